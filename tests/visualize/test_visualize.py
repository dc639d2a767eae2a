"""Figure builders: panel data and traces in, charts and images out (no model runs here)."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from csd.records.panel_data import (
    DistancePanel,
    Histogram,
    LogRatioPanel,
    Panels,
    PrefillPanel,
    ResamplerPanel,
    Spread,
    Sweep,
    TimePanel,
)
from csd.trace import Maker
from visualize.chart import Chart, Series
from visualize.export import export_pngs
from visualize.images import MAKER_STYLE, display_grid, legend_html, tile, token_map, upscale, upscale_factor
from visualize.panels import analysis_charts, time_breakdown
from visualize.render import to_matplotlib, to_plotly
from visualize.toy import toy_chart


def _spread(n: int) -> Spread:
    v = [None, *np.linspace(0.2, 0.8, n - 1).tolist()]  # None: no drafted token at step 0
    return Spread(
        list(range(n)), v, v, [None if x is None else x - 0.1 for x in v], [None if x is None else x + 0.1 for x in v]
    )


def _sweep(knob: str, values: list[float]) -> Sweep:
    k = len(values)
    return Sweep(knob, values, [0.5] * k, [0.6] * k, [1.2] * (k - 1) + [None], [0] * k, [1.0] * k)


@pytest.fixture
def panels() -> Panels:
    hist = Histogram([0.0, 1.0, 2.0], {"aligned": [3, 1], "independent": [1, 3]})
    return Panels(
        pair="synthetic",
        weights="random:0",
        n_images=2,
        settings={},
        distance=DistancePanel(
            {"aligned": _spread(4), "independent": _spread(4)},
            hist,
            {"aligned": 0.6, "independent": 1.1},
            {"aligned": 0.4, "independent": 0.2},
        ),
        prefill=PrefillPanel({"0%": _spread(4), "5%": _spread(4)}, {"0%": 0.3, "5%": None}),
        resampler=ResamplerPanel(Histogram([0.5, 1.5, 2.5], {"tokens": [5, 1]}), 1.2, 0, 6, 100),
        sweeps={
            "gamma": _sweep("gamma", [1.0, 2.0, 4.0]),
            "cfg_scale": _sweep("cfg_scale", [1.0, 3.0]),
            "temperature": _sweep("temperature", [1.0]),
        },
        log_ratio=LogRatioPanel(
            Histogram([-10.0, 0.0, 10.0], {"trajectory": [2, 2], "final": [1, 3], "log r": [3, 1]}),
            {"trajectory": -1.0, "final": 0.5, "log r": -0.5},
            {"trajectory": 4.0, "final": 1.0, "log r": 4.1},
            0.75,
        ),
        time=TimePanel(
            {
                "target-only": {"target_backbone": 2.0, "target_head": 1.0},
                "CSD": {"draft_backbone": 0.5, "verify": 0.1},
            },
            {"target-only": 3.0, "CSD": 2.0},
            1.5,
            1.6,
            None,
            {"C_p": 0.1, "H_p": 0.05, "C_q": 0.02, "H_q": 0.03},
            4,
        ),
    )


def test_every_analysis_panel_renders_in_plotly_and_matplotlib(panels):
    charts = analysis_charts(panels)
    assert len(charts) == 10
    for chart in charts.values():
        assert isinstance(to_plotly(chart), go.Figure)
        assert to_matplotlib(chart).axes


def test_missing_values_become_gaps_not_errors(panels):
    fig = to_plotly(analysis_charts(panels)["acceptance_per_step"])
    assert any(trace.y is not None and trace.y[0] is None for trace in fig.data)


def test_notes_carry_the_numbers_to_take_away(panels):
    charts = analysis_charts(panels)
    assert "0.40" in charts["distance_overall"].note and "0.20" in charts["distance_overall"].note
    assert "1.50x" in charts["time"].note and "n/a" in charts["time"].note  # bound unknown here
    assert "75%" in charts["log_ratio_split"].note


def test_band_is_drawn_under_its_line():
    chart = Chart("t", "x", "y", [Series("s", [0, 1], [1.0, 2.0], band=([0.5, 1.5], [1.5, 2.5]))])
    fig = to_plotly(chart)
    assert [t.fill for t in fig.data] == [None, "tonexty", None] and fig.data[-1].name == "s"


def test_time_breakdown_stacks_phases_per_method():
    chart = time_breakdown({"a": {"target_backbone": 1.0}, "b": {"draft_head": 2.0, "target_backbone": 0.5}}, "t")
    assert chart.barmode == "stack"
    by_name = {s.name: s.y for s in chart.series}
    assert by_name == {"draft (backbone and head)": [0.0, 2.0], "target backbone": [1.0, 0.5]}
    grouped = time_breakdown(
        {"a": {"prefill_backbone": 1.0, "target_backbone": 2.0, "verify": 0.5, "resample": 1}}, "t"
    )
    assert {s.name: s.y for s in grouped.series} == {"target backbone": [3.0], "accept or resample": [1.5]}
    to_matplotlib(chart)  # stacked categorical bars
    with_wall = time_breakdown({"a": {"target_backbone": 1.0}}, "t", wall={"a": 1.25})
    assert with_wall.series[-1].name == "other" and with_wall.series[-1].y == [0.25]


def test_export_writes_one_png_per_chart(panels, tmp_path):
    paths = export_pngs(panels, tmp_path)
    assert len(paths) == 10 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_upscale_is_nearest_neighbour_and_reaches_the_display_size():
    img = np.arange(12, dtype=np.uint8).reshape(1, 2, 2, 3)
    assert upscale_factor(32) == 8
    big = upscale(img, 3)
    assert big.shape == (1, 6, 6, 3) and (big[0, :3, :3] == img[0, 0, 0]).all()


def test_tile_lays_out_a_square_ish_grid():
    grid = tile(np.zeros((5, 4, 4, 3), dtype=np.uint8), pad=1)
    assert grid.shape == (2 * 4 + 1, 3 * 4 + 2, 3)  # 3 columns, 2 rows
    assert display_grid(np.zeros((1, 32, 32, 3), dtype=np.uint8)).shape == (256, 256, 3)


def test_token_map_paints_each_cell_in_exactly_its_legend_colour_and_numbers_the_images():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)  # the image does not tint the map
    maker = np.full((2, 64), int(Maker.ACCEPTED), dtype=np.int8)
    maker[0, 9] = Maker.PREFILL
    maker[1, 63] = Maker.RESAMPLED
    out = token_map(images, maker)
    cell = 32  # 4 px tokens upscaled 8x
    inside = lambda r, c, image=0: out[r * cell + cell // 2, image * (256 + 4) + c * cell + cell // 2]
    assert tuple(inside(1, 1)) == MAKER_STYLE[Maker.PREFILL][1]
    assert tuple(inside(0, 5)) == MAKER_STYLE[Maker.ACCEPTED][1]
    assert tuple(inside(7, 7, image=1)) == MAKER_STYLE[Maker.RESAMPLED][1]
    legend = {rgb for _, rgb in MAKER_STYLE.values()} | {(40, 40, 40), (255, 255, 255), (235, 235, 235)}
    body = out.copy()
    body[:16, :24] = body[:16, 260 : 260 + 24] = 255  # the number boxes (anti-aliased text)
    assert {tuple(p) for p in body.reshape(-1, 3)} <= legend  # no blended colours outside the legend
    corner = out[2:12, 3:9]  # image 0's number
    assert (corner == 0).any() and (corner == 255).any()


def test_legend_names_every_maker():
    html = legend_html()
    assert all(label in html for label, _ in MAKER_STYLE.values())


def test_toy_chart_shades_the_residual_and_normalises_the_histogram():
    samples = np.random.default_rng(0).normal(0.0, 1.0, 20_000)
    chart = toy_chart((0.0, 1.0), (1.0, 1.5), samples)
    kinds = {s.name: s for s in chart.series}
    residual = kinds["max(0, p - q): what resampling adds"]
    assert residual.kind == "area" and min(residual.y) >= 0.0
    hist = kinds["speculative samples"]
    assert sum(hist.y) * hist.width == pytest.approx(1.0, abs=1e-3)  # a density


def test_moving_average_is_a_trailing_mean():
    from visualize.training_curves import moving_average

    assert moving_average([1, 2, 3, 4], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([5, 1], 10).tolist() == [5.0, 3.0]
    with pytest.raises(ValueError, match="window"):
        moving_average([1.0], 0)


def test_training_curves_read_logs_and_render(tmp_path):
    from visualize.training_curves import loss_curves, lr_curves, main, read_log

    records = [{"step": 100 * (i + 1), "loss": 1.0 / (i + 1), "lr": 1e-3, "elapsed": i} for i in range(12)]
    log = tmp_path / "m.log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))
    assert [r["step"] for r in read_log(log)] == [r["step"] for r in records]
    chart = loss_curves({"m": read_log(log)}, window_steps=200, skip_steps=500)
    assert chart.series[0].x == [600, 700, 800, 900, 1000, 1100, 1200]
    assert chart.series[0].y[0] == pytest.approx(1 / 6)  # smoothing starts after the skipped records
    assert chart.series[0].y[-1] == pytest.approx((1 / 11 + 1 / 12) / 2) and "m 0.0871 at 1200" in chart.note
    assert "masked tokens" in chart.title and loss_curves({"m": records}, loss="flow matching").title.endswith(
        "(flow matching)"
    )
    to_matplotlib(lr_curves({"m": records}))
    main([str(log), "--out", str(tmp_path / "curves.png")])
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "curves_lr.png").stat().st_size > 0
    bad = tmp_path / "bad.log.jsonl"
    bad.write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="bad.log.jsonl"):
        read_log(bad)


def test_a_run_started_from_another_is_drawn_after_its_parent(tmp_path):
    from visualize.training_curves import chain_logs, main

    parent = [{"step": s, "loss": 1.0, "lr": 1e-3, "elapsed": s / 10} for s in (50, 100)]
    child = [{"step": s, "loss": 0.5, "lr": 5e-4, "elapsed": s / 20} for s in (25, 50)]
    chained = chain_logs([parent, child])
    assert [r["step"] for r in chained] == [50, 100, 125, 150]
    assert [r["elapsed"] for r in chained] == [5.0, 10.0, 11.25, 12.5]
    assert [r["loss"] for r in chained] == [1.0, 1.0, 0.5, 0.5]
    for name, records in (("a", parent), ("b", child)):
        (tmp_path / f"{name}.log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = f"{tmp_path / 'a.log.jsonl'}+{tmp_path / 'b.log.jsonl'}"
    main([spec, "--out", str(tmp_path / "c.png"), "--window-steps", "50"])
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_small_recompute_is_drawn_over_the_committed_frontier_never_in_its_place():
    import copy
    from pathlib import Path

    from visualize.frontier_chart import frontier_chart

    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / "bench" / "results" / "frontier_b1.json").read_text())
    small = copy.deepcopy(committed) | {"n": 2}
    small["rows"] = [r | {"accuracy": 1.0, "accuracy_se": 0.0} for r in small["rows"][:3]]
    alone, both = frontier_chart(committed, "accuracy"), frontier_chart(committed, "accuracy", overlay=small)
    assert [s.name for s in both.series[:-1]] == [s.name for s in alone.series]
    points = [s.y for s in both.series[:-1] if "off the chart" not in s.name]  # the edge markers follow the axis
    assert points == [s.y for s in alone.series if "off the chart" not in s.name]  # the committed points unchanged
    assert both.series[-1].name.startswith("recomputed here, n = 2") and both.series[-1].y == [1.0] * 3
    assert both.title == alone.title and f"({committed['n']} images per point)" in both.title


def test_the_cost_chart_puts_every_row_at_its_measured_and_predicted_time():
    from visualize.frontier_chart import cost_chart

    rows = [
        {"name": "target-only", "method": "target, fewer AR steps", "time": 1.0, "predicted": 0.95},
        {"name": "CSD, gamma 8", "method": "CSD", "time": 0.5, "predicted": 0.3},
    ]
    chart = cost_chart({"rows": rows, "batch": 1})
    points = {s.name: (s.x, s.y) for s in chart.series}
    assert points["CSD"] == ([0.5], [0.3]) and points["target, fewer AR steps"] == ([1.0], [0.95])
    assert chart.series[-1].dash and "largest gap 0.20" in chart.note and "batch 1" in chart.title
    with pytest.raises(ValueError, match="no predicted times"):
        cost_chart({"rows": [{k: v for k, v in rows[0].items() if k != "predicted"}], "batch": 8})


def _frontier(values: dict[str, float], front: set[str], best: str, rival: str) -> dict:
    """A frontier result of FD values by name (standard error 1, time growing with the order given), with the
    verdict's deciding setting ``best`` (a CSD one) against ``rival``."""
    rows = [
        {
            "name": name,
            "method": "CSD" if name == best else "target",
            "time": 0.1 + 0.05 * k,
            "fd": fd,
            "fd_se": 1.0,
            "front_fd": name in front,
            "sampling": {"num_steps": 16, "cfg_scale": 3.0},
        }
        for k, (name, fd) in enumerate(values.items())
    ]
    deciding = {"name": best, "rival": rival, "time": 0.0, "fd": values[best], "margin": -1.0}
    return {"rows": rows, "n": 100, "batch": 1, "metrics": ["fd"], "verdict": {"metric": "fd", "best": deciding}}


