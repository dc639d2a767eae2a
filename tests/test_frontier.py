"""The quality-time frontier: its grid of settings, the Pareto front, and a tiny run end to end."""

import json

import pytest

from csd.experiments.frontier import Point, frontier_markdown, grid, pareto, run_frontier
from csd.sampling import SamplingConfig
from csd.shapes.metrics import load_classifier, reference_features
from csd.speculative import CSDConfig
from tests.helpers import save_tiny_pixel_pair
from visualize.frontier import frontier_chart


def test_pareto_keeps_the_points_nothing_beats_on_both_time_and_quality():
    times, fd = [1.0, 0.5, 0.5, 0.3, 0.9], [10.0, 20.0, 15.0, 40.0, 12.0]
    assert pareto(times, fd, higher_is_better=False) == [True, False, True, True, True]
    accuracy = [0.9, 0.6, 0.7, 0.7, 0.5]
    assert pareto(times, accuracy, higher_is_better=True) == [True, False, False, True, False]  # 3 ties 2, faster
    assert pareto([1.0, 1.0], [5.0, 5.0], False) == [True, True]  # equal points do not dominate each other


def test_the_grid_starts_at_the_baseline_and_holds_every_kind_of_alternative():
    s, c = SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig()
    points = grid(s, c, 25, quick=True)
    assert points[0] == Point("target-only (32 AR steps, head 25)", s)
    names = [p.name for p in points]
    assert len(set(names)) == len(names)
    methods = {p.method for p in points}
    assert methods == {"target, fewer AR steps", "target, cheaper head", "CSD"}
    assert any(p.sampling.head_steps_min is not None for p in points)  # a head-step schedule
    assert any(p.csd is not None and p.csd.draft_head_steps is not None for p in points)  # a cheaper draft head
    assert any(p.csd is not None and p.sampling.head_steps is not None for p in points)  # CSD with cheaper heads
    assert len(grid(s, c, 25, quick=False)) > len(points)
    assert all(p.sampling.num_steps <= 8 for p in grid(replace_steps(s, 8), c, 25, quick=True))


def replace_steps(s: SamplingConfig, k: int) -> SamplingConfig:
    from dataclasses import replace

    return replace(s, num_steps=k)


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory, one_thread):
    from csd.experiments.evaluate import load_models

    target_path, draft_path = save_tiny_pixel_pair(tmp_path_factory.mktemp("pair"))
    target, draft = load_models(target_path, draft_path, "cpu")
    s, c = SamplingConfig(num_steps=6, cfg_scale=2.0), CSDConfig(gamma=2)
    points = [p for p in grid(s, c, 10, quick=True) if "tau_v 5" not in p.name][:6]
    classifier = load_classifier()
    return run_frontier(
        target, draft, points, classifier, reference_features(30, 1, classifier), n=6, batch=2, repeats=1
    )


def test_a_tiny_frontier_has_times_qualities_errors_and_fronts(tiny_result):
    rows = tiny_result["rows"]
    assert rows[0]["time"] == 1.0 and all(r["time"] > 0 for r in rows)
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and r["accuracy_se"] >= 0 and r["fd"] > 0 and r["fd_se"] >= 0
    front = pareto([r["time"] for r in rows], [r["fd"] for r in rows], False)
    assert [r["front_fd"] for r in rows] == front and any(front)
    md = frontier_markdown(tiny_result)
    assert md.count("\n|") == len(rows) + 2 and "+-" in md  # a header, a rule and a row per setting
    chart = frontier_chart(tiny_result)
    assert chart.series[-1].name == "Pareto front" and len(chart.series[-1].x) == sum(front)
    json.dumps(tiny_result)  # JSON-ready


def test_the_bench_writes_the_frontier_json_markdown_and_plot(tmp_path, restore_threads):
    from csd.experiments.bench import main

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "6", "--threads", "1", "--out", str(tmp_path / "out")]
    result = main(args)
    saved = json.loads((tmp_path / "out" / "frontier.json").read_text())
    assert [r["name"] for r in saved["rows"]] == [r["name"] for r in result["rows"]]
    assert saved["rows"][0]["name"].startswith("target-only (6 AR steps")
    assert (tmp_path / "out" / "frontier.md").read_text().startswith("# Quality-time frontier")
    assert (tmp_path / "out" / "frontier.png").stat().st_size > 1000
