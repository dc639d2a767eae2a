"""Target-only (or draft-only) generation with MAR's schedule, and the pieces CSD shares with it.

One AR step = one backbone pass over the current tokens, then the head chain for the tokens of
the step, vectorised over the batch and the step's tokens.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from csd.chain import ChainNoise, GaussianChain, HeadCondition, Trajectory, run_chain
from csd.models.schedule import CFG_SCHEDULES, step_cfg_scales, step_sizes
from csd.rng import ImageStreams, check_seeds
from csd.trace import Maker, Trace


class TokenHead(Protocol):
    def chain(self, steps: int | None = None) -> GaussianChain: ...


class ARModel(Protocol):
    """What the samplers need of a model (MAR implements it)."""

    seq_len: int
    token_dim: int
    num_classes: int
    head: TokenHead

    def conditions(self, tokens: Tensor, mask: Tensor, labels: Tensor, guided: bool) -> tuple[Tensor, Tensor | None]:
        """Per-position conditions z (B, N, D) and, when guided, the unconditional ones."""


StepCallback = Callable[[int, int, str], None]
"""``on_step(done, total, phase)``: called by a sampler after each AR step (``done`` of ``total`` steps
processed, ``phase`` what the step was: "target", "draft", "pre-fill", "verify"). It may raise to
stop the run there (the app's Stop button does); a sampler without one pays nothing."""


PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """Knobs shared by every sampler. ``head_steps=None`` uses the target's default."""

    num_steps: int = 64
    cfg_scale: float = 1.0
    cfg_schedule: str = "linear"
    temperature: float = 1.0
    head_steps: int | None = None
    precision: str = "float32"  # backbone precision; heads and all densities stay in float32

    def __post_init__(self) -> None:
        if not _is_int(self.num_steps) or self.num_steps < 1:
            raise ValueError(f"num_steps (AR steps) must be an int >= 1, got {self.num_steps!r}")
        if not math.isfinite(self.cfg_scale) or not 0.0 <= self.cfg_scale <= 100.0:
            raise ValueError(f"cfg_scale must be in [0, 100], got {self.cfg_scale!r}")
        if self.cfg_schedule not in CFG_SCHEDULES:
            raise ValueError(f"cfg_schedule must be one of {CFG_SCHEDULES}, got {self.cfg_schedule!r}")
        if not math.isfinite(self.temperature) or not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"temperature must be in (0, 10], got {self.temperature!r}")
        if self.head_steps is not None and (not _is_int(self.head_steps) or not 1 <= self.head_steps <= 1000):
            raise ValueError(f"head_steps must be an int in [1, 1000] or None, got {self.head_steps!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0


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


def check_labels(labels: Sequence[int] | Tensor, num_classes: int, batch: int, device: torch.device) -> Tensor:
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if labels.numel() != batch:
        raise ValueError(f"labels must hold one class id per seed ({batch}), got {labels.numel()}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"class labels must be in [0, {num_classes - 1}], got {labels.tolist()}")
    return labels.to(device)


@dataclass(frozen=True)
class Plan:
    """The AR schedule of a batch: orders (B, N), tokens per step, guidance per step.

    As in MAR, the tokens still masked after step s are orders[:, :masked_after[s]], so step s
    predicts orders[:, masked_after[s]:masked_before[s]]."""

    orders: Tensor
    sizes: list[int]
    cfg: list[float]

    @property
    def num_steps(self) -> int:
        return len(self.sizes)

    def positions(self, step: int) -> Tensor:
        before = self.orders.shape[1] - sum(self.sizes[:step])
        return self.orders[:, before - self.sizes[step] : before]  # (B, k)


def make_plan(seeds: Sequence[int], num_tokens: int, config: SamplingConfig, device: torch.device) -> Plan:
    sizes = step_sizes(num_tokens, config.num_steps)
    orders = ImageStreams(seeds, "order", device).randperm(num_tokens)
    return Plan(orders, sizes, step_cfg_scales(config.cfg_scale, config.cfg_schedule, sizes))


def draw_chain_noise(streams: ImageStreams, k: int, steps: int, d: int) -> ChainNoise:
    """Noise for k tokens per image, rows image-major: xi (B*k, d), eps (T-1, B*k, d)."""
    raw = streams.randn(steps, k, d)  # (B, T, k, d)
    b = raw.shape[0]
    return ChainNoise(xi=raw[:, 0].reshape(b * k, d), eps=raw[:, 1:].permute(1, 0, 2, 3).reshape(steps - 1, b * k, d))


def gather_rows(values: Tensor, pos: Tensor) -> Tensor:
    """values (B, N, D) at positions (B, k) -> (B*k, D), image-major."""
    return torch.gather(values, 1, pos.unsqueeze(-1).expand(-1, -1, values.shape[-1])).reshape(-1, values.shape[-1])


def step_condition(z: Tensor, z_uncond: Tensor | None, pos: Tensor, cfg_rows: Tensor) -> HeadCondition:
    if z_uncond is None:
        return HeadCondition(gather_rows(z, pos))
    return HeadCondition(gather_rows(z, pos), gather_rows(z_uncond, pos), cfg_rows)


def commit(tokens: Tensor, mask: Tensor, pos: Tensor, x: Tensor) -> None:
    """Write x (B*k, d) at positions (B, k) and unmask them, in place."""
    b, k = pos.shape
    tokens.scatter_(1, pos.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]), x.reshape(b, k, -1).to(tokens.dtype))
    mask.scatter_(1, pos, False)


