"""What a block of drafted steps costs: CSD's quality and time at several draft lengths, under the published
block, the context fixed alone and the exact block (:attr:`csd.config.CSDConfig.block`), on the same labels
and seeds as target-only.

Every setting makes the same ``n`` images (image i: label i, seed i), batch by batch, the settings taking
turns on each batch so that a busy machine slows them alike; its CPU time is the sum of its batches' wall
times, as a ratio to target-only's. Quality is compared image by image (:mod:`csd.experiments.paired`): each
setting against target-only, and each exact block against CSD at gamma 1 (the distribution it keeps). The
GPU time is a prediction: the cost model (:class:`csd.records.cost.PassCosts`) at the per-pass costs measured
on an H200 at paper scale (MAR-L / MAR-B, 256 px, batch 8, bfloat16: ``bench/results/gpu/paper_scale``),
applied to each setting's counted work (backbone passes, head-chain transitions), as a ratio to target-only's.

    python -m csd.experiments.blocks --threads 1 --n 200 --out bench/results/blocks/shapes.json
    python -m csd.experiments.blocks --threads 1 --n 200 --target assets/models/shapes_text_target.safetensors \\
        --draft assets/models/shapes_text_draft.safetensors --out bench/results/blocks/text.json
    python -m visualize.report bench/results/blocks/shapes.json   # blocks.md beside it

``--compare-views``: target-only, CSD at gamma 1 and the exact block at gamma 4 and 8, its views as rows of one
target pass and a pass each (``views="per_view"``), all taking turns on the same images: what the one pass costs
against a pass per view (bench/results/blocks/views/).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from csd.cli import start_up
from csd.config import CSDConfig, SamplingConfig
from csd.experiments.decide import score
from csd.experiments.evaluate import (
    add_setting_args,
    eval_labels_seeds,
    load_models,
    quality,
    recorded_models,
    settings_from_args,
)
from csd.experiments.frontier import BOOTSTRAP
from csd.experiments.grid import Point
from csd.experiments.paired import compare
from csd.models.checkpoint import file_digest
from csd.records.cost import ChainCost, PassCosts
from csd.serving.pairs import image_tokenizer
from csd.shapes.metrics import REFERENCE_SEED, load_classifier, reference_features

GAMMAS = (1, 2, 4, 8, 16)  # the published block
FIXED_GAMMAS = (2, 4, 8)  # the context fixed alone, and the exact block
VIEW_GAMMAS = (4, 8)  # the exact block's views in one pass against a pass each (--compare-views)
PAPER_SCALE = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu" / "paper_scale" / "paper_scale.json"


def _point(sampling: SamplingConfig, csd: CSDConfig, block: str, g: int, views: str = "one_pass") -> Point:
    name = f"{block}, gamma {g}" + (", a pass per view" if views == "per_view" else "")
    return Point(name, sampling, csd.with_knobs(gamma=g, gamma_schedule=(), block=block, views=views))


def block_points(sampling: SamplingConfig, csd: CSDConfig) -> list[Point]:
    """Target-only, the published block at :data:`GAMMAS`, the context fixed alone and the exact block at
    :data:`FIXED_GAMMAS` (a masked family's views as rows of one target pass)."""
    points = [Point("target-only", sampling)] + [_point(sampling, csd, "published", g) for g in GAMMAS]
    return points + [_point(sampling, csd, block, g) for block in ("context", "exact") for g in FIXED_GAMMAS]


def view_points(sampling: SamplingConfig, csd: CSDConfig) -> list[Point]:
    """Target-only, CSD at gamma 1 (the distribution the exact block keeps) and, at each of :data:`VIEW_GAMMAS`, the
    exact block with its views as rows of one target pass and with a target pass per view (``views="per_view"``):
    the same decisions, other passes."""
    at = lambda g, views: _point(sampling, csd, "exact", g, views)
    points = [Point("target-only", sampling), _point(sampling, csd, "published", 1)]
    return points + [at(g, views) for g in VIEW_GAMMAS for views in ("one_pass", "per_view")]


def gpu_costs(path: Path = PAPER_SCALE) -> tuple[PassCosts, dict]:
    """The H200's per-pass costs at paper scale (the committed MAR-L / MAR-B row at batch 8), as the cost model
    takes them: a backbone pass of each model, and each head's chain per transition (at 32 rows a chain call
    is launch-bound: its cost does not grow with its rows)."""
    record = json.loads(path.read_text())
    pair = next(p for p in record["pairs"] if p["pair"] == "MAR-L / MAR-B")
    row = next(r for r in pair["rows"] if r["batch"] == 8)
    ms, steps = row["per_step_ms"], pair["head_steps"]
    costs = PassCosts(
        ms["target_backbone"] / 1e3,
        ms["draft_backbone"] / 1e3,
        ChainCost(ms["target_head"] / 1e3 / steps),
        ChainCost(ms["draft_head"] / 1e3 / steps),
    )
    return costs, {"pair": pair["pair"], "batch": 8, "per_step_ms": ms, "head_steps": steps, "file": path.name}


def run_blocks(target, draft, points: list[Point], labels, seeds, batch: int) -> dict:
    """Each point's images, seconds and counts over the same labels and seeds, the points taking turns on every
    batch (after one untimed warm-up batch each)."""
    tokenizer = image_tokenizer(target)
    for p in points:  # warm-up
        p.runner.run(target, draft, labels[:batch], seeds[:batch], p.sampling)
    out = {
        p.name: {"images": [], "seconds": 0.0, "kept": [], "work": defaultdict(float), "passes": [0, 0]} for p in points
    }
    for i in range(0, len(seeds), batch):
        for p in points:
            t0 = time.perf_counter()
            g = p.runner.run(target, draft, labels[i : i + batch], seeds[i : i + batch], p.sampling)
            images = tokenizer.decode(g.tokens)
            run = out[p.name]
            run["seconds"] += time.perf_counter() - t0
            run["images"].append(images)
            run["kept"] += [kept for kept, _ in g.trace.block_steps]
            run["passes"][0] += g.trace.target_passes
            run["passes"][1] += g.trace.draft_passes
            for phase, counts in g.trace.work.items():
                for key, value in counts.items():
                    run["work"][phase, key] += value
            run.setdefault("accepted", []).append(g.trace.acceptance_rate)
    return out


def summarize_blocks(points, runs, labels, classifier, ref, costs: PassCosts, bootstrap: int) -> list[dict]:
    """A row per point: its quality, the paired comparisons, its CPU time and predicted GPU time as ratios to
    target-only's, its passes and the steps it kept per block."""
    scored, rows = {}, []
    work = {
        name: {phase: {"calls": 0, "steps": 0, "token_steps": 0} for phase, _ in r["work"]} for name, r in runs.items()
    }
    for name, r in runs.items():
        for (phase, key), value in r["work"].items():
            work[name][phase][key] = value
    gpu = {name: costs.predict(w) for name, w in work.items()}
    base, gamma1 = points[0].name, "published, gamma 1"
    for p in points:
        r = runs[p.name]
        images = torch.cat(r["images"])
        scored[p.name] = score(images, labels, classifier)
        metrics, _ = quality(images, labels, ref, classifier)
        row = {
            "name": p.name,
            "block": None if p.csd is None else p.csd.block.kind,
            "views": None if p.csd is None else p.csd.block.views,
            "gamma": None if p.csd is None else p.csd.gamma,
            **metrics,
            "cpu_time": r["seconds"] / runs[base]["seconds"],
            "gpu_time_predicted": gpu[p.name] / gpu[base],
            "target_passes": r["passes"][0] / len(r["images"]),
            "draft_passes": r["passes"][1] / len(r["images"]),
            "steps_kept_per_block": float(np.mean(r["kept"])) if r["kept"] else None,
            "acceptance": float(np.nanmean(r["accepted"])) if p.csd is not None else None,
        }
        if p.name != base:
            row["vs_target"] = compare(scored[p.name], scored[base], ref, bootstrap)
        if p.csd is not None and p.csd.block.kind == "exact":
            row["vs_gamma1"] = compare(scored[p.name], scored[gamma1], ref, bootstrap)
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.blocks", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    parser.add_argument("--n", type=int, default=200, help="images per setting (same labels and seeds)")
    parser.add_argument("--n-ref", type=int, default=1000, help="held-out real images for the Frechet distance")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP, help="paired bootstrap resamples")
    parser.add_argument(
        "--compare-views", action="store_true", help="only the exact block's views in one pass against a pass each"
    )
    parser.add_argument("--out", required=True, help="the result (JSON); its table: python -m visualize.report OUT")
    args = parser.parse_args(argv)
    for flag, least in (("n", 2), ("n_ref", 2), ("batch_size", 1), ("bootstrap", 2)):
        if getattr(args, flag) < least:
            parser.error(f"--{flag.replace('_', '-')} must be at least {least}")
    return args, parser


