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

This module is the network and its training objective (noisy-context flow matching); the sampler
and speculative decoding over cells build on :meth:`XAR.velocity`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.chain import ChainNoise, Trajectory, run_chain
from csd.family import Plan
from csd.models.head import TimestepEmbedder
from csd.models.masked import check_labels


@dataclass(frozen=True)
class XARConfig:
    """Architecture of an xAR model: a ``grid`` x ``grid`` token grid of ``token_dim`` channels, split
    into ``cells`` square cells generated one per AR step."""

    grid: int = 16
    token_dim: int = 16
    cells: int = 4
    embed_dim: int = 768
    encoder_depth: int = 8
    decoder_depth: int = 8
    num_heads: int = 12
    mlp_ratio: float = 4.0
    class_num: int = 1000
    label_drop_prob: float = 0.1
    rope_theta: float = 10000.0
    flow_steps: int = 50  # Euler-Maruyama steps per cell (the published settings: B 40, L and H 50)

    def __post_init__(self) -> None:
        for name in ("grid", "token_dim", "cells", "embed_dim", "encoder_depth", "decoder_depth", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"XARConfig.{name} must be an int >= 1, got {value!r}")
        side = math.isqrt(self.cells)
        if side * side != self.cells or self.grid % side:
            raise ValueError(
                f"XARConfig.cells ({self.cells}) must be a square whose side divides the grid ({self.grid})"
            )
        if self.embed_dim % self.num_heads or (self.embed_dim // self.num_heads) % 4:
            raise ValueError(
                f"XARConfig.embed_dim ({self.embed_dim}) / num_heads ({self.num_heads}) must be a multiple of 4 "
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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> XARConfig:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown XARConfig fields: {unknown}")
        return cls(**data)


def _sizes(dim: int, depth: int, heads: int) -> dict:
    return dict(embed_dim=dim, encoder_depth=depth, decoder_depth=depth, num_heads=heads)


# The official sizes (ImageNet 256, KL-16 latents: a 16 x 16 grid in 4 cells of 8 x 8).
XAR_CONFIGS: dict[str, XARConfig] = {
    "xar_base": XARConfig(**_sizes(768, 8, 12), flow_steps=40),
    "xar_large": XARConfig(**_sizes(1024, 16, 16)),
    "xar_huge": XARConfig(**_sizes(1280, 20, 16)),
    # The embedded pair: 32 x 32 shapes images as an 8 x 8 grid of 4 x 4 RGB patches (d = 48), in 16 cells
    # of 2 x 2 tokens (16 AR steps), 10 classes; 25 flow steps per cell keep CPU sampling quick.
    "shapes_xar_target": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(192, 6, 6)),
    "shapes_xar_draft": XARConfig(grid=8, token_dim=48, cells=16, class_num=10, flow_steps=25, **_sizes(96, 2, 3)),
    "xar_test": XARConfig(
        grid=4, cells=4, embed_dim=32, encoder_depth=1, decoder_depth=1, num_heads=2, class_num=10, flow_steps=6
    ),
}


def xar_config(name: str, **overrides) -> XARConfig:
    if name not in XAR_CONFIGS:
        raise ValueError(f"unknown xAR config {name!r}; choose from {sorted(XAR_CONFIGS)}")
    return replace(XAR_CONFIGS[name], **overrides)


# --- layout --------------------------------------------------------------------------------------


def cfg_ramp(cfg: float, cell: int, cells: int) -> float:
    """xAR's guidance per cell: 1 at the first cell, rising linearly to ``cfg`` at the last."""
    return cfg if cells == 1 else 1.0 + (cfg - 1.0) * cell / (cells - 1)


def flow_times(num_steps: int) -> Tensor:
    """The official Euler-Maruyama time grid: ``num_steps`` times from 1 to 0.04, then 0 (float64):
    num_steps - 1 stochastic steps and one deterministic last step."""
    if not isinstance(num_steps, int) or num_steps < 2:
        raise ValueError(f"flow steps must be an int >= 2, got {num_steps!r}")
    return torch.cat([torch.linspace(1.0, 0.04, num_steps, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])


def cell_order(grid: int, cells: int) -> Tensor:
    """Raster index of each position in cell order: cells row-major, tokens row-major inside a cell
    (the official ``clusterify``). (grid*grid,) long."""
    per = math.isqrt(cells)
    side = grid // per
    index = torch.arange(grid * grid).reshape(per, side, per, side)  # (cell row, row in cell, cell col, col)
    return index.permute(0, 2, 1, 3).reshape(-1)


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
        out = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
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

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, H, L, head_dim) at ``positions`` (L,) in cell order (default: the first L)."""
        cos = self.freqs_cos[: x.shape[2]] if positions is None else self.freqs_cos[positions]
        sin = self.freqs_sin[: x.shape[2]] if positions is None else self.freqs_sin[positions]
        return x * cos + rotate_pairs(x) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, grid: int, cells: int, theta: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.rope = Rope2d(dim // num_heads, grid, cells, theta)

    def forward(
        self, x: Tensor, mask: Tensor | None, positions: Tensor | None = None, past=None, record=None
    ) -> Tensor:
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


# --- the official sampler as a Gaussian chain ---------------------------------------------------------


@dataclass(frozen=True)
class CellCondition:
    """What the chains of ``cells`` consecutive cells per image, from cell ``first``, are conditioned on:
    labels (B,), the cache of every clean cell before the last of them (the context, then the drafted
    cells; of the doubled batch [labels; null] when guided) and the guidance scale per row (B * cells,)."""

    labels: Tensor
    first: int
    cells: int
    cache: list | None
    cfg: Tensor | None = None  # None: unguided

    def attention_mask(self, cell_len: int, device) -> Tensor | None:
        """Drafted cell j attends to the clean cells before it and to itself: (1, 1, Q, K) additive."""
        if self.cells == 1:
            return None  # all of the cache is earlier
        clean = self.first + self.cells - 1
        query_cell = self.first + torch.arange(self.cells * cell_len, device=device) // cell_len  # absolute
        clean_cell = torch.arange(clean * cell_len, device=device) // cell_len
        own = torch.arange(self.cells * cell_len, device=device) // cell_len
        allowed = torch.cat(
            [clean_cell[None] < query_cell[:, None], own[None] == (query_cell[:, None] - self.first)], dim=1
        )
        return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))[None, None]


class CellFlow:
    """xAR's Euler-Maruyama sampler as a :class:`csd.chain.GaussianChain` over flattened cells
    (cell_len * d per row; rows image-major): at time t with step dt < 0,

        mu = y + dt ((2 - t) v + y),   sigma = sqrt(2 t |dt|)   (N - 1 steps),   x = mu at the last,

    (the last step's sigma is reported too, by the same formula, as the final token's width),

    v the velocity, guided on the doubled batch as v_u + cfg (v_c - v_u). sigma does not depend on
    the model. Several cells per image advance together, one backbone pass per step (block
    verification). States are float64 (as the official sampler's); the network runs in its dtype."""

    def __init__(self, model: XAR, num_steps: int):
        self.model, self.times = model, flow_times(num_steps)
        self.token_dim = model.token_dim

    def num_steps(self) -> int:
        return len(self.times) - 1

    def transition(self, y: Tensor, step: int, cond: CellCondition) -> tuple[Tensor, Tensor]:
        m, c = self.model, self.model.config
        t, t_next = self.times[step].item(), self.times[step + 1].item()
        dt, b, k = t_next - t, cond.labels.shape[0], cond.cells
        x = y.reshape(b, k * c.cell_len, c.token_dim)
        dtype, dev = m.z_proj.weight.dtype, y.device
        positions = torch.arange(cond.first * c.cell_len, (cond.first + k) * c.cell_len, device=dev)
        mask = cond.attention_mask(c.cell_len, dev)
        net = lambda xx, labels: m._network(
            xx.to(dtype), labels, xx.new_full((xx.shape[0], k), t, dtype=dtype), positions, mask, cond.cache
        ).to(torch.float64)
        if cond.cfg is None:
            v = net(x, cond.labels)
        else:
            vv = net(torch.cat([x, x]), torch.cat([cond.labels, torch.full_like(cond.labels, m.null_class)]))
            v_c, v_u = vv[:b], vv[b:]
            scale = cond.cfg.to(torch.float64).reshape(b, k).repeat_interleave(c.cell_len, dim=1)[..., None]
            v = v_u + scale * (v_c - v_u)
        x64 = x.to(torch.float64)
        mu = (x64 + dt * ((2.0 - t) * v + x64)).reshape(b * k, -1)
        # The last step is deterministic (never sampled from); its std, by the same formula at t = 0.04, is
        # the width the acceptance test's final-step term and the resampler give the final token.
        return mu, torch.full_like(mu, math.sqrt(2.0 * t * abs(dt)))


@dataclass(frozen=True)
class CellChain:
    """The :class:`csd.family.TokenChain` of ``cond.cells`` cells per image (rows image-major)."""

    flow: CellFlow
    cond: CellCondition
    temperature: float = 1.0

    @property
    def rows(self) -> int:
        return int(self.cond.labels.shape[0]) * self.cond.cells

    def num_steps(self) -> int:
        return self.flow.num_steps()

    def run(self, noise: ChainNoise) -> Trajectory:
        noise = ChainNoise(noise.xi.to(torch.float64), noise.eps.to(torch.float64))  # float64 states
        traj = run_chain(self.flow, self.cond, noise, self.temperature)
        # float64 inside the chain; float32 out, as every other family's tokens and statistics
        return Trajectory(x=traj.x.float(), states=traj.states.float(), mean=traj.mean.float(), std=traj.std.float())

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """Every transition at another path's states (T, rows, d): one pass per step."""
        out = [self.flow.transition(states[k].to(torch.float64), k, self.cond) for k in range(states.shape[0])]
        mean, std = torch.stack([mu for mu, _ in out]), torch.stack([sd for _, sd in out]) * self.temperature
        return mean.float(), std.float()

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self, rows)


@dataclass(frozen=True)
class JoinedCells:
    """The draft's chains of a block, one AR step (one cell per image) each, as one chain whose rows are
    image-major over the block: row b * k + j is image b's cell j, a row of ``chains[j]``."""

    chains: tuple

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chains)

    def num_steps(self) -> int:
        return self.chains[0].num_steps()

    def _split(self, x: Tensor) -> list[Tensor]:  # (..., B * k, d) -> k of (..., B, d)
        k = len(self.chains)
        return list(x.reshape(*x.shape[:-2], -1, k, x.shape[-1]).unbind(-2))

    @staticmethod
    def _merge(parts: list[Tensor]) -> Tensor:  # k of (..., B, d) -> (..., B * k, d)
        x = torch.stack(parts, dim=-2)
        return x.reshape(*x.shape[:-3], -1, x.shape[-1])

    def run(self, noise: ChainNoise) -> Trajectory:
        xis, epss = self._split(noise.xi), self._split(noise.eps)
        trajs = [c.run(ChainNoise(xi, eps)) for c, xi, eps in zip(self.chains, xis, epss, strict=True)]
        return Trajectory(*(self._merge([getattr(t, f) for t in trajs]) for f in ("x", "states", "mean", "std")))

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        out = [c.evaluate(s) for c, s in zip(self.chains, self._split(states), strict=True)]
        return self._merge([m for m, _ in out]), self._merge([s for _, s in out])

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self, rows)


