"""Default settings of the embedded shapes pair and the named presets, in one place so the app, evaluation
and benchmark agree: :data:`SAMPLING` and :data:`CSD` differ from the dataclass defaults only where the
embedded pair does; :data:`PRESETS` names whole settings, as DiT names its model configs."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from csd.config import CSDConfig, SamplingConfig
from csd.serving.pairs import EMBEDDED_DIR

TARGET_PATH = EMBEDDED_DIR / "shapes_target.safetensors"
DRAFT_PATH = EMBEDDED_DIR / "shapes_draft.safetensors"

SAMPLING = SamplingConfig(num_steps=32, cfg_scale=3.0)
CSD = CSDConfig()
BATCH_SIZE = 8


class Preset(NamedTuple):
    """A named setting: the two configs a run takes."""

    sampling: SamplingConfig
    csd: CSDConfig


# Named for what a user wants (the app's preset menu, --preset). A family with fixed AR steps (xAR) keeps its own.
PRESETS: dict[str, Preset] = {
    "default": Preset(SAMPLING, CSD),
    "fast": Preset(SAMPLING, replace(CSD, gamma=16, prefill=0.05)),
    "faithful": Preset(SAMPLING, replace(CSD, gamma=2, prefill=0.1)),
    "show rejections": Preset(SAMPLING, replace(CSD.with_knobs(tau_v=1.0), align=False)),
}


def preset(name: str) -> Preset:
    """The preset ``name``; an unknown name is a ValueError naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {name!r}")
    return PRESETS[name]
