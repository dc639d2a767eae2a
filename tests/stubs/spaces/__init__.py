"""A recording stand-in for Hugging Face's ``spaces`` package (its ZeroGPU contract), for the tests.

``GPU(duration=fn)`` decorates as the real package does on a ZeroGPU Space, minus the GPU: every call records
its function, its arguments' first value (the app's task name) and the duration it asks for (``fn`` called
with the call's own arguments, as ZeroGPU does), and checks it is a positive number of seconds within
:data:`MAX_SECONDS`. Arguments and every yielded or returned value cross a pickle round trip, as they cross
the process boundary to ZeroGPU's worker. :data:`OPEN` counts the calls under way, so a test can tell whether
a model ran inside one (a forward hook reads it); :data:`HOLD` makes calls slow (a GPU that takes its time).

A call fails on demand (:data:`FAULTS`, one :class:`Fault` for each of the next calls): a fault of the worker is
thrown into the task where it waits after its first ``after`` events (as a model run's exception arises in
the worker; at 0, before the task starts); a fault of the host is raised by the call itself after ``after``
events (as ZeroGPU raises its own ``gr.Error``, "GPU task aborted"). As the real package does (0.51), an
exception that leaves the worker reaches the caller as it is when it is a ``gr.Error``, else as
``gr.Error("<its class name>", title="ZeroGPU worker error")``.

On the path as ``spaces`` (``tests/stubs`` first on ``PYTHONPATH``) with ``SPACES_ZERO_GPU`` set, importing it
also patches torch as the real package does on a ZeroGPU Space's main process, where no GPU is attached:
``torch.cuda.is_available()`` is True, a module placed on CUDA stays where it is (recorded in :data:`PLACED`;
the real package moves it when a call starts; here calls run on the CPU), ``torch.cuda.synchronize`` does
nothing, and ``torch._C._cuda_init`` raises: any code that would initialise CUDA fails by name."""

from __future__ import annotations

import functools
import inspect
import os
import pickle
from dataclasses import dataclass

MAX_SECONDS = 300  # the longest call ZeroGPU grants anyone (a logged-in visitor)
CALLS: list[dict] = []  # {"function", "task", "duration"} per call, in order
DECORATED: list = []  # every function decorated
OPEN = [0]  # GPU calls under way
HOLD: list = []  # hold(*args, **kwargs) for each, as a call starts (open), before it runs: may wait
ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
WORKER_ERROR = "ZeroGPU worker error"  # the title the real package gives a worker's exception (spaces.zero.wrappers)


@dataclass
class Fault:
    """The next call fails with ``error`` after its first ``after`` events: in the worker (the task's own
    fault) or at the host (ZeroGPU's)."""

    error: BaseException
    after: int = 0
    where: str = "worker"


FAULTS: list[Fault] = []  # consumed one per call, in order
FAILED: list[dict] = []  # {"task", "error", "open"} per fault raised: what, and how many calls were open then


def _worker_error(err: Exception) -> Exception:
    """What the caller gets of an exception that left the worker (spaces.zero.wrappers.exception_result)."""
    import gradio as gr

    if isinstance(err, gr.Error):
        return err
    return gr.Error(type(err).__name__, title=WORKER_ERROR, print_exception=False)


def _events(inner, fault: Fault | None, task):
    """The task's events, with ``fault`` raised where and when it says."""
    done = 0
    while True:
        if fault is not None and done == fault.after:
            FAILED.append({"task": task, "error": fault.error, "open": OPEN[0]})
            if fault.where == "host":
                raise fault.error
            step, fault = (lambda error=fault.error: inner.throw(error)), None
        else:
            step = lambda: next(inner)
        try:
            value = step()
        except StopIteration:
            return
        except Exception as err:
            raise _worker_error(err) from None
        yield value
        done += 1


def _crossed(value):
    return pickle.loads(pickle.dumps(value))


def _record(fn, duration, args, kwargs) -> None:
    seconds = duration(*args, **kwargs) if callable(duration) else duration
    if not (isinstance(seconds, int | float) and 0 < seconds <= MAX_SECONDS):
        raise AssertionError(f"{fn.__name__} asked for {seconds!r} s: not a duration ZeroGPU grants")
    CALLS.append({"function": fn.__name__, "task": args[0] if args else None, "duration": seconds})


def _hold(args, kwargs) -> None:
    for hold in HOLD:
        hold(*args, **kwargs)


def GPU(task=None, *, duration=None, size=None, **kwargs):
    def decorate(fn):
        DECORATED.append(fn)
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args, **kwargs):
                _record(fn, duration, args, kwargs)
                args, kwargs = _crossed((args, kwargs))
                OPEN[0] += 1
                inner = fn(*args, **kwargs)
                try:
                    _hold(args, kwargs)
                    for value in _events(inner, FAULTS.pop(0) if FAULTS else None, args[0] if args else None):
                        yield _crossed(value)
                finally:  # a closed call (Stop) closes the task, as ZeroGPU's worker does
                    inner.close()
                    OPEN[0] -= 1

            return generator

        @functools.wraps(fn)
        def regular(*args, **kwargs):
            _record(fn, duration, args, kwargs)
            args, kwargs = _crossed((args, kwargs))
            OPEN[0] += 1
            try:
                _hold(args, kwargs)
                return _crossed(fn(*args, **kwargs))
            finally:
                OPEN[0] -= 1

        return regular

    return decorate(task) if task is not None else decorate


PLACED: list[str] = []  # the modules placed on CUDA (ZeroGPU mode)


def _patch_torch() -> None:
    import torch

    def no_cuda_here():
        raise RuntimeError("CUDA initialised in the main process of a ZeroGPU Space")

    module_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is None or device.type != "cuda":
            return module_to(self, *args, **kwargs)
        PLACED.append(type(self).__name__)
        return self

    torch._C._cuda_init = no_cuda_here
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.nn.Module.to = to


if ZERO_GPU:
    _patch_torch()
