"""A frontier result judged: the quality metrics it holds, the rows on its Pareto fronts, and the stated rule
by which CSD is *clearly ahead*, *on par* or *behind* the best alternative measured at no more than its time.
Pure functions of a result's rows (:func:`csd.experiments.frontier.run_frontier` writes them; the app, the
report and the charts read them without loading a model)."""

from __future__ import annotations

import math
from collections.abc import Sequence

METRICS = {  # key -> (label, higher is better)
    "fd": ("Frechet distance", False),
    "accuracy": ("class accuracy (shapes classifier)", True),
    "rms": ("RMS token distance to target-only", False),
}


def result_metrics(result: dict) -> list[str]:
    """The metrics a result holds, the one to plot first (results from before the key: FD and accuracy)."""
    return list(result.get("metrics", ["fd", "accuracy"]))


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


def mark_fronts(rows: list[dict], metrics: Sequence[str]) -> None:
    """Set ``front_<metric>`` on every row: on the Pareto front of time against that metric."""
    times = [r["time"] for r in rows]
    for key in metrics:
        for r, on in zip(rows, pareto(times, [r[key] for r in rows], METRICS[key][1]), strict=True):
            r[f"front_{key}"] = on


SLACK = 0.05  # an alternative counts against a CSD setting up to this much slower (time ratio)
CLEAR = 2.0  # standard errors (combined) by which "clearly" ahead or behind is meant


def margins(rows: list[dict], metric: str = "fd", slack: float = SLACK) -> list[dict]:
    """Per CSD row: its ``metric`` against the best non-CSD alternative measured at no more than its
    time + ``slack``, as a margin in combined standard errors (positive: CSD better). Rows without
    such an alternative get margin None."""
    better_high = METRICS[metric][1]
    out = []
    for r in rows:
        if r["method"] != "CSD":
            continue
        rivals = [a for a in rows if a["method"] != "CSD" and a["time"] <= r["time"] + slack]
        entry = {"name": r["name"], "time": r["time"], metric: r[metric], "rival": None, "margin": None}
        if rivals:
            sign = 1.0 if better_high else -1.0
            best = max(rivals, key=lambda a: sign * a[metric])
            se = math.hypot(r[f"{metric}_se"], best[f"{metric}_se"])
            diff = sign * (r[metric] - best[metric])
            entry |= {"rival": best["name"], "rival_time": best["time"], "rival_value": best[metric]}
            entry["margin"] = diff / se if se > 0 else (math.inf if diff > 0 else -math.inf if diff < 0 else 0.0)
        out.append(entry)
    return out


def verdict(rows: list[dict], metric: str = "fd", slack: float = SLACK, clear: float = CLEAR) -> dict:
    """The frontier's one-line answer for CSD, by the stated rule: *clearly ahead* where a CSD
    setting's ``metric`` beats every alternative at no more than its time (+ ``slack``) by more than
    ``clear`` combined standard errors; *on par* where its best margin is within +-``clear``; *behind*
    where every CSD setting is beaten by more. The CSD setting with the largest margin decides."""
    rated = [m for m in margins(rows, metric, slack) if m["margin"] is not None]
    if not rated:
        return {"verdict": "unrated", "metric": metric, "slack": slack, "clear": clear, "best": None}
    best = max(rated, key=lambda m: m["margin"])
    return {
        "verdict": verdict_word(best["margin"], clear),
        "metric": metric,
        "slack": slack,
        "clear": clear,
        "best": best,
    }


def verdict_word(margin: float, clear: float = CLEAR) -> str:
    """The rule's word for CSD's deciding margin (standard errors, positive: CSD better)."""
    return "clearly ahead" if margin > clear else "on par" if margin >= -clear else "behind"


def verdict_line(result: dict) -> str:
    """The verdict as a sentence with its margin."""
    v = result.get("verdict") or verdict(result["rows"])
    if v["best"] is None:
        return "CSD unrated: no alternative was measured at or below any CSD setting's time."
    b, name = v["best"], METRICS[v["metric"]][0]
    return (
        f"CSD is {v['verdict']} at batch {result['batch']}: its best setting, {b['name']} (time "
        f"{b['time']:.2f}, {name} {b[v['metric']]:.1f}), against the best alternative at no more than its "
        f"time + {v['slack']:g}, {b['rival']} ({b['rival_time']:.2f}, {b['rival_value']:.1f}): "
        f"{b['margin']:+.1f} combined standard errors."
    )
