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
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

pytest.importorskip("gradio_client")

import demo.application
from csd.experiments.defaults import PRESETS
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import gpu, server
from demo.application import App, pair_defaults
from demo.estimate import Rates
from demo.gpu import GpuCalls
from demo.limits import Limits
from demo.tab import Page
from demo.tabs.analyze import check_analysis, plan_analysis, plan_frontier
from demo.tabs.generate import RUN_KINDS, GenerateTab, check_generate, compare
from tests.demo.local_client import local_client
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
    """generate, analyze, frontier, inspect, the start-up timing and the warm-up comparison: each a call of the
    decorated function, asking for a duration within the cap; no model runs outside one."""
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    assert on_zero_gpu.DECORATED and on_zero_gpu.DECORATED[-1].__name__ == "_run"
    outside = outside_calls(application)
    server.warm_up(application)
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
    assert tasks == ["calibrate", "compare", "compare", "analysis", "frontier", "inspect"], tasks
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


def test_stop_closes_the_gpu_call_and_its_job(on_zero_gpu):
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    application.rates(application.store.get(RANDOM_SOURCE.name))
    events = compare(application, NO_PROGRESS, **controls(application, ar_steps=32))
    next(events)  # the first AR step is in: the call is under way
    assert on_zero_gpu.OPEN[0] == 1
    events.close()  # what Stop does to the page's handler
    assert on_zero_gpu.OPEN[0] == 0 and application.history[-1]["status"] == "stopped"


def twin(name: str = "slow twin"):
    """The untrained pair's source under another name: a second pair that loads at once."""
    return replace(RANDOM_SOURCE, name=name, load=lambda device: replace(RANDOM_SOURCE.load(device), name=name))


class Held:
    """A hold for the stand-in (its ``HOLD``): the GPU call timing ``pair`` waits until :attr:`release` is set."""

    def __init__(self, pair: str):
        self.pair, self.started, self.release = pair, threading.Event(), threading.Event()

    def __call__(self, task, values, estimate):
        if task == "calibrate" and values["pair_name"] == self.pair:
            self.started.set()
            self.release.wait(120)


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


QUICK = Rates(one={"target": 0.01, "draft": 0.005, "csd": 0.01}, many={"target": 0.02, "draft": 0.01, "csd": 0.02})


WAITING = r"Waiting for the slow twin pair's timing as the server starts \(about \d+ s\) \.\.\."


def test_while_a_pair_is_timed_the_others_are_served_and_its_own_requests_wait_for_it(on_zero_gpu, monkeypatch):
    """The start-up timing of one pair (a slow GPU call) holds nothing else: another pair's rates, its
    validators' checks and its handlers' runs come at once. A validator on the pair being timed answers at once
    and does not refuse (its time check waits for the rates, as for a pair not timed yet); a Generate on it
    refuses a value out of range at once, else waits for the timing, saying so, and runs once the timing is in,
    without timing the pair a second time."""
    monkeypatch.setattr(
        demo.application, "calibrate", lambda *args: QUICK
    )  # the timing's result (its GPU call is held)
    slow = twin()
    application = App(PairStore([RANDOM_SOURCE, slow], torch.device("cpu")), LIMITS)
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    timed = application.store.get(RANDOM_SOURCE.name)
    application.rates(timed)
    held = Held(slow.name)
    on_zero_gpu.HOLD.append(held)
    timing = threading.Thread(target=application.rates, args=(application.store.get(slow.name),), daemon=True)
    timing.start()  # the start-up timing (demo.server.warm_up) of the second pair
    values = controls(application)
    slow_values = values | {"pair_name": slow.name}
    updates: list[dict] = []
    waiting = threading.Thread(target=lambda: updates.extend(tab.generate(None, **slow_values)), daemon=True)
    try:
        assert held.started.wait(30) and application.timing(slow.name)
        analysis = {k: v for k, v in values.items() if k != "batch_size"}
        assert within(1.0, application.rates, timed) is application.rates(timed)
        for load in (False, True):  # a validator's check, then the handler's
            assert within(1.0, check_generate, application, None, load, **values) is not None
            assert within(1.0, check_analysis, application, 1, None, load, **analysis) is not None
        assert within(1.0, check_generate, application, None, False, **slow_values) is not None  # not refused
        assert within(1.0, check_analysis, application, 1, None, False, **(analysis | {"pair_name": slow.name}))
        with pytest.raises(gr.Error, match="Batch size must be"):  # a value out of range: refused before any wait
            within(1.0, next, tab.generate(None, **(slow_values | {"batch_size": 3})))
        line = within(1.0, next, application.await_rates(slow.name))
        assert re.fullmatch(WAITING, line), line
        waiting.start()  # a Generate on the pair being timed: waits in its handler
        deadline = time.monotonic() + 5
        while not updates and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting.is_alive() and updates and re.fullmatch(WAITING, updates[0][tab.stats]), updates
        *_, result = compare(application, NO_PROGRESS, **values)  # the timed pair runs meanwhile
        assert result.pair_name == RANDOM_SOURCE.name and waiting.is_alive() and application.timing(slow.name)
    finally:
        held.release.set()
        timing.join(60)
    waiting.join(120)
    assert not waiting.is_alive() and updates[-1][tab.stats].startswith("### Speedup"), updates[-1]
    assert application.timed(slow.name) and not application.timing(slow.name)
    assert [c["task"] for c in on_zero_gpu.CALLS] == ["calibrate", "calibrate", "compare", "compare"]  # timed once


