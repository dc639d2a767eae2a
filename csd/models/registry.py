"""The project's own model files: ``name.safetensors`` (weights) + ``name.json`` (architecture and provenance).

The JSON holds ``{"arch": "mar", "config": MARConfig.to_dict(), ...}`` or, for a text-conditioned
model, ``{"arch": "harmon", "config": HarmonConfig.to_dict(), "tokenizer": {...}, ...}``; anything else
in it (how the model was trained) is informational. Loading is strict: a file whose weights do not match its
config is an error naming the file, never a silently half-loaded model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from csd.models.checkpoint import CheckpointError, load_state_strict, read_safetensors, save_safetensors
from csd.models.mar import MAR, MARConfig

SUFFIX = ".safetensors"


def weights_path(path: str | Path) -> Path:
    """``path`` with the ``.safetensors`` suffix (a bare prefix such as ``assets/models/x`` is accepted)."""
    path = Path(path)
    return path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)


def _arch(model) -> tuple[str, dict]:
    """The JSON's reserved entries for a model."""
    from csd.models.harmon import Harmon
    from csd.models.xar import XAR

    if isinstance(model, Harmon):
        return "harmon", {"config": model.config.to_dict(), "tokenizer": model.tokenizer.to_dict()}
    if isinstance(model, XAR):
        return "xar", {"config": model.config.to_dict()}
    return "mar", {"config": model.config.to_dict()}


def save_model(model, path: str | Path, extra: Mapping | None = None) -> Path:
    """Write the weights and the JSON side by side; ``extra`` adds top-level JSON entries (e.g. ``train``).

    Both files are written under temporary names and then renamed, so a run killed mid-save leaves
    the previous pair intact. Returns the ``.safetensors`` path."""
    path = weights_path(path)
    extra = dict(extra or {})
    arch, reserved = _arch(model)
    clash = ({"arch"} | set(reserved)) & set(extra)
    if clash:
        raise ValueError(f"extra must not override the reserved JSON keys {sorted(clash)}")
    tmp = path.with_name(f".{path.stem}.tmp{SUFFIX}")
    save_safetensors(model, tmp, {"arch": arch, **reserved, **extra})
    os.replace(tmp.with_suffix(".json"), path.with_suffix(".json"))
    os.replace(tmp, path)
    return path


ARCHS = ("mar", "harmon", "xar")


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """A MAR (Harmon, xAR) in eval mode from a project checkpoint; :class:`CheckpointError` names the file
    on any mismatch."""
    path = weights_path(path)
    state, meta = read_safetensors(path)
    json_path = path.with_suffix(".json")
    arch = meta.get("arch") if isinstance(meta, dict) else type(meta).__name__
    if arch not in ARCHS:
        raise CheckpointError(f'{json_path}: expected "arch" to be one of {ARCHS}, got {arch!r}')
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f'{json_path}: missing the "config" object')
    try:
        if arch == "mar":
            model = MAR(MARConfig.from_dict(meta["config"]))
        elif arch == "xar":
            from csd.models.xar import XAR, XARConfig

            model = XAR(XARConfig.from_dict(meta["config"]))
        else:
            from csd.models.harmon import Harmon, HarmonConfig, tokenizer_from_dict

            if not isinstance(meta.get("tokenizer"), dict):
                raise CheckpointError(f'{json_path}: missing the "tokenizer" object')
            model = Harmon(HarmonConfig.from_dict(meta["config"]), tokenizer_from_dict(meta["tokenizer"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: invalid {arch} config: {exc}") from exc
    load_state_strict(model, state, str(path))
    return model.to(device).eval()
