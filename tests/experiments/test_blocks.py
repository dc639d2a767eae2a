"""What a block costs (csd.experiments.blocks): every draft length under the published block, the context fixed
alone and the exact block, against target-only on the same images; its table (visualize.report), and the
committed runs pasted into the Method tab's text as measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.blocks import FIXED_GAMMAS, GAMMAS, VIEW_GAMMAS, block_points, gpu_costs, view_points
from tests.helpers import save_tiny_pixel_pair

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "bench" / "results" / "blocks").glob("*.json"))


def test_the_settings_are_target_only_then_each_block_at_its_draft_lengths():
    points = block_points(SamplingConfig(num_steps=8), CSDConfig(gamma=3, gamma_schedule=(2,)))
    assert points[0].csd is None and points[0].name == "target-only"
    blocks = [(p.csd.block.kind, p.csd.block.views, p.csd.gamma) for p in points[1:]]
    expected = [("published", "one_pass", g) for g in GAMMAS]
    expected += [(b, "one_pass", g) for b in ("context", "exact") for g in FIXED_GAMMAS]
    assert blocks == expected and all(p.csd.gamma_schedule == () for p in points[1:])
    views = view_points(SamplingConfig(num_steps=8), CSDConfig(gamma=3))
    expected = [("published", "one_pass", 1)] + [("exact", v, g) for g in VIEW_GAMMAS for v in ("one_pass", "per_view")]
    assert views[0].csd is None and [(p.csd.block.kind, p.csd.block.views, p.csd.gamma) for p in views[1:]] == expected


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
    assert result["kind"] == "blocks" and len(rows) == 1 + len(GAMMAS) + 2 * len(FIXED_GAMMAS)
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


def test_the_views_run_sets_the_one_pass_beside_a_pass_per_view(tmp_path, restore_threads):
    from csd.experiments.blocks import main

    target, draft = save_tiny_pixel_pair(tmp_path)
    out = tmp_path / "views.json"
    args = ["--target", target, "--draft", draft, "--num-steps", "6", "--n", "2", "--n-ref", "20", "--threads", "1"]
    main([*args, "--batch-size", "2", "--bootstrap", "5", "--compare-views", "--out", str(out)])
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    exact = [f"exact, gamma {g}{v}" for g in VIEW_GAMMAS for v in ("", ", a pass per view")]
    assert list(rows) == ["target-only", "published, gamma 1", *exact]
    for g in VIEW_GAMMAS:  # the same blocks; one target pass per block against one per drafted step
        one, each = rows[f"exact, gamma {g}"], rows[f"exact, gamma {g}, a pass per view"]
        assert one["steps_kept_per_block"] == each["steps_kept_per_block"] and one["fd"] == pytest.approx(each["fd"])
        assert one["target_passes"] < each["target_passes"] and one["views"] == "one_pass" != each["views"]
    from visualize.report import report

    page = tmp_path / "docs" / "how_it_works.md"  # the main table's place: a comparison of views is not pasted there
    page.parent.mkdir()
    page.write_text("<!-- blocks:start -->\nthe main table\n<!-- blocks:end -->\n")
    assert report(out, root=tmp_path) == f"wrote {out.with_suffix('.md')}"
    assert page.read_text() == "<!-- blocks:start -->\nthe main table\n<!-- blocks:end -->\n"
    assert out.with_suffix(".md").read_text().startswith("# The exact block's views, one pass or a pass each: MAR")


def test_only_keeps_target_only_and_gamma_1_beside_the_settings_it_names_and_refuses_others():
    import argparse

    from csd.experiments.blocks import only_points

    points = block_points(SamplingConfig(num_steps=8), CSDConfig(gamma=3))
    parser = argparse.ArgumentParser()
    kept = only_points(points, ["exact, gamma 8", "exact, gamma 4"], parser)
    assert [p.name for p in kept] == ["target-only", "published, gamma 1", "exact, gamma 4", "exact, gamma 8"]
    assert only_points(points, None, parser) == points
    with pytest.raises(SystemExit):
        only_points(points, ["exact, gamma 9"], parser)


def test_a_run_in_a_subfolder_of_the_method_tabs_records_is_not_pasted_into_its_text(tmp_path):
    """Another batch's run (bench/results/blocks/batch1/) gets its table beside it; the Method tab's text keeps
    the table of the run it charts."""
    from visualize.report import report

    run = json.loads((ROOT / "bench" / "results" / "blocks" / "causal.json").read_text())
    page = tmp_path / "docs" / "how_it_works.md"
    page.parent.mkdir()
    page.write_text("<!-- causal-blocks:start -->\nthe charted run's table\n<!-- causal-blocks:end -->\n")
    for folder, pasted in (("batch1", False), ("", True)):
        out = tmp_path / "bench" / "results" / "blocks" / folder / "causal.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run))
        report(out, root=tmp_path)
        assert out.with_suffix(".md").is_file() and ("the charted run's table" not in page.read_text()) == pasted


# The embedded causal pair's exact block, 200 paired prompts at batch 8 and 1: the exact block within two
# paired standard errors of gamma 1 (FD and class accuracy) and under one target pass per token at gamma 8.
CAUSAL_RUNS = [ROOT / "bench" / "results" / "blocks" / name / "causal.json" for name in ("", "batch1")]


@pytest.mark.parametrize("path", CAUSAL_RUNS, ids=["batch 8", "batch 1"])
def test_the_causal_pairs_exact_block_keeps_gamma_1s_quality_at_under_a_pass_per_token(path):
    from csd.models.checkpoint import file_digest

    run = json.loads(path.read_text())
    models = ROOT / "assets" / "models"
    assert run["weights"] == file_digest(
        models / "shapes_causal_target.safetensors", models / "shapes_causal_draft.safetensors"
    )
    assert run["settings"]["n"] == 200 and run["family"] == "NextStep"
    rows = {r["name"]: r for r in run["rows"]}
    exact = [r for r in rows.values() if r["block"] == "exact"]
    assert exact and {r["gamma"] for r in exact} >= {4, 8}
    for r in exact:
        for metric in ("accuracy", "fd"):
            diff = r["vs_gamma1"][metric]
            assert abs(diff["diff"]) <= 2 * diff["se"], (r["name"], metric, diff)
    tokens = rows["target-only"]["target_passes"]  # one pass per token (64) per batch
    assert rows["exact, gamma 8"]["target_passes"] / tokens < 1
