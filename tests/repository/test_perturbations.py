"""The tests that compare floats pass under other kernels: rerun in a subprocess under each perturbation of
tests/kernels.py this CPU can run (two torch threads; oneDNN off; torch's other CPU capabilities with oneDNN's
and MKL's instruction sets capped to match), so that the README's one test command also checks how another
machine's kernels round (docs/specification_notes.md, "Numbers on other CPUs").

A test that compares floats of runs whose kernels differ between CPUs carries the ``kernels`` mark; a module
that imports the float bounds of tests/helpers.py must mark such tests (checked below). A test that passes at
home but fails under a perturbation is a failing test."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import kernels

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"F64_ATOL", "F32_ATOL", "assert_same64", "assert_differ64"}


def start(name: str, threads: int | None, paths: list[str]) -> subprocess.Popen:
    """``pytest -m kernels`` over ``paths`` in a fresh process under perturbation ``name`` (``threads``:
    torch's default thread count there, None for the machine's)."""
    env = os.environ | kernels.PERTURBATIONS[name] | {"GRADIO_ANALYTICS_ENABLED": "False"}
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "kernels", *paths]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=1800)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def skipped(name: str) -> str | None:
    """Why perturbation ``name`` is not rerun on this CPU, or None."""
    if name.upper() == torch.backends.cpu.get_cpu_capability():
        return f"{name} is this process's own capability: the suite itself runs under it"
    if not kernels.runnable(name):
        return f"this CPU cannot run {name} kernels"
    return None


def kernels_modules(session: pytest.Session) -> list[str] | None:
    """The modules of the ``kernels`` tests, where this session collected every test module (the suite: a rerun
    then collects only those, not the suite's others, which cost it seconds of imports); None otherwise."""
    collected = {item.path for item in session.items}
    if collected != set((ROOT / "tests").rglob("test_*.py")):
        return None
    return sorted({str(item.path.relative_to(ROOT)) for item in session.items if item.get_closest_marker("kernels")})


def rerun(name: str, paths: list[str]) -> subprocess.CompletedProcess | str:
    """Perturbation ``name``'s rerun of the ``kernels`` tests in ``paths``, or why it is skipped. ``threads2``
    runs on two threads, the others on one (a test that asks for one gets one anyway; the rest would otherwise
    take the machine's)."""
    return skipped(name) or finish(start(name, None if name == "threads2" else 1, paths))


class Rerun:
    """The float-comparing tests pass under one perturbation. A class per perturbation (below), so a parallel
    run (``--dist loadscope``) can give each rerun to a worker of its own."""

    name = ""

    @pytest.mark.slow
    def test_the_float_comparing_tests_pass_under_another_kernel_choice(self, request):
        paths = kernels_modules(request.session)
        run = rerun(self.name, paths or ["tests"])  # in this test's hold of the CPU lock (tests/cpu_lock.py)
        if isinstance(run, str):
            pytest.skip(run)
        out = run.stdout.splitlines()
        assert run.returncode == 0, (
            f"under {kernels.PERTURBATIONS[self.name]}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
        )
        assert " passed" in out[-1] and " deselected" in out[-1]
        if paths:  # every kernels test of the suite ran there, none lost to the list of modules
            here = sum(1 for item in request.session.items if item.get_closest_marker("kernels"))
            assert sum(int(n) for n, _ in re.findall(r"(\d+) (passed|skipped)", out[-1])) == here, out[-1]


class TestThreads2(Rerun):
    name = "threads2"


class TestNoOnednn(Rerun):
    name = "no-onednn"


class TestDefaultCapability(Rerun):
    name = "default"


class TestAvx2Capability(Rerun):
    name = "avx2"


class TestAvx512Capability(Rerun):
    name = "avx512"


def test_every_perturbation_has_its_rerun():
    classes = [c for c in globals().values() if isinstance(c, type) and issubclass(c, Rerun) and c is not Rerun]
    assert sorted(c.name for c in classes) == sorted(kernels.PERTURBATIONS)


def _marked(node: ast.FunctionDef, module_marked: bool) -> bool:
    names = {ast.unparse(d) for d in node.decorator_list}
    return module_marked or any("mark.kernels" in n for n in names)


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def test_every_test_that_asserts_a_float_bound_is_rerun_under_the_perturbations():
    """A test (or the fixture-free helper it calls in its module) that uses the float bounds of tests/helpers.py
    carries the kernels mark, so the perturbation reruns include it."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = "kernels" in "".join(
            ast.unparse(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "pytestmark"
        )
        helpers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")}
        bounded = {h for h in helpers if _uses(next(n for n in tree.body if getattr(n, "name", "") == h), BOUNDS)}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                if _uses(node, BOUNDS | bounded) and not _marked(node, module_marked):
                    unmarked.append(f"{path.name}::{node.name}")
    assert not unmarked, "compare floats under a bound but are not marked kernels:\n" + "\n".join(unmarked)


@pytest.mark.kernels  # it reads the bounds; rerunning it costs nothing
def test_the_float_bounds_stand_on_the_committed_measurement_under_every_perturbation():
    """tests/data/kernel_drift.json (python -m tests.data.measure_kernel_drift): every perturbation measured,
    the float64 bound over 100x its worst gap and under float32's, the float32 bound 5x its worst, and no
    decision flipped between float32 and float64 or between a batch and an image alone."""
    from tests.helpers import F32_ATOL, F64_ATOL

    drift = json.loads((ROOT / "tests" / "data" / "kernel_drift.json").read_text())["records"]
    assert {"own", "threads2", "no-onednn", "default", "avx2"} <= set(drift)
    rows = [case for record in drift.values() for family in record["families"].values() for case in family.values()]
    assert len(rows) == 5 * (11 + 11 + 8)  # every family's cases under every perturbation
    worst = {k: max(r[k] for r in rows) for k in ("f64_batch", "f32_batch", "f32_f64", "flips", "batch_flips64")}
    assert F64_ATOL >= 100 * worst["f64_batch"] and F64_ATOL < 1e-3 * worst["f32_f64"]
    assert F32_ATOL >= 5 * max(worst["f32_batch"], worst["f32_f64"])
    assert worst["flips"] == worst["batch_flips64"] == 0


def test_the_perturbations_change_the_kernels_they_claim():
    probe = (
        "import json, torch; from tests import kernels; kernels.apply(); "
        "torch.set_num_threads(kernels.threads_for_tests()); "
        "print(json.dumps([torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), "
        "torch.backends.mkldnn.enabled]))"
    )
    got = {}
    for name in ("threads2", "no-onednn", "default"):
        env = os.environ | kernels.PERTURBATIONS[name]
        out = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        )
        got[name] = json.loads(out.stdout)
    assert got["threads2"][1:] == [2, True] and got["no-onednn"][1:] == [1, False]
    assert got["default"][0] == "DEFAULT"


def test_a_timing_names_the_cpu_and_the_kernels_it_ran_on():
    """What bench/results/request_times.json records of its machine, one record per capability."""
    probe = "import json; from csd.experiments.timing import machine; print(json.dumps(machine()))"
    env = os.environ | kernels.PERTURBATIONS["default"]
    got = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True).stdout)
    assert got["capability"] == "DEFAULT" and got["kernel_env"] == kernels.PERTURBATIONS["default"]
    assert got["cpu"] and got["torch"] == torch.__version__
