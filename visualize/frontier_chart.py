"""The quality-time frontier as a chart (a result of csd.experiments.frontier; its metrics: csd.records.verdict)."""

from __future__ import annotations

import numpy as np

from csd.records.verdict import METRICS, result_metrics
from visualize.chart import Chart, Series

# The window the chart opens on (:func:`y_window`): Tukey's fences, Q1 - k IQR to Q3 + k IQR, for the settings
# (NEAR) and for the Pareto front (FAR); the window padded by PAD of its height on each side.
NEAR, FAR, PAD = 1.5, 3.0, 0.06


def _fmt(v: float, key: str) -> str:
    return f"{v:.1f}" if key == "fd" else f"{v:.3f}"


def point_hover(row: dict, metrics: list[str]) -> str:
    """A point's setting and figures, for hovering."""
    lines = [f"<b>{row['name']}</b>", f"time {row['time']:.2f} of target-only's"]
    for m in metrics:
        lines.append(f"{METRICS[m][0]} {_fmt(row[m], m)} +- {_fmt(row[m + '_se'], m)}")
    s, c = row["sampling"], row.get("csd")
    head = "default" if s.get("head_steps") is None else s["head_steps"]
    if s.get("head_steps_min") is not None:
        head = f"{head} -> {s['head_steps_min']} ({s.get('head_schedule', 'linear')})"
    lines.append(f"AR steps {s['num_steps']}, head steps {head}, CFG {s['cfg_scale']:g}")
    if s.get("cond_cache_start") is not None:
        start, every = s["cond_cache_start"], s["cond_cache_every"]
        lines.append(f"condition cache: full CFG passes {start} first, then every {every}")
    if s.get("token_cache_keep") is not None:
        keep, start, every = s["token_cache_keep"], s["token_cache_start"], s["token_cache_every"]
        lines.append(f"token cache: {100 * keep:g}% of decoder rows, full passes {start} first, then every {every}")
    if c is not None:
        draft_head = "" if c.get("draft_head_steps") is None else f", draft head {c['draft_head_steps']}"
        lines.append(
            f"gamma {c['gamma']}, tau_v {c['tau_v']:g}, pre-fill {100 * c['prefill']:g}%, "
            f"{'aligned' if c['align'] else 'independent'} noise{draft_head}"
        )
    return "<br>".join(lines)


def _fences(values: list[float], k: float) -> tuple[float, float]:
    q1, q3 = np.percentile(values, [25, 75])
    return float(q1 - k * (q3 - q1)), float(q3 + k * (q3 - q1))


def deciding_rows(result: dict) -> list[dict]:
    """The verdict's two settings as rows: CSD's deciding setting and the alternative it was judged against
    (none when the result holds no verdict, or CSD was unrated)."""
    best = (result.get("verdict") or {}).get("best")
    if not best:
        return []
    by_name = {r["name"]: r for r in result["rows"]}
    return [by_name[n] for n in (best["name"], best["rival"]) if n in by_name]


def y_window(result: dict, key: str, overlay: dict | None = None) -> tuple[float, float] | None:
    """The y-range the chart opens on: of each result drawn, the settings within Tukey's fences (NEAR) and
    the Pareto front's within the far fences (FAR), and the verdict's two settings with their error bars,
    padded; None when it would hold every setting (the axis then fits them all)."""
    held, every = [], []
    for res in (result, overlay):
        if res is None or key not in result_metrics(res):
            continue
        values = [r[key] for r in res["rows"]]
        (lo, hi), (far_lo, far_hi) = _fences(values, NEAR), _fences(values, FAR)
        every += values
        for r, v in zip(res["rows"], values, strict=True):
            if lo <= v <= hi or (r.get(f"front_{key}") and far_lo <= v <= far_hi):
                held.append(v)
    held += [r[key] + sign * r[f"{key}_se"] for r in deciding_rows(result) for sign in (-1, 1)]
    lo, hi = min(held), max(held)
    if lo <= min(every) and max(every) <= hi:
        return None
    pad = PAD * ((hi - lo) or abs(hi) or 1.0)
    return lo - pad, hi + pad


def _off_window(rows: list[dict], key: str, window: tuple[float, float], metrics: list[str]) -> list[Series]:
    """Markers at the window's edge for the settings beyond it (triangles pointing their way), their values
    on hover (Plotly)."""
    lo, hi = window
    inset, label, out = 0.02 * (hi - lo), METRICS[key][0], []
    for side, beyond, edge in (("above", lambda v: v > hi, hi - inset), ("below", lambda v: v < lo, lo + inset)):
        off = [r for r in rows if beyond(r[key])]
        if off:
            hover = [f"off the chart: {label} {_fmt(r[key], key)}<br>" + point_hover(r, metrics) for r in off]
            out.append(
                Series(
                    f"{len(off)} off the chart {side}",
                    [r["time"] for r in off],
                    [edge] * len(off),
                    "markers",
                    color="#555555",
                    hover=hover,
                    symbol="triangle-up" if side == "above" else "triangle-down",
                    size=10,
                )
            )
    return out


