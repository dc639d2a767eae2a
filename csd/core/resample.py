"""Acceptance-rejection sampling from the modified distribution p'(x) = max(0, p(x) - q(x)) / Z.

Proposal p with bound M = 1/Z (valid because max(0, p - q) <= p): draw x ~ p and keep it with
probability alpha(x) = max(0, 1 - q(x)/p(x)). Expected tries: 1/Z. Output is exactly p'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.core.gaussian import normal_logpdf


@dataclass(frozen=True)
class Resampled:
    """x: (n, d) tokens; tries: (n,) proposals drawn; capped: (n,) True where no try was kept (then x is the
    fallback: the target's own sample, or zero under ``fallback`` "zero", the published code's)."""

    x: Tensor
    tries: Tensor
    capped: Tensor
    fallback: str = "target"


def keep_probability(log_q_over_p: Tensor) -> Tensor:
    """alpha = max(0, 1 - q/p), computed without overflow for large log q/p."""
    return -torch.expm1(log_q_over_p.clamp(max=0.0))


def first_kept(keep: Tensor) -> tuple[Tensor, Tensor]:
    """Index of the first True along the last dim and whether any is True. keep: (n, k)."""
    any_kept = keep.any(-1)
    return keep.to(torch.int8).argmax(-1), any_kept


def resample_gaussian(
    p_mean: Tensor,
    p_std: Tensor,
    q_mean: Tensor,
    q_std: Tensor,
    draws: Callable[[int, Tensor], tuple[Tensor, Tensor]],
    fallback: Tensor,
    max_tries: int,
    log_weight: Tensor | None = None,
    chunk: int = 4,
    fallback_name: str = "target",
) -> Resampled:
    """Sample p' for Gaussian p = N(p_mean, p_std^2) and q = w N(q_mean, q_std^2), all (n, d).

    log_weight: (n,) log w, the extra factor of q relative to p (for criterion (a), minus the
    trajectory term); None means w = 1, two normalised densities.
    draws(k, pending) -> (normal (m, k, d), uniform (m, k)) for the m rows where ``pending`` (n,)
    is True: tries are drawn in chunks of ``chunk`` so that the common one-try case stays cheap.
    fallback: (n, d) token taken where all ``max_tries`` are rejected.
    """
    lw = torch.zeros(p_mean.shape[0], device=p_mean.device, dtype=p_mean.dtype) if log_weight is None else log_weight

    def keep(cand: Tensor, idx: Tensor) -> Tensor:
        mp, sp, mq, sq = (a[idx].unsqueeze(1) for a in (p_mean, p_std, q_mean, q_std))
        log_q_over_p = lw[idx].unsqueeze(1) + normal_logpdf(cand, mq, sq) - normal_logpdf(cand, mp, sp)
        return keep_probability(log_q_over_p)

    return resample_proposals(p_mean, p_std, keep, draws, fallback, max_tries, chunk, fallback_name)


def resample_proposals(
    p_mean: Tensor,
    p_scale: Tensor,
    keep: Callable[[Tensor, Tensor], Tensor],
    draws: Callable[[int, Tensor], tuple[Tensor, Tensor]],
    fallback: Tensor,
    max_tries: int,
    chunk: int = 4,
    fallback_name: str = "target",
) -> Resampled:
    """Acceptance-rejection with proposals p_mean + p_scale * normal (n, d): ``keep(cand (m, k, d), rows (m,))``
    is each proposal's probability of being kept (m, k); the first kept one of each row is its token, tried in
    chunks of ``chunk`` up to ``max_tries``; a row with none keeps ``fallback`` (named ``fallback_name``)."""
    n = p_mean.shape[0]
    x = fallback.clone()
    tries = torch.zeros(n, dtype=torch.long, device=p_mean.device)
    pending = torch.ones(n, dtype=torch.bool, device=p_mean.device)
    used = 0
    while used < max_tries and bool(pending.any()):
        k = min(chunk, max_tries - used)
        normal, uniform = draws(k, pending)  # (m, k, d), (m, k)
        idx = pending.nonzero().squeeze(-1)
        cand = p_mean[idx].unsqueeze(1) + p_scale[idx].unsqueeze(1) * normal  # (m, k, d)
        first, kept = first_kept(uniform < keep(cand, idx))
        x[idx[kept]] = cand[kept, first[kept]]
        tries[idx] += torch.where(kept, first + 1, torch.full_like(first, k))
        pending[idx[kept]] = False
        used += k
    return Resampled(x=x, tries=tries, capped=pending, fallback=fallback_name)


def resample_paths(
    propose: Callable[[Tensor], tuple[Tensor, Tensor]],
    uniforms: Callable[[Tensor], Tensor],
    fallback: Tensor,
    max_tries: int,
    fallback_name: str = "target",
) -> Resampled:
    """Acceptance-rejection for path proposals (criterion (b)), one round per try.

    propose(pending) -> (x (m, d), log q/p of the proposed path (m,)) for the m pending rows:
    a fresh target path and the draft/target density ratio along it.
    uniforms(pending) -> (m,) uniforms for those rows."""
    n = fallback.shape[0]
    x = fallback.clone()
    tries = torch.zeros(n, dtype=torch.long, device=fallback.device)
    pending = torch.ones(n, dtype=torch.bool, device=fallback.device)
    for _ in range(max_tries):
        if not bool(pending.any()):
            break
        idx = pending.nonzero().squeeze(-1)
        cand, log_q_over_p = propose(pending)
        kept = uniforms(pending) < keep_probability(log_q_over_p)
        tries[idx] += 1
        x[idx[kept]] = cand[kept]
        pending[idx[kept]] = False
    return Resampled(x=x, tries=tries, capped=pending, fallback=fallback_name)
