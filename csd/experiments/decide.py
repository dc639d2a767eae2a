"""Enough images to decide (issue 43): the settings that decide a frontier's verdict, measured again on the
same labels and seeds and compared image by image.

At a frontier's 100 images a Frechet distance's standard error (4 to 8) is larger than the gaps between the
settings that decide its verdict. Here CSD's best settings and the alternatives near their time are timed
side by side at batch 1 and 8 and scored over n images of the same labels and seeds (image i of every
setting has label i and seed i), and each CSD setting is compared with each alternative by paired
differences: the Frechet distance's by a paired bootstrap (one draw of image indices for both sets, the
reference fixed), the accuracy's by the spread of the per-image differences. Sets made from the same seeds
are correlated, so a paired difference's error is smaller than the two sets' errors combined.

The verdict is :mod:`csd.verdict`'s rule on these margins: per CSD setting, its smallest margin over the
alternatives at no more than its time + slack (it must beat every one of them); *clearly ahead* where the
best CSD setting's margin exceeds ``CLEAR`` paired standard errors, *behind* below ``-CLEAR``, else *on
par*, at each slack of :data:`SLACKS` (ratios of target-only's time).

    python -m csd.experiments.decide --candidates bench/results/xar/frontier_b1.json \\
        bench/results/xar/frontier_b8.json --target ... --draft ... --num-steps 16   # what to measure
    python -m csd.experiments.decide --threads 1 --out bench/results/xar/decide.json \\
        --target assets/models/shapes_xar_target.safetensors --draft assets/models/shapes_xar_draft.safetensors \\
        --num-steps 16 --points "CSD, gamma 4, tau_v 5, flow 12" "target, Euler ODE flow 6 steps, official grid"
    python -m visualize.report bench/results/xar/decide.json   # decide.md beside it
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from csd.cli import start_up
from csd.config import CSDConfig
from csd.experiments.bench import recorded_models
from csd.experiments.evaluate import (
    add_setting_args,
    class_labels,
    eval_labels_seeds,
    generate_images,
    load_models,
    settings_from_args,
)
from csd.experiments.frontier import (
    BOOTSTRAP,
    Point,
    fd_standard_error,
    pair_grid,
    points_of,
    time_points,
    timed_units,
)
from csd.models.checkpoint import file_digest
from csd.shapes.metrics import (
    REFERENCE_SEED,
    features,
    frechet_distance,
    frechet_from_stats,
    gaussian_stats,
    load_classifier,
    predict,
    reference_features,
)
from csd.verdict import CLEAR, METRICS, verdict_word

SLACKS = (0.0, 0.05, 0.10)  # how much slower than CSD (ratios of target-only's time) an alternative may be
CANDIDATE_SLACK = 0.10  # --candidates lists the alternatives up to this much slower than CSD's best
KIND = "decide"  # a result's "kind": what visualize.report makes of it


# --- the statistics: pure functions of per-image arrays --------------------------------------------


@dataclass(frozen=True)
class Scored:
    """One setting's images as the comparisons read them: classifier features (n, d) and, per image whose
    condition names a class (every image of a class pair), 1.0 where the classifier names it (m,)."""

    feats: np.ndarray
    correct: np.ndarray


def paired_mean(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """mean(a - b) over paired items (n,) and its standard error: the per-item differences' std / sqrt(n)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"need two paired vectors of the same length >= 2, got shapes {a.shape}, {b.shape}")
    d = a - b
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def paired_fd(
    feats_a: np.ndarray, feats_b: np.ndarray, ref: np.ndarray, bootstrap: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float]:
    """FD(a) - FD(b) to the reference features, and its paired bootstrap standard error: each of the
    ``bootstrap`` resamples draws one set of image indices for both (n, d) sets (image i of both made from
    the same label and seed); the reference stays fixed."""
    a, b = np.asarray(feats_a), np.asarray(feats_b)
    if a.shape != b.shape:
        raise ValueError(f"paired feature sets must have one shape, got {a.shape} and {b.shape}")
    ref_stats = gaussian_stats(ref)
    fd = lambda x: frechet_from_stats(*gaussian_stats(x), *ref_stats)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap):
        i = rng.integers(0, len(a), len(a))
        draws.append(fd(a[i]) - fd(b[i]))
    return fd(a) - fd(b), float(np.std(draws, ddof=1))


def margin(diff: float, se: float, higher_is_better: bool) -> float:
    """A difference (CSD - alternative) in standard errors, positive where CSD is better."""
    signed = diff if higher_is_better else -diff
    if se > 0:
        return signed / se
    return math.inf if signed > 0 else -math.inf if signed < 0 else 0.0


