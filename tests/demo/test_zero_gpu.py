"""The Space on ZeroGPU: every model run of the app is a call of one ``spaces.GPU`` function (demo.gpu), each
asking for its own estimate with a margin, at most ``--gpu-seconds``; a request past that is refused by name
before it queues; nothing touches CUDA in the main process. Checked with the real ``spaces`` package (off
ZeroGPU: a pass-through) and with a recording stand-in (tests/stubs/spaces) that emulates ZeroGPU's side:
the durations asked for, arguments and results crossing a process boundary (pickled), torch patched as on a
ZeroGPU Space's main process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

pytest.importorskip("gradio_client")

from csd.experiments.defaults import PRESETS
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import gpu, server
from demo.application import App, pair_defaults
from demo.gpu import GpuCalls
from demo.limits import Limits
from demo.tab import Page
from demo.tabs.analyze import check_analysis, plan_analysis, plan_frontier
from demo.tabs.generate import RUN_KINDS, GenerateTab, check_generate, compare
from tests.demo.local_client import local_client
from tests.demo.slow_pair import slowed
from tests.stubs import spaces as stub

pytestmark = pytest.mark.usefixtures("shared_rates")  # each pair timed once per session (tests/demo/conftest.py)
ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(max_batch=2, max_steps=64, max_images=2)
NO_PROGRESS = lambda *args, **kwargs: None


def controls(application: App, **overrides) -> dict:
    return {**application.default_controls(), "batch_size": 1, "ar_steps": 8, "gamma": 4, **overrides}


@pytest.fixture
def on_zero_gpu(monkeypatch):
    """ZeroGPU's flag set and the recording stand-in in place of the spaces package, its records cleared."""
    monkeypatch.setenv(gpu.ZERO_GPU_FLAG, "true")
    monkeypatch.setattr(gpu, "import_spaces", lambda: stub)
    monkeypatch.setattr(stub, "HOLD", [])
    stub.CALLS.clear()
    return stub


def outside_calls(application: App) -> list[str]:
    """Forward hooks on the served pairs' models: the modules that ran while no GPU call was open."""
    seen: list[str] = []
    for name in application.store.names:
        pair = application.store.get(name)
        for model in (pair.target, pair.draft):
            model.register_forward_pre_hook(lambda module, args: stub.OPEN[0] or seen.append(type(module).__name__))
    return seen


def test_with_the_real_spaces_package_off_zero_gpu_calls_run_in_process(monkeypatch):
    """The real package is a requirement, imported, and a pass-through here: the app's GPU function is its own."""
    spaces = pytest.importorskip("spaces")
    monkeypatch.delenv(gpu.ZERO_GPU_FLAG, raising=False)
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    assert application.gpu.spaces is spaces and "tests/stubs" not in spaces.__file__
    assert application.gpu._call == application.gpu._run  # spaces.GPU returned the function itself
    *_, result = compare(application, NO_PROGRESS, **controls(application))
    assert result.images["target"].dtype == np.uint8 and result.pair_name == RANDOM_SOURCE.name


def test_every_model_running_endpoint_runs_inside_a_gpu_call(on_zero_gpu):
    """generate, analyze, frontier, inspect and the server's timing of its pair: each a call of the decorated
    function, asking for a duration within the cap; no model runs outside one."""
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    assert on_zero_gpu.DECORATED and on_zero_gpu.DECORATED[-1].__name__ == "_run"
    outside = outside_calls(application)
    application.idle_work()
    demo = server.build(application)
    url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False)
    try:
        client = local_client(url)
        values = controls(application)
        client.predict(**values, api_name="/generate")
        analysis = {k: v for k, v in values.items() if k != "batch_size"}
        client.predict(n_images=1, **analysis, api_name="/analyze")
        client.predict(n_images=1, regime=1, **analysis, api_name="/frontier")
        client.predict(image=0, row=1, column=2, **values, api_name="/inspect")
    finally:
        demo.close()
    tasks = [c["task"] for c in on_zero_gpu.CALLS]
    assert tasks == ["calibrate", "compare", "analysis", "frontier", "inspect"], tasks
    assert all(0 < c["duration"] <= LIMITS.gpu_seconds for c in on_zero_gpu.CALLS)
    assert outside == []


def test_the_duration_is_positive_and_within_the_cap_for_every_pairs_defaults_and_presets(on_zero_gpu):
    """Every embedded pair's default Generate and each preset, its default analysis and frontier recomputes:
    the duration asked for is whole seconds, positive, its estimate with the margin, at most the cap."""
    application = server.make_app(None, LIMITS)
    cap = application.limits.gpu_seconds
    asked = {}
    for pair in application.store.names:
        base = pair_defaults(application, application.default_controls(), pair)
        for preset in PRESETS:
            values = application.preset(preset, base)  # the pair's fixed knobs stay
            r = check_generate(application, None, True, False, **values)  # whether it fits this CPU: not asked
            asked[pair, preset] = application.estimate(r, RUN_KINDS), values
        analysis = {k: v for k, v in base.items() if k != "batch_size"}
        for name, plan in (("analysis", plan_analysis), ("frontier", plan_frontier)):
            r, work = plan(application, 2, None, True, **analysis)
            asked[pair, name] = application.estimate_runs(r, work.planned(), 2), analysis
    assert len(asked) == len(application.store.names) * (len(PRESETS) + 2)
    for (pair, name), (seconds, values) in asked.items():
        duration = application.gpu.duration(name, values, seconds)
        assert isinstance(duration, int) and 0 < duration <= cap, (pair, name, duration)
        assert duration == min(cap, math.ceil(seconds * gpu.MARGIN + gpu.OVERHEAD)), (pair, name)
    calibrations = [c for c in on_zero_gpu.CALLS if c["task"] == "calibrate"]
    assert len(calibrations) == len(application.store.names)  # each pair timed once, in a GPU call


