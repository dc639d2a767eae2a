"""The app tests' shared timing: each served pair is timed once per test session, not once per app a test builds.

A pair's rates (:func:`demo.estimate.calibrate`: whole runs of each kind at the page's default setting) cost 3-18 s
of a busy 2-core CPU each, and the app tests build an app per test or module: across tests/demo, 28 timings took 92
s of model runs unshared, 18 took 57 s shared (docs/testing.md). A module that does not test the timing itself uses
:func:`shared_rates`: the first app to time a pair at a setting times it for real (inside its own GPU call)
and keeps the rates in the session's temporary folder, which every worker of the session sees; a later app asking
for the same pair at the same setting on the same threads gets those rates. What a test checks of a timing (that it
runs in a GPU call, once per pair, before the pair's first request) stays in each app: only the model runs of the
timing are shared.

A pair is known by its name: a module that serves other models under a shipped pair's name (tests/demo/
test_server.py's slowed untrained pair) must not use it, or it gets the real pair's rates.
"""

from __future__ import annotations

import hashlib
import pickle

import pytest
import torch
from filelock import FileLock

import demo.application
from demo import estimate
from tests.demo.browser import close_chromium


def _session_dir(tmp_path_factory, worker_id: str):
    """A folder every worker of this test session sees (xdist gives each worker its own temporary root inside
    the session's)."""
    root = tmp_path_factory.getbasetemp()
    return (root if worker_id == "master" else root.parent) / "shared_rates"


@pytest.fixture(scope="module")
def shared_rates(tmp_path_factory, worker_id):
    """The app times each pair at each setting once per test session (see the module's docstring); for a
    module's apps, module-scoped ones included."""
    folder = _session_dir(tmp_path_factory, worker_id)
    folder.mkdir(parents=True, exist_ok=True)

    def once(pair, sampling, csd, condition, on_step=None):
        what = repr((pair.name, sampling, csd, condition, torch.get_num_threads(), torch.get_default_dtype()))
        path = folder / hashlib.sha256(what.encode()).hexdigest()[:24]
        with FileLock(f"{path}.lock"):  # a pair being timed by the other worker is waited for, not timed twice
            if path.exists():
                return pickle.loads(path.read_bytes())
            rates = estimate.calibrate(pair, sampling, csd, condition, on_step)
            path.write_bytes(pickle.dumps(rates))
            return rates

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo.application, "calibrate", once)
        yield


@pytest.fixture(scope="session", autouse=True)
def _chromium_closed():
    """The Chromium a test process launched for its pages (tests/demo/browser.py) is closed at its session's end."""
    yield
    close_chromium()
