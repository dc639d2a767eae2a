"""A frontier run in parts and put together: :func:`part` deals a grid's settings to processes run at once
(one per core), :func:`merge_parts` makes one frontier of their results, and :func:`kept_rows` keeps an
earlier frontier's rows for a grid that grew. Rows are matched by their settings' keys
(:meth:`csd.experiments.grid.Point.key`), never by their display names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from csd.config import SamplingConfig
from csd.experiments.grid import Point, keyed, points_of
from csd.records.verdict import mark_fronts, verdict


def part(points: list[Point], k: int, n: int) -> list[Point]:
    """Part ``k`` (1..``n``) of a grid, for ``n`` processes run at once (one per core): every part holds
    the baseline and the target's fewest-AR-step point (the cost model's fit), the rest is dealt in turn,
    so each part gets its share of the costly settings. :func:`merge_parts` puts the results together."""
    if not (isinstance(n, int) and n >= 1 and isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"frontier part: k must be in 1..n and n >= 1, got {k}/{n}")
    target_steps = [p.sampling.num_steps for p in points if p.csd is None]
    fewest = replace(points[0].sampling, num_steps=min(target_steps))
    shared = [0] + [i for i, p in enumerate(points) if p.csd is None and p.sampling == fewest and i > 0][:1]
    rest = [i for i in range(len(points)) if i not in shared]
    return [points[i] for i in sorted(shared + rest[k - 1 :: n])]


def rows_by_key(result: dict, base: SamplingConfig) -> dict[str, dict]:
    """A result's rows by their settings' keys over ``base`` (the grid's baseline sampling)."""
    return {p.key(base): row for p, row in zip(points_of(result), result["rows"], strict=True)}


def merge_parts(results: list[dict], grid: Sequence[Point]) -> dict:
    """One frontier from the parts (:func:`part`) of ``grid`` timed at the same batch: the rows in the grid's
    order (a setting in several parts kept from the first), the fronts and verdict recomputed. Each row's
    time is a ratio to its own part's baseline, timed side by side in that part; the pass costs are the
    first part's, each part's kept under ``parts``."""
    if not results or len({r["batch"] for r in results}) != 1 or len({r["n"] for r in results}) != 1:
        raise ValueError("merge_parts: results of one batch and one n, at least one")
    order, base = keyed(grid), grid[0].sampling
    rows: dict[str, dict] = {}
    for result in results:
        for key, row in rows_by_key(result, base).items():
            rows.setdefault(key, dict(row))
    missing = [order[key].name for key in order if key not in rows]
    extra = [row["name"] for key, row in rows.items() if key not in order]
    if missing or extra:
        raise ValueError(f"merge_parts: rows missing {missing[:3]}, rows not in the grid {extra[:3]}")
    merged = dict(results[0])
    merged["rows"] = [rows[key] for key in order]
    mark_fronts(merged["rows"], merged["metrics"])
    merged["verdict"] = verdict(merged["rows"])
    merged["parts"] = [
        {
            "rows": [r["name"] for r in result["rows"]],
            "pass_costs": result["pass_costs"],
            "minutes": result.get("minutes"),
        }
        for result in results
    ]
    return merged


def kept_rows(earlier: dict, parts: list[dict], rtol: float = 1e-3) -> dict:
    """The rows of an ``earlier`` frontier (same weights and batch) as one more part for :func:`merge_parts`,
    for a grid that grew: only the new settings are run (``--frontier-only``), the rest is kept. A row's
    quality does not depend on when it was measured, so the settings measured in both must agree on FD
    and accuracy (relative ``rtol``); otherwise the images changed since (code, seeds) and the whole grid
    must run again. Times from different runs do not mix: retime the merged frontier alone."""
    base = points_of(earlier)[0].sampling
    fresh = {key: row for result in parts for key, row in rows_by_key(result, base).items()}
    old = rows_by_key(earlier, base)
    shared = [key for key in old if key in fresh]
    if not shared:
        raise ValueError("kept rows: no setting measured in both the earlier frontier and the parts to check it by")
    for key in shared:
        row, now = old[key], fresh[key]
        for metric in ("fd", "accuracy"):
            if abs(row[metric] - now[metric]) > rtol * max(1.0, abs(now[metric])):
                raise ValueError(
                    f"kept rows: {row['name']!r} {metric} {row[metric]:.4f} earlier, {now[metric]:.4f} now: "
                    "the images changed since; run the whole grid"
                )
    return earlier | {"rows": [row for key, row in old.items() if key not in fresh]}
