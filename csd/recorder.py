"""What a run keeps beside its tokens: its trace, the time and work of each phase, and its progress.

The decoding loop (:func:`csd.speculative.decode`) notifies a :class:`Recorder` once per phase, with what
the phase made: each AR step of the model that pre-fills (:meth:`Recorder.made`), each drafted step
(:meth:`Recorder.drafted`), each block's verification (:meth:`Recorder.verified`) and decision
(:meth:`Recorder.committed`). The model and criterion calls are timed through :meth:`Recorder.timed`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from csd.acceptance import Decision, Proposal
from csd.core.chain import ChainNoise, Trajectory
from csd.decoding import Block, Generation, StepCallback, finished
from csd.trace import BlockRecord, Maker, Trace


class PhaseTimer:
    """Time per named phase, with no host synchronisation inside a run.

    On a CPU, wall seconds. On CUDA, each phase is bracketed by CUDA events recorded on the current stream
    (enqueued, not waited for): :meth:`finish` waits once, when the run ends, and adds up the device time
    between each pair, so the loop never stops to read a clock and GPU work lands in the phase that queued it.

    ``work[phase]`` counts what the phase did, for the cost model (:mod:`csd.records.cost`): its calls, and for a
    chain phase the transitions run (``steps`` per call) and the token-transitions (``tokens * steps``,
    tokens counted over the batch)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = defaultdict(float)
        self.work: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "steps": 0, "token_steps": 0})
        self._events: list[tuple[str, object, object]] = []  # (phase, start, end) on CUDA, read by finish()

    @contextmanager
    def __call__(self, phase: str, tokens: int = 0, steps: int = 0, calls: int = 1) -> Iterator[None]:
        """Time what runs inside as ``phase``, counted as ``calls`` calls (a masked family's views of a block:
        one backbone pass each, run as one call)."""
        work = self.work[phase]
        work["calls"] += calls
        work["steps"] += steps
        work["token_steps"] += tokens * steps
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((phase, start, end))
            return
        t0 = time.perf_counter()
        yield
        self.times[phase] += time.perf_counter() - t0

    def finish(self) -> dict[str, float]:
        """Seconds per phase, every queued phase included (on CUDA: one wait for the device, here)."""
        if self._events:
            self._events[-1][2].synchronize()
            for phase, start, end in self._events:
                self.times[phase] += start.elapsed_time(end) / 1000.0
            self._events.clear()
        return self.times


# What the model that pre-fills is called, by its maker: its timed phases, whose pass it is, its progress.
ALONE = {
    Maker.PREFILL: ("prefill", "target", "pre-fill"),  # CSD's pre-fill: the target
    Maker.TARGET: ("target", "target", "target"),  # target-only: the target to the end
    Maker.DRAFT: ("draft", "draft", "draft"),  # draft-only: the draft to the end
}


