"""How long a request will take on this server, known before it runs.

Each pair is timed once, the first time it is served (:func:`calibrate`): one image, a few AR steps, for
target-only, draft-only and CSD. A request's estimate is its AR steps x images, per run it makes, at those
rates (linear in the batch: batching only makes it faster, so the estimate errs long). A request whose
estimate exceeds the per-request limit is refused by name before it runs; the page shows the estimate
before the click.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.pairs import ModelPair
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker

CALIBRATION_STEPS = 8  # AR steps of a calibration run (a family with fixed AR steps uses its own)
HEADROOM = 0.8  # a request is refused when its estimate passes this share of the time limit


@dataclass(frozen=True)
class Rates:
    """Seconds per image per AR step of each kind of run, at the pair's default head steps."""

    target: float
    draft: float
    csd: float

    def seconds(self, steps: int, images: int, runs: dict[str, int]) -> float:
        """``runs``: how many runs of each kind ("target", "draft", "csd") the request makes."""
        return steps * images * sum(getattr(self, kind) * count for kind, count in runs.items())


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def calibrate(pair: ModelPair) -> Rates:
    """Time one image of each run kind (after an untimed warm-up run of each)."""
    t = pair.traits
    steps = t.fixed_num_steps or min(CALIBRATION_STEPS, pair.num_tokens)
    sampling = SamplingConfig(num_steps=steps, cfg_scale=3.0, cfg_schedule=t.cfg_schedule or "linear")
    condition = list(pair.prompts[:1] or [0])
    runs = {
        "target": lambda: generate(pair.target, condition, [0], sampling),
        "draft": lambda: generate(pair.draft, condition, [0], sampling, Maker.DRAFT),
        "csd": lambda: speculative_generate(pair.target, pair.draft, condition, [0], sampling, CSDConfig(gamma=4)),
    }
    for run in runs.values():
        run()
    return Rates(**{kind: _seconds(run) / steps for kind, run in runs.items()})


def words(seconds: float) -> str:
    """An estimate in words: "about 12 s", "about 2 min"."""
    if seconds < 1:
        return "under 1 s"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"
