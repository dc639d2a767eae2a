"""Settings, each declared once (:class:`Knob`), and the settings that apply only together as small frozen
values tagged with their kind, each checking its own rules: the acceptance criterion (:class:`Aligned`,
:class:`Exact`, :class:`Published`), the head's sampler (:class:`HeadSampler`), the head-step anneal
(:class:`HeadAnneal`), LazyMAR's two caches (:class:`CondCache`, :class:`TokenCache`), GtR (:class:`GtR`) and
the block's verification (:class:`Verification`).

Outside the configs (:mod:`csd.config`), every setting is a flat knob named by its key: the tools' flags
(:mod:`csd.cli`), the app's controls and API, and the settings saved with a result ("tau_v",
"cond_cache_start"). A value's fields declare their keys; a :class:`Slot` makes a value from its knobs
(None where the value is off) and reads its knobs back, so the flat names stay what they were."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from csd.core.checks import SettingError, check_choice, check_int, check_ints, check_number
from csd.core.schedule import HEAD_SCHEDULES

CRITERIA = ("aligned", "exact", "published")
PRODUCT_PRECISIONS = ("float32", "float64")  # of the published test's density products
# The resampler's draws: rounds for the rejected rows, or all at once; "auto" picks per device (pick_resampler).
RESAMPLERS = ("auto", "rounds", "one_pass")
FALLBACKS = ("target", "zero")  # a token the resampler never accepts: the target's own sample, or zero
SCALE_SLOTS = ("std", "variance")  # what the published code's scale slots hold
TRAJECTORY_TERMS = ("derived", "published", "none")
ACCEPTANCE_UNITS = ("row", "token")
# The head's samplers (a family's traits name those it takes): MAR's DDPM and DDIM (masked families), xAR's
# Euler-Maruyama and the probability-flow ODE of the same guided velocity, first order ("euler") or second
# ("heun": two velocity calls a step).
HEAD_SAMPLERS = ("ddpm", "ddim", "euler-maruyama", "euler", "heun")
ODE_SAMPLERS = ("euler", "heun")
BLOCKS = ("published", "context", "exact")
# A masked family's views of a context or exact block: rows of one target pass, or a pass each.
VIEWS = ("one_pass", "per_view")
FLOW_GRIDS = ("official", "uniform")  # xAR's time grids: 1 to 0.04 then 0 (the published one), or even steps
KINDS = ("int", "number", "choice", "bool", "ints")


@dataclass(frozen=True)
class Knob:
    """A setting, declared beside its field. help: what it does. kind: "int", "number", "choice", "bool" or
    "ints" (a tuple of ints); lo / hi (``lo_open`` / ``hi_open``: that end excluded) or ``choices``: its valid
    values; optional: None is valid too (the model's default, or off). key: its flat name (flags, app
    controls, saved results) where not the field's name. name: the words an error names it by, where more
    than its key ("num_steps (AR steps)"). flag: its command-line flag where not ``--key``; knobs that share
    a flag are set together, in order, each as its ``metavar`` (``--cond-cache START EVERY``)."""

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
    key: str = ""

    def __post_init__(self) -> None:
        check_choice("Knob.kind", self.kind, KINDS)

    def check(self, key: str, value):
        """``value`` if it is valid (a sequence of ints as a tuple), else a SettingError naming ``key``."""
        if value is None and self.optional:
            return None
        name = self.name or key
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
            raise SettingError(str(err), key) from None
        return value


def knob(default, help: str, kind: str, **spec):
    """A dataclass field with its :class:`Knob`."""
    return field(default=default, metadata={"knob": Knob(help, kind, **spec)})


def optional_steps(help: str, name: str = "", **spec):
    """A field of head steps, None for the model's own (or off)."""
    return knob(None, help, "int", lo=1, hi=1000, optional=True, name=name, **spec)


def field_knobs(value) -> dict[str, tuple[str, Knob, Any]]:
    """The knobs a dataclass (class or instance) declares on its fields: key -> (field name, knob, default)."""
    return {
        f.metadata["knob"].key or f.name: (f.name, f.metadata["knob"], f.default)
        for f in fields(value)
        if "knob" in f.metadata
    }