ZERO_GPU_START = """
import json, sys, threading, time
import socket
with socket.socket() as s:  # a free port
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
sys.argv = ["app.py", "--port", str(port), "--host", "127.0.0.1"]
import app  # the entry point: spaces first, then the server
import spaces
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import DEVICE, PRECISION, App

made = []
def make_app(checkpoints, limits, hub=None):
    made.append(App(PairStore([RANDOM_SOURCE], DEVICE), limits))
    return made[-1]
server.make_app = make_app
urls = []
serve = server.serve
server.serve = lambda *args, **kwargs: urls.append(serve(*args, **kwargs)) or urls[-1]
threading.Thread(target=app.main, daemon=True).start()
deadline = time.monotonic() + 600
warm = lambda: made and made[0].timed(RANDOM_SOURCE.name) and spaces.CALLS[-1]["task"] == "compare"
while not (urls and warm() and not spaces.OPEN[0]):
    assert time.monotonic() < deadline, "the server did not start"
    time.sleep(0.2)
from tests.demo.local_client import local_client
values = {**made[0].default_controls(), "batch_size": 1, "ar_steps": 8}
local_client(urls[0]).predict(**values, api_name="/generate")
print(json.dumps({"device": str(DEVICE), "precision": PRECISION, "placed": spaces.PLACED, "calls": spaces.CALLS}))
"""


@pytest.mark.slow
def test_on_zero_gpu_the_app_starts_serves_and_times_its_pairs_without_initialising_cuda(tmp_path):
    """``python app.py`` as a ZeroGPU Space runs it (flag set, the stand-in's torch patch: CUDA "available"
    but any initialisation raises): it places its models on CUDA the ZeroGPU way, serves, then times each pair
    in GPU calls; a visitor's request is one more call."""
    env = os.environ | {gpu.ZERO_GPU_FLAG: "true", "PYTHONPATH": f"{ROOT / 'tests' / 'stubs'}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-c", ZERO_GPU_START], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout.splitlines()
    record = json.loads(out[-1])
    assert record["device"] == "cuda" and record["precision"] == "bfloat16"
    assert record["placed"] and {"MAR"} <= set(record["placed"])  # loaded on the CPU, then placed on CUDA
    assert [c["task"] for c in record["calls"]] == ["calibrate", "compare", "compare"]
    serving = next(i for i, line in enumerate(out) if "ZeroGPU" in line and "serving, then timing" in line)
    timed = next(i for i, line in enumerate(out) if line.startswith("Timed "))
    assert serving < timed  # the page is up before the first GPU call


