"""One lock across the suite's worker processes: a test marked ``alone`` runs with the CPU its own.

The crowd test (tests/demo/test_crowd.py) compares the waits its server predicts with the waits measured: a
test on the other of two cores changes what a turn takes between the moment the line learns it and the moment
it is measured (docs/testing.md, "Timed tests run alone").

Every test holds the lock shared for its whole run (setup, call, teardown: a module's fixtures start inside
its first test's hold), an ``alone`` test holds it exclusive. A ``gate`` lock gives the exclusive holder its
turn: it takes the gate before waiting for the lock, and a test that would share takes the gate before the
lock, so the other worker cannot start test after test while an ``alone`` test waits. A process started
inside a hold (a perturbation rerun is a whole pytest process) finds ``HELD`` in its environment and takes
nothing: its parent's hold covers it, and waiting would deadlock against an ``alone`` test waiting for that
parent.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

FOLDER = Path(tempfile.gettempdir())
LOCK_FILE = FOLDER / f"csd-tests-cpu-{os.getuid()}.lock"
GATE_FILE = FOLDER / f"csd-tests-cpu-gate-{os.getuid()}.lock"
HELD = "CSD_TESTS_CPU_HELD"  # set while a hold lasts, so the processes it starts take none


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def hold(alone: bool, lock: Path = LOCK_FILE, gate: Path = GATE_FILE) -> Iterator[None]:
    """Hold the suite's CPU lock: ``alone`` (no other test runs meanwhile) or shared with the other tests;
    nothing where a hold of this process's parent covers it."""
    if os.environ.get(HELD):
        yield
        return
    with ExitStack() as stack:
        with _flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH):
            stack.enter_context(_flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        os.environ[HELD] = "alone" if alone else "shared"
        try:
            yield
        finally:
            del os.environ[HELD]
