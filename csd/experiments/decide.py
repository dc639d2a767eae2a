"""Enough images to decide: the settings that decide a frontier's verdict, measured again on the
same labels and seeds and compared image by image.

At a frontier's 100 images a Frechet distance's standard error (4 to 8) is larger than the gaps between the
settings that decide its verdict. Here CSD's best settings and the alternatives near their time are timed
side by side at batch 1 and 8 and scored over n images of the same labels and seeds (image i of every
setting has label i and seed i), and each CSD setting is compared with each alternative by paired
differences: the Frechet distance's by a paired bootstrap (one draw of image indices for both sets, the
reference fixed), the accuracy's by the spread of the per-image differences. Sets made from the same seeds
are correlated, so a paired difference's error is smaller than the two sets' errors combined.

The verdict is :mod:`csd.records.verdict`'s rule on these margins: per CSD setting, its smallest margin over the
alternatives at no more than its time + slack (it must beat every one of them); *clearly ahead* where the
best CSD setting's margin exceeds ``CLEAR`` paired standard errors, *behind* below ``-CLEAR``, else *on
par*, at each slack of :data:`~csd.experiments.paired.SLACKS` (ratios of target-only's time). The statistics
are :mod:`csd.experiments.paired`'s; this module measures and runs the command.

    python -m csd.experiments.decide --candidates bench/results/xar/frontier_b1.json \\
        bench/results/xar/frontier_b8.json --target ... --draft ... --num-steps 16   # what to measure
    python -m csd.experiments.decide --threads 1 --out bench/results/xar/decide.json \\
        --target assets/models/shapes_xar_target.safetensors --draft assets/models/shapes_xar_draft.safetensors \\
        --num-steps 16 --points csd,head_steps=12,gamma=4,tau_v=5 target,head_steps=6,head_sampler=euler
    python -m visualize.report bench/results/xar/decide.json   # decide.md beside it
"""

from __future__ import annotations

import argparse
import difflib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from csd.cli import start_up
from csd.config import CSDConfig
from csd.experiments.evaluate import (
    add_setting_args,
    class_labels,
    eval_labels_seeds,
    generate_images,
    load_models,
    recorded_models,
    settings_from_args,
)
from csd.experiments.frontier import BOOTSTRAP, time_points, timed_units
from csd.experiments.grid import Point, keyed, pair_grid, points_of
from csd.experiments.paired import Scored, decisions, summarize
from csd.models.checkpoint import file_digest
from csd.shapes.metrics import (
    REFERENCE_SEED,
    features,
    load_classifier,
    predict,
    reference_features,
)

CANDIDATE_SLACK = 0.10  # --candidates lists the alternatives up to this much slower than CSD's best


def score(images: torch.Tensor, labels: Sequence, classifier) -> Scored:
    """Features and per-image class correctness of images (n, 3, H, W): against the conditioning class, or
    for prompts the class each one names (:func:`csd.experiments.evaluate.class_labels`, as ``quality``)."""
    named, classes = class_labels(labels)
    correct = predict(images[named], classifier) == np.asarray(classes)
    return Scored(features(images, classifier), correct.astype(np.float64))


def run_decide(
    target,
    draft,
    points: Sequence[Point],
    classifier,
    ref: np.ndarray,
    n: int,
    batches: Sequence[int],
    repeats: int,
    bootstrap: int = BOOTSTRAP,
    log: Callable[[str], None] = print,
) -> tuple[dict, dict[str, Scored]]:
    """Time every point side by side at each batch (:func:`time_batches`), make ``n`` images of each on the
    same labels and seeds (those of the frontier), and :func:`~csd.experiments.paired.summarize` -> (result, each
    setting's :class:`~csd.experiments.paired.Scored`)."""
    t0 = time.perf_counter()
    seconds = time_batches(target, draft, points, batches, repeats, log)
    labels, seeds = eval_labels_seeds(n, 0, target.traits)
    scored = {}
    for p in points:
        mode = "target" if p.csd is None else "csd"
        images, _ = generate_images(mode, target, draft, labels, seeds, p.sampling, p.csd or CSDConfig(), 8)
        scored[p.name] = score(images, labels, classifier)
        log(f"scored {p.name} ({(time.perf_counter() - t0) / 60:.1f} min)")
    result = summarize(points, seconds, scored, ref, bootstrap)
    result["timing"] = _timing(seconds, repeats)
    result["repeats"] = repeats
    return result, scored


