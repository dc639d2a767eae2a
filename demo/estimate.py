"""How long a request will take on this server, known before it runs.

Each pair is timed once, as the server starts, once it serves (:func:`calibrate`, from :func:`demo.server.warm_up`; a
pair first used otherwise is timed then): target-only, draft-only and CSD at the page's default setting on
that pair, at one image and at :data:`CALIBRATION_BATCH` images. A request's estimate is its AR steps times
the per-step cost of each run it makes, at its batch: linear in the batch between the two measured batches,
and beyond them. A CSD run's step is the timed one with its target and draft passes per AR step replaced by
the request's (its draft length and pre-fill: :func:`csd.records.cost.csd_passes`). Timing the default setting
itself keeps the default's estimate honest (a few AR steps of more tokens each cost more per step than the
default's many steps of few tokens). A request whose estimate exceeds the per-request limit is refused by
name before it runs; the page shows the estimate before the click.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from csd.config import CSDConfig, SamplingConfig
from csd.decoding import StepCallback, sync_cuda
from csd.dispatch import Method
from csd.records.cost import csd_passes
from csd.serving.pairs import ModelPair

CALIBRATION_BATCH = 4  # the second batch timed
# What a timing call may take, asked for before the pair's rates exist (its GPU call's duration, demo.gpu): the
# default setting's three runs at one image and at CALIBRATION_BATCH, after a warm-up (an estimate: 8 s on the
# 2-core CPU for the embedded pairs, docs/space.md for a GPU).
CALIBRATION_SECONDS = 40.0
PROBE_REPEATS = 2  # runs of a probe (demo.reference): the least is taken
PROBE_SECONDS = 10.0  # what a probe's GPU call may take (its three short runs; an estimate)
HEADROOM = 0.8  # a request is refused when its estimate passes this share of the time limit


@dataclass(frozen=True)
class Rates:
    """Seconds per AR step of each kind of run ("target", "draft", "csd") at one image (``one``) and at
    ``batch`` images (``many``), at the timed setting; ``passes``: the timed CSD run's target and draft passes
    per AR step, and ``tokens`` the pair's tokens per image (None: CSD steps are not adjusted);
    ``head_share``: the share of each kind's time in its head chains, at ``head_calls`` network calls per
    chain (the timed setting's; 0: head steps are not adjusted)."""

    one: dict[str, float]
    many: dict[str, float]
    batch: int = CALIBRATION_BATCH
    passes: tuple[float, float] | None = None
    tokens: int = 0
    head_share: dict[str, float] = field(default_factory=dict)
    head_calls: float = 0.0

    def scaled(self, factor: float) -> Rates:
        """The same rates on a machine ``factor`` times as slow (every step's cost times ``factor``)."""
        return replace(
            self, one={k: v * factor for k, v in self.one.items()}, many={k: v * factor for k, v in self.many.items()}
        )

    def step(self, kind: str, images: int) -> float:
        """Seconds of one AR step of a run of ``kind`` over ``images`` images (linear in the batch)."""
        slope = max(0.0, self.many[kind] - self.one[kind]) / (self.batch - 1)
        return self.one[kind] + slope * (images - 1)

    def seconds(
        self,
        sampling: SamplingConfig,
        images: int,
        runs: dict[str, int],
        csd: CSDConfig | None = None,
        head_calls: float = 0.0,
    ) -> float:
        """``runs``: how many runs of each kind the request makes; ``csd``: the CSD runs' setting (None: the
        timed one); ``head_calls``: the network calls of a chain (0: the timed number). A CSD step costs the
        timed one plus a target step per extra target pass per AR step and a draft step per extra draft pass
        (fewer: less), never less than a draft step; a kind's head chains cost in proportion to their calls."""
        steps, cost = sampling.num_steps, {kind: self.step(kind, images) for kind in runs}
        if "csd" in cost and csd is not None and self.passes is not None:
            target, draft = csd_passes(self.tokens, sampling, csd)
            extra = self.step("target", images) * (target / steps - self.passes[0])
            extra += self.step("draft", images) * (draft / steps - self.passes[1])
            cost["csd"] = max(self.step("draft", images), cost["csd"] + extra)
        if head_calls and self.head_calls:
            cost = {
                k: c * (1.0 + self.head_share.get(k, 0.0) * (head_calls / self.head_calls - 1.0))
                for k, c in cost.items()
            }
        return steps * sum(cost[kind] * count for kind, count in runs.items())


def head_calls(pair: ModelPair, sampling: SamplingConfig) -> float:
    """Network calls of a head chain per AR step at ``sampling``, on average over its AR steps (a head-step
    schedule, Heun's two calls a step)."""
    steps = sampling.head_steps_per_step(pair.target.head_steps(sampling.head_steps))
    return sum(sampling.head_calls(h) for h in steps) / len(steps)


def _head_share(trace) -> float:
    """The share of a run's phase time spent in head chains (``*_head`` phases)."""
    total = sum(trace.times.values())
    return sum(v for k, v in trace.times.items() if k.endswith("_head")) / total if total > 0 else 0.0


def cheapest(pair: ModelPair, sampling: SamplingConfig) -> SamplingConfig:
    """``sampling`` at the family's cheapest setting: one AR step (or the fixed ones) at the fewest head steps,
    guided as ``sampling`` is (a warm-up run)."""
    cheap = pair.traits.cheapest()
    return replace(sampling, num_steps=cheap.num_steps, head_steps=cheap.head_steps, cfg_schedule=cheap.cfg_schedule)


def calibrate(
    pair: ModelPair, sampling: SamplingConfig, csd: CSDConfig, condition, on_step: StepCallback | None = None
) -> Rates:
    """Time each run kind at ``sampling`` and ``csd`` (the page's default on this pair, ``condition`` its
    class or prompt) at one image and at :data:`CALIBRATION_BATCH`, after an untimed warm-up of each kind
    at the family's cheapest setting. ``on_step``: every run's AR steps (a stop raised there ends the timing)."""
    steps = sampling.num_steps

    def runs(images: int, s: SamplingConfig) -> dict:
        conditions, seeds = [condition] * images, list(range(images))
        methods = (Method.target(), Method.draft(), Method.speculative(csd))  # keyed by kind: target, draft, csd
        return {m.kind: (lambda m=m: m.run(pair.target, pair.draft, conditions, seeds, s, on_step)) for m in methods}

    for run in runs(1, cheapest(pair, sampling)).values():
        run()
    traces = {}

    def per_step(images: int) -> dict[str, float]:
        out = {}
        for kind, run in runs(images, sampling).items():
            sync_cuda()
            t0 = time.perf_counter()
            traces[kind] = run().trace
            sync_cuda()
            out[kind] = (time.perf_counter() - t0) / steps
        return out

    target, draft = csd_passes(pair.num_tokens, sampling, csd)
    one, many = per_step(1), per_step(CALIBRATION_BATCH)
    share = {kind: _head_share(trace) for kind, trace in traces.items()}  # at the larger batch
    passes = (target / steps, draft / steps)
    return Rates(
        one, many, passes=passes, tokens=pair.num_tokens, head_share=share, head_calls=head_calls(pair, sampling)
    )


def probe(pair: ModelPair, sampling: SamplingConfig, condition, on_step: StepCallback | None = None) -> float:
    """Seconds of the target's run over one image at ``sampling`` (the page's default on the pair, ``condition``
    its class or prompt), the least of :data:`PROBE_REPEATS` after an untimed warm-up at the family's cheapest
    setting: a short measure of how fast this machine runs the pair, against a reference machine's
    (:mod:`demo.reference`). ``on_step`` as in :func:`calibrate`."""
    target = Method.target()
    target.run(pair.target, pair.draft, [condition], [0], cheapest(pair, sampling), on_step)
    seconds = []
    for _ in range(PROBE_REPEATS):
        sync_cuda()
        t0 = time.perf_counter()
        target.run(pair.target, pair.draft, [condition], [0], sampling, on_step)
        sync_cuda()
        seconds.append(time.perf_counter() - t0)
    return min(seconds)


def words(seconds: float) -> str:
    """An estimate in words: "about 12 s", "about 2 min"."""
    if seconds < 1:
        return "under 1 s"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"
