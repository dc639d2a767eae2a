"""The app object every tab shares: the model store and the limits (read-only), the controls, the
precomputed results, each pair's timing (:mod:`demo.timings`), the line of model runs (:mod:`demo.line`) and
stoppable model runs (:mod:`demo.runs`): each request's runs are one GPU call that runs a job, followed from the
main process, which keeps the state (each pair's rates, the history)."""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import torch

from csd.family import FamilyTraits
from csd.models.tokenizer import to_uint8
from csd.records.panel_data import Panels
from csd.serving.jobs import Job
from csd.serving.pairs import ModelPair, PairStore
from demo.controls import declare_controls, preset_values
from demo.errors import refuse
from demo.estimate import CALIBRATION_SECONDS, HEADROOM, PROBE_SECONDS, Rates, calibrate, probe, words
from demo.faults import Load
from demo.gpu import Done, GpuCalls, task, zero_gpu
from demo.limits import Limits
from demo.line import Line
from demo.reference import Reference
from demo.requests import Request, build_request
from demo.runs import DEVICE, ModelRuns, run_to_end
from demo.timings import GiveUp, PairTimings

PRECISION = "bfloat16" if DEVICE.type == "cuda" else "float32"  # backbone precision; heads stay float32
T = TypeVar("T")
# A waiting request's client hears its place and wait as it joins, each time its place changes, and this often
# while it does not: each is a message to each waiting client, which the server's event loop makes beside the
# run under way (docs/space.md, "The line").
STILL_SECONDS = 10.0
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
        reference: Reference | None = None,
    ) -> None:
        self.store, self.limits, self.panels = store, limits, panels
        # Every model run goes through this one GPU-decorated function (demo.gpu), as a registered task.
        self.gpu = gpu or GpuCalls(self, limits.gpu_seconds)
        # The benchmark's frontiers of the pairs served: pair name -> batch -> result (read-only).
        self.fronts: dict[str, dict[int, dict]] = fronts or {}
        self.controls = declare_controls(store, limits)
        # The latest model runs: status ("done", "stopped", "over time", "error"), AR steps run, seconds.
        self.history: deque[dict] = deque(maxlen=64)
        # Each pair's rates: committed (``reference``, scaled to this machine), or timed in a GPU call at its default.
        self.timings = PairTimings(store, self._time_pair, reference)
        # Visitors' model runs, in the order they came, bounded by the line's predicted length.
        self.line = Line(limits.concurrency, limits.max_wait, limits.queue_size)
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

    def default_setting(self, pair_name: str) -> str:
        """The page's default setting on the pair (what its rates are timed at), as a key."""
        controls = pair_defaults(self, self.default_controls(), pair_name)
        return json.dumps({"precision": PRECISION, **controls}, sort_keys=True)

    def _time_pair(self, pair: ModelPair, give_up: GiveUp | None = None) -> Rates | None:
        return run_to_end(self.gpu.call("calibrate", {"pair_name": pair.name}, CALIBRATION_SECONDS), give_up)

    def probe_seconds(self, pair_name: str, give_up: GiveUp | None = None) -> float | None:
        """The pair's probe on this machine (:func:`demo.estimate.probe`, in a GPU call); None when given up."""
        return run_to_end(self.gpu.call("probe", {"pair_name": pair_name}, PROBE_SECONDS), give_up)

    def idle_work(self, log: Callable[[str], None] = lambda line: None) -> None:
        """The server's own work, each piece run only while the line is empty and given up the moment a request
        joins (taken up again once the line is empty again): each committed pair probed (its rates scaled to this
        machine), then each pair without rates timed. ``log``: a line per piece. A piece that fails is logged and
        left: the pair's committed rates stay unscaled, or its first request's turn times it."""
        for name in self.timings.unprobed():
            t0 = time.perf_counter()
            seconds = self._when_idle(lambda give_up, n=name: self.probe_seconds(n, give_up), name, log)
            if seconds is not None:
                self.timings.scale[name] = scale = seconds / self.timings.reference.probes[name]
                took = time.perf_counter() - t0
                log(f"Probed {name} in {took:.0f} s: {scale:.2f}x the reference machine's time")
        for name in self.timings.missing():
            t0, pair = time.perf_counter(), self.store.get(name)
            if self._when_idle(lambda give_up, p=pair: self.timings.rates(p, give_up), name, log) is not None:
                log(f"Timed {name} in {time.perf_counter() - t0:.0f} s")

    def _when_idle(self, work: Callable[[GiveUp], T | None], pair_name: str, log: Callable[[str], None]) -> T | None:
        """``work(give_up)`` run while the line is empty (:meth:`demo.line.Line.idle`) until it is not given up
        (it returns None when it is); its result, or None when it failed (logged: the server serves on)."""
        try:
            while (result := self.line.idle(work)) is None:
                pass
        except Exception as err:  # a fault of the server's own work on the pair
            log(f"Timing {pair_name} failed ({type(err).__name__}: {err}): the server serves on")
            return None
        return result

    def timed(self, pair_name: str) -> bool:
        """Whether the pair has rates without running anything (:meth:`demo.timings.PairTimings.timed`)."""
        return self.timings.timed(pair_name)

    def rates(self, pair: ModelPair) -> Rates:
        """The pair's rates, timed the first time they are asked for (:meth:`demo.timings.PairTimings.rates`)."""
        return self.timings.rates(pair)

    def turn(
        self,
        request,
        pair_name,
        check: Callable[[], object],
        estimate: Callable[[], float],
        advice: str,
        progress=None,
    ) -> Turn:
        """A request's turn in the line (:class:`Turn`), for its handler."""
        return Turn(self, request, pair_name, check, estimate, advice, progress)

    def line_seconds(self, estimate: float) -> float:
        """What a request estimated at ``estimate`` seconds counts for in the line: its estimate, or on ZeroGPU
        the duration its GPU call asks for (what ZeroGPU grants it)."""
        return float(self.gpu.duration("", {}, estimate)) if zero_gpu() else estimate

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


