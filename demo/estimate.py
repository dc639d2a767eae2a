"""How long a request will take on this server, known before it runs.

Each pair is timed once, before the server serves (:func:`calibrate`, from :func:`demo.server.warm_up`; a
pair first used otherwise is timed then): target-only, draft-only and CSD at the page's default setting on
that pair, at one image and at :data:`CALIBRATION_BATCH` images. A request's estimate is its AR steps times
the per-step cost of each run it makes, at its batch: linear in the batch between the two measured batches,
and beyond them. A CSD run's step is the timed one with its target and draft passes per AR step replaced by
the request's (its draft length and pre-fill: :func:`csd.cost.csd_passes`). Timing the default setting
itself keeps the default's estimate honest (a few AR steps of more tokens each cost more per step than the
default's many steps of few tokens). A request whose estimate exceeds the per-request limit is refused by
name before it runs; the page shows the estimate before the click.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from csd.config import CSDConfig, SamplingConfig
from csd.cost import csd_passes
from csd.experiments.pairs import ModelPair
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker

CALIBRATION_BATCH = 4  # the second batch timed
HEADROOM = 0.8  # a request is refused when its estimate passes this share of the time limit


@dataclass(frozen=True)
class Rates:
    """Seconds per AR step of each kind of run ("target", "draft", "csd") at one image (``one``) and at
    ``batch`` images (``many``), at the timed setting; ``passes``: the timed CSD run's target and draft passes
    per AR step, and ``tokens`` the pair's tokens per image (None: CSD steps are not adjusted)."""

    one: dict[str, float]
    many: dict[str, float]
    batch: int = CALIBRATION_BATCH
    passes: tuple[float, float] | None = None
    tokens: int = 0

    def step(self, kind: str, images: int) -> float:
        """Seconds of one AR step of a run of ``kind`` over ``images`` images (linear in the batch)."""
        slope = max(0.0, self.many[kind] - self.one[kind]) / (self.batch - 1)
        return self.one[kind] + slope * (images - 1)

    def seconds(self, steps: int, images: int, runs: dict[str, int], csd: CSDConfig | None = None) -> float:
        """``runs``: how many runs of each kind the request makes; ``csd``: the CSD runs' setting (None: the
        timed one). A CSD step costs the timed one plus a target step per extra target pass per AR step and a
        draft step per extra draft pass (fewer: less), never less than a draft step."""
        cost = {kind: self.step(kind, images) for kind in runs}
        if "csd" in cost and csd is not None and self.passes is not None:
            target, draft = csd_passes(self.tokens, steps, csd.gamma, csd.prefill, csd.gamma_schedule)
            extra = self.step("target", images) * (target / steps - self.passes[0])
            extra += self.step("draft", images) * (draft / steps - self.passes[1])
            cost["csd"] = max(self.step("draft", images), cost["csd"] + extra)
        return steps * sum(cost[kind] * count for kind, count in runs.items())


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def calibrate(pair: ModelPair, sampling: SamplingConfig, csd: CSDConfig, condition) -> Rates:
    """Time each run kind at ``sampling`` and ``csd`` (the page's default on this pair, ``condition`` its
    class or prompt) at one image and at :data:`CALIBRATION_BATCH`, after an untimed warm-up of each kind
    at the family's cheapest setting."""
    steps = sampling.num_steps

    def runs(images: int, s: SamplingConfig) -> dict:
        conditions, seeds = [condition] * images, list(range(images))
        return {
            "target": lambda: generate(pair.target, conditions, seeds, s),
            "draft": lambda: generate(pair.draft, conditions, seeds, s, Maker.DRAFT),
            "csd": lambda: speculative_generate(pair.target, pair.draft, conditions, seeds, s, csd),
        }

    cheap = pair.traits.cheapest()  # one AR step (or the fixed ones) at the fewest head steps, guided as timed
    warm = replace(sampling, num_steps=cheap.num_steps, head_steps=cheap.head_steps, cfg_schedule=cheap.cfg_schedule)
    for run in runs(1, warm).values():
        run()
    per_step = lambda images: {kind: _seconds(run) / steps for kind, run in runs(images, sampling).items()}
    target, draft = csd_passes(pair.num_tokens, steps, csd.gamma, csd.prefill, csd.gamma_schedule)
    one, many = per_step(1), per_step(CALIBRATION_BATCH)
    return Rates(one, many, passes=(target / steps, draft / steps), tokens=pair.num_tokens)


def words(seconds: float) -> str:
    """An estimate in words: "about 12 s", "about 2 min"."""
    if seconds < 1:
        return "under 1 s"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"
