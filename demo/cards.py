"""Model cards: what a visitor should know of a pair where they choose it (one line: resolution, what it
is conditioned on, its measured accuracy) and in full (sizes, training, known limits, links), from the
pair's files and the committed benchmark results, not from hand-written numbers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import torch

from csd.experiments.pairs import EMBEDDED_DIR, PairSource, pair_specs
from csd.models.registry import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
# The committed benchmark of each shipped target (by its file in assets/models).
BENCH = {
    "shapes_target": "bench/results",
    "shapes_text_target": "bench/results/text",
    "shapes_xar_target": "bench/results/xar",
}
PAPER = "https://arxiv.org/abs/2411.11925"


@cache
def _parameters(path: str) -> int | None:
    """Parameters of a project file's model, counted on the meta device from its JSON (no weights read)."""
    json_path = Path(path).with_suffix(".json")
    try:
        meta = json.loads(json_path.read_text())
        family = FAMILIES[meta["arch"]]
        with torch.device("meta"):
            model = family.make(family.config.from_dict(meta["config"]), meta)
        return sum(p.numel() for p in model.parameters())
    except (OSError, KeyError, ValueError, TypeError):
        return None


@cache
def _bench(target: str) -> dict | None:
    folder = BENCH.get(target)
    path = ROOT / folder / "bench.json" if folder else None
    return json.loads(path.read_text()) if path and path.is_file() else None


def _millions(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f}M"


def model_line(source: PairSource) -> str:
    """One line under the pair's name: resolution, conditions, what its target gets right (benchmark)."""
    spec = next((s for s in pair_specs("embedded") if s.name == source.name), None)
    if spec is None:
        kind = "text prompts" if source.is_text else f"{len(source.class_names)} classes"
        return f"*{source.name}: {kind}; {source.weights}.*"
    t, d = (_parameters(str(EMBEDDED_DIR / f"{n}.safetensors")) for n in (spec.target, spec.draft))
    what = "prompts over a 34-word caption vocabulary" if source.is_text else f"{len(source.class_names)} shape classes"
    unit = f", {source.traits.fixed_num_steps} cells" if source.traits.fixed_num_steps else ""
    line = f"32 x 32 px{unit}, {what}; target {_millions(t)} / draft {_millions(d)} parameters"
    bench = _bench(spec.target)
    if bench is not None:
        line += f"; target-only class accuracy {bench['accuracy_target']:.2f}"
        if "colour_accuracy_target" in bench:
            line += f", colour accuracy {bench['colour_accuracy_target']:.2f}"
        line += f" (draft {bench['accuracy_draft']:.2f})"
    return f"*{line}.*"


def card_markdown(sources: list[PairSource]) -> str:
    """The model card of every served pair, for the How it works tab."""
    lines = [
        "### The models served here",
        "",
        f"Continuous speculative decoding: Wang et al., [arXiv 2411.11925]({PAPER}). The embedded pairs were "
        "trained on a 2-core CPU for this demo (assets/models/TRAINING.md records how); they draw procedural "
        "32 x 32 shapes, not photographs.",
        "",
    ]
    for source in sources:
        lines.append(f"* **{source.name}**: {model_line(source).strip('*')}")
    lines += [
        "",
        "Known limits: the embedded targets are small (about 10M parameters) and trained for hours, not days; "
        "their images are recognisable shapes with soft edges, and the accuracies above are measured by a "
        "classifier trained on the same generator. Speed figures are a 2-core CPU's and say nothing of a GPU.",
    ]
    return "\n".join(lines)
