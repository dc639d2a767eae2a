"""The project's own model files: ``name.safetensors`` (weights) + ``name.json`` (architecture and provenance).

The JSON holds ``{"arch": "mar", "config": MARConfig.to_dict(), ...}``; anything else in it (how the
model was trained) is informational. Loading is strict: a file whose weights do not match its
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


def save_model(model: MAR, path: str | Path, extra: Mapping | None = None) -> Path:
    """Write the weights and the JSON side by side; ``extra`` adds top-level JSON entries (e.g. ``train``).

    Both files are written under temporary names and then renamed, so a run killed mid-save leaves
    the previous pair intact. Returns the ``.safetensors`` path."""
    path = weights_path(path)
    extra = dict(extra or {})
    clash = {"arch", "config"} & set(extra)
    if clash:
        raise ValueError(f"extra must not override the reserved JSON keys {sorted(clash)}")
    tmp = path.with_name(f".{path.stem}.tmp{SUFFIX}")
    save_safetensors(model, tmp, {"arch": "mar", "config": model.config.to_dict(), **extra})
    os.replace(tmp.with_suffix(".json"), path.with_suffix(".json"))
    os.replace(tmp, path)
    return path


def load_model(path: str | Path, device: str | torch.device = "cpu") -> MAR:
    """A MAR in eval mode from a project checkpoint; :class:`CheckpointError` names the file on any mismatch."""
    path = weights_path(path)
    state, meta = read_safetensors(path)
    json_path = path.with_suffix(".json")
    if not isinstance(meta, dict) or meta.get("arch") != "mar":
        found = meta.get("arch") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f'{json_path}: expected "arch": "mar", got {found!r}')
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f'{json_path}: missing the "config" object')
    try:
        config = MARConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: invalid MAR config: {exc}") from exc
    model = MAR(config)
    load_state_strict(model, state, str(path))
    return model.to(device).eval()
