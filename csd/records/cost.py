"""Cost model of block CSD (DESIGN.md section 6): pass counts and the speedup bound.

Target-only with S AR steps costs S (C_p + H_p). Block CSD with P pre-fill steps drafts the other
S - P steps and verifies them in ceil((S - P) / gamma) target passes:

    (S - P)(C_q + H_q) + (P + ceil((S - P) / gamma)) C_p + S H_p   (+ resampling and overhead)

With P = 0 and gamma dividing S this is DESIGN.md's ``S (C_q + H_q) + (S / gamma) C_p + S H_p``. The
functions take the configs whole: a ``CSDConfig.gamma_schedule`` sets the lengths of the first blocks.

The model charges the target head per AR step (S H_p, as measured in target-only runs), but CSD runs
it once per block over every drafted token; where per-call overhead dominates the head (batch 1 on a
CPU) that is much cheaper, so a measured speedup can exceed this "bound".

The frontier's per-pass model (:class:`PassCosts`, bottom) charges what a run actually did, phase by
phase (``Trace.work``): each backbone pass at its measured cost, each head chain call at
``steps * (a + b * tokens)``, ``a`` the per-transition cost of a call whatever its size (what dominates
at batch 1 on a CPU), ``b`` the cost per token-transition (what dominates at large batches), both fitted
from the target-only and draft-only runs of the same run at two AR-step counts. So one model covers
both regimes: at batch 1 a block's verification chain costs about one step's, at batch 8 it costs in
proportion to its tokens.

The head's samplers are charged by the network calls they make: ``Trace.work`` counts a chain's calls
(``SamplingConfig.head_calls``), so a Heun step of xAR's ODE costs two velocity calls, an Euler, DDIM or
Euler-Maruyama step one, as a DDPM step. GtR changes the AR steps and the tokens of each, which the work
counts as it does for any plan. Its FTS is charged at the detail tokens' length for every token of a
reconstruction step (the calls of the shorter chain of the other tokens are left out): an
approximation over one or two AR steps' heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from csd.config import CSDConfig, SamplingConfig
from csd.core.schedule import step_sizes


def prefill_steps(sizes: list[int], prefill: float) -> int:
    """AR steps the target makes alone: as in ``speculative_generate``, until prefill * N tokens exist."""
    n, steps, made = sum(sizes), 0, 0
    while steps < len(sizes) and made < prefill * n:
        made += sizes[steps]
        steps += 1
    return steps


def _blocks(csd: CSDConfig, steps: int) -> tuple[int, int]:
    """(blocks of ``csd.gamma_schedule`` that ``steps`` drafted AR steps run, the steps left after them)."""
    blocks, left = 0, steps
    for g in csd.gamma_schedule:
        if left <= 0:
            break
        blocks, left = blocks + 1, left - g
    return blocks, max(0, left)


def csd_passes(num_tokens: int, sampling: SamplingConfig, csd: CSDConfig) -> tuple[int, int]:
    """(target passes, draft passes) of one block-CSD generation of ``num_tokens`` tokens: the pre-fill
    steps, then a pass per block (``csd.gamma_schedule``'s lengths first, ``csd.gamma`` after them)."""
    p = prefill_steps(step_sizes(num_tokens, sampling.num_steps), csd.prefill)
    blocks, left = _blocks(csd, sampling.num_steps - p)
    return p + blocks + math.ceil(left / csd.gamma), sampling.num_steps - p


@dataclass(frozen=True)
class StepCosts:
    """Seconds per AR step: backbone passes C and head chains H of target p and draft q."""

    target_backbone: float
    target_head: float
    draft_backbone: float
    draft_head: float

    def __post_init__(self) -> None:
        for name in ("target_backbone", "target_head", "draft_backbone", "draft_head"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"{name} cost must be finite and >= 0, got {v!r}")
        if self.target_backbone + self.target_head <= 0.0:
            raise ValueError("target costs must not both be zero")


def speedup_bound(
    costs: StepCosts, num_tokens: int, sampling: SamplingConfig, csd: CSDConfig, head_per_block: bool = False
) -> float:
    """Target-only cost over block-CSD cost for the same S, without resampling and overhead; the blocks as
    :func:`csd_passes` counts them (a ``gamma_schedule`` included).

    ``head_per_block``: the target's chain of a whole block costs what one step's does (xAR: its flow
    chain is the backbone itself, run over the block's cells at once), so verification is charged
    (P + blocks) (C_p + H_p) instead of (P + blocks) C_p + S H_p."""
    s = sampling.num_steps
    passes, drafted = csd_passes(num_tokens, sampling, csd)
    c_p, h_p, c_q, h_q = costs.target_backbone, costs.target_head, costs.draft_backbone, costs.draft_head
    verify = passes * (c_p + h_p) if head_per_block else passes * c_p + s * h_p
    return s * (c_p + h_p) / (drafted * (c_q + h_q) + verify)


def simple_bound(costs: StepCosts, sampling: SamplingConfig, csd: CSDConfig) -> float:
    """C_p / (C_q + C_p / gamma): the bound when the heads are free and nothing is pre-filled, gamma the
    mean draft length of the blocks (``csd.gamma_schedule``'s, then ``csd.gamma``; a last block counted in
    part)."""
    blocks, left = _blocks(csd, sampling.num_steps)
    per_step = (blocks + left / csd.gamma) / sampling.num_steps  # target passes per drafted step
    return costs.target_backbone / (costs.draft_backbone + costs.target_backbone * per_step)


# --- per-pass costs and a run's predicted time (the frontier's cost model) -------------------------

# Trace phases whose time the per-pass model predicts, by model; the rest (acceptance test,
# resampling, bookkeeping) is what the prediction leaves out.
BACKBONE_PHASES = {"target": ("target_backbone", "prefill_backbone"), "draft": ("draft_backbone",)}
CHAIN_PHASES = {"target": ("target_head", "prefill_head", "next_head"), "draft": ("draft_head",)}


@dataclass(frozen=True)
class ChainCost:
    """Seconds of a head chain call of ``steps`` transitions over ``tokens`` tokens (counted over the
    batch): ``steps * (per_transition + tokens * per_token_transition)``. The first term is what a call
    costs however few tokens it holds (kernel launches, Python; dominant at batch 1 on a CPU), the
    second what grows with the tokens (the arithmetic; dominant at large batches)."""

    per_transition: float
    per_token_transition: float = 0.0

    def seconds(self, steps: float, token_steps: float) -> float:
        return self.per_transition * steps + self.per_token_transition * token_steps


@dataclass(frozen=True)
class PassCosts:
    """Measured per-pass costs of a pair at one batch: a backbone pass of each model and each model's
    chain cost (:class:`ChainCost`)."""

    target_pass: float
    draft_pass: float
    target_chain: ChainCost
    draft_chain: ChainCost

    def predict(self, work: dict[str, dict[str, int]]) -> float:
        """Seconds a run with this ``work`` (Trace.work: per phase calls, steps, token_steps) should take."""
        total = 0.0
        for model, per_pass, chain in (
            ("target", self.target_pass, self.target_chain),
            ("draft", self.draft_pass, self.draft_chain),
        ):
            total += per_pass * sum(work.get(p, {}).get("calls", 0) for p in BACKBONE_PHASES[model])
            for p in CHAIN_PHASES[model]:
                w = work.get(p, {})
                total += chain.seconds(w.get("steps", 0), w.get("token_steps", 0))
        return total


def phase_totals(times: dict[str, float], work: dict[str, dict[str, int]], phases: Sequence[str]) -> tuple:
    """(seconds, calls, steps, token_steps) summed over ``phases`` of one run."""
    sec = sum(times.get(p, 0.0) for p in phases)
    calls, steps, token_steps = (sum(work.get(p, {}).get(k, 0) for p in phases) for k in WORK_KEYS)
    return sec, calls, steps, token_steps


WORK_KEYS = ("calls", "steps", "token_steps")


def fit_chain(runs: Sequence[tuple[float, float, float]]) -> ChainCost:
    """A :class:`ChainCost` from runs' (seconds, steps, token_steps) of one model's chain phases.

    Two runs with different tokens per transition (a model at two AR-step counts) fix both terms
    (least squares over more); where the tokens per transition do not differ (one run, or a family
    whose AR steps are fixed) or the fit would make a term negative, the chain is charged per
    transition only."""
    runs = [r for r in runs if r[1] > 0]
    if not runs:
        return ChainCost(0.0)
    sec, steps, tok = (np.asarray(v, dtype=float) for v in zip(*runs, strict=True))
    per_call = ChainCost(float(sec.sum() / steps.sum()))
    density = tok / steps
    if len(runs) < 2 or np.ptp(density) < 1e-9 * max(density.max(), 1.0):
        return per_call
    (a, b), *_ = np.linalg.lstsq(np.stack([steps, tok], axis=1), sec, rcond=None)
    return ChainCost(float(a), float(b)) if a >= 0 and b >= 0 else per_call


def fit_pass(runs: Sequence[tuple[float, float]]) -> float:
    """Seconds per backbone pass from runs' (seconds, calls)."""
    sec, calls = sum(r[0] for r in runs), sum(r[1] for r in runs)
    return sec / calls if calls else 0.0
