"""The app object every tab shares: the model store and the limits (read-only), the controls, the
precomputed results, each pair's timing (:mod:`demo.timings`) and stoppable model runs (:mod:`demo.runs`):
each request's runs are one GPU call that runs a job, followed from the main process, which keeps the state
(each pair's rates, the history)."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterator

import numpy as np
import torch

from csd.family import FamilyTraits
from csd.models.tokenizer import to_uint8
from csd.records.panel_data import Panels
from csd.serving.jobs import Job
from csd.serving.pairs import ModelPair, PairStore
from demo.controls import declare_controls, preset_values
from demo.errors import refuse
from demo.estimate import CALIBRATION_SECONDS, HEADROOM, Rates, calibrate, words
from demo.faults import Load
from demo.gpu import Done, GpuCalls, task
from demo.limits import Limits
from demo.requests import Request, build_request
from demo.runs import DEVICE, ModelRuns, run_to_end
from demo.timings import WAIT_SECONDS, PairTimings

PRECISION = "bfloat16" if DEVICE.type == "cuda" else "float32"  # backbone precision; heads stay float32
DECODE_SECONDS = 2.0  # what a decode call asks for, before the margin (an estimate: KL-16 on 8 images)


def fixed_controls(traits: FamilyTraits) -> dict:
    """The controls a pair fixes, by control name: its AR steps (xAR: one per cell) and its CFG ramp."""
    fixed = {"ar_steps": traits.fixed_num_steps, "cfg_schedule": traits.cfg_schedule}
    return {name: value for name, value in fixed.items() if value}


def pair_defaults(app: App, controls: dict, pair_name: str) -> dict:
    """``controls`` on another pair: the controls it fixes (:func:`fixed_controls`), a class it has. The one
    place a pair's fixed knobs are set."""
    source = app.store.source(pair_name)
    controls = controls | {"pair_name": pair_name} | fixed_controls(source.traits)
    if not source.is_text and controls.get("class_name") not in source.class_names:
        controls["class_name"] = source.class_names[0]
    return controls


