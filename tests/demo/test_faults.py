"""A model run that fails reaches the visitor as a named message, and leaves nothing shared broken (demo.faults).

On ZeroGPU, with the stand-in ``spaces`` package (tests/stubs/spaces) made to fail a GPU call on demand: the
faults a Space meets (CUDA out of memory, out of RAM, a kernel error, ZeroGPU's own abort and quota errors),
raised mid-stream inside the task (caught there, memory released there) or before it starts (crossing the call
as ZeroGPU reports it: the class name). Off ZeroGPU, the CPU path: the model itself raises mid-run. Through
``gradio_client``, on every endpoint that runs a model: the named message arrives within seconds, the next
request gives the same images as before the fault, no lock stays held, and the analysis still completes."""

from __future__ import annotations

import logging
import time

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("gradio_client")
from gradio_client import Client
from gradio_client.exceptions import AppError

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import faults, gpu, server
from demo.application import App
from demo.faults import Load
from demo.limits import Limits
from tests.demo.local_client import local_client
from tests.stubs import spaces as stub

pytestmark = pytest.mark.usefixtures("shared_rates")  # each pair timed once per session (tests/demo/conftest.py)
LIMITS = Limits(max_batch=2, max_steps=64, max_images=2, max_seconds=600.0)  # estimates on a busy CPU run long
SMALL = {"batch_size": 2, "ar_steps": 8, "gamma": 4}
QUICK = 30.0  # seconds: a named message, not a hang (the runs it stops take a few seconds on a 2-core CPU)
ENDPOINTS = ("generate", "analyze", "inspect", "frontier")
# What each endpoint asks for, as the message names it.
ASKED = {
    "generate": ("2 images", "try 1 or fewer \\(Images\\), or fewer AR steps"),
    "inspect": ("2 images", "try 1 or fewer \\(Images\\), or fewer AR steps"),
    "analyze": ("2 images", "try 1 or fewer \\(Images \\(n\\)\\), or fewer AR steps"),
    "frontier": ("1 image", "try fewer AR steps"),
}


def oom() -> Exception:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")


def illegal_access() -> Exception:
    return RuntimeError("CUDA error: an illegal memory access was encountered")


def expected(fault: str, endpoint: str) -> str:
    images, fewer = ASKED[endpoint]
    asked = f"for {images} at 8 AR steps"
    return {
        "gpu memory": f"^The GPU ran out of memory {asked}: {fewer}\\.$",
        "cpu memory": f"^The server ran out of memory \\(RAM\\) {asked}: {fewer}\\.$",
        "gpu kernel": f"^A kernel failed on the GPU {asked} \\(RuntimeError: CUDA error: an illegal memory access",
        "gpu kernel, by name": f"^A kernel failed on the GPU {asked}\\. The server has recovered: try again",
        "cpu kernel": f"^A kernel failed on the CPU {asked} \\(RuntimeError: matmul kernel failed\\)\\. The server",
        "aborted": "^GPU task aborted$",
        "quota": "^You have exceeded your GPU quota",
    }[fault]


# (name, the stub's fault, what the message says): mid-stream (after 3 events) inside the task, or before it.
ZERO_GPU_FAULTS = {
    "cuda oom, mid-stream": (lambda: stub.Fault(oom(), after=3), "gpu memory"),
    "cuda oom, as the call starts": (lambda: stub.Fault(oom(), after=0), "gpu memory"),
    "out of ram, mid-stream": (lambda: stub.Fault(MemoryError(), after=3), "cpu memory"),
    "kernel error, mid-stream": (lambda: stub.Fault(illegal_access(), after=3), "gpu kernel"),
    "kernel error, as the call starts": (lambda: stub.Fault(illegal_access(), after=0), "gpu kernel, by name"),
    "zero gpu abort": (
        lambda: stub.Fault(gr.Error("GPU task aborted", title=stub.WORKER_ERROR), after=2, where="host"),
        "aborted",
    ),
    "zero gpu quota": (
        lambda: stub.Fault(
            gr.Error("You have exceeded your GPU quota (75s requested vs. 12s left).", title="ZeroGPU quota exceeded"),
            after=0,
            where="host",
        ),
        "quota",
    ),
}


