"""What runs: target-only, draft-only, or CSD with its settings, as one value.

A :class:`Method` is the choice every harness makes between the two samplers: :meth:`Method.run` calls
:func:`csd.sampling.generate` with the target (target-only) or with the draft (draft-only, its tokens made by
``Maker.DRAFT``), or :func:`csd.speculative.speculative_generate` with both (CSD at :attr:`Method.csd`). It
adds nothing to what runs: the same call, the same tokens, as calling the sampler directly.

    Method.speculative(CSDConfig(gamma=4)).run(target, draft, [1, 2], [0, 1], SamplingConfig(num_steps=8))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from csd.config import CSDConfig, SamplingConfig
from csd.decoding import Generation, StepCallback
from csd.family import ModelFamily
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker

Kind = Literal["target", "draft", "csd"]
KINDS: tuple[Kind, ...] = ("target", "draft", "csd")
LABELS: dict[Kind, str] = {"target": "target-only", "draft": "draft-only", "csd": "CSD"}


@dataclass(frozen=True)
class Method:
    """Which sampler runs: ``kind`` "target" (the target alone), "draft" (the draft alone) or "csd" (the pair
    under continuous speculative decoding at ``csd``, which only CSD has)."""

    kind: Kind = "target"
    csd: CSDConfig | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a method's kind must be one of {KINDS}, got {self.kind!r}")
        if (self.csd is not None) != (self.kind == "csd"):
            raise ValueError(f"CSD and only CSD has CSD settings: kind {self.kind!r}, csd {self.csd!r}")

    @classmethod
    def target(cls) -> Method:
        """Target-only generation."""
        return cls("target")

    @classmethod
    def draft(cls) -> Method:
        """Draft-only generation (its tokens made by ``Maker.DRAFT``)."""
        return cls("draft")

    @classmethod
    def speculative(cls, csd: CSDConfig | None = None) -> Method:
        """CSD at ``csd`` (the defaults when None, as :func:`speculative_generate` takes them)."""
        return cls("csd", CSDConfig() if csd is None else csd)

    @classmethod
    def of(cls, csd: CSDConfig | None) -> Method:
        """Target-only where ``csd`` is None, else CSD at ``csd``: the tools' settings, where None marks
        target-only."""
        return cls.target() if csd is None else cls.speculative(csd)

    @property
    def label(self) -> str:
        """Its name in the tools' tables and the app: "target-only", "draft-only" or "CSD"."""
        return LABELS[self.kind]

    @property
    def is_csd(self) -> bool:
        return self.kind == "csd"

    def run(
        self,
        target: ModelFamily | None,
        draft: ModelFamily | None,
        conditions: Sequence | Tensor,
        seeds: Sequence[int],
        sampling: SamplingConfig | None = None,
        on_step: StepCallback | None = None,
        keep_details: bool = False,
    ) -> Generation:
        """Generate ``len(seeds)`` images with this method: the target alone, the draft alone, or CSD with both
        (a run that does not use a model may pass None for it). ``on_step`` as the samplers take it;
        ``keep_details`` (CSD's token details, :func:`speculative_generate`) only for CSD."""
        if self.kind == "csd":
            return speculative_generate(
                target, draft, conditions, seeds, sampling, self.csd, on_step=on_step, keep_details=keep_details
            )
        if keep_details:
            raise ValueError(f"only CSD keeps token details, not {self.label}")
        if self.kind == "target":
            return generate(target, conditions, seeds, sampling, maker=Maker.TARGET, on_step=on_step)
        return generate(draft, conditions, seeds, sampling, maker=Maker.DRAFT, on_step=on_step)
