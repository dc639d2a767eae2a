"""Loading the official xAR checkpoints (``xAR-B.pth``, ``xAR-L.pth``, ``xAR-H.pth`` from the Hub
repository OliverRen/xAR) into :class:`csd.models.xar.XAR`; in a checkpoint directory they sit at
:data:`OFFICIAL_FILES`, beside MAR's KL-16 tokenizer ``vae/kl16.ckpt``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from csd.models.checkpoint import load_state_strict, safe_torch_load
from csd.models.xar.network import XAR, XARConfig, xar_config

CHECKPOINTS = {"xar_base": "xAR-B.pth", "xar_large": "xAR-L.pth", "xar_huge": "xAR-H.pth"}
OFFICIAL_FILES = {name: (f"xar/{file}",) for name, file in CHECKPOINTS.items()}


def load_official_xar(path, config: str | XARConfig = "xar_base") -> XAR:
    """An official ``xAR-{B,L,H}.pth`` (Hub: OliverRen/xAR; a flat state dict, buffers included) read
    with ``weights_only=True`` and loaded strictly: missing, unexpected and misshapen keys are named."""
    state = safe_torch_load(path)
    model = XAR(xar_config(config) if isinstance(config, str) else config)
    load_state_strict(model, state, str(path))
    return model.eval()


def from_checkpoints(checkpoints: Path, name: str, target: XAR | None = None) -> XAR:
    """The official ``name`` model (a key of :data:`OFFICIAL_FILES`) from a checkpoint directory. A draft
    samples on its ``target``'s time grid (its flow steps): the aligned test needs one time grid."""
    config = xar_config(name) if target is None else replace(xar_config(name), flow_steps=target.config.flow_steps)
    return load_official_xar(Path(checkpoints) / OFFICIAL_FILES[name][0], config)