def compare(a: Scored, b: Scored, ref: np.ndarray, bootstrap: int = BOOTSTRAP) -> dict:
    """``a`` against ``b`` on the same images, per metric: difference (a - b), paired standard error and
    margin (positive: ``a`` better)."""
    out = {}
    for key, (diff, se) in (
        ("fd", paired_fd(a.feats, b.feats, ref, bootstrap)),
        ("accuracy", paired_mean(a.correct, b.correct)),
    ):
        out[key] = {"diff": diff, "se": se, "margin": margin(diff, se, METRICS[key][1])}
    return out


def judge(rows: list[dict], pairs: list[dict], batch: str, slack: float, metric: str, clear: float = CLEAR) -> dict:
    """The verdict at one batch and slack on one metric. Each CSD row is held against every alternative
    (``pairs``: CSD row, alternative, :func:`compare`) at no more than its time + ``slack`` at ``batch``;
    its margin is the smallest (it must beat each one), the rival the alternative that gives it. The CSD
    row with the largest margin decides, by :func:`csd.verdict.verdict_word`."""
    times = {r["name"]: r["time"][batch] for r in rows}
    rated = []
    for r in rows:
        if r["method"] != "CSD":
            continue
        near = [p for p in pairs if p["csd"] == r["name"] and times[p["alternative"]] <= times[r["name"]] + slack]
        if not near:
            continue
        worst = min(near, key=lambda p: p[metric]["margin"])
        rated.append(
            {
                "csd": r["name"],
                "time": times[r["name"]],
                "rival": worst["alternative"],
                "rival_time": times[worst["alternative"]],
                "alternatives": len(near),
                **worst[metric],
            }
        )
    out = {"batch": int(batch), "slack": slack, "metric": metric, "clear": clear, "settings": rated}
    if not rated:
        return out | {"verdict": "unrated", "best": None}
    best = max(rated, key=lambda m: m["margin"])
    return out | {"verdict": verdict_word(best["margin"], clear), "best": best}


def keeps_target(rows: list[dict], batch: str) -> dict:
    """The fastest row at ``batch`` whose quality stays within target-only's (``rows[0]``) standard error:
    Frechet distance at most target-only's + its SE, accuracy at least target-only's - its SE."""
    base = rows[0]
    kept = [
        r
        for r in rows
        if r["fd"] <= base["fd"] + base["fd_se"] and r["accuracy"] >= base["accuracy"] - base["accuracy_se"]
    ]
    best = min(kept, key=lambda r: r["time"][batch])  # target-only itself always qualifies
    return {
        "name": best["name"],
        "method": best["method"],
        "time": best["time"][batch],
        "speedup": 1 / best["time"][batch],
        "fd": best["fd"],
        "accuracy": best["accuracy"],
    }


def summarize(
    points: Sequence[Point],
    seconds: dict[int, dict[str, float]],
    scored: dict[str, Scored],
    ref: np.ndarray,
    bootstrap: int = BOOTSTRAP,
    slacks: Sequence[float] = SLACKS,
    clear: float = CLEAR,
) -> dict:
    """A decision's result from its measurements: ``seconds`` (batch -> setting -> median seconds of a
    timed unit) and each setting's :class:`Scored` images. ``points[0]`` is target-only, the time unit and
    the quality every row is also compared with (``vs_target``). Rows, every CSD-alternative comparison,
    the verdicts per batch, slack and metric, and per batch the fastest setting within target-only's SE."""
    base = points[0]
    if base.csd is not None:
        raise ValueError("points must start with the target-only baseline")
    rows = []
    for p in points:
        s = scored[p.name]
        n, m = len(s.feats), len(s.correct)
        acc = float(s.correct.mean())
        rows.append(
            {
                "name": p.name,
                "method": p.method,
                "time": {str(b): t[p.name] / t[base.name] for b, t in seconds.items()},
                "fd": frechet_distance(s.feats, ref),
                "fd_se": fd_standard_error(s.feats, ref),
                "accuracy": acc,
                "accuracy_se": math.sqrt(acc * (1 - acc) / m),
                "n": n,
                "n_accuracy": m,
                "vs_target": None if p is base else compare(s, scored[base.name], ref, bootstrap),
                "sampling": asdict(p.sampling),
                "csd": None if p.csd is None else asdict(p.csd),
            }
        )
    csd = [p for p in points if p.csd is not None]
    alternatives = [p for p in points if p.csd is None]
    pairs = [
        {"csd": c.name, "alternative": a.name, **compare(scored[c.name], scored[a.name], ref, bootstrap)}
        for c in csd
        for a in alternatives
    ]
    result = {"kind": KIND, "rows": rows, "pairs": pairs, "n": len(scored[base.name].feats), "bootstrap": bootstrap}
    return result | decisions(rows, pairs, slacks, clear)