ZERO_GPU_TIMING = """
import json, os, re, socket, sys, threading, time
from dataclasses import replace
with socket.socket() as s:  # a free port
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
# two runs at once: a request waiting for its pair's timing holds one (docs/space.md)
sys.argv = ["app.py", "--port", str(port), "--host", "127.0.0.1", "--concurrency", "2"]
import app  # the entry point: spaces first, then the server
import spaces
from csd.serving.pairs import RANDOM_SOURCE, PairStore
import demo.application
from demo import server
from demo.application import DEVICE, App
from tests.demo.test_zero_gpu import QUICK, WAITING, Held, twin

slow = twin()
made, urls = [], []
def make_app(checkpoints, limits, hub=None):
    made.append(App(PairStore([RANDOM_SOURCE, slow], DEVICE), limits))
    return made[-1]
server.make_app = make_app
serve = server.serve
server.serve = lambda *args, **kwargs: urls.append(serve(*args, **kwargs)) or urls[-1]
# what a timing measures is not at issue here: how long it holds the GPU is
demo.application.calibrate = lambda *args: QUICK
held = Held(slow.name)  # the stand-in's GPU is slow: the second pair's timing takes until released
spaces.HOLD.append(held)
threading.Thread(target=app.main, daemon=True).start()
assert held.started.wait(600), "the second pair's timing did not start"
from gradio_client.utils import Status
from tests.demo.local_client import local_client

client, record = local_client(urls[0]), {}
values = {**made[0].default_controls(), "batch_size": 1, "ar_steps": 8}
analysis = {k: v for k, v in values.items() if k != "batch_size"}

def joined(job, t0):  # seconds until the server answered the join (the job is queued or running), at most 5
    while job.status().code in (Status.STARTING, Status.JOINING_QUEUE) and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    return time.monotonic() - t0

def statuses(job):
    return [out[4] for out in job.outputs() if isinstance(out[4], str)]

t0 = time.monotonic()
waiting = client.submit(**(values | {"pair_name": slow.name}), api_name="/generate")  # the pair being timed
record["waiting joined"] = joined(waiting, t0)
while not any(re.fullmatch(WAITING, line) for line in statuses(waiting)) and time.monotonic() - t0 < 10:
    time.sleep(0.05)
record["waiting says"] = statuses(waiting)[-1:]
record["waiting told in"] = time.monotonic() - t0
t0 = time.monotonic()
generate = client.submit(**values, api_name="/generate")
record["generate joined"] = joined(generate, t0)
t0 = time.monotonic()
analyze = client.submit(n_images=1, **analysis, api_name="/analyze")
record["analyze joined"] = joined(analyze, t0)
if record["generate joined"] < 5:
    generate.result(timeout=300)
    record["generated"] = made[0].history[-1]["status"]
record["still timing"] = made[0].timing(slow.name)
record["still waiting"] = not waiting.done()
held.release.set()
out = waiting.result(timeout=300)
record["waited then ran"] = out[4][:20]
record["calibrations"] = [c["task"] for c in spaces.CALLS].count("calibrate")
print(json.dumps(record), flush=True)
os._exit(0)  # the analysis queued above is not waited for
"""


def test_on_zero_gpu_a_request_on_a_pair_being_timed_waits_in_the_queue_and_the_others_run(tmp_path):
    """``python app.py`` on ZeroGPU (the stand-in, whose GPU call timing the second pair is slow): while that
    timing runs, a Generate on that pair joins the queue within 1 s, says it waits for the timing, and runs once
    the timing is in; meanwhile a Generate and an analysis on the timed pair join within 1 s and the Generate
    completes. Each pair is timed once."""
    env = os.environ | {gpu.ZERO_GPU_FLAG: "true", "PYTHONPATH": f"{ROOT / 'tests' / 'stubs'}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-c", ZERO_GPU_TIMING], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads(run.stdout.splitlines()[-1])
    assert record["waiting joined"] < 1 and record["waiting told in"] < 5, record
    assert re.fullmatch(WAITING, record["waiting says"][0]), record
    assert record["generate joined"] < 1 and record["analyze joined"] < 1, record
    assert record["generated"] == "done" and record["still timing"] and record["still waiting"], record
    assert record["waited then ran"].startswith("### Speedup"), record
    assert record["calibrations"] == 2, record
