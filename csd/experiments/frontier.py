"""Where speculative decoding stands among the cheap alternatives: the benchmark's quality-time frontier.

Every point is a sampler setting of one pair (:mod:`csd.experiments.grid`). Its time is a ratio to
target-only at the base setting, timed side by side in the same process, interleaved after a warm-up; its
quality is scored over the same labels and seeds (class accuracy and Frechet distance over many images,
with standard errors). The Pareto front (less time, better quality) is marked per metric. A run and a
retime share one timing path (:func:`time_grid`), so a frontier timed again on a quieter machine is timed as
it was first. The app's recompute at a few images is :mod:`csd.experiments.small_frontier`.

    python -m csd.experiments.bench --frontier --quick   # about 10 minutes on a 2-core CPU
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from csd.config import SamplingConfig
from csd.decoding import Generation
from csd.dispatch import Method
from csd.experiments.evaluate import eval_labels_seeds, method_images, quality
from csd.experiments.grid import Point, points_of
from csd.experiments.timing import alternate
from csd.records.cost import BACKBONE_PHASES, CHAIN_PHASES, WORK_KEYS, PassCosts, fit_chain, fit_pass, phase_totals
from csd.records.verdict import mark_fronts, result_metrics, verdict
from csd.shapes.metrics import frechet_distance

BOOTSTRAP = 20  # resamples for the Frechet distance's standard error
TIMED_IMAGES = 8  # images per timed unit at batches up to 8 ...
LATENCY_IMAGES = 3  # ... but at batch 1, where one image at a time is slow: 3 (distinct seeds)


def timed_units(batch: int) -> int:
    """Generations of ``batch`` images in one timed unit."""
    return max(1, math.ceil((LATENCY_IMAGES if batch == 1 else TIMED_IMAGES) / batch))


def fd_standard_error(feats: np.ndarray, ref: np.ndarray, seed: int = 0) -> float:
    """Bootstrap standard error of the Frechet distance over the generated images."""
    rng = np.random.default_rng(seed)
    values = [frechet_distance(feats[rng.integers(0, len(feats), len(feats))], ref) for _ in range(BOOTSTRAP)]
    return float(np.std(values, ddof=1))


@dataclass
class Timed:
    """One setting's timings at one batch: median seconds of a unit (:func:`timed_units`) and the
    phase times and work of its last unit (summed over the unit's generations)."""

    seconds: float
    times: dict
    work: dict


def _unit_trace(outputs: list[Generation]) -> tuple[dict, dict]:
    times: dict[str, float] = {}
    work: dict[str, dict[str, int]] = {}
    for g in outputs:
        for phase, sec in g.trace.times.items():
            times[phase] = times.get(phase, 0.0) + sec
        for phase, w in g.trace.work.items():
            acc = work.setdefault(phase, dict.fromkeys(WORK_KEYS, 0))
            for k in WORK_KEYS:
                acc[k] += w.get(k, 0)
    return times, work


def time_points(target, draft, points: list[Point], batch: int, repeats: int, extra: dict | None = None) -> dict:
    """Every point (and ``extra``: name -> callable(labels, seeds)) timed side by side at ``batch``:
    a unit is :func:`timed_units` generations of distinct seeds; units are interleaved over ``repeats``
    rounds after one warm-up round (none at batch 1, where a first run costs what a second does on a
    CPU). -> name -> :class:`Timed`."""
    units = timed_units(batch)
    labels, seeds = eval_labels_seeds(batch * units, 100_000, target.traits)
    chunks = [(labels[i * batch : (i + 1) * batch], seeds[i * batch : (i + 1) * batch]) for i in range(units)]

    def runner(p: Point):
        method = p.runner
        return lambda lab, sd: method.run(target, draft, lab, sd, p.sampling)

    makers = {p.name: runner(p) for p in points} | dict(extra or {})
    runs = {name: (lambda f=f: [f(lab, sd) for lab, sd in chunks]) for name, f in makers.items()}
    samples = alternate(runs, repeats, warmup=0 if batch == 1 else 1)
    out = {}
    for name, smp in samples.items():
        times, work = _unit_trace(smp.outputs[-1])
        out[name] = Timed(smp.median, times, work)
    return out


def draft_runs(target, draft, sampling: SamplingConfig, fewest: int | None) -> dict:
    """Draft-only runs for the cost model's draft terms: at the base AR steps and, where the family's
    steps can change, at ``fewest`` (a second token count per transition); the draft's head takes the
    target's head steps, as in CSD."""
    base = replace(sampling, head_steps=target.head_steps(sampling.head_steps))
    settings = {"draft-only": base}
    if fewest is not None:
        settings[f"draft-only, {fewest} AR steps"] = replace(base, num_steps=fewest)
    only = Method.draft()
    return {name: (lambda lab, sd, s=s: only.run(target, draft, lab, sd, s)) for name, s in settings.items()}


def pass_costs(timed: dict[str, Timed], target_runs: Sequence[str], draft_runs_: Sequence[str]) -> PassCosts:
    """The cost model's per-pass costs from the target-only and draft-only runs at one batch."""

    def fitted(names, model):
        backbone = [phase_totals(timed[n].times, timed[n].work, BACKBONE_PHASES[model])[:2] for n in names]
        chain = [phase_totals(timed[n].times, timed[n].work, CHAIN_PHASES[model]) for n in names]
        return fit_pass(backbone), fit_chain([(sec, steps, tok) for sec, _, steps, tok in chain])

    c_p, h_p = fitted(target_runs, "target")
    c_q, h_q = fitted(draft_runs_, "draft")
    return PassCosts(c_p, c_q, h_p, h_q)


@dataclass
class GridTiming:
    """A grid timed at one batch (:func:`time_grid`): each setting's :class:`Timed`, the draft-only runs'
    names, and the cost model's per-pass costs fitted from them and target-only's."""

    batch: int
    repeats: int
    timed: dict[str, Timed]
    costs: PassCosts
    draft_names: list[str]
    base: float  # target-only's median seconds, the time unit

    def row_times(self, p: Point) -> dict:
        """A row's measured time, the cost model's prediction and its phases, as ratios to target-only's, and
        the work the prediction charges (per phase calls, steps, token_steps)."""
        t = self.timed[p.name]
        return {
            "time": t.seconds / self.base,
            "predicted": self.costs.predict(t.work) / self.base,
            "phases": {k: v / self.base for k, v in sorted(t.times.items())},
            "work": {k: dict(v) for k, v in sorted(t.work.items())},
        }

    def record(self) -> dict:
        """What a result says of its timing: the repeats, how it was timed, the pass costs."""
        units, b = timed_units(self.batch), self.batch
        made = f"{units * b} images" + (f" as {units} generations of {b}" if units > 1 else f" at batch {b}")
        scaled = lambda d: {k: v / self.base for k, v in d.items()}
        costs = asdict(self.costs)
        return {
            "repeats": self.repeats,
            "timing": f"median wall time of {made} over {self.repeats} interleaved repeats",
            "pass_costs": {
                "seconds_target_only": self.base,
                **scaled({k: v for k, v in costs.items() if not isinstance(v, dict)}),
                "target_chain": scaled(costs["target_chain"]),
                "draft_chain": scaled(costs["draft_chain"]),
                "draft_only": {name: self.timed[name].seconds / self.base for name in self.draft_names},
            },
        }


def time_grid(target, draft, points: list[Point], batch: int, repeats: int) -> GridTiming:
    """Every point timed side by side at ``batch`` (:func:`time_points`) with the draft-only runs, and the
    per-pass costs fitted from target-only at the base and its fewest AR steps and the draft-only runs."""
    base_sampling = points[0].sampling
    fewest = min(p.sampling.num_steps for p in points if p.csd is None)
    fewest_point = next(
        (p.name for p in points if p.csd is None and p.sampling == replace(base_sampling, num_steps=fewest)), None
    )
    if fewest == base_sampling.num_steps:
        fewest, fewest_point = None, None
    extra = draft_runs(target, draft, base_sampling, fewest)
    timed = time_points(target, draft, points, batch, repeats, extra)
    costs = pass_costs(timed, [points[0].name] + ([fewest_point] if fewest_point else []), list(extra))
    return GridTiming(batch, repeats, timed, costs, list(extra), timed[points[0].name].seconds)


def score_points(target, draft, points: list[Point], classifier, ref_feats, n: int) -> list[dict]:
    """Class accuracy and Frechet distance, with standard errors, of ``n`` images of each point on the same
    labels and seeds."""
    labels, seeds = eval_labels_seeds(n, 0, target.traits)
    scored = []
    for p in points:
        images, _ = method_images(p.runner, target, draft, labels, seeds, p.sampling, 8)
        scores, feats = quality(images, labels, ref_feats, classifier)
        acc = scores["accuracy"]
        scored.append(
            {
                "accuracy": acc,
                "accuracy_se": math.sqrt(acc * (1 - acc) / n),
                "fd": scores["fd"],
                "fd_se": fd_standard_error(feats, ref_feats),
            }
        )
    return scored


def run_frontier(
    target, draft, points: list[Point], classifier, ref_feats, n: int, batches: Sequence[int], repeats: int
) -> dict[int, dict]:
    """Time every point side by side at each of ``batches``, score ``n`` images of each once (a
    setting's images do not depend on the batch it is timed at) -> batch -> result.

    Each result's rows carry the measured time (a ratio to the baseline at that batch) and the cost
    model's prediction (``predicted``: :class:`csd.records.cost.PassCosts` from the target-only and draft-only
    runs at that batch applied to the row's own work, over the baseline's measured time)."""
    timings = {b: time_grid(target, draft, points, b, repeats) for b in batches}
    scored = score_points(target, draft, points, classifier, ref_feats, n)
    results = {}
    for b, timing in timings.items():
        rows = []
        for p, quality_ in zip(points, scored, strict=True):
            times = timing.row_times(p)
            rows.append(
                {"name": p.name, "method": p.method, "time": times["time"], "predicted": times["predicted"]}
                | quality_
                | {
                    "phases": times["phases"],
                    "work": times["work"],
                    "sampling": p.sampling.knob_values(),
                    "csd": p.csd and p.csd.knob_values(),
                }
            )
        metrics = ["fd", "accuracy"]
        mark_fronts(rows, metrics)
        results[b] = {"rows": rows, "metrics": metrics, "n": n, "batch": b} | timing.record()
        results[b]["verdict"] = verdict(rows)
    return results


def retime(target, draft, result: dict, repeats: int) -> dict:
    """A frontier timed again at its batch (a quieter machine, say), its quality kept: a setting's images
    do not depend on when it is timed. Times, predictions, phases, fronts and verdict are this run's."""
    points = points_of(result)
    timing = time_grid(target, draft, points, int(result["batch"]), repeats)
    rows = [row | timing.row_times(p) for p, row in zip(points, result["rows"], strict=True)]
    mark_fronts(rows, result_metrics(result))
    out = dict(result) | {"rows": rows} | timing.record() | {"verdict": verdict(rows)}
    out["timing"] += " (timed again alone; quality from the first run)"
    return out
