"""Acceptance-rejection sampling from the modified distribution p'(x) = max(0, p(x) - q(x)) / Z.

Proposal p with bound M = 1/Z (valid because max(0, p - q) <= p): draw x ~ p and keep it with
probability alpha(x) = max(0, 1 - q(x)/p(x)). Expected tries: 1/Z. Output is exactly p'.

Two ways to draw the same law: in rounds (:func:`resample_proposals`: tries for the rows still pending, which
the host reads between rounds), or in one pass (:func:`resample_one_pass`: ``max_tries`` proposals for every
row at once, the first kept one taken; nothing read on the host, the proposals after it drawn and unused).
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
    draws: Callable[[int, Tensor | None], tuple[Tensor, Tensor]],
    fallback: Tensor,
    max_tries: int,
    log_weight: Tensor | None = None,
    chunk: int = 4,
    fallback_name: str = "target",
    one_pass: bool = False,
) -> Resampled:
    """Sample p' for Gaussian p = N(p_mean, p_std^2) and q = w N(q_mean, q_std^2), all (n, d).

    log_weight: (n,) log w, the extra factor of q relative to p (for criterion (a), minus the
    trajectory term); None means w = 1, two normalised densities.
    draws(k, pending) -> (normal (m, k, d), uniform (m, k)) for the m rows where ``pending`` (n,)
    is True: tries are drawn in chunks of ``chunk`` so that the common one-try case stays cheap.
    fallback: (n, d) token taken where all ``max_tries`` are rejected.
    one_pass: draw all ``max_tries`` tries of every row at once (:func:`resample_one_pass`).
    """
    lw = torch.zeros(p_mean.shape[0], device=p_mean.device, dtype=p_mean.dtype) if log_weight is None else log_weight

    def keep(cand: Tensor, idx: Tensor) -> Tensor:
        mp, sp, mq, sq = (a[idx].unsqueeze(1) for a in (p_mean, p_std, q_mean, q_std))
        log_q_over_p = lw[idx].unsqueeze(1) + normal_logpdf(cand, mq, sq) - normal_logpdf(cand, mp, sp)
        return keep_probability(log_q_over_p)

    if one_pass:
        return resample_one_pass(p_mean, p_std, keep, draws, fallback, max_tries, fallback_name)
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
    chunks of ``chunk`` up to ``max_tries``; a row with none keeps ``fallback`` (named ``fallback_name``).
    Each round reads on the host which rows are still pending."""
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


def take_first_kept(cand: Tensor, kept: Tensor, fallback: Tensor, fallback_name: str = "target") -> Resampled:
    """Each row's first kept proposal: cand (n, k, d), kept (n, k) bool. tries: its index + 1, or k where none
    is kept (capped: the row takes ``fallback`` (n, d)). Fixed shapes throughout: nothing read on the host."""
    first, any_kept = first_kept(kept)
    chosen = cand.gather(1, first.view(-1, 1, 1).expand(-1, 1, cand.shape[-1])).squeeze(1)  # (n, d)
    x = torch.where(any_kept.unsqueeze(-1), chosen, fallback)
    tries = torch.where(any_kept, first + 1, kept.shape[-1])
    return Resampled(x=x, tries=tries, capped=~any_kept, fallback=fallback_name)


def resample_one_pass(
    p_mean: Tensor,
    p_scale: Tensor,
    keep: Callable[[Tensor, Tensor], Tensor],
    draws: Callable[[int, None], tuple[Tensor, Tensor]],
    fallback: Tensor,
    max_tries: int,
    fallback_name: str = "target",
) -> Resampled:
    """:func:`resample_proposals` in one pass: ``draws(max_tries, None)`` gives every row's ``max_tries``
    normals (n, k, d) and uniforms (n, k) at once, and each row takes its first kept proposal
    (:func:`take_first_kept`). The first kept of i.i.d. proposals, capped at ``max_tries``, as in rounds: the
    same law, from other random numbers (each row draws all its tries, kept or not)."""
    normal, uniform = draws(max_tries, None)
    rows = torch.arange(p_mean.shape[0], device=p_mean.device)
    cand = p_mean.unsqueeze(1) + p_scale.unsqueeze(1) * normal  # (n, k, d)
    return take_first_kept(cand, uniform < keep(cand, rows), fallback, fallback_name)


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
