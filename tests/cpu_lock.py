"""One lock, across the suite's worker processes, for the tests whose figures depend on the CPU being theirs.

The crowd test (tests/demo/test_crowd.py) compares the waits its server predicts with the waits measured: a
kernel rerun (tests/repository/test_perturbations.py: a whole pytest process on the float tests) beside it on
the other of two cores made every turn of the burst three times what the line had learned a moment before
(predicted / measured 0.28-0.35 in a full run). The crowd test holds this lock alone, the reruns share it: no
rerun runs beside the burst, the reruns still run beside each other, and everything else as before.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / f"csd-tests-cpu-{os.getuid()}.lock"


@contextmanager
def exclusive_cpu(path: Path = LOCK_FILE, shared: bool = False) -> Iterator[None]:
    """Hold the suite's CPU lock: alone, or ``shared`` with the other holders that share it (an ``flock``,
    released when the block ends or the process dies)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
