"""Deepen a trained MAR without changing what it computes, as a starting point for more training.

New transformer blocks are inserted between the old ones with their two residual branches' output
layers (``attn.proj`` and ``mlp.fc2``) set to zero, so each new block is the identity and the grown
model's outputs equal the old model's exactly. Their other layers get MAR's usual init, so training
moves them off the identity from the first step (the zeroed layers get non-zero gradients).
The token head can be deepened the same way (``--head-depth``): its new residual blocks keep the
head's own zero-initialised AdaLN modulation (shift, scale and gate 0), so they too start as the identity.

``python -m csd.training.grow SRC --encoder-depth 8 --decoder-depth 8 --out PREFIX`` writes ``PREFIX.train_state.pt``
(weights = EMA = the grown source weights, fresh AdamW moments, step 0) for
``python -m csd.training.trainer ... --model-overrides '{"encoder_depth": 8, "decoder_depth": 8}' --init-from``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from csd.core.rng import drawing_from
from csd.models.mar import MAR, MARConfig
from csd.models.registry import load_model, weights_path
from csd.training.trainer import param_groups


def block_positions(old_depth: int, new_depth: int, name: str = "depth") -> list[int]:
    """Where the old blocks go in the grown stack: spread evenly, first block first, order kept."""
    if old_depth < 1 or new_depth < old_depth:
        raise ValueError(f"{name} must be >= the source model's {old_depth}, got {new_depth}")
    return [i * new_depth // old_depth for i in range(old_depth)]


def _identity_block(block: nn.Module) -> None:
    for layer in (block.attn.proj, block.mlp.fc2):
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)


def grow_depth(
    model: MAR,
    encoder_depth: int,
    decoder_depth: int,
    generator: torch.Generator | None = None,
    head_depth: int | None = None,
) -> MAR:
    """A copy of ``model`` with ``encoder_depth`` / ``decoder_depth`` blocks (and ``head_depth`` residual
    blocks in the token head; None keeps the head) that computes the same function.

    ``generator`` (default: seeded with 0) draws the init of the new blocks' inner layers (the rest is
    copied); the global generator is left alone."""
    old = model.config
    head_depth = old.diffloss_d if head_depth is None else head_depth
    block_positions(old.encoder_depth, encoder_depth, "encoder_depth")
    block_positions(old.decoder_depth, decoder_depth, "decoder_depth")
    head_kept = block_positions(old.diffloss_d, head_depth, "head_depth")
    config = MARConfig.from_dict(
        {**old.to_dict(), "encoder_depth": encoder_depth, "decoder_depth": decoder_depth, "diffloss_d": head_depth}
    )
    with drawing_from(torch.Generator().manual_seed(0) if generator is None else generator):
        grown = MAR(config)  # layer init: the same numbers as after torch.manual_seed(seed)
    grown = grown.to(next(model.parameters()).device)
    mapping: dict[str, str] = {}
    for stack, depth, new_depth in (
        ("encoder_blocks", old.encoder_depth, encoder_depth),
        ("decoder_blocks", old.decoder_depth, decoder_depth),
    ):
        kept = block_positions(depth, new_depth, stack)
        for i, j in enumerate(kept):
            mapping[f"{stack}.{i}."] = f"{stack}.{j}."
        for j in sorted(set(range(new_depth)) - set(kept)):
            _identity_block(getattr(grown, stack)[j])
    # Head blocks: the fresh head's modulation is zero (MLPAdaLN's init), so unmapped blocks are the identity.
    for i, j in enumerate(head_kept):
        mapping[f"diffloss.net.res_blocks.{i}."] = f"diffloss.net.res_blocks.{j}."
    state = grown.state_dict()
    for key, value in model.state_dict().items():
        new_key = key
        for prefix, new_prefix in mapping.items():
            if key.startswith(prefix):
                new_key = new_prefix + key[len(prefix) :]
                break
        if state[new_key].shape != value.shape:
            raise ValueError(f"{key} -> {new_key}: shape {tuple(value.shape)} vs {tuple(state[new_key].shape)}")
        state[new_key] = value.clone()
    grown.load_state_dict(state)
    return grown.eval()


def grown_train_state(
    src: str | Path,
    encoder_depth: int,
    decoder_depth: int,
    weight_decay: float,
    seed: int,
    head_depth: int | None = None,
) -> dict:
    """A train state (as ``csd.training.trainer`` writes it) of the grown ``src`` model, for ``--init-from``."""
    src = weights_path(src)
    model = load_model(src)
    grown = grow_depth(model, encoder_depth, decoder_depth, torch.Generator().manual_seed(seed), head_depth)
    optimizer = torch.optim.AdamW(param_groups(grown, weight_decay), lr=1e-4)  # moments empty: a fresh start
    meta = json.loads(src.with_suffix(".json").read_text())
    args = {
        "grow_from": str(src),
        "encoder_depth": [model.config.encoder_depth, encoder_depth],
        "decoder_depth": [model.config.decoder_depth, decoder_depth],
        "head_depth": [model.config.diffloss_d, grown.config.diffloss_d],
        "seed": seed,
    }
    return {
        "step": 0,
        "elapsed": 0.0,
        "args": args,
        "model": grown.state_dict(),
        "ema": grown.state_dict(),
        "optimizer": optimizer.state_dict(),
        "parent": meta.get("train"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="project model (.safetensors + .json)")
    parser.add_argument("--encoder-depth", type=int, required=True)
    parser.add_argument("--decoder-depth", type=int, required=True)
    parser.add_argument(
        "--head-depth", type=int, default=None, help="residual blocks of the token head (default: kept)"
    )
    parser.add_argument("--weight-decay", type=float, default=0.02, help="must match the training run's")
    parser.add_argument("--seed", type=int, default=0, help="init of the new blocks' inner layers")
    parser.add_argument("--out", required=True, help="output prefix; writes <out>.train_state.pt")
    args = parser.parse_args(argv)
    state = grown_train_state(
        args.src, args.encoder_depth, args.decoder_depth, args.weight_decay, args.seed, args.head_depth
    )
    out = Path(args.out + ".train_state.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    a = state["args"]
    print(f"wrote {out}: encoder {a['encoder_depth']}, decoder {a['decoder_depth']}, head {a['head_depth']}")


if __name__ == "__main__":
    main()
