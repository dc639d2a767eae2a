"""A speculative run replayed block by block: the records (:class:`Frame`) the replay figures draw
(:mod:`visualize.replay`), computed from the run's trace and tokens and the target-only run with the same
seeds; nothing here runs a model.

:func:`replay_frames`: the CSD canvas after each pre-fill step, each drafted block (the draft's proposal)
and each verification (what the target kept), beside the target-only canvas after as many AR steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from csd.trace import Maker, Trace

DRAFTED = -2  # status of a token the draft proposed and the target has not verified yet
UNKNOWN = -1


@dataclass
class Frame:
    """One moment of a run. tokens (B, N, d) hold the known tokens (zeros elsewhere); status (B, N)
    is a Maker value for committed tokens, DRAFTED for proposals under verification, UNKNOWN."""

    label: str
    ar_steps: int  # AR steps made (drafted included) at this moment
    tokens: np.ndarray
    status: np.ndarray
    target_tokens: np.ndarray  # the target-only run after as many AR steps
    target_known: np.ndarray  # (B, N) bool


def _canvas(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    return np.where(known[..., None], values, 0.0).astype(np.float32)


def replay_frames(tokens: Tensor, trace: Trace, target_tokens: Tensor, target_trace: Trace) -> list[Frame]:
    """Frames of a speculative run, in order; the last one is the final image. Needs the trace's
    details (CSD run with ``keep_details=True``: ``Method.speculative(csd).run(..., keep_details=True)``,
    :class:`csd.dispatch.Method`) for the draft's proposals."""
    if trace.details is None:
        raise ValueError("replay needs the draft's proposals: run CSD (csd.Method.speculative) with keep_details=True")
    final, target = tokens.numpy(), target_tokens.numpy()
    proposal = trace.details.draft_tokens
    committed = np.full(trace.maker.shape, UNKNOWN, dtype=np.int8)

    def frame(label: str, steps: int, status: np.ndarray, values: np.ndarray) -> Frame:
        shown = status != UNKNOWN
        target_known = (target_trace.ar_step >= 0) & (target_trace.ar_step < steps)
        return Frame(label, steps, _canvas(values, shown), status.copy(), _canvas(target, target_known), target_known)

    frames = []
    prefill_steps = sorted({int(s) for s in np.unique(trace.ar_step[trace.maker == Maker.PREFILL])})
    for s in prefill_steps:
        made = trace.ar_step == s
        committed[made] = Maker.PREFILL
        frames.append(frame(f"pre-fill: AR step {s + 1}", s + 1, committed, final))
    for b in sorted(int(v) for v in np.unique(trace.block[trace.block >= 0])):
        in_block = trace.block == b
        steps = trace.ar_step[in_block]
        first, last = int(steps.min()), int(steps.max())
        drafted = committed.copy()
        drafted[in_block] = DRAFTED
        values = np.where(in_block[..., None], proposal, final)
        frames.append(frame(f"block {b + 1}: drafted AR steps {first + 1}-{last + 1}", last + 1, drafted, values))
        committed[in_block] = trace.maker[in_block]
        frames.append(frame(f"block {b + 1}: verified", last + 1, committed, final))
    return frames
