"""A long model run that reports progress per AR step and can be stopped between two steps.

The samplers take an ``on_step`` callback (:data:`csd.sampling.StepCallback`). A :class:`Job` runs a
function of such callbacks in a worker thread and hands its progress to whoever iterates it; a
stop request (or the job's time limit) makes the next callback raise :class:`Stopped`, so the run
ends within one AR step and nothing half-made comes out as a result::

    job = Job(lambda job: generate(model, labels, seeds, config, on_step=job.on_step("target-only")))
    try:
        for event in job:  # Step(label, done, total, phase) or whatever the work posted
            print(event)
    finally:
        job.stop()  # no-op when finished; else stops the worker and waits for it
    images = job.result
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from csd.decoding import StepCallback


class Stopped(Exception):
    """A run stopped between two AR steps: on request, or past its time limit."""

    def __init__(self, message: str, over_time: bool = False):
        super().__init__(message)
        self.over_time = over_time


@dataclass(frozen=True)
class Step:
    """Progress of one AR step: ``done`` of ``total`` steps of the run ``label``, in ``phase``."""

    label: str
    done: int
    total: int
    phase: str

    @property
    def text(self) -> str:
        return f"{self.label}: AR step {self.done}/{self.total} ({self.phase})"


@dataclass(frozen=True)
class RunStart:
    """One run of several about to start: ``done`` of ``total`` runs are done, the next is ``label``."""

    done: int
    total: int
    label: str


_STEP, _POST, _DONE, _FAILED = range(4)


class Job:
    """Runs ``work(job)`` in a daemon thread. Iterating yields :class:`Step` events and the values the
    work passes to :meth:`post`, in order, and ends when the work returns (``result``) or re-raises
    its exception. :meth:`stop` is safe to call at any time and more than once."""

    def __init__(self, work: Callable[[Job], Any], time_limit: float | None = None):
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"time_limit must be > 0 seconds or None, got {time_limit!r}")
        self._work, self.time_limit = work, time_limit
        self._events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="csd-job", daemon=True)
        self._started = 0.0
        self.result: Any = None
        self.steps = 0  # AR steps reported so far

    # --- called by the work, in the worker thread -------------------------------------------

    def check(self) -> None:
        """Raise :class:`Stopped` if a stop was asked for or the time limit has passed."""
        if self._stop.is_set():
            raise Stopped("stopped on request")
        if self.time_limit is not None and time.monotonic() - self._started > self.time_limit:
            raise Stopped(f"ran past the time limit of {self.time_limit:g} s", over_time=True)

    def on_step(self, label: str) -> StepCallback:
        """A sampler callback that reports its steps under ``label`` and stops the run when asked."""

        def callback(done: int, total: int, phase: str) -> None:
            self.check()
            self.steps += 1
            self._events.put((_STEP, Step(label, done, total, phase)))

        return callback

    def post(self, value: Any) -> None:
        """Hand an intermediate value (e.g. a finished image) to the iterating side."""
        self.check()
        self._events.put((_POST, value))

    # --- the iterating side ------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._events.put((_DONE, self._work(self)))
        except BaseException as err:  # handed to the iterating thread, which re-raises it
            self._events.put((_FAILED, err))

    def __iter__(self) -> Iterator[Any]:
        self._started = time.monotonic()
        self._thread.start()
        while True:
            kind, value = self._events.get()
            if kind == _DONE:
                self.result = value
                return
            if kind == _FAILED:
                raise value
            yield value

    def stop(self) -> None:
        """Ask the worker to stop at its next AR step and wait until it has."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
