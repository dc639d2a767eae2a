"""Loading official MAR checkpoints (``checkpoint-last.pth``) into :class:`csd.models.mar.MAR`.

The files hold ``model`` and ``model_ema`` state dicts plus training state and the argparse
``args``. They are read with ``torch.load(weights_only=True)`` and an allow-list (argparse
Namespace only); the architecture comes from ``args`` when no config is given. In a checkpoint
directory they sit at :data:`OFFICIAL_FILES` (the layout of the official Hub mirror)::

    <dir>/mar/mar_base/checkpoint-last.pth   <dir>/mar/mar_large/...   <dir>/mar/mar_huge/...
    <dir>/vae/kl16.ckpt                      (the KL-16 tokenizer, shared by every official pair)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from csd.models.checkpoint import CheckpointError, load_state_strict, safe_torch_load
from csd.models.mar.network import MAR, MAR_CONFIGS, MARConfig, mar_config

WEIGHT_ENTRIES = ("model_ema", "model")
OFFICIAL_FILES = {name: (f"mar/{name}/checkpoint-last.pth",) for name in ("mar_base", "mar_large", "mar_huge")}

# argparse name in MAR's main_mar.py -> MARConfig field.
_ARG_FIELDS = {
    "img_size": "img_size",
    "vae_stride": "vae_stride",
    "patch_size": "patch_size",
    "vae_embed_dim": "token_channels",
    "class_num": "class_num",
    "buffer_size": "buffer_size",
    "label_drop_prob": "label_drop_prob",
    "attn_dropout": "attn_dropout",
    "proj_dropout": "proj_dropout",
    "mask_ratio_min": "mask_ratio_min",
    "diffloss_d": "diffloss_d",
    "diffloss_w": "diffloss_w",
    "num_sampling_steps": "num_sampling_steps",
    "diffusion_batch_mul": "diffusion_batch_mul",
}


def config_from_args(args: argparse.Namespace | dict) -> MARConfig:
    """The MARConfig a training run's ``args`` describe (named size + the overrides it used)."""
    args = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    name = args.get("model")
    if name not in MAR_CONFIGS:
        raise CheckpointError(f"checkpoint args name model {name!r}; known configs: {sorted(MAR_CONFIGS)}")
    overrides = {field: args[arg] for arg, field in _ARG_FIELDS.items() if arg in args}
    if "num_sampling_steps" in overrides:  # MAR passes it as a string, e.g. '100'
        overrides["num_sampling_steps"] = int(overrides["num_sampling_steps"])
    return mar_config(name, **overrides)


def load_official_mar(path: str | Path, config: MARConfig | str | None = None, weights: str = "model_ema") -> MAR:
    """Build MAR and load an official checkpoint strictly; returns it in eval mode on the CPU.

    config: a MARConfig, a name in MAR_CONFIGS, or None to read it from the checkpoint's args.
    weights: "model_ema" (the published evaluation weights, default) or "model".
    """
    if weights not in WEIGHT_ENTRIES:
        raise ValueError(f"weights must be one of {WEIGHT_ENTRIES}, got {weights!r}")
    ckpt = safe_torch_load(path)
    if weights not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no {weights!r} entry; it holds {sorted(ckpt)}")
    if isinstance(config, str):
        config = mar_config(config)
    elif config is None:
        if "args" not in ckpt:
            raise CheckpointError(f"checkpoint {path} has no 'args'; pass config='mar_base'/'mar_large'/'mar_huge'")
        config = config_from_args(ckpt["args"])
    model = MAR(config)
    load_state_strict(model, ckpt[weights], f"{path}[{weights!r}]")
    return model.eval()


def from_checkpoints(checkpoints: Path, name: str, target: MAR | None = None) -> MAR:
    """The official ``name`` model (a key of :data:`OFFICIAL_FILES`) from a checkpoint directory; a draft
    needs nothing of its ``target``."""
    return load_official_mar(Path(checkpoints) / OFFICIAL_FILES[name][0], name)
