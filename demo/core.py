"""The app object every tab shares: the model store and the limits (read-only), the controls, the
precomputed results, and stoppable model runs (a job per request, its progress reported per AR step,
Stop and the time limit honoured at the next AR step)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

import gradio as gr
import torch

from csd.experiments.analysis import Panels
from csd.experiments.jobs import Job, Step, Stopped
from csd.experiments.pairs import PairStore
from demo.controls import declare_controls
from demo.limits import Limits
from demo.requests import Request, build_request

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRECISION = "bfloat16" if DEVICE.type == "cuda" else "float32"  # backbone precision; heads stay float32


class App:
    """What the handlers share. Holds only read-only things: the model store and the limits. Nothing a
    visitor sends names a file, a directory or a repository: pairs are chosen by name among those the
    operator installed before serving."""

    def __init__(self, store: PairStore, limits: Limits, panels: Panels | None = None, front: dict | None = None):
        self.store, self.limits, self.panels, self.front = store, limits, panels, front
        self.controls = declare_controls(store, limits)
        # The latest model runs: status ("done", "stopped", "over time", "error"), AR steps run, seconds.
        self.history: deque[dict] = deque(maxlen=64)

    def request(self, **values) -> Request:
        """A checked request from one value per control (:func:`demo.requests.build_request`)."""
        return build_request(self.store, self.controls, PRECISION, **values)

    def default_controls(self) -> dict:
        """Keyword arguments of :meth:`request` for the default setting, within the limits."""
        return {name: control.default for name, control in self.controls.items()}

    def job(self, work) -> Job:
        """A model run for one request: progress per AR step, stopped by Stop or the time limit."""
        return Job(work, time_limit=self.limits.max_seconds)

    def follow(self, job: Job, runs: list[str], progress) -> Iterator[object]:
        """Iterate ``job``: report each AR step to ``progress`` (phase in the label, the bar across
        ``runs``) and pass on the values it posts; always stop the job on the way out (Stop closes
        this generator), and turn its errors into the app's errors."""
        t0, status = time.perf_counter(), "stopped"  # stays so when Stop closes this generator
        try:
            for event in job:
                if isinstance(event, Step):
                    i = runs.index(event.label) if event.label in runs else 0
                    progress((i * event.total + event.done, len(runs) * event.total), desc=event.text, unit="steps")
                yield event
            status = "done"
        except Stopped as err:
            status = "over time" if err.over_time else "stopped"
            if err.over_time:
                raise gr.Error(
                    f"This request {err} per request (--max-seconds, CSD_MAX_SECONDS): "
                    "ask for fewer images, AR steps or a smaller resampler cap"
                ) from None
            raise gr.Error("Stopped.") from None
        except ValueError as err:
            status = "error"
            raise gr.Error(f"Invalid setting: {err}") from None
        finally:
            job.stop()
            self.history.append({"status": status, "steps": job.steps, "seconds": time.perf_counter() - t0})

    def run_all(self, runs, finish, progress) -> Iterator[str]:
        """Run ``runs.steps()`` (one generation each) in a stoppable job, yielding a status line (the run
        within the runs, the AR step within the run); returns ``finish()``, computed in the job once every
        run is done."""

        def work(job: Job):
            for done, total, label in runs.steps(on_step=lambda label: job.on_step(label)):
                job.post((done, total, label))
            return finish()

        run = (0, len(runs), "")
        job = self.job(work)
        for event in self.follow(job, [], lambda *args, **kwargs: None):
            if isinstance(event, Step):
                done, total, _ = run
                progress((done * event.total + event.done, total * event.total), desc=event.text, unit="steps")
                yield f"Running {done + 1}/{total}: {event.text} ..."
            else:
                run = event
        return job.result
