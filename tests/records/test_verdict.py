"""The frontier's verdict rule and the per-pass cost model behind its predicted times."""

import math

import pytest

from csd.records.cost import ChainCost, PassCosts, fit_chain, fit_pass
from csd.records.verdict import margins, verdict, verdict_line


def row(name, method, time, fd, fd_se=1.0):
    return {"name": name, "method": method, "time": time, "fd": fd, "fd_se": fd_se}


def test_csd_is_clearly_ahead_only_beyond_two_combined_standard_errors():
    base = [row("target-only", "target, fewer AR steps", 1.0, 10.0), row("t16", "target, fewer AR steps", 0.5, 20.0)]
    ahead = verdict(base + [row("csd", "CSD", 0.47, 16.0)])  # 4 better, SE sqrt(2): 2.8 SE
    assert ahead["verdict"] == "clearly ahead" and ahead["best"]["rival"] == "t16"
    assert ahead["best"]["margin"] == pytest.approx(4 / math.sqrt(2))
    assert verdict(base + [row("csd", "CSD", 0.47, 18.0)])["verdict"] == "on par"  # 1.4 SE
    assert verdict(base + [row("csd", "CSD", 0.47, 24.0)])["verdict"] == "behind"  # -2.8 SE


def test_an_alternative_counts_up_to_its_slack_slower_and_the_best_setting_decides():
    rows = [
        row("target-only", "target, fewer AR steps", 1.0, 10.0),
        row("t16", "target, fewer AR steps", 0.54, 12.0),  # slower than csd by 0.04: within the slack
        row("csd fast", "CSD", 0.50, 16.0),
        row("csd slow", "CSD", 0.90, 9.0),
    ]
    m = {x["name"]: x for x in margins(rows)}
    assert m["csd fast"]["rival"] == "t16" and m["csd fast"]["margin"] < -2
    assert m["csd slow"]["rival"] == "t16" and m["csd slow"]["margin"] == pytest.approx(3 / math.sqrt(2))
    v = verdict(rows)
    assert v["verdict"] == "clearly ahead" and v["best"]["name"] == "csd slow"
    assert "clearly ahead" in verdict_line({"rows": rows, "batch": 8, "verdict": v})
    assert verdict(rows, slack=0.0)["best"]["name"] == "csd slow"


def test_a_csd_setting_faster_than_every_alternative_is_unrated():
    rows = [row("target-only", "target, fewer AR steps", 1.0, 10.0), row("csd", "CSD", 0.3, 12.0)]
    assert margins(rows)[0]["margin"] is None and verdict(rows)["verdict"] == "unrated"
    assert "unrated" in verdict_line({"rows": rows, "batch": 1})


def test_the_chain_cost_fit_separates_per_call_and_per_token_terms():
    a, b = 0.002, 1e-5
    runs = [(steps * (a + b * tok / steps), steps, tok) for steps, tok in ((800, 800 * 16), (200, 200 * 64))]
    fitted = fit_chain(runs)
    assert fitted.per_transition == pytest.approx(a) and fitted.per_token_transition == pytest.approx(b)
    one = fit_chain(runs[:1])  # one token count: per transition only
    assert one.per_token_transition == 0.0 and one.seconds(800, 0) == pytest.approx(runs[0][0])
    assert fit_chain([(1.0, 100, 100), (0.1, 100, 1000)]).per_token_transition == 0.0  # a negative term is refused
    assert fit_pass([(2.0, 10), (1.0, 10)]) == pytest.approx(0.15)


def test_the_prediction_charges_each_phase_by_its_calls_and_transitions():
    costs = PassCosts(target_pass=1.0, draft_pass=0.1, target_chain=ChainCost(0.01, 0.001), draft_chain=ChainCost(0.02))
    work = {
        "target_backbone": {"calls": 3, "steps": 0, "token_steps": 0},
        "prefill_backbone": {"calls": 1, "steps": 0, "token_steps": 0},
        "target_head": {"calls": 3, "steps": 30, "token_steps": 300},
        "draft_backbone": {"calls": 8, "steps": 0, "token_steps": 0},
        "draft_head": {"calls": 8, "steps": 80, "token_steps": 320},
        "verify": {"calls": 3, "steps": 0, "token_steps": 0},  # not modelled
    }
    expected = 4 * 1.0 + (30 * 0.01 + 300 * 0.001) + 8 * 0.1 + 80 * 0.02
    assert costs.predict(work) == pytest.approx(expected)
