"""The samplers' settings: :class:`SamplingConfig` (every sampler) and :class:`CSDConfig` (the speculative
decoder). A config's field is a knob (:func:`csd.settings.knob`: what it does, its kind and valid values, the
words its errors name it by, its command-line flag) or, for settings that apply only together, a tagged
value that checks its own rules (:mod:`csd.settings`: the acceptance criterion, the head's sampler, the
head-step anneal, LazyMAR's caches, GtR).

Outside the configs every setting is a flat knob, named as the tools' flags (:mod:`csd.cli`), the app's
controls, its API and the saved results name it: :func:`knobs` declares them, ``from_knobs`` makes a config of
them, ``with_knobs`` changes some and ``knob_values`` reads them back. A bad value raises a
:class:`~csd.core.checks.SettingError` that names its knob. The rules between a config's fields, between the
two configs and between a setting and a model are checked when a run is set up (:mod:`csd.run_setup`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from csd.core.checks import SettingError
from csd.core.precision import run_dtype
from csd.core.schedule import CFG_SCHEDULES, head_step_schedule
from csd.settings import (
    ANNEAL,
    BLOCK,
    COND_CACHE,
    CRITERION,
    DRAFT_SAMPLER,
    GTR,
    SAMPLER,
    TOKEN_CACHE,
    Aligned,
    CondCache,
    CriterionSetting,
    GtR,
    HeadAnneal,
    HeadSampler,
    Knob,
    Slot,
    TokenCache,
    Verification,
    check_knobs,
    knob,
    optional_steps,
)

# Precisions, each with its backbones' autocast dtype (None: no autocast). float32 is the default; bfloat16 and
# float16 autocast the backbones, heads and every density staying in float32; float64 runs every part in
# float64, the models' weights too: the exact reference (csd.core.precision).
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": None}


def setting(default, slot: Slot):
    """A config field holding a setting value, set by the flat knobs of its :class:`~csd.settings.Slot`."""
    return field(default=default, metadata={"slot": slot})


def knobs(config) -> dict[str, Knob]:
    """The flat knobs of a config class (or instance), by key, in field order (a setting value's in its
    slot's order)."""
    out: dict[str, Knob] = {}
    for f in fields(config):
        out |= f.metadata["slot"].knobs if "slot" in f.metadata else {f.name: f.metadata["knob"]}
    return out


def knob_values(config) -> dict[str, Any]:
    """Every flat knob of a config and its value: what the saved results record as its settings."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        out |= f.metadata["slot"].read(value) if "slot" in f.metadata else {f.name: value}
    return out


def from_knobs(cls, values: dict[str, Any]):
    """A config of class ``cls`` from flat knobs (each missing one at its default); an unknown key is a
    SettingError naming it and the valid keys."""
    unknown = sorted(set(values) - set(knobs(cls)))
    if unknown:
        raise SettingError(f"{cls.__name__} has no knob {unknown[0]!r}: the knobs are {sorted(knobs(cls))}", unknown[0])
    made = {}
    for f in fields(cls):
        if "slot" not in f.metadata:
            if f.name in values:
                made[f.name] = values[f.name]
            continue
        slot = f.metadata["slot"]
        if any(key in values for key in slot.knobs):
            made[f.name] = slot.make(slot.defaults | {k: v for k, v in values.items() if k in slot.knobs})
    return cls(**made)


@dataclass(frozen=True)
class SamplingConfig:
    """Knobs shared by every sampler. ``head_steps=None`` uses the target's default; ``head_anneal`` anneals
    the head steps over the AR steps; ``sampler`` is the head's; LazyMAR's ``cond_cache`` and
    ``token_cache`` and ``gtr`` are None when off."""

    num_steps: int = knob(64, "AR steps S", "int", lo=1, name="num_steps (AR steps)")
    cfg_scale: float = knob(1.0, "classifier-free guidance scale (1: none)", "number", lo=0.0, hi=100.0)
    cfg_schedule: str = knob("linear", "how the CFG scale ramps over the AR steps", "choice", choices=CFG_SCHEDULES)
    temperature: float = knob(1.0, "temperature of the head's noise", "number", lo=0.0, hi=10.0, lo_open=True)
    head_steps: int | None = optional_steps("head steps (none: the model's own)")
    head_anneal: HeadAnneal | None = setting(None, ANNEAL)
    precision: str = knob(
        "float32",
        "bfloat16 / float16: the backbones under autocast (heads and densities in float32); float64: every part "
        "in float64, the models' weights too (the exact reference)",
        "choice",
        choices=tuple(PRECISIONS),
    )
    cond_cache: CondCache | None = setting(None, COND_CACHE)
    token_cache: TokenCache | None = setting(None, TOKEN_CACHE)
    sampler: HeadSampler = setting(HeadSampler(), SAMPLER)
    gtr: GtR | None = setting(None, GTR)

    def __post_init__(self) -> None:
        check_knobs(self)
        check_settings_of(self)

    @classmethod
    def from_knobs(cls, **values) -> SamplingConfig:
        """A config from flat knobs, by key (:func:`from_knobs`)."""
        return from_knobs(cls, values)

    def with_knobs(self, **changes) -> SamplingConfig:
        """This config with the flat knobs ``changes`` names changed."""
        return from_knobs(type(self), knob_values(self) | changes)

    def knob_values(self) -> dict[str, Any]:
        return knob_values(self)

    @property
    def deterministic_head(self) -> bool:
        """The head's chain has no density along its path (:attr:`csd.settings.HeadSampler.deterministic`)."""
        return self.sampler.deterministic

    def head_calls(self, steps: int) -> int:
        """Network calls of a chain of ``steps`` transitions: a Heun step makes two."""
        return self.sampler.calls(steps)

    def head_steps_per_step(self, first: int) -> list[int]:
        """The head steps of every AR step, from ``first`` (the model's head steps for ``head_steps``): the
        head-step schedule (:func:`csd.core.schedule.head_step_schedule`) over every AR step or, with GtR's
        ``head_steps``, over GtR's generation stages, then the reconstruction stage's (FTS's detail steps
        where it runs: its chains then run them for a share of the tokens, GtR's head steps for the others)."""
        anneal = self.head_anneal
        last, kind = (None, "linear") if anneal is None else (anneal.last, anneal.schedule)
        gtr = self.gtr
        if gtr is None or gtr.head_steps is None:
            return head_step_schedule(first, last, self.num_steps, kind)
        made = self.num_steps - gtr.stages[-1]
        detail = gtr.detail_steps if gtr.detail_steps is not None else gtr.head_steps
        return head_step_schedule(first, last, made, kind) + [detail] * gtr.stages[-1]

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the run's canvas, noise, chains and densities (:func:`csd.core.precision.run_dtype`)."""
        return run_dtype(self.precision)

    def full_guidance_pass(self, index: int) -> bool:
        """Whether a model's backbone pass ``index`` (0-based) runs both CFG halves: always, unless LazyMAR's
        condition cache says otherwise."""
        return self.cond_cache is None or self.cond_cache.full(index)

    def full_token_pass(self, index: int) -> bool:
        """Whether a model's backbone pass ``index`` (0-based) runs its decoder over every row: always,
        unless LazyMAR's token cache says otherwise."""
        return self.token_cache is None or self.token_cache.full(index)


@dataclass(frozen=True)
class CSDConfig:
    """Knobs of the speculative decoder; each knob's declaration says what it does and its valid values,
    ``criterion`` is the acceptance test with its own knobs (:mod:`csd.settings`).

    Beyond them: an empty gamma_schedule (the default) is the paper's constant draft length. A
    draft_head_steps other than the target's head steps cannot share noise or compare per-step stds, so it
    needs align=False, criterion "aligned" and trajectory_term "none" (:meth:`needs_equal_chains`; the rules
    between knobs are :mod:`csd.run_setup`'s); under a head-step schedule (SamplingConfig.head_anneal)
    every block runs the head steps of its first AR step.
    Under acceptance_unit "token" a cell counts as accepted when all of its tokens are, and
    Trace.unit_accepted holds the fraction.
    """

    gamma: int = knob(8, "draft length (AR steps per block)", "int", lo=1, name="gamma (draft length)")
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
    criterion: CriterionSetting = setting(Aligned(), CRITERION)
    counterfactual: bool = knob(
        False,
        "also run the target chain with the other noise choice (the distance with and without alignment)",
        "bool",
    )
    draft_head_steps: int | None = optional_steps("the draft head's steps (needs --no-align, --trajectory-term none)")
    draft_sampler: HeadSampler | None = setting(None, DRAFT_SAMPLER)
    block: Verification = setting(Verification(), BLOCK)

    def __post_init__(self) -> None:
        check_knobs(self)
        check_settings_of(self)

    @classmethod
    def from_knobs(cls, **values) -> CSDConfig:
        """A config from flat knobs, by key (:func:`from_knobs`)."""
        return from_knobs(cls, values)

    def with_knobs(self, **changes) -> CSDConfig:
        """This config with the flat knobs ``changes`` names changed."""
        return from_knobs(type(self), knob_values(self) | changes)

    def knob_values(self) -> dict[str, Any]:
        return knob_values(self)

    @property
    def cap_fallback(self) -> str:
        """What a token the resampler never accepts becomes: the criterion's fallback, else its own."""
        return self.criterion.cap_fallback

    def on_device(self, device: torch.device | str) -> CSDConfig:
        """This config as it runs on ``device``: the criterion's resampler picked for it ("auto": one pass on
        CUDA, rounds elsewhere; :func:`csd.settings.pick_resampler`)."""
        criterion = self.criterion.on_device(torch.device(device).type)
        return self if criterion == self.criterion else replace(self, criterion=criterion)

    def block_length(self, block: int) -> int:
        """AR steps drafted in block ``block`` (0-based): the schedule's entry, else gamma."""
        return self.gamma_schedule[block] if block < len(self.gamma_schedule) else self.gamma

    def draft_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """The draft's sampler settings: the target's, on ``draft_sampler`` (on the target's time grid) where
        one is set."""
        if self.draft_sampler is None:
            return sampling
        return replace(sampling, sampler=replace(self.draft_sampler, flow_grid=sampling.sampler.flow_grid))

    def needs_equal_chains(self) -> bool:
        """Whether draft and target chains must have equal lengths (so ``draft_head_steps`` must equal the
        target's): shared noise, the exact criterion and the trajectory term all pair their transitions."""
        c = self.criterion
        return self.align or not isinstance(c, Aligned) or c.trajectory_term != "none"


def check_settings_of(config) -> None:
    """Each setting value of a config is of its field's kinds (a value checks its own rules when made)."""
    for f in fields(config):
        if "slot" in f.metadata:
            f.metadata["slot"].check(f.name, getattr(config, f.name))
