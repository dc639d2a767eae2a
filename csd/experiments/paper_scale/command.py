"""The paper-scale command line: the plan and its estimate, then (unless --dry-run) the run."""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import torch

from csd.checks import check_number
from csd.cli import add_machine_flags, start_up
from csd.cost import csd_passes
from csd.experiments import paper_scale
from csd.experiments.paper_scale.estimate import PROFILES, Rates, estimate
from csd.experiments.paper_scale.grid import HEAD_MODES, Cell, GridConfig, pair_keys, paper_families, plan_cells
from csd.experiments.paper_scale.report import markdown, plan_text
from csd.experiments.paper_scale.run import DEFAULT_OUT, RunContext, run, write_result


def profile_for(name: str, device: torch.device) -> str:
    """--estimate-device auto: the profile of the device the run uses (a GPU by its name, H200 if unknown)."""
    if name != "auto":
        return name
    if device.type != "cuda":
        return "cpu"
    gpu = torch.cuda.get_device_name(device).lower()
    return next((k for k in PROFILES if k != "cpu" and k in gpu), "h200")


def parser() -> argparse.ArgumentParser:
    families, keys = paper_families(), pair_keys()
    description = paper_scale.__doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m csd.experiments.paper_scale", description=description)
    p.add_argument("--families", nargs="+", default=list(families), help=f"model families, of {', '.join(families)}")
    p.add_argument("--pairs", nargs="+", default=list(keys), help=f"target/draft sizes: {', '.join(keys)}")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 8 64 256; --tiny 1 2)")
    p.add_argument("--gammas", type=int, nargs="+", help="draft lengths (default 8 16 32; --tiny 2 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--prefill", type=float, default=0.05, help="fraction of tokens the target makes first")
    p.add_argument("--seed", type=int, default=0, help="weights, conditions and image seeds")
    p.add_argument("--checkpoints", type=Path, help="official checkpoints (DIR/mar, DIR/xar, DIR/harmon) where present")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="backbone precision (auto: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--heads",
        default="float32",
        choices=HEAD_MODES,
        help="head matmuls: float32 (the library), tf32 (CUDA TF32), bfloat16 (autocast, as the published code)",
    )
    add_machine_flags(p)
    p.add_argument("--tiny", action="store_true", help="the same code path at tiny sizes (a CPU, under a minute)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and a run-time estimate, run nothing")
    p.add_argument("--estimate-device", default="auto", choices=("auto", *PROFILES), help="device of the estimate")
    p.add_argument(
        "--budget-s",
        type=float,
        help="warn when the estimated run time exceeds this many seconds; a run skips the cells that no longer fit",
    )
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="folder for paper_scale[_tiny].json and .md")
    return p


def grid_from_args(args: argparse.Namespace) -> GridConfig:
    """The grid the flags ask for; raises ValueError naming a bad flag and its valid range."""
    tup = lambda v: None if v is None else tuple(v)
    grid = GridConfig(
        families=tuple(args.families),
        pairs=tuple(args.pairs),
        batches=tup(args.batches),
        gammas=tup(args.gammas),
        repeats=args.repeats,
        warmup=args.warmup,
        prefill=args.prefill,
        seed=args.seed,
        tiny=args.tiny,
        heads=args.heads,
    )
    if args.budget_s is not None:
        check_number("--budget-s (seconds)", args.budget_s, 0.0, 1e9, lo_open=True)
    if args.tiny and args.checkpoints is not None:
        raise ValueError("--tiny builds shrunken random models: it cannot load --checkpoints")
    return grid


def main(argv: list[str] | None = None) -> dict:
    """Print the plan and its estimate; unless --dry-run, time every cell and write JSON and Markdown."""
    args_parser = parser()
    args = args_parser.parse_args(argv)
    try:
        grid = grid_from_args(args)
    except ValueError as err:
        args_parser.error(str(err))  # exits with the message and the usage
    device = start_up(args, args_parser)
    if not args.dry_run and grid.heads == "tf32" and device.type != "cuda":
        args_parser.error("--heads tf32 needs a CUDA device (TF32 is a CUDA matmul mode)")
    profile = profile_for(args.estimate_device, device)
    # The plan's dtypes: those of the device estimated (dry run) or used.
    gpu = profile != "cpu" if args.dry_run else device.type == "cuda"
    precision = args.precision if args.precision != "auto" else ("bfloat16" if gpu else "float32")
    cells = plan_cells(grid, precision)
    est = estimate(cells, grid, Rates(PROFILES[profile], precision != "float32", grid.heads))
    print(plan_text(cells, grid, est, args.budget_s))
    if args.dry_run:
        return {"plan": [_cell_dict(c, grid) for c in cells], "estimate": est}
    if grid.heads == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    stem = "paper_scale_tiny" if grid.tiny else "paper_scale"
    deadline = None if args.budget_s is None else time.perf_counter() + args.budget_s
    estimates = {(r["pair"], r["batch"]): r for r in est["rows"]}
    ctx = RunContext(grid, device, args.checkpoints, estimates, deadline)
    result = run(cells, ctx, est, partial(write_result, out=args.out, stem=stem))
    print(markdown(result))
    print(f"wrote {args.out / (stem + '.json')} and {args.out / (stem + '.md')}")
    return result


def _cell_dict(cell: Cell, grid: GridConfig) -> dict:
    s = cell.sampling
    return {
        "pair": cell.pair.paper_name,
        "batch": cell.batch,
        "gammas": list(cell.gammas),
        "num_steps": s.num_steps,
        "head_steps": cell.head_steps,
        "cfg_scale": s.cfg_scale,
        "precision": s.precision,
        "target_passes": [csd_passes(cell.num_tokens, s, grid.csd(g))[0] for g in cell.gammas],
    }
