"""GtR, "Generation then Reconstruction" (Yan et al., ICLR 2026, arXiv 2510.17171), for the masked families:
written for this project from the paper's description.

The tokens of a side x side grid (row i, column j) fall into K stages by the checkerboard: the odd cells,
(i + j) mod 2 = 1, are the last stage (the reconstruction, where every token has made neighbours all
round); the even ones are split again by recursive bisection, (i + j) mod 4 = 2 the stage before it, then
mod 8 = 4, ..., and the rest the first stage (a sparse lattice over the whole image: the structure comes
first). Each stage runs its own AR steps (``SamplingConfig.gtr``), in the image's random order
restricted to the stage and MAR's cosine schedule over the stage's tokens, so one stage of every token
is MAR's own plan. Frequency-weighted token selection (FTS) gives the reconstruction tokens of most
high-frequency energy in their condition z more head steps: score
sum_{n=1}^{D/2} |DFT(z)_n| (1 + n / (D/2)), the top share per image and step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.core.chain import ChainNoise, HeadChain, Trajectory
from csd.core.rng import ImageStreams
from csd.core.schedule import step_cfg_scales, step_sizes
from csd.family import Plan


def grid_side(num_tokens: int) -> int:
    """The side of a square token grid of ``num_tokens`` tokens (GtR's checkerboard needs one)."""
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f"GtR needs a square token grid, got {num_tokens} tokens")
    return side


def stage_of(positions: Tensor, side: int, stages: int) -> Tensor:
    """GtR's stage (0 .. stages - 1) of raster positions (any shape) on a side x side grid: with
    v = i + j, the odd v are the last stage; an even v whose largest power of two dividing it is 2^e (e >= 1)
    the stage stages - 1 - e; v = 0 and the v divisible by 2^(stages - 1), stage 0."""
    v = positions // side + positions % side
    stage = torch.zeros_like(v)
    for e in range(stages - 1):  # residue 2^e modulo 2^(e + 1): split off in bisection round e + 1
        stage = torch.where(v % 2 ** (e + 1) == 2**e, stages - 1 - e, stage)
    return stage


def stage_orders(perm: Tensor, stage: Tensor, stages: int) -> Tensor:
    """Plan orders (B, N) from random orders ``perm`` (B, N) and every position's stage (N,): stage 0's
    positions last (the plan consumes orders from the end), each stage in the order ``perm`` gives it."""
    later_first = (stages - 1 - stage)[perm]  # (B, N) of each entry of perm
    return torch.gather(perm, 1, torch.argsort(later_first, dim=1, stable=True))


def gtr_sizes(stage_tokens: Sequence[int], stage_steps: Sequence[int]) -> list[int]:
    """Tokens per AR step: MAR's cosine schedule over each stage's tokens, stage after stage."""
    sizes = []
    for tokens, steps in zip(stage_tokens, stage_steps, strict=True):
        if steps > tokens:
            raise ValueError(f"gtr_stages: a stage of {tokens} tokens takes at most {tokens} AR steps, got {steps}")
        sizes += step_sizes(tokens, steps)
    return sizes


def gtr_plan(seeds: Sequence[int], num_tokens: int, config, device) -> Plan:
    """The plan of GtR's stages (``config.gtr.stages``), its random orders from the images' "order" streams."""
    stages, side = len(config.gtr.stages), grid_side(num_tokens)
    stage = stage_of(torch.arange(num_tokens, device=device), side, stages)
    perm = ImageStreams(seeds, "order", device).randperm(num_tokens)
    counts = torch.bincount(stage, minlength=stages).tolist()
    sizes = gtr_sizes(counts, config.gtr.stages)
    return Plan(stage_orders(perm, stage, stages), sizes, step_cfg_scales(config.cfg_scale, config.cfg_schedule, sizes))


def frequency_score(z: Tensor) -> Tensor:
    """FTS's high-frequency energy of conditions z (n, D): sum_{n=1}^{D/2} |DFT(z)_n| (1 + n / (D/2)), (n,)."""
    half = z.shape[-1] // 2
    amplitude = torch.fft.rfft(z.float(), dim=-1).abs()[:, 1 : half + 1]  # (n, D/2)
    weight = 1.0 + torch.arange(1, half + 1, device=z.device, dtype=amplitude.dtype) / half
    return (amplitude * weight).sum(-1)


def detail_rows(score: Tensor, batch: int, fraction: float) -> Tensor:
    """(rows,) True for the max(1, round(fraction * k)) rows of highest score of each image (rows image-major,
    k per image)."""
    per_image = score.reshape(batch, -1)
    k = per_image.shape[1]
    top = torch.topk(per_image, min(k, max(1, round(fraction * k))), dim=1).indices
    return torch.zeros_like(per_image, dtype=torch.bool).scatter_(1, top, True).reshape(-1)


@dataclass(frozen=True)
class DetailChains:
    """The :class:`csd.family.TokenChain` of a reconstruction step under FTS: the ``long`` chain for the detail
    rows, the ``short`` one for the others. Its noise is the long chain's; a short row takes its xi and first
    eps (the numbers its chain takes without FTS, so FTS changes the detail tokens only), then its token
    waits: its later states are the token, with NaN statistics."""

    long: HeadChain
    short: HeadChain
    detail: Tensor  # (rows,) bool

    @property
    def rows(self) -> int:
        return self.long.rows

    def num_steps(self) -> int:
        return self.long.num_steps()

    def _parts(self) -> tuple[int, Tensor, Tensor]:
        return self.short.num_steps(), self.detail.nonzero().squeeze(-1), (~self.detail).nonzero().squeeze(-1)

    def _merge(self, rows_long: Tensor, rows_short: Tensor, long: Tensor, short: Tensor, pad: Tensor) -> Tensor:
        """long (L, m, d) and short (S, r, d) as (L, rows, d), the short rows' last L - S entries from pad."""
        full = long.new_empty((long.shape[0], self.rows, long.shape[-1]))
        full[:, rows_long] = long
        full[:, rows_short] = torch.cat([short, pad.expand(long.shape[0] - short.shape[0], *short.shape[1:])])
        return full

    def run(self, noise: ChainNoise) -> Trajectory:
        steps, lr, sr = self._parts()
        long = self.long.select(lr).run(noise.select(lr))
        short = self.short.select(sr).run(ChainNoise(noise.xi[sr], noise.eps[: steps - 1, sr]))
        nan = torch.full_like(short.x, float("nan"))
        x = torch.empty_like(noise.xi)
        x[lr], x[sr] = long.x, short.x
        return Trajectory(
            x=x,
            states=self._merge(lr, sr, long.states, short.states, short.x),
            mean=self._merge(lr, sr, long.mean, short.mean, nan),
            std=self._merge(lr, sr, long.std, short.std, nan),
        )

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        steps, lr, sr = self._parts()
        long = self.long.select(lr).evaluate(states[:, lr])
        short = self.short.select(sr).evaluate(states[:steps, sr])
        nan = torch.full(states.shape[2:], float("nan"), dtype=states.dtype, device=states.device)
        mean, std = (self._merge(lr, sr, a, b, nan) for a, b in zip(long, short, strict=True))
        return mean, std

    def select(self, rows: Tensor) -> DetailChains:
        return DetailChains(self.long.select(rows), self.short.select(rows), self.detail[rows])
