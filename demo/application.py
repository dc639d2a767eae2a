"""The app object every tab shares: the model store and the limits (read-only), the controls, the
precomputed results, and stoppable model runs: each request's runs are one GPU call (:mod:`demo.gpu`) that
runs a job (progress reported per AR step, Stop and the time limit honoured at the next AR step), followed
from the main process, which keeps the state (each pair's rates, the history)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr
import numpy as np
import torch

from csd.family import FamilyTraits
from csd.models.tokenizer import to_uint8
from csd.records.panel_data import Panels
from csd.serving.jobs import Job, RunStart, Step, Stopped
from csd.serving.pairs import ModelPair, PairStore
from demo.controls import declare_controls, preset_values
from demo.errors import refuse
from demo.estimate import CALIBRATION_SECONDS, HEADROOM, Rates, calibrate, head_calls, words
from demo.faults import FAULT, CallEnded, Load, caught, crossed, fault_error
from demo.gpu import Done, Ended, GpuCalls, task
from demo.limits import Limits
from demo.requests import Request, build_request

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The page hears of a run's AR steps at most once every this many seconds (and at each run's first and last
# step): every update costs the server's event loop a few milliseconds of Python, taken from the run itself
# (the GIL), and one per AR step made the default Generate a third slower on the 2-core CPU (docs/app.md).
PROGRESS_SECONDS = 0.25
PRECISION = "bfloat16" if DEVICE.type == "cuda" else "float32"  # backbone precision; heads stay float32
DECODE_SECONDS = 2.0  # what a decode call asks for, before the margin (an estimate: KL-16 on 8 images)
WAIT_SECONDS = 0.5  # how often a request waiting for its pair's timing hears how long it should still wait


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


@dataclass
class Throttle:
    """Which AR steps of a run the page hears of: each run's first and last, and the others at most one every
    ``every`` seconds (by ``clock``)."""

    every: float = PROGRESS_SECONDS
    clock: Callable[[], float] = time.monotonic
    _last: float = -math.inf

    def due(self, step: Step) -> bool:
        now = self.clock()
        if step.done in (1, step.total) or now - self._last >= self.every:
            self._last = now
            return True
        return False


class App:
    """What the handlers share. Holds only read-only things: the model store and the limits. Nothing a
    visitor sends names a file, a directory or a repository: pairs are chosen by name among those the
    operator installed before serving."""

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
        self._rates: dict[str, Rates] = {}  # per pair, measured the first time it is served
        self._sides: dict[str, int] = {}  # per pair, its images' side in pixels
        # One lock per pair, held while that pair is timed: known rates are read without any lock, and a
        # request never waits for another pair's timing (for its own pair's, it waits: await_rates).
        self._rates_locks: dict[str, threading.Lock] = {}
        self._timing_since: dict[str, float] = {}  # per pair, when its timing started (time.monotonic)
        self._timing_took: dict[str, float] = {}  # per pair, the seconds its timing took
        self._locks_lock = threading.Lock()  # held only to make a pair's lock
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

    def timed(self, pair_name: str) -> bool:
        """Whether the pair's rates are measured already (an estimate needs no calibration run)."""
        return pair_name in self._rates

    def timing(self, pair_name: str) -> bool:
        """Whether the pair is being timed right now (its rates are not in yet)."""
        lock = self._rates_locks.get(pair_name)
        return lock is not None and lock.locked() and pair_name not in self._rates

    def _rates_lock(self, pair_name: str) -> threading.Lock:
        with self._locks_lock:
            return self._rates_locks.setdefault(pair_name, threading.Lock())

    def rates(self, pair: ModelPair) -> Rates:
        """The pair's rates (:mod:`demo.estimate`), timed at its default setting in a GPU call the first time
        they are asked for (the server asks for every pair's once it serves) and kept here. Known rates are read
        at once, whatever pair is being timed; a pair is timed once however many ask: the others wait for it
        (a visitor's request through :meth:`await_rates`, which says so)."""
        known = self._rates.get(pair.name)
        if known is not None:
            return known
        with self._rates_lock(pair.name):
            if pair.name not in self._rates:
                t0 = self._timing_since[pair.name] = time.monotonic()
                events = self.gpu.call("calibrate", {"pair_name": pair.name}, CALIBRATION_SECONDS)
                self._rates[pair.name] = run_to_end(events)
                self._timing_took[pair.name] = time.monotonic() - t0
            return self._rates[pair.name]

    def timing_left(self, pair_name: str) -> float:
        """Seconds the pair's timing under way should still take: the longest timing of a pair on this server
        so far (each pair is timed at its own default), else :data:`~demo.estimate.CALIBRATION_SECONDS`,
        less the time it has run (at least 1 s)."""
        expected = max(self._timing_took.values(), default=CALIBRATION_SECONDS)
        since = self._timing_since.get(pair_name, time.monotonic())
        return max(1.0, expected - (time.monotonic() - since))

    def await_rates(
        self, pair_name: str, progress=None, check: Callable[[], object] | None = None, poll: float = WAIT_SECONDS
    ) -> Iterator[str]:
        """Wait for the pair's rates, in the handler of a visitor's request: a status line (:func:`waiting_line`,
        also to ``progress``) every ``poll`` seconds while the pair is being timed (as the server starts); a pair
        nobody is timing is timed here (a line says so first). ``check``: the request's checks that need no
        rates (its validator's), run first, so that a value out of range is refused before any wait. Returns at
        once when the rates are known, or when ``pair_name`` is not a served pair (the request's check refuses it)."""
        if not isinstance(pair_name, str) or pair_name not in self.store.names or pair_name in self._rates:
            return
        if check is not None:
            self.store.get(pair_name)  # loaded (as the request's own check would): the validator's check is whole
            check()
        while pair_name not in self._rates:
            lock = self._rates_lock(pair_name)
            if lock.acquire(timeout=poll):  # nobody is timing it (or its timing has just ended)
                lock.release()
                if pair_name not in self._rates:
                    line = f"Timing the {pair_name} pair (its first use on this server) ..."
                    if progress is not None:
                        progress(None, desc=line)
                    yield line
                    self.rates(self.store.get(pair_name))  # waits for a timing that started meanwhile
                return
            line = waiting_line(pair_name, self.timing_left(pair_name))
            if progress is not None:
                progress(None, desc=line)
            yield line

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
        """As :meth:`estimate`, for runs at settings of their own: (sampling, csd) or (sampling, csd, kind),
        csd None for target-only (an analysis's sweeps, a frontier's points), each over ``images`` images.
        ``measure=False`` (a validator) never waits: 0 while the pair's rates are not in, being timed or not;
        ``measure=True`` (a handler, after :meth:`await_rates`) waits for them."""
        if not measure and r.pair.name not in self._rates:
            return 0.0
        rates, images = self.rates(r.pair), images or len(r.seeds)
        seconds = 0.0
        for sampling, csd, *kind in planned:
            kind = kind[0] if kind else "target" if csd is None else "csd"
            calls = head_calls(r.pair, sampling)
            seconds += rates.seconds(sampling, images, {kind: 1}, csd, calls)
        return seconds

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

    def job_events(self, work) -> Iterator[object]:
        """A model run as a GPU task yields it: ``work(job)`` in a :class:`~csd.serving.jobs.Job` (progress
        per AR step, stopped by Stop or the time limit), its steps and posted values, then :class:`Done` with
        its result or :class:`Ended` with why it did not finish. The job stops whenever the caller stops."""
        job = Job(work, time_limit=self.limits.max_seconds)
        try:
            yield from job
        except Stopped as err:
            yield Ended("over time" if err.over_time else "stopped", str(err))
            return
        except gr.Error:  # a ValueError too: the app's own refusals, and ZeroGPU's errors, as they are
            raise
        except ValueError as err:
            yield Ended("error", str(err))
            return
        except Exception as err:  # a fault of the run: logged and its memory released here, in the GPU call
            job.stop()  # first: a fault raised on this side leaves the worker running
            kind, detail = caught(err, DEVICE.type == "cuda")
            yield Ended(FAULT, detail, kind)
            return
        finally:
            job.stop()
        yield Done(job.result)

    def follow(self, events: Iterator, runs: list[str], progress, load: Load | None = None) -> Iterator[object]:
        """Follow a GPU call's events (:meth:`job_events`) in the main process: report its AR steps to
        ``progress`` (phase in the label, the bar across ``runs``) and pass them on, as a :class:`Throttle`
        lets them through, and pass on every value it posts; return its result (``yield from``), or raise the
        app's error for a run that stopped, was refused or failed (:mod:`demo.faults`: named for ``load``, what
        the request asked for), whether it ends the call's events or crosses the call as an exception.
        Closing this generator (Stop) closes the call."""
        t0, status, steps, throttle = time.perf_counter(), None, 0, Throttle()  # None: closed by Stop
        try:
            for event in events:
                if isinstance(event, Done):
                    status = "done"
                    return event.result
                if isinstance(event, Ended):
                    status = event.status
                    raise ended(event, load)
                if isinstance(event, Step):
                    steps += 1
                    if not throttle.due(event):
                        continue
                    i = runs.index(event.label) if event.label in runs else 0
                    progress((i * event.total + event.done, len(runs) * event.total), desc=event.text, unit="steps")
                yield event
            raise CallEnded("a GPU call ended without its result")
        except Exception as err:
            error = crossed(err, load, DEVICE.type == "cuda")
            status = status or ("error" if error is err else FAULT)  # refused (ZeroGPU's own errors), or failed
            raise error from None
        finally:
            events.close()
            self.history.append({"status": status or "stopped", "steps": steps, "seconds": time.perf_counter() - t0})

    def run_all(self, task: str, values: dict, seconds: float, progress, load: Load | None = None) -> Iterator[str]:
        """Run GPU task ``task`` (whose work posts a :class:`~csd.serving.jobs.RunStart` before each of its
        runs, :func:`steps_job`) on ``values``, asking for ``seconds``: yields a status line (the run within the
        runs, the AR step within the run); returns the task's result (a fault named for ``load``)."""
        run = RunStart(0, 1, "")
        follow = self.follow(self.gpu.call(task, values, seconds), [], lambda *args, **kwargs: None, load)
        while True:
            try:
                event = next(follow)
            except StopIteration as done:
                return done.value
            if isinstance(event, Step):
                progress((run.done * event.total + event.done, run.total * event.total), desc=event.text, unit="steps")
                yield f"Running {run.done + 1}/{run.total}: {event.text} ..."
            elif isinstance(event, RunStart):
                run = event


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