@dataclass(frozen=True)
class SelectedCells:
    """Some rows of a block's chains (the exact criterion resamples the rejected ones). The rows of a
    block are independent given its clean cells (a noisy cell attends to the clean cells and to itself
    only), so the whole chain runs with the other rows' noise (states) at zero and the selected rows
    are kept: the same numbers as the rows alone, at the cost of the whole block."""

    chain: CellChain | JoinedCells
    index: Tensor  # (m,) rows of ``chain``

    @property
    def rows(self) -> int:
        return int(self.index.numel())

    def num_steps(self) -> int:
        return self.chain.num_steps()

    def _pad(self, x: Tensor) -> Tensor:  # (..., m, d) -> (..., chain.rows, d), zeros elsewhere
        full = x.new_zeros(*x.shape[:-2], self.chain.rows, x.shape[-1])
        full[..., self.index, :] = x
        return full

    def run(self, noise: ChainNoise) -> Trajectory:
        return self.chain.run(ChainNoise(self._pad(noise.xi), self._pad(noise.eps))).select(self.index)

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        mean, std = self.chain.evaluate(self._pad(states))
        return mean[:, self.index], std[:, self.index]

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self.chain, self.index[rows])


class XAR(nn.Module):
    """xAR. As a :class:`csd.family.ModelFamily` its tokens are whole cells: ``seq_len`` = cells,
    ``token_dim`` = cell_len * d, one cell per AR step in raster order of cells."""

    def __init__(self, config: XARConfig):
        super().__init__()
        c = self.config = config
        d, args = c.embed_dim, (c.num_heads, c.mlp_ratio, c.grid, c.cells, c.rope_theta)
        self.seq_len, self.token_dim = c.cells, c.cell_len * c.token_dim
        self.tokens_per_row = c.cell_len  # for acceptance_unit "token"
        self.fixed_num_steps = c.cells  # one AR step per cell (csd.family.fixed_num_steps)
        self.head_per_block = True  # the flow chain is the backbone, run over a block's cells at once
        self.class_emb = nn.Embedding(c.class_num + 1, d)  # the last row is the null class
        self.time_embed = TimestepEmbedder(d)
        self.z_proj = nn.Linear(c.token_dim, d)
        self.z_proj_ln = RMSNorm(d, weight=True)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, d))
        self.encoder_blocks = nn.ModuleList(Block(d, *args) for _ in range(c.encoder_depth))
        self.encoder_norm = RMSNorm(d, weight=True)
        self.decoder_embed = nn.Linear(d, d)
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, d))
        self.decoder_blocks = nn.ModuleList(Block(d, *args) for _ in range(c.decoder_depth))
        self.decoder_norm = RMSNorm(d, weight=True)
        self.pred = nn.Linear(d, c.token_dim)
        self.register_buffer("mask", block_causal_mask(c.cells, c.cell_len))
        self._init_weights()

    def _init_weights(self) -> None:
        for p in (self.class_emb.weight, self.encoder_pos_embed_learned, self.decoder_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def num_classes(self) -> int:
        return self.config.class_num

    @property
    def null_class(self) -> int:
        return self.config.class_num

    def cell_conditions(self, labels: Tensor, t: Tensor) -> Tensor:
        """labels (B,), t (B, K) the flow time of each of K cells -> (B, K, D)."""
        steps = torch.floor(t * 1000).long()  # the official time input: floor(1000 t)
        return self.class_emb(labels)[:, None] + self.time_embed(steps.reshape(-1)).reshape(*t.shape, -1)

    def velocity(self, x: Tensor, labels: Tensor, t: Tensor) -> Tensor:
        """The velocity of every token of the first K cells, in one block-causal pass.

        x (B, K * cell_len, d) tokens in cell order; labels (B,) (the null class for unconditional);
        t (B, K) each cell's flow time (0 = clean context)."""
        c = self.config
        n = x.shape[1]
        if n % c.cell_len or n > c.seq_len:
            raise ValueError(f"x must hold whole cells of {c.cell_len} tokens (at most {c.seq_len}), got {n}")
        return self._network(x, labels, t, torch.arange(n, device=x.device), self.mask[..., :n, :n])

    def _network(self, x, labels, t, positions, mask, pasts=None, record=None) -> Tensor:
        """The encoder-decoder on tokens x at ``positions`` (cell order), cells at times t (B, K)."""
        c = self.config
        cond = self.cell_conditions(labels, t).repeat_interleave(c.cell_len, dim=1)  # (B, L, D)
        blocks = [*self.encoder_blocks, *self.decoder_blocks]
        pasts = pasts or [None] * len(blocks)
        h = self.z_proj_ln(self.z_proj(x) + self.encoder_pos_embed_learned[:, positions])
        for i, block in enumerate(blocks):
            if i == len(self.encoder_blocks):
                h = self.decoder_embed(self.encoder_norm(h)) + self.decoder_pos_embed_learned[:, positions]
            h = block(h, cond, mask, positions, pasts[i], record)
        return self.pred(self.decoder_norm(h))

    # --- the model family -----------------------------------------------------------------------------

    def check_conditions(self, conditions, batch: int, device: torch.device) -> Tensor:
        return check_labels(conditions, self.num_classes, batch, device)

    def plan(self, seeds, config, device: torch.device) -> Plan:
        cells = self.config.cells
        if config.num_steps != cells:
            raise ValueError(
                f"num_steps (AR steps) must equal the cells of this xAR model ({cells}), got {config.num_steps}"
            )
        if config.cfg_schedule != "linear":
            raise ValueError("xAR ramps CFG over the cells: cfg_schedule must be 'linear'")
        orders = torch.arange(cells - 1, -1, -1, device=device).expand(len(seeds), -1)  # cell 0 first
        return Plan(orders, [1] * cells, [cfg_ramp(config.cfg_scale, s, cells) for s in range(cells)])

    def head_steps(self, steps: int | None) -> int:
        return steps or self.config.flow_steps

    def predict(self, tokens, mask, conditions, pos, cfg, config, steps) -> CellChain:
        """The chain of the next cell of every image: its context is every earlier cell, clean."""
        cell = int(pos[0, 0])
        if pos.shape[1] != 1 or bool((pos != cell).any()):
            raise ValueError("xAR predicts one cell per AR step, the same for every image")
        return self._chain(tokens[:, :cell], conditions, cell, 1, cfg, config, steps)

    def verify(self, tokens, mask, conditions, pos, cfg, config, steps, drafted=None) -> CellChain:
        """The chains of a drafted block of consecutive cells in one pass per flow step: each drafted
        cell conditioned on the clean cells before it, the context's and the drafted ones."""
        first, k = int(pos[0, 0]), pos.shape[1]
        expected = torch.arange(first, first + k, device=pos.device)
        if bool((pos != expected).any()):
            raise ValueError("xAR verifies consecutive cells, the same for every image")
        if drafted is None:
            raise ValueError("xAR verifies each drafted cell given the cells drafted before it: pass drafted")
        b = tokens.shape[0]
        clean = torch.cat([tokens[:, :first], drafted.reshape(b, k, -1)[:, : k - 1].to(tokens.dtype)], dim=1)
        return self._chain(clean, conditions, first, k, cfg, config, steps)

    def _chain(self, clean_cells: Tensor, labels: Tensor, first: int, k: int, cfg, config, steps) -> CellChain:
        """Chains of cells first .. first + k - 1 over the clean cells (B, C, cell width) before the last."""
        b, c = clean_cells.shape[0], self.config
        clean = clean_cells.reshape(b, -1, c.token_dim)
        guided = config.guided
        both = torch.cat([labels, torch.full_like(labels, self.null_class)]) if guided else labels
        cache = self.context_cache(torch.cat([clean, clean]) if guided else clean, both)
        cond = CellCondition(labels, first, k, cache, cfg if guided else None)
        return CellChain(CellFlow(self, self.head_steps(steps)), cond, config.temperature)

    def join(self, chains, batch: int) -> JoinedCells:
        return JoinedCells(tuple(chains))

    # --- sampling ----------------------------------------------------------------------------------

    def context_cache(self, clean: Tensor, labels: Tensor) -> list[tuple[Tensor, Tensor]] | None:
        """Every block's keys and values of the clean context cells (t = 0): what the official KV
        cache holds when the next cell is sampled. clean (B, K * cell_len, d); None for K = 0."""
        n = clean.shape[1]
        if n == 0:
            return None
        record: list = []
        t = clean.new_zeros(clean.shape[0], n // self.config.cell_len)
        self._network(clean, labels, t, torch.arange(n, device=clean.device), self.mask[..., :n, :n], None, record)
        return record

    def cell_velocity(self, x: Tensor, labels: Tensor, t: Tensor, cell: int, cache) -> Tensor:
        """The velocity of cell ``cell`` at noisy tokens x (B, cell_len, d) and times t (B,), attending
        to the cached context cells (all earlier) and to itself."""
        cl = self.config.cell_len
        positions = torch.arange(cell * cl, (cell + 1) * cl, device=x.device)
        return self._network(x, labels, t[:, None], positions, None, cache)

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


# --- official checkpoints ------------------------------------------------------------------------------

OFFICIAL_FILES = {"xar_base": "xAR-B.pth", "xar_large": "xAR-L.pth", "xar_huge": "xAR-H.pth"}


def load_official_xar(path, config: str | XARConfig = "xar_base") -> XAR:
    """An official ``xAR-{B,L,H}.pth`` (Hub: OliverRen/xAR; a flat state dict, buffers included) read
    with ``weights_only=True`` and loaded strictly: missing, unexpected and misshapen keys are named."""
    from csd.models.checkpoint import load_state_strict, safe_torch_load

    state = safe_torch_load(path)
    model = XAR(xar_config(config) if isinstance(config, str) else config)
    load_state_strict(model, state, str(path))
    return model.eval()
