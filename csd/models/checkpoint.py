"""Checkpoint I/O: official ``.pth``/``.ckpt`` files (safe unpickling) and the project's safetensors.

Official MAR checkpoints are pickles. They are read with ``torch.load(weights_only=True)``
and an explicit allow-list of the few non-tensor classes they hold, never a bare pickle load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

# Non-tensor classes found in official MAR training checkpoints (the argparse args).
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or does not match the model it is loaded into."""


def safe_torch_load(path: str | Path, extra_globals: tuple[type, ...] = ()) -> dict:
    """Load a torch pickle with ``weights_only=True`` and the project's allow-list."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS + extra_globals)):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupted zip, truncated file, disallowed global ...
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"checkpoint {path} holds a {type(obj).__name__}, expected a dict")
    return dict(obj)


def _preview(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def load_state_strict(module: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """``load_state_dict(strict=True)`` with one readable error listing every mismatch."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = [f"checkpoint {source} does not match {type(module).__name__}:"]
        if missing:
            parts.append(f"missing keys ({len(missing)}): {_preview(missing)}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {_preview(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches ({len(shapes)}): {_preview(shapes, 6)}")
        raise CheckpointError("\n  ".join(parts))
    module.load_state_dict(state, strict=True)


def save_safetensors(module: nn.Module, path: str | Path, config: Mapping) -> None:
    """Write ``path`` (safetensors) and ``path`` with suffix ``.json`` (the config) side by side."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Cloned: tied weights (an LLM's embedding and output head) share storage, which safetensors refuses.
    state = {k: v.detach().cpu().clone().contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(path))
    path.with_suffix(".json").write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a project checkpoint: (state dict, JSON config beside it)."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg_path = path.with_suffix(".json")
    for p in (path, cfg_path):
        if not p.is_file():
            raise CheckpointError(f"checkpoint file not found: {p}")
    try:
        state = load_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"cannot read safetensors file {path}: {type(exc).__name__}: {exc}") from exc
    try:
        config = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"config {cfg_path} is not valid JSON: {exc}") from exc
    return state, config


def file_digest(*paths: Path) -> str:
    """A short content hash of weight files (what a result or a pair records as its weights)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()[:16]
