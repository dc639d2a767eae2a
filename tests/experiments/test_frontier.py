"""The quality-time frontier: its grid of settings, the Pareto front, and a tiny run end to end."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.frontier import run_frontier
from csd.experiments.grid import Point, grid
from csd.experiments.small_frontier import SmallFrontier, image_scores
from csd.records.cost import ChainCost, PassCosts
from csd.records.verdict import METRICS, pareto
from csd.shapes.metrics import load_classifier, reference_features
from tests.helpers import save_tiny_pixel_pair
from visualize.frontier_chart import frontier_chart
from visualize.tables import frontier_markdown


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
    assert methods == {"target, fewer AR steps", "target, cheaper head", "target, DiSA", "CSD"}
    (disa,) = [p for p in points if p.method == "target, DiSA"]  # DiSA's 100 -> 50 -> 5, in proportion
    assert (
        disa.sampling.head_steps,
        disa.sampling.knob_values()["head_steps_min"],
        disa.sampling.knob_values()["head_schedule"],
    ) == (12, 1, "disa")
    full = grid(s, c, 25, quick=False)
    assert any(
        p.csd is not None and p.sampling.knob_values()["head_schedule"] == "disa" for p in full
    )  # combined with CSD
    assert not any(
        p.sampling.knob_values()["cond_cache_start"] is not None for p in full
    )  # the family takes no condition cache
    lazy = [
        p
        for p in grid(s, c, 25, quick=False, caches_guidance=True)
        if p.sampling.knob_values()["cond_cache_start"] is not None
    ]
    assert [
        (p.method, p.sampling.knob_values()["cond_cache_start"], p.sampling.knob_values()["cond_cache_every"])
        for p in lazy
    ] == [
        ("target, LazyMAR condition cache", 2, 4),  # LazyMAR's 5 and 9 of 64 steps, at 32
        ("CSD", 2, 4),
    ]
    assert any(p.sampling.knob_values()["head_steps_min"] is not None for p in points)  # a head-step schedule
    assert any(p.csd is not None and p.csd.draft_head_steps is not None for p in points)  # a cheaper draft head
    assert any(p.csd is not None and p.sampling.head_steps is not None for p in points)  # CSD with cheaper heads
    assert len(full) > len(points)
    assert all(p.sampling.num_steps <= 8 for p in grid(replace_steps(s, 8), c, 25, quick=True))


def test_the_full_grid_is_dense_in_the_target_steps_around_csd():
    s, c = SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig()
    full = grid(s, c, 25, quick=False)
    names = [p.name for p in full]
    assert len(set(names)) == len(names)
    fewer = sorted(p.sampling.num_steps for p in full[1:] if p.method == "target, fewer AR steps")
    assert fewer == list(range(8, 25))  # every AR-step count from a quarter to three quarters of 32
    combos = [p for p in full if p.csd is None and p.sampling.num_steps < 32 and p.sampling.head_steps is not None]
    assert {p.sampling.num_steps for p in combos} == {12, 16, 20}  # fewer AR steps with a cheaper head
    assert {p.csd.gamma for p in full if p.csd is not None} == {4, 8, 16}
    xar = grid(replace_steps(s, 16), c, 25, quick=False, fixed_steps=True)
    flows = sorted(
        p.sampling.head_steps for p in xar[1:] if p.csd is None and p.sampling.knob_values()["head_steps_min"] is None
    )
    assert flows == list(range(6, 17)) and all(p.sampling.num_steps == 16 for p in xar)  # every flow count


def replace_steps(s: SamplingConfig, k: int) -> SamplingConfig:
    from dataclasses import replace

    return replace(s, num_steps=k)


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory, one_thread):
    from csd.experiments.evaluate import load_models

    target_path, draft_path = save_tiny_pixel_pair(tmp_path_factory.mktemp("pair"))
    target, draft = load_models(target_path, draft_path, "cpu")
    s, c = SamplingConfig(num_steps=6, cfg_scale=2.0), CSDConfig(gamma=2)
    points = [p for p in grid(s, c, 10, quick=True) if "tau_v 5" not in p.name][:6]
    points.insert(1, Point("target, 3 AR steps", replace_steps(s, 3)))  # fewer AR steps: a second token count
    classifier = load_classifier()
    refs = reference_features(30, 1, classifier)
    return run_frontier(target, draft, points, classifier, refs, n=6, batches=(1, 2), repeats=1)


@pytest.fixture(scope="module")
def tiny_result(tiny_results):
    return tiny_results[2]


def test_a_tiny_frontier_has_times_qualities_errors_and_fronts(tiny_result):
    rows = tiny_result["rows"]
    assert rows[0]["time"] == 1.0 and all(r["time"] > 0 for r in rows)
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and r["accuracy_se"] >= 0 and r["fd"] > 0 and r["fd_se"] >= 0
    front = pareto([r["time"] for r in rows], [r["fd"] for r in rows], False)
    assert [r["front_fd"] for r in rows] == front and any(front)
    md = frontier_markdown(tiny_result)
    assert md.count("\n|") == len(rows) + 2 and "+-" in md  # a header, a rule and a row per setting
    assert "predicted" in md and "CSD is" in md  # the cost model's column and the verdict line
    chart = frontier_chart(tiny_result)
    assert chart.series[-1].name == "Pareto front" and len(chart.series[-1].x) == sum(front)
    json.dumps(tiny_result)  # JSON-ready


def test_each_batch_is_timed_apart_and_the_images_scored_once(tiny_results):
    one, two = tiny_results[1], tiny_results[2]
    assert (one["batch"], two["batch"]) == (1, 2)
    assert "3 images as 3 generations of 1" in one["timing"] and "8 images as 4 generations of 2" in two["timing"]
    for a, b in zip(one["rows"], two["rows"], strict=True):
        assert a["name"] == b["name"] and (a["fd"], a["accuracy"]) == (b["fd"], b["accuracy"])
    assert [r["time"] for r in one["rows"]] != [r["time"] for r in two["rows"]]  # measured twice, not copied


def test_the_cost_model_predicts_every_row_from_the_per_pass_costs_of_the_same_run(tiny_results):
    for result in tiny_results.values():
        costs = result["pass_costs"]
        assert costs["target_pass"] > 0 and costs["draft_pass"] > 0 and costs["target_chain"]["per_transition"] > 0
        assert set(costs["draft_only"]) == {"draft-only", "draft-only, 3 AR steps"}  # the draft at two token counts
        rows = result["rows"]
        assert all(r["predicted"] > 0 for r in rows)
        # each prediction is the recorded pass costs (in target-only's time unit) charged to the row's own work:
        # arithmetic, exact on any machine; how close it comes to the measured time is noise, not checked here
        scaled = PassCosts(
            costs["target_pass"],
            costs["draft_pass"],
            ChainCost(**costs["target_chain"]),
            ChainCost(**costs["draft_chain"]),
        )
        for r in rows:
            assert r["predicted"] == pytest.approx(scaled.predict(r["work"]), rel=1e-12)
        base, fewer = rows[0], next(r for r in rows if r["name"] == "target, 3 AR steps")
        assert base["work"]["target_head"]["steps"] == 2 * fewer["work"]["target_head"]["steps"]  # 6 AR steps, 3
        assert fewer["predicted"] < base["predicted"]  # fewer passes, fewer chain calls


def test_the_bench_writes_a_frontier_per_batch_and_the_report_its_plots(tmp_path, restore_threads):
    from csd.experiments.bench import main
    from visualize.report import main as report

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "1", "2", "--num-steps", "6", "--threads", "1"]
    results = main(args + ["--out", str(tmp_path / "out")])
    assert sorted(results) == [1, 2]
    for b in (1, 2):
        saved = json.loads((tmp_path / "out" / f"frontier_b{b}.json").read_text())
        assert [r["name"] for r in saved["rows"]] == [r["name"] for r in results[b]["rows"]]
        assert saved["rows"][0]["name"].startswith("target-only (6 AR steps") and saved["batch"] == b
        assert saved["minutes"] >= 0 and saved["settings"]["batches"] == [1, 2]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["frontier_b1.json", "frontier_b2.json"]  # measurements write JSON only: no tables, no figures
    report([str(tmp_path / "out" / "frontier_b1.json")])
    assert (tmp_path / "out" / "frontier_b1.md").read_text().startswith("# Quality-time frontier, batch 1")
    assert (tmp_path / "out" / "frontier_b1.png").stat().st_size > 1000
    assert (tmp_path / "out" / "frontier_b1_cost.png").stat().st_size > 1000


def test_the_bench_frontier_records_the_weights_the_app_matches(tmp_path, restore_threads):
    from csd.experiments.bench import main
    from csd.models.checkpoint import file_digest

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "4", "--threads", "1", "--out", str(tmp_path / "out")]
    result = main(args)[2]
    assert result["weights"] == file_digest(Path(target), Path(draft)) and result["metrics"] == ["fd", "accuracy"]


def test_the_parts_of_a_grid_cover_it_once_each_with_the_baseline_and_the_fewest_steps_in_every_part():
    from csd.experiments.parts import part

    points = grid(SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig(gamma=8), 25, quick=False)
    fewest = next(p.name for p in points if p.name == "target, 8 AR steps")
    parts = [part(points, k, 3) for k in (1, 2, 3)]
    for q in parts:
        assert q[0] is points[0] and fewest in [p.name for p in q]
        assert [points.index(p) for p in q] == sorted(points.index(p) for p in q)  # the grid's order
    names = [p.name for q in parts for p in q[1:] if p.name != fewest]
    assert sorted(names + [fewest]) == sorted(p.name for p in points[1:])  # each other point in one part
    assert max(len(q) for q in parts) - min(len(q) for q in parts) <= 1
    assert [p.name for p in part(points, 1, 1)] == [p.name for p in points]
    for k, n in ((0, 2), (3, 2), (1, 0)):
        with pytest.raises(ValueError, match="1..n"):
            part(points, k, n)


def test_a_frontier_run_in_parts_merges_into_the_grids_rows_with_fronts_and_verdict_recomputed(
    tmp_path, restore_threads
):
    from csd.experiments.bench import main
    from csd.records.verdict import verdict

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "6", "--threads", "1", "--out", str(tmp_path)]
    parts = [main(args + ["--frontier-part", f"{k}/2"])[2] for k in (1, 2)]
    assert sorted(p.name for p in tmp_path.glob("frontier_part*")) == [
        "frontier_part1of2_b2.json",
        "frontier_part2of2_b2.json",
    ]
    with pytest.raises(SystemExit, match="other weights"):
        main(args[1:] + ["--merge-parts", "2", "--target", draft, "--draft", target])
    merged = main(args[1:] + ["--merge-parts", "2"])[2]
    saved = json.loads((tmp_path / "frontier_b2.json").read_text())
    assert [r["name"] for r in saved["rows"]] == [r["name"] for r in merged["rows"]]
    assert len(saved["rows"]) == len({r["name"] for p in parts for r in p["rows"]}) > len(parts[0]["rows"])
    by_name = {r["name"]: r for r in parts[1]["rows"]} | {r["name"]: r for r in parts[0]["rows"]}
    for r in saved["rows"]:
        assert r["time"] == by_name[r["name"]]["time"] and r["fd"] == by_name[r["name"]]["fd"]
    assert saved["verdict"] == verdict(saved["rows"]) and len(saved["parts"]) == 2
    assert saved["minutes"] == max(p["minutes"] for p in parts)
    assert saved["rows"][0]["name"].startswith("target-only (6 AR steps")
    with pytest.raises(SystemExit, match="missing"):
        main(args[1:] + ["--merge-parts", "3"])


def test_a_half_run_as_two_quarters_merges_into_the_same_frontier_as_the_half(tmp_path, restore_threads):
    from csd.experiments.bench import main

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "6", "--threads", "1", "--out", str(tmp_path)]
    for spec in ("1/2", "2/2", "2/4", "4/4"):
        main(args + ["--frontier-part", spec])
    halves = main(args[1:] + ["--merge-parts", "2"])[2]
    quarters = main(args[1:] + ["--merge-parts", "1/2", "2/4", "4/4"])[2]
    assert [(r["name"], r["fd"]) for r in quarters["rows"]] == [(r["name"], r["fd"]) for r in halves["rows"]]
    assert len(quarters["parts"]) == 3 and all(p["minutes"] is not None for p in quarters["parts"])
    with pytest.raises(SystemExit, match="rows missing"):
        main(args[1:] + ["--merge-parts", "1/2", "2/4"])  # a quarter of the grid not merged
    for bad in (["0"], ["1/2", "1/2"], ["3/2"]):
        with pytest.raises(SystemExit):
            main(args[1:] + ["--merge-parts", *bad])


def test_a_grown_grid_runs_only_its_new_settings_and_keeps_the_earlier_rows_once_their_images_agree(
    tmp_path, restore_threads
):
    from csd.experiments.bench import main

    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "6", "--threads", "1"]
    earlier = main(args + ["--out", str(tmp_path / "earlier")])[2]
    new = ["--frontier-only", "csd", "--out", str(tmp_path / "new")]  # every CSD setting
    parts = [main(args + new + ["--frontier-part", f"{k}/2"])[2] for k in (1, 2)]
    merged = main(args[1:] + new + ["--merge-parts", "2", "--keep-rows", str(tmp_path / "earlier")])[2]
    assert [r["name"] for r in merged["rows"]] == [r["name"] for r in earlier["rows"]]  # the whole grid's order
    fresh = {r["name"]: r for p in parts for r in p["rows"]}
    old = {r["name"]: r for r in earlier["rows"]}
    assert {n for n in fresh if n.startswith("CSD")} == {n for n in old if n.startswith("CSD")}
    for r in merged["rows"]:
        source = fresh.get(r["name"], old[r["name"]])  # a new setting's row from the parts, else the earlier one
        assert r["time"] == source["time"] and r["fd"] == source["fd"]
    assert merged["kept_rows"]["rows"] == len(earlier["rows"]) - len(fresh) > 0
    saved = json.loads((tmp_path / "new" / "frontier_b2.json").read_text())
    assert [(r["name"], r["fd"]) for r in saved["rows"]] == [(r["name"], r["fd"]) for r in merged["rows"]]

    earlier["rows"][0]["fd"] *= 1.01  # the baseline's images changed since
    (tmp_path / "earlier" / "frontier_b2.json").write_text(json.dumps(earlier))
    with pytest.raises(SystemExit, match="images changed since"):
        main(args[1:] + new + ["--merge-parts", "2", "--keep-rows", str(tmp_path / "earlier")])
    with pytest.raises(SystemExit):
        main(["--frontier", "--keep-rows", str(tmp_path / "earlier")])  # only with --merge-parts


@pytest.mark.parametrize("bad", ["2", "0/2", "3/2", "a/b"])
def test_a_bad_frontier_part_names_the_flag(bad, capsys):
    from csd.experiments.bench import main

    with pytest.raises(SystemExit):
        main(["--frontier", "--frontier-part", bad])
    assert "--frontier-part" in capsys.readouterr().err


# --- the app's recompute at a few images ----------------------------------------------------------


SMALL = SamplingConfig(num_steps=4, cfg_scale=2.0)


@pytest.fixture(scope="module")
def small(one_thread, random_models):
    points = grid(SMALL, CSDConfig(gamma=2), 10, quick=True)
    f = SmallFrontier(random_models, points, 3, seed=5, label=2)
    labels = [run.label for run in f.steps()]
    assert len(labels) == len(f) == len(points) + 1 and labels[-1].endswith("timed again")
    return f, f.result()


def test_a_small_frontier_scores_every_setting_on_the_same_seeds(small):
    f, result = small
    assert f.seeds == [5, 6, 7] and f.labels == [2, 3, 4]
    assert result["metrics"] == ["accuracy"]  # the untrained pair is a shapes pixel pair: the classifier applies
    rows = result["rows"]
    assert [r["name"] for r in rows] == [p.name for p in f.points]
    assert rows[0]["time"] == 1.0 and all(r["time"] > 0 for r in rows)
    for r in rows:
        assert r["accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0) and r["accuracy_se"] >= 0
    assert [r["front_accuracy"] for r in rows] == pareto(
        [r["time"] for r in rows], [r["accuracy"] for r in rows], higher_is_better=True
    )
    assert result["weights"] == f.pair.weights and 0 <= result["drift"] and "differ by" in result["timing"]
    # CSD rows of the published block made fewer target passes than the baseline: the time axis is not all noise
    # (the exact block, which commits a block through its first rejection, may make more)
    published = [r for r in rows if r["method"] == "CSD" and "exact block" not in r["name"]]
    assert published and all(r["target_passes"] < rows[0]["target_passes"] for r in published)
    json.dumps(result)


def test_the_small_frontier_scores_are_those_of_a_plain_run_with_the_same_seeds(small, random_models):
    from csd.experiments.analysis import run_csd

    f, result = small
    i = next(i for i, p in enumerate(f.points) if p.csd is not None)
    _, score = image_scores(random_models, f.labels, f._runs[0].generation)
    again = run_csd(random_models, f.labels, f.seeds, f.points[i].sampling, f.points[i].csd).generation
    assert float(score(again).mean()) == result["rows"][i]["accuracy"]


def test_a_small_frontier_wants_its_runs_and_a_baseline_first(random_models):
    points = grid(SMALL, CSDConfig(gamma=2), 10, quick=True)
    with pytest.raises(RuntimeError, match="run every step"):
        SmallFrontier(random_models, points, 1).result()
    with pytest.raises(ValueError, match="baseline"):
        SmallFrontier(random_models, points[::-1], 1)
    with pytest.raises(ValueError, match="number of images"):
        SmallFrontier(random_models, points, 0)


def test_scores_fall_back_to_distance_to_the_target_run_without_a_classifier(random_models):
    from dataclasses import replace

    from csd.experiments.analysis import run_single

    other = replace(random_models, class_names=tuple(f"c{i}" for i in range(10)))
    reference = run_single(random_models, [0, 1], [0, 1], SamplingConfig(num_steps=4)).generation
    key, score = image_scores(other, [0, 1], reference)
    assert key == "rms" and METRICS[key][1] is False
    assert score(reference).tolist() == [0.0, 0.0]
    shifted = replace(reference, tokens=reference.tokens + 0.5)
    assert np.allclose(score(shifted), 0.5)


def test_the_chart_and_table_follow_the_result_metric(small):
    _, result = small
    chart = frontier_chart(result)
    assert "class accuracy" in chart.y_label and "higher is better" in chart.y_label
    csd_series = next(s for s in chart.series if s.name == "CSD")
    assert all("gamma" in h and "AR steps" in h for h in csd_series.hover)  # the setting, on hover
    assert csd_series.errors is not None
    md = frontier_markdown(result)
    assert "front (accuracy)" in md and "Frechet" not in md
    with pytest.raises(ValueError, match="metric must be one of"):
        frontier_chart(result, "fd")


def test_the_frontier_runs_on_a_text_pair(tmp_path, restore_threads):
    from csd.experiments.bench import main
    from tests.helpers import save_tiny_text_pair

    target, draft = save_tiny_text_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "6", "--threads", "1", "--out", str(tmp_path / "out")]
    result = main(args)[2]
    assert result["rows"][0]["name"].startswith("target-only (6 AR steps") and any(
        r["front_fd"] for r in result["rows"]
    )


def test_the_frontier_runs_on_an_xar_pair_with_fewer_flow_steps_in_place_of_ar_steps(tmp_path, restore_threads):
    from csd.experiments.bench import main
    from tests.helpers import save_tiny_xar_pair

    s = SamplingConfig(num_steps=16, cfg_scale=3.0, cfg_schedule="linear")
    points = grid(s, CSDConfig(), 25, quick=True, fixed_steps=True)
    assert all(p.sampling.num_steps == 16 for p in points) and points[0].name.endswith("flow 25)")
    assert [p.sampling.head_steps for p in points if p.method == "target, cheaper head"] == [12, 6, 25]

    target, draft = save_tiny_xar_pair(tmp_path)
    args = ["--frontier", "--quick", "--target", target, "--draft", draft, "--n", "2", "--n-ref", "20"]
    args += ["--repeats", "1", "--batches", "2", "--num-steps", "16", "--cfg-schedule", "linear", "--head-steps", "4"]
    result = main(args + ["--threads", "1", "--out", str(tmp_path / "out")])[2]
    names = [r["name"] for r in result["rows"]]
    assert (
        len(set(names)) == len(names)
        and "target, flow 2 steps" in names
        and not any("AR steps" in n for n in names if not n.startswith("target-only"))
    )


@pytest.mark.parametrize("criterion", ["aligned", "exact"])
@pytest.mark.parametrize("fixed", [False, True])
def test_the_grid_never_holds_a_setting_the_decoder_refuses(criterion, fixed):
    """Around any controls (here the exact criterion too), a draft head of other length is always unaligned,
    with the aligned criterion and the final-step term only: the decoder's rule for chains of unequal length."""
    from csd.experiments.grid import grid

    s = SamplingConfig(num_steps=16 if fixed else 32, cfg_scale=3.0, head_steps=25)
    for point in grid(s, CSDConfig.from_knobs(criterion=criterion, align=True), 25, quick=True, fixed_steps=fixed):
        c = point.csd
        if c is not None and c.draft_head_steps not in (None, 25):
            assert not c.needs_equal_chains(), point.name


