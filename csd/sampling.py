"""Target-only (or draft-only) generation, and the pieces speculative decoding shares with it.

One AR step = one pass of the model over the current tokens (:meth:`csd.family.ModelFamily.predict`),
then the chains of the step's tokens, vectorised over the batch and the step's tokens.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from csd.chain import ChainNoise, Trajectory
from csd.checks import check_choice, check_int, check_number
from csd.family import ModelFamily, TokenChain
from csd.models.schedule import CFG_SCHEDULES
from csd.rng import ImageStreams, check_seeds
from csd.trace import Maker, Trace

StepCallback = Callable[[int, int, str], None]
"""``on_step(done, total, phase)``: called by a sampler after each AR step (``done`` of ``total`` steps
processed, ``phase`` what the step was: "target", "draft", "pre-fill", "verify"). It may raise to
stop the run there (the app's Stop button does); a sampler without one pays nothing."""


PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class SamplingConfig:
    """Knobs shared by every sampler. ``head_steps=None`` uses the target's default; ``head_steps_min``
    anneals the head steps linearly over the AR steps, from ``head_steps`` at the first to it at the
    last (DiSA's cheaper late steps; :func:`head_step_schedule`)."""

    num_steps: int = 64
    cfg_scale: float = 1.0
    cfg_schedule: str = "linear"
    temperature: float = 1.0
    head_steps: int | None = None
    head_steps_min: int | None = None  # a head-step schedule: linear from head_steps to this over the AR steps
    precision: str = "float32"  # backbone precision; heads and all densities stay in float32

    def __post_init__(self) -> None:
        check_int("num_steps (AR steps)", self.num_steps, 1)
        check_number("cfg_scale", self.cfg_scale, 0.0, 100.0)
        check_choice("cfg_schedule", self.cfg_schedule, CFG_SCHEDULES)
        check_number("temperature", self.temperature, 0.0, 10.0, lo_open=True)
        if self.head_steps is not None:
            check_int("head_steps", self.head_steps, 1, 1000, word="None or an int")
        if self.head_steps_min is not None:
            check_int("head_steps_min (last AR step's head steps)", self.head_steps_min, 1, 1000, word="None or an int")
        check_choice("precision", self.precision, tuple(PRECISIONS))

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0


def head_step_schedule(first: int, last: int | None, num_steps: int) -> list[int]:
    """Head steps of each AR step: ``first`` throughout, or linear from ``first`` to ``last``, rounded."""
    if last is None or num_steps == 1:
        return [first] * num_steps
    return [round(first + (last - first) * s / (num_steps - 1)) for s in range(num_steps)]


@dataclass
class Generation:
    tokens: Tensor  # (B, N, d), float32 on the CPU
    trace: Trace


class PhaseTimer:
    """Wall time per named phase; synchronises CUDA so GPU work is charged to the right phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        yield
        if sync:
            torch.cuda.synchronize(self.device)
        self.times[phase] += time.perf_counter() - t0


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def draw_chain_noise(streams: ImageStreams, k: int, steps: int, d: int) -> ChainNoise:
    """Noise for k tokens per image, rows image-major: xi (B*k, d), eps (T-1, B*k, d)."""
    raw = streams.randn(steps, k, d)  # (B, T, k, d)
    b = raw.shape[0]
    return ChainNoise(xi=raw[:, 0].reshape(b * k, d), eps=raw[:, 1:].permute(1, 0, 2, 3).reshape(steps - 1, b * k, d))


def predict_step(
    model: ModelFamily,
    tokens: Tensor,
    mask: Tensor,
    conditions,
    pos: Tensor,
    cfg: float,
    noise: ChainNoise,
    config: SamplingConfig,
    steps: int,
    timer: PhaseTimer,
    phase: str,
) -> tuple[Trajectory, TokenChain]:
    """One AR step of one model: its pass over the context (``{phase}_backbone``), then the chains of
    the tokens at ``pos`` (``{phase}_head``). Returns the trajectory and the chains it came from."""
    with timer(f"{phase}_backbone"):
        chain = model.predict(
            tokens, mask, conditions, pos, torch.full((pos.numel(),), cfg, device=pos.device), config, steps
        )
    with timer(f"{phase}_head"):
        traj = chain.run(noise)
    return traj, chain


def commit(tokens: Tensor, mask: Tensor, pos: Tensor, x: Tensor) -> None:
    """Write x (B*k, d) at positions (B, k) and unmask them, in place."""
    b, k = pos.shape
    tokens.scatter_(1, pos.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]), x.reshape(b, k, -1).to(tokens.dtype))
    mask.scatter_(1, pos, False)


@torch.inference_mode()
def generate(
    model: ModelFamily,
    conditions: Sequence | Tensor,
    seeds: Sequence[int],
    config: SamplingConfig | None = None,
    maker: Maker = Maker.TARGET,
    on_step: StepCallback | None = None,
) -> Generation:
    """Generate ``len(seeds)`` images with one model alone (the baseline of every comparison).
    ``conditions``: one per seed (class ids for MAR).

    Image i depends only on (seeds[i], conditions[i], config): the same as when generated alone.
    ``on_step`` (see :data:`StepCallback`) is called after each AR step."""
    config = config or SamplingConfig()
    seeds = check_seeds(seeds)
    device = model_device(model)
    batch, n, d = len(seeds), model.seq_len, model.token_dim
    conditions = model.check_conditions(conditions, batch, device)
    plan = model.plan(seeds, config, device)
    schedule = head_step_schedule(model.head_steps(config.head_steps), config.head_steps_min, config.num_steps)
    noise_streams = ImageStreams(seeds, "chain", device)
    timer = PhaseTimer(device)
    phase = "target" if maker == Maker.TARGET else "draft"
    trace = Trace.empty(batch, n, plan.sizes, {"sampling": asdict(config), "maker": maker.name.lower()})

    tokens = torch.zeros(batch, n, d, device=device)
    mask = torch.ones(batch, n, dtype=torch.bool, device=device)
    for s, k in enumerate(plan.sizes):
        pos = plan.positions(s)
        noise = draw_chain_noise(noise_streams, k, schedule[s], d)
        args = (conditions, pos, plan.cfg[s], noise, config, schedule[s], timer, phase)
        traj, _ = predict_step(model, tokens, mask, *args)
        commit(tokens, mask, pos, traj.x)
        trace.record_made(pos, s, maker)
        trace.record_pass(phase)
        if on_step is not None:
            on_step(s + 1, plan.num_steps, phase)
    trace.record_times(timer.times)
    return Generation(tokens.float().cpu(), trace)
