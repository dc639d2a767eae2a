"""The quality-time frontier as a chart (data from csd.experiments.frontier)."""

from __future__ import annotations

from visualize.chart import Chart, Series


def frontier_chart(result: dict) -> Chart:
    """Frechet distance against time, one series per method, the front as a line."""
    rows, series = result["rows"], []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        series.append(
            Series(
                method,
                [r["time"] for r in mine],
                [r["fd"] for r in mine],
                kind="markers",
                text=[r["name"] for r in mine],
            )
        )
    front = sorted((r for r in rows if r["front_fd"]), key=lambda r: r["time"])
    series.append(
        Series("Pareto front", [r["time"] for r in front], [r["fd"] for r in front], color="#000000", dash=True)
    )
    on = [r["name"] for r in front if r["method"] == "CSD"]
    note = f"CSD on the front: {', '.join(on)}" if on else "no CSD setting is on the front"
    return Chart(
        "Quality against time", "time / target-only's", "Frechet distance (lower is better)", series, note=note
    )
