"""Speculative sampling of one 1-D Gaussian token: the method in its smallest exact form.

Draft x ~ q, accept with min(1, p(x)/q(x)), otherwise resample from max(0, p - q)/Z. The output
follows p exactly; acceptance is 1 - TV(p, q) and the resampler needs 1/Z = 1/TV tries on
average. The app's how-it-works tab runs this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from csd.core.gaussian import normal_logpdf
from csd.core.resample import resample_gaussian


@dataclass(frozen=True)
class ToyResult:
    samples: np.ndarray  # (n,) output tokens
    accepted: np.ndarray  # (n,) bool, draft token kept
    tries: np.ndarray  # (n,) resampler tries (0 where accepted)
    capped: np.ndarray  # (n,) bool

    @property
    def acceptance(self) -> float:
        return float(self.accepted.mean())

    @property
    def mean_tries(self) -> float:
        t = self.tries[~self.accepted]
        return float(t.mean()) if t.size else float("nan")


def check_gaussian(name: str, mean: float, std: float) -> None:
    if not math.isfinite(mean) or abs(mean) > 100:
        raise ValueError(f"{name} mean must be in [-100, 100], got {mean!r}")
    if not math.isfinite(std) or not 1e-3 <= std <= 100:
        raise ValueError(f"{name} std must be in [0.001, 100], got {std!r}")


def total_variation(p: tuple[float, float], q: tuple[float, float], points: int = 200_001) -> float:
    """TV(p, q) = Z = integral of max(0, p - q), by quadrature over +-10 std of both."""
    lo = min(p[0] - 10 * p[1], q[0] - 10 * q[1])
    hi = max(p[0] + 10 * p[1], q[0] + 10 * q[1])
    x = np.linspace(lo, hi, points)
    pdf = lambda m, s: np.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    return float(np.maximum(0.0, pdf(*p) - pdf(*q)).sum() * (x[1] - x[0]))


def speculative_sample(
    p: tuple[float, float], q: tuple[float, float], n: int, seed: int = 0, max_tries: int = 1000
) -> ToyResult:
    """n independent speculative draws of a token with target p = (mean, std), draft q."""
    check_gaussian("target", *p)
    check_gaussian("draft", *q)
    if not 1 <= n <= 1_000_000:
        raise ValueError(f"number of samples must be in [1, 1000000], got {n!r}")
    g = torch.Generator().manual_seed(seed)
    col = lambda v: torch.full((n, 1), float(v), dtype=torch.float64)
    mp, sp, mq, sq = col(p[0]), col(p[1]), col(q[0]), col(q[1])
    x = mq + sq * torch.randn((n, 1), generator=g, dtype=torch.float64)
    log_r = normal_logpdf(x, mp, sp) - normal_logpdf(x, mq, sq)
    accepted = torch.rand(n, generator=g, dtype=torch.float64).log() < log_r
    out = x.clone()
    tries = torch.zeros(n, dtype=torch.long)
    capped = torch.zeros(n, dtype=torch.bool)
    rej = (~accepted).nonzero().squeeze(-1)
    if rej.numel():

        def draws(k: int, pending: torch.Tensor):
            m = int(pending.sum())
            return torch.randn((m, k, 1), generator=g, dtype=torch.float64), torch.rand(
                (m, k), generator=g, dtype=torch.float64
            )

        res = resample_gaussian(mp[rej], sp[rej], mq[rej], sq[rej], draws, fallback=mp[rej], max_tries=max_tries)
        out[rej], tries[rej], capped[rej] = res.x, res.tries, res.capped
    return ToyResult(out[:, 0].numpy(), accepted.numpy(), tries.numpy(), capped.numpy())
