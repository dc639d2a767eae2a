"""Target-only (or draft-only) generation: the baseline of every comparison.

A run of one model is the speculative decoder's run with no draft: the model pre-fills to the end
(:func:`csd.speculative.decode`). One AR step = one pass of the model over the current tokens
(:meth:`csd.family.ModelFamily.predict`), then the chains of the step's tokens, vectorised over the batch and
the step's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from csd.config import SamplingConfig
from csd.decoding import Generation, StepCallback
from csd.family import ModelFamily
from csd.run_setup import Run
from csd.speculative import decode
from csd.trace import Maker


@torch.inference_mode()
def generate(
    model: ModelFamily,
    conditions: Sequence | Tensor,
    seeds: Sequence[int],
    config: SamplingConfig | None = None,
    maker: Maker = Maker.TARGET,
    on_step: StepCallback | None = None,
) -> Generation:
    """Generate ``len(seeds)`` images with one model alone. ``conditions``: one per seed (class ids for a
    class-conditional family, prompts for a text one); ``maker``: who the trace says made the tokens
    (``Maker.DRAFT`` for a draft-only run, which times and counts its steps as the draft's).

    Image i depends only on (seeds[i], conditions[i], config): the same as when generated alone. The run
    is checked and set up by :meth:`csd.run_setup.Run.start`.
    ``on_step`` (see :data:`csd.decoding.StepCallback`) is called after each AR step."""
    return decode(Run.start(model, conditions, seeds, config or SamplingConfig(), maker=maker, on_step=on_step))
