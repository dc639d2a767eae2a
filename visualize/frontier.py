"""The quality-time frontier as a chart (a result of csd.experiments.frontier; its metrics: csd.verdict)."""

from __future__ import annotations

from csd.verdict import METRICS, result_metrics
from visualize.chart import Chart, Series


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


def frontier_chart(result: dict, metric: str | None = None, overlay: dict | None = None) -> Chart:
    """``metric`` (default: the result's first) against time, one series per method with standard
    errors, the front as a line; hovering a point shows its setting. ``overlay``: a small recompute drawn
    over it (grey crosses labelled with its n), never in place of it."""
    metrics = result_metrics(result)
    key = metric or metrics[0]
    if key not in metrics:
        raise ValueError(f"metric must be one of {metrics}, got {key!r}")
    label, higher = METRICS[key]
    rows, series = result["rows"], []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        series.append(
            Series(
                method,
                [r["time"] for r in mine],
                [r[key] for r in mine],
                kind="markers",
                hover=[point_hover(r, metrics) for r in mine],
                errors=[r[f"{key}_se"] for r in mine],
            )
        )
    front = sorted((r for r in rows if r[f"front_{key}"]), key=lambda r: r["time"])
    series.append(
        Series(
            "Pareto front",
            [r["time"] for r in front],
            [r[key] for r in front],
            color="#000000",
            dash=True,
            hover=[point_hover(r, metrics) for r in front],
        )
    )
    on = [r["name"] for r in front if r["method"] == "CSD"]
    note = f"CSD on the front: {', '.join(on)}" if on else "no CSD setting is on the front"
    if overlay is not None and key in result_metrics(overlay):
        extra = overlay["rows"]
        series.append(
            Series(
                f"recomputed here, n = {overlay['n']} (wide errors)",
                [r["time"] for r in extra],
                [r[key] for r in extra],
                kind="markers",
                color="#777777",
                hover=[point_hover(r, metrics) for r in extra],
                errors=[r[f"{key}_se"] for r in extra],
            )
        )
        note += f"; grey: a recompute over {overlay['n']} images, drawn over the committed one"
    direction = "higher is better" if higher else "lower is better"
    return Chart(
        f"Quality against time ({result['n']} images per point)",
        "time / target-only's",
        f"{label} ({direction})",
        series,
        note=note,
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