class Recorder:
    """A run's trace (:class:`csd.trace.Trace`), its phases' times and work (:class:`PhaseTimer`), and its
    progress (``on_step``, see :data:`csd.decoding.StepCallback`), for a run on the canvas ``tokens`` (B, N, d)
    in AR steps of ``sizes`` tokens. The trace is in the canvas's precision (float64 or float32); its writes
    are kept on the device until the run ends (on every device: the loop never reads it on the host), and it
    keeps :class:`csd.trace.TokenDetails` of chains up to ``detail_steps`` transitions where given.
    ``maker``: who makes the pre-filled tokens (``Maker.PREFILL`` under CSD, else ``Maker.TARGET`` or
    ``Maker.DRAFT``), which names the pre-fill's phases (:data:`ALONE`); ``aligned``: whether the target's
    chains run on the draft's noise (CSD's ``align``)."""

    def __init__(
        self,
        tokens: Tensor,
        sizes: list[int],
        settings: dict,
        maker: Maker,
        on_step: StepCallback | None = None,
        aligned: bool = True,
        detail_steps: int | None = None,
    ):
        (b, n, d), device = tokens.shape, tokens.device
        dtype = np.float64 if tokens.dtype == torch.float64 else np.float32
        self.trace = Trace.empty(b, n, sizes, settings, dtype, defer=True)  # written when the run ends
        if detail_steps is not None:
            self.trace.keep_details(detail_steps, d)
        self.timer, self.maker, self.aligned = PhaseTimer(device), maker, aligned
        self.phase, self.model, self.progress = ALONE.get(maker, ALONE[Maker.DRAFT])
        self.report = on_step or (lambda done, total, phase: None)

    @property
    def total(self) -> int:
        """The run's AR steps."""
        return len(self.trace.step_sizes)

    def timed(self, phase: str, tokens: int = 0, steps: int = 0, calls: int = 1):
        """A context that times what runs inside as ``phase`` (:class:`PhaseTimer`)."""
        return self.timer(phase, tokens, steps, calls)

    def made(self, pos: Tensor, step: int, traj: Trajectory) -> None:
        """The model that pre-fills made AR step ``step``: its tokens at ``pos`` (B, k) are committed."""
        self.trace.record_made(pos, step, self.maker)
        self._inspect(pos, "target", traj)
        self.trace.record_pass(self.model)
        self.report(step + 1, self.total, self.progress)

    def made_next(self, pos: Tensor, step: int, traj: Trajectory) -> None:
        """The target made AR step ``step`` after a wholly accepted block, from its verification's pass (no pass
        of its own: none is counted)."""
        self.trace.record_made(pos, step, Maker.NEXT)
        self._inspect(pos, "target", traj)
        self.report(step + 1, self.total, "verify")

    def drafted(self, step: int) -> None:
        """The draft made AR step ``step`` of a block."""
        self.trace.record_pass("draft")
        self.report(step + 1, self.total, "draft")

    def verified(self, block: Block, proposal: Proposal, passes: int, other: ChainNoise | None = None) -> None:
        """The target verified ``block`` in ``passes`` passes: the draft-target distances and, when asked, the
        chains' transitions (:class:`csd.trace.TokenDetails`). ``other``: the noise choice the target's chains
        did not run on (``counterfactual``): they run once more on it, for the distance under that choice."""
        for _ in range(passes):
            self.trace.record_pass("target")
        draft = block.draft
        self._inspect(block.pos, "draft", draft)
        self.trace.record_distance(block.pos, (draft.x - proposal.target.x).norm(dim=-1), self.aligned)
        self._inspect(block.pos, "target", proposal.target)
        if other is not None:
            with self.timed("counterfactual"):
                counterfactual = proposal.chain_p.run(other)
            self.trace.record_distance(block.pos, (draft.x - counterfactual.x).norm(dim=-1), not self.aligned)

    def committed(self, block: Block, decision: Decision) -> None:
        """The block's decision, its kept steps committed: the trace's record of it (:class:`csd.trace.BlockRecord`),
        who made each committed token (accepted, resampled, capped or zeroed) read from the resampler's result."""
        maker = torch.full_like(decision.accepted, int(Maker.ACCEPTED), dtype=torch.int8)
        tries = torch.zeros_like(decision.accepted, dtype=torch.int32)
        if decision.resampled is not None:  # by mask, not by index: nothing read on the host
            res = decision.resampled
            cap = Maker.ZEROED if res.fallback == "zero" else Maker.CAPPED
            redrawn = torch.where(res.capped, int(cap), int(Maker.RESAMPLED)).to(torch.int8)
            maker = torch.where(decision.rejected, redrawn, maker)
            tries = res.tries.to(torch.int32)
        v, kept = decision.verdict, block.kept_of
        self.trace.record_block(
            BlockRecord(
                block.index,
                block.steps,
                block.sizes,
                block.pos,
                block.kept,
                kept(maker),
                kept(v.accept_prob),
                kept(v.trajectory),
                kept(v.final),
                kept(tries),
                decision.draws,
                decision.unit_accepted,
            )
        )
        self.report(block.steps.start + block.kept, self.total, "verify")

    def _inspect(self, pos: Tensor, model: str, traj: Trajectory) -> None:
        """Keep a chain's transitions for inspection, when asked; a measurement, kept out of decoding times."""
        if self.trace.details is not None:
            with self.timed("inspection"):
                self.trace.record_chain(pos, model, traj)

    def finish(self, tokens: Tensor) -> Generation:
        """The run's result: its tokens and its trace, with every phase's time and work, every write made."""
        self.trace.record_times(self.timer.finish(), self.timer.work)
        self.trace.flush()
        return Generation(finished(tokens), self.trace)
