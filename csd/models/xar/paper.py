"""xAR at the published sizes (:mod:`csd.experiments.paper_scale`).

Published settings (OliverRensu/xAR README): xAR-B 40 flow steps at cfg 2.7, xAR-L 50 at 2.3, xAR-H 50 at
2.2 (``--num_steps``, ``--cfg``); 172.6M / 608.4M / 1186.0M parameters (tests/models/test_xar.py). One AR step per
cell (4 cells; the official ``--num_iter`` is unused), CFG ramped over the cells (schedule "linear"). The
draft runs on the target's flow steps (the aligned test needs one time grid, as
:func:`csd.models.xar.official.from_checkpoints` loads a draft), so at most 3 cells are drafted after the
pre-filled one. ``--tiny`` shrinks a config to width by size, depth 1, a 4 x 4 grid of 4 cells and 3 or 4
flow steps (the base model fewer, as the official 40 against 50).
"""

from __future__ import annotations

from torch import nn

from csd.models.spec import TINY_WIDTHS, CostShape, PaperScale, stack

# Kernels (aten ops) per xAR layer (adaLN, RoPE, KV cache), counted with a TorchDispatchMode on the tiny models.
LAYER_KERNELS = 60
TINY_FLOW_STEPS = {"huge": 4, "large": 4, "base": 3}


def tiny_overrides(name: str, tiny: bool) -> dict:
    """An xAR preset's changes under --tiny (none at the official size)."""
    if not tiny:
        return {}
    size = name.split("_")[1]
    w = TINY_WIDTHS[size]
    over = dict(grid=4, cells=4, embed_dim=w, encoder_depth=1, decoder_depth=1, encoder_num_heads=2)
    return over | dict(decoder_num_heads=2, flow_steps=TINY_FLOW_STEPS[size])


def cost_shape(model: nn.Module, prompt: int = 0) -> CostShape:
    """Every block as one stack, run once per flow step over a block's cells."""
    c = model.config
    blocks = stack([*model.encoder_blocks, *model.decoder_blocks], c.embed_dim, LAYER_KERNELS)
    params = sum(p.numel() for p in model.parameters())
    return CostShape(params, blocks, tokens=c.seq_len, flow=True, cell_len=c.cell_len)


PAPER = PaperScale(
    cfg={"xar_huge": 2.2, "xar_large": 2.3, "xar_base": 2.7},
    cfg_schedule="linear",
    num_steps=None,
    head_steps=None,
    tiny_steps=(None, None),
    overrides=tiny_overrides,
    layout=lambda config, head_steps: (config.cells, config.flow_steps),
    cost=cost_shape,
    match_draft=lambda target: {"flow_steps": target.config.flow_steps},
    head_name="flow",
    note="Heads: xAR's flow chain (a backbone pass per flow step).",
)
