"""The suite's CPU lock (tests/cpu_lock.py), between processes as the workers hold it: an ``alone`` hold has
no other beside it, shared holds run together, an ``alone`` hold that waits is not passed by later shared ones,
and a process started inside a hold takes none."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests import cpu_lock

ROOT = Path(__file__).resolve().parents[2]
# A holder: takes the lock (alone or shared), logs when it holds it and when it lets go.
HOLDER = """
import sys, time
from pathlib import Path
from tests.cpu_lock import hold
name, alone, seconds, folder = sys.argv[1], sys.argv[2] == "alone", float(sys.argv[3]), Path(sys.argv[4])
log = folder / "log"
with open(folder / f"{name}.waiting", "w"):
    pass
with hold(alone, folder / "lock", folder / "gate"):
    with open(log, "a") as f:
        f.write(f"in {name}\\n")
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"out {name}\\n")
"""


def start(folder: Path, name: str, alone: bool, seconds: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != cpu_lock.HELD}  # this test runs inside a hold itself
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, "alone" if alone else "shared", str(seconds), str(folder)],
        cwd=ROOT,
        env=env,
    )


def wait_for(path: Path, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.01)


def log(folder: Path) -> list[str]:
    return (folder / "log").read_text().split("\n")[:-1]


def finish(*runs: subprocess.Popen) -> None:
    for run in runs:
        assert run.wait(60) == 0


def test_an_alone_hold_has_no_other_beside_it_and_shared_holds_run_together(tmp_path):
    a = start(tmp_path, "a", alone=False, seconds=3.0)
    b = start(tmp_path, "b", alone=False, seconds=3.0)
    end = time.monotonic() + 30
    while len(log(tmp_path) if (tmp_path / "log").exists() else []) < 2:  # both in, or one out: the shared two
        assert time.monotonic() < end, "the shared holders never came in"
        time.sleep(0.01)
    c = start(tmp_path, "c", alone=True, seconds=0.5)
    finish(a, b, c)
    lines = log(tmp_path)
    assert set(lines[:2]) == {"in a", "in b"}, lines  # the shared two together
    assert lines[-2:] == ["in c", "out c"], lines  # the alone one after both, with none beside it


def test_an_alone_hold_that_waits_goes_before_shared_holds_asked_for_later(tmp_path):
    first = start(tmp_path, "first", alone=False, seconds=1.5)
    wait_for(tmp_path / "log")
    alone = start(tmp_path, "alone", alone=True, seconds=0.5)
    wait_for(tmp_path / "alone.waiting")
    time.sleep(0.3)  # it waits for the lock, holding the gate
    later = start(tmp_path, "later", alone=False, seconds=0.1)
    finish(first, alone, later)
    assert log(tmp_path) == ["in first", "out first", "in alone", "out alone", "in later", "out later"]


def test_a_process_started_inside_a_hold_takes_none(tmp_path, monkeypatch):
    holder = start(tmp_path, "holder", alone=True, seconds=30.0)
    wait_for(tmp_path / "log")
    try:
        monkeypatch.setenv(cpu_lock.HELD, "alone")  # as a rerun started by a test that holds the lock
        began = time.monotonic()
        with cpu_lock.hold(True, tmp_path / "lock", tmp_path / "gate"):
            pass
        assert time.monotonic() - began < 5.0  # it did not wait for the holder's 30 s
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.delenv(cpu_lock.HELD)
    with cpu_lock.hold(False, tmp_path / "lock", tmp_path / "gate"):
        assert os.environ[cpu_lock.HELD] == "shared"  # what the processes a hold starts find
    assert cpu_lock.HELD not in os.environ
