"""What the experiments and the reports know of each model family, beside its row in the model table
(:data:`csd.models.registry.FAMILIES`, which holds only what a model needs to load and run): the pairs it
offers (:class:`PairSpec`: embedded, official, untrained), how it runs at the published sizes
(:class:`~csd.models.spec.PaperScale`, built in the family's own ``paper.py``) and where its embedded pair's
results stand in the docs (:class:`ResultsDocs`).

:data:`CATALOG` has one :class:`Entry` per family, by its arch; :func:`add` and :func:`remove` an entry of a
family defined elsewhere (the tests'). The figures read no module of the experiments: what they need of a
family (its label, its docs blocks, what its cheap baseline cuts) is a plain record, docs/families.json
(:func:`report_records`), which ``python -m csd.serving.catalog`` writes from this table (a test keeps the
two equal).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from csd.core.checks import check_choice
from csd.models.harmon import paper as harmon_paper
from csd.models.mar import paper as mar_paper
from csd.models.registry import FAMILIES
from csd.models.spec import PaperScale
from csd.models.xar import paper as xar_paper

PAIR_KINDS = ("embedded", "official", "random")
RECORDS_FILE = Path(__file__).resolve().parents[2] / "docs" / "families.json"


@dataclass(frozen=True)
class PairSpec:
    """A target/draft pair a family offers: its name (as the app lists it), the family's ``arch``, the
    target's and the draft's names, and its kind:

    * "embedded": project files ``<target>.safetensors`` / ``<draft>.safetensors`` in ``assets/models``;
    * "official": presets loaded from official checkpoints (the app) or built at the published sizes
      (:mod:`csd.experiments.paper_scale`): ``key`` says which of the paper's pairs ("H/B": the huge target,
      "L/B": the large one, both drafted by the base model), ``paper_name`` is its name in the paper-scale
      report, ``published`` the paper's speed-ups, ``prompts`` a text pair's example prompts;
    * "random": untrained presets, for tests and for a server with nothing installed.
    """

    name: str
    family: str
    target: str
    draft: str
    kind: str
    key: str = ""
    paper_name: str = ""
    published: str = ""
    prompts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice("PairSpec.kind", self.kind, PAIR_KINDS)

    @property
    def tag(self) -> str:
        """How an untrained pair's weights are recorded (with their seed): its name without "(untrained)",
        hyphenated ("random xAR (untrained)" -> "random-xar")."""
        return self.name.removesuffix(" (untrained)").lower().replace(" ", "-")


@dataclass(frozen=True)
class ResultsDocs:
    """Where a family's embedded pair stands in the results pages (:mod:`visualize.report`): ``label`` names
    its rows in their tables, ``prefix`` its blocks in docs/results.md (``<prefix>bench``,
    ``<prefix>frontier-b<batch>``; the class pair's, prefix "", also the README's ``headline``), ``rank`` its
    place among the families' rows."""

    label: str
    prefix: str
    rank: int


@dataclass(frozen=True)
class Entry:
    """A family's entry: the pairs it offers (the conformance test needs its "random" one), how it runs at
    the published sizes (None: not timed there) and where its embedded pair's results stand in the docs
    (None: nowhere)."""

    pairs: tuple[PairSpec, ...] = ()
    paper: PaperScale | None = None
    docs: ResultsDocs | None = None


CATALOG: dict[str, Entry] = {}


def add(arch: str, entry: Entry) -> Entry:
    """Add a family's entry (an arch already there, or a pair of another family, is an error naming it)."""
    if arch in CATALOG:
        raise ValueError(f"family {arch!r} has a catalog entry already")
    for pair in entry.pairs:
        if pair.family != arch:
            raise ValueError(f"pair {pair.name!r} of family {arch!r} names family {pair.family!r}")
    CATALOG[arch] = entry
    return entry


def remove(arch: str) -> None:
    """Remove a family's entry (a family added for a while, e.g. by a test)."""
    if arch not in CATALOG:
        raise ValueError(f"family {arch!r} has no catalog entry; entries: {tuple(CATALOG)}")
    del CATALOG[arch]


def entry_of(arch: str) -> Entry:
    """A family's entry (an empty one for a family without: no pairs, not timed, in no docs)."""
    return CATALOG.get(arch, Entry())


def pair_specs(kind: str) -> list[PairSpec]:
    """Every registered family's pairs of one kind ("embedded", "official", "random"), in the table's order."""
    return [pair for arch in FAMILIES for pair in entry_of(arch).pairs if pair.kind == kind]


