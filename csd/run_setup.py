"""A run's set-up, shared by target-only :func:`csd.sampling.generate` and
:func:`csd.speculative.speculative_generate`: the one place a run's settings are checked, and the run both
samplers decode, built from them (:meth:`Run.start`).

A config checks each of its knobs alone, as the knob's declaration says (:class:`csd.config.Knob`), and each
setting value (the criterion, the head's sampler, LazyMAR's caches, GtR: :mod:`csd.settings`) checks the rules
between its own knobs; every rule between a config's fields, between the two configs, or between a setting
and a model is here. The rules that need
only the settings and the family's traits are :func:`check_settings` (the app calls it before a run, to show
an error beside its control); :meth:`Run.start` calls it, then checks what needs the models themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from csd.acceptance import Criterion, criterion_of
from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise
from csd.core.checks import SettingError
from csd.core.precision import run_dtype, weights_dtype
from csd.core.rng import ImageStreams, check_seeds
from csd.decoding import StepCallback, model_device
from csd.family import FamilyTraits, ModelFamily, ModelState, Plan
from csd.recorder import Recorder
from csd.settings import Aligned
from csd.trace import Maker

TARGET_STREAMS = ("chain",)  # a target-only run's random numbers beyond its plan's
SPECULATIVE_STREAMS = ("chain", "accept", "resample", "independent")


@dataclass
class Run:
    """One generation, checked and set up by :meth:`start`, and where it stands as it decodes.

    ``target`` pre-fills: the target under CSD; in a run of one model (``draft`` and ``csd`` None), that
    model, to the end. The rest: each model's state of the generation (its conditions and caches,
    :meth:`csd.family.ModelFamily.start`), the settings, the plan, the (target's) head steps of every AR step,
    one random stream per purpose, under CSD its criterion, the recorder of its trace, times and progress
    (:class:`csd.recorder.Recorder`), the canvas, and the AR steps and blocks done so far."""

    target: ModelFamily
    draft: ModelFamily | None
    target_state: ModelState
    draft_state: ModelState | None
    sampling: SamplingConfig
    csd: CSDConfig | None
    plan: Plan
    head_steps: list[int]
    streams: dict[str, ImageStreams]
    criterion: Criterion | None
    recorder: Recorder
    tokens: Tensor  # (B, N, d) in the run's dtype
    mask: Tensor  # (B, N) True where not yet made
    committed: int = 0  # AR steps committed (where the next block starts)
    blocks: int = 0  # blocks drafted

    @classmethod
    def start(
        cls,
        target: ModelFamily,
        conditions: Sequence | Tensor,
        seeds: Sequence[int],
        sampling: SamplingConfig,
        csd: CSDConfig | None = None,
        draft: ModelFamily | None = None,
        maker: Maker = Maker.TARGET,
        on_step: StepCallback | None = None,
        keep_details: bool = False,
    ) -> Run:
        """Check a run and build it: of ``target`` alone (``csd`` and ``draft`` None; its tokens made by
        ``maker``), or speculative (both given). Every rule on a run's settings is checked here, each a
        ValueError (a :class:`~csd.core.checks.SettingError` where one knob is at fault) that names the knob and
        its valid values:

        * the settings and the family's traits, in order (:func:`check_settings`): the configs' rules between
          their knobs; the family's rules on the target's settings; under CSD, where CSD is defined on them and
          the family's rules on the draft's settings;
        * the draft against the target: one family, the same token layout and conditions (:func:`check_pair`);
        * each model's weights in the precision's dtype (:func:`check_model_precision`);
        * the seeds (:func:`csd.core.rng.check_seeds`), one device for both models, the batch's conditions (the
          family's :meth:`~csd.family.ModelFamily.check_conditions`);
        * under CSD, a ``draft_head_steps`` other than the target's head steps only where the chains need not
          be of equal length (:func:`check_draft_head_steps`).

        Under CSD the run takes ``csd`` as it runs on the models' device (:meth:`~csd.config.CSDConfig.on_device`:
        the resampler "auto" is one pass on CUDA, rounds elsewhere), and its trace records that setting.

        What stays with a model is what its own computations need of their inputs: the family's plan checks that
        GtR's checkerboard fits its grid (:mod:`csd.models.mar.gtr`), its ``predict`` and ``verify`` that they
        are given positions they can make. Nothing here draws a random number: the streams are made, the plan
        draws from its own. ``on_step`` is the run's progress callback; ``keep_details`` (CSD only) keeps every
        token's inputs in the trace (:class:`csd.trace.TokenDetails`)."""
        if (csd is None) != (draft is None):
            raise ValueError("a speculative run needs both csd and draft, a target-only run neither")
        if draft is not None:
            check_pair(target, draft)
        check_settings(target.traits, target.seq_len, sampling, csd, None if draft is None else draft.traits)
        models = {"model": target} if draft is None else {"target": target, "draft": draft}
        for who, model in models.items():
            check_model_precision(model, sampling.precision, who)
        seeds = check_seeds(seeds)
        device = model_device(target)
        if draft is not None and model_device(draft) != device:
            raise ValueError(f"draft model is on {model_device(draft)}, the target on {device}: use one device")
        conditions = target.check_conditions(conditions, len(seeds), device)
        plan = target.plan(seeds, sampling, device)
        head_steps = sampling.head_steps_per_step(target.head_steps(sampling.head_steps))
        criterion = None
        if csd is not None:
            check_draft_head_steps(csd, head_steps)
            csd = csd.on_device(device)  # its resampler picked: what the run records is what ran
            criterion = criterion_of(csd, target.traits.tokens_per_row, device)
        names = TARGET_STREAMS if csd is None else SPECULATIVE_STREAMS
        streams = {name: ImageStreams(seeds, name, device) for name in names}
        maker = maker if csd is None else Maker.PREFILL
        knobs = {"maker": maker.name.lower()} if csd is None else {"csd": csd.knob_values()}
        settings = {"sampling": sampling.knob_values()} | knobs
        tokens = torch.zeros(len(seeds), target.seq_len, target.token_dim, device=device, dtype=sampling.dtype)
        mask = torch.ones(tokens.shape[:2], dtype=torch.bool, device=device)
        details = max(head_steps + [(csd and csd.draft_head_steps) or 0]) if keep_details else None
        recorder = Recorder(tokens, plan.sizes, settings, maker, on_step, csd is None or csd.align, details)
        states = (
            target.start(conditions, sampling),
            None if draft is None else draft.start(conditions, csd.draft_sampling(sampling)),
        )
        return cls(target, draft, *states, sampling, csd, plan, head_steps, streams, criterion, recorder, tokens, mask)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The run's precision: the dtype of its canvas, noise, chains and densities."""
        return self.sampling.dtype

    @property
    def draft_sampling(self) -> SamplingConfig:
        """The draft's sampler settings (the target's, on ``draft_head_sampler`` where one is set)."""
        return self.sampling if self.csd is None else self.csd.draft_sampling(self.sampling)

    @property
    def prefill_tokens(self) -> float:
        """Tokens the model that pre-fills makes alone before drafting starts: a fraction ``csd.prefill`` of
        them, or all of them in a run of one model."""
        return math.inf if self.csd is None else self.csd.prefill * self.target.seq_len

    @property
    def done(self) -> bool:
        """Every AR step committed."""
        return self.committed >= self.plan.num_steps

    def uniforms(self, stream: str, k: int) -> Tensor:
        """k uniforms per image from ``stream``, image-major (B*k,), drawn in float32 (every precision's
        numbers), cast to the run's dtype."""
        return self.streams[stream].rand(k).reshape(-1).to(self.dtype)

    def noise(self, stream: str, k: int, steps: int) -> ChainNoise:
        """Noise from ``stream`` for k tokens per image and chains of ``steps`` transitions, rows image-major:
        xi (B*k, d), eps (T-1, B*k, d), drawn in float32 (every precision's numbers), cast to the run's dtype."""
        b, d = self.tokens.shape[0], self.tokens.shape[-1]
        raw = self.streams[stream].randn(steps, k, d).to(self.dtype)  # (B, T, k, d)
        eps = raw[:, 1:].permute(1, 0, 2, 3).reshape(steps - 1, b * k, d)
        return ChainNoise(xi=raw[:, 0].reshape(b * k, d), eps=eps)


