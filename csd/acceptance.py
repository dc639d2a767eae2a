"""Acceptance criteria for a drafted continuous token (DESIGN.md sections 3 and 4).

The math is pure functions of trajectories. Each criterion is also an object with three steps, in the
spirit of a diffusers scheduler's ``step()``: :meth:`Criterion.verdict` (log r, split into a trajectory
term and a final-step term so the UI can show which one decides, and the tokens an accepted row
commits), :meth:`Criterion.resample` (rejected rows redrawn from max(0, p - q) / Z) and
:meth:`Criterion.rows` (the :class:`Decision` per row, as the trace records it). A token is accepted with
probability min(1, r). :class:`PerToken` tests the tokens of a multi-token row alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from csd.config import CSDConfig
from csd.core.chain import ChainNoise, Trajectory
from csd.core.gaussian import normal_logpdf
from csd.core.resample import Resampled, resample_gaussian, resample_one_pass, resample_paths, resample_proposals
from csd.family import TokenChain
from csd.settings import Exact, Published


@dataclass(frozen=True)
class Verdict:
    """Per-token log acceptance ratio log r = trajectory + final, each (n,)."""

    trajectory: Tensor
    final: Tensor

    @property
    def log_ratio(self) -> Tensor:
        return self.trajectory + self.final

    @property
    def accept_prob(self) -> Tensor:
        return self.log_ratio.clamp(max=0.0).exp()

    def accept(self, uniforms: Tensor) -> Tensor:
        """The accept decision: u < min(1, r), i.e. log u < log r. uniforms: (n,) in [0, 1)."""
        return uniforms.log() < self.log_ratio


def trajectory_log_std_gap(draft: Trajectory, target: Trajectory) -> Tensor:
    """sum over stochastic steps and dims of log sigma^q - log sigma^p: (n,).

    With shared noise every stochastic transition has density phi(eps) / prod sigma under its own
    model; the phi factors cancel in p(Y_p) / q(Y_q), leaving the ratio of std products."""
    return (draft.std[:-1].log() - target.std[:-1].log()).sum(dim=(0, 2))


def final_step_term(x: Tensor, draft: Trajectory, target: Trajectory, tau_v: float) -> Tensor:
    """log N(x; mu^p_0, (tau_v s^p_0)^2) - log N(x; mu^q_0, (tau_v s^q_0)^2) for draft tokens x (n, d)."""
    return normal_logpdf(x, target.final_mean, tau_v * target.final_std) - normal_logpdf(
        x, draft.final_mean, tau_v * draft.final_std
    )


def aligned_verdict(draft: Trajectory, target: Trajectory, tau_v: float, trajectory_term: str = "derived") -> Verdict:
    """Criterion (a): the paper's approximation p(Y_p) / q(Y_q) for trajectories made from the same noise.

    trajectory_term: "derived" (the sign that follows from the densities), "published" (the sign
    of the reference code) or "none" (final-step term only)."""
    if trajectory_term == "none":  # also for chains of different lengths (a cheaper draft head)
        traj = torch.zeros(draft.x.shape[0], dtype=draft.x.dtype, device=draft.x.device)
    else:
        gap = trajectory_log_std_gap(draft, target)
        traj = {"derived": gap, "published": -gap}[trajectory_term]
    return Verdict(trajectory=traj, final=final_step_term(draft.x, draft, target, tau_v))


def path_log_ratio(states: Tensor, num_mean: Tensor, num_std: Tensor, den_mean: Tensor, den_std: Tensor) -> Tensor:
    """sum over stochastic transitions of log N_num(y_{k+1} | y_k) - log N_den(y_{k+1} | y_k): (n,).

    states: (T, n, d) a path (states[k] is the input of transition k); the means and stds are the
    two models' transitions evaluated at those states, (T, n, d)."""
    nxt = states[1:]
    return normal_logpdf(nxt, num_mean[:-1], num_std[:-1]).sum(0) - normal_logpdf(nxt, den_mean[:-1], den_std[:-1]).sum(
        0
    )


