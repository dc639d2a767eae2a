"""The README is a front page that tells the truth: its library example runs as written, its headline table
is the class pair's benchmark (bench/results/bench.json) and its table of the families every pair's."""

import json
import re
from pathlib import Path

import pytest
from PIL import Image

from visualize.tables import bench_markdown, headline_markdown

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_library_example_runs_as_written(tmp_path, monkeypatch, capsys, one_thread):
    code = re.search(r"## Using the library\n\n```python\n(.*?)```", README, re.S)[1]
    (tmp_path / "assets").symlink_to(ROOT / "assets")  # the example's relative paths, without writing in the tree
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"target passes: 32 -> \d+ \(\+ \d+ draft passes\)", out), out
    assert "drafted tokens accepted:" in out and "seconds per phase:" in out
    for name in ("target", "csd"):
        with Image.open(tmp_path / f"{name}.png") as img:
            assert img.size == (32, 64)  # two 32x32 images, stacked


def test_the_headline_table_is_the_benchmarks():
    block = re.search(r"<!-- headline:start -->\n(.*?)<!-- headline:end -->", README, re.S)[1]
    assert block == headline_markdown(json.loads((ROOT / "bench" / "results" / "bench.json").read_text()))


def test_the_results_page_holds_the_benchmarks_markdown():
    results = (ROOT / "docs" / "results.md").read_text()
    block = re.search(r"<!-- bench:start -->\n(.*?)<!-- bench:end -->", results, re.S)[1]
    bench_md = (ROOT / "bench" / "results" / "bench.md").read_text()
    assert block.strip() == bench_md.split("\n", 2)[2].strip()  # without its title


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")) + ["README.md"])
def test_relative_links_point_at_files_that_exist(page):
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
        assert (path.parent / target).exists(), f"{page} links to {target}, which does not exist"


def test_the_front_page_is_short():
    """The class pair's table, the verdicts, one table for the four families; the rest is in docs/ (each
    family's own table moved there: 190 lines before). The YAML front matter is the Space's configuration, not
    shown as the page: not counted."""
    page = re.sub(r"\A---\n.*?\n---\n", "", README, flags=re.S)
    assert page != README and len(page.splitlines()) <= 160


def test_update_docs_rewrites_the_blocks_from_a_result(tmp_path):
    """A benchmark goes into its family's block of docs/results.md; the class pair's also into the README's
    headline, and the README's table of the families is remade from the committed benchmarks."""
    import shutil

    from visualize.report import update_docs
    from visualize.tables import bench_markdown, families_markdown

    for name in ("bench.json", "text/bench.json"):  # the committed benchmarks of this tree
        (tmp_path / "bench" / "results" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "bench" / "results" / name, tmp_path / "bench" / "results" / name)
    result, text = (json.loads((ROOT / "bench" / "results" / n).read_text()) for n in ("bench.json", "text/bench.json"))
    (tmp_path / "docs").mkdir()
    blocks = "".join(f"<!-- {b}:start -->\nold\n<!-- {b}:end -->\n" for b in ("bench", "text-bench"))
    (tmp_path / "docs" / "results.md").write_text("a\n" + blocks + "b\n")
    readme = "".join(f"<!-- {b}:start -->\nold\n<!-- {b}:end -->\n" for b in ("headline", "families"))
    (tmp_path / "README.md").write_text(readme)
    update_docs(text, root=tmp_path)  # a text pair's: its docs block and the families' table, not the headline
    page = (tmp_path / "README.md").read_text()
    assert "<!-- headline:start -->\nold\n" in page and families_markdown([result, text]) in page
    assert bench_markdown(text).split("\n", 2)[2].strip() in (tmp_path / "docs" / "results.md").read_text()
    update_docs(result, root=tmp_path)
    assert (tmp_path / "docs" / "results.md").read_text().startswith("a\n<!-- bench:start -->\nS = 32 AR steps")
    assert bench_markdown(result).split("\n", 2)[2].strip() in (tmp_path / "docs" / "results.md").read_text()
    assert headline_markdown(result) in (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="expected one <!-- headline:start -->"):
        update_docs(result, root=tmp_path)


def test_the_where_csd_pays_paragraph_quotes_the_committed_frontiers():
    """Every "(time, FD x)" the README's reading of the verdicts quotes is a row of a committed frontier,
    and its verdict table is theirs."""
    import re

    from visualize.report import committed_frontiers
    from visualize.tables import verdict_table

    results = committed_frontiers(ROOT)
    para = README[README.index("**Where CSD pays**") :]
    para = para[: para.index("![Quality against time")]
    assert verdict_table(results) in para
    reading = para[para.index("<!-- verdicts:end -->") :]
    quoted = re.findall(r"\((\d\.\d\d), FD (\d+\.\d)\)", reading)
    assert len(quoted) >= 2, reading
    rows = {(f"{r['time']:.2f}", f"{r['fd']:.1f}") for res in results for r in res["rows"]}
    for path in ROOT.glob("bench/results/**/decide.json"):  # the paired decisions: a row's time at batch 1
        rows |= {(f"{r['time']['1']:.2f}", f"{r['fd']:.1f}") for r in json.loads(path.read_text())["rows"]}
    for pair in quoted:
        assert pair in rows, pair


