"""MAR at the published sizes (:mod:`csd.experiments.paper_scale`).

Published settings (LTH14/mar README, "Evaluation"): MAR-B / L / H have 208M / 479M / 943M parameters and
are evaluated with 100 diffusion-head steps (``--num_sampling_steps 100``), temperature 1.0 and a linear CFG
schedule at cfg 2.9 / 3.0 / 3.2. The CSD code (MarkXCloud/CSpD ``main_mar.py``) defaults to 64 AR steps
(``--num_iter 64``); its demo pairs a MAR-H target with a MAR-B draft, pre-fills 5%
(``SpecDecodeRunner(..., ratio=0.05)``) and samples under CUDA autocast. ``--tiny`` shrinks a config to
width by size, depth 1 and a 4 x 4 token grid (64 px at stride 16).
"""

from __future__ import annotations

from torch import nn

from csd.models.spec import TINY_WIDTHS, CostShape, PaperScale, Stack, stack

LAYER_KERNELS = 18  # aten ops per layer of MAR's ViT, counted with a TorchDispatchMode on the tiny models


def tiny_overrides(name: str, tiny: bool) -> dict:
    """A MAR preset's changes under --tiny (none at the official size)."""
    if not tiny:
        return {}
    w = TINY_WIDTHS[name.split("_")[1]]
    dims = dict(encoder_embed_dim=w, decoder_embed_dim=w, encoder_num_heads=2, decoder_num_heads=2)
    return dict(img_size=64, encoder_depth=1, decoder_depth=1, buffer_size=4, diffloss_d=1, diffloss_w=w, **dims)


def cost_shape(model: nn.Module, mar: nn.Module, llm: Stack | None = None, prompt: int = 0) -> CostShape:
    """The cost shape of a masked model: ``mar``'s encoder, decoder and head (``model`` itself, or a text
    model's MAR generator, with the ``llm`` stack over ``prompt`` tokens); parameters counted on ``model``."""
    c = mar.config
    enc = stack(mar.encoder_blocks, c.encoder_embed_dim, LAYER_KERNELS)
    dec = stack(mar.decoder_blocks, c.decoder_embed_dim, LAYER_KERNELS)
    head = sum(p.numel() for p in mar.diffloss.parameters())
    params = sum(p.numel() for p in model.parameters())
    prompt = prompt if llm is not None else 0
    return CostShape(params, enc, dec, llm, head, c.diffloss_d, model.seq_len, c.buffer_size, prompt)


PAPER = PaperScale(
    cfg={"mar_huge": 3.2, "mar_large": 3.0, "mar_base": 2.9},
    cfg_schedule="linear",
    num_steps=64,
    head_steps=100,
    tiny_steps=(8, 4),
    overrides=tiny_overrides,
    layout=lambda config, head_steps: (config.seq_len, head_steps),
    cost=lambda model, prompt: cost_shape(model, model),
)
