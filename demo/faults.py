"""Faults: a model run that fails (out of memory, a kernel error, anything unexpected) is answered by name.

A fault is caught where it happens, inside the GPU call (:meth:`demo.runs.ModelRuns.job_events`): its
traceback goes to the server's log, the cached device memory is released there (:func:`release_memory`), and
the call ends with a plain :class:`~demo.gpu.Ended` event of status :data:`FAULT` whose ``kind`` says what
failed (:func:`kind_of`). The main process turns that event into the visitor's message (:func:`fault_error`),
which says what happened and what to try, sized to the request (:class:`Load`).

A fault can also cross the GPU call as an exception (it escaped the task: a failed load, a fault while the
call's arguments or results cross the process boundary). In process it is the exception itself; on ZeroGPU
the ``spaces`` package turns a worker's exception that is not a ``gr.Error`` into
``gr.Error("<its class name>", title="ZeroGPU worker error")``. :func:`crossed` names both the same way.
ZeroGPU's own errors ("GPU task aborted", quota and queue errors) are ``gr.Error`` already: they pass as
they are.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import gradio as gr
import torch

from demo.errors import log, refuse

FAULT = "fault"  # the Ended status of a model run that failed
WORKER_ERROR = "ZeroGPU worker error"  # the title spaces gives a worker's exception that is not a gr.Error
# What failed, as an Ended event carries it (plain strings: it crosses the process boundary).
GPU_MEMORY, CPU_MEMORY, GPU_KERNEL, CPU_KERNEL, OTHER = "gpu memory", "cpu memory", "gpu kernel", "cpu kernel", "other"
# A worker's exception as ZeroGPU names it (its class name) -> what failed; a worker runs on the GPU.
WORKER_KINDS = {
    "OutOfMemoryError": GPU_MEMORY,
    "MemoryError": CPU_MEMORY,
    "RuntimeError": GPU_KERNEL,
    "AcceleratorError": GPU_KERNEL,
}
DETAIL = 160  # characters of an exception's first line quoted to the visitor


class CallEnded(Exception):
    """A GPU call whose events ended without its result or a reason (not a model run's own fault)."""


@dataclass(frozen=True)
class Load:
    """What the failed request asked of the models, as the visitor set it: for the advice."""

    images: int
    ar_steps: int
    control: str = "Images"  # what the visitor lowers to ask for fewer images: "Images" or "Images (n)"

    def words(self) -> str:
        return f"{self.images} image{'s' if self.images != 1 else ''} at {self.ar_steps} AR steps"

    def fewer(self) -> str:
        """The advice after running out of memory: half the images, or fewer AR steps for one image."""
        if self.images > 1:
            return f"try {max(1, self.images // 2)} or fewer ({self.control}), or fewer AR steps"
        return "try fewer AR steps"


def kind_of(err: BaseException, on_gpu: bool) -> str:
    """What failed: memory (``torch.OutOfMemoryError``, ``MemoryError``), a kernel (any other ``RuntimeError``,
    torch's ``AcceleratorError`` included) or anything else; on the GPU or the CPU (``on_gpu``: the run's device,
    or a message that names CUDA)."""
    gpu = on_gpu or "cuda" in str(err).lower()
    if isinstance(err, torch.OutOfMemoryError):
        return GPU_MEMORY if gpu else CPU_MEMORY
    if isinstance(err, MemoryError):
        return CPU_MEMORY
    if isinstance(err, RuntimeError):
        return GPU_KERNEL if gpu else CPU_KERNEL
    return OTHER


def detail_of(err: BaseException) -> str:
    """The exception's class and first line, cut to :data:`DETAIL` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= DETAIL else text[: DETAIL - 3] + "..."


def release_memory() -> None:
    """Free what a failed run left: Python's garbage, and the CUDA caching allocator's cached blocks (only where
    CUDA is initialised: this never starts CUDA)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def caught(err: BaseException, on_gpu: bool) -> tuple[str, str]:
    """A fault caught inside the GPU call: its traceback logged, memory released; (kind, detail) for the event."""
    log.error("model run failed: %s", detail_of(err), exc_info=(type(err), err, err.__traceback__))
    release_memory()
    return kind_of(err, on_gpu), detail_of(err)


def message(kind: str, detail: str, load: Load | None) -> str:
    """What the visitor reads: what happened, for what request, and what to try."""
    what = f" for {load.words()}" if load is not None else ""
    fewer = load.fewer() if load is not None else "try fewer images or AR steps"
    said = f" ({detail})" if detail else ""
    if kind == GPU_MEMORY:
        return f"The GPU ran out of memory{what}: {fewer}."
    if kind == CPU_MEMORY:
        return f"The server ran out of memory (RAM){what}: {fewer}."
    if kind in (GPU_KERNEL, CPU_KERNEL):
        device = "GPU" if kind == GPU_KERNEL else "CPU"
        return (
            f"A kernel failed on the {device}{what}{said}. The server has recovered: try again, or with other "
            "settings (fewer images, another precision or head sampler)."
        )
    return f"The model run failed{what}{said}. The server has recovered and logged it: try again, or other settings."


def fault_error(kind: str, detail: str, load: Load | None) -> gr.Error:
    """The app's error for a model run that failed (its traceback is in the log already)."""
    return refuse(message(kind, detail, load))


def crossed(err: Exception, load: Load | None, on_gpu: bool) -> gr.Error:
    """The app's error for an exception that crossed the GPU call: ZeroGPU's own errors as they are, a worker's
    exception as ZeroGPU reports it (its class name) named, any other exception named and logged here."""
    if isinstance(err, gr.Error):
        text = str(err.message)
        if getattr(err, "title", None) == WORKER_ERROR and text in WORKER_KINDS:
            return fault_error(WORKER_KINDS[text], "", load)
        if getattr(err, "title", None) == WORKER_ERROR and text.isidentifier():
            return fault_error(OTHER, text, load)  # another exception class, named by ZeroGPU
        return err
    log.error("model run failed: %s", detail_of(err), exc_info=(type(err), err, err.__traceback__))
    release_memory()
    return fault_error(kind_of(err, on_gpu), detail_of(err), load)