def check_knobs(value) -> None:
    """Check every knob of a dataclass instance as its declaration says (sequences of ints become tuples)."""
    for key, (name, k, _) in field_knobs(value).items():
        object.__setattr__(value, name, k.check(key, getattr(value, name)))


# --- the head's sampler and its steps ------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadSampler:
    """The head's sampler: ``kind`` None, the family's own (DDPM for MAR and Harmon, Euler-Maruyama for xAR),
    or one of HEAD_SAMPLERS its traits take: "ddim" with ``ddim_eta`` (0: deterministic; on DDIM only),
    "euler" / "heun" (xAR's probability-flow ODE). flow_grid: xAR's time grid, "official" (1 to 0.04, then
    0) or "uniform"."""

    kind: str | None = knob(
        None,
        "the head's sampler (none: the model's own): ddim (MAR, Harmon), euler / heun (xAR's probability-flow ODE)",
        "choice",
        choices=HEAD_SAMPLERS,
        optional=True,
        key="head_sampler",
    )
    ddim_eta: float = knob(0.0, "DDIM's eta (0: deterministic)", "number", lo=0.0, hi=1.0)
    flow_grid: str = knob("official", "xAR's time grid", "choice", choices=FLOW_GRIDS)

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.ddim_eta != 0.0 and self.kind != "ddim":
            raise SettingError(
                f"ddim_eta applies to head_sampler 'ddim' only, got head_sampler {self.kind!r}", "ddim_eta"
            )

    @property
    def deterministic(self) -> bool:
        """The chain has no noise before its last step (the ODE samplers, DDIM with eta 0): its transitions
        have no density, so CSD's acceptance test cannot compare them."""
        return self.kind in ODE_SAMPLERS or (self.kind == "ddim" and self.ddim_eta == 0.0)

    def calls(self, steps: int) -> int:
        """Network calls of a chain of ``steps`` transitions: a Heun step makes two."""
        return 2 * steps if self.kind == "heun" else steps


@dataclass(frozen=True)
class HeadAnneal:
    """The head steps annealed over the AR steps, from the first AR step's to ``last`` at the last (DiSA's
    cheaper late steps), along ``schedule``: "linear", or DiSA's own "disa" / "disa-cosine"
    (:func:`csd.core.schedule.head_step_schedule`)."""

    kind: ClassVar[str] = "anneal"
    last: int = optional_steps(
        "anneal the head steps to this at the last AR step (a head-step schedule from head_steps)",
        "head_steps_min (last AR step's head steps)",
        key="head_steps_min",
    )
    schedule: str = knob(
        "linear",
        "how the head steps anneal: linear, or DiSA's own disa / disa-cosine",
        "choice",
        choices=HEAD_SCHEDULES,
        key="head_schedule",
    )

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.last is None:
            raise SettingError(
                "head_steps_min must be an int in [1, 1000] (a config's head_anneal None: none)", "head_steps_min"
            )


# --- LazyMAR's caches (masked families) ------------------------------------------------------------------


def full_pass(index: int, start: int, every: int) -> bool:
    """Whether LazyMAR's cache runs backbone pass ``index`` (0-based) in full: the first ``start`` passes, then
    every ``every``-th."""
    return index < start or (index - start) % every == 0


@dataclass(frozen=True)
class CondCache:
    """LazyMAR's condition cache (guided runs): a model's first ``start`` backbone passes and every
    ``every``-th after run both CFG halves; the others only the conditional one, reusing the last full
    pass's unconditional-minus-conditional difference."""

    kind: ClassVar[str] = "lazymar-condition"
    start: int = knob(
        0,
        "LazyMAR's condition cache: full CFG passes for the first START and every EVERY-th after (MAR, Harmon)",
        "int",
        lo=0,
        name="cond_cache_start (full CFG passes first)",
        flag="cond-cache",
        metavar="START",
        key="cond_cache_start",
    )
    every: int = knob(
        9,
        "passes between full CFG passes",
        "int",
        lo=1,
        name="cond_cache_every (passes between full CFG passes)",
        flag="cond-cache",
        metavar="EVERY",
        key="cond_cache_every",
    )

    def __post_init__(self) -> None:
        check_knobs(self)

    def full(self, index: int) -> bool:
        """Whether backbone pass ``index`` (0-based) runs both CFG halves."""
        return full_pass(index, self.start, self.every)


