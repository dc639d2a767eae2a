"""xAR: next-cell prediction with flow matching (Ren et al., 2025), the architecture.

The whole encoder-decoder transformer is the flow network: ``pred`` gives a velocity for every token,
a cell of tokens is generated at once, and attention is block-causal over cells (a cell sees the
earlier cells and itself). Module tree and parameter names are the official ones (``models/xar.py``
of OliverRensu/xAR), so ``xAR-B.pth`` / ``xAR-L.pth`` / ``xAR-H.pth`` can load strictly:

* ``class_emb`` (classes + 1 rows, the last the null class), ``time_embed.mlp`` (DiT's timestep
  embedder on ``floor(1000 t)``); a cell's condition is their sum;
* ``z_proj``, ``z_proj_ln`` (RMSNorm with weight), learned ``encoder_pos_embed_learned`` and
  ``decoder_pos_embed_learned``, ``encoder_norm``, ``decoder_embed``, ``decoder_norm``, ``pred``;
* blocks: weightless RMSNorm (eps 1e-6) before attention and MLP; attention ``qkv`` (bias) and
  ``proj`` with a 2-D rotary embedding in cell order (interleaved pairs); SwiGLU ``fc1_g`` /
  ``fc1_x`` / ``fc2`` of width ``int(D * mlp_ratio * 2 / 3)`` whose gate is exact GELU; adaLN
  ``ada_lin = (SiLU, Linear(D, 6 D))`` split as gamma1, gamma2, scale1, scale2, shift1, shift2;
* buffers: the block-causal ``mask`` and each block's RoPE ``freqs``, ``freqs_cos``, ``freqs_sin``.

The number of cells is a setting (the official models: 4 cells of 8 x 8 tokens on a 16 x 16 grid),
so a small model can use, e.g., 16 cells of 2 x 2 tokens on an 8 x 8 grid.

This module is the network and its training objective (noisy-context flow matching); the sampler as
Gaussian chains over cells is :mod:`.chains`, the samplers' view of the model :mod:`.adapter`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.family import FamilyTraits
from csd.models.head import TimestepEmbedder
from csd.models.kernels import HeadKernels
from csd.models.spec import SerialConfig
from csd.models.tokenizer import cell_order
from csd.models.xar.adapter import XARFamily


@dataclass(frozen=True)
class XARConfig(SerialConfig):
    """Architecture of an xAR model: a ``grid`` x ``grid`` token grid of ``token_dim`` channels, split
    into ``cells`` square cells generated one per AR step. Encoder and decoder take their own head counts,
    as the official constructor does (the published sizes use equal ones)."""

    grid: int = 16
    token_dim: int = 16
    cells: int = 4
    embed_dim: int = 768
    encoder_depth: int = 8
    decoder_depth: int = 8
    encoder_num_heads: int = 12
    decoder_num_heads: int = 12
    mlp_ratio: float = 4.0
    class_num: int = 1000
    label_drop_prob: float = 0.1
    rope_theta: float = 10000.0
    flow_steps: int = 50  # Euler-Maruyama steps per cell (the published settings: B 40, L and H 50)

    def __post_init__(self) -> None:
        positive = ("grid", "token_dim", "cells", "embed_dim", "encoder_depth", "decoder_depth")
        for name in (*positive, "encoder_num_heads", "decoder_num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"XARConfig.{name} must be an int >= 1, got {value!r}")
        side = math.isqrt(self.cells)
        if side * side != self.cells or self.grid % side:
            raise ValueError(
                f"XARConfig.cells ({self.cells}) must be a square whose side divides the grid ({self.grid})"
            )
        for part in ("encoder", "decoder"):
            heads = getattr(self, f"{part}_num_heads")
            if self.embed_dim % heads or (self.embed_dim // heads) % 4:
                raise ValueError(
                    f"XARConfig.embed_dim ({self.embed_dim}) / {part}_num_heads ({heads}) must be a multiple of 4 "
                    "(the 2-D rotary embedding rotates pairs in two halves)"
                )

    @property
    def seq_len(self) -> int:
        return self.grid * self.grid

    @property
    def cell_side(self) -> int:
        return self.grid // math.isqrt(self.cells)

    @property
    def cell_len(self) -> int:
        return self.cell_side**2

    def traits(self) -> FamilyTraits:
        """One cell per AR step, CFG ramped over the cells, a cell (cell_len tokens) per acceptance row,
        at least two flow steps (N - 1 stochastic and a deterministic last one); verifying a block runs
        the flow chain (the backbone) over its cells at once."""
        return FamilyTraits(
            "xAR",
            "classes",
            num_classes=self.class_num,
            fixed_num_steps=self.cells,
            cfg_schedule="linear",
            head_per_block=True,
            verifies_in_context=True,
            tokens_per_row=self.cell_len,
            min_head_steps=2,
            row_name="cells",
            head_samplers=("euler-maruyama", "euler", "heun"),
            flow_grids=True,
        )


def _sizes(dim: int, depth: int, heads: int) -> dict:
    return dict(
        embed_dim=dim, encoder_depth=depth, decoder_depth=depth, encoder_num_heads=heads, decoder_num_heads=heads
    )


# The official sizes (ImageNet 256, KL-16 latents: a 16 x 16 grid in 4 cells of 8 x 8).
XAR_CONFIGS: dict[str, XARConfig] = {
    "xar_base": XARConfig(**_sizes(768, 8, 12), flow_steps=40),
    "xar_large": XARConfig(**_sizes(1024, 16, 16)),
    "xar_huge": XARConfig(**_sizes(1280, 20, 16)),
    # The embedded pair: 32 x 32 shapes images as an 8 x 8 grid of 4 x 4 RGB patches (d = 48), in 16 cells
    # of 2 x 2 tokens (16 AR steps), 10 classes; 25 flow steps per cell keep CPU sampling quick.
    "shapes_xar_target": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(192, 6, 6)),
    "shapes_xar_draft": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(96, 2, 3)),
    "xar_test": XARConfig(grid=4, cells=4, class_num=10, flow_steps=6, **_sizes(32, 1, 2)),
    # Untrained pairs on the embedded layout (random weights), for tests and a server with no weights.
    "random_xar_target": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(64, 1, 2)),
    "random_xar_draft": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(32, 1, 1)),
}


def xar_config(name: str, **overrides) -> XARConfig:
    if name not in XAR_CONFIGS:
        raise ValueError(f"unknown xAR config {name!r}; choose from {sorted(XAR_CONFIGS)}")
    return replace(XAR_CONFIGS[name], **overrides)


# --- layout --------------------------------------------------------------------------------------


def block_causal_mask(cells: int, cell_len: int) -> Tensor:
    """(1, 1, L, L) additive mask: 0 where a token's cell is at or after the key's cell, else -inf."""
    cell = torch.arange(cells * cell_len) // cell_len
    allowed = cell[:, None] >= cell[None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


# --- blocks -----------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, weight: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if weight else None

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 at least, float64 kept
        out = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return out if self.weight is None else out * self.weight


def rotate_pairs(x: Tensor) -> Tensor:
    """(..., 2k) -> the interleaved pairs (a, b) rotated to (-b, a)."""
    a, b = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((-b, a), dim=-1).flatten(-2)


class Rope2d(nn.Module):
    """The 2-D rotary embedding of EVA-02 as xAR uses it: half the head channels rotate with the row,
    half with the column, pairs interleaved; positions listed in cell order."""

    def __init__(self, head_dim: int, grid: int, cells: int, theta: float = 10000.0):
        super().__init__()
        half = head_dim // 2
        freqs = 1.0 / (theta ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # (half/2,)
        self.register_buffer("freqs", freqs)
        angles = torch.arange(grid, dtype=torch.float32)[:, None] * freqs  # (grid, half/2)
        angles = angles.repeat_interleave(2, dim=-1)  # (grid, half): each frequency for a pair
        rows = angles[:, None, :].expand(grid, grid, half)
        cols = angles[None, :, :].expand(grid, grid, half)
        table = torch.cat([rows, cols], dim=-1).reshape(grid * grid, head_dim)[cell_order(grid, cells)]
        self.register_buffer("freqs_cos", table.cos())
        self.register_buffer("freqs_sin", table.sin())

    def forward(self, x: Tensor, positions: slice | None = None) -> Tensor:
        """x (B, H, L, head_dim) at the L ``positions`` in cell order (default: the first L); a slice, whose
        tables are views (no copy per call)."""
        positions = slice(0, x.shape[2]) if positions is None else positions
        return x * self.freqs_cos[positions] + rotate_pairs(x) * self.freqs_sin[positions]


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, grid: int, cells: int, theta: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.rope = Rope2d(dim // num_heads, grid, cells, theta)

    def forward(self, x: Tensor, mask: Tensor | None, positions: slice | None = None, past=None, record=None) -> Tensor:
        """``past``: (k, v) of earlier tokens to attend to as well; ``record``: a list that receives
        this call's (k, v) (a context pass filling a cache)."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q, positions), self.rope(k, positions)
        if record is not None:
            record.append((k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class SwiGLU(nn.Module):
    """timm's SwiGLU with the names it gives its layers; xAR passes GELU as the gate activation."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden)
        self.fc1_x = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1_g(x)) * self.fc1_x(x))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, grid: int, cells: int, theta: float):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, num_heads, grid, cells, theta)
        self.mlp = SwiGLU(dim, int(dim * mlp_ratio * 2 / 3.0))
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, cond: Tensor, mask, positions=None, past=None, record=None) -> Tensor:
        """x (B, L, D); cond (B, L, D): every token's cell condition."""
        gamma1, gamma2, scale1, scale2, shift1, shift2 = self.ada_lin(cond).chunk(6, dim=-1)
        x = x + self.attn(self.norm1(x) * (1 + scale1) + shift1, mask, positions, past, record) * gamma1
        return x + self.mlp(self.norm2(x) * (1 + scale2) + shift2) * gamma2


class XAR(XARFamily, nn.Module):
    """xAR. As a :class:`csd.family.ModelFamily` (:class:`~csd.models.xar.adapter.XARFamily`) its tokens
    are whole cells: ``seq_len`` = cells, ``token_dim`` = cell_len * d, one cell per AR step in raster
    order of cells."""

    def __init__(self, config: XARConfig):
        super().__init__()
        c = self.config = config
        d, args = c.embed_dim, (c.mlp_ratio, c.grid, c.cells, c.rope_theta)
        self.seq_len, self.token_dim = c.cells, c.cell_len * c.token_dim
        self.class_emb = nn.Embedding(c.class_num + 1, d)  # the last row is the null class
        self.time_embed = TimestepEmbedder(d)
        self.z_proj = nn.Linear(c.token_dim, d)
        self.z_proj_ln = RMSNorm(d, weight=True)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, d))
        self.encoder_blocks = nn.ModuleList(Block(d, c.encoder_num_heads, *args) for _ in range(c.encoder_depth))
        self.encoder_norm = RMSNorm(d, weight=True)
        self.decoder_embed = nn.Linear(d, d)
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, d))
        self.decoder_blocks = nn.ModuleList(Block(d, c.decoder_num_heads, *args) for _ in range(c.decoder_depth))
        self.decoder_norm = RMSNorm(d, weight=True)
        self.pred = nn.Linear(d, c.token_dim)
        self.register_buffer("mask", block_causal_mask(c.cells, c.cell_len))
        self.kernels: HeadKernels | None = None  # how its flow chains run; None: the device's default
        self._init_weights()

    def use_kernels(self, kernels: HeadKernels | None) -> None:
        """Run this model's flow chains with ``kernels`` (compiled velocity calls or not) on every device, or
        None: the device's default (:func:`csd.models.kernels.kernels_for`)."""
        self.kernels = kernels

    def _init_weights(self) -> None:
        for p in (self.class_emb.weight, self.encoder_pos_embed_learned, self.decoder_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def traits(self) -> FamilyTraits:
        return self.config.traits()

    @property
    def null_class(self) -> int:
        return self.config.class_num

    def cell_conditions(self, labels: Tensor, t: Tensor) -> Tensor:
        """labels (B,), t (B, K) the flow time of each of K cells -> (B, K, D)."""
        # the official time input, floor(1000 t) of t in float32 as the official sampler holds it: in every
        # precision (a float64 t would floor 0.68 to 680 where float32's 0.67999... floors to 679)
        steps = torch.floor(t.float() * 1000).long()
        return self.class_emb(labels)[:, None] + self.time_embed(steps.reshape(-1)).reshape(*t.shape, -1)

    def velocity(self, x: Tensor, labels: Tensor, t: Tensor) -> Tensor:
        """The velocity of every token of the first K cells, in one block-causal pass.

        x (B, K * cell_len, d) tokens in cell order; labels (B,) (the null class for unconditional);
        t (B, K) each cell's flow time (0 = clean context)."""
        c = self.config
        n = x.shape[1]
        if n % c.cell_len or n > c.seq_len:
            raise ValueError(f"x must hold whole cells of {c.cell_len} tokens (at most {c.seq_len}), got {n}")
        return self._network(x, labels, t, slice(0, n), self.mask[..., :n, :n])

    def _network(self, x, labels, t, positions, mask, pasts=None, record=None) -> Tensor:
        """The encoder-decoder on tokens x at ``positions`` (a slice of the cell order), cells at times t (B, K)."""
        cond = self.cell_conditions(labels, t).repeat_interleave(self.config.cell_len, dim=1)  # (B, L, D)
        return self._trunk(x, cond, positions, mask, pasts, record)

    def _trunk(self, x, cond, positions, mask, pasts=None, record=None) -> Tensor:
        """The encoder-decoder on tokens x at ``positions`` under every token's cell condition ``cond`` (B, L, D)."""
        blocks = [*self.encoder_blocks, *self.decoder_blocks]
        pasts = pasts or [None] * len(blocks)
        h = self.z_proj_ln(self.z_proj(x) + self.encoder_pos_embed_learned[:, positions])
        for i, block in enumerate(blocks):
            if i == len(self.encoder_blocks):
                h = self.decoder_embed(self.encoder_norm(h)) + self.decoder_pos_embed_learned[:, positions]
            h = block(h, cond, mask, positions, pasts[i], record)
        return self.pred(self.decoder_norm(h))

    # --- the context cache ----------------------------------------------------------------------------------

    def context_cache(self, clean: Tensor, labels: Tensor, past: list | None = None) -> list[tuple[Tensor, Tensor]]:
        """Every block's keys and values (B, heads, L, head_dim) of clean context cells (t = 0): what the
        official KV cache holds when the next cell is sampled. clean (B, K * cell_len, d): the K cells after
        those of ``past`` (the keys and values of the earlier clean cells, None: none), which they attend
        to; returns the earlier cells' keys and values with the new ones appended, L = every cell's tokens."""
        m, n = 0 if past is None else past[0][0].shape[2], clean.shape[1]
        record: list = []
        t = clean.new_zeros(clean.shape[0], n // self.config.cell_len)
        self._network(clean, labels, t, slice(m, m + n), self.mask[..., m : m + n, : m + n], past, record)
        if past is None:
            return record
        pairs = zip(past, record, strict=True)
        return [(torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)) for (pk, pv), (k, v) in pairs]

    def forward(self, tokens: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Noisy-context flow matching: every cell its own time t from a logit-normal, x_t = (1 - t) x +
        t eps, target v = eps - x, MSE over all cells at once under the block-causal mask; labels
        dropped to the null class with ``label_drop_prob``. tokens (B, L, d) in cell order."""
        b, dev = tokens.shape[0], tokens.device
        drop = torch.rand(b, generator=generator, device=dev) < self.config.label_drop_prob
        labels = torch.where(drop, torch.full_like(labels, self.null_class), labels)
        t = torch.sigmoid(torch.randn((b, self.config.cells), generator=generator, device=dev))
        eps = torch.randn(tokens.shape, generator=generator, device=dev)
        tt = t.repeat_interleave(self.config.cell_len, dim=1)[..., None]
        v = self.velocity((1 - tt) * tokens + tt * eps, labels, t)
        return (v - (eps - tokens)).pow(2).mean()
