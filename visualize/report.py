"""Benchmark results into the repository: each frontier's chart beside its JSON, each benchmark's tables
into docs/results.md and its headline into the README (the class pair's blocks, or the text and xAR
pairs' own: ``text-bench`` / ``xar-bench``, ``text-headline`` / ``xar-headline``).

    python -m visualize.report bench/results/bench.json bench/results/frontier_b1.json [...]

The measurements themselves (``python -m csd.experiments.bench``) only write JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

from csd.experiments.bench import docs_prefix, headline_markdown, markdown
from csd.experiments.frontier import frontier_markdown, verdict_table
from visualize.frontier import cost_chart, frontier_chart
from visualize.render import save_png

ROOT = Path(__file__).resolve().parents[1]


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
    """A benchmark's Markdown into docs/results.md and its headline table into the README."""
    prefix = docs_prefix(result)
    paste_block(root / "docs" / "results.md", f"{prefix}bench", markdown(result).split("\n", 2)[2])
    paste_block(root / "README.md", f"{prefix}headline", headline_markdown(result))


FAMILY_ORDER = ("MAR", "Harmon", "xAR")  # the README's rows: class pair, text pair, xAR pair


def committed_frontiers(root: Path = ROOT) -> list[dict]:
    """Every committed frontier (bench/results/**/frontier_b<batch>.json), in the README's order."""
    results = [json.loads(p.read_text()) for p in sorted((root / "bench" / "results").rglob("frontier_b*.json"))]
    rank = lambda r: (FAMILY_ORDER.index(r["family"]) if r.get("family") in FAMILY_ORDER else 99, int(r["batch"]))
    return sorted(results, key=rank)


FRONTIER_PREFIX = {"MAR": "", "Harmon": "text-", "xAR": "xar-"}  # docs/results.md's blocks per family


def update_verdicts(root: Path = ROOT) -> None:
    """The verdict table of every committed frontier into the ``verdicts`` blocks of the README and
    docs/results.md, and each frontier's table into its block there (``frontier-b1``, ``text-frontier-b8``...)."""
    results = committed_frontiers(root)
    for page in (root / "README.md", root / "docs" / "results.md"):
        paste_block(page, "verdicts", verdict_table(results))
    for r in results:
        block = f"{FRONTIER_PREFIX.get(r.get('family'), '')}frontier-b{r['batch']}"
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
    """One result file: a frontier gets its charts (``frontier_b8.png`` and ``frontier_b8_cost.png`` beside
    ``frontier_b8.json``), a benchmark its docs blocks."""
    result = json.loads(Path(path).read_text())
    if "metrics" in result:  # a frontier (csd.experiments.frontier.run_frontier)
        out = Path(path).with_suffix(".png")
        save_png(frontier_chart(result), out)
        if all("predicted" in r for r in result["rows"]):  # and its cost model's chart
            cost = out.with_name(f"{out.stem}_cost.png")
            save_png(cost_chart(result), cost)
            if (root / "bench" / "results").resolve() in Path(path).resolve().parents:  # a committed one
                update_verdicts(root)
                return f"wrote {out} and {cost}; the README's verdict table from every committed frontier"
            return f"wrote {out} and {cost}"
        return f"wrote {out}"
    update_docs(result, root)
    return f"pasted {path} into docs/results.md and README.md"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m visualize.report", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="bench.json / frontier.json files")
    for path in p.parse_args(argv).results:
        print(report(path))


if __name__ == "__main__":
    main()
