"""The samplers' settings: :class:`SamplingConfig` (every sampler) and :class:`CSDConfig` (the speculative
decoder), validated where they are made, so a bad value is an error naming the knob and its range."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from csd.checks import check_choice, check_int, check_ints, check_number
from csd.schedule import CFG_SCHEDULES, HEAD_SCHEDULES, head_step_schedule

# Backbone precisions; heads and every density stay in float32.
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
CRITERIA = ("aligned", "exact")
TRAJECTORY_TERMS = ("derived", "published", "none")
ACCEPTANCE_UNITS = ("row", "token")
# The head's samplers (SamplingConfig.head_sampler; a family's traits name those it takes): MAR's DDPM and
# DDIM (masked families), xAR's Euler-Maruyama and the probability-flow ODE of the same guided velocity,
# first order ("euler") or second ("heun": two velocity calls a step).
HEAD_SAMPLERS = ("ddpm", "ddim", "euler-maruyama", "euler", "heun")
ODE_SAMPLERS = ("euler", "heun")
FLOW_GRIDS = ("official", "uniform")  # xAR's time grids: 1 to 0.04 then 0 (the published one), or even steps


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
    # The head's sampler: None, the family's own (DDPM for MAR and Harmon, Euler-Maruyama for xAR), or one of
    # HEAD_SAMPLERS its traits take: "ddim" with ddim_eta (0: deterministic), "euler" / "heun" (xAR's
    # probability-flow ODE). flow_grid: xAR's time grid, "official" (1 to 0.04, then 0) or "uniform".
    head_sampler: str | None = None
    ddim_eta: float = 0.0
    flow_grid: str = "official"
    # GtR (Yan et al., ICLR 2026; masked families): the AR steps of each of its stages, the checkerboard
    # subsets of csd.models.mar.gtr (the last, the other half of the checkerboard, is the reconstruction
    # stage); empty: no GtR. gtr_head_steps: the reconstruction stage's head steps (the head-step schedule
    # then runs over the generation stages); gtr_detail_fraction of each reconstruction step's tokens, those
    # of most high-frequency energy in their condition, run gtr_detail_steps instead (its FTS).
    gtr_stages: tuple[int, ...] = ()
    gtr_head_steps: int | None = None
    gtr_detail_fraction: float = 0.0
    gtr_detail_steps: int | None = None

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
        self._check_sampler()
        self._check_gtr()

    def _check_sampler(self) -> None:
        if self.head_sampler is not None:
            check_choice("head_sampler", self.head_sampler, (None, *HEAD_SAMPLERS))
        check_number("ddim_eta", self.ddim_eta, 0.0, 1.0)
        if self.ddim_eta != 0.0 and self.head_sampler != "ddim":
            raise ValueError(f"ddim_eta applies to head_sampler 'ddim' only, got head_sampler {self.head_sampler!r}")
        check_choice("flow_grid", self.flow_grid, FLOW_GRIDS)

    def _check_gtr(self) -> None:
        stages = check_ints("gtr_stages (AR steps of each GtR stage)", self.gtr_stages, 1)
        object.__setattr__(self, "gtr_stages", stages)
        if stages and sum(stages) != self.num_steps:
            raise ValueError(
                f"gtr_stages (AR steps of each GtR stage) must add up to num_steps {self.num_steps}, "
                f"got {stages} = {sum(stages)}"
            )
        for name in ("gtr_head_steps", "gtr_detail_steps"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1, 1000, word="None or an int")
                if len(stages) < 2:
                    raise ValueError(f"{name} needs gtr_stages of 2 stages or more (a reconstruction stage)")
        check_number("gtr_detail_fraction (FTS: share of reconstruction tokens)", self.gtr_detail_fraction, 0.0, 1.0)
        detail = self.gtr_detail_fraction > 0.0
        if detail != (self.gtr_detail_steps is not None):
            raise ValueError("gtr_detail_fraction > 0 and gtr_detail_steps go together (GtR's FTS), got one of them")
        if detail and (self.gtr_head_steps is None or self.gtr_detail_steps <= self.gtr_head_steps):
            raise ValueError(
                f"gtr_detail_steps must exceed gtr_head_steps (the reconstruction stage's head steps), got "
                f"{self.gtr_detail_steps} and {self.gtr_head_steps}"
            )

    @property
    def deterministic_head(self) -> bool:
        """The head's chain has no noise before its last step (the ODE samplers, DDIM with eta 0): its
        transitions have no density, so CSD's acceptance test cannot compare them."""
        return self.head_sampler in ODE_SAMPLERS or (self.head_sampler == "ddim" and self.ddim_eta == 0.0)

    def head_calls(self, steps: int) -> int:
        """Network calls of a chain of ``steps`` transitions: a Heun step makes two."""
        return 2 * steps if self.head_sampler == "heun" else steps

    def head_steps_per_step(self, first: int) -> list[int]:
        """The head steps of every AR step, from ``first`` (the model's head steps for ``head_steps``): the
        head-step schedule (:func:`csd.schedule.head_step_schedule`) over every AR step or, with
        ``gtr_head_steps``, over GtR's generation stages, then the reconstruction stage's (FTS's detail
        steps where it runs: its chains then run them for a share of the tokens, ``gtr_head_steps`` for the
        others)."""
        if self.gtr_head_steps is None:
            return head_step_schedule(first, self.head_steps_min, self.num_steps, self.head_schedule)
        made = self.num_steps - self.gtr_stages[-1]
        last = self.gtr_detail_steps if self.gtr_detail_steps is not None else self.gtr_head_steps
        return head_step_schedule(first, self.head_steps_min, made, self.head_schedule) + [last] * self.gtr_stages[-1]

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
    draft_head_sampler: str | None = None  # the draft's head sampler; None: the target's (with its ddim_eta)
    draft_ddim_eta: float = 0.0

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
        if self.draft_head_sampler is not None:
            check_choice("draft_head_sampler", self.draft_head_sampler, (None, *HEAD_SAMPLERS))
        check_number("draft_ddim_eta", self.draft_ddim_eta, 0.0, 1.0)
        if self.draft_ddim_eta != 0.0 and self.draft_head_sampler != "ddim":
            raise ValueError(
                f"draft_ddim_eta applies to draft_head_sampler 'ddim' only, got {self.draft_head_sampler!r}"
            )

    def block_length(self, block: int) -> int:
        """AR steps drafted in block ``block`` (0-based): the schedule's entry, else gamma."""
        return self.gamma_schedule[block] if block < len(self.gamma_schedule) else self.gamma

    def draft_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """The draft's sampler settings: the target's, on ``draft_head_sampler`` where one is set."""
        if self.draft_head_sampler is None:
            return sampling
        return replace(sampling, head_sampler=self.draft_head_sampler, ddim_eta=self.draft_ddim_eta)

    def needs_equal_chains(self) -> bool:
        """Whether draft and target chains must have equal lengths (so ``draft_head_steps`` must equal the
        target's): shared noise, the exact criterion and the trajectory term all pair their transitions."""
        return self.align or self.criterion != "aligned" or self.trajectory_term != "none"


