"""``python app.py`` as an operator starts it: the page answers first, the pairs are timed after, and the first
Generate runs once its pair is timed. How long each takes is recorded (reported, not asserted) in
``tests/.times/start_up.json`` (docs/testing.md, "Time")."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gradio_client")
import httpx

from tests.demo.local_client import local_client

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / ".times" / "start_up.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(seconds: float, ready) -> float:
    """Seconds until ``ready()`` is true, polled every 0.1 s; fails past ``seconds``."""
    t0 = time.monotonic()
    while not ready():
        assert time.monotonic() - t0 < seconds, f"not ready within {seconds} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_python_app_py_serves_the_page_before_timing_its_pairs_and_then_generates(tmp_path):
    """The page answers before the first pair's timing is in; a Generate at the page's defaults, sent as soon as
    the page answers, waits for its pair's timing and completes. Seconds to the page and to that first result
    are written to the record."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False", "CSD_THREADS": "1"}
    env.pop("SPACES_ZERO_GPU", None)
    log = tmp_path / "app.log"
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        until(300, lambda: answers(url) or server.poll() is not None)
        assert server.poll() is None, log.read_text()[-3000:]
        to_page = time.monotonic() - t0
        timed_at_page = log.read_text().count("Timed ")
        out = local_client(url).predict(api_name="/generate")  # the page's defaults
        to_result = time.monotonic() - t0
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    text = log.read_text()
    assert out[4].startswith("### Speedup"), out[4]
    serving = next(i for i, line in enumerate(text.splitlines()) if "serving, then timing each pair" in line)
    first_timed = next(i for i, line in enumerate(text.splitlines()) if line.startswith("Timed "))
    assert serving < first_timed and timed_at_page == 0, text[-3000:]  # the page before the first timing
    record = {
        "seconds_to_page": round(to_page, 2),
        "seconds_to_first_generate": round(to_result, 2),
        "pairs_timed_when_the_page_answered": timed_at_page,
        "timed": [line for line in text.splitlines() if line.startswith("Timed ")],
        "load_average_at_start": round(load, 2),
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))