def controls(application: App, **overrides) -> dict:
    return {**application.default_controls(), **SMALL, **overrides}


def request(client: Client, application: App, endpoint: str):
    values = controls(application)
    analysis = {k: v for k, v in values.items() if k != "batch_size"}
    if endpoint == "generate":
        return client.predict(**values, api_name="/generate")
    if endpoint == "analyze":
        return client.predict(n_images=2, **analysis, api_name="/analyze")
    if endpoint == "frontier":
        return client.predict(n_images=1, regime=1, **analysis, api_name="/frontier")
    return client.predict(image=0, row=1, column=2, **values, api_name="/inspect")


def images(client: Client, application: App) -> list[np.ndarray]:
    """A /generate's target-only, CSD and draft-only images."""
    target, csd, _, draft, *_ = request(client, application, "generate")
    out = []
    for path in (target, csd, draft):
        with Image.open(path) as image:
            out.append(np.asarray(image.convert("RGB")))
    return out


def assert_nothing_left_broken(application: App) -> None:
    assert not any(lock.locked() for lock in application.timings.locks.values())  # no timing lock held
    assert not any(lock.locked() for lock in application.store._locks.values())  # no pair half-loaded
    assert stub.OPEN[0] == 0  # every GPU call closed


@pytest.fixture(scope="module")
def rates():
    """The untrained pair's rates, timed once for the module's two servers."""
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    return application.rates(application.store.get(RANDOM_SOURCE.name))


def serving(application: App):
    """Serve ``application``; yield it, a client and its images before any fault; close it after."""
    demo = server.build(application)
    client = local_client(server.serve(demo, LIMITS, "127.0.0.1", None, block=False))
    try:
        yield application, client, images(client, application)
    finally:
        demo.close()


def timed_app(rates) -> App:
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    application.timings.known[RANDOM_SOURCE.name] = rates
    return application