@dataclass(frozen=True)
class TokenCache:
    """LazyMAR's token cache: a model's first ``start`` backbone passes and every ``every``-th after run the
    decoder over every row; at the others its later blocks run only ``keep`` of the rows (the buffer, the
    rows the step predicts, the tokens made since the last pass, then those whose features changed most) and
    reuse the other rows' keys, values and outputs from the pass that last computed them
    (csd.models.mar.token_cache)."""

    kind: ClassVar[str] = "lazymar-token"
    keep: float = knob(
        0.5,
        "LazyMAR's token cache: full decoder passes for the first START and every EVERY-th after, the "
        "others recompute a KEEP fraction of the decoder's rows (MAR, Harmon)",
        "number",
        lo=0.0,
        hi=1.0,
        lo_open=True,
        name="token_cache_keep (fraction of decoder rows recomputed)",
        flag="token-cache",
        metavar="KEEP",
        key="token_cache_keep",
    )
    start: int = knob(
        5,
        "full decoder passes first",
        "int",
        lo=0,
        name="token_cache_start (full decoder passes first)",
        flag="token-cache",
        metavar="START",
        key="token_cache_start",
    )
    every: int = knob(
        9,
        "passes between full decoder passes",
        "int",
        lo=1,
        name="token_cache_every (passes between full decoder passes)",
        flag="token-cache",
        metavar="EVERY",
        key="token_cache_every",
    )

    def __post_init__(self) -> None:
        check_knobs(self)

    def full(self, index: int) -> bool:
        """Whether backbone pass ``index`` (0-based) runs the decoder over every row."""
        return full_pass(index, self.start, self.every)


# --- GtR (Yan et al., ICLR 2026; masked families) ---------------------------------------------------------


def check_gtr(stages: tuple[int, ...], head_steps: int | None, detail_fraction: float, detail_steps: int | None):
    """GtR's rules between its knobs: the reconstruction stage's head steps need one (2 stages or more), and
    its FTS (a share of the reconstruction tokens and their head steps, above the stage's) is set whole."""
    for key, value in (("gtr_head_steps", head_steps), ("gtr_detail_steps", detail_steps)):
        if value is not None and len(stages) < 2:
            raise SettingError(f"{key} needs gtr_stages of 2 stages or more (a reconstruction stage)", key)
    detail = detail_fraction > 0.0
    if detail != (detail_steps is not None):
        raise SettingError(
            "gtr_detail_fraction > 0 and gtr_detail_steps go together (GtR's FTS), got one of them",
            "gtr_detail_fraction",
        )
    if detail and (head_steps is None or detail_steps <= head_steps):
        raise SettingError(
            f"gtr_detail_steps must exceed gtr_head_steps (the reconstruction stage's head steps), got "
            f"{detail_steps} and {head_steps}",
            "gtr_detail_steps",
        )


@dataclass(frozen=True)
class GtR:
    """GtR: the AR steps of each of its stages, the checkerboard subsets of csd.models.mar.gtr (the last, the
    other half of the checkerboard, is the reconstruction stage). head_steps: the reconstruction stage's
    head steps (the head-step schedule then runs over the generation stages); detail_fraction of each
    reconstruction step's tokens, those of most high-frequency energy in their condition, run
    detail_steps instead (its FTS)."""

    kind: ClassVar[str] = "gtr"
    stages: tuple[int, ...] = knob(
        (),
        "GtR: the AR steps of each stage, the last the reconstruction (they add up to num_steps; MAR, Harmon)",
        "ints",
        lo=1,
        name="gtr_stages (AR steps of each GtR stage)",
        metavar="STEPS",
        key="gtr_stages",
    )
    head_steps: int | None = optional_steps("GtR: the reconstruction stage's head steps", key="gtr_head_steps")
    detail_fraction: float = knob(
        0.0,
        "GtR's FTS: this fraction of each reconstruction step's tokens (most high-frequency energy) runs "
        "STEPS head steps",
        "number",
        lo=0.0,
        hi=1.0,
        name="gtr_detail_fraction (FTS: share of reconstruction tokens)",
        flag="gtr-detail",
        metavar="FRACTION",
        key="gtr_detail_fraction",
    )
    detail_steps: int | None = optional_steps(
        "GtR's FTS: the detail tokens' head steps", flag="gtr-detail", metavar="STEPS", key="gtr_detail_steps"
    )

    def __post_init__(self) -> None:
        check_knobs(self)
        if not self.stages:
            raise SettingError("gtr_stages must hold one stage or more (a config's gtr None: no GtR)", "gtr_stages")
        check_gtr(self.stages, self.head_steps, self.detail_fraction, self.detail_steps)