def retime(target, draft, result: dict, repeats: int, log: Callable[[str], None] = print) -> dict:
    """A decision timed again at its batches (a quieter machine, more repeats), its images' comparisons
    kept: a setting's images do not depend on when it is timed. Times, verdicts and the fastest setting
    within target-only's SE are this run's."""
    points = points_of(result)
    seconds = time_batches(target, draft, points, list(result["rows"][0]["time"]), repeats, log)
    base = points[0].name
    rows = [r | {"time": {b: t[r["name"]] / t[base] for b, t in seconds.items()}} for r in result["rows"]]
    out = (
        result
        | {"rows": rows, "repeats": repeats}
        | decisions(rows, result["pairs"], result["slacks"], result["clear"])
    )
    out["timing"] = {
        b: f"{t} (timed again alone; images from the first run)" for b, t in _timing(seconds, repeats).items()
    }
    return out


def time_batches(target, draft, points: Sequence[Point], batches: Sequence, repeats: int, log) -> dict:
    """Every point timed side by side at each batch (:func:`csd.experiments.frontier.time_points`) -> batch
    (as given) -> setting -> median seconds of a timed unit."""
    t0, seconds = time.perf_counter(), {}
    for b in batches:
        timed = time_points(target, draft, list(points), int(b), repeats)
        seconds[b] = {name: t.seconds for name, t in timed.items()}
        log(f"timed at batch {b} ({(time.perf_counter() - t0) / 60:.1f} min)")
    return seconds


def _timing(seconds: dict, repeats: int) -> dict[str, str]:
    return {
        str(b): f"median wall time of {timed_units(int(b)) * int(b)} images at batch {b} over {repeats} interleaved "
        "repeats"
        for b in seconds
    }


def chosen(grid: Sequence[Point], keys: Sequence[str]) -> list[Point]:
    """The baseline (``grid[0]``) and the grid's points of these keys (:meth:`csd.experiments.grid.Point.key`),
    in the grid's order; an unknown key is a ValueError naming the nearest ones."""
    by_key = keyed(grid)
    unknown = [key for key in keys if key not in by_key]
    if unknown:
        near = {key: difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.5) for key in unknown}
        raise ValueError(f"not in the family's grid: {near} (the nearest keys listed)")
    return [grid[0]] + [p for key, p in list(by_key.items())[1:] if key in set(keys)]


def candidates(result: dict, grid: Sequence[Point], slack: float = CANDIDATE_SLACK) -> dict:
    """What a committed frontier says to measure at its batch: CSD's best setting by its verdict, every
    alternative measured at no more than its time + ``slack``, and the grid's settings it did not measure
    (their time unknown: the few-step samplers and GtR, say); each with its key, what --points takes."""
    best, base = result["verdict"]["best"], grid[0].sampling
    key_of = {row["name"]: p.key(base) for p, row in zip(points_of(result), result["rows"], strict=True)}
    out = {"batch": result["batch"], "best": None, "alternatives": []}
    if best is not None:
        limit = best["time"] + slack
        near = [r for r in result["rows"] if r["method"] != "CSD" and r["time"] <= limit]
        out["best"] = {
            "name": best["name"],
            "key": key_of[best["name"]],
            "time": best["time"],
            "margin": best["margin"],
        }
        out["alternatives"] = [
            {"name": r["name"], "key": key_of[r["name"]], "time": r["time"], "fd": r["fd"], "accuracy": r["accuracy"]}
            for r in sorted(near, key=lambda r: r["time"])
        ]
    measured = set(key_of.values())
    out["not_measured"] = [{"name": p.name, "key": key} for key, p in keyed(grid).items() if key not in measured]
    return out


def print_candidates(found: dict) -> None:
    best = found["best"]
    print(f"batch {found['batch']}:")
    if best is None:
        print("  no CSD setting rated")
        return
    print(f"  CSD best: {best['key']} ({best['name']}; time {best['time']:.2f}, margin {best['margin']:+.1f} SE)")
    print(f"  alternatives at time <= {best['time'] + CANDIDATE_SLACK:.2f}:")
    for r in found["alternatives"]:
        print(f"    {r['time']:.2f}  FD {r['fd']:6.1f}  accuracy {r['accuracy']:.2f}  {r['key']} ({r['name']})")
    if found["not_measured"]:
        print("  in the grid, not in this frontier (time unknown):")
        print("\n".join(f"    {p['key']} ({p['name']})" for p in found["not_measured"]))


