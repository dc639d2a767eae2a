"""The consequences table of issue 53 (``python -m csd.experiments.criteria``): every test on the same paired
images, its acceptance, the share left at zero and the differences to target-only; and the committed tables
(bench/results/criteria/*.json) with their Markdown and the docs' copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csd.config import CSDConfig
from csd.experiments.criteria import criteria_settings, main, markdown

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "bench" / "results" / "criteria").glob("*.json"))


def test_the_settings_differ_only_in_the_test():
    base = CSDConfig(gamma=4, prefill=0.1)
    settings = criteria_settings(base)
    assert list(settings) == [
        "derived",
        "published sign",
        "published code, float32",
        "published code, float64",
        "published code, float64, variances in the scale slots",
    ]
    assert {s.gamma for s in settings.values()} == {4} and {s.prefill for s in settings.values()} == {0.1}
    assert settings["published code, float32"].criterion.kind == "published"
    assert settings["published code, float32"].criterion.product_precision == "float32"
    assert settings["published sign"].criterion.trajectory_term == "published"


@pytest.mark.slow
def test_a_small_run_scores_every_test_on_the_same_images(tmp_path):
    out = tmp_path / "criteria.json"
    result = main(["--n", "4", "--n-ref", "20", "--num-steps", "4", "--threads", "1", "--out", str(out)])
    rows = result["rows"]
    assert set(rows) == {"target only", *criteria_settings(CSDConfig())}
    assert rows["published code, float32"]["acceptance_rate"] == 0.0  # 48-dim products underflow: all rejected
    assert rows["published code, float32"]["zeroed_share"] == 1.0  # and the resampler's too: all left at zero
    assert rows["published code, float64"]["acceptance_rate"] == rows["published sign"]["acceptance_rate"]
    assert out.with_suffix(".md").read_text() == markdown(json.loads(out.read_text()))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_the_committed_tables_are_their_markdown_and_in_the_docs(path):
    result = json.loads(path.read_text())
    assert result["n"] == 200 and path.with_suffix(".md").read_text() == markdown(result)
    table = markdown(result).split("\n\n", 1)[1].strip()
    for doc in ("specification_notes.md", "results.md"):
        assert table in (ROOT / "docs" / doc).read_text(), doc


def test_every_embedded_pair_has_its_committed_table():
    assert {p.stem for p in COMMITTED} == {"class", "xar", "text"}
