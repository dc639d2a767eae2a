"""What a block costs (csd.experiments.blocks): every draft length under the published block, the context fixed
alone and the exact block, against target-only on the same images; its table (visualize.report), and the
committed runs pasted into the Method tab's text as measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.blocks import FIXED_GAMMAS, GAMMAS, PER_VIEW_GAMMAS, block_points, gpu_costs
from tests.helpers import save_tiny_pixel_pair

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "bench" / "results" / "blocks").glob("*.json"))


def test_the_settings_are_target_only_then_each_block_at_its_draft_lengths():
    points = block_points(SamplingConfig(num_steps=8), CSDConfig(gamma=3, gamma_schedule=(2,)))
    assert points[0].csd is None and points[0].name == "target-only"
    blocks = [(p.csd.block.kind, p.csd.block.views, p.csd.gamma) for p in points[1:]]
    expected = [("published", "one_pass", g) for g in GAMMAS]
    expected += [(b, "one_pass", g) for b in ("context", "exact") for g in FIXED_GAMMAS]
    expected += [("exact", "per_view", g) for g in PER_VIEW_GAMMAS]
    assert blocks == expected and all(p.csd.gamma_schedule == () for p in points[1:])


def test_the_gpu_costs_are_the_committed_h200_row():
    costs, source = gpu_costs()
    assert source["pair"] == "MAR-L / MAR-B" and source["batch"] == 8
    assert costs.target_pass == pytest.approx(source["per_step_ms"]["target_backbone"] / 1e3)
    assert costs.target_chain.per_transition * source["head_steps"] == pytest.approx(
        source["per_step_ms"]["target_head"] / 1e3
    )


def test_a_tiny_run_end_to_end_and_its_table(tmp_path, restore_threads):
    from csd.experiments.blocks import main
    from visualize.report import write_tables

    target, draft = save_tiny_pixel_pair(tmp_path)
    out = tmp_path / "blocks.json"
    args = ["--target", target, "--draft", draft, "--num-steps", "4", "--n", "4", "--n-ref", "20", "--threads", "1"]
    main([*args, "--batch-size", "2", "--bootstrap", "5", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert result["kind"] == "blocks" and len(rows) == 1 + len(GAMMAS) + 2 * len(FIXED_GAMMAS) + len(PER_VIEW_GAMMAS)
    assert rows["target-only"]["cpu_time"] == rows["target-only"]["gpu_time_predicted"] == 1.0
    assert rows["target-only"]["target_passes"] == 4.0  # 4 AR steps per batch
    assert all("vs_target" in r for name, r in rows.items() if name != "target-only")
    assert all(("vs_gamma1" in r) == (r["block"] == "exact") for r in rows.values())
    for g in FIXED_GAMMAS:
        exact, context = rows[f"exact, gamma {g}"], rows[f"context, gamma {g}"]
        assert 1.0 <= exact["steps_kept_per_block"] <= g  # committed through the first rejection
        # a masked family's views as rows of one pass: a target pass per block, every block's steps kept (context,
        # as the published block) or those through the first rejection (exact: more blocks)
        assert rows[f"published, gamma {g}"]["target_passes"] == context["target_passes"] <= exact["target_passes"]
    for g in PER_VIEW_GAMMAS:  # a pass per view: one per step the blocks drafted, where the one pass made one per block
        assert rows[f"exact, gamma {g}, a pass per view"]["target_passes"] > rows[f"exact, gamma {g}"]["target_passes"]
    assert rows["published, gamma 4"]["target_passes"] < rows["target-only"]["target_passes"]
    table = write_tables(out).read_text()
    assert table.startswith("# What a block costs: MAR") and "| exact, gamma 2 |" in table


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_the_committed_runs_are_in_the_method_tabs_text(path):
    from visualize.tables import blocks_markdown, docs_prefix

    result = json.loads(path.read_text())
    text = (ROOT / "docs" / "how_it_works.md").read_text()
    marker = f"<!-- {docs_prefix(result)}blocks:start -->\n"
    assert marker + blocks_markdown(result).strip() in text
