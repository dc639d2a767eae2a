"""The samplers' settings: :class:`SamplingConfig` (every sampler) and :class:`CSDConfig` (the speculative
decoder), each knob validated where it is made, so a bad value is an error naming the knob and its range.

Every setting is declared once, beside its field (:func:`knob`): what it does, its kind and valid values,
the words its errors name it by and its command-line flag. The checks below and every tool's flags
(:mod:`csd.cli`) are derived from that declaration; a bad value raises a :class:`~csd.core.checks.SettingError`
that names its field. A config checks each knob alone: the rules between knobs, between the two configs and
between a setting and a model are checked when a run is set up (:mod:`csd.run_setup`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from csd.core.checks import SettingError, check_choice, check_int, check_ints, check_number
from csd.core.precision import run_dtype
from csd.core.schedule import CFG_SCHEDULES, HEAD_SCHEDULES, head_step_schedule

# Precisions, each with its backbones' autocast dtype (None: no autocast). float32 is the default; bfloat16 and
# float16 autocast the backbones, heads and every density staying in float32; float64 runs every part in
# float64, the models' weights too: the exact reference (csd.core.precision).
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": None}
CRITERIA = ("aligned", "exact", "published")
PRODUCT_PRECISIONS = ("float32", "float64")  # of the published test's density products
FALLBACKS = ("target", "zero")  # a token the resampler never accepts: the target's own sample, or zero
SCALE_SLOTS = ("std", "variance")  # what the published code's scale slots hold
TRAJECTORY_TERMS = ("derived", "published", "none")
ACCEPTANCE_UNITS = ("row", "token")
BLOCKS = ("published", "context", "exact")
# The head's samplers (SamplingConfig.head_sampler; a family's traits name those it takes): MAR's DDPM and
# DDIM (masked families), xAR's Euler-Maruyama and the probability-flow ODE of the same guided velocity,
# first order ("euler") or second ("heun": two velocity calls a step).
HEAD_SAMPLERS = ("ddpm", "ddim", "euler-maruyama", "euler", "heun")
ODE_SAMPLERS = ("euler", "heun")
FLOW_GRIDS = ("official", "uniform")  # xAR's time grids: 1 to 0.04 then 0 (the published one), or even steps
KINDS = ("int", "number", "choice", "bool", "ints")


@dataclass(frozen=True)
class Knob:
    """A setting, declared beside its field. help: what it does. kind: "int", "number", "choice", "bool" or
    "ints" (a tuple of ints); lo / hi (``lo_open`` / ``hi_open``: that end excluded) or ``choices``: its valid
    values; optional: None is valid too (the model's default, or off). name: the words an error names it by,
    where more than the field's name ("num_steps (AR steps)"). flag: its command-line flag where not
    ``--field-name``; knobs that share a flag are set together, in field order, each as its ``metavar``
    (``--cond-cache START EVERY``)."""

    help: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple = ()
    optional: bool = False
    name: str = ""
    flag: str = ""
    metavar: str = ""

    def __post_init__(self) -> None:
        check_choice("Knob.kind", self.kind, KINDS)

    def check(self, field_name: str, value):
        """``value`` if it is valid (a sequence of ints as a tuple), else a SettingError naming the field."""
        if value is None and self.optional:
            return None
        name = self.name or field_name
        try:
            if self.kind == "int":
                return check_int(name, value, self.lo, self.hi, word="None or an int" if self.optional else "an int")
            if self.kind == "number":
                return check_number(name, value, self.lo, self.hi, self.lo_open, self.hi_open)
            if self.kind == "choice":
                check_choice(name, value, (None, *self.choices) if self.optional else self.choices)
            if self.kind == "ints":
                return check_ints(name, value, self.lo)
            if self.kind == "bool" and not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        except ValueError as err:
            raise SettingError(str(err), field_name) from None
        return value


def knob(default, help: str, kind: str, **spec):
    """A dataclass field with its :class:`Knob`."""
    return field(default=default, metadata={"knob": Knob(help, kind, **spec)})


def knobs(config) -> dict[str, Knob]:
    """The knobs of a config class (or instance), by field name, in field order."""
    return {f.name: f.metadata["knob"] for f in fields(config) if "knob" in f.metadata}


def check_knobs(config) -> None:
    """Check every knob of a config as its declaration says (sequences of ints become tuples)."""
    for name, k in knobs(config).items():
        object.__setattr__(config, name, k.check(name, getattr(config, name)))


def _optional_steps(help: str, name: str = "", **spec):
    return knob(None, help, "int", lo=1, hi=1000, optional=True, name=name, **spec)


@dataclass(frozen=True)
class SamplingConfig:
    """Knobs shared by every sampler. ``head_steps=None`` uses the target's default; ``head_steps_min``
    anneals the head steps over the AR steps, from ``head_steps`` at the first to it at the last (DiSA's
    cheaper late steps), along ``head_schedule``: "linear", or DiSA's own "disa" / "disa-cosine"
    (:func:`csd.core.schedule.head_step_schedule`)."""

    num_steps: int = knob(
        64,
        "AR steps S",
        "int",
        lo=1,
        name="num_steps (AR steps)",
    )
    cfg_scale: float = knob(
        1.0,
        "classifier-free guidance scale (1: none)",
        "number",
        lo=0.0,
        hi=100.0,
    )
    cfg_schedule: str = knob(
        "linear",
        "how the CFG scale ramps over the AR steps",
        "choice",
        choices=CFG_SCHEDULES,
    )
    temperature: float = knob(
        1.0,
        "temperature of the head's noise",
        "number",
        lo=0.0,
        hi=10.0,
        lo_open=True,
    )
    head_steps: int | None = _optional_steps("head steps (none: the model's own)")
    head_steps_min: int | None = _optional_steps(
        "anneal the head steps to this at the last AR step (a head-step schedule from head_steps)",
        "head_steps_min (last AR step's head steps)",
    )
    precision: str = knob(
        "float32",
        "bfloat16 / float16: the backbones under autocast (heads and densities in float32); float64: every part "
        "in float64, the models' weights too (the exact reference)",
        "choice",
        choices=tuple(PRECISIONS),
    )
    head_schedule: str = knob(
        "linear",
        "how the head steps anneal: linear, or DiSA's own disa / disa-cosine",
        "choice",
        choices=HEAD_SCHEDULES,
    )
    # LazyMAR's condition cache (masked families, guided runs): a model's first cond_cache_start backbone
    # passes and every cond_cache_every-th after run both CFG halves; the others only the conditional one,
    # reusing the last full pass's unconditional-minus-conditional difference. None: no cache.
    cond_cache_start: int | None = knob(
        None,
        "LazyMAR's condition cache: full CFG passes for the first START and every EVERY-th after (MAR, Harmon)",
        "int",
        lo=0,
        optional=True,
        name="cond_cache_start (full CFG passes first)",
        flag="cond-cache",
        metavar="START",
    )
    cond_cache_every: int = knob(
        9,
        "passes between full CFG passes",
        "int",
        lo=1,
        name="cond_cache_every (passes between full CFG passes)",
        flag="cond-cache",
        metavar="EVERY",
    )
    # LazyMAR's token cache (masked families): a model's first token_cache_start backbone passes and every
    # token_cache_every-th after run the decoder over every row; at the others its later blocks run only
    # token_cache_keep of the rows (the buffer, the rows the step predicts, the tokens made since the last
    # pass, then those whose features changed most) and reuse the other rows' keys, values and outputs
    # from the pass that last computed them (csd.models.mar.token_cache). None: no cache.
    token_cache_keep: float | None = knob(
        None,
        "LazyMAR's token cache: full decoder passes for the first START and every EVERY-th after, the "
        "others recompute a KEEP fraction of the decoder's rows (MAR, Harmon)",
        "number",
        lo=0.0,
        hi=1.0,
        lo_open=True,
        optional=True,
        name="token_cache_keep (fraction of decoder rows recomputed)",
        flag="token-cache",
        metavar="KEEP",
    )
    token_cache_start: int = knob(
        5,
        "full decoder passes first",
        "int",
        lo=0,
        name="token_cache_start (full decoder passes first)",
        flag="token-cache",
        metavar="START",
    )
    token_cache_every: int = knob(
        9,
        "passes between full decoder passes",
        "int",
        lo=1,
        name="token_cache_every (passes between full decoder passes)",
        flag="token-cache",
        metavar="EVERY",
    )
    # The head's sampler: None, the family's own (DDPM for MAR and Harmon, Euler-Maruyama for xAR), or one of
    # HEAD_SAMPLERS its traits take: "ddim" with ddim_eta (0: deterministic), "euler" / "heun" (xAR's
    # probability-flow ODE). flow_grid: xAR's time grid, "official" (1 to 0.04, then 0) or "uniform".
    head_sampler: str | None = knob(
        None,
        "the head's sampler (none: the model's own): ddim (MAR, Harmon), euler / heun (xAR's probability-flow ODE)",
        "choice",
        choices=HEAD_SAMPLERS,
        optional=True,
    )
    ddim_eta: float = knob(0.0, "DDIM's eta (0: deterministic)", "number", lo=0.0, hi=1.0)
    flow_grid: str = knob("official", "xAR's time grid", "choice", choices=FLOW_GRIDS)
    # GtR (Yan et al., ICLR 2026; masked families): the AR steps of each of its stages, the checkerboard
    # subsets of csd.models.mar.gtr (the last, the other half of the checkerboard, is the reconstruction
    # stage); empty: no GtR. gtr_head_steps: the reconstruction stage's head steps (the head-step schedule
    # then runs over the generation stages); gtr_detail_fraction of each reconstruction step's tokens, those
    # of most high-frequency energy in their condition, run gtr_detail_steps instead (its FTS).
    gtr_stages: tuple[int, ...] = knob(
        (),
        "GtR: the AR steps of each stage, the last the reconstruction (they add up to num_steps; MAR, Harmon)",
        "ints",
        lo=1,
        name="gtr_stages (AR steps of each GtR stage)",
        metavar="STEPS",
    )
    gtr_head_steps: int | None = _optional_steps("GtR: the reconstruction stage's head steps")
    gtr_detail_fraction: float = knob(
        0.0,
        "GtR's FTS: this fraction of each reconstruction step's tokens (most high-frequency energy) runs "
        "STEPS head steps",
        "number",
        lo=0.0,
        hi=1.0,
        name="gtr_detail_fraction (FTS: share of reconstruction tokens)",
        flag="gtr-detail",
        metavar="FRACTION",
    )
    gtr_detail_steps: int | None = _optional_steps(
        "GtR's FTS: the detail tokens' head steps", flag="gtr-detail", metavar="STEPS"
    )

    def __post_init__(self) -> None:
        check_knobs(self)

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
        head-step schedule (:func:`csd.core.schedule.head_step_schedule`) over every AR step or, with
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

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the run's canvas, noise, chains and densities (:func:`csd.core.precision.run_dtype`)."""
        return run_dtype(self.precision)

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
    """Knobs of the speculative decoder; each knob's declaration says what it does and its valid values.

    Beyond them: an empty gamma_schedule (the default) is the paper's constant draft length. A
    draft_head_steps other than the target's head steps cannot share noise or compare per-step stds, so it
    needs align=False, criterion "aligned" and trajectory_term "none" (:meth:`needs_equal_chains`; the rules
    between knobs are :mod:`csd.run_setup`'s); under a head-step schedule (SamplingConfig.head_steps_min)
    every block runs the head steps of its first AR step.
    Under acceptance_unit "token" a cell counts as accepted when all of its tokens are, and
    Trace.unit_accepted holds the fraction.
    """

    gamma: int = knob(
        8,
        "draft length (AR steps per block)",
        "int",
        lo=1,
        name="gamma (draft length)",
    )
    gamma_schedule: tuple[int, ...] = knob(
        (),
        "draft lengths of the first blocks, in order (gamma after them)",
        "ints",
        lo=1,
        name="gamma_schedule (draft lengths of the first blocks)",
        metavar="G",
    )
    prefill: float = knob(
        0.05,
        "fraction of tokens the target makes before drafting",
        "number",
        lo=0.0,
        hi=1.0,
        hi_open=True,
        name="prefill ratio",
    )
    align: bool = knob(
        True,
        "trajectory alignment: the target's chains share the draft's noise (--no-align: independent noise)",
        "bool",
    )
    criterion: str = knob(
        "aligned",
        "acceptance test: the paper's approximation, the exact one, or what the published code computes",
        "choice",
        choices=CRITERIA,
    )
    trajectory_term: str = knob(
        "derived",
        "the aligned criterion's trajectory term",
        "choice",
        choices=TRAJECTORY_TERMS,
    )
    tau_v: float = knob(
        42.0,
        "widening of the final Gaussians in the acceptance test",
        "number",
        lo=1.0,
        hi=1e4,
    )
    resample_widening: float = knob(
        1.0,
        "widening of the final Gaussians when resampling (the published code: 1)",
        "number",
        lo=1.0,
        hi=1e4,
    )
    max_tries: int = knob(
        100,
        "resampler cap: proposals drawn before a rejected row takes its fallback token",
        "int",
        lo=1,
        hi=10000,
        name="max_tries (resampler cap)",
    )
    product_precision: str = knob(
        "float32",
        "criterion 'published': the float precision of its density products (float32 as the published code)",
        "choice",
        choices=PRODUCT_PRECISIONS,
    )
    published_scale: str = knob(
        "std",
        "criterion 'published': what its scale slots hold, the final step's std (the published code) or its variance",
        "choice",
        choices=SCALE_SLOTS,
    )
    fallback: str | None = knob(
        None,
        "a token the resampler never accepts: target (its own aligned sample) or zero (the published code); "
        "none: zero under criterion 'published', target otherwise",
        "choice",
        choices=FALLBACKS,
        optional=True,
    )
    counterfactual: bool = knob(
        False,
        "also run the target chain with the other noise choice (the distance with and without alignment)",
        "bool",
    )
    draft_head_steps: int | None = _optional_steps("the draft head's steps (needs --no-align, --trajectory-term none)")
    acceptance_unit: str = knob(
        "row",
        "row: a whole row (a token, an xAR cell); token: every token of a row tested alone",
        "choice",
        choices=ACCEPTANCE_UNITS,
    )
    draft_head_sampler: str | None = knob(
        None,
        "the draft head's sampler (none: the target's, with its ddim_eta)",
        "choice",
        choices=HEAD_SAMPLERS,
        optional=True,
    )
    draft_ddim_eta: float = knob(0.0, "the draft's DDIM eta", "number", lo=0.0, hi=1.0)
    block: str = knob(
        "published",
        "published: the target verifies every drafted step from the context before the block and the whole block "
        "is committed (the paper's code); context: each step given the drafted steps before it, the whole block "
        "committed; exact: so, and the block committed through its first step with a rejection (gamma 1's "
        "distribution at any gamma)",
        "choice",
        choices=BLOCKS,
    )

    def __post_init__(self) -> None:
        check_knobs(self)

    @property
    def cap_fallback(self) -> str:
        """What a token the resampler never accepts becomes: ``fallback``, else the criterion's own."""
        if self.fallback is not None:
            return self.fallback
        return "zero" if self.criterion == "published" else "target"

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