def test_a_request_past_the_gpu_cap_is_refused_by_name_before_it_queues(on_zero_gpu, monkeypatch):
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    values = controls(application, ar_steps=64, batch_size=2)
    application.rates(application.store.get(RANDOM_SOURCE.name))
    asked = {  # what each call would ask for: this machine's estimate x 1.5 + 10 s
        name: application.gpu.seconds(
            application.estimate(check_generate(application, None, True, False, **v), RUN_KINDS)
        )
        for name, v in (("large", values), ("small", controls(application)))
    }
    assert asked["large"] > asked["small"]
    cap = (asked["large"] + asked["small"]) / 2  # between them, whatever this machine's speed
    application.gpu.cap = cap
    with pytest.raises(
        gr.Error, match=rf"more than the {cap:.0f} s one GPU call may take on this Space \(--gpu-seconds\)"
    ):
        next(compare(application, NO_PROGRESS, **values))
    assert [c["task"] for c in on_zero_gpu.CALLS] == ["calibrate"]  # refused before any call
    assert check_generate(application, None, True, **controls(application)) is not None  # a small one fits
    monkeypatch.delenv(gpu.ZERO_GPU_FLAG)  # off ZeroGPU there is no call to cap
    assert check_generate(application, None, True, **values) is not None


def test_a_gpu_call_asks_for_its_estimate_with_the_margin_within_the_cap():
    calls = GpuCalls(None, cap=120.0, spaces_module=None)
    assert calls.duration("compare", {}, 4.0) == 16  # 4 x 1.5 + 10
    assert calls.duration("compare", {}, 0.0) == 10
    assert calls.duration("compare", {}, 500.0) == 120
    with pytest.raises(KeyError, match="no GPU task 'nothing'"):
        calls.call("nothing", {}, 1.0)


def test_the_line_counts_a_request_for_the_duration_its_gpu_call_asks_for_on_zero_gpu_its_estimate_elsewhere(
    monkeypatch,
):
    """ZeroGPU grants a call its asked duration: the line's wait and limit count that, so two requests estimated
    at 12 s fill a 30 s line there (28 s each) and fit in it on a CPU (12 s each)."""
    limits = Limits(max_wait=30.0, gpu_seconds=60.0)
    on_cpu = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits)
    assert on_cpu.line_seconds(12.0) == 12.0
    on_cpu.line.join(on_cpu.line_seconds(12.0), "fewer images")
    assert on_cpu.line.join(on_cpu.line_seconds(12.0), "fewer images") is not None
    monkeypatch.setenv(gpu.ZERO_GPU_FLAG, "true")
    on_zero = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits, gpu=GpuCalls(None, 60.0, None))
    assert on_zero.line_seconds(12.0) == 28 and on_zero.line_seconds(100.0) == 60  # 12 x 1.5 + 10; the cap
    on_zero.line.join(on_zero.line_seconds(12.0), "fewer images")
    with pytest.raises(gr.Error, match=r"This request would be about 56 s in line here \(about 28 s to wait"):
        on_zero.line.join(on_zero.line_seconds(12.0), "fewer images")


def test_stop_closes_the_gpu_call_and_its_job(on_zero_gpu):
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    application.rates(application.store.get(RANDOM_SOURCE.name))
    events = compare(application, NO_PROGRESS, **controls(application, ar_steps=32))
    next(events)  # the first AR step is in: the call is under way
    assert on_zero_gpu.OPEN[0] == 1
    events.close()  # what Stop does to the page's handler
    assert on_zero_gpu.OPEN[0] == 0 and application.history[-1]["status"] == "stopped"


def within(seconds: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``'s result, or its error raised here: either must come within ``seconds``."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except Exception as err:
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} gave no answer within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def until(seconds: float, ready) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.01)


