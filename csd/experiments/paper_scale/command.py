"""The paper-scale command line: the plan and its estimate, then (unless --dry-run) the run."""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import torch

from csd.cli import add_machine_flags, start_up
from csd.core.checks import check_number
from csd.experiments import paper_scale
from csd.experiments.evaluate import init_distributed
from csd.experiments.fid import load_reference_stats
from csd.experiments.paper_scale.markdown import markdown, plan_text
from csd.experiments.paper_scale.plan import HEAD_MODES, Cell, GridConfig, pair_keys, paper_families, plan_cells
from csd.experiments.paper_scale.projection import PROFILES, Rates, estimate
from csd.experiments.paper_scale.quality import QualityConfig, run_quality
from csd.experiments.paper_scale.run import DEFAULT_OUT, RunContext, run, write_result
from csd.records.cost import csd_passes


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
    q = p.add_argument_group("Table 1's quality column (needs official checkpoints; torchrun shares the images out)")
    q.add_argument("--fid", type=int, metavar="N", help="also generate N images per sampler and score FID and IS")
    q.add_argument("--fid-stats", type=Path, help="reference statistics (.npz with mu and sigma: ADM ImageNet 256)")
    q.add_argument("--inception", type=Path, help="Inception weights of the backend (csd.experiments.fid)")
    q.add_argument("--fid-backend", default="auto", help="torch-fidelity, clean-fid or auto (the installed one)")
    q.add_argument("--fid-batch", type=int, default=64, help="images per chunk (one .npz shard each)")
    return p


def quality_config(args: argparse.Namespace) -> QualityConfig | None:
    """The --fid settings, checked before anything is built: the statistics file must exist and hold mu, sigma."""
    if args.fid is None:
        return None
    if args.fid_stats is None:
        raise ValueError("--fid needs --fid-stats FILE (reference statistics: .npz with mu and sigma)")
    load_reference_stats(args.fid_stats)  # a missing file or key is named now, not after hours of sampling
    shards = args.out / "fid_shards"
    return QualityConfig(args.fid, args.fid_stats, shards, args.inception, args.fid_backend, args.fid_batch)


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
    if args.fid is not None and args.checkpoints is None:
        raise ValueError("--fid needs --checkpoints: FID of random weights means nothing")
    return grid


def main(argv: list[str] | None = None) -> dict:
    """Print the plan and its estimate; unless --dry-run, time every cell and write JSON and Markdown."""
    args_parser = parser()
    args = args_parser.parse_args(argv)
    try:
        grid = grid_from_args(args)
        quality = quality_config(args)
    except (ValueError, FileNotFoundError) as err:
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
    rank, world = 0, 1
    if quality is not None:  # under torchrun each rank makes its share of the images on its own device
        rank, world, device = init_distributed(str(device))
    ctx = RunContext(grid, device, args.checkpoints, estimates, deadline)
    scored = {} if quality is None else run_quality(cells, ctx, quality, quality.features(device), rank, world)
    if rank != 0:
        return {}
    result = run(cells, ctx, est, partial(write_result, out=args.out, stem=stem))
    if quality is not None:
        for entry in result["pairs"]:
            entry["quality"] = scored.get(entry["pair"])
        result["fid"] = {"n": quality.n, "stats": str(quality.stats), "backend": quality.backend}
        write_result(result, args.out, stem)
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