def check_settings(
    traits: FamilyTraits,
    seq_len: int,
    sampling: SamplingConfig,
    csd: CSDConfig | None = None,
    draft_traits: FamilyTraits | None = None,
) -> None:
    """The rules on a run's settings that need only the family's traits and its number of tokens, in this
    order: the sampler settings' rules between fields (:func:`check_sampling_knobs`); the family's rules on
    the target's settings (:func:`check_family`); and under CSD (``csd`` given) where CSD is defined
    (:func:`check_speculative`) and the draft family's rules on the draft's settings (``draft_traits``, the
    target's by default). Each setting value checked its own rules when it was made (:mod:`csd.settings`)."""
    check_sampling_knobs(sampling)
    check_family(traits, sampling, seq_len)
    if csd is not None:
        check_speculative(sampling, csd, traits)
        check_family(draft_traits or traits, csd.draft_sampling(sampling), seq_len)


def check_sampling_knobs(config: SamplingConfig) -> None:
    """The sampler settings' rules between fields (each setting value checks its own): GtR's stages add up
    to the AR steps."""
    if config.gtr is not None and sum(config.gtr.stages) != config.num_steps:
        stages = config.gtr.stages
        raise SettingError(
            f"gtr_stages (AR steps of each GtR stage) must add up to num_steps {config.num_steps}, "
            f"got {stages} = {sum(stages)}",
            "gtr_stages",
        )


