"""Stoppable model runs: each request's runs are one GPU call (:mod:`demo.gpu`) that runs a job (progress
reported per AR step, Stop and the time limit honoured at the next AR step), followed from the main process,
which keeps the history; a run that does not finish ends in the app's error, named for what it asked for."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr
import torch

from csd.serving.jobs import Job, RunStart, Step, Stopped
from demo.errors import refuse
from demo.faults import FAULT, CallEnded, Load, caught, crossed, fault_error
from demo.gpu import Done, Ended, GpuCalls
from demo.limits import Limits
from demo.timings import PairTimings

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The page hears of a run's AR steps at most once every this many seconds (and at each run's first and last
# step): every update costs the server's event loop a few milliseconds of Python, taken from the run itself
# (the GIL), and one per AR step made the default Generate a third slower on the 2-core CPU (docs/app.md).
PROGRESS_SECONDS = 0.25


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


class ModelRuns:
    """Model runs as GPU calls: the job a GPU task runs (:meth:`job_events`), and its events followed in the
    main process (:meth:`follow`, :meth:`run_all`), each recorded in ``history``. For the app
    (:class:`demo.application.App`), which holds the attributes below."""

    gpu: GpuCalls  # every model run goes through this one GPU-decorated function, as a registered task
    limits: Limits
    history: deque[dict]  # the latest model runs: status, AR steps run, seconds
    timings: PairTimings  # each pair's rates, which what its requests' runs take refines

    def job_events(self, work, limited: bool = True) -> Iterator[object]:
        """A model run as a GPU task yields it: ``work(job)`` in a :class:`~csd.serving.jobs.Job` (progress
        per AR step, stopped by Stop or, when ``limited``, the time limit), its steps and posted values, then
        :class:`Done` with its result or :class:`Ended` with why it did not finish. The job stops whenever the
        caller stops."""
        job = Job(work, time_limit=self.limits.max_seconds if limited else None)
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

    def follow(
        self,
        events: Iterator,
        runs: list[str],
        progress,
        load: Load | None = None,
        estimate: tuple[str, float] | None = None,
    ) -> Iterator[object]:
        """Follow a GPU call's events (:meth:`job_events`) in the main process: report its AR steps to
        ``progress`` (phase in the label, the bar across ``runs``) and pass them on, as a :class:`Throttle`
        lets them through, and pass on every value it posts; return its result (``yield from``), or raise the
        app's error for a run that stopped, was refused or failed (:mod:`demo.faults`: named for ``load``, what
        the request asked for), whether it ends the call's events or crosses the call as an exception.
        ``estimate``: the pair the call ran on and the seconds it was estimated at; what a call that finished
        took refines the pair's estimates (:meth:`demo.timings.PairTimings.observe`). Closing this generator
        (Stop) closes the call."""
        t0, status, steps, throttle = time.perf_counter(), None, 0, Throttle()  # None: closed by Stop
        try:
            for event in events:
                if isinstance(event, Done):
                    status = "done"
                    if estimate is not None:
                        self.timings.observe(*estimate, time.perf_counter() - t0)
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
        runs, :func:`steps_job`) on ``values`` (its ``pair_name`` among them), asking for ``seconds``: yields a
        status line (the run within the runs, the AR step within the run); returns the task's result (a fault
        named for ``load``)."""
        run = RunStart(0, 1, "")
        call = self.gpu.call(task, values, seconds)
        follow = self.follow(call, [], lambda *args, **kwargs: None, load, (values["pair_name"], seconds))
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


def run_to_end(events: Iterator, give_up: Callable[[], bool] | None = None) -> object:
    """The result of a GPU call run to its end without progress reports (the server's own call: a pair's timing or
    probe, a decode); a call that did not finish raises the app's error. ``give_up``: asked at each of the call's
    events (each AR step of a job); once it is true the call is closed (its job stops) and None returned."""
    try:
        for event in events:
            if isinstance(event, Done):
                return event.result
            if isinstance(event, Ended):
                raise ended(event)
            if give_up is not None and give_up():
                return None
    except Exception as err:
        raise crossed(err, None, DEVICE.type == "cuda") from None
    finally:
        events.close()
    raise crossed(CallEnded("a GPU call ended without its result"), None, DEVICE.type == "cuda")