def test_the_families_table_is_every_pairs_benchmark():
    """The README's table of the families is families_markdown of the four committed benchmarks (one row each,
    in the docs' order), and docs/results.md holds each one's full Markdown in its family's block."""
    from visualize.report import committed_benches
    from visualize.tables import docs_prefix, families_markdown

    results = committed_benches()
    assert sorted(docs_prefix(r) for r in results) == ["", "causal-", "text-", "xar-"]
    block = re.search(r"<!-- families:start -->\n(.*?)<!-- families:end -->", README, re.S)[1]
    assert block == families_markdown(results)
    rows = [line.split(" | ")[0] for line in block.splitlines()[2:]]
    assert rows == ["| MAR (class pair)", "| Harmon (text pair)", "| xAR (cells pair)", "| NextStep (causal pair)"]
    pages = (ROOT / "docs" / "results.md").read_text()
    for r in results:
        prefix = docs_prefix(r)
        md = re.search(rf"<!-- {prefix}bench:start -->\n(.*?)<!-- {prefix}bench:end -->", pages, re.S)[1]
        assert md.strip() == bench_markdown(r).split("\n", 2)[2].strip(), prefix


def test_a_text_result_with_background_scores_gets_their_column():
    """Results since issue 42 score the prompt's background too: every text table shows it beside colour,
    one cell per sampler, and a result without it (a class pair) gets neither column."""
    result = json.loads((ROOT / "bench" / "results" / "text" / "bench.json").read_text())
    with_bg = result | {
        f"background_accuracy_{k}": 0.25 + i / 10
        for i, k in enumerate(("target", "csd", "fewer", "draft", "csd_unaligned"))
    }
    for table in (headline_markdown(with_bg), bench_markdown(with_bg)):
        lines = [ln for ln in table.splitlines() if ln.startswith("|")]
        assert "| colour accuracy | background accuracy |" in lines[0] or "background accuracy" in table
        widths = {ln.count("|") for ln in lines[:6]}
        assert len(widths) == 1, table  # every row has the header's cells
    assert "| 0.250 |" in headline_markdown(with_bg) and "| 0.550 |" in headline_markdown(with_bg)
    plain = {k: v for k, v in result.items() if not k.startswith(("colour_accuracy_", "background_accuracy_"))}
    assert "colour accuracy" not in headline_markdown(plain) and "background" not in headline_markdown(plain)


def test_the_docs_name_each_family_and_its_blocks_by_its_catalog_entry():
    from csd.models.registry import FAMILIES
    from csd.serving.catalog import entry_of
    from visualize.tables import docs_prefix, family_label

    for arch, family in FAMILIES.items():
        name, docs = family.shared_traits().family, entry_of(arch).docs
        assert family_label(name) == docs.label and docs_prefix({"family": name}) == docs.prefix
        assert family_label(arch) == docs.label  # a result may name its family by its arch too
    assert [entry_of(a).docs.label for a in sorted(FAMILIES, key=lambda a: entry_of(a).docs.rank)] == [
        "MAR (class pair)",
        "Harmon (text pair)",
        "xAR (cells pair)",
        "NextStep (causal pair)",
    ]
    assert family_label("nonesuch") == "?" and family_label(None, "unnamed") == "unnamed"


def test_the_figures_family_records_are_the_catalogs():
    """The figures read no module of the experiments: docs/families.json is their plain record of every
    family, written from the catalog (python -m csd.serving.catalog) and equal to it."""
    from csd.serving.catalog import RECORDS_FILE, records_text
    from visualize.tables import FAMILIES_FILE, committed_families

    assert FAMILIES_FILE == RECORDS_FILE
    assert RECORDS_FILE.read_text() == records_text(), "run python -m csd.serving.catalog"
    assert committed_families()["xAR"] == {
        "arch": "xar",
        "cheap_knob": "head_steps",
        "head_name": "flow",
        "docs": {"label": "xAR (cells pair)", "prefix": "xar-", "rank": 2},
    }


def front_matter() -> dict:
    """The README's YAML front matter: the Hugging Face Space's configuration."""
    import yaml

    return yaml.safe_load(re.match(r"---\n(.*?)\n---\n", README, re.S)[1])


def test_the_space_configuration_names_the_gradio_and_python_the_lock_was_made_with():
    """The Space builds as written: its ``sdk_version`` is the gradio requirements.lock pins and its
    ``python_version`` the Python pip-compile made the lock with (major.minor, from the lock's header); a ZeroGPU
    Space is the suggested hardware, a flavour the Hub knows."""
    from huggingface_hub import SpaceHardware

    config, lock = front_matter(), (ROOT / "requirements.lock").read_text()
    assert config["sdk"] == "gradio" and config["app_file"] == "app.py"
    assert str(config["sdk_version"]) == re.search(r"^gradio==(\S+)$", lock, re.M)[1]
    made_with = re.search(r"^# This file is autogenerated by pip-compile with Python (\d+\.\d+)", lock, re.M)[1]
    assert isinstance(config["python_version"], str) and config["python_version"] == made_with
    hardware = config["suggested_hardware"]
    assert hardware == "zero-a10g" and hardware in {h.value for h in SpaceHardware}