def test_the_full_grid_holds_lazymars_token_cache_where_the_family_takes_it():
    from csd.experiments.grid import select

    s, c = SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig()
    assert not any(p.sampling.knob_values()["token_cache_keep"] for p in grid(s, c, 25, quick=False))
    full = grid(s, c, 25, quick=False, caches_guidance=True, caches_tokens=True)
    cached = [p for p in full if p.sampling.knob_values()["token_cache_keep"] is not None]
    assert [
        (p.method, p.sampling.knob_values()["token_cache_start"], p.sampling.knob_values()["token_cache_every"])
        for p in cached
    ] == [
        ("target, LazyMAR token cache", 2, 4),
        ("target, LazyMAR token cache", 2, 4),  # with the condition cache as well
        ("CSD", 2, 4),
    ]
    assert cached[1].sampling.cond_cache.start == 2 and cached[0].sampling.token_cache.keep == 0.25
    some = select(full, ["cond_cache_start", "token_cache_keep"])  # the points that change either knob
    assert some[0] == full[0] and all("LazyMAR" in p.name for p in some[1:]) and len(some) == 6
    assert select(full, None) == full


def test_a_grids_points_are_selected_by_their_keys_not_their_names():
    from csd.experiments.grid import select

    s, c = SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig()
    full = grid(s, c, 25, quick=False)
    keys = [p.key(s) for p in full]
    assert keys[0] == "target" and len(set(keys)) == len(keys)  # the baseline, then each setting once
    assert full[keys.index("target,num_steps=16")].name == "target, 16 AR steps"
    assert full[keys.index("csd,head_steps=12,gamma=4,tau_v=5")].name == "CSD, gamma 4, tau_v 5, head 12"
    fast = select(full, ["gamma=4,tau_v=5"])  # every point holding both parts
    assert len(fast) > 3 and all(p.csd.gamma == 4 and p.csd.criterion.tau_v == 5.0 for p in fast[1:])
    assert select(full, ["=csd"]) == [full[0], full[keys.index("csd")]]  # a whole key: that point alone
    assert [p.name for p in select(full, ["=csd"])][1] == "CSD, gamma 8, tau_v 42"
    assert select(full, ["CSD, gamma 8, tau_v 42"]) == [full[0]]  # a display name selects nothing


