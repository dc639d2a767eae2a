"""Benchmark results into the repository: each result's tables (Markdown, :mod:`visualize.tables` and
:mod:`visualize.decisions`) and each frontier's charts beside its JSON, each benchmark's tables into
docs/results.md (the block its family's record in docs/families.json names: ``bench`` for the class pair,
``text-bench``, ``xar-bench`` ... for the others), the class pair's headline and the table of every pair's
benchmark into the README.
A decision (``csd.experiments.decide``) gets its table beside it, and the decisions named together their
summary on stdout, for the README.

    python -m visualize.report bench/results/bench.json bench/results/frontier_b1.json [...]

The measurements themselves (``python -m csd.experiments.bench``) only write JSON; the verdict rule is
:mod:`csd.records.verdict`'s.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

from visualize.decisions import decide_markdown, decide_summary
from visualize.frontier_chart import cost_chart, frontier_chart
from visualize.render import save_png
from visualize.tables import (
    bench_markdown,
    blocks_markdown,
    docs_prefix,
    families_markdown,
    family_docs,
    family_label,
    frontier_markdown,
    headline_markdown,
    prompts_markdown,
    verdict_table,
)

ROOT = Path(__file__).resolve().parents[1]


def compares_views(result: dict) -> bool:
    """A blocks run of the exact block's views in one pass against a pass each (``blocks --compare-views``)."""
    return any(r.get("views") == "per_view" for r in result["rows"])


def method_tab_record(path: Path, root: Path = ROOT) -> bool:
    """A blocks run the Method tab charts and whose table its text holds: one in bench/results/blocks/ itself
    (not a subfolder: another batch, bench/results/blocks/batch1/), not a comparison of the exact block's views,
    or one outside the repository (a run of one's own, pasted into ``root``'s text)."""
    result = json.loads(Path(path).read_text())
    if compares_views(result):
        return False
    blocks = (root / "bench" / "results" / "blocks").resolve()
    where = Path(path).resolve()
    return where.parent == blocks or blocks.parent not in where.parents


def write_tables(path: Path) -> Path:
    """A result's Markdown beside its JSON: bench.md for a benchmark, frontier_b8.md for frontier_b8.json."""
    path = Path(path)
    result = json.loads(path.read_text())
    if result.get("kind") == "blocks":  # csd.experiments.blocks
        out = path.with_suffix(".md")
        what = "The exact block's views, one pass or a pass each" if compares_views(result) else "What a block costs"
        out.write_text(f"# {what}: {family_label(result.get('family'))}\n\n" + blocks_markdown(result))
    elif result.get("kind") == "decide":  # csd.experiments.decide
        out = path.with_suffix(".md")
        out.write_text(decide_markdown(result))
    elif result.get("kind") == "prompts":  # csd.experiments.prompts
        out = path.with_suffix(".md")
        out.write_text("# Prompt following\n\n" + prompts_markdown(result))
    elif "metrics" in result:  # a frontier (csd.experiments.frontier.run_frontier)
        out = path.with_suffix(".md")
        out.write_text(f"# Quality-time frontier, batch {result['batch']}\n\n" + frontier_markdown(result))
    else:
        out = path.with_name("bench.md")
        out.write_text(bench_markdown(result))
    return out


# --- into the repository ----------------------------------------------------------------------------------


def paste_block(path: Path, marker: str, text: str) -> None:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in a Markdown file."""
    new, n = re.subn(
        rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)",
        lambda m: m.group(1) + text.strip() + "\n" + m.group(2),
        path.read_text(),
        flags=re.S,
    )
    if n != 1:
        raise ValueError(f"{path}: expected one <!-- {marker}:start --> ... <!-- {marker}:end --> block, found {n}")
    path.write_text(new)


def update_docs(result: dict, root: Path = ROOT) -> None:
    """A benchmark's Markdown into docs/results.md; the class pair's headline table into the README, and the
    README's table of the families from every committed benchmark."""
    prefix = docs_prefix(result)
    paste_block(root / "docs" / "results.md", f"{prefix}bench", bench_markdown(result).split("\n", 2)[2])
    if prefix == "":
        paste_block(root / "README.md", "headline", headline_markdown(result))
    paste_block(root / "README.md", "families", families_markdown(committed_benches(root)))