def exact_verdict(draft: Trajectory, target_mean: Tensor, target_std: Tensor) -> Verdict:
    """Criterion (b): speculative sampling on paths; the target's transitions evaluated on the draft path.

    target_mean, target_std: (T, n, d) from :func:`csd.core.chain.evaluate_path` on ``draft.states``.
    xi has the same density under both models and the last step is deterministic, so only the
    stochastic transitions enter. Accepted tokens commit the target's last mean on that path."""
    traj = path_log_ratio(draft.states, target_mean, target_std, draft.mean, draft.std)
    return Verdict(trajectory=traj, final=torch.zeros_like(traj))


# --- criteria as objects ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    """What a criterion sees of a drafted block, rows image-major: the draft's trajectories and chains,
    the target's chains and its trajectory (from the draft's noise when aligned)."""

    draft: Trajectory
    target: Trajectory
    chain_q: TokenChain
    chain_p: TokenChain


class RowDraws(Protocol):
    """Random numbers for the rejected rows, drawn image by image (an image's draws never depend on the
    others'). ``pending`` (m_all,) marks the rejected rows still waiting; results have one row per True.
    ``pending`` None (a one-pass resampler's): one row per row of the block, the same count for every image."""

    def normal(self, pending: Tensor | None, *shape: int) -> Tensor: ...

    def uniform(self, pending: Tensor | None, *shape: int) -> Tensor: ...


@dataclass(frozen=True)
class Decision:
    """A block's verification, one entry per tested unit (a row, or each token of it under :class:`PerToken`),
    image-major: the values committed, log r, the uniform u each unit was tested with (u < min(1, r)
    accepts; NaN where a row's tokens were tested alone), whether it was accepted, which units were rejected
    (and committed: redrawn) and how the resampler redrew them, per unit: its tries (0 where not redrawn) and
    whether it hit the cap (None: nothing redrawn). ``unit_accepted`` (rows,): the fraction of each row's
    tokens accepted when they were tested alone; None when rows were tested whole."""

    x: Tensor  # (units, d)
    verdict: Verdict
    draws: Tensor  # (units,)
    accepted: Tensor  # (units,) bool
    rejected: Tensor  # (units,) bool
    resampled: Resampled | None  # tries and capped (units,); x None
    unit_accepted: Tensor | None = None


class Criterion(Protocol):
    """An acceptance test, its resampler and its results per row. ``units``: tokens tested per row (1: whole
    rows). ``one_pass``: its resampler draws every row's tries at once (rows None), not in rounds."""

    units: int
    one_pass: bool

    def verdict(self, p: Proposal) -> tuple[Verdict, Tensor]:
        """log r of every row and the tokens (rows, d) an accepted row commits."""

    def resample(self, p: Proposal, verdict: Verdict, rows: Tensor | None, draws: RowDraws) -> Resampled:
        """Redraw ``rows`` (the rejected rows' indices; None: every row, in one pass) from max(0, p - q) / Z; a
        capped row takes its fallback (the target's own sample, or zero)."""

    def rows(self, decision: Decision) -> Decision:
        """The decision with one entry per row of the block (what the trace records)."""


def of_rows(a: Tensor, rows: Tensor | None) -> Tensor:
    """``a``'s entries at ``rows`` (indices; None: all of them)."""
    return a if rows is None else a[rows]


class WholeRows:
    """A criterion that tests whole rows: its decision is already one per row."""

    fallback: str = "target"

    def rows(self, decision: Decision) -> Decision:
        return decision

    def fallback_values(self, p: Proposal, rows: Tensor | None) -> Tensor:
        """What a rejected row the resampler never accepts becomes: the target's own sample, or zero."""
        x = of_rows(p.target.x, rows)
        return torch.zeros_like(x) if self.fallback == "zero" else x


@dataclass(frozen=True)
class AlignedCriterion(WholeRows):
    """Criterion (a), the paper's approximation; the resampler draws from the final Gaussians, q weighted
    by the trajectory term (both widened by ``widening``), in rounds or in one pass (``one_pass``)."""

    tau_v: float = 42.0
    trajectory_term: str = "derived"
    widening: float = 1.0
    max_tries: int = 100
    units: int = 1
    fallback: str = "target"
    one_pass: bool = False

    def verdict(self, p: Proposal) -> tuple[Verdict, Tensor]:
        return aligned_verdict(p.draft, p.target, self.tau_v, self.trajectory_term), p.draft.x.clone()

    def resample(self, p: Proposal, verdict: Verdict, rows: Tensor | None, draws: RowDraws) -> Resampled:
        w, d = self.widening, p.target.x.shape[-1]
        return resample_gaussian(
            p_mean=of_rows(p.target.final_mean, rows),
            p_std=w * of_rows(p.target.final_std, rows),
            q_mean=of_rows(p.draft.final_mean, rows),
            q_std=w * of_rows(p.draft.final_std, rows),
            draws=lambda k, pending: (draws.normal(pending, k, d), draws.uniform(pending, k)),
            fallback=self.fallback_values(p, rows),
            max_tries=self.max_tries,
            log_weight=-of_rows(verdict.trajectory, rows),
            fallback_name=self.fallback,
            one_pass=self.one_pass,
        )


@dataclass(frozen=True)
class ExactCriterion(WholeRows):
    """Criterion (b), speculative sampling on paths: the target's transitions on the draft path; the
    resampler proposes whole target paths and keeps them with probability max(0, 1 - q/p), in rounds (each
    proposal is a whole target chain: no one-pass resampler)."""

    max_tries: int = 100
    units: int = 1
    fallback: str = "target"
    one_pass = False

    def verdict(self, p: Proposal) -> tuple[Verdict, Tensor]:
        mean_p, std_p = p.chain_p.evaluate(p.draft.states)
        return exact_verdict(p.draft, mean_p, std_p), mean_p[-1].clone()  # the target's last step on the draft path

    def resample(self, p: Proposal, verdict: Verdict, rejected: Tensor, draws: RowDraws) -> Resampled:
        chain_p, chain_q = p.chain_p.select(rejected), p.chain_q.select(rejected)
        steps, d = p.draft.states.shape[0], p.target.x.shape[-1]

        def propose(pending: Tensor) -> tuple[Tensor, Tensor]:  # a whole target path, weighed by q / p
            raw = draws.normal(pending, steps, d)  # (m, T, d)
            path = chain_p.select(pending).run(ChainNoise(raw[:, 0], raw[:, 1:].transpose(0, 1)))
            mean_q, std_q = chain_q.select(pending).evaluate(path.states)
            return path.x, path_log_ratio(path.states, mean_q, std_q, path.mean, path.std)

        fallback = self.fallback_values(p, rejected)
        return resample_paths(propose, draws.uniform, fallback, self.max_tries, self.fallback)


# --- the published code's test ---------------------------------------------------------------------------


def published_scales(traj: Trajectory, scale: str) -> Tensor:
    """The final step's scale (n, d) as the published code's slots hold it: its std, or its variance."""
    return traj.final_std if scale == "std" else traj.final_std**2


def published_log_fixed(draft: Trajectory, target: Trajectory, dtype: torch.dtype) -> Tensor:
    """log of the published trajectory factor (n,): each model's log stds summed over the stochastic steps in
    ``dtype``, their difference (target minus draft) summed over the dimensions."""
    log_sum = lambda t: t.std[:-1].to(dtype).log().sum(0)  # (n, d)
    return (log_sum(target) - log_sum(draft)).sum(-1)


def published_ratio(x: Tensor, draft: Trajectory, target: Trajectory, tau_v: float, dtype, scale: str) -> Tensor:
    """The published code's acceptance ratio (n,) for draft tokens x (n, d), computed as it does, in ``dtype``:
    exp(-||(x - mu) / s / tau_v||^2 / 2) of each model, s its scale slot, and their ratio times the trajectory
    factor times the draft's product of scales over the target's. A product of many small scales underflows
    in float32 (0 / 0: NaN, which no draw accepts)."""
    x, mp, mq = x.to(dtype), target.final_mean.to(dtype), draft.final_mean.to(dtype)
    sp, sq = published_scales(target, scale).to(dtype), published_scales(draft, scale).to(dtype)
    unnormalised = lambda m, s: torch.exp(-0.5 * (((x - m) / s / tau_v) ** 2).sum(-1))
    fixed = torch.exp(published_log_fixed(draft, target, dtype))
    return unnormalised(mp, sp) * fixed * sq.prod(-1) / (unnormalised(mq, sq) * sp.prod(-1))


def published_keep(cand: Tensor, p: tuple[Tensor, Tensor], q: tuple[Tensor, Tensor], fixed: Tensor) -> Tensor:
    """The published resampler's probability of keeping proposals cand (m, k, d): max(0, p(x) - q(x) / fixed)
    / p(x), each density a product over the dimensions in ``cand``'s dtype (normalised with the product of
    the scales: it underflows as the test does). p, q: (mean, scale) (m, 1, d); fixed: (m, 1)."""
    d = cand.shape[-1]
    pdf = lambda m, s: torch.exp(-0.5 * (((cand - m) / s) ** 2).sum(-1)) / ((2 * math.pi) ** (d / 2) * s.prod(-1))
    px = pdf(*p)
    return (px - pdf(*q) / fixed).clamp(min=0.0) / px


@dataclass(frozen=True)
class PublishedCriterion(WholeRows):
    """What the published code computes (MarkXCloud/CSpD, ``spec_decode/spec_decode_runner.py``,
    ``DistributionProcessor``, read at d91f721): the aligned test with the published sign, as products of
    densities in ``dtype`` (:func:`published_ratio`), the scale slots holding ``scale`` of the final step; its
    resampler proposes from the target's final Gaussian on that scale and keeps a proposal with probability
    max(0, p - q / fixed) / p (un-widened densities, :func:`published_keep`), at most ``max_tries`` tries, in
    rounds or in one pass (``one_pass``); a token never accepted becomes ``fallback`` (the published code
    leaves it zero)."""

    tau_v: float = 42.0
    max_tries: int = 100
    dtype: torch.dtype = torch.float32
    scale: str = "std"
    fallback: str = "zero"
    units: int = 1
    one_pass: bool = False

    def verdict(self, p: Proposal) -> tuple[Verdict, Tensor]:
        log_fixed = published_log_fixed(p.draft, p.target, self.dtype)
        ratio = published_ratio(p.draft.x, p.draft, p.target, self.tau_v, self.dtype, self.scale)
        out = p.draft.x.dtype
        verdict = Verdict(trajectory=log_fixed.to(out), final=(ratio.log() - log_fixed).to(out))
        return verdict, p.draft.x.clone()

    def resample(self, p: Proposal, verdict: Verdict, rows: Tensor | None, draws: RowDraws) -> Resampled:
        """Proposals in the run's dtype, each one's probability of being kept in the products' dtype."""
        d, dtype = p.target.x.shape[-1], self.dtype
        mp, mq = of_rows(p.target.final_mean, rows), of_rows(p.draft.final_mean, rows)
        sp = of_rows(published_scales(p.target, self.scale), rows)
        sq = of_rows(published_scales(p.draft, self.scale), rows)
        fixed = torch.exp(of_rows(published_log_fixed(p.draft, p.target, dtype), rows))

        def keep(cand: Tensor, idx: Tensor) -> Tensor:
            row = lambda a: a[idx].unsqueeze(1).to(dtype)
            q = (row(mq), row(sq))
            return published_keep(cand.to(dtype), (row(mp), row(sp)), q, fixed[idx].unsqueeze(1)).to(cand.dtype)

        normal = lambda k, pending: (draws.normal(pending, k, d), draws.uniform(pending, k))
        fallback = self.fallback_values(p, rows)
        if self.one_pass:
            return resample_one_pass(mp, sp, keep, normal, fallback, self.max_tries, self.fallback)
        return resample_proposals(mp, sp, keep, normal, fallback, self.max_tries, fallback_name=self.fallback)


def split_rows(traj: Trajectory, units: int) -> Trajectory:
    """A trajectory of n rows of ``units`` tokens each as one of n * units rows (row-major)."""
    flat = lambda a: a.reshape(*a.shape[:-2], a.shape[-2] * units, a.shape[-1] // units)
    return Trajectory(x=flat(traj.x), states=flat(traj.states), mean=flat(traj.mean), std=flat(traj.std))


@dataclass(frozen=True)
class PerToken:
    """A criterion applied to every token of a multi-token row alone (xAR's cells under acceptance_unit
    "token"): an approximation to measure, for criteria that need no chains (the aligned one)."""

    inner: AlignedCriterion
    units: int

    @property
    def one_pass(self) -> bool:
        return self.inner.one_pass

    def _split(self, p: Proposal) -> Proposal:
        return Proposal(split_rows(p.draft, self.units), split_rows(p.target, self.units), p.chain_q, p.chain_p)

    def verdict(self, p: Proposal) -> tuple[Verdict, Tensor]:
        return self.inner.verdict(self._split(p))

    def resample(self, p: Proposal, verdict: Verdict, rows: Tensor | None, draws: RowDraws) -> Resampled:
        return self.inner.resample(self._split(p), verdict, rows, draws)

    def rows(self, decision: Decision) -> Decision:
        """Per-token results as per-row ones: the row's tokens side by side, log r summed over them, a row
        accepted when all of its tokens are (rejected otherwise), its tries summed and capped when any token
        was, no single draw (NaN); and each row's accepted fraction."""
        d = decision
        by_row = lambda a: a.reshape(-1, self.units)
        tries = torch.zeros(d.accepted.shape, dtype=torch.long, device=d.accepted.device)
        capped = torch.zeros(d.accepted.shape, dtype=torch.bool, device=d.accepted.device)
        if d.resampled is not None:
            tries, capped = d.resampled.tries.long(), d.resampled.capped
        row_ok = by_row(d.accepted).all(1)
        per_row = Resampled(
            x=None, tries=by_row(tries).sum(1), capped=by_row(capped).any(1), fallback=self.inner.fallback
        )
        return Decision(
            x=d.x.reshape(row_ok.shape[0], -1),
            verdict=Verdict(by_row(d.verdict.trajectory).sum(1), by_row(d.verdict.final).sum(1)),
            draws=torch.full(row_ok.shape, float("nan"), dtype=d.draws.dtype, device=d.draws.device),
            accepted=row_ok,
            rejected=~row_ok,
            resampled=per_row,
            unit_accepted=by_row(d.accepted).float().mean(1),
        )


def criterion_of(csd: CSDConfig, tokens_per_row: int = 1, device: torch.device | str = "cpu") -> Criterion:
    """The criterion a setting names (:mod:`csd.settings`), its resampler as it runs on ``device``
    (:meth:`csd.config.CSDConfig.on_device`); "token" units test each of a row's ``tokens_per_row`` tokens alone."""
    c, fallback = csd.on_device(device).criterion, csd.cap_fallback
    if isinstance(c, Exact):
        return ExactCriterion(c.max_tries, fallback=fallback)
    one_pass = c.resampler == "one_pass"
    if isinstance(c, Published):
        dtype = torch.float64 if c.product_precision == "float64" else torch.float32
        return PublishedCriterion(c.tau_v, c.max_tries, dtype, c.published_scale, fallback, one_pass=one_pass)
    aligned = AlignedCriterion(
        c.tau_v, c.trajectory_term, c.resample_widening, c.max_tries, fallback=fallback, one_pass=one_pass
    )
    if c.acceptance_unit == "token":
        return PerToken(aligned, tokens_per_row)
    return aligned
