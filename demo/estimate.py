"""How long a request will take on this server, known before it runs.

Each pair is timed once, the first time it is served (:func:`calibrate`): a few AR steps of target-only,
draft-only and CSD, at one image and at :data:`CALIBRATION_BATCH` images. A request's estimate is its AR
steps times the per-step cost at its batch, per run it makes: the cost of a step is linear in the batch
between the two measured batches, and beyond them (so a batch larger than the calibration's errs long). A
request whose estimate exceeds the per-request limit is refused by name before it runs; the page shows the
estimate before the click.
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
CALIBRATION_BATCH = 4  # the second batch timed
CALIBRATION_GAMMA = 4  # the draft length of the timed CSD runs
HEADROOM = 0.8  # a request is refused when its estimate passes this share of the time limit


@dataclass(frozen=True)
class Rates:
    """Seconds per AR step of each kind of run ("target", "draft", "csd") at one image (``one``) and at
    ``batch`` images (``many``), at the pair's default head steps."""

    one: dict[str, float]
    many: dict[str, float]
    batch: int = CALIBRATION_BATCH

    def step(self, kind: str, images: int) -> float:
        """Seconds of one AR step of a run of ``kind`` over ``images`` images (linear in the batch)."""
        slope = max(0.0, self.many[kind] - self.one[kind]) / (self.batch - 1)
        return self.one[kind] + slope * (images - 1)

    def seconds(self, steps: int, images: int, runs: dict[str, int], gamma: int = CALIBRATION_GAMMA) -> float:
        """``runs``: how many runs of each kind the request makes. A CSD run's target passes per AR step are
        about 1 / gamma: its step costs the timed one plus the target's step times (1/gamma - 1/4)."""
        cost = {kind: self.step(kind, images) for kind in runs}
        if "csd" in cost:
            target = self.step("target", images)
            cost["csd"] = max(self.step("draft", images), cost["csd"] + target * (1 / gamma - 1 / CALIBRATION_GAMMA))
        return steps * sum(cost[kind] * count for kind, count in runs.items())


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def calibrate(pair: ModelPair) -> Rates:
    """Time each run kind at one image and at :data:`CALIBRATION_BATCH` (after an untimed warm-up run)."""
    t = pair.traits
    steps = t.fixed_num_steps or min(CALIBRATION_STEPS, pair.num_tokens)
    sampling = SamplingConfig(num_steps=steps, cfg_scale=3.0, cfg_schedule=t.cfg_schedule or "linear")

    def runs(images: int) -> dict:
        condition, seeds = list(pair.prompts[:1] or [0]) * images, list(range(images))
        csd = CSDConfig(gamma=CALIBRATION_GAMMA)
        return {
            "target": lambda: generate(pair.target, condition, seeds, sampling),
            "draft": lambda: generate(pair.draft, condition, seeds, sampling, Maker.DRAFT),
            "csd": lambda: speculative_generate(pair.target, pair.draft, condition, seeds, sampling, csd),
        }

    for run in runs(1).values():
        run()
    per_step = lambda images: {kind: _seconds(run) / steps for kind, run in runs(images).items()}
    return Rates(per_step(1), per_step(CALIBRATION_BATCH))


def words(seconds: float) -> str:
    """An estimate in words: "about 12 s", "about 2 min"."""
    if seconds < 1:
        return "under 1 s"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"