def test_the_grid_holds_the_targets_few_step_samplers_gtr_and_disas_floor_by_name():
    """Issue 43's alternatives, named on every frontier the bench runs (the app's recompute passes no
    samplers and keeps its grid)."""
    s, c = SamplingConfig(num_steps=32, cfg_scale=3.0), CSDConfig()
    full = grid(s, c, 25, quick=False, head_samplers=("ddpm", "ddim"), takes_gtr=True)
    ddim = [p for p in full if p.method == "target, DDIM"]
    assert sorted({p.sampling.head_steps for p in ddim}) == [5, 8, 10, 12, 15]
    assert {p.sampling.knob_values()["ddim_eta"] for p in ddim} == {0.0, 0.5}
    (floor,) = [p for p in full if p.csd is None and "DiSA floor" in p.name]
    assert (
        floor.sampling.head_steps,
        floor.sampling.knob_values()["head_steps_min"],
        floor.sampling.knob_values()["head_schedule"],
    ) == (12, 5, "disa")
    gtr = {p.name: p.sampling for p in full if p.method == "target, GtR"}
    assert gtr["target, GtR 12/3/1 AR steps"].gtr.stages == (12, 3, 1)  # GtR's 24 : 6 : 2 over half the steps
    fts = gtr["target, GtR 12/3/1, head 12 -> 5, reconstruction 5, FTS 10% x 12"]
    assert (
        fts.num_steps,
        fts.knob_values()["gtr_head_steps"],
        fts.knob_values()["gtr_detail_fraction"],
        fts.knob_values()["gtr_detail_steps"],
    ) == (16, 5, 0.1, 12)
    on_csd = [
        p
        for p in full
        if p.csd is not None and (p.sampling.knob_values()["head_sampler"] or p.sampling.knob_values()["gtr_stages"])
    ]
    assert {p.sampling.knob_values()["ddim_eta"] for p in on_csd if p.sampling.knob_values()["head_sampler"]} == {
        0.5
    }  # never DDIM at eta 0
    assert all(p.sampling.knob_values()["gtr_detail_fraction"] == 0 for p in on_csd)  # FTS does not compose
    xar = grid(
        replace_steps(s, 16), c, 25, quick=False, fixed_steps=True, head_samplers=("euler-maruyama", "euler", "heun")
    )
    for method, sampler in (("target, Euler ODE", "euler"), ("target, Heun ODE", "heun")):
        mine = [p.sampling for p in xar if p.method == method]
        assert {(p.head_steps, p.knob_values()["flow_grid"]) for p in mine} == {
            (k, g) for k in range(3, 13) for g in ("official", "uniform")
        }
        assert {p.knob_values()["head_sampler"] for p in mine} == {sampler}
    uniform = sorted(p.sampling.head_steps for p in xar if p.method == "target, uniform grid")
    assert uniform == list(range(3, 13))
    assert not any(p.csd is not None and p.sampling.knob_values()["head_sampler"] in ("euler", "heun") for p in xar)


