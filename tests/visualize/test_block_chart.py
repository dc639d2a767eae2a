"""The Method tab's lesson on blocks as pictures: one chart per pair from the committed records of
``python -m csd.experiments.blocks`` (FD against CPU time, each block's points labelled with gamma, target-only
and gamma 1 marked), and docs/how_it_works.md cut so its tables go into an accordion."""

from __future__ import annotations

import json
from pathlib import Path

from demo.tabs.method import BLOCKS_DIR, HOW_IT_WORKS, block_records, lesson_parts
from visualize.block_chart import block_chart

RECORD = json.loads((BLOCKS_DIR / "shapes.json").read_text())


def test_a_pairs_chart_has_each_block_labelled_by_gamma_and_marks_target_only_and_gamma_1():
    chart = block_chart(RECORD, "MAR (class pair)")
    by_name = {s.name: s for s in chart.series}
    assert list(by_name) == ["published block", "context fixed alone", "exact block", "target-only", "gamma 1"]
    rows = {(r["block"], r["gamma"]): r for r in RECORD["rows"]}
    assert by_name["published block"].text == ["γ1", "γ2", "γ4", "γ8", "γ16"]
    assert by_name["exact block"].text == ["γ1", "γ2", "γ4", "γ8"]  # from gamma 1, where the blocks are one
    assert by_name["exact block"].y == [rows[("published", 1)]["fd"]] + [rows[("exact", g)]["fd"] for g in (2, 4, 8)]
    assert by_name["exact block"].x[-1] == rows[("exact", 8)]["cpu_time"]
    assert by_name["target-only"].x == [1.0] and by_name["target-only"].y == [rows[(None, None)]["fd"]]
    assert by_name["gamma 1"].y == [rows[("published", 1)]["fd"]]
    assert "gamma 8" in chart.note and chart.y_log


def test_every_committed_blocks_record_has_a_chart_in_the_families_order():
    labels = [label for label, _ in block_records()]
    assert len(labels) == len(list(BLOCKS_DIR.glob("*.json")))
    assert labels[:3] == ["MAR (class pair)", "Harmon (text pair)", "xAR (cells pair)"]


def test_the_lessons_tables_are_cut_out_whole_for_the_accordion():
    before, tables, after = lesson_parts(HOW_IT_WORKS.read_text())
    for name in ("blocks", "text-blocks", "xar-blocks"):
        assert f"<!-- {name}:start -->" in tables and f"<!-- {name}:end -->" in tables
    assert "| setting |" not in before + after
    assert "What a block of drafted steps costs" in before and "A note on" in after
    assert Path(HOW_IT_WORKS).read_text().count("<!-- block-tables:") == 2
