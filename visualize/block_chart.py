"""What a block of drafted steps costs, as a picture: a pair's Frechet distance against its time, for the
published block, the context fixed alone and the exact block at each draft length (the records of
:mod:`csd.experiments.blocks`, ``bench/results/blocks/<pair>.json``), target-only and gamma 1 marked."""

from __future__ import annotations

from visualize.chart import Chart, Series

BLOCKS = {  # block -> (legend name, colour): Okabe-Ito, as every chart here
    "published": ("published block", "#0072B2"),
    "context": ("context fixed alone", "#E69F00"),
    "exact": ("exact block", "#009E73"),
}


def _rows(record: dict, block: str | None) -> list[dict]:
    return sorted((r for r in record["rows"] if r["block"] == block), key=lambda r: r["gamma"] or 0)


def block_chart(record: dict, label: str) -> Chart:
    """One pair's chart: x the CPU time per image against target-only's (measured side by side), y the Frechet
    distance to real images (lower is better). Each block's points are labelled with their draft length;
    the context and exact blocks start from gamma 1, where all three are one setting."""
    base = _rows(record, None)[0]
    published = _rows(record, "published")
    first = next(r for r in published if r["gamma"] == 1)
    series = []
    for block, (name, color) in BLOCKS.items():
        rows = published if block == "published" else [first, *_rows(record, block)]
        hover = [
            f"{name}, gamma {r['gamma']}: FD {r['fd']:.1f}, CPU time {r['cpu_time']:.2f}x, "
            f"target passes {r['target_passes']:.0f}, steps kept per block {r['steps_kept_per_block']:.2f}"
            for r in rows
        ]
        text = [f"γ{r['gamma']}" for r in rows]
        x, y = [r["cpu_time"] for r in rows], [r["fd"] for r in rows]
        series.append(Series(name, x, y, text=text, color=color, hover=hover, text_position="top right"))
    series.append(
        Series(
            "target-only",
            [1.0],
            [base["fd"]],
            kind="markers",
            symbol="circle-open",
            size=13,
            color="#000000",
            hover=[f"target-only: FD {base['fd']:.1f}"],
        )
    )
    series.append(
        Series(
            "gamma 1",
            [first["cpu_time"]],
            [first["fd"]],
            kind="markers",
            symbol="triangle-up",
            size=13,
            color="#D55E00",
            hover=[f"gamma 1: FD {first['fd']:.1f}"],
        )
    )
    exact = _rows(record, "exact")
    longest = exact[-1] if exact else None
    note = ""
    if longest is not None:
        per_block = longest["target_passes"] / base["target_passes"]
        note = (
            f"Exact block at gamma {longest['gamma']}: FD {longest['fd']:.1f} (gamma 1: {first['fd']:.1f}), "
            f"{per_block:.2f}x target-only's target passes, {longest['cpu_time']:.2f}x its CPU time."
        )
    return Chart(
        title=f"What a block costs: {label}",
        x_label="CPU time per image (target-only = 1)",
        y_label="Frechet distance (log; lower is better)",
        series=series,
        note=note,
        height=380,
        y_log=True,
    )
