"""A paper-scale run: every cell of the plan, one pair in memory at a time; a pair that cannot be built, a
batch that runs out of memory and a cell the deadline leaves no time for are named as skipped; the result
is written after every cell, so a run stopped half-way keeps what it measured."""

from __future__ import annotations

import gc
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from csd.experiments.paper_scale.build import conditions_for, load_pair
from csd.experiments.paper_scale.markdown import QUALITY_NOTE, RANDOM_NOTE, markdown
from csd.experiments.paper_scale.measure import time_cell
from csd.experiments.paper_scale.plan import Cell, GridConfig
from csd.serving.catalog import PairSpec, entry_of

DEFAULT_OUT = "bench/results/gpu"


@dataclass(frozen=True)
class RunContext:
    """What every cell of a run shares: the grid, the device, where checkpoints are, the estimate per cell
    (pair, batch), a deadline (perf_counter seconds, None: none) and the (measured, estimated) seconds of
    the cells done, which scale the estimate of the next one."""

    grid: GridConfig
    device: torch.device
    checkpoints: Path | None
    estimates: dict[tuple[str, int], dict]
    deadline: float | None
    done: list[tuple[float, float]] = field(default_factory=list)

    def predicted_s(self, estimated: float) -> float:
        """A cell's estimate, times the measured / estimated ratio of the cells timed so far."""
        measured, guessed = (sum(v) for v in zip(*self.done, strict=True)) if self.done else (1.0, 1.0)
        return estimated * measured / guessed


def run_pair(pair: PairSpec, cells: list[Cell], ctx: RunContext, entry: dict, save: Callable[[], None]) -> None:
    """Every cell of one pair into ``entry``, saved after each. A pair that cannot be built, a batch that runs
    out of memory and a cell the deadline leaves no time for are named as skipped, with the reason."""
    try:
        loaded = load_pair(pair, ctx.device, ctx.grid.seed, ctx.grid.tiny, ctx.checkpoints)
    except Exception as err:  # e.g. a text family without transformers, or too little memory
        entry |= {"weights": "not built", "skipped": f"{type(err).__name__}: {err}"}
        print(f"skipped {pair.paper_name}: {entry['skipped']}")
        return
    count = lambda m: sum(p.numel() for p in m.parameters())
    entry |= {"weights": loaded.weights, "params": {"target": count(loaded.target), "draft": count(loaded.draft)}}
    if loaded.target.traits.conditions == "prompts":  # as the model tokenises it, start token and template included
        paper, official = entry_of(pair.family).paper, loaded.weights == "official"
        prompts, _ = conditions_for(loaded.target, 1, ctx.grid.seed, paper.prompt_shape(ctx.grid.tiny)[0], official)
        entry["prompt_tokens"] = paper.prompt_length(loaded.target, prompts[0])
    for cell in cells:
        entry["rows"] += time_or_skip(loaded, cell, ctx)
        save()
    del loaded
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def time_or_skip(loaded, cell: Cell, ctx: RunContext) -> list[dict]:
    """The cell's rows, each with its estimate next to it (to calibrate the estimate), or one skipped row."""
    est = ctx.estimates.get((cell.pair.paper_name, cell.batch))
    skip = lambda why: [{"batch": cell.batch, "skipped": why}]
    if ctx.deadline is not None and est is not None:
        predicted = ctx.predicted_s(est["cell_s"])
        if time.perf_counter() + predicted > ctx.deadline:
            return skip(f"--budget-s: its predicted {predicted:.0f} s do not fit in the time left")
    t0 = time.perf_counter()
    try:
        rows = time_cell(loaded, cell, ctx.grid, ctx.device)
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return skip(f"out of memory ({str(err).splitlines()[0]})")
    wall = time.perf_counter() - t0
    if est is not None:
        ctx.done.append((wall, est["cell_s"]))
    for r in rows:
        r["cell_wall_s"] = wall
        if est is not None:
            r["estimate"] = {
                "cell_s": est["cell_s"],
                "target_s": est["target_s"],
                "speedup": est["speedups"][r["gamma"]],
            }
    speedups = ", ".join(f"gamma {r['gamma']} {r['speedup']:.2f}x" for r in rows)
    print(f"{cell.pair.paper_name} batch {cell.batch}: {speedups}")
    return rows


def run(cells: list[Cell], ctx: RunContext, est: dict, write: Callable[[dict], None]) -> dict:
    """Every pair's cells, one pair in memory at a time; the result so far is written after every cell (a
    run stopped half-way keeps what it measured)."""
    t0 = time.perf_counter()
    grid = ctx.grid
    result = {
        "random_weights": False,
        "weights_note": "",
        "quality": QUALITY_NOTE,
        "pairs": [],
        "estimate": est,
        "settings": {
            **asdict(grid),
            "batches": list(grid.batch_sizes),
            "gammas": list(grid.draft_lengths),
            "precision": cells[0].sampling.precision if cells else None,
            "device": str(ctx.device),
            "device_name": device_name(ctx.device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }

    def save() -> None:
        result["random_weights"] = any(p.get("weights", "").startswith("random") for p in result["pairs"])
        sizes = "tiny configs" if grid.tiny else "official sizes"
        result["weights_note"] = RANDOM_NOTE.format(sizes=sizes) if result["random_weights"] else "official checkpoints"
        result["settings"]["wall_time_s"] = time.perf_counter() - t0
        write(result)

    for pair in dict.fromkeys(c.pair for c in cells):
        pair_cells = [c for c in cells if c.pair == pair]
        entry = {"pair": pair.paper_name, "family": pair.family, "target": pair.target, "draft": pair.draft}
        entry |= {"sampling": pair_cells[0].sampling.knob_values(), "head_steps": pair_cells[0].head_steps, "rows": []}
        result["pairs"].append(entry)
        run_pair(pair, pair_cells, ctx, entry, save)
        save()
    return result


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"


def write_result(result: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
