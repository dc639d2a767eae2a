"""One cell of a paper-scale run timed: target-only, draft-only and CSD at every gamma, interleaved, with
device synchronisation and peak memory, into one row per gamma."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Callable
from dataclasses import asdict
from functools import partial

import numpy as np
import torch

from csd import CSDConfig, Method, SamplingConfig
from csd.experiments.paper_scale.build import LoadedPair, conditions_for
from csd.experiments.paper_scale.plan import Cell, GridConfig
from csd.experiments.timing import Samples, alternate, cost_breakdown, measured_costs, ratio_spread
from csd.records.cost import csd_passes, speedup_bound
from csd.serving.catalog import entry_of


def autocast_for(sampling: SamplingConfig, device: torch.device, heads: str) -> contextlib.AbstractContextManager:
    """Autocast around a whole run where the library does not lower the precision itself: the library runs
    backbones (every family's) at SamplingConfig.precision and heads in float32; ``heads`` "bfloat16" puts
    the heads under bfloat16 too, as the published code samples. Densities stay float32 or float64:
    autocast only lowers matmul-like ops and never touches float64."""
    if heads == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def measured_run(
    fn: Callable[[], object],
    device: torch.device,
    peaks: dict[str, int],
    name: str,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> Callable[[], object]:
    """``fn`` with device synchronisation around it (so the wall time holds the GPU work) and, on CUDA, its
    peak allocated memory (reset first) kept in ``peaks[name]`` (the largest over the repeats)."""

    def run() -> object:
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with autocast():
            out = fn()
        if cuda:
            torch.cuda.synchronize(device)
            peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))
        return out

    return run


def process_peak_rss() -> int | None:
    """The process's peak resident memory in bytes (never reset; None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if platform.system() == "Darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def time_cell(loaded: LoadedPair, cell: Cell, grid: GridConfig, device: torch.device) -> list[dict]:
    """Target-only, draft-only and CSD at every gamma of a cell, interleaved: one row per gamma."""
    target, draft, sampling = loaded.target, loaded.draft, cell.sampling
    prompt_tokens = entry_of(cell.pair.family).paper.prompt_shape(grid.tiny)[0]
    official = loaded.weights == "official"
    conditions, seeds = conditions_for(target, cell.batch, grid.seed, prompt_tokens, official)
    csd = {g: grid.csd(g) for g in cell.gammas}
    methods = {"target": Method.target(), "draft": Method.draft()}
    methods |= {f"csd/{g}": Method.speculative(c) for g, c in csd.items()}
    fns: dict[str, Callable[[], object]] = {
        name: partial(method.run, target, draft, conditions, seeds, sampling) for name, method in methods.items()
    }
    peaks: dict[str, int] = {}
    autocast = partial(autocast_for, sampling, device, grid.heads)
    runs = {name: measured_run(fn, device, peaks, name, autocast) for name, fn in fns.items()}
    samples = alternate(runs, grid.repeats, grid.warmup)
    costs = measured_costs(samples["target"], samples["draft"], sampling.num_steps)
    return [_row(cell, csd[g], samples, costs, peak_memory(peaks, device, g)) for g in cell.gammas]


def peak_memory(peaks: dict[str, int], device: torch.device, gamma: int) -> dict:
    if device.type == "cuda":
        kind = "torch.cuda.max_memory_allocated, reset per run"
        return {"kind": kind, "target": peaks.get("target"), "csd": peaks.get(f"csd/{gamma}")}
    rss = process_peak_rss()
    return {"kind": "process peak RSS (resource.getrusage; not reset per run)", "target": rss, "csd": rss}


def _row(cell: Cell, csd: CSDConfig, samples: dict[str, Samples], costs, memory: dict) -> dict:
    g = csd.gamma
    base, spec = samples["target"], samples[f"csd/{g}"]
    lo, hi = ratio_spread(base, spec)
    steps, p_steps = cell.sampling.num_steps, cell.prefill_steps(csd.prefill)
    passes, drafts = csd_passes(cell.num_tokens, cell.sampling, csd)
    split = cost_breakdown(spec)
    per_block = cell.traits.head_per_block  # xAR's flow chain is the backbone: a block's chain costs one step's
    return {
        "batch": cell.batch,
        "gamma": g,
        "num_steps": steps,
        "head_steps": cell.head_steps,
        "prefill_steps": p_steps,
        "target_passes": passes,
        "draft_passes": drafts,
        "target_s": base.median,
        "draft_s": samples["draft"].median,
        "csd_s": spec.median,
        "speedup": base.median / spec.median,
        "speedup_min": lo,
        "speedup_max": hi,
        "speedup_bound": speedup_bound(costs, cell.num_tokens, cell.sampling, csd, per_block),
        "per_step_ms": {k: 1e3 * v for k, v in asdict(costs).items()},
        "time_split": {
            "backbones": split["draft_backbone"] + split["target_backbone"],
            "heads": split["draft_heads"] + split["target_heads"],
            "acceptance": split["acceptance_test"],
            "resampling": split["resampling"],
            "other": split["other"],
        },
        "cost_breakdown": split,
        "acceptance": float(np.nanmean([o.trace.acceptance_rate for o in spec.outputs])),
        "peak_memory": memory,
    }