class App(ModelRuns):
    """What the handlers share. Holds only read-only things: the model store and the limits. Nothing a
    visitor sends names a file, a directory or a repository: pairs are chosen by name among those the
    operator installed before serving. Its model runs are :class:`~demo.runs.ModelRuns`'; each pair's rates
    are ``timings`` (:class:`~demo.timings.PairTimings`), asked for through the methods below."""

    def __init__(
        self,
        store: PairStore,
        limits: Limits,
        panels: Panels | None = None,
        fronts: dict | None = None,
        gpu: GpuCalls | None = None,
    ) -> None:
        self.store, self.limits, self.panels = store, limits, panels
        # Every model run goes through this one GPU-decorated function (demo.gpu), as a registered task.
        self.gpu = gpu or GpuCalls(self, limits.gpu_seconds)
        # The benchmark's frontiers of the pairs served: pair name -> batch -> result (read-only).
        self.fronts: dict[str, dict[int, dict]] = fronts or {}
        self.controls = declare_controls(store, limits)
        # The latest model runs: status ("done", "stopped", "over time", "error"), AR steps run, seconds.
        self.history: deque[dict] = deque(maxlen=64)
        # Each pair's rates, timed in a GPU call at its default setting the first time they are asked for.
        self.timings = PairTimings(store, self._time_pair)
        self._sides: dict[str, int] = {}  # per pair, its images' side in pixels
        self.streams: Counter = Counter()  # open result streams per session (demo.guard.Guard counts them)
        self.gone = 0  # requests not run because their client had gone
        # The page's control components (the Generate tab sets them): every request's values are checked
        # against them, for events that take raw values (preprocess=False) as for any other caller.
        self.components: dict = {}

    def committed_front(self, pair: str | None, batch: int) -> dict | None:
        """The benchmark's frontier of ``pair`` (default: the default pair) timed at ``batch``, or None."""
        pair = self.store.names[0] if pair is None and self.store.names else pair
        return self.fronts.get(pair, {}).get(batch)

    def check_client(self, request, wait: float = 2.0) -> None:
        """Refuse to start a run whose client is not listening for its result (it joined the queue and left,
        or never opened the stream): it would hold the queue for nobody. ``request``: the handler's
        gr.Request (None when called in-process)."""
        session = getattr(request, "session_hash", None)
        if session is None:
            return
        deadline = time.monotonic() + wait  # the stream opens just after joining the queue
        while self.streams.get(session, 0) <= 0:
            if time.monotonic() > deadline:
                self.gone += 1
                raise refuse("the client that asked for this run is not listening for its result: not run")
            time.sleep(0.05)

    def load(self, r: Request, images: int | None = None, control: str = "Images") -> Load:
        """What request ``r`` asks of the models (``images``: when not its batch), for a fault's message."""
        return Load(images or len(r.seeds), r.sampling.num_steps, control)

    def request(self, components: dict | None = None, load: bool = True, **values) -> Request | None:
        """A checked request from one value per control (:func:`demo.requests.build_request`); ``load=False``:
        what a validator may check at once (None when the pair is not loaded yet)."""
        components = self.components if components is None else components
        return build_request(self.store, self.controls, PRECISION, components, load, **values)

    def _time_pair(self, pair: ModelPair) -> Rates:
        return run_to_end(self.gpu.call("calibrate", {"pair_name": pair.name}, CALIBRATION_SECONDS))

    def timed(self, pair_name: str) -> bool:
        """Whether the pair's rates are measured already (:meth:`demo.timings.PairTimings.timed`)."""
        return self.timings.timed(pair_name)

    def timing(self, pair_name: str) -> bool:
        """Whether the pair is being timed right now (:meth:`demo.timings.PairTimings.timing`)."""
        return self.timings.timing(pair_name)

    def rates(self, pair: ModelPair) -> Rates:
        """The pair's rates, timed the first time they are asked for (:meth:`demo.timings.PairTimings.rates`)."""
        return self.timings.rates(pair)

    def await_rates(
        self, pair_name: str, progress=None, check: Callable[[], object] | None = None, poll: float = WAIT_SECONDS
    ) -> Iterator[str]:
        """Status lines while the pair's rates are not in (:meth:`demo.timings.PairTimings.await_rates`)."""
        return self.timings.await_rates(pair_name, progress, check, poll)

    def decode(self, pair_name: str, tokens: torch.Tensor) -> np.ndarray:
        """Tokens (B, N, d) of a served pair -> images (B, H, W, 3) uint8: arithmetic here for pixel tokens, in
        a GPU call where the tokenizer is a network (KL-16: its decoder is a model like any other)."""
        pair = self.store.get(pair_name)
        if not pair.tokenizer.network:
            return to_uint8(pair.tokenizer.decode(tokens.float().cpu())).numpy()
        return run_to_end(self.gpu.call("decode", {"pair_name": pair_name, "tokens": tokens.cpu()}, DECODE_SECONDS))

    def image_side(self, pair_name: str, tokens: torch.Tensor) -> int:
        """The side in pixels of the pair's images (decoded once, from one image's ``tokens`` (1, N, d))."""
        if pair_name not in self._sides:
            self._sides[pair_name] = int(self.decode(pair_name, tokens[:1]).shape[1])
        return self._sides[pair_name]

    def estimate(self, r: Request, runs: dict[str, int], images: int | None = None, measure: bool = True) -> float:
        """Seconds the request's runs should take on this server (:mod:`demo.estimate`); ``measure=False``:
        0 unless the pair's rates are known already (a validator does not wait for a calibration)."""
        return self.estimate_runs(
            r, [(r.sampling, r.csd, kind) for kind, n in runs.items() for _ in range(n)], images, measure
        )

    def estimate_runs(self, r: Request, planned: list[tuple], images: int | None = None, measure: bool = True) -> float:
        """As :meth:`estimate`, for runs at settings of their own (:meth:`demo.timings.PairTimings.estimate_runs`:
        an analysis's sweeps, a frontier's points)."""
        return self.timings.estimate_runs(r, planned, images, measure)

    def check_fits(self, seconds: float, advice: str, control: str | None = None, within: float | None = None) -> None:
        """Refuse, by name and before it runs, a request estimated to run past the per-request limit (or past
        ``within`` seconds, when less: what the page's defaults are sized to), or, on ZeroGPU, one whose GPU
        call would ask for more than ``--gpu-seconds``."""
        most = HEADROOM * self.limits.max_seconds
        most = most if within is None else min(most, within)
        if seconds > most:
            raise refuse(
                f"This request would take {words(seconds)} on this server, more than the {most:.0f} s one request "
                f"may take here: {advice}",
                control=control,
            )
        if not self.gpu.fits(seconds):
            raise refuse(
                f"This request would ask for {self.gpu.seconds(seconds):.0f} s of GPU time ({words(seconds)} "
                f"estimated, with a margin), more than the {self.gpu.cap:.0f} s one GPU call may take on this "
                f"Space (--gpu-seconds): {advice}",
                control=control,
            )

    def default_controls(self) -> dict:
        """Keyword arguments of :meth:`request` for the default setting, within the limits."""
        return {name: control.default for name, control in self.controls.items()}

    def preset(self, name: str, controls: dict) -> dict:
        """The controls after choosing preset ``name`` (:func:`demo.controls.preset_values`) on the pair of
        ``controls``, whose fixed knobs stay (:func:`pair_defaults`)."""
        return pair_defaults(self, preset_values(name, controls, self.default_controls()), controls["pair_name"])


@task("decode")
def decode_task(app: App, pair_name: str, tokens: torch.Tensor) -> Iterator[Done]:
    """The GPU task of :meth:`App.decode` for a tokenizer that is a network."""
    yield Done(app.store.get(pair_name).images(tokens).numpy())


@task("calibrate")
def calibrate_task(app: App, pair_name: str) -> Iterator[Done]:
    """The GPU task of :meth:`App.rates`: time the pair at its default setting."""
    r = app.request(None, True, **pair_defaults(app, app.default_controls(), pair_name))
    yield Done(calibrate(r.pair, r.sampling, r.csd, r.labels[0]))


def steps_job(runs, finish) -> Callable:
    """The work of a job over ``runs.steps()`` (one generation each): posts its
    :class:`~csd.serving.jobs.RunStart` before each run, and returns ``finish()`` once every run is done."""

    def work(job: Job):
        for start in runs.steps(on_step=lambda label: job.on_step(label)):
            job.post(start)
        return finish()

    return work


def drain(gen: Iterator) -> object:
    """Run a generator to its end, dropping what it yields; its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value