def retime_file(target, draft, path: Path, args) -> dict:
    """--retime: the decision in ``path`` timed again with --repeats, written back to ``path``."""
    result = json.loads(path.read_text())
    if result.get("weights") != file_digest(Path(args.target), Path(args.draft)):
        raise SystemExit(f"--retime {path}: measured on other weights than --target / --draft")
    t0 = time.perf_counter()
    out = retime(target, draft, result, args.repeats)
    out["retime_minutes"] = round((time.perf_counter() - t0) / 60, 1)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print_verdicts(out)
    print(f"{out['retime_minutes']:.1f} minutes; wrote {path}; its table: python -m visualize.report {path}")
    return out


def print_verdicts(result: dict) -> None:
    for v in result["verdicts"]:
        if v["best"] is not None:
            b = v["best"]
            print(
                f"batch {v['batch']}, slack {v['slack']:g}, {v['metric']}: {v['verdict']} "
                f"({b['margin']:+.1f} paired SE, {b['csd']} vs {b['rival']})"
            )


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.decide", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    parser.add_argument(
        "--points",
        nargs="+",
        metavar="KEY",
        help="settings of the family's frontier grid, by key (csd.experiments.grid.Point.key; --candidates lists them)",
    )
    parser.add_argument(
        "--candidates",
        nargs="+",
        metavar="FRONTIER_JSON",
        help="instead: print each committed frontier's CSD best, the alternatives within its time + 0.10 and "
        "the grid's settings it did not measure",
    )
    parser.add_argument("--n", type=int, default=200, help="images per setting (same labels and seeds)")
    parser.add_argument("--n-ref", type=int, default=1000, help="held-out real images for the Frechet distance")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP, help="paired bootstrap resamples")
    parser.add_argument(
        "--retime",
        metavar="DECIDE_JSON",
        help="instead: time a decision's settings again at its batches (its comparisons kept) and rewrite it",
    )
    parser.add_argument("--out", help="the result (JSON); its table: python -m visualize.report OUT")
    parser.add_argument("--features", help="also write each setting's features and correctness here (.npz)")
    args = parser.parse_args(argv)
    if not (args.candidates or args.retime or (args.points and args.out)):
        parser.error("give --points and --out (or --candidates, or --retime)")
    for flag, least in (("n", 2), ("n_ref", 2), ("repeats", 1), ("bootstrap", 2)):
        if getattr(args, flag) < least:
            parser.error(f"--{flag.replace('_', '-')} must be at least {least}")
    return args, parser


def write_decision(result: dict, scored: dict, points: list[Point], ref: np.ndarray, args) -> Path:
    """The decision to --out and, with --features, each setting's features and correctness."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.features:
        arrays = {
            f"{kind}_{i}": getattr(scored[p.name], kind) for i, p in enumerate(points) for kind in ("feats", "correct")
        }
        np.savez_compressed(args.features, names=np.asarray([p.name for p in points]), ref=ref, **arrays)
    return out


def main(argv: list[str] | None = None) -> dict:
    args, parser = parse_args(argv)
    device = start_up(args, parser)
    sampling, csd = settings_from_args(args)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    if args.retime:
        return retime_file(target, draft, Path(args.retime), args)
    grid = pair_grid(target, sampling, csd)
    if args.candidates:
        found = [candidates(json.loads(Path(p).read_text()), grid) for p in args.candidates]
        for f in found:
            print_candidates(f)
        return {"candidates": found}
    try:
        points = chosen(grid, args.points)
    except ValueError as err:
        parser.error(str(err))
    classifier = load_classifier(args.classifier)
    ref = reference_features(args.n_ref, REFERENCE_SEED, classifier)
    t0 = time.perf_counter()
    result, scored = run_decide(
        target, draft, points, classifier, ref, args.n, args.batches, args.repeats, args.bootstrap
    )
    minutes = (time.perf_counter() - t0) / 60
    result |= {
        "family": target.traits.family,
        "models": recorded_models(args.target, args.draft),
        "weights": file_digest(Path(args.target), Path(args.draft)),
        "settings": {
            "sampling": sampling.knob_values(),
            "csd": csd.knob_values(),
            "n_ref": args.n_ref,
            "batches": args.batches,
        },
        "threads": torch.get_num_threads(),
        "minutes": round(minutes, 1),
    }
    out = write_decision(result, scored, points, ref, args)
    print_verdicts(result)
    print(f"{minutes:.1f} minutes; wrote {out}; its table: python -m visualize.report {out}")
    return result


if __name__ == "__main__":
    main()
