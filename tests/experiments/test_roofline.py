"""The roofline benchmark counts a run's matrix products from their shapes, replays exactly those as its bound,
and reports a before/after pair of trees with the same tokens (``python -m csd.experiments.roofline``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from csd.experiments import roofline
from csd.experiments.roofline_probe import Bound, MatmulRecorder, op_class


def test_the_recorder_counts_every_product_and_its_flops():
    """nn.Linear on a 3-D input, addmm, bmm and attention (its two products), with their flops from the shapes;
    other ops are counted, not recorded; the bound replays the same products."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 5, 8, generator=g), torch.randn(3, 8, generator=g), torch.randn(3, generator=g)
    q = torch.randn(2, 4, 6, 16, generator=g)
    with torch.inference_mode(), MatmulRecorder() as rec:
        F.gelu(F.linear(x, w, b))
        torch.addmm(b, x[0], w.t())
        torch.bmm(x, x.transpose(1, 2))
        F.scaled_dot_product_attention(q, q, q)
    flops = [f for *_, f in rec.products]
    assert flops == [2 * 10 * 8 * 3, 2 * 5 * 8 * 3, 2 * 2 * 5 * 8 * 5, 2 * 8 * 6 * 6 * 16, 2 * 8 * 6 * 6 * 16]
    assert rec.ops["gelu"] == 1 and sum(rec.ops.values()) == 8  # and x[0], w.t(), x.transpose(1, 2)
    bound = Bound(rec.products, torch.device("cpu"))
    assert len(bound.calls) == 5 and bound.run() > 0.0


def test_ops_fall_into_their_classes():
    cases = {
        "aten::addmm": "matmul",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "aten::native_layer_norm": "norm",
        "aten::addcmul_": "element-wise",
        "aten::copy_": "copy and layout",
        "aten::as_strided": "copy and layout",
        "aten::randn": "random",
        "aten::bincount": "other",
    }
    assert {name: op_class(name) for name in cases} == cases


@pytest.mark.slow
def test_the_command_compares_two_trees_on_the_same_tokens(tmp_path):
    """One case, this tree against itself: both rows measured, the same flops and op calls, a bound below the
    wall time, the same tokens and decisions, and the JSON and Markdown written."""
    out = tmp_path / "roofline"
    argv = ["--pairs", "mar", "--batches", "1", "--modes", "target", "--repeats", "1", "--num-steps", "8"]
    result = roofline.main([*argv, "--before", str(roofline.ROOT), "--out", str(out)])
    (row,) = result["rows"]
    assert row["case"]["num_steps"] == 8 and row["trees"]["after"]["ar_steps"] == 8
    before, after = row["trees"]["before"], row["trees"]["after"]
    assert before["flops"] == after["flops"] > 1e9 and before["op_calls"] == after["op_calls"]
    assert 0.0 < after["bound_s"] < after["wall_s"] and 0.0 < after["efficiency"] < 1.0
    assert row["max_token_diff"] == 0.0 and row["same_decisions"]
    assert json.loads((out / "roofline.json").read_text())["rows"][0]["case"]["family"] == "mar"
    assert "| mar | 1 | target | after |" in (out / "roofline.md").read_text()


@pytest.mark.slow
def test_without_the_profile_the_rows_keep_flops_and_times_and_leave_op_calls_out(tmp_path):
    argv = ["--pairs", "mar", "--batches", "1", "--modes", "target", "--repeats", "1", "--num-steps", "2"]
    result = roofline.main([*argv, "--no-profile", "--out", str(tmp_path)])
    (row,) = result["rows"]
    after = row["trees"]["after"]
    assert after["flops"] > 0 and after["wall_s"] > 0 and after["op_calls"] is None and after["profile_s"] == {}
    table = (tmp_path / "roofline.md").read_text()
    assert "| mar | 1 | target | after |" in table and "Self time by op class" not in table


def test_bad_counts_are_refused_by_name():
    with pytest.raises(SystemExit):
        roofline.main(["--repeats", "0"])
    with pytest.raises(SystemExit):
        roofline.main(["--num-steps", "0"])