class Turn:
    """A request's turn in the line, for its handler (``request``: its gr.Request, None in-process). Iterating it
    joins the line (the request checked first: ``estimate()`` refuses a bad value or a request too long for this
    server, and gives its seconds; ``check()``, the checks that need no rates, stands in while its pair has none)
    and yields a status line, its place and predicted wait, as it joins, as its place changes and every
    :data:`STILL_SECONDS` while it does not (not to ``progress``: Gradio's progress messages made a burst of 16
    about 10% slower); past ``--max-wait`` it is refused at once (``advice``: what the visitor may do), and a
    request whose client stops listening leaves the line. At its turn, a pair without rates is timed first (its
    lines also to ``progress``). Leaving the ``with`` block leaves the line."""

    def __init__(self, app: App, request, pair_name, check, estimate, advice: str, progress=None) -> None:
        self.app, self.request, self.pair_name, self.progress = app, request, pair_name, progress
        self.check, self.estimate, self.advice = check, estimate, advice
        self.ticket = None

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if self.ticket is not None:
            self.app.line.leave(self.ticket, done=kind is None)

    def __iter__(self) -> Iterator[str]:
        app, pair = self.app, self.pair_name
        timed = isinstance(pair, str) and app.timed(pair)
        if timed:
            seconds = self.estimate()
        else:  # a pair without rates yet: timed at this request's turn
            if pair in app.store.names:
                app.store.get(pair)  # loaded (as the request's own check would): the check needing no rates is whole
            self.check()
            seconds = app.timings.timing_left(pair)
        self.ticket = app.line.join(app.line_seconds(seconds), self.advice)
        session = getattr(self.request, "session_hash", None)
        told, told_at = None, 0.0
        for where in app.line.turn(self.ticket):
            if session is not None and app.streams.get(session, 0) <= 0:
                app.gone += 1
                raise refuse("the client that asked for this run stopped listening for its result: not run")
            if told is None or where.place != told.place or time.monotonic() - told_at >= STILL_SECONDS:
                told, told_at = where, time.monotonic()
                yield where.text()
        if not timed:
            yield from app.timings.await_rates(pair, self.progress)
            self.ticket.seconds = app.line.clock() - self.ticket.started + app.line_seconds(self.estimate())
        app.check_client(self.request)


@task("calibrate")
def calibrate_task(app: App, pair_name: str) -> Iterator[object]:
    """The GPU task of :meth:`App.rates`: time the pair at its default setting (a stop ends it at an AR step)."""
    r = app.request(None, True, **pair_defaults(app, app.default_controls(), pair_name))
    work = lambda job: calibrate(r.pair, r.sampling, r.csd, r.labels[0], job.on_step("timing"))
    yield from app.job_events(work, limited=False)


@task("probe")
def probe_task(app: App, pair_name: str) -> Iterator[object]:
    """The GPU task of :meth:`App.probe_seconds`: the pair's probe at its default setting."""
    r = app.request(None, True, **pair_defaults(app, app.default_controls(), pair_name))
    yield from app.job_events(lambda job: probe(r.pair, r.sampling, r.labels[0], job.on_step("probe")), limited=False)


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