def waiting_line(pair_name: str, seconds_left: float) -> str:
    """What a request on a pair being timed shows while it waits for the timing, in the queue."""
    return f"Waiting for the {pair_name} pair's timing as the server starts ({words(seconds_left)}) ..."


def ended(event: Ended, load: Load | None = None) -> Exception:
    """The app's error for a model run that did not finish (a fault named for ``load``)."""
    if event.status == FAULT:
        return fault_error(event.kind, event.message, load)
    if event.status == "over time":
        return refuse(
            f"This request {event.message} per request on this server and was stopped: ask for fewer images "
            "or AR steps (or a smaller resampler cap)"
        )
    if event.status == "stopped":
        return refuse("Stopped.")
    return refuse(f"Invalid setting: {event.message}")


def drain(gen: Iterator) -> object:
    """Run a generator to its end, dropping what it yields; its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def run_to_end(events: Iterator) -> object:
    """The result of a GPU call run to its end without progress reports (an operator's call: the start-up
    timing, the warm-up); a call that did not finish raises the app's error."""
    try:
        for event in events:
            if isinstance(event, Done):
                return event.result
            if isinstance(event, Ended):
                raise ended(event)
    except Exception as err:
        raise crossed(err, None, DEVICE.type == "cuda") from None
    finally:
        events.close()
    raise crossed(CallEnded("a GPU call ended without its result"), None, DEVICE.type == "cuda")
