"""Precomputed comparisons: what the page shows at first sight and in its gallery, before a visitor spends
any CPU. Made by the same code as a Generate run (:func:`demo.tabs.generate.compare`), for a few settings
of the embedded pairs, and kept in ``assets/showcase/`` with the weights they were made with; one made
with other weights than those served is not shown.

    python -m demo.precompute          # regenerate (scripts/regenerate_assets.sh runs it)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SHOWCASE_DIR = ROOT / "assets" / "showcase"
IMAGES = ("target", "csd", "map", "draft")

# (name, title, pair, changes to the default controls); the first is the page's first sight.
EXAMPLES = (
    ("circles", "Circles, the default setting", "shapes (embedded)", {"class_name": "circle"}),
    ("stars_fast", "Stars, the fast preset (gamma 16)", "shapes (embedded)", {"class_name": "star", "gamma": 16}),
    (
        "rejections",
        "Hearts, showing rejections (tau_v 1, no alignment)",
        "shapes (embedded)",
        {"class_name": "heart", "tau_v": 1.0, "align": False},
    ),
    ("xar_squares", "Circles from the xAR pair (one cell per AR step)", "shapes, next-cell flow (embedded xAR)", {}),
    (
        "text_red_star",
        "A text prompt (the Harmon-layout pair)",
        "shapes, text prompts (embedded, Harmon layout)",
        {"prompt": "a large red star on a plain white background"},
    ),
)


@dataclass
class Shown:
    """One precomputed comparison: its images (uint8 arrays), the Generate tab's status text, the summary,
    the controls that made it and each run's seconds per phase (empty in a record made without them)."""

    name: str
    title: str
    images: dict[str, np.ndarray]
    stats: str
    summary: dict
    controls: dict
    weights: str
    phases: dict = field(default_factory=dict)

    def composite(self) -> np.ndarray:
        """target | CSD | map, side by side with a white gap: the image a visitor downloads."""
        from demo.views import side_by_side

        return side_by_side([self.images[k] for k in ("target", "csd", "map")])


def load(directory: Path = SHOWCASE_DIR, weights: dict[str, str] | None = None) -> list[Shown]:
    """The precomputed comparisons, in :data:`EXAMPLES` order; with ``weights`` (pair name -> the weights
    served), only those made with the weights served."""
    shown = []
    for name, _, pair_name, _ in EXAMPLES:
        path = directory / f"{name}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        if weights is not None and weights.get(pair_name) != record["weights"]:
            continue
        images = {k: np.asarray(Image.open(directory / f"{name}_{k}.png").convert("RGB")) for k in IMAGES}
        fields = (record["stats"], record["summary"], record["controls"], record["weights"], record.get("phases", {}))
        shown.append(Shown(name, record["title"], images, *fields))
    return shown