def decisions(rows: list[dict], pairs: list[dict], slacks: Sequence[float] = SLACKS, clear: float = CLEAR) -> dict:
    """What the rows' times and the pairs' margins decide: the verdicts per batch, slack and metric
    (:func:`judge`) and per batch the fastest setting within target-only's SE (:func:`keeps_target`)."""
    batches = list(rows[0]["time"])
    return {
        "verdicts": [judge(rows, pairs, b, s, m, clear) for b in batches for s in slacks for m in ("fd", "accuracy")],
        "keeps_target": {b: keeps_target(rows, b) for b in batches},
        "slacks": list(slacks),
        "clear": clear,
    }


# --- the measurements --------------------------------------------------------------------------------


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
    """Time every point side by side at each batch (:func:`csd.experiments.frontier.time_points`), make
    ``n`` images of each on the same labels and seeds (those of the frontier), and :func:`summarize` ->
    (result, each setting's :class:`Scored`)."""
    t0 = time.perf_counter()
    seconds = {}
    for b in batches:
        timed = time_points(target, draft, list(points), b, repeats)
        seconds[b] = {name: t.seconds for name, t in timed.items()}
        log(f"timed at batch {b} ({(time.perf_counter() - t0) / 60:.1f} min)")
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
    seconds = {}
    for b in result["rows"][0]["time"]:
        timed = time_points(target, draft, points, int(b), repeats)
        seconds[b] = {name: t.seconds for name, t in timed.items()}
        log(f"timed at batch {b}")
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


def _timing(seconds: dict, repeats: int) -> dict[str, str]:
    return {
        str(b): f"median wall time of {timed_units(int(b)) * int(b)} images at batch {b} over {repeats} interleaved "
        "repeats"
        for b in seconds
    }


def chosen(grid: Sequence[Point], names: Sequence[str]) -> list[Point]:
    """The baseline (``grid[0]``) and the grid's points of exactly these names, in the grid's order; an
    unknown name is a ValueError naming the nearest ones."""
    by_name = {p.name: p for p in grid}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        near = {name: difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.5) for name in unknown}
        raise ValueError(f"not in the family's grid: {near} (the nearest names listed)")
    return [grid[0]] + [p for p in grid[1:] if p.name in set(names)]


def candidates(result: dict, grid_names: Sequence[str], slack: float = CANDIDATE_SLACK) -> dict:
    """What a committed frontier says to measure at its batch: CSD's best setting by its verdict, every
    alternative measured at no more than its time + ``slack``, and the grid's settings it did not measure
    (their time unknown: the few-step samplers and GtR, say)."""
    best = result["verdict"]["best"]
    measured = {r["name"] for r in result["rows"]}
    out = {"batch": result["batch"], "best": None, "alternatives": []}
    if best is not None:
        limit = best["time"] + slack
        near = [r for r in result["rows"] if r["method"] != "CSD" and r["time"] <= limit]
        out["best"] = {"name": best["name"], "time": best["time"], "margin": best["margin"]}
        out["alternatives"] = [
            {"name": r["name"], "time": r["time"], "fd": r["fd"], "accuracy": r["accuracy"]}
            for r in sorted(near, key=lambda r: r["time"])
        ]
    out["not_measured"] = [name for name in grid_names if name not in measured]
    return out


def print_candidates(found: dict) -> None:
    best = found["best"]
    print(f"batch {found['batch']}:")
    if best is None:
        print("  no CSD setting rated")
        return
    print(f"  CSD best: {best['name']!r} (time {best['time']:.2f}, margin {best['margin']:+.1f} SE)")
    print(f"  alternatives at time <= {best['time'] + CANDIDATE_SLACK:.2f}:")
    for r in found["alternatives"]:
        print(f"    {r['time']:.2f}  FD {r['fd']:6.1f}  accuracy {r['accuracy']:.2f}  {r['name']!r}")
    if found["not_measured"]:
        print("  in the grid, not in this frontier (time unknown):")
        print("\n".join(f"    {name!r}" for name in found["not_measured"]))


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.decide", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    parser.add_argument("--points", nargs="+", metavar="NAME", help="settings of the family's frontier grid, by name")
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

    device = start_up(args, parser)
    sampling, csd = settings_from_args(args)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    if args.retime:
        return retime_file(target, draft, Path(args.retime), args)
    grid = pair_grid(target, sampling, csd)
    if args.candidates:
        found = [candidates(json.loads(Path(p).read_text()), [p.name for p in grid]) for p in args.candidates]
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
        "settings": {"sampling": asdict(sampling), "csd": asdict(csd), "n_ref": args.n_ref, "batches": args.batches},
        "threads": torch.get_num_threads(),
        "minutes": round(minutes, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.features:
        arrays = {
            f"{kind}_{i}": getattr(scored[p.name], kind) for i, p in enumerate(points) for kind in ("feats", "correct")
        }
        np.savez_compressed(args.features, names=np.asarray([p.name for p in points]), ref=ref, **arrays)
    print_verdicts(result)
    print(f"{minutes:.1f} minutes; wrote {out}; its table: python -m visualize.report {out}")
    return result


if __name__ == "__main__":
    main()
