"""Model cards come from the pair's files and the committed benchmark, not from hand-written numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import demo.cards as cards
from csd.models.registry import load_model
from csd.serving.pairs import discover, pair_specs
from demo.cards import BENCH, FACTS_FILE, built_facts, card_markdown, model_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sources():
    return {s.name: s for s in discover(None)}


@pytest.mark.parametrize("spec", pair_specs("embedded"), ids=lambda s: s.target)
def test_the_line_quotes_the_committed_benchmark_and_the_files_sizes(sources, spec):
    bench = json.loads((ROOT / BENCH[spec.target] / "bench.json").read_text())
    line = model_line(sources[spec.name])
    assert f"target-only class accuracy {bench['accuracy_target']:.2f}" in line
    assert f"(draft {bench['accuracy_draft']:.2f})" in line
    assert line.startswith("*32 x 32 px") and "M parameters" in line and "?" not in line
    for key, name in (("colour_accuracy", "colour"), ("background_accuracy", "background")):
        if f"{key}_target" in bench:
            assert f"{name} accuracy {bench[f'{key}_target']:.2f}" in line
    meta = json.loads((ROOT / "assets" / "models" / f"{spec.target}.json").read_text())
    if "tokenizer" in meta:  # a text pair: the vocabulary its file holds
        assert f"prompts over a {len(meta['tokenizer']['words'])}-word caption vocabulary" in line
    target = load_model(ROOT / "assets" / "models" / f"{spec.target}.safetensors")
    assert f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M" in line


def test_the_card_derives_its_numbers_from_the_files_and_the_benchmarks(sources):
    card = card_markdown(list(sources.values()))
    millions = sorted(
        sum(p.numel() for p in load_model(ROOT / "assets" / "models" / f"{s.target}.safetensors").parameters()) / 1e6
        for s in pair_specs("embedded")
    )
    assert f"small ({millions[0]:.1f}-{millions[-1]:.1f}M parameters)" in card
    threads = {
        json.loads((ROOT / folder / "bench.json").read_text())["settings"]["threads"] for folder in BENCH.values()
    }
    assert threads == {1} and "Speed figures are a CPU's (1 thread)" in card
    assert "procedural 32 x 32 shapes" in card and "2-core" not in card and "about 10M" not in card


def test_the_card_names_every_pair_the_paper_and_the_limits(sources):
    card = card_markdown(list(sources.values()))
    assert "arxiv.org/abs/2411.11925" in card and "Known limits" in card
    assert all(f"**{name}**" in card for name in sources)


def test_the_committed_facts_are_the_built_ones_of_every_shipped_file():
    """The page reads the shipped models' facts from assets/models/facts.json (no framework import): each entry
    is the facts of a model built from its file, and every shipped file has one (python -m demo.cards)."""
    committed = json.loads(FACTS_FILE.read_text())
    shipped = sorted((ROOT / "assets" / "models").glob("*.safetensors"))
    assert len(committed) == len(shipped) == 8
    for path in shipped:
        assert committed[cards._digest(path)] == vars(built_facts(str(path))), path.name


def test_a_file_without_committed_facts_is_built(tmp_path):
    """An operator's checkpoint (not a shipped file) gets its facts from its own files, and a changed JSON
    is a new file: the committed entry of the shipped one no longer applies."""
    source = ROOT / "assets" / "models" / "shapes_draft"
    for suffix in (".safetensors", ".json"):
        (tmp_path / f"mine{suffix}").write_bytes(source.with_suffix(suffix).read_bytes())
    meta = json.loads((tmp_path / "mine.json").read_text())
    meta["config"]["img_size"] = 64  # a different model from the same weights file
    (tmp_path / "mine.json").write_text(json.dumps(meta))
    assert cards._digest(tmp_path / "mine.safetensors") not in json.loads(FACTS_FILE.read_text())
    assert cards._facts(str(tmp_path / "mine.safetensors")).image_side == 64