def test_the_frontier_chart_opens_on_the_bulk_and_the_verdicts_settings_with_outliers_at_its_edge():
    from visualize.frontier_chart import frontier_chart

    values = {f"s{k}": 20.0 + k for k in range(12)} | {"DiSA 12 -> 1": 700.0, "xAR 3 steps": 1100.0}
    result = _frontier(values, front={"s0", "s1", "s5"}, best="s5", rival="s2")
    chart = frontier_chart(result)
    # Q1 23.25, Q3 29.75: every setting within the fences (13.5 to 39.5) is held, 20 to 31, padded by 6%.
    assert chart.y_range == pytest.approx((20.0 - 0.66, 31.0 + 0.66))
    assert tuple(to_plotly(chart).layout.yaxis.range) == pytest.approx(chart.y_range)
    (off,) = [s for s in chart.series if "off the chart" in s.name]
    assert off.name.startswith("2 off the chart above") and off.symbol == "triangle-up"
    assert off.x == pytest.approx([0.7, 0.75]) and all(
        chart.y_range[1] - 0.5 < y < chart.y_range[1] for y in off.y
    )  # at the edge
    assert "Frechet distance 700.0" in off.hover[0] and "1100.0" in off.hover[1]  # its value, on hover
    assert "2 off the chart, as triangles at its edge" in chart.note
    (verdict,) = [s for s in chart.series if s.name == "the verdict's two settings"]
    assert verdict.text == ["CSD (verdict)", "rival (verdict)"] and (verdict.x, verdict.y) == (
        [0.35, 0.2],
        [25.0, 22.0],
    )
    assert verdict.text_position == ["top right", "bottom right"]  # the upper label above, both inside the chart
    assert [s.name for s in chart.series][-1] == "Pareto front"


