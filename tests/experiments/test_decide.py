"""Enough images to decide: paired differences on the same seeds, the verdict they give at each slack, and a
tiny decision end to end."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.decide import candidates, chosen
from csd.experiments.frontier import fd_standard_error
from csd.experiments.grid import Point, grid
from csd.experiments.paired import Scored, compare, judge, keeps_target, margin, paired_fd, paired_mean, summarize
from tests.helpers import save_tiny_pixel_pair
from visualize.decisions import decide_markdown, decide_summary


def feature_sets(n: int = 200, d: int = 4, noise: float = 0.1, seed: int = 0):
    """Reference features and two generated sets that share most of their variation image by image (as
    two samplers' images of the same seeds do): a common part plus small independent noise."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(1000, d))
    common = rng.normal(size=(n, d))
    a = common + noise * rng.normal(size=(n, d))
    b = common + noise * rng.normal(size=(n, d))
    return ref, a, b


def test_identical_sets_differ_by_nothing_with_no_error():
    ref, a, _ = feature_sets()
    assert paired_fd(a, a.copy(), ref) == (0.0, 0.0)
    correct = np.array([1.0, 0.0, 1.0, 1.0])
    assert paired_mean(correct, correct) == (0.0, 0.0)
    assert margin(0.0, 0.0, higher_is_better=True) == 0.0


def test_a_paired_error_is_smaller_than_the_combined_error_of_correlated_sets():
    ref, a, b = feature_sets(noise=0.1)
    _, paired = paired_fd(a, b, ref, bootstrap=50)
    combined = math.hypot(fd_standard_error(a, ref), fd_standard_error(b, ref))
    assert 0 < paired < combined / 3  # the shared variation cancels in the difference
    rng = np.random.default_rng(1)
    x = (rng.random(400) < 0.7).astype(float)
    y = x.copy()
    y[:20] = 1 - y[:20]  # 5% of the images flip: the two accuracies are strongly correlated
    _, se = paired_mean(x, y)
    unpaired = math.hypot(x.std() / 20, y.std() / 20)
    assert se < unpaired / 2


def test_independent_sets_get_about_the_combined_error():
    ref, a, _ = feature_sets(noise=0.1, seed=0)
    _, b, _ = feature_sets(noise=0.1, seed=5)  # other images altogether: nothing to pair
    _, paired = paired_fd(a, b, ref, bootstrap=200)
    combined = math.hypot(fd_standard_error(a, ref), fd_standard_error(b, ref))
    assert 0.6 < paired / combined < 1.6  # 20 resamples per error: a loose band


def test_a_shifted_set_gives_the_expected_sign():
    ref, a, b = feature_sets()
    worse = b + 0.5  # its mean moved away from the reference: a larger distance
    diff, se = paired_fd(a, worse, ref)
    assert diff < 0 and se > 0
    assert margin(diff, se, higher_is_better=False) > 2  # a (CSD) better on FD: a positive margin
    hits = np.ones(100)
    misses = hits.copy()
    misses[::4] = 0.0
    diff, se = paired_mean(hits, misses)
    assert diff == pytest.approx(0.25) and margin(diff, se, higher_is_better=True) > 2
    both = compare(Scored(a, hits), Scored(worse, misses), ref)
    assert both["fd"]["margin"] > 0 and both["accuracy"]["margin"] > 0
    reverse = compare(Scored(worse, misses), Scored(a, hits), ref)
    assert reverse["fd"]["diff"] == pytest.approx(-both["fd"]["diff"])
    assert reverse["fd"]["margin"] < 0 and reverse["accuracy"]["margin"] < 0


def test_paired_statistics_refuse_unpaired_inputs():
    ref, a, _ = feature_sets()
    with pytest.raises(ValueError, match="one shape"):
        paired_fd(a, a[:-1], ref)
    with pytest.raises(ValueError, match="same length"):
        paired_mean(np.ones(3), np.ones(4))


def row(name: str, method: str, t1: float, fd: float = 10.0, accuracy: float = 0.8) -> dict:
    return {
        "name": name,
        "method": method,
        "time": {"1": t1, "8": t1 + 0.1},
        "fd": fd,
        "fd_se": 2.0,
        "accuracy": accuracy,
        "accuracy_se": 0.03,
    }


def pair(csd: str, alternative: str, fd_margin: float, acc_margin: float = 0.0) -> dict:
    entry = lambda m: {"diff": -m, "se": 1.0, "margin": m}
    return {"csd": csd, "alternative": alternative, "fd": entry(fd_margin), "accuracy": entry(-acc_margin)}


ROWS = [
    row("target-only", "target, fewer AR steps", 1.0, fd=10.0, accuracy=0.85),
    row("CSD a", "CSD", 0.40),
    row("fast", "target, fewer AR steps", 0.38, fd=11.0, accuracy=0.84),
    row("near", "target, fewer AR steps", 0.44),
    row("far", "target, fewer AR steps", 0.48),
]
PAIRS = [pair("CSD a", "target-only", -5.0), pair("CSD a", "fast", 3.0), pair("CSD a", "near", 1.0)]
PAIRS.append(pair("CSD a", "far", -3.0))


def test_the_slack_decides_which_alternatives_count_and_the_smallest_margin_decides():
    at = lambda slack: judge(ROWS, PAIRS, "1", slack, "fd")
    assert at(0.0)["verdict"] == "clearly ahead" and at(0.0)["best"]["rival"] == "fast"  # only "fast" as fast
    assert at(0.05)["verdict"] == "on par" and at(0.05)["best"]["rival"] == "near"  # 0.44 <= 0.40 + 0.05
    assert at(0.10)["verdict"] == "behind" and at(0.10)["best"]["margin"] == -3.0  # "far" at 0.48
    assert at(0.10)["best"]["alternatives"] == 3 and at(0.10)["batch"] == 1
    assert judge(ROWS, PAIRS[:1], "1", 0.10, "fd")["verdict"] == "unrated"  # target-only is never as fast


def test_the_best_csd_setting_decides():
    rows = ROWS + [row("CSD b", "CSD", 0.40)]
    pairs = PAIRS + [pair("CSD b", "fast", 4.0), pair("CSD b", "near", 2.5), pair("CSD b", "far", 2.2)]
    v = judge(rows, pairs, "1", 0.10, "fd")
    assert v["verdict"] == "clearly ahead" and v["best"]["csd"] == "CSD b" and v["best"]["rival"] == "far"
    assert [s["csd"] for s in v["settings"]] == ["CSD a", "CSD b"]


def test_the_fastest_setting_within_target_onlys_error():
    k = keeps_target(ROWS, "1")
    assert k["name"] == "fast" and k["speedup"] == pytest.approx(1 / 0.38)  # FD 11 <= 10 + 2, accuracy 0.84 >= 0.82
    rows = [ROWS[0], row("fast", "target", 0.38, fd=12.1), row("mid", "target", 0.6, accuracy=0.81)]
    rows.append(row("slow", "target", 0.9, accuracy=0.83))
    assert keeps_target(rows, "1")["name"] == "slow"  # FD 12.1 > 10 + 2; accuracy 0.81 < 0.85 - 0.03
    assert keeps_target(rows[:1], "8")["name"] == "target-only"


S = SamplingConfig(num_steps=6, cfg_scale=2.0)


def test_summarize_pairs_every_csd_setting_with_every_alternative():
    ref, a, b = feature_sets(n=50)
    rng = np.random.default_rng(3)
    correct = lambda: (rng.random(50) < 0.8).astype(float)
    points = [Point("target-only", S), Point("target, 3 AR steps", S), Point("CSD", S, CSDConfig(gamma=2))]
    scored = {"target-only": Scored(a, correct()), "target, 3 AR steps": Scored(b + 0.3, correct())}
    scored["CSD"] = Scored(b, correct())
    seconds = {1: {"target-only": 2.0, "target, 3 AR steps": 1.0, "CSD": 1.2}, 8: {k: 1.0 for k in scored}}
    result = summarize(points, seconds, scored, ref, bootstrap=10)
    assert [r["time"]["1"] for r in result["rows"]] == [1.0, 0.5, 0.6] and result["rows"][2]["time"]["8"] == 1.0
    assert [(p["csd"], p["alternative"]) for p in result["pairs"]] == [
        ("CSD", "target-only"),
        ("CSD", "target, 3 AR steps"),
    ]
    assert result["rows"][0]["vs_target"] is None and result["rows"][2]["vs_target"]["fd"]["diff"] != 0
    assert result["pairs"][1]["fd"]["margin"] > 0  # the shifted alternative is worse
    assert len(result["verdicts"]) == 2 * 3 * 2  # batches x slacks x metrics
    first = result["verdicts"][0]
    assert (first["batch"], first["slack"], first["metric"], first["best"]["rival"]) == (
        1,
        0.0,
        "fd",
        "target, 3 AR steps",
    )
    json.dumps(result)
    md = decide_markdown(result)
    assert md.startswith("# Enough images to decide") and "| 1 | 0.05 | FD | **" in md
    assert md.count("\n| target, 3 AR steps |") == 2  # its row and its comparison with CSD
    summary = decide_summary([result | {"family": "MAR"}]).splitlines()
    assert len(summary) == 2 + 2 + 1 + 1  # a header, a rule, a row per batch, a blank line, a line per family
    v = [v for v in result["verdicts"] if v["batch"] == 8 and v["metric"] == "fd"]
    assert summary[3].startswith("| MAR (class pair) | 8 | 50 |") and f"{v[0]['best']['margin']:+.1f} / " in summary[3]
    assert summary[-1].startswith("- MAR (class pair): ") and "target-only: FD" in summary[-1]


def test_candidates_are_csds_best_the_alternatives_near_its_time_and_the_unmeasured_by_key():
    steps = {"target-only": 6, "fast": 2, "near": 3, "far": 4}
    settings = {name: {"sampling": replace(S, num_steps=k).knob_values(), "csd": None} for name, k in steps.items()}
    settings["CSD a"] = {"sampling": S.knob_values(), "csd": CSDConfig(gamma=2).knob_values()}
    frontier = {"batch": 8, "verdict": {"best": {"name": "CSD a", "time": 0.40, "margin": 1.0}}}
    frontier["rows"] = [r | {"time": r["time"]["1"]} | settings[r["name"]] for r in ROWS]
    ode = Point("target, Euler ODE flow 6 steps", S.with_knobs(head_steps=6, head_sampler="euler"))
    found = candidates(frontier, [Point("target-only", S), Point("near", replace(S, num_steps=3)), ode])
    assert [r["name"] for r in found["alternatives"]] == ["fast", "near", "far"]  # up to 0.50, fastest first
    assert [r["key"] for r in found["alternatives"]] == [f"target,num_steps={k}" for k in (2, 3, 4)]
    assert found["best"]["key"] == "csd,gamma=2"
    assert found["not_measured"] == [{"name": ode.name, "key": "target,head_steps=6,head_sampler=euler"}]


def test_points_are_chosen_by_their_stable_key_with_the_baseline_first():
    points = grid(S, CSDConfig(gamma=2), 10, quick=True)
    keys = [p.key(S) for p in points]
    assert keys[:3] == ["target", "target,head_steps=5", "target,head_steps=10,head_steps_min=2"]
    assert "csd,gamma=4,tau_v=5" in keys and "csd,gamma=2,prefill=0.25" in keys  # the knobs each changes
    picked = chosen(points, [keys[3], keys[1]])
    assert picked == [points[0], points[1], points[3]]
    with pytest.raises(ValueError, match="nearest"):
        chosen(points, ["CSD, gamma 4, tau_v 5"])  # a display name is not a key


def test_a_tiny_decision_end_to_end_and_its_table(tmp_path, restore_threads):
    from csd.experiments.decide import main
    from visualize.report import main as report

    target, draft = save_tiny_pixel_pair(tmp_path)
    out = tmp_path / "decide.json"
    args = ["--target", target, "--draft", draft, "--num-steps", "4", "--n", "6", "--n-ref", "20", "--threads", "1"]
    args += ["--repeats", "2", "--batches", "1", "2", "--bootstrap", "5", "--out", str(out)]
    args += ["--points", "csd,gamma=4,tau_v=5", "target,num_steps=2", "--features", str(tmp_path / "f.npz")]
    result = main(args)
    saved = json.loads(out.read_text())
    assert [r["name"] for r in saved["rows"]] == [r["name"] for r in result["rows"]]
    assert saved["rows"][0]["name"].startswith("target-only (4 AR steps") and saved["rows"][0]["time"]["2"] == 1.0
    assert saved["n"] == 6 and saved["kind"] == "decide" and saved["minutes"] >= 0
    assert {v["batch"] for v in saved["verdicts"]} == {1, 2}
    assert len(saved["pairs"]) == 2  # CSD against target-only and 2 AR steps
    arrays = np.load(tmp_path / "f.npz")
    assert arrays["feats_1"].shape[0] == 6 and list(arrays["names"]) == [r["name"] for r in saved["rows"]]
    report([str(out)])
    assert (tmp_path / "decide.md").read_text().startswith("# Enough images to decide: MAR")
    again = main(["--retime", str(out), "--target", target, "--draft", draft, "--repeats", "1", "--threads", "1"])
    assert json.loads(out.read_text()) == again and again["pairs"] == saved["pairs"]  # the images' comparisons kept
    assert [r["time"] for r in again["rows"]] != [r["time"] for r in saved["rows"]]  # timed again
    assert again["repeats"] == 1 and "timed again" in again["timing"]["2"] and len(again["verdicts"]) == 12
