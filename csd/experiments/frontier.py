"""Where speculative decoding stands among the cheap alternatives: a quality-time frontier.

Every point is a sampler setting of one pair: target-only with fewer AR steps, fewer head steps or
a head-step schedule, CSD at several draft lengths, tests and head steps, and their combinations.
Each point's time is a ratio to target-only at the default setting, timed side by side in the same
process (interleaved after a warm-up); its quality is class accuracy and Frechet distance over the
same labels and seeds, with standard errors. The Pareto front (less time, better quality) is marked.

    python -m csd.experiments.bench --frontier --quick   # about 10 minutes on a 2-core CPU
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from csd.experiments.bench import alternate
from csd.experiments.evaluate import eval_labels_seeds, generate_images, quality
from csd.sampling import SamplingConfig, generate
from csd.shapes.metrics import frechet_distance
from csd.speculative import CSDConfig, speculative_generate

BOOTSTRAP = 20  # resamples for the Frechet distance's standard error


@dataclass(frozen=True)
class Point:
    """One sampler setting; ``csd`` None is target-only."""

    name: str
    sampling: SamplingConfig
    csd: CSDConfig | None = None

    @property
    def method(self) -> str:
        if self.csd is None:
            cheap = self.sampling.head_steps is not None or self.sampling.head_steps_min is not None
            return "target, cheaper head" if cheap else "target, fewer AR steps"
        return "CSD"


def grid(sampling: SamplingConfig, csd: CSDConfig, head_steps: int, quick: bool) -> list[Point]:
    """The settings of the frontier, the baseline (target-only at ``sampling``) first."""
    s, c, t = sampling, csd, head_steps
    few = {"head_steps": max(1, t // 2)}
    points = [Point(f"target-only ({s.num_steps} AR steps, head {t})", s)]
    ar_steps = [k for k in ((16, 8) if quick else (24, 16, 11, 8)) if k < s.num_steps]
    points += [Point(f"target, {k} AR steps", replace(s, num_steps=k)) for k in ar_steps]
    points += [
        Point(f"target, head {few['head_steps']} steps", replace(s, **few)),
        Point(f"target, head {t} -> {max(1, t // 5)} steps", replace(s, head_steps=t, head_steps_min=max(1, t // 5))),
    ]
    if ar_steps:
        k = ar_steps[0]
        points.append(Point(f"target, {k} AR steps, head {few['head_steps']}", replace(s, num_steps=k, **few)))
    gammas = (4, 8) if quick else (2, 4, 8, 16)
    for g in gammas:
        for tau in (c.tau_v, 5.0):
            points.append(Point(f"CSD, gamma {g}, tau_v {tau:g}", s, replace(c, gamma=g, tau_v=tau)))
    points += [
        Point(f"CSD, gamma 4, tau_v 5, head {few['head_steps']}", replace(s, **few), replace(c, gamma=4, tau_v=5.0)),
        Point(f"CSD, gamma {c.gamma}, pre-fill 25%", s, replace(c, prefill=0.25)),
        Point(
            f"CSD, gamma {c.gamma}, draft head {few['head_steps']} (independent noise)",
            s,
            replace(c, draft_head_steps=few["head_steps"], align=False, trajectory_term="none"),
        ),
    ]
    if not quick:
        points += [
            Point(f"CSD, gamma {g}, head {few['head_steps']}", replace(s, **few), replace(c, gamma=g)) for g in (4, 8)
        ]
    return points


def pareto(times: list[float], quality: list[float], higher_is_better: bool) -> list[bool]:
    """True for the points no other point beats on both: at most the time and at least the quality,
    better in one of them."""
    q = [v if higher_is_better else -v for v in quality]
    front = []
    for i in range(len(times)):
        dominated = any(
            times[j] <= times[i] and q[j] >= q[i] and (times[j] < times[i] or q[j] > q[i]) for j in range(len(times))
        )
        front.append(not dominated)
    return front


def fd_standard_error(feats: np.ndarray, ref: np.ndarray, seed: int = 0) -> float:
    """Bootstrap standard error of the Frechet distance over the generated images."""
    rng = np.random.default_rng(seed)
    values = [frechet_distance(feats[rng.integers(0, len(feats), len(feats))], ref) for _ in range(BOOTSTRAP)]
    return float(np.std(values, ddof=1))


def run_frontier(target, draft, points: list[Point], classifier, ref_feats, n: int, batch: int, repeats: int) -> dict:
    """Time every point side by side at ``batch`` images, then score ``n`` images of each."""
    labels, seeds = eval_labels_seeds(batch, 100_000, target.num_classes)

    def runner(p: Point):
        if p.csd is None:
            return lambda: generate(target, labels, seeds, p.sampling)
        return lambda: speculative_generate(target, draft, labels, seeds, p.sampling, p.csd)

    timed = alternate({p.name: runner(p) for p in points}, repeats)
    base = timed[points[0].name].median
    eval_labels, eval_seeds = eval_labels_seeds(n, 0, target.num_classes)
    rows = []
    for p in points:
        mode = "target" if p.csd is None else "csd"
        images, _ = generate_images(mode, target, draft, eval_labels, eval_seeds, p.sampling, p.csd or CSDConfig(), 8)
        scores, feats = quality(images, eval_labels, ref_feats, classifier)
        acc = scores["accuracy"]
        rows.append(
            {
                "name": p.name,
                "method": p.method,
                "time": timed[p.name].median / base,
                "accuracy": acc,
                "accuracy_se": math.sqrt(acc * (1 - acc) / n),
                "fd": scores["fd"],
                "fd_se": fd_standard_error(feats, ref_feats),
                "sampling": asdict(p.sampling),
                "csd": None if p.csd is None else asdict(p.csd),
            }
        )
    times = [r["time"] for r in rows]
    for key, higher in (("fd", False), ("accuracy", True)):
        for r, on in zip(rows, pareto(times, [r[key] for r in rows], higher), strict=True):
            r[f"front_{key}"] = on
    return {"rows": rows, "n": n, "batch": batch, "repeats": repeats}


def frontier_markdown(result: dict) -> str:
    lines = [
        f"Time: median wall time at batch {result['batch']} over {result['repeats']} interleaved repeats, as a "
        f"ratio to the first row. Quality over {result['n']} images (same labels and seeds), +- one standard "
        "error. Front: no other setting is at most as slow and at least as good (FD / accuracy).",
        "",
        "| setting | time | class accuracy | Frechet distance | front (FD) | front (accuracy) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(result["rows"], key=lambda r: r["time"]):
        lines.append(
            f"| {r['name']} | {r['time']:.2f} | {r['accuracy']:.3f} +- {r['accuracy_se']:.3f} | "
            f"{r['fd']:.1f} +- {r['fd_se']:.1f} | {'yes' if r['front_fd'] else ''} | "
            f"{'yes' if r['front_accuracy'] else ''} |"
        )
    return "\n".join(lines) + "\n"