def check_family(traits: FamilyTraits, config: SamplingConfig, seq_len: int) -> None:
    """A family's rules on a sampler setting (from its :class:`~csd.family.FamilyTraits`): its fixed AR steps
    (else at most one per token), its CFG schedule, the caches, head steps and samplers it takes, GtR."""
    family, fixed = traits.family, traits.fixed_num_steps
    if fixed is not None and config.num_steps != fixed:
        raise SettingError(
            f"num_steps (AR steps) must equal {fixed} for this {family} model (one AR step per "
            f"{traits.row_name[:-1]}), got {config.num_steps}",
            "num_steps",
        )
    if fixed is None and config.num_steps > seq_len:
        raise SettingError(
            f"num_steps (AR steps) must be in [1, {seq_len}] (the number of tokens), got {config.num_steps}",
            "num_steps",
        )
    if traits.cfg_schedule is not None and config.cfg_schedule != traits.cfg_schedule:
        raise SettingError(
            f"cfg_schedule must be {traits.cfg_schedule!r} for this {family} model (its guidance ramps over "
            f"the {traits.row_name}), got {config.cfg_schedule!r}",
            "cfg_schedule",
        )
    if config.cond_cache is not None and not traits.caches_guidance:
        raise SettingError(
            f"cond_cache_start must be None for this {family} model (LazyMAR's condition cache needs "
            f"guidance from two backbone halves), got {config.cond_cache.start}",
            "cond_cache_start",
        )
    if config.token_cache is not None and not traits.caches_tokens:
        raise SettingError(
            f"token_cache_keep must be None for this {family} model (LazyMAR's token cache needs a "
            f"decoder over every position), got {config.token_cache.keep}",
            "token_cache_keep",
        )
    anneal = config.head_anneal
    for name, steps in (("head_steps", config.head_steps), ("head_steps_min", anneal and anneal.last)):
        if steps is not None and steps < traits.min_head_steps:
            raise SettingError(f"{name} must be >= {traits.min_head_steps} for this {family} model, got {steps}", name)
    sampler = config.sampler
    if sampler.kind is not None and sampler.kind not in traits.head_samplers:
        takes = f"one of {traits.head_samplers}" if traits.head_samplers else "its own (None)"
        raise SettingError(
            f"head_sampler must be None or {takes} for this {family} model, got {sampler.kind!r}",
            "head_sampler",
        )
    if sampler.flow_grid != "official" and not traits.flow_grids:
        raise SettingError(
            f"flow_grid must be 'official' for this {family} model (the uniform grid is a flow chain's), "
            f"got {sampler.flow_grid!r}",
            "flow_grid",
        )
    if config.gtr is not None and not traits.takes_gtr:
        raise SettingError(
            f"gtr_stages must be empty for this {family} model (GtR orders a masked family's tokens), "
            f"got {config.gtr.stages}",
            "gtr_stages",
        )


