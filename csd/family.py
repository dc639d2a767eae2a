"""What the two samplers need from a model family (MAR today; xAR and Harmon plug in the same way).

A family makes an image in AR steps. Each step, the backbone reads the tokens made so far (the
*context*) and the image's *condition* (a class label, a prompt, ...), and a Gaussian chain turns
explicit noise into the step's tokens (or cells), one Gaussian transition at a time. The samplers
only ever see four things:

* :meth:`ModelFamily.plan`: which positions each AR step makes, for given seeds;
* :meth:`ModelFamily.check_conditions`: the batch's conditions, validated, in the family's form;
* :meth:`ModelFamily.predict`: one AR step from a context, as chains bound to their conditions;
* :meth:`ModelFamily.verify`: the target's chains for a whole drafted block, from the context
  before the block, in one pass (MAR: one backbone pass; xAR: one pass per flow step with a
  block-causal mask; the decoder does not care which).

Chains come back as a :class:`TokenChain`: noise in, a :class:`~csd.chain.Trajectory` (tokens,
states, per-step means and stds) out, and the same chains evaluated along any other path. That is
all the acceptance test and the resampler need, for any family. docs/FAMILIES.md says how a new
family implements it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from csd.chain import ChainNoise, Trajectory

if TYPE_CHECKING:
    from csd.sampling import SamplingConfig


@dataclass(frozen=True)
class Plan:
    """The AR schedule of a batch: orders (B, N), tokens per step, guidance per step.

    The tokens still masked after step s are orders[:, :masked_after[s]], so step s makes
    orders[:, masked_after[s]:masked_before[s]] (MAR's convention; a raster family uses the
    identity order)."""

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

    def check_conditions(self, conditions: Sequence[Any] | Tensor, batch: int, device: torch.device) -> Any:
        """The batch's conditions (class ids, prompts, ...) in the form :meth:`predict` takes; raises a
        ValueError that names the valid values when one is not."""

    def plan(self, seeds: Sequence[int], config: SamplingConfig, device: torch.device) -> Plan:
        """The AR schedule of a batch; image i's depends only on seeds[i] and the config."""

    def head_steps(self, steps: int | None) -> int:
        """Transitions of this model's chain for a requested number (None: the model's default)."""

    def predict(
        self,
        tokens: Tensor,
        mask: Tensor,
        conditions: Any,
        pos: Tensor,
        cfg: Tensor,
        config: SamplingConfig,
        steps: int,
    ) -> TokenChain:
        """One AR step: read the context (``tokens`` (B, N, d) where ``~mask``) and return the chains of
        the tokens at ``pos`` (B, k), guided per row by ``cfg`` (B*k,)."""

    def verify(
        self,
        tokens: Tensor,
        mask: Tensor,
        conditions: Any,
        pos: Tensor,
        cfg: Tensor,
        config: SamplingConfig,
        steps: int,
        drafted: Tensor | None = None,
    ) -> TokenChain:
        """The chains of a whole drafted block (``pos`` (B, k): all its AR steps' positions) from the
        context before the block, in one verification pass. ``drafted`` (B*k, d): the draft's tokens
        of the block, for a family whose later positions are conditioned on the earlier ones (xAR:
        each drafted cell is verified given the cells drafted before it); MAR-like families ignore it."""

    def join(self, chains: Sequence[TokenChain], batch: int) -> TokenChain:
        """The chains of several AR steps of a block as one, rows image-major over the whole block."""


def fixed_num_steps(model) -> int | None:
    """The AR steps a family's model requires (xAR: one per cell), None where any number works."""
    return getattr(model, "fixed_num_steps", None)


def head_per_block(model) -> bool:
    """Whether the target's chain of a drafted block costs about one step's chain (xAR: the flow chain
    is the backbone over the block's cells) rather than one per drafted token (MAR's per-token head)."""
    return bool(getattr(model, "head_per_block", False))
