"""Default settings of the embedded shapes pair and the named sampler presets, in one place so the app,
evaluation and benchmark agree: :data:`SAMPLING` and :data:`CSD` differ from the dataclass defaults only
where the embedded pair does; a preset (:data:`PRESETS`) names the fields it changes over them."""

from __future__ import annotations

from dataclasses import fields, replace

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.pairs import EMBEDDED_DIR

TARGET_PATH = EMBEDDED_DIR / "shapes_target.safetensors"
DRAFT_PATH = EMBEDDED_DIR / "shapes_draft.safetensors"

SAMPLING = SamplingConfig(num_steps=32, cfg_scale=3.0)
CSD = CSDConfig()
BATCH_SIZE = 8

# Named sampler presets: the fields each changes over the defaults, named for what a user wants (the app's
# preset menu, --preset). A family with fixed AR steps (xAR) keeps its own.
PRESETS: dict[str, dict[str, object]] = {
    "default": {},
    "fast": {"gamma": 16, "prefill": 0.05},
    "faithful": {"gamma": 2, "prefill": 0.1},
    "show rejections": {"tau_v": 1.0, "align": False},
}


def preset(name: str) -> tuple[SamplingConfig, CSDConfig]:
    """The default settings with preset ``name``'s changes."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {name!r}")
    changes = PRESETS[name]
    split = lambda config: {f.name: changes[f.name] for f in fields(config) if f.name in changes}
    return replace(SAMPLING, **split(SAMPLING)), replace(CSD, **split(CSD))
