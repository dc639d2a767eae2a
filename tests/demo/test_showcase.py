"""The page's precomputed comparisons: shown only for the weights they were made with, in order, and
each composes into the one image a visitor downloads."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from demo import showcase


def _write(folder, name: str, weights: str, side: int = 16) -> None:
    for k, key in enumerate(showcase.IMAGES):
        Image.fromarray(np.full((side, side, 3), 40 * k, dtype=np.uint8)).save(folder / f"{name}_{key}.png")
    record = {"title": name, "stats": "### Speedup", "summary": {}, "controls": {"seed": 3}, "weights": weights}
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_only_comparisons_made_with_the_served_weights_are_shown(tmp_path):
    (first, _, first_pair, _), (second, _, second_pair, _) = showcase.EXAMPLES[0], showcase.EXAMPLES[3]
    assert first_pair != second_pair
    _write(tmp_path, first, "sha256:served")
    _write(tmp_path, second, "sha256:old")
    shown = showcase.load(tmp_path, weights={first_pair: "sha256:served", second_pair: "sha256:new"})
    assert [s.name for s in shown] == [first]
    assert [s.name for s in showcase.load(tmp_path)] == [first, second]  # no filter: every file, in order
    composite = shown[0].composite()
    assert composite.shape == (16, 3 * 16 + 2 * 8, 3)  # target | CSD | map with white gaps
    assert (composite[:, 16:24] == 255).all()


def test_the_committed_comparisons_match_the_shipped_weights():
    from csd.serving.pairs import discover

    served = {s.name: s.weights for s in discover(None)}
    shown = showcase.load(weights=served)
    assert shown and shown[0].name == showcase.EXAMPLES[0][0]  # the first sight is there
    assert len(shown) == len([e for e in showcase.EXAMPLES if e[2] in served])  # regenerated with the weights


def test_every_committed_comparison_shows_where_its_time_went():
    """The first sight has no empty pane: each committed comparison keeps every run's seconds per phase, which
    the Generate tab draws as the time chart a click draws (each run's phases within its wall time)."""
    from demo.views import time_figure

    shown = showcase.load()
    assert shown
    for s in shown:
        assert set(s.phases) == {"target-only", "CSD", "draft-only"}, s.name
        for run, phases in s.phases.items():
            assert phases and 0.0 < sum(phases.values()) <= s.summary["seconds"][run] * 1.001, (s.name, run)
        figure = time_figure(s.phases, s.summary)
        assert len(figure.data) >= 2 and "Speedup" in figure.layout.title.text