def test_the_servers_timing_of_a_pair_gives_way_to_a_request_and_is_taken_up_again_once_the_line_is_empty(
    on_zero_gpu,
):
    """While the server times a pair (its own work, in a GPU call, run only while the line is empty), the validators
    of requests on that pair answer at once and do not refuse (their time check waits for the rates), and a
    Generate on another pair joins: the timing gives way within an AR step (its call closed), the Generate starts
    within a second and completes, and the timing is taken up again once the line is empty, to its end."""
    slow, limits = slowed("slow twin"), Limits(max_batch=2, max_steps=8, max_images=2)
    application = App(PairStore([RANDOM_SOURCE, slow], torch.device("cpu")), limits)
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    application.rates(application.store.get(RANDOM_SOURCE.name))
    log: list[str] = []
    server_work = threading.Thread(target=application.idle_work, args=(log.append,), daemon=True)
    server_work.start()
    until(30, lambda: len(on_zero_gpu.CALLS) == 2 and on_zero_gpu.OPEN[0] == 1)  # the twin's timing is under way
    time.sleep(0.3)  # a few of its AR steps in
    twin_values = controls(application, pair_name=slow.name)
    analysis = {k: v for k, v in twin_values.items() if k != "batch_size"}
    assert within(1.0, check_generate, application, None, False, **twin_values) is not None  # a validator: at once
    assert within(1.0, check_analysis, application, 1, None, False, **analysis) is not None
    t0, seen = time.monotonic(), []
    for update in tab.generate(None, **controls(application)):
        seen.append((time.monotonic() - t0, update.get(tab.stats)))
    started = next(t for t, line in seen if line == "Starting ...")
    assert started < 1.0, seen[:3]
    assert seen[-1][1].startswith("### Speedup") and not application.timed(slow.name)  # it gave way, not done
    server_work.join(60)
    assert application.timed(slow.name) and len(log) == 1 and log[0].startswith(f"Timed {slow.name} in ")
    assert [c["task"] for c in on_zero_gpu.CALLS] == ["calibrate", "calibrate", "compare", "calibrate"]
    assert on_zero_gpu.OPEN[0] == 0


ZERO_GPU_START = """
import json, os, re, socket, sys, threading, time
with socket.socket() as s:  # a free port
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
sys.argv = ["app.py", "--port", str(port), "--host", "127.0.0.1"]
import app  # the entry point: spaces first, then the server
import spaces
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import DEVICE, PRECISION, App
from tests.demo.slow_pair import slowed

slow = slowed("slow twin")
made, urls = [], []
def make_app(checkpoints, limits, hub=None):
    made.append(App(PairStore([RANDOM_SOURCE, slow], DEVICE), limits))
    return made[-1]
server.make_app = make_app
serve = server.serve
server.serve = lambda *args, **kwargs: urls.append(serve(*args, **kwargs)) or urls[-1]
threading.Thread(target=app.main, daemon=True).start()
deadline = time.monotonic() + 600
twin_timing = lambda: [c["task"] for c in spaces.CALLS] == ["calibrate", "calibrate"] and spaces.OPEN[0] == 1
while not (urls and twin_timing()):  # the server serves and times its second pair
    assert time.monotonic() < deadline, "the server did not start timing its second pair"
    time.sleep(0.01)
time.sleep(0.3)  # a few of its AR steps in
from gradio_client.utils import Status
from tests.demo.local_client import local_client

client, record = local_client(urls[0]), {}
values = {**made[0].default_controls(), "batch_size": 1, "ar_steps": 8, "pair_name": slow.name}
t0 = time.monotonic()
job = client.submit(**values, api_name="/generate")  # on the pair being timed
while job.status().code in (Status.STARTING, Status.JOINING_QUEUE) and time.monotonic() - t0 < 5:
    time.sleep(0.01)
record["joined in"] = time.monotonic() - t0
out = job.result(timeout=300)
record["statuses"] = [o[4] for o in job.outputs() if isinstance(o[4], str)][:3]
record["result"] = out[4][:20]
while made[0].timings.missing():  # the server's own work ends
    time.sleep(0.05)
calls = {"calls": spaces.CALLS, "placed": spaces.PLACED}
print(json.dumps(record | calls | {"device": str(DEVICE), "precision": PRECISION}), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_on_zero_gpu_the_app_starts_serves_and_times_its_pairs_without_initialising_cuda(tmp_path):
    """``python app.py`` as a ZeroGPU Space runs it (flag set, the stand-in's torch patch: CUDA "available"
    but any initialisation raises): it places its models on CUDA the ZeroGPU way, serves, then times each pair
    in a GPU call while its line is empty. A Generate on the pair being timed joins at once, the timing gives way
    to it, and its own turn times the pair (one more GPU call), then runs it (one more)."""
    env = os.environ | {gpu.ZERO_GPU_FLAG: "true", "PYTHONPATH": f"{ROOT / 'tests' / 'stubs'}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-c", ZERO_GPU_START], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout.splitlines()
    record = json.loads(out[-1])
    assert record["device"] == "cuda" and record["precision"] == "bfloat16"
    assert record["placed"] and {"MAR"} <= set(record["placed"])  # loaded on the CPU, then placed on CUDA
    assert record["joined in"] < 1, record
    assert record["statuses"][-2:] == ["Timing the slow twin pair (its first use on this server) ...", "Starting ..."]
    assert record["result"].startswith("### Speedup"), record
    assert [c["task"] for c in record["calls"]] == ["calibrate", "calibrate", "calibrate", "compare"], record
    serving = next(i for i, line in enumerate(out) if "ZeroGPU" in line and "serving, then timing" in line)
    timed = next(i for i, line in enumerate(out) if line.startswith("Timed "))
    assert serving < timed  # the page is up before the first GPU call