def put(arr: np.ndarray, pos: Tensor, values) -> None:
    """arr[b, pos[b, j]] = values[b, j] for a (B, N) trace array; values (B*k,), (B, k) or a scalar."""
    p = pos.cpu().numpy()
    if isinstance(values, Tensor):
        values = values.detach().float().cpu().numpy().reshape(p.shape)
    arr[np.arange(p.shape[0])[:, None], p] = values


def backbone_conditions(
    model: ARModel, tokens: Tensor, mask: Tensor, labels: Tensor, config: SamplingConfig
) -> tuple[Tensor, Tensor | None]:
    """One backbone pass, under autocast when a reduced precision is asked; z comes back in float32."""
    dtype = PRECISIONS[config.precision]
    if dtype is None:
        return model.conditions(tokens, mask, labels, config.guided)
    with torch.autocast(device_type=tokens.device.type, dtype=dtype):
        z, z_uncond = model.conditions(tokens, mask, labels, config.guided)
    return z.float(), None if z_uncond is None else z_uncond.float()


def predict_step(
    model: ARModel,
    chain: GaussianChain,
    tokens: Tensor,
    mask: Tensor,
    labels: Tensor,
    pos: Tensor,
    cfg: float,
    noise: ChainNoise,
    config: SamplingConfig,
    timer: PhaseTimer,
    phase: str,
) -> tuple[Trajectory, HeadCondition]:
    """One AR step of one model: a backbone pass, then the head chains of the tokens at ``pos``."""
    with timer(f"{phase}_backbone"):
        z, z_uncond = backbone_conditions(model, tokens, mask, labels, config)
    cond = step_condition(z, z_uncond, pos, torch.full((pos.numel(),), cfg, device=z.device))
    with timer(f"{phase}_head"):
        traj = run_chain(chain, cond, noise, config.temperature)
    return traj, cond


@torch.inference_mode()
def generate(
    model: ARModel,
    labels: Sequence[int] | Tensor,
    seeds: Sequence[int],
    config: SamplingConfig | None = None,
    maker: Maker = Maker.TARGET,
    on_step: StepCallback | None = None,
) -> Generation:
    """Generate ``len(seeds)`` images with one model alone (the baseline of every comparison).

    Image i depends only on (seeds[i], labels[i], config): the same as when generated alone.
    ``on_step`` (see :data:`StepCallback`) is called after each AR step."""
    config = config or SamplingConfig()
    seeds = check_seeds(seeds)
    device = model_device(model)
    batch, n, d = len(seeds), model.seq_len, model.token_dim
    labels = check_labels(labels, model.num_classes, batch, device)
    if config.num_steps > n:
        raise ValueError(f"num_steps (AR steps) must be in [1, {n}] (the number of tokens), got {config.num_steps}")
    chain = model.head.chain(config.head_steps)
    plan = make_plan(seeds, n, config, device)
    noise_streams = ImageStreams(seeds, "chain", device)
    timer = PhaseTimer(device)
    phase = "target" if maker == Maker.TARGET else "draft"
    trace = Trace.empty(batch, n, plan.sizes, {"sampling": asdict(config), "maker": maker.name.lower()})

    tokens = torch.zeros(batch, n, d, device=device)
    mask = torch.ones(batch, n, dtype=torch.bool, device=device)
    for s, k in enumerate(plan.sizes):
        pos = plan.positions(s)
        noise = draw_chain_noise(noise_streams, k, chain.num_steps(), d)
        traj, _ = predict_step(model, chain, tokens, mask, labels, pos, plan.cfg[s], noise, config, timer, phase)
        commit(tokens, mask, pos, traj.x)
        put(trace.maker, pos, int(maker))
        put(trace.ar_step, pos, s)
        if on_step is not None:
            on_step(s + 1, plan.num_steps, phase)
    if maker == Maker.TARGET:
        trace.target_passes = plan.num_steps
    else:
        trace.draft_passes = plan.num_steps
    trace.times = dict(timer.times)
    return Generation(tokens.float().cpu(), trace)