# --- the block --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    """How the target verifies a drafted block and what it commits (csd.speculative): ``kind`` "published" (every
    drafted step from the context before the block, the whole block committed: the paper's code), "context"
    (each step given the block's drafted steps before it, the whole block committed) or "exact" (so, and the
    block committed through its first step with a rejection); ``views``: how a masked family runs a context or
    exact block's views, one per drafted step: as rows of the block's one target pass ("one_pass"), or a target
    pass each ("per_view")."""

    kind: str = knob(
        "published",
        "published: the target verifies every drafted step from the context before the block and the whole block "
        "is committed (the paper's code); context: each step given the drafted steps before it, the whole block "
        "committed; exact: so, and the block committed through its first step with a rejection (gamma 1's "
        "distribution at any gamma)",
        "choice",
        choices=BLOCKS,
        key="block",
    )
    views: str = knob(
        "one_pass",
        "block context or exact on a masked family (MAR, Harmon): every drafted step's view a row of the block's "
        "one target pass (one_pass), or a target pass per view (per_view: smaller passes; faster on a CPU at "
        "batch 8 and gamma 8, bench/results/blocks)",
        "choice",
        choices=VIEWS,
    )

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.views != "one_pass" and self.kind == "published":
            raise SettingError(
                f"views {self.views!r} needs block 'context' or 'exact' (the published block verifies every drafted "
                "step from one context: one pass)",
                "views",
            )


# --- the acceptance criterion -------------------------------------------------------------------------------


def _tau_v():
    return knob(42.0, "widening of the final Gaussians in the acceptance test", "number", lo=1.0, hi=1e4)


def _max_tries():
    return knob(
        100,
        "resampler cap: proposals drawn before a rejected row takes its fallback token",
        "int",
        lo=1,
        hi=10000,
        name="max_tries (resampler cap)",
    )


def _resampler():
    return knob(
        "auto",
        "how the resampler draws: rounds (tries for the rejected rows only, read on the host), one_pass "
        "(max_tries tries for every row of the block at once, nothing read on the host; other draws, same law), "
        "or auto: one_pass on a CUDA device, rounds elsewhere",
        "choice",
        choices=RESAMPLERS,
    )


def pick_resampler(resampler: str, device_type: str) -> str:
    """The resampler a setting runs on a device of ``device_type`` ("cuda", "cpu", ...): "auto" is one pass on
    CUDA (the loop then leaves nothing for the host to read) and rounds elsewhere (the CPU's tokens, golden
    and committed, are the rounds'); "rounds" and "one_pass" are what they say on every device."""
    if resampler != "auto":
        return resampler
    return "one_pass" if device_type == "cuda" else "rounds"


def _fallback():
    return knob(
        None,
        "a token the resampler never accepts: target (its own aligned sample) or zero (the published code); "
        "none: zero under criterion 'published', target otherwise",
        "choice",
        choices=FALLBACKS,
        optional=True,
    )


class _Criterion:
    """What every criterion setting has: the token a row its resampler never accepts becomes (``fallback``,
    else its own), the unit it tests (whole rows unless it says otherwise) and how its resampler draws (in
    rounds unless it says otherwise)."""

    fallback: str | None
    own_fallback: ClassVar[str] = "target"
    acceptance_unit = "row"
    resampler = "rounds"

    @property
    def cap_fallback(self) -> str:
        """What a token the resampler never accepts becomes: ``fallback``, else the criterion's own."""
        return self.own_fallback if self.fallback is None else self.fallback

    def on_device(self, device_type: str):
        """This setting as it runs on a device of ``device_type``: its resampler picked
        (:func:`pick_resampler`; "auto" becomes "one_pass" or "rounds", so the setting a run records says
        which ran)."""
        picked = pick_resampler(self.resampler, device_type)
        return self if picked == self.resampler else replace(self, resampler=picked)


@dataclass(frozen=True)
class Aligned(_Criterion):
    """Criterion (a), the paper's approximation: ``tau_v`` widens the final Gaussians of the test,
    ``resample_widening`` those of the resampler; ``trajectory_term`` "derived", "published" (the reference
    code's sign) or "none" (the final-step term alone); ``acceptance_unit`` "token" tests each token of a
    multi-token row alone (a cell counts as accepted when all of its tokens are); ``resampler`` "one_pass"
    draws ``max_tries`` proposals for every row of a block at once (:func:`csd.core.resample.resample_one_pass`),
    "rounds" tries the rejected rows only, "auto" picks by device (:func:`pick_resampler`)."""

    kind: ClassVar[str] = "aligned"
    trajectory_term: str = knob(
        "derived", "the aligned criterion's trajectory term", "choice", choices=TRAJECTORY_TERMS
    )
    tau_v: float = _tau_v()
    resample_widening: float = knob(
        1.0, "widening of the final Gaussians when resampling (the published code: 1)", "number", lo=1.0, hi=1e4
    )
    max_tries: int = _max_tries()
    fallback: str | None = _fallback()
    acceptance_unit: str = knob(
        "row",
        "row: a whole row (a token, an xAR cell); token: every token of a row tested alone",
        "choice",
        choices=ACCEPTANCE_UNITS,
    )
    resampler: str = _resampler()

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class Exact(_Criterion):
    """Criterion (b), speculative sampling on paths: no knob of its own beyond the resampler's cap and fallback
    (its proposals are whole target chains, drawn in rounds: no one-pass resampler)."""

    kind: ClassVar[str] = "exact"
    max_tries: int = _max_tries()
    fallback: str | None = _fallback()

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class Published(_Criterion):
    """What the published code computes: the aligned test as products of densities in
    ``product_precision``, its scale slots holding the final step's ``published_scale``; a token never
    accepted becomes zero unless ``fallback`` says otherwise; ``resampler`` as :class:`Aligned`'s."""

    kind: ClassVar[str] = "published"
    own_fallback: ClassVar[str] = "zero"
    tau_v: float = _tau_v()
    max_tries: int = _max_tries()
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
    fallback: str | None = _fallback()
    resampler: str = _resampler()

    def __post_init__(self) -> None:
        check_knobs(self)


CRITERION_KINDS = {c.kind: c for c in (Aligned, Exact, Published)}
CriterionSetting = Aligned | Exact | Published
CRITERION_KNOB = Knob(
    "acceptance test: the paper's approximation, the exact one, or what the published code computes",
    "choice",
    choices=CRITERIA,
)


# --- slots: a setting value as flat knobs ---------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A config field holding a setting value, as the flat knobs that set it: their declarations and
    defaults by key, in flag order; ``make`` the value of every key's value (None: off), each knob checked
    first, then the value's own rules; ``read`` a value's knobs (None's too) back."""

    knobs: dict[str, Knob]
    defaults: dict[str, Any]
    build: Callable[[dict], Any]
    read: Callable[[Any], dict]
    kinds: tuple[type, ...]
    optional: bool = False

    def make(self, values: dict):
        return self.build({key: k.check(key, values[key]) for key, k in self.knobs.items()})

    def check(self, name: str, value) -> None:
        """A config field's value is one of the slot's kinds (or None where the setting can be off)."""
        if not (isinstance(value, self.kinds) or (value is None and self.optional)):
            kinds = " or ".join(k.__name__ for k in self.kinds) + (" or None" if self.optional else "")
            raise SettingError(f"{name} must be {kinds}, got {value!r}", name)


def _of(cls, values: dict):
    """An instance of a value class from the flat values of its keys."""
    return cls(**{name: values[key] for key, (name, _, _) in field_knobs(cls).items()})


def _read(value) -> dict:
    return {key: getattr(value, name) for key, (name, _, _) in field_knobs(value).items()}


def value_slot(cls, off_key: str | None = None, off=None, when_off: Callable[[dict], None] | None = None) -> Slot:
    """The slot of a one-class setting; with ``off_key``, None (off) where that knob is ``off`` (the knob
    optional where ``off`` is None), the others then unused (``when_off`` checks them)."""
    declared = field_knobs(cls)
    knobs = {key: k for key, (_, k, _) in declared.items()}
    defaults = {key: default for key, (_, _, default) in declared.items()}
    if off_key is not None:
        if off is None:
            knobs[off_key] = replace(knobs[off_key], optional=True)
        defaults[off_key] = off

    def build(values: dict):
        if off_key is not None and values[off_key] == off:
            if when_off is not None:
                when_off(values)
            return None
        return _of(cls, values)

    read = lambda value: dict(defaults) if value is None else _read(value)
    return Slot(knobs, defaults, build, read, (cls,), off_key is not None)


def _anneal_off(values: dict) -> None:
    if values["head_schedule"] != "linear":
        raise SettingError(
            f"head_schedule {values['head_schedule']!r} needs head_steps_min (the head steps it anneals to)",
            "head_schedule",
        )


def _gtr_off(values: dict) -> None:
    check_gtr((), values["gtr_head_steps"], values["gtr_detail_fraction"], values["gtr_detail_steps"])


SAMPLER = value_slot(HeadSampler)
ANNEAL = value_slot(HeadAnneal, "head_steps_min", when_off=_anneal_off)
COND_CACHE = value_slot(CondCache, "cond_cache_start")
TOKEN_CACHE = value_slot(TokenCache, "token_cache_keep")
GTR = value_slot(GtR, "gtr_stages", (), _gtr_off)
BLOCK = value_slot(Verification)


def _criterion_slot() -> Slot:
    """The criterion as its flat knobs: ``criterion`` names the kind; a knob the kind has not is unused
    (acceptance_unit "token" on a criterion that tests whole rows only, and resampler "one_pass" on the exact
    criterion, are errors)."""
    knobs, defaults = {"criterion": CRITERION_KNOB}, {"criterion": "aligned"}
    for cls in CRITERION_KINDS.values():
        for key, (_, k, default) in field_knobs(cls).items():
            knobs.setdefault(key, k)
            defaults.setdefault(key, default)

    def build(values: dict) -> CriterionSetting:
        cls = CRITERION_KINDS[values["criterion"]]
        if values["acceptance_unit"] != "row" and cls is not Aligned:
            raise SettingError(
                f"acceptance_unit {values['acceptance_unit']!r} needs criterion 'aligned' (the exact test "
                "compares whole rows)",
                "acceptance_unit",
            )
        if values["resampler"] == "one_pass" and cls is Exact:
            raise SettingError(
                f"resampler {values['resampler']!r} needs criterion 'aligned' or 'published' (the exact "
                "criterion's proposals are whole target chains, drawn in rounds)",
                "resampler",
            )
        return _of(cls, values)

    read = lambda c: defaults | {"criterion": c.kind, "resampler": c.resampler} | _read(c)
    return Slot(knobs, defaults, build, read, tuple(CRITERION_KINDS.values()))


def _draft_slot() -> Slot:
    """The draft head's sampler as its flat knobs: None, the target's (with its ddim_eta)."""
    knobs = {
        "draft_head_sampler": Knob(
            "the draft head's sampler (none: the target's, with its ddim_eta)",
            "choice",
            choices=HEAD_SAMPLERS,
            optional=True,
        ),
        "draft_ddim_eta": Knob("the draft's DDIM eta", "number", lo=0.0, hi=1.0),
    }
    defaults = {"draft_head_sampler": None, "draft_ddim_eta": 0.0}

    def build(values: dict) -> HeadSampler | None:
        kind, eta = values["draft_head_sampler"], values["draft_ddim_eta"]
        if eta != 0.0 and kind != "ddim":
            raise SettingError(
                f"draft_ddim_eta applies to draft_head_sampler 'ddim' only, got {kind!r}", "draft_ddim_eta"
            )
        return None if kind is None else HeadSampler(kind, eta)

    def read(value: HeadSampler | None) -> dict:
        return dict(defaults) if value is None else {"draft_head_sampler": value.kind, "draft_ddim_eta": value.ddim_eta}

    return Slot(knobs, defaults, build, read, (HeadSampler,), True)


CRITERION = _criterion_slot()
DRAFT_SAMPLER = _draft_slot()