def committed_benches(root: Path = ROOT) -> list[dict]:
    """Every pair's committed benchmark: each bench/results/**/bench.json (one per pair's folder)."""
    return [json.loads(p.read_text()) for p in sorted((root / "bench" / "results").rglob("bench.json"))]


def committed_frontiers(root: Path = ROOT) -> list[dict]:
    """Every committed frontier (bench/results/**/frontier_b<batch>.json), in the README's order: by its
    family's rank (its record's ``docs``), then batch."""
    results = [json.loads(p.read_text()) for p in sorted((root / "bench" / "results").rglob("frontier_b*.json"))]
    rank = lambda r: (docs["rank"] if (docs := family_docs(r)) is not None else 99, int(r["batch"]))
    return sorted(results, key=rank)


def update_verdicts(root: Path = ROOT) -> None:
    """The verdict table of every committed frontier into the ``verdicts`` blocks of the README and
    docs/results.md, and each frontier's table into its block there (``frontier-b1``, ``text-frontier-b8``...)."""
    results = committed_frontiers(root)
    for page in (root / "README.md", root / "docs" / "results.md"):
        paste_block(page, "verdicts", verdict_table(results))
    for r in results:
        block = f"{docs_prefix(r)}frontier-b{r['batch']}"
        paste_block(root / "docs" / "results.md", block, frontier_markdown(r))
    subsets = token_cache_runs(root)
    if subsets:
        text = "\n".join(f"Batch {r['batch']}:\n\n{frontier_markdown(r)}" for r in subsets)
        paste_block(root / "docs" / "results.md", "token-cache", text)


def token_cache_runs(root: Path = ROOT) -> list[dict]:
    """The class pair's run of LazyMAR's settings (bench/results/lazymar/frontier_subset_b<batch>.json)."""
    paths = sorted((root / "bench" / "results" / "lazymar").glob("frontier_subset_b*.json"))
    return sorted((json.loads(p.read_text()) for p in paths), key=lambda r: int(r["batch"]))


def report(path: Path, root: Path = ROOT) -> str:
    """One result file: its tables (:func:`write_tables`); a frontier also gets its charts
    (``frontier_b8.png`` and ``frontier_b8_cost.png`` beside ``frontier_b8.json``), a benchmark its docs blocks."""
    result = json.loads(Path(path).read_text())
    table = write_tables(path)
    if result.get("kind") == "decide" or (result.get("kind") == "blocks" and not method_tab_record(path, root)):
        return f"wrote {table}"  # its table only: the docs take its numbers by hand
    if result.get("kind") == "blocks":  # its block in the Method tab's text (docs/how_it_works.md)
        page = root / "docs" / "how_it_works.md"
        paste_block(page, f"{docs_prefix(result)}blocks", blocks_markdown(result))
        return f"wrote {table}; pasted {path} into {page.relative_to(root)}"
    if result.get("kind") == "prompts":  # a text pair's: its family's block in docs/results.md (the text pair's
        block = f"{docs_prefix(result)}prompts" if "family" in result else "text-prompts"  # before it was named)
        paste_block(root / "docs" / "results.md", block, prompts_markdown(result))
        return f"wrote {table}; pasted {path} into docs/results.md"
    if "metrics" in result:  # a frontier (csd.experiments.frontier.run_frontier)
        out = Path(path).with_suffix(".png")
        save_png(frontier_chart(result), out)
        if all("predicted" in r for r in result["rows"]):  # and its cost model's chart
            cost = out.with_name(f"{out.stem}_cost.png")
            save_png(cost_chart(result), cost)
            if (root / "bench" / "results").resolve() in Path(path).resolve().parents:  # a committed one
                update_verdicts(root)
                return f"wrote {table}, {out} and {cost}; the README's verdict table from every committed frontier"
            return f"wrote {table}, {out} and {cost}"
        return f"wrote {table} and {out}"
    update_docs(result, root)
    return f"wrote {table}; pasted {path} into docs/results.md and README.md"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m visualize.report", description=__doc__.split("\n")[0])
    p.add_argument(
        "results", nargs="+", type=Path, help="bench.json / frontier.json / decide.json / prompts.json files"
    )
    decisions = []
    for path in p.parse_args(argv).results:
        print(report(path))
        result = json.loads(path.read_text())
        decisions += [result] if result.get("kind") == "decide" else []
    if decisions:  # their summary, for the README
        print(decide_summary(decisions), end="")


if __name__ == "__main__":
    main()