@pytest.mark.parametrize("family", ["mar", "xar", "text"])
def test_every_new_point_is_a_setting_its_family_takes_and_csd_accepts(family):
    from csd.run_setup import check_settings
    from csd.serving.pairs import random_pair

    pair = random_pair(family=None if family == "mar" else {"xar": "xar", "text": "harmon"}[family])
    traits, t = pair.target.traits, pair.target.head_steps(None)
    s = SamplingConfig(num_steps=traits.fixed_num_steps or 32, cfg_scale=3.0)
    fixed = traits.fixed_num_steps is not None
    for quick in (True, False):
        for p in grid(s, CSDConfig(), t, quick, fixed, head_samplers=traits.head_samplers, takes_gtr=traits.takes_gtr):
            check_settings(traits, pair.target.seq_len, p.sampling, p.csd, pair.draft.traits)
            if p.sampling.knob_values()["gtr_stages"]:
                pair.target.plan([0], p.sampling, "cpu")  # every stage fits its tokens


@pytest.mark.parametrize("name", ["shapes_target", "shapes_xar_target", "shapes_text_target"])
def test_the_apps_deciding_points_are_the_full_grids_settings(name):
    """The app's quick frontier adds the alternatives that decided the paired verdicts (GtR's stages on
    the masked pairs, Euler and Heun ODE steps on xAR), under the names and settings of the full grid."""
    from csd.experiments import defaults
    from csd.experiments.grid import deciding_points, pair_grid
    from csd.models.registry import load_model

    target = load_model(Path(__file__).resolve().parents[2] / "assets" / "models" / f"{name}.safetensors")
    steps = target.traits.fixed_num_steps or defaults.SAMPLING.num_steps
    s = replace(defaults.SAMPLING, num_steps=steps)
    head = target.head_steps(s.head_steps)
    points = deciding_points(s, head, target.traits.head_samplers, target.traits.takes_gtr)
    full = {p.name: p for p in pair_grid(target, s, defaults.CSD)}
    expected = ["GtR"] if target.traits.takes_gtr else ["Euler ODE flow 6", "Heun ODE flow 4"]
    assert [e for e in expected if any(e in p.name for p in points)] == expected
    for p in points:
        assert p.csd is None and full[p.name].sampling == p.sampling, p.name


def test_a_points_key_is_its_setting_written_as_the_tools_read_it():
    """Each key part is a knob's key=value (csd.cli.parse_setting's form): read back over the baseline and the
    default CSD setting, the key gives the point's own configs."""
    from csd.cli import parse_setting
    from csd.config import knobs

    s = SamplingConfig(num_steps=32, cfg_scale=3.0)
    full = grid(s, CSDConfig(), 25, False, caches_guidance=True, caches_tokens=True, head_samplers=("ddpm", "ddim"))
    for p in full + grid(s, CSDConfig(), 25, False, fixed_steps=True, head_samplers=("euler-maruyama", "euler")):
        kind, *parts = p.key(s).split(",")
        ours = [item for item in parts if item.partition("=")[0] in knobs(SamplingConfig)]
        assert parse_setting(",".join(ours), s) == p.sampling, p.name
        theirs = [item for item in parts if item not in ours]
        assert (kind == "csd") == (p.csd is not None) and (p.csd is not None or not theirs)
        assert p.csd is None or parse_setting(",".join(theirs), CSDConfig()) == p.csd, p.name
