"""What the two samplers need from a model family (MAR, Harmon and xAR implement it in csd/models/).

A family makes an image in AR steps. Each step, the backbone reads the tokens made so far (the
*context*) and the image's *condition* (a class label, a prompt, ...), and a Gaussian chain turns
explicit noise into the step's tokens (or cells), one Gaussian transition at a time. The samplers
see six things (and the small helpers :meth:`~ModelFamily.head_steps`, :meth:`~ModelFamily.join`
and :meth:`~ModelFamily.check_draft`):

* :attr:`ModelFamily.traits`: the typed facts about the family that decoders and experiments read
  (:class:`FamilyTraits`: conditions, fixed AR steps, what a row is, what verification costs);
* :meth:`ModelFamily.plan`: which positions each AR step makes, for given seeds;
* :meth:`ModelFamily.check_conditions`: the batch's conditions, validated, in the family's form;
* :meth:`ModelFamily.start`: one model's state for one generation (:class:`ModelState`: the conditions,
  the sampler settings and whatever the model keeps between its passes: caches of keys and values, ...),
  passed to every :meth:`~ModelFamily.predict` and :meth:`~ModelFamily.verify` of that generation;
* :meth:`ModelFamily.predict`: one AR step from a context, as chains bound to their conditions;
* :meth:`ModelFamily.verify`: the target's chains for a whole drafted block at once (MAR: one
  backbone pass over the context before the block; xAR: one pass per flow step with a block-causal
  mask, each drafted cell given the cells drafted before it; the decoder does not care which).

Chains come back as a :class:`TokenChain`: noise in, a :class:`~csd.core.chain.Trajectory` (tokens,
states, per-step means and stds) out, and the same chains evaluated along any other path. That is
all the acceptance test and the resampler need, for any family. docs/families.md says how a new
family implements it and registers in one table (:mod:`csd.models.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from csd.config import SamplingConfig
from csd.core.chain import ChainNoise, Trajectory
from csd.core.checks import check_choice, check_int
from csd.core.schedule import CFG_SCHEDULES

CONDITIONS = ("classes", "prompts")
MAX_PROMPT_CHARS = 1000


def check_prompt(prompt, index: int | None = None) -> str:
    """A prompt every text family takes: a non-empty string of at most :data:`MAX_PROMPT_CHARS` characters
    (what its tokenizer can encode is the model's own check, :meth:`ModelFamily.check_conditions`)."""
    where = "prompt" if index is None else f"prompt {index}"
    if not isinstance(prompt, str):
        raise ValueError(f"{where} must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError(f"{where} must not be empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"{where} must be at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")
    return prompt


@dataclass(frozen=True)
class FamilyTraits:
    """What decoders, experiments and the app need to know of a family beyond the Protocol's methods.

    family: its name ("MAR", "Harmon", "xAR"); draft and target must share it.
    conditions: "classes" (class ids, ``num_classes`` of them) or "prompts" (text).
    fixed_num_steps: the AR steps a model requires (xAR: one per cell), None where any number works.
    cfg_schedule: the one CFG schedule it takes (xAR ramps CFG over its cells), None for any.
    head_per_block: the target's chains of a drafted block cost about one step's chain (xAR: the flow
    chain is the backbone, run over the block's cells at once) rather than one per drafted token.
    verifies_in_context: verification conditions each drafted row on the drafted rows before it (xAR),
    so it equals verifying the block step by step; a masked family verifies every drafted token from the
    context before the block (one backbone pass), as published, or, under CSDConfig.block "context" or
    "exact", each drafted step from a view of its own (the views as rows of one pass).
    verifies_next: verification also gives the target's chain of the token after the block (a causal family's
    one cached pass reads every drafted token, the last included): under the exact block, a block whose every
    token is accepted is followed by that token, made by the target without a pass of its own (LLM speculative
    decoding's bonus token).
    tokens_per_row: tokens in one acceptance row (xAR: a cell's), for acceptance_unit "token".
    min_head_steps: the fewest chain transitions the head takes (a flow sampler needs two).
    row_name: what a drafted row is called ("tokens", "cells").
    caches_guidance: takes LazyMAR's condition cache (SamplingConfig.cond_cache): its guidance is
    two backbone halves whose difference can be reused (masked families; xAR guides inside its flow).
    caches_tokens: takes LazyMAR's token cache (SamplingConfig.token_cache): a bidirectional
    decoder over every position, whose rows can be recomputed in part (masked families).
    head_samplers: the head samplers it takes (SamplingConfig.sampler), its own first (MAR: DDPM and
    DDIM; xAR: Euler-Maruyama and the probability-flow ODE); empty: its own only.
    flow_grids: takes SamplingConfig.sampler.flow_grid "uniform" (a flow chain's time grid: xAR).
    takes_gtr: takes GtR's two-stage order (SamplingConfig.gtr): a masked family on a square grid.

    A run checks its settings against these (:func:`csd.run_setup.check_family`).
    """

    family: str
    conditions: str = "classes"
    num_classes: int = 0
    fixed_num_steps: int | None = None
    cfg_schedule: str | None = None
    head_per_block: bool = False
    verifies_in_context: bool = False
    verifies_next: bool = False
    tokens_per_row: int = 1
    min_head_steps: int = 1
    row_name: str = "tokens"
    caches_guidance: bool = False
    caches_tokens: bool = False
    head_samplers: tuple[str, ...] = ()
    flow_grids: bool = False
    takes_gtr: bool = False

    def __post_init__(self) -> None:
        check_choice("FamilyTraits.conditions", self.conditions, CONDITIONS)
        check_int("FamilyTraits.num_classes", self.num_classes, 1 if self.conditions == "classes" else 0)
        if self.conditions == "prompts" and self.num_classes:
            raise ValueError("FamilyTraits.num_classes must be 0 for a family conditioned on prompts")
        if self.fixed_num_steps is not None:
            check_int("FamilyTraits.fixed_num_steps", self.fixed_num_steps, 1, word="None or an int")
        if self.cfg_schedule is not None:
            check_choice("FamilyTraits.cfg_schedule", self.cfg_schedule, CFG_SCHEDULES)
        check_int("FamilyTraits.tokens_per_row", self.tokens_per_row, 1)
        check_int("FamilyTraits.min_head_steps", self.min_head_steps, 1)
        if self.verifies_next and not self.verifies_in_context:
            raise ValueError("FamilyTraits.verifies_next needs verifies_in_context (the block read in context)")

    @property
    def cheap_knob(self) -> str:
        """What a cheaper target-only run cuts: AR steps, or head (flow) steps where AR steps are fixed."""
        return "head_steps" if self.fixed_num_steps is not None else "num_steps"

    def cheapest(self) -> SamplingConfig:
        """The cheapest sampler setting a model of the family takes (a warm-up run)."""
        return SamplingConfig(
            num_steps=self.fixed_num_steps or 1,
            head_steps=self.min_head_steps,
            cfg_schedule=self.cfg_schedule or SamplingConfig.cfg_schedule,
        )


@dataclass(frozen=True)
class Plan:
    """The AR schedule of a batch: orders (B, N), tokens per step, guidance per step.

    Before step s the tokens orders[:, :N - sum(sizes[:s])] are still masked, and step s makes the last
    sizes[s] of them (:meth:`positions`; MAR's convention; a raster family uses the identity order)."""

    orders: Tensor
    sizes: list[int]
    cfg: list[float]

    @property
    def num_steps(self) -> int:
        return len(self.sizes)

    def positions(self, step: int) -> Tensor:
        """Grid positions (B, k) made by AR step ``step``."""
        before = self.orders.shape[1] - sum(self.sizes[:step])
        return self.orders[:, before - self.sizes[step] : before]


@dataclass
class ModelState:
    """One model's state over one generation (:meth:`ModelFamily.start`): the batch's conditions in the
    family's form and the sampler settings the model runs with. A family that keeps something between the
    passes of a generation (caches of keys and values, the last pass's rows, ...) extends it; nothing of a
    generation outlives its state, so two generations, or the two models of one, never share a cache."""

    conditions: Any
    config: SamplingConfig

    def rewind(self, known: int) -> None:
        """The canvas may change from token (row) ``known`` on: a block's drafted tokens, now decided (some
        redrawn). A state that keeps something of those tokens forgets it, to make it again from the canvas
        at the next pass; the decoding loop calls this after every block, so that a state never compares the
        canvas with what it keeps (a read on the host). Nothing to forget here."""


class TokenChain(Protocol):
    """The Gaussian chains of ``rows`` tokens (or cells), bound to their conditions and temperature.
    Rows are image-major: the k tokens of image 0, then those of image 1, ..."""

    @property
    def rows(self) -> int: ...

    def num_steps(self) -> int:
        """T, the transitions of each chain (the last one noise-free)."""

    def run(self, noise: ChainNoise) -> Trajectory:
        """Sample every row with the given noise (xi (rows, d), eps (T-1, rows, d))."""

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """Means and stds (T, rows, d) of every transition at given states (T, rows, d), e.g. another
        model's path: the exact criterion and the path resampler need it."""

    def select(self, rows: Tensor) -> TokenChain:
        """The chains of some rows (an index tensor)."""


class ModelFamily(Protocol):
    """A continuous AR image model as the samplers see it. Draft and target of one speculative run
    are two models of one family with the same ``seq_len``, ``token_dim`` and plan."""

    seq_len: int  # tokens (or cells x tokens per cell) of one image
    token_dim: int
    traits: FamilyTraits

    def check_conditions(self, conditions: Sequence[Any] | Tensor, batch: int, device: torch.device) -> Any:
        """The batch's conditions (class ids, prompts, ...) in the form :meth:`predict` takes; raises a
        ValueError that names the valid values when one is not."""

    def plan(self, seeds: Sequence[int], config: SamplingConfig, device: torch.device) -> Plan:
        """The AR schedule of a batch; image i's depends only on seeds[i] and the config."""

    def head_steps(self, steps: int | None) -> int:
        """Transitions of this model's chain for a requested number (None: the model's default)."""

    def start(self, conditions: Any, config: SamplingConfig) -> ModelState:
        """This model's state for a new generation of the batch's ``conditions`` (as :meth:`check_conditions`
        returns them) under ``config``: every :meth:`predict` and :meth:`verify` of the generation takes it."""

    def predict(
        self,
        state: ModelState,
        tokens: Tensor,
        mask: Tensor,
        pos: Tensor,
        cfg: Tensor,
        steps: int,
        known: int | None = None,
    ) -> TokenChain:
        """One AR step: read the context (``tokens`` (B, N, d) where ``~mask``) and return the chains of
        the tokens at ``pos`` (B, k), guided per row by ``cfg`` (B*k,), of ``steps`` transitions. ``known``:
        the tokens (rows) every image has made so far, as the decoding loop knows them on the host; a family
        uses it instead of reading the mask or positions back from the device (None: it may read them)."""

    def verify(
        self,
        state: ModelState,
        tokens: Tensor,
        mask: Tensor,
        pos: Tensor,
        cfg: Tensor,
        steps: int,
        drafted: Tensor | None = None,
        sizes: Sequence[int] | None = None,
        known: int | None = None,
    ) -> TokenChain:
        """The chains of a whole drafted block (``pos`` (B, k): all its AR steps' positions) from the
        context before the block, in one verification pass. ``drafted`` (B*k, d): the draft's tokens
        of the block, for a family whose later positions are conditioned on the earlier ones (xAR:
        each drafted cell is verified given the cells drafted before it); MAR-like families ignore it,
        unless ``sizes`` (the block's tokens per AR step) asks for the exact block: each step's chains
        given the context plus the block's drafted steps before it. ``known``: the tokens every image had
        made before the block (as in :meth:`predict`)."""

    def join(self, chains: Sequence[TokenChain], batch: int) -> TokenChain:
        """The chains of several AR steps of a block as one, rows image-major over the whole block."""

    def check_draft(self, draft: ModelFamily) -> None:
        """Raise a ValueError naming what differs when ``draft`` cannot draft for this model beyond the
        shared token layout (a text family: the same tokenizer and prompt template)."""

    def token_layout(self, raster_tokenizer: Any) -> Any:
        """The tokenizer of this model's tokens over a tokenizer of its raster grid (xAR groups the raster
        tokens into cells; a masked family's tokens are the raster's)."""
