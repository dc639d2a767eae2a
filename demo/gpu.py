"""Where the app's models run: every model run of a request is one call of :class:`GpuCalls`, a function
decorated with ``spaces.GPU``, Hugging Face's ZeroGPU contract (docs/space.md).

On a ZeroGPU Space (:data:`ZERO_GPU_FLAG` set) CUDA exists only inside such a call. The ``spaces`` package
forks a worker that holds a GPU for the call; the call asks for a duration before it starts (here the
request's own estimate with a margin, at most ``--gpu-seconds``); its arguments reach the worker pickled and
what it yields comes back pickled; what the worker changes stays in the worker. So a call takes plain values
(a task's name, the request checked in the main process or its plan, the estimate) and yields plain values
(progress steps, images, a result), and the main process keeps the state (each pair's rates, the history).
Off ZeroGPU ``spaces.GPU`` returns the function itself: a CPU server, or a machine with its own GPU, runs the
same path in-process.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

ZERO_GPU_FLAG = "SPACES_ZERO_GPU"
# The longest call ZeroGPU grants a visitor who is not logged in (300 s for one who is): docs/space.md.
ZERO_GPU_SECONDS = 120.0
# A call asks for its estimate x MARGIN + OVERHEAD seconds: estimates err by up to a quarter (demo.estimate),
# and a call also forks its worker and moves the weights to the GPU (an estimate, docs/space.md).
MARGIN, OVERHEAD = 1.5, 10.0


def zero_gpu() -> bool:
    """Whether this process serves on ZeroGPU (the flag Hugging Face sets on such a Space)."""
    return os.environ.get(ZERO_GPU_FLAG, "").lower() in ("1", "t", "true")


def import_spaces():
    """The ``spaces`` package, or None where it is not installed (every model run then runs in-process)."""
    try:
        import spaces
    except ImportError:
        return None
    return spaces


@dataclass(frozen=True)
class Done:
    """The last event of a call that ran to its end: the task's result."""

    result: Any


@dataclass(frozen=True)
class Ended:
    """The last event of a call that did not: ``status`` "stopped", "over time", "error" (a setting the
    library refused) or "fault" (the run failed: ``kind`` says what, :mod:`demo.faults`), and why."""

    status: str
    message: str
    kind: str = ""


Task = Callable[..., Iterator]  # task(app, **values) -> events: progress steps, posted values, then Done or Ended
TASKS: dict[str, Task] = {}  # every GPU task, by name, registered as its module is imported (before any fork)


def task(name: str) -> Callable[[Task], Task]:
    """Register a GPU task under ``name``: ``fn(app, **values)`` yields a model run's events."""

    def register(fn: Task) -> Task:
        if TASKS.get(name, fn) is not fn:
            raise ValueError(f"GPU task {name!r} is registered already")
        TASKS[name] = fn
        return fn

    return register


class GpuCalls:
    """The one function of an app that runs models, decorated with ``spaces.GPU`` (when the package is
    there) at construction, before the server starts: :meth:`call` runs a registered task in it, on ``app``."""

    def __init__(self, app: Any, cap: float = ZERO_GPU_SECONDS, spaces_module: Any = "import"):
        self.app, self.cap = app, cap
        self.spaces = import_spaces() if spaces_module == "import" else spaces_module
        gpu = self.spaces.GPU(duration=self.duration) if self.spaces is not None else (lambda fn: fn)
        self._call = gpu(self._run)

    def seconds(self, estimate: float) -> float:
        """The GPU time a call estimated to run ``estimate`` seconds asks for, before the cap."""
        return estimate * MARGIN + OVERHEAD

    def fits(self, estimate: float) -> bool:
        """Whether a call of that estimate may ask for its time: always off ZeroGPU, else within the cap."""
        return not zero_gpu() or self.seconds(estimate) <= self.cap

    def duration(self, name: str, values: dict, estimate: float) -> int:
        """What the call asks ZeroGPU for (``spaces.GPU`` calls it with the call's own arguments): whole
        seconds, at least 1, at most the cap."""
        return max(1, math.ceil(min(self.cap, self.seconds(estimate))))

    def call(self, name: str, values: dict, estimate: float) -> Iterator:
        """The events of task ``name`` run on ``values`` (plain, picklable values), in a GPU call that asks
        for ``estimate`` seconds with the margin."""
        if name not in TASKS:
            raise KeyError(f"no GPU task {name!r}; registered: {sorted(TASKS)}")
        return self._call(name, values, estimate)

    def _run(self, name: str, values: dict, estimate: float) -> Iterator:
        yield from TASKS[name](self.app, **values)
