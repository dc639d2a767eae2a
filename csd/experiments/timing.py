"""Timing samplers side by side: interleaved repeats, their medians and spreads, and the per-pass costs
and phase shares a run's traces record. Ratios of runs timed here in one process are the project's
speed figures (absolute times depend on the machine).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from csd.decoding import sync_cuda
from csd.records.cost import StepCosts

# Environment variables that choose the float kernels (docs/specification_notes.md, "Numbers on other CPUs").
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform reports."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What a timing ran on: the CPU, the kernels torch runs there (its CPU capability and the variables set
    to choose them), torch's version and threads. Absolute times are only comparable between equal ones."""
    return {
        "cpu": cpu_model(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)
    outputs: list = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def alternate(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, Samples]:
    """Time every run ``repeats`` times, interleaved round by round, after ``warmup`` untimed rounds.

    Odd rounds run in reverse order, so a slow drift (thermal, background load) is charged to every
    run alike rather than to whichever runs last."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    out = {name: Samples() for name in names}
    for k in range(repeats):
        for name in names if k % 2 == 0 else names[::-1]:
            sync_cuda()
            t0 = time.perf_counter()
            result = runs[name]()
            sync_cuda()
            out[name].seconds.append(time.perf_counter() - t0)
            out[name].outputs.append(result)
    return out


def ratio_spread(a: Samples, b: Samples) -> tuple[float, float]:
    """Min and max of the per-round ratios a / b (how noisy the median ratio is)."""
    ratios = [x / y for x, y in zip(a.seconds, b.seconds, strict=True)]
    return min(ratios), max(ratios)


def mean_phase(samples: Samples, phase: str) -> float:
    return float(np.mean([g.trace.times.get(phase, 0.0) for g in samples.outputs]))


def measured_costs(target: Samples, draft: Samples, num_steps: int) -> StepCosts:
    """C_p, H_p from the target-only runs, C_q, H_q from the draft-only runs, per AR step."""
    return StepCosts(
        target_backbone=mean_phase(target, "target_backbone") / num_steps,
        target_head=mean_phase(target, "target_head") / num_steps,
        draft_backbone=mean_phase(draft, "draft_backbone") / num_steps,
        draft_head=mean_phase(draft, "draft_head") / num_steps,
    )


# Trace phases of a CSD run, grouped as the cost model names them.
COST_GROUPS = {
    "draft_backbone": ("draft_backbone",),
    "draft_heads": ("draft_head",),
    "target_backbone": ("prefill_backbone", "target_backbone", "next_backbone"),
    "target_heads": ("prefill_head", "target_head", "next_head"),
    "acceptance_test": ("verify",),
    "resampling": ("resample",),
}


def cost_breakdown(csd_runs: Samples) -> dict[str, float]:
    """Fraction of a CSD run's wall time per phase group; ``other`` is bookkeeping and noise drawing."""
    wall = float(np.mean(csd_runs.seconds))
    out = {group: sum(mean_phase(csd_runs, p) for p in phases) / wall for group, phases in COST_GROUPS.items()}
    out["other"] = 1.0 - sum(out.values())
    return out