def report_records() -> dict[str, dict]:
    """What the figures need of every registered family, by the name its results record it by (its traits'
    family): its arch, what its cheap baseline cuts (:attr:`csd.family.FamilyTraits.cheap_knob`), what its
    head's steps are called, and where its results stand in the docs (None: nowhere)."""
    records = {}
    for arch, family in FAMILIES.items():
        entry = entry_of(arch)
        records[family.shared_traits().family] = {
            "arch": arch,
            "cheap_knob": family.shared_traits().cheap_knob,
            "head_name": entry.paper.head_name if entry.paper is not None else "head",
            "docs": None if entry.docs is None else asdict(entry.docs),
        }
    return records


def records_text() -> str:
    """:func:`report_records` as docs/families.json holds them."""
    return json.dumps(report_records(), indent=2) + "\n"


add(
    "mar",
    Entry(
        pairs=(
            PairSpec("shapes (embedded)", "mar", "shapes_target", "shapes_draft", "embedded"),
            # Table 1 of the paper (MAR, ImageNet 256, gamma 32), as docs/DESIGN.md records it.
            PairSpec(
                "MAR-H / MAR-B (ImageNet)",
                "mar",
                "mar_huge",
                "mar_base",
                "official",
                key="H/B",
                paper_name="MAR-H / MAR-B",
                published="1.44x at batch 1, 2.17x at 128, 2.33x at 256 (gamma 32)",
            ),
            PairSpec(
                "MAR-L / MAR-B (ImageNet)",
                "mar",
                "mar_large",
                "mar_base",
                "official",
                key="L/B",
                paper_name="MAR-L / MAR-B",
                published="1.18x at batch 1 to 1.49x at 256 (gamma 32)",
            ),
            PairSpec("random (untrained)", "mar", "random_target", "random_draft", "random"),
        ),
        paper=mar_paper.PAPER,
        docs=ResultsDocs("MAR (class pair)", "", 0),
    ),
)
add(
    "xar",
    Entry(
        pairs=(
            PairSpec(
                "shapes, next-cell flow (embedded xAR)", "xar", "shapes_xar_target", "shapes_xar_draft", "embedded"
            ),
            PairSpec("xAR-H / xAR-B (ImageNet)", "xar", "xar_huge", "xar_base", "official", "H/B", "xAR-H / xAR-B"),
            PairSpec("xAR-L / xAR-B (ImageNet)", "xar", "xar_large", "xar_base", "official", "L/B", "xAR-L / xAR-B"),
            PairSpec("random xAR (untrained)", "xar", "random_xar_target", "random_xar_draft", "random"),
        ),
        paper=xar_paper.PAPER,
        docs=ResultsDocs("xAR (cells pair)", "xar-", 2),
    ),
)
add(
    "harmon",
    Entry(
        pairs=(
            PairSpec(
                "shapes, text prompts (embedded, Harmon layout)",
                "harmon",
                "shapes_text_target",
                "shapes_text_draft",
                "embedded",
            ),
            # Harmon-1.5B's generator is MAR-H and Harmon-0.5B's MAR-B: the family's one pair, its H/B.
            PairSpec(
                "Harmon-1.5B / Harmon-0.5B (text)",
                "harmon",
                "harmon_1.5b",
                "harmon_0.5b",
                "official",
                key="H/B",
                paper_name="Harmon-1.5B / Harmon-0.5B",
                prompts=("a red fox in the snow", "a lighthouse at dusk, oil painting", "a bowl of ramen, top view"),
            ),
            PairSpec("random text (untrained)", "harmon", "random_text_target", "random_text_draft", "random"),
        ),
        paper=harmon_paper.PAPER,
        docs=ResultsDocs("Harmon (text pair)", "text-", 1),
    ),
)
add(
    "nextstep",
    Entry(
        pairs=(
            PairSpec(
                "shapes, text prompts, causal (embedded, NextStep layout)",
                "nextstep",
                "shapes_causal_target",
                "shapes_causal_draft",
                "embedded",
            ),
            # No draft is published: the official target beside a draft of the user's, in its layout.
            PairSpec(
                "NextStep-1-Large / your draft (text)",
                "nextstep",
                "nextstep_1_large",
                "nextstep_draft",
                "official",
                prompts=("a red fox in the snow", "a lighthouse at dusk, oil painting", "a bowl of ramen, top view"),
            ),
            PairSpec(
                "random causal (untrained)", "nextstep", "random_nextstep_target", "random_nextstep_draft", "random"
            ),
        ),
        docs=ResultsDocs("NextStep (causal pair)", "causal-", 3),
    ),
)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m csd.serving.catalog", description="Write the families' plain record for the figures."
    )
    p.add_argument("--out", type=Path, default=RECORDS_FILE, help="where (default: docs/families.json)")
    args = p.parse_args(argv)
    args.out.write_text(records_text())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