def check_speculative(sampling: SamplingConfig, csd: CSDConfig) -> None:
    """Where CSD is defined on the new samplers. Its acceptance test compares the draft's and the target's
    Gaussian transitions and its resampler draws from the target's: the target's chain must be stochastic
    (DDPM, DDIM with eta > 0, Euler-Maruyama on either time grid); a deterministic one (the probability-flow
    ODE, Euler or Heun; DDIM with eta 0) has no density along its path. A deterministic draft still has a
    final Gaussian, so it drafts under the final-step test alone (trajectory_term "none", criterion
    "aligned"). GtR's stages compose (draft and target share the plan); its FTS does not (a block's chains
    share one length, and the detail tokens are picked from the target's conditions)."""
    if sampling.deterministic_head:
        raise ValueError(
            f"CSD needs the target's head transitions to be Gaussian: head_sampler {sampling.head_sampler!r}"
            f"{' with ddim_eta 0' if sampling.head_sampler == 'ddim' else ''} is deterministic (no density along "
            "its path, nothing to accept or resample from); use DDPM, DDIM with ddim_eta > 0 or Euler-Maruyama "
            "(either flow_grid), or sample target-only"
        )
    final_only = csd.trajectory_term == "none" and csd.criterion == "aligned"
    if csd.draft_sampling(sampling).deterministic_head and not final_only:
        raise ValueError(
            f"draft_head_sampler {csd.draft_head_sampler!r} is deterministic: its path has no density, so it "
            "needs criterion 'aligned' with trajectory_term 'none' (the final-step test alone)"
        )
    if sampling.gtr_detail_fraction > 0.0:
        raise ValueError(
            "gtr_detail_fraction (GtR's FTS) must be 0 under CSD: a block's chains share one length, and the "
            "detail tokens are picked from the target's conditions, which the draft does not have"
        )
