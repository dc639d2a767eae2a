"""Model cards: what a visitor should know of a pair where they choose it (one line: resolution, what it
is conditioned on, its measured accuracy) and in full (sizes, training, known limits, links), from the
pair's files and the committed benchmark results, not from hand-written numbers."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from csd.models.checkpoint import file_digest
from csd.models.registry import FAMILIES
from csd.serving.pairs import EMBEDDED_DIR, PairSource, pair_specs

ROOT = Path(__file__).resolve().parents[1]
# The committed benchmark of each shipped target (by its file in assets/models).
BENCH = {
    "shapes_target": "bench/results",
    "shapes_text_target": "bench/results/text",
    "shapes_xar_target": "bench/results/xar",
    "shapes_causal_target": "bench/results/causal",
}
PAPER = "https://arxiv.org/abs/2411.11925"
# The facts of the shipped models, keyed by the digest of each model's weights and JSON (`python -m demo.cards`
# writes it): building a model on the meta device to count its parameters imports its framework (Harmon's:
# transformers, seconds), which the page would otherwise wait for. A file whose digest is not there is built;
# tests/demo/test_cards.py keeps the committed facts equal to the built ones.
FACTS_FILE = ROOT / "assets" / "models" / "facts.json"


@dataclass(frozen=True)
class Facts:
    """What a project file's model is, read from its JSON (the model built on the meta device, no weights)."""

    parameters: int
    image_side: int  # pixels: the token grid of RGB patches it draws
    words: int  # caption vocabulary of a text model (0: class-conditional)


def built_facts(path: str) -> Facts | None:
    """The facts of a project file's model, built on the meta device from its JSON (no weights read)."""
    json_path = Path(path).with_suffix(".json")
    try:
        meta = json.loads(json_path.read_text())
        family = FAMILIES[meta["arch"]]
        with torch.device("meta"):
            model = family.make(family.config.from_dict(meta["config"]), meta)
        per_row = model.traits.tokens_per_row
        patch = math.isqrt(model.token_dim // per_row // 3)  # an RGB patch per token
        side = math.isqrt(model.seq_len * per_row) * patch
        words = len(meta.get("tokenizer", {}).get("words", ()))
        return Facts(sum(p.numel() for p in model.parameters()), side, words)
    except (OSError, KeyError, ValueError, TypeError):
        return None


@cache
def _committed_facts() -> dict[str, dict]:
    try:
        return json.loads(FACTS_FILE.read_text())
    except (OSError, ValueError):
        return {}


@cache
def _facts(path: str) -> Facts | None:
    """The facts of a project file's model: the committed ones where the file is a shipped one (by digest),
    else :func:`built_facts`."""
    try:
        known = _committed_facts().get(_digest(Path(path)))
    except OSError:
        known = None
    return Facts(**known) if known is not None else built_facts(path)


def _digest(path: Path) -> str:
    """The digest of a project file's weights and JSON: what its facts are read from."""
    return file_digest(path, path.with_suffix(".json"))


def write_facts(paths: list[Path]) -> dict[str, dict]:
    """Build the facts of ``paths`` and write them to :data:`FACTS_FILE`, keyed by file digest."""
    facts = {_digest(p): vars(built_facts(str(p))) for p in sorted(paths)}
    FACTS_FILE.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    return facts


@cache
def _bench(target: str) -> dict | None:
    folder = BENCH.get(target)
    path = ROOT / folder / "bench.json" if folder else None
    return json.loads(path.read_text()) if path and path.is_file() else None


def _millions(facts: Facts | None) -> str:
    return "?" if facts is None else f"{facts.parameters / 1e6:.1f}M"


def _embedded(source: PairSource) -> tuple[Facts | None, Facts | None, str] | None:
    """The facts of an embedded pair's target and draft files, and its target's name; None for other pairs."""
    spec = next((s for s in pair_specs("embedded") if s.name == source.name), None)
    if spec is None:
        return None
    t, d = (_facts(str(EMBEDDED_DIR / f"{n}.safetensors")) for n in (spec.target, spec.draft))
    return t, d, spec.target


def model_line(source: PairSource) -> str:
    """One line under the pair's name: resolution, conditions, what its target gets right (benchmark)."""
    embedded = _embedded(source)
    if embedded is None or embedded[0] is None:
        kind = "text prompts" if source.is_text else f"{len(source.class_names)} classes"
        return f"*{source.name}: {kind}; {source.weights}.*"
    t, d, target = embedded
    classes = f"{len(source.class_names)} shape classes"
    what = f"prompts over a {t.words}-word caption vocabulary" if source.is_text else classes
    unit = f", {source.traits.fixed_num_steps} cells" if source.traits.fixed_num_steps else ""
    line = f"{t.image_side} x {t.image_side} px{unit}, {what}; target {_millions(t)} / draft {_millions(d)} parameters"
    bench = _bench(target)
    if bench is not None:
        line += f"; target-only class accuracy {bench['accuracy_target']:.2f}"
        for key, name in (("colour_accuracy", "colour"), ("background_accuracy", "background")):
            if f"{key}_target" in bench:
                line += f", {name} accuracy {bench[f'{key}_target']:.2f}"
        line += f" (draft {bench['accuracy_draft']:.2f})"
    return f"*{line}.*"


def card_markdown(sources: list[PairSource]) -> str:
    """The model card of every served pair, for the Method tab; its numbers come from the pairs' files and
    the committed benchmarks."""
    targets = [e[0] for e in map(_embedded, sources) if e is not None and e[0] is not None]
    sides = sorted({f"{t.image_side} x {t.image_side}" for t in targets})
    millions = sorted(t.parameters / 1e6 for t in targets)
    threads = sorted({b["settings"]["threads"] for b in map(_bench, BENCH) if b is not None})
    lines = [
        "### The models served here",
        "",
        f"Continuous speculative decoding: Wang et al., [arXiv 2411.11925]({PAPER}). The embedded pairs were "
        "trained on a CPU for this demo (assets/models/TRAINING.md records how); they draw procedural "
        f"{' or '.join(sides) or 'small'} shapes, not photographs.",
        "",
    ]
    for source in sources:
        lines.append(f"* **{source.name}**: {model_line(source).strip('*')}")
    size = f" ({millions[0]:.1f}-{millions[-1]:.1f}M parameters)" if millions else ""
    timed = f" ({' or '.join(map(str, threads))} thread{'s' * (threads != [1])})" if threads else ""
    lines += [
        "",
        f"Known limits: the embedded targets are small{size} and trained for hours, not days; "
        "their images are recognisable shapes with soft edges, and the accuracies above are measured by a "
        f"classifier trained on the same generator. Speed figures are a CPU's{timed} and say nothing of a GPU.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # regenerate the shipped models' facts (scripts/regenerate_assets.sh does)
    print(json.dumps(write_facts(sorted(EMBEDDED_DIR.glob("*.safetensors"))), indent=1))