def check_speculative(sampling: SamplingConfig, csd: CSDConfig, traits: FamilyTraits) -> None:
    """Where CSD is defined on the samplers. Its acceptance test compares the draft's and the target's
    Gaussian transitions and its resampler draws from the target's: the target's chain must be stochastic
    (DDPM, DDIM with eta > 0, Euler-Maruyama on either time grid); a deterministic one (the probability-flow
    ODE, Euler or Heun; DDIM with eta 0) has no density along its path. A deterministic draft still has a
    final Gaussian, so it drafts under the final-step test alone (trajectory_term "none", criterion
    "aligned"). GtR's stages compose (draft and target share the plan); its FTS does not (a block's chains
    share one length, and the detail tokens are picked from the target's conditions). Per-token acceptance
    needs rows of several tokens (xAR's cells)."""
    if sampling.deterministic_head:
        kind = sampling.sampler.kind
        raise ValueError(
            f"CSD needs the target's head transitions to be Gaussian: head_sampler {kind!r}"
            f"{' with ddim_eta 0' if kind == 'ddim' else ''} is deterministic (no density along "
            "its path, nothing to accept or resample from); use DDPM, DDIM with ddim_eta > 0 or Euler-Maruyama "
            "(either flow_grid), or sample target-only"
        )
    final_only = isinstance(csd.criterion, Aligned) and csd.criterion.trajectory_term == "none"
    if csd.draft_sampling(sampling).deterministic_head and not final_only:
        raise ValueError(
            f"draft_head_sampler {csd.draft_sampler and csd.draft_sampler.kind!r} is deterministic: its path has "
            "no density, so it needs criterion 'aligned' with trajectory_term 'none' (the final-step test alone)"
        )
    if sampling.gtr is not None and sampling.gtr.detail_fraction > 0.0:
        raise ValueError(
            "gtr_detail_fraction (GtR's FTS) must be 0 under CSD: a block's chains share one length, and the "
            "detail tokens are picked from the target's conditions, which the draft does not have"
        )
    if csd.criterion.acceptance_unit == "token" and traits.tokens_per_row == 1:
        raise ValueError("acceptance_unit 'token' needs a family whose rows hold several tokens (xAR's cells)")
    block = csd.block
    if block.views != "one_pass" and traits.verifies_in_context:
        raise SettingError(
            f"views {block.views!r} needs a family that verifies a block from one context (MAR, Harmon): this "
            f"{traits.family} model verifies each drafted step given those before it in one pass",
            "views",
        )
    if block.kind != "published":
        caches = {
            "cond_cache_start": sampling.cond_cache and sampling.cond_cache.start,
            "token_cache_keep": sampling.token_cache and sampling.token_cache.keep,
        }
        for name, value in caches.items():
            if value is not None:
                raise SettingError(
                    f"{name} must be None under block {block.kind!r} (LazyMAR's caches follow one context per pass; "
                    f"this block verifies each drafted step on a context of its own), got {value}",
                    name,
                )


def check_draft_head_steps(csd: CSDConfig, head_steps: list[int]) -> None:
    """A ``draft_head_steps`` other than the target's ``head_steps`` (every AR step's) makes chains of
    different lengths: they share no noise and no per-step stds (:meth:`csd.config.CSDConfig.needs_equal_chains`)."""
    if csd.draft_head_steps is None or all(t == csd.draft_head_steps for t in head_steps):
        return
    if csd.needs_equal_chains():
        raise ValueError(
            f"draft_head_steps {csd.draft_head_steps} differs from the target's head steps "
            f"{sorted(set(head_steps))}: "
            "chains of different lengths share no noise and no per-step stds, so it needs align=False, "
            "criterion 'aligned' and trajectory_term 'none'"
        )


def check_pair(target: ModelFamily, draft: ModelFamily) -> None:
    """Draft and target must be one family with the same tokenizer, token layout and conditions."""
    t, q = target.traits, draft.traits
    pairs = (
        (t.family, q.family, "family"),
        (target.seq_len, draft.seq_len, "number of tokens (seq_len)"),
        (target.token_dim, draft.token_dim, "token width (token_dim)"),
        (t.conditions, q.conditions, "conditions"),
        (t.num_classes, q.num_classes, "classes (num_classes)"),
    )
    for a, b, what in pairs:
        if a != b:
            raise ValueError(
                f"draft model does not match the target's token layout: {what} is {b} for the draft and {a} for "
                "the target"
            )
    target.check_draft(draft)


def check_model_precision(model: nn.Module, precision: str, who: str = "model") -> None:
    """A float64 run needs float64 weights, any other run float32 ones (autocast lowers them itself): a
    SettingError on ``precision`` that says how to get a matching model."""
    want, got = run_dtype(precision), weights_dtype(model)
    if got != want:
        raise SettingError(
            f"precision {precision!r} needs the {who}'s weights in {str(want)[6:]}, got {str(got)[6:]}: "
            f"pass csd.core.precision.at_precision({who}, {precision!r})",
            "precision",
        )
