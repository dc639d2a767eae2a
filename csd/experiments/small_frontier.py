"""The app's quick frontier: one pair's settings (:mod:`csd.experiments.grid`) at a few images, one run per
setting, run by run so a caller can report progress and stop; class accuracy where the shapes classifier
applies, else the RMS token distance to the target-only run of the same seeds. The benchmark's frontier, timed
side by side over many images, is :mod:`csd.experiments.frontier`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import check_int
from csd.decoding import Generation, StepCallback
from csd.experiments.analysis import image_conditions, run_method
from csd.experiments.grid import Point
from csd.models.tokenizer import PixelTokenizer
from csd.records.verdict import mark_fronts
from csd.serving.jobs import RunStart
from csd.serving.pairs import ModelPair
from csd.shapes.data import CLASS_NAMES
from csd.shapes.metrics import DEFAULT_CLASSIFIER, load_classifier, predict
from csd.shapes.text import prompt_class


def image_scores(pair: ModelPair, labels: Sequence, reference: Generation) -> tuple[str, Callable]:
    """(metric key, per-image scores of a generation).

    Class accuracy (1 where the shapes classifier names the conditioning class, or the class a prompt
    names) where the classifier applies: pixel pairs over the shapes classes. Otherwise the RMS token
    distance to ``reference``, a target-only run with the same seeds: a measure of closeness to the full
    run, not of quality."""
    shapes = pair.class_names == CLASS_NAMES or pair.is_text
    wanted = [prompt_class(c) if isinstance(c, str) else c for c in labels]
    pixels = (
        isinstance(getattr(pair.tokenizer, "inner", pair.tokenizer), PixelTokenizer) and DEFAULT_CLASSIFIER.is_file()
    )
    if pixels and shapes and None not in wanted:
        classifier = load_classifier()
        wanted = np.asarray(wanted)
        return "accuracy", lambda g: (predict(pair.tokenizer.decode(g.tokens), classifier) == wanted).astype(float)
    return "rms", lambda g: (g.tokens - reference.tokens).pow(2).mean(dim=(1, 2)).sqrt().numpy()


class SmallFrontier:
    """The frontier of one pair at a few images (image i: seed + i, class (label + i) mod classes), one
    run per setting; the baseline runs first and again last, and the two runs' difference is reported
    as the timing drift. On a CPU a setting's first run costs about what a second run does (measured
    within the run-to-run noise), so no warm-up pass is spent."""

    def __init__(self, pair: ModelPair, points: list[Point], n_images: int, seed: int = 0, label: int = 0, prompt=None):
        check_int("number of images", n_images, 1)
        if not points or points[0].csd is not None:
            raise ValueError("points must start with the target-only baseline")
        self.pair, self.points = pair, points
        self.labels = image_conditions(pair, n_images, label, prompt)
        self.seeds = [seed + i for i in range(n_images)]
        self._condition = {"prompt": prompt} if pair.is_text else {"label": label}
        self._runs: list = []

    def plan(self) -> dict:
        """Its pair's name and the arguments that make it again: plain, picklable values, for a run in another
        process (the app's GPU call) that takes the points as planned and checked."""
        plan = {"pair_name": self.pair.name, "points": self.points, "n_images": len(self.seeds), "seed": self.seeds[0]}
        return plan | self._condition

    def __len__(self) -> int:
        return len(self.points) + 1

    def _order(self) -> list[Point]:
        return [*self.points, self.points[0]]  # each setting, then the baseline again

    def planned(self) -> list[tuple[SamplingConfig, CSDConfig | None]]:
        """The setting of every run, in order (CSD None: target-only): what an estimate of the cost needs."""
        return [(p.sampling, p.csd) for p in self._order()]

    def steps(self, on_step: Callable[[str], StepCallback | None] = lambda label: None) -> Iterator[RunStart]:
        """Run every setting; yields a :class:`~csd.serving.jobs.RunStart` before each."""
        order = self._order()
        self._runs = []
        for i, p in enumerate(order):
            label = p.name if i < len(self.points) else f"{p.name}, timed again"
            yield RunStart(i, len(order), label)
            self._runs.append(run_method(self.pair, self.labels, self.seeds, p.sampling, p.runner, on_step(label)))

    def result(self) -> dict:
        if len(self._runs) != len(self):
            raise RuntimeError("run every step of the frontier before asking for its result")
        first, last = self._runs[0].seconds, self._runs[-1].seconds
        base = (first + last) / 2
        key, score = image_scores(self.pair, self.labels, self._runs[0].generation)
        n, rows = len(self.labels), []
        for i, (p, run) in enumerate(zip(self.points, self._runs, strict=False)):
            values = score(run.generation)
            rows.append(
                {
                    "name": p.name,
                    "method": p.method,
                    "time": 1.0 if i == 0 else run.seconds / base,  # the baseline: the mean of its two runs
                    key: float(values.mean()),
                    f"{key}_se": float(values.std() / math.sqrt(n)),
                    "target_passes": run.trace.target_passes,
                    "sampling": p.sampling.knob_values(),
                    "csd": None if p.csd is None else p.csd.knob_values(),
                }
            )
        mark_fronts(rows, [key])
        drift = abs(last - first) / base
        return {
            "pair": self.pair.name,
            "weights": self.pair.weights,
            "rows": rows,
            "metrics": [key],
            "n": n,
            "batch": n,
            "repeats": 1,
            "timing": f"one run per setting at batch {n} (the baseline's two runs differ by {100 * drift:.0f}%)",
            "drift": drift,
            "seed": self.seeds[0],
            "label": self.labels[0],
        }
