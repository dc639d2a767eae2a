"""Analysis panel data: the runs it plans, what the panels hold, and the JSON round trip."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.analysis import Analysis, AnalysisSettings, cost_model, step_costs
from csd.records.cost import csd_passes, simple_bound, speedup_bound
from csd.records.panel_data import Histogram, Panels, Spread
from csd.trace import Trace

SETTINGS = AnalysisSettings(
    n_images=2,
    sampling=SamplingConfig(num_steps=8, cfg_scale=2.0),
    csd=CSDConfig(gamma=4, prefill=0.05),
    gammas=(2, 4),
    cfg_scales=(1.0, 2.0),
    temperatures=(1.0,),
    step_fractions=(1.0, 0.5),
)


@pytest.fixture(scope="module")
def pair(one_thread, random_models):
    return random_models


@pytest.fixture(scope="module")
def analysis(pair):
    a = Analysis(pair, SETTINGS)
    labels = [run.label for run in a.steps()]
    assert len(labels) == len(a)
    return a


@pytest.fixture(scope="module")
def panels(analysis):
    return analysis.panels()


def test_runs_are_planned_once_per_distinct_setting(analysis):
    # CSD at S = 8 makes 4 target passes (2 pre-fill steps + 2 blocks), so the fair fewer-steps
    # baseline coincides with S/2.
    assert csd_passes(64, SETTINGS.sampling, SETTINGS.csd) == (4, 6)
    # aligned + independent + pre-fill 0%, 15% + gamma 2 + CFG 1 + target-only (the default CSD run is
    # shared); target-only and CSD timed again.
    assert len(analysis) == 7 + 2


def test_images_cycle_classes_from_the_chosen_one(pair):
    a = Analysis(pair, replace(SETTINGS, n_images=3, label=9, seed=5))
    assert a.labels == [9, 0, 1] and a.seeds == [5, 6, 7]


def test_panels_round_trip_through_json(panels):
    text = panels.to_json()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON: missing values are null
    assert Panels.from_dict(json.loads(text)).to_json() == text


def test_distance_panel_has_both_noise_choices_per_step(panels):
    d = panels.distance
    assert set(d.per_step) == {"aligned", "independent"}
    assert len(d.per_step["aligned"].x) == 8
    assert d.mean["aligned"] is not None and d.mean["independent"] is not None
    assert all(0.0 <= v <= 1.0 for v in d.acceptance.values())


def test_prefill_panel_has_no_acceptance_for_prefilled_steps(panels):
    zero, most = panels.prefill.per_step["0%"], panels.prefill.per_step["15%"]
    assert zero.mean[0] is not None  # nothing pre-filled: step 0 is drafted
    assert most.mean[0] is None  # step 0 made by the target alone


def test_sweeps_hold_one_value_per_setting(panels):
    assert panels.sweeps["gamma"].values == [2.0, 4.0]
    assert panels.sweeps["cfg_scale"].values == [1.0, 2.0]
    assert len(panels.sweeps["temperature"].acceptance) == 1


def test_time_panel_uses_the_cost_model_of_csd_cost():
    def trace(times, target_passes, draft_passes):
        t = Trace.empty(1, 16, [2] * 8)
        t.times, t.target_passes, t.draft_passes = times, target_passes, draft_passes
        return t

    target = trace({"target_backbone": 8.0, "target_head": 0.8}, 8, 0)
    csd_run = trace({"draft_backbone": 0.7, "draft_head": 0.35}, 3, 7)
    csd = CSDConfig(gamma=4, prefill=0.05)
    costs = step_costs(target, csd_run)
    per_step = (costs.target_backbone, costs.target_head, costs.draft_backbone, costs.draft_head)
    assert per_step == pytest.approx((1.0, 0.1, 0.1, 0.05))  # target per AR step, draft per draft pass
    sampling = SamplingConfig(num_steps=8)
    model, bound = cost_model(target, csd_run, sampling, csd)
    assert math.isclose(model, speedup_bound(costs, 16, sampling, csd))
    assert math.isclose(bound, simple_bound(costs, sampling, csd)) and math.isclose(bound, 1.0 / (0.1 + 1.0 / 4))


def test_the_time_panels_bounds_count_the_blocks_of_a_draft_length_schedule(pair):
    """A gamma_schedule's short first blocks cost target passes: 8 AR steps in blocks of 1, 1, then 4 and 2
    make 4 passes, not gamma 4's 2 (the bounds took gamma alone before issue 54)."""
    csd = CSDConfig(gamma=4, gamma_schedule=(1, 1), prefill=0.0)
    settings = replace(SETTINGS, n_images=1, csd=csd, gammas=(4,), prefills=(0.0,), cfg_scales=(2.0,))
    analysis = Analysis(pair, settings)
    for _ in analysis.steps():
        pass
    time = analysis.panels().time
    c_p, h_p, c_q, h_q = (time.costs[k] for k in ("C_p", "H_p", "C_q", "H_q"))
    assert time.cost_model == pytest.approx(8 * (c_p + h_p) / (8 * (c_q + h_q) + 4 * c_p + 8 * h_p))
    assert time.bound == pytest.approx(c_p / (c_q + c_p * 3.5 / 8))  # blocks of 1, 1, then 6 / 4 = 1.5 of gamma


def test_spread_ignores_nan_and_marks_empty_groups():
    s = Spread.of([0, 1], [np.array([1.0, np.nan, 3.0]), np.array([np.nan])])
    assert s.mean == [2.0, None] and s.median == [2.0, None] and s.q25 == [1.5, None]


def test_histogram_shares_edges_and_clips_outliers_into_the_end_bins():
    h = Histogram.of({"a": np.r_[np.zeros(98), 1e6, np.nan], "b": np.ones(10)}, bins=4, clip=1.0)
    assert len(h.edges) == 5 and h.edges[-1] < 1e6
    assert sum(h.counts["a"]) == 99 and sum(h.counts["b"]) == 10
