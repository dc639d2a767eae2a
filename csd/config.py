"""The samplers' settings: :class:`SamplingConfig` (every sampler) and :class:`CSDConfig` (the speculative
decoder), validated where they are made, so a bad value is an error naming the knob and its range."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csd.checks import check_choice, check_int, check_ints, check_number
from csd.schedule import CFG_SCHEDULES, HEAD_SCHEDULES

# Backbone precisions; heads and every density stay in float32.
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
CRITERIA = ("aligned", "exact")
TRAJECTORY_TERMS = ("derived", "published", "none")
ACCEPTANCE_UNITS = ("row", "token")


@dataclass(frozen=True)
class SamplingConfig:
    """Knobs shared by every sampler. ``head_steps=None`` uses the target's default; ``head_steps_min``
    anneals the head steps over the AR steps, from ``head_steps`` at the first to it at the last (DiSA's
    cheaper late steps), along ``head_schedule``: "linear", or DiSA's own "disa" / "disa-cosine"
    (:func:`csd.schedule.head_step_schedule`)."""

    num_steps: int = 64
    cfg_scale: float = 1.0
    cfg_schedule: str = "linear"
    temperature: float = 1.0
    head_steps: int | None = None
    head_steps_min: int | None = None  # a head-step schedule: linear from head_steps to this over the AR steps
    precision: str = "float32"  # backbone precision; heads and all densities stay in float32
    head_schedule: str = "linear"  # how head_steps anneal to head_steps_min: "linear", "disa", "disa-cosine"
    # LazyMAR's condition cache (masked families, guided runs): a model's first cond_cache_start backbone
    # passes and every cond_cache_every-th after run both CFG halves; the others only the conditional one,
    # reusing the last full pass's unconditional-minus-conditional difference. None: no cache.
    cond_cache_start: int | None = None
    cond_cache_every: int = 9
    # LazyMAR's token cache (masked families): a model's first token_cache_start backbone passes and every
    # token_cache_every-th after run the decoder over every row; at the others its later blocks run only
    # token_cache_keep of the rows (the buffer, the rows the step predicts, the tokens made since the last
    # pass, then those whose features changed most) and reuse the other rows' keys, values and outputs
    # from the pass that last computed them (csd.models.mar.token_cache). None: no cache.
    token_cache_keep: float | None = None
    token_cache_start: int = 5
    token_cache_every: int = 9

    def __post_init__(self) -> None:
        check_int("num_steps (AR steps)", self.num_steps, 1)
        check_number("cfg_scale", self.cfg_scale, 0.0, 100.0)
        check_choice("cfg_schedule", self.cfg_schedule, CFG_SCHEDULES)
        check_number("temperature", self.temperature, 0.0, 10.0, lo_open=True)
        if self.head_steps is not None:
            check_int("head_steps", self.head_steps, 1, 1000, word="None or an int")
        if self.head_steps_min is not None:
            check_int("head_steps_min (last AR step's head steps)", self.head_steps_min, 1, 1000, word="None or an int")
        check_choice("precision", self.precision, tuple(PRECISIONS))
        check_choice("head_schedule", self.head_schedule, HEAD_SCHEDULES)
        if self.cond_cache_start is not None:
            check_int("cond_cache_start (full CFG passes first)", self.cond_cache_start, 0, word="None or an int")
        check_int("cond_cache_every (passes between full CFG passes)", self.cond_cache_every, 1)
        if self.token_cache_keep is not None:
            what = "token_cache_keep (fraction of decoder rows recomputed)"
            check_number(what, self.token_cache_keep, 0.0, 1.0, lo_open=True)
        check_int("token_cache_start (full decoder passes first)", self.token_cache_start, 0)
        check_int("token_cache_every (passes between full decoder passes)", self.token_cache_every, 1)

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    def full_guidance_pass(self, index: int) -> bool:
        """Whether a model's backbone pass ``index`` (0-based) runs both CFG halves under the condition
        cache: the first ``cond_cache_start`` and every ``cond_cache_every``-th after them (LazyMAR)."""
        start = self.cond_cache_start
        return start is None or index < start or (index - start) % self.cond_cache_every == 0

    def full_token_pass(self, index: int) -> bool:
        """Whether a model's backbone pass ``index`` (0-based) runs its decoder over every row under the
        token cache: the first ``token_cache_start`` and every ``token_cache_every``-th after them."""
        start = self.token_cache_start
        return self.token_cache_keep is None or index < start or (index - start) % self.token_cache_every == 0


@dataclass(frozen=True)
class CSDConfig:
    """Knobs of the speculative decoder.

    gamma: draft length in AR steps per block. gamma_schedule: optional draft lengths of the first
    blocks, in order (block b drafts gamma_schedule[b] steps; the blocks after them draft gamma);
    empty by default, the paper's constant draft length. prefill: fraction of tokens the target makes
    before drafting starts. align: share the draft's noise with the target's chain.
    criterion: "aligned" (the paper's approximation) or "exact" (path-space reference).
    trajectory_term: sign convention of criterion (a)'s trajectory term ("derived", "published")
    or "none" (final-step term only). tau_v: widening of the final Gaussians in the test.
    resample_widening: widening of the same Gaussians when resampling (the published code: 1).
    max_tries: resampler cap. counterfactual: also run the target chain with the other noise
    choice, to record the draft-target distance with and without alignment. draft_head_steps: a
    cheaper (or dearer) draft head, None for the target's head steps; a different number of steps
    cannot share noise or compare per-step stds, so it needs align=False, criterion "aligned" and
    trajectory_term "none". With a head-step schedule (SamplingConfig.head_steps_min) every block
    runs the head steps of its first AR step. acceptance_unit: "row" (a token of MAR or Harmon, a
    whole cell of xAR: the exact unit) or "token" (a family whose rows hold several tokens, xAR's
    cells: each token of a cell tested and resampled alone, an approximation to measure; a cell
    counts as accepted when all of its tokens are, and Trace.unit_accepted holds the fraction).
    """

    gamma: int = 8
    gamma_schedule: tuple[int, ...] = ()
    prefill: float = 0.05
    align: bool = True
    criterion: str = "aligned"
    trajectory_term: str = "derived"
    tau_v: float = 42.0
    resample_widening: float = 1.0
    max_tries: int = 100
    counterfactual: bool = False
    draft_head_steps: int | None = None
    acceptance_unit: str = "row"

    def __post_init__(self) -> None:
        check_int("gamma (draft length)", self.gamma, 1)
        schedule = check_ints("gamma_schedule (draft lengths of the first blocks)", self.gamma_schedule, 1)
        object.__setattr__(self, "gamma_schedule", schedule)
        check_number("prefill ratio", self.prefill, 0.0, 1.0, hi_open=True)
        check_choice("criterion", self.criterion, CRITERIA)
        check_choice("trajectory_term", self.trajectory_term, TRAJECTORY_TERMS)
        check_number("tau_v", self.tau_v, 1.0, 1e4)
        check_number("resample_widening", self.resample_widening, 1.0, 1e4)
        check_int("max_tries (resampler cap)", self.max_tries, 1, 10000)
        if self.draft_head_steps is not None:
            check_int("draft_head_steps", self.draft_head_steps, 1, 1000, word="None or an int")
        check_choice("acceptance_unit", self.acceptance_unit, ACCEPTANCE_UNITS)
        if self.acceptance_unit == "token" and self.criterion != "aligned":
            raise ValueError("acceptance_unit 'token' needs criterion 'aligned' (the exact test compares whole rows)")

    def block_length(self, block: int) -> int:
        """AR steps drafted in block ``block`` (0-based): the schedule's entry, else gamma."""
        return self.gamma_schedule[block] if block < len(self.gamma_schedule) else self.gamma

    def needs_equal_chains(self) -> bool:
        """Whether draft and target chains must have equal lengths (so ``draft_head_steps`` must equal the
        target's): shared noise, the exact criterion and the trajectory term all pair their transitions."""
        return self.align or self.criterion != "aligned" or self.trajectory_term != "none"