def main(argv: list[str] | None = None) -> dict:
    args, parser = parse_args(argv)
    device = start_up(args, parser)
    sampling, csd = settings_from_args(args)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    classifier = load_classifier(args.classifier)
    ref = reference_features(args.n_ref, REFERENCE_SEED, classifier)
    points = (view_points if args.compare_views else block_points)(sampling, csd)
    labels, seeds = eval_labels_seeds(args.n, 0, target.traits)
    costs, gpu_source = gpu_costs()
    t0 = time.perf_counter()
    runs = run_blocks(target, draft, points, labels, seeds, args.batch_size)
    rows = summarize_blocks(points, runs, labels, classifier, ref, costs, args.bootstrap)
    minutes = (time.perf_counter() - t0) / 60
    result = {
        "kind": "blocks",
        "what": "CSD's quality and time per draft length and block, against target-only on the same images",
        "family": target.traits.family,
        "models": recorded_models(args.target, args.draft),
        "weights": file_digest(Path(args.target), Path(args.draft)),
        "settings": {"sampling": sampling.knob_values(), "csd": csd.knob_values(), "n": args.n, "n_ref": args.n_ref},
        "batch": args.batch_size,
        "threads": torch.get_num_threads(),
        "gpu_costs": gpu_source,
        "rows": rows,
        "minutes": round(minutes, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{minutes:.1f} minutes; wrote {out}; its table: python -m visualize.report {out}")
    return result


if __name__ == "__main__":
    main()