def _deciding(result: dict, key: str, metrics: list[str]) -> list[Series]:
    """The verdict's two settings ringed and labelled, the upper label above its point and the lower below,
    both on the side of the chart's middle (a point near an edge keeps its label inside)."""
    rows = deciding_rows(result)
    if len(rows) != 2:
        return []
    (csd, rival), y = rows, [r[key] for r in rows]
    times = [r["time"] for r in result["rows"]]
    side = "right" if csd["time"] < (min(times) + max(times)) / 2 else "left"
    upper = y[0] >= y[1]
    return [
        Series(
            "the verdict's two settings",
            [csd["time"], rival["time"]],
            y,
            "markers",
            text=["CSD (verdict)", "rival (verdict)"],
            text_position=[f"{v} {side}" for v in (("top", "bottom") if upper else ("bottom", "top"))],
            color="#000000",
            hover=[
                f"verdict: {who}<br>" + point_hover(r, metrics) for who, r in zip(("CSD", "rival"), rows, strict=True)
            ],
            symbol="circle-open",
            size=16,
        )
    ]


def _points(name: str, rows: list[dict], key: str, metrics: list[str], color: str | None = None) -> Series:
    """Rows as markers with their standard errors, each setting on hover."""
    return Series(
        name,
        [r["time"] for r in rows],
        [r[key] for r in rows],
        kind="markers",
        color=color,
        hover=[point_hover(r, metrics) for r in rows],
        errors=[r[f"{key}_se"] for r in rows],
    )


def frontier_chart(result: dict, metric: str | None = None, overlay: dict | None = None) -> Chart:
    """``metric`` (default: the result's first) against time, one series per method with standard
    errors, the verdict's two settings ringed and labelled, the front as a line; hovering a point shows its
    setting. The y-axis opens on :func:`y_window` (the settings beyond it drawn as triangles at its edge).
    ``overlay``: a small recompute drawn over it (grey markers labelled with its n), never in place of it."""
    metrics = result_metrics(result)
    key = metric or metrics[0]
    if key not in metrics:
        raise ValueError(f"metric must be one of {metrics}, got {key!r}")
    label, higher = METRICS[key]
    rows = result["rows"]
    extra = overlay["rows"] if overlay is not None and key in result_metrics(overlay) else []
    series = [
        _points(m, [r for r in rows if r["method"] == m], key, metrics)
        for m in dict.fromkeys(r["method"] for r in rows)
    ]
    series += _deciding(result, key, metrics)
    window = y_window(result, key, overlay if extra else None)
    off = _off_window(rows + extra, key, window, metrics) if window else []
    series += off
    front = sorted((r for r in rows if r[f"front_{key}"]), key=lambda r: r["time"])
    hover = [point_hover(r, metrics) for r in front]
    series.append(
        Series(
            "Pareto front", [r["time"] for r in front], [r[key] for r in front], color="#000000", dash=True, hover=hover
        )
    )
    on = [r["name"] for r in front if r["method"] == "CSD"]
    note = f"CSD on the front: {', '.join(on)}" if on else "no CSD setting is on the front"
    if extra:
        series.append(_points(f"recomputed here, n = {overlay['n']} (wide errors)", extra, key, metrics, "#777777"))
        note += f"; grey: a recompute over {overlay['n']} images, drawn over the committed one"
    if off:
        count = sum(len(s.x) for s in off)
        note += f"; {count} off the chart, as triangles at its edge"
    direction = "higher is better" if higher else "lower is better"
    return Chart(
        f"Quality against time ({result['n']} images per point)",
        "time / target-only's",
        f"{label} ({direction})",
        series,
        note=note,
        y_range=window,
        height=600,  # its legend (a line per method on a phone) leaves the plot room
    )


def cost_chart(result: dict) -> Chart:
    """The cost model's predicted time of every setting against its measured time (both ratios to
    target-only at the result's batch), one series per method, and the diagonal where they agree."""
    rows = [r for r in result["rows"] if "predicted" in r]
    if not rows:
        raise ValueError("the result holds no predicted times (a frontier from before the cost model)")
    series = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        hover = [f"<b>{r['name']}</b><br>measured {r['time']:.2f}, predicted {r['predicted']:.2f}" for r in mine]
        series.append(Series(method, [r["time"] for r in mine], [r["predicted"] for r in mine], "markers", hover=hover))
    top = max(max(r["time"], r["predicted"]) for r in rows) * 1.05
    series.append(Series("predicted = measured", [0.0, top], [0.0, top], color="#000000", dash=True))
    csd = [r for r in rows if r["method"] == "CSD"]
    gap = max((abs(r["predicted"] - r["time"]) for r in csd), default=0.0)
    return Chart(
        f"Cost model at batch {result['batch']}: predicted against measured time",
        "measured time / target-only's",
        "predicted time / target-only's",
        series,
        note=f"per-pass costs measured in the same run; CSD's largest gap {gap:.2f} (below the line: time the "
        "model leaves out, the acceptance test, resampling and bookkeeping)",
    )