@pytest.fixture(scope="module")
def zero_gpu_served(rates):
    """The untrained pair served on ZeroGPU with the stand-in spaces package; its images before any fault."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gpu.ZERO_GPU_FLAG, "true")
        mp.setattr(gpu, "import_spaces", lambda: stub)
        mp.setattr(stub, "HOLD", [])
        mp.setattr(stub, "FAULTS", [])
        yield from serving(timed_app(rates))


@pytest.fixture
def released(monkeypatch) -> list[int]:
    """Each release of device memory: how many GPU calls were open then (as if CUDA were initialised)."""
    calls: list[int] = []
    monkeypatch.setattr(faults.torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(faults.torch.cuda, "empty_cache", lambda: calls.append(stub.OPEN[0]))
    return calls


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("case", list(ZERO_GPU_FAULTS))
def test_a_fault_on_zero_gpu_is_named_and_the_next_request_is_as_before(
    zero_gpu_served, released, caplog, case, endpoint
):
    application, client, before = zero_gpu_served
    make, kind = ZERO_GPU_FAULTS[case]
    fault = make()
    stub.FAULTS[:] = [fault]
    stub.FAILED.clear()
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="csd.demo"), pytest.raises(AppError, match=expected(kind, endpoint)):
        request(client, application, endpoint)
    assert time.monotonic() - t0 < QUICK
    assert [f["error"] for f in stub.FAILED] == [fault.error]  # the fault was raised, in this request's call
    assert application.history[-1]["status"] == ("error" if fault.where == "host" else faults.FAULT)
    if fault.where == "worker" and fault.after > 0:  # caught in the task: logged with its traceback, memory freed
        assert any(r.exc_info and r.exc_info[1] is not None for r in caplog.records if "failed" in r.getMessage())
        assert released and all(open_calls == 1 for open_calls in released)  # inside the GPU call
    assert_nothing_left_broken(application)
    after = images(client, application)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_analysis_still_completes_after_the_faults(zero_gpu_served):
    application, client, _ = zero_gpu_served
    stub.FAULTS[:] = [stub.Fault(oom(), after=3)]
    with pytest.raises(AppError, match="ran out of memory"):
        request(client, application, "analyze")
    status, *_ = request(client, application, "analyze")
    assert "Recomputed" in status
    assert_nothing_left_broken(application)


# --- the CPU path: no ZeroGPU, the model itself raises mid-run -------------------------------------------------


@pytest.fixture(scope="module")
def cpu_served(rates):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(gpu.ZERO_GPU_FLAG, raising=False)
        yield from serving(timed_app(rates))


CPU_FAULTS = {
    "out of ram": (MemoryError, "cpu memory"),
    "allocator out of memory": (lambda: torch.OutOfMemoryError("DefaultCPUAllocator: not enough memory"), "cpu memory"),
    "kernel error": (lambda: RuntimeError("matmul kernel failed"), "cpu kernel"),
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("case", list(CPU_FAULTS))
def test_a_model_run_that_raises_mid_stream_on_the_cpu_is_named(cpu_served, case, endpoint):
    application, client, before = cpu_served
    make, kind = CPU_FAULTS[case]
    target = application.store.get(RANDOM_SOURCE.name).target
    calls = [0]

    def fail_on_the_third_pass(module, args):  # some AR steps in: progress was reported
        calls[0] += 1
        if calls[0] == 3:
            raise make()

    hooks = [m.register_forward_pre_hook(fail_on_the_third_pass) for m in target.modules()]
    try:
        t0 = time.monotonic()
        with pytest.raises(AppError, match=expected(kind, endpoint)):
            request(client, application, endpoint)
        assert time.monotonic() - t0 < QUICK
    finally:
        for hook in hooks:
            hook.remove()
    assert calls[0] >= 3 and application.history[-1]["status"] == faults.FAULT
    assert not any(lock.locked() for lock in application.timings.locks.values())
    for a, b in zip(before, images(client, application), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_analysis_still_completes_after_a_fault_on_the_cpu(cpu_served):
    application, client, _ = cpu_served
    status, *_ = request(client, application, "analyze")
    assert "Recomputed" in status


# --- the messages and the release, alone -----------------------------------------------------------------------


def test_each_fault_is_named_for_what_the_request_asked():
    many, one = Load(8, 64), Load(1, 64, "Images (n)")
    assert faults.message(faults.GPU_MEMORY, "", many) == (
        "The GPU ran out of memory for 8 images at 64 AR steps: try 4 or fewer (Images), or fewer AR steps."
    )
    assert faults.message(faults.GPU_MEMORY, "", one) == "The GPU ran out of memory for 1 image at 64 AR steps: " + (
        "try fewer AR steps."
    )
    assert faults.kind_of(oom(), on_gpu=False) == faults.GPU_MEMORY  # the message names CUDA
    assert faults.kind_of(torch.OutOfMemoryError("not enough memory"), on_gpu=False) == faults.CPU_MEMORY
    assert faults.kind_of(MemoryError(), on_gpu=True) == faults.CPU_MEMORY
    assert faults.kind_of(torch.AcceleratorError("CUDA error: device-side assert"), on_gpu=True) == faults.GPU_KERNEL
    assert faults.kind_of(RuntimeError("bad kernel"), on_gpu=False) == faults.CPU_KERNEL
    assert faults.kind_of(KeyError("x"), on_gpu=True) == faults.OTHER
    long = faults.detail_of(RuntimeError("x" * 1000 + "\nsecond line"))
    assert len(long) == faults.DETAIL and long.startswith("RuntimeError: xxx") and "second" not in long


def test_a_worker_error_is_named_by_its_class_and_zero_gpus_own_errors_pass_as_they_are():
    load = Load(2, 8)
    named = faults.crossed(gr.Error("OutOfMemoryError", title=faults.WORKER_ERROR), load, on_gpu=True)
    assert named.message.startswith("The GPU ran out of memory for 2 images at 8 AR steps")
    other = faults.crossed(gr.Error("KeyError", title=faults.WORKER_ERROR), load, on_gpu=True)
    assert other.message.startswith("The model run failed for 2 images at 8 AR steps (KeyError)")
    for own in (gr.Error("GPU task aborted", title=faults.WORKER_ERROR), gr.Error("quota", title="ZeroGPU quota")):
        assert faults.crossed(own, load, on_gpu=True) is own


def test_releasing_memory_empties_cudas_cache_only_where_cuda_is_initialised(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    faults.release_memory()
    assert emptied == []  # never starts CUDA (on ZeroGPU's main process that would fail)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    faults.release_memory()
    assert emptied == [1]
