"""The decoders' step toolbox, shared by target-only :func:`csd.sampling.generate` and
:func:`csd.speculative.speculative_generate`: a run's result, phase timers, chain noise, one AR step of one
model, and committing tokens to the canvas.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from csd.config import SamplingConfig
from csd.core.chain import ChainNoise, Trajectory
from csd.core.rng import ImageStreams
from csd.family import ModelFamily, ModelState, TokenChain
from csd.trace import Trace

StepCallback = Callable[[int, int, str], None]
"""``on_step(done, total, phase)``: called by a sampler after each AR step (``done`` of ``total`` steps
processed, ``phase`` what the step was: "target", "draft", "pre-fill", "verify"). It may raise to
stop the run there (the app's Stop button does); a sampler without one pays nothing."""


@dataclass
class Generation:
    tokens: Tensor  # (B, N, d) on the CPU, float32 (float64 under precision "float64")
    trace: Trace


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
    def __call__(self, phase: str, tokens: int = 0, steps: int = 0) -> Iterator[None]:
        work = self.work[phase]
        work["calls"] += 1
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


def sync_cuda() -> None:
    """Wait for every queued CUDA kernel, where CUDA is in use (a no-op on a CPU, and where it was never
    initialised): a timed span starts and ends with it, so GPU work lands in the span that queued it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def new_canvas(batch: int, n: int, d: int, config: SamplingConfig, device: torch.device) -> tuple[Tensor, Tensor]:
    """An empty canvas: tokens (B, N, d) in the run's dtype, all zero, and the mask (B, N), all True."""
    tokens = torch.zeros(batch, n, d, device=device, dtype=config.dtype)
    return tokens, torch.ones(batch, n, dtype=torch.bool, device=device)


def trace_dtype(config: SamplingConfig) -> type:
    """The numpy dtype of a run's trace: float64 for a float64 run, float32 otherwise."""
    return np.float64 if config.dtype == torch.float64 else np.float32


def finished(tokens: Tensor) -> Tensor:
    """A run's tokens as :class:`Generation` holds them: on the CPU, float32 (float64 in a float64 run)."""
    return tokens.cpu() if tokens.dtype == torch.float64 else tokens.float().cpu()


def draw_chain_noise(
    streams: ImageStreams, k: int, steps: int, d: int, dtype: torch.dtype = torch.float32
) -> ChainNoise:
    """Noise for k tokens per image, rows image-major: xi (B*k, d), eps (T-1, B*k, d), drawn in float32
    (every precision's numbers) and cast to the run's ``dtype``."""
    raw = streams.randn(steps, k, d).to(dtype)  # (B, T, k, d)
    b = raw.shape[0]
    return ChainNoise(xi=raw[:, 0].reshape(b * k, d), eps=raw[:, 1:].permute(1, 0, 2, 3).reshape(steps - 1, b * k, d))


@dataclass(frozen=True)
class StepInput:
    """What one AR step of one model reads beside the canvas: the model's state of the generation (its
    conditions and caches, :meth:`csd.family.ModelFamily.start`), the positions it makes (B, k), its guidance
    scale, its chains' noise, the sampler settings and head steps it runs them with, and the phase its time
    is counted under ("target", "draft", "prefill")."""

    state: ModelState
    pos: Tensor
    cfg: float
    noise: ChainNoise
    config: SamplingConfig
    steps: int
    phase: str


def predict_step(
    model: ModelFamily, tokens: Tensor, mask: Tensor, step: StepInput, timer: PhaseTimer
) -> tuple[Trajectory, TokenChain]:
    """One AR step of one model: its pass over the context (``{phase}_backbone``), then the chains of
    the tokens at ``step.pos`` (``{phase}_head``). Returns the trajectory and the chains it came from."""
    pos, config = step.pos, step.config
    with timer(f"{step.phase}_backbone"):
        cfg = torch.full((pos.numel(),), step.cfg, device=pos.device, dtype=config.dtype)
        chain = model.predict(step.state, tokens, mask, pos, cfg, step.steps)
    with timer(f"{step.phase}_head", tokens=pos.numel(), steps=config.head_calls(step.steps)):  # Heun: two calls
        traj = chain.run(step.noise)
    return traj, chain


def commit(tokens: Tensor, mask: Tensor, pos: Tensor, x: Tensor) -> None:
    """Write x (B*k, d) at positions (B, k) and unmask them, in place."""
    b, k = pos.shape
    tokens.scatter_(1, pos.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]), x.reshape(b, k, -1).to(tokens.dtype))
    mask.scatter_(1, pos, False)
