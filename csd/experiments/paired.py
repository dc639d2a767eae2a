"""Paired comparisons of settings made on the same labels and seeds, and the verdicts they decide: pure
functions of per-image arrays and a decision's rows (:mod:`csd.experiments.decide` measures them).

Sets made from the same seeds are correlated, so a paired difference's error is smaller than the two sets'
errors combined: the Frechet distance's by a paired bootstrap (one draw of image indices for both sets, the
reference fixed), the accuracy's by the spread of the per-image differences."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from csd.experiments.frontier import BOOTSTRAP, fd_standard_error
from csd.experiments.grid import Point
from csd.records.verdict import CLEAR, METRICS, verdict_word
from csd.shapes.metrics import frechet_distance, frechet_from_stats, gaussian_stats

SLACKS = (0.0, 0.05, 0.10)  # how much slower than CSD (ratios of target-only's time) an alternative may be
KIND = "decide"  # a result's "kind": what visualize.report makes of it


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
    row with the largest margin decides, by :func:`csd.records.verdict.verdict_word`."""
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
                "sampling": p.sampling.knob_values(),
                "csd": None if p.csd is None else p.csd.knob_values(),
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