def test_the_verdicts_settings_stay_in_view_even_beyond_the_fences():
    from visualize.frontier_chart import frontier_chart

    values = {f"s{k}": 20.0 + k for k in range(12)} | {"far CSD": 60.0, "DiSA": 900.0}
    lo, hi = frontier_chart(_frontier(values, front={"s0"}, best="far CSD", rival="s3")).y_range
    assert lo < 20.0 and 61.0 < hi < 100.0  # 60 + its standard error is in; 900 is not


def test_a_frontier_without_outliers_keeps_an_axis_that_fits_every_setting():
    from visualize.frontier_chart import frontier_chart

    chart = frontier_chart(_frontier({f"s{k}": 20.0 + k for k in range(12)}, {"s0"}, "s4", "s1"))
    assert chart.y_range is None and not any("off the chart" in s.name for s in chart.series)


@pytest.mark.parametrize("path", ["frontier_b1.json", "text/frontier_b1.json", "xar/frontier_b8.json"])
def test_the_committed_frontiers_open_below_their_outliers_with_front_and_verdict_in_view(path):
    from pathlib import Path

    from visualize.frontier_chart import FAR, _fences, deciding_rows, frontier_chart

    result = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / path).read_text())
    chart = frontier_chart(result)
    lo, hi = chart.y_range
    rows = result["rows"]
    assert max(r["fd"] for r in rows) > 700 and hi < 100  # FD 700-1175 outliers do not set the axis
    assert sum(lo <= r["fd"] <= hi for r in rows) >= 0.8 * len(rows)  # the bulk of the settings is in view
    # and the whole front but its far outliers (beyond Tukey's far fences: at batch 8 the fastest setting, the
    # official sampler at 3 flow steps on xAR's uniform grid, FD 1256, is on the front; it is drawn at the edge)
    far_lo, far_hi = _fences([r["fd"] for r in rows], FAR)
    assert all(lo <= r["fd"] <= hi for r in rows if r["front_fd"] and far_lo <= r["fd"] <= far_hi)
    assert all(lo <= r["fd"] - r["fd_se"] and r["fd"] + r["fd_se"] <= hi for r in deciding_rows(result))
    off = [x for s in chart.series if "off the chart" in s.name for x in s.x]
    assert sorted(off) == sorted(r["time"] for r in rows if not lo <= r["fd"] <= hi)  # every other one at the edge
