"""Fixtures shared by the test modules."""

import os

import pytest
import torch

from csd.models.mar import MAR, mar_config
from csd.serving.pairs import random_pair
from tests import cpu_lock, kernels


def pytest_configure(config):
    kernels.apply()  # CSD_TEST_KERNELS: the perturbations tests/repository/test_perturbations.py reruns under
    # Processes started from here on (the workers, served apps, command runs, the perturbation reruns) share
    # the cores: an OpenMP thread that waits sleeps instead of spinning. The threads2 rerun of two modules beside
    # a busy core took 44.6 s spinning and 16.9 s sleeping (docs/testing.md); what a thread computes is the same.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one worker per core: torch's threads would oversubscribe them
        torch.set_num_threads(kernels.threads_for_tests())


# The longest module: its reruns run beside every other test when it starts first.
FIRST = ("tests/repository/test_perturbations.py",)
LONG = ("slow", "browser")  # marks of tests that take tens of seconds


def pytest_collection_modifyitems(items):
    """Longest first, so the parallel run ends on short tests: the perturbation reruns, then every module with
    a slow or browser test, then the rest, and last the modules with an ``alone`` test (it waits for the test
    beside it to end, a short one there); each module's tests together and in their order (each worker takes
    whole modules, ``--dist loadscope``)."""
    modules = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    alone = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("alone")}
    slow = {item.nodeid.split("::")[0] for item in items if any(map(item.get_closest_marker, LONG))}
    rank = {m: (m in alone, m not in FIRST, m not in slow, i) for i, m in enumerate(modules)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test runs holding the suite's CPU lock (tests/cpu_lock.py): exclusive for an ``alone`` test, shared
    for the rest; its setup, call and teardown (its module's fixtures too) inside the hold."""
    with cpu_lock.hold(alone=item.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (two under the ``threads2`` perturbation, tests/kernels.py): tiny models
    gain nothing from intra-op threads (on a shared CPU extra threads can cost 50x). No test's claim rests
    on it: float64 claims hold under any reduction order, float32 ones within a bound measured under both."""
    threads = torch.get_num_threads()
    torch.set_num_threads(kernels.threads_for_tests())
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def restore_threads():
    """For a test whose code under test sets the thread count itself."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def random_models():
    """The untrained pixel pair (target wider and deeper than the draft), built once."""
    return random_pair()


@pytest.fixture(scope="session")
def mar_test() -> MAR:
    """The tiny KL-16-shaped MAR of the unit tests, seeded, with clipped x0."""
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        return MAR(mar_config("mar_test", clip_x0=1.0)).eval()
