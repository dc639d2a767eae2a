"""The tests that compare floats pass on CPUs other than this one: run again in a subprocess under each CPU
capability this machine can emulate besides its own (torch's ATEN_CPU_CAPABILITY, with oneDNN's and MKL's
instruction sets capped to match), so that the README's one test command also checks another machine's
kernels (docs/specification_notes.md, "Numbers on other CPUs").

The files: the runs saved before the move (decisions exact, drift measured) and the official reference
numbers of every family, then the tightest tolerances between runs (batch invariance, cached against plain):
about 30 s per capability on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "tests/test_same_tokens.py",
    "tests/test_mar_parity.py",
    "tests/test_harmon_parity.py",
    "tests/test_xar.py::test_velocity_of_a_whole_sequence_matches_the_official_network",
    "tests/test_xar.py::test_a_whole_guided_run_replays_the_official_sampler",
    "tests/test_head_steps.py",
    "tests/test_families.py",
    "tests/test_speculative.py",
    "tests/test_harmon.py",
    "tests/test_vae.py",
    "tests/test_inspection.py",
)
# A machine of each capability: torch's kernels, and oneDNN's (its matmuls change the numbers too) and MKL's
# (no change measured here; an Intel CPU may differ) capped to the same instructions.
MACHINES = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "ALL", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}


def machine_env(capability: str) -> dict[str, str]:
    return os.environ | MACHINES[capability] | {"GRADIO_ANALYTICS_ENABLED": "False"}


def capability_under(env: dict[str, str]) -> str:
    """What torch runs under ``env`` on this CPU (a capability the CPU lacks falls back to its best)."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("capability", sorted(MACHINES))
def test_the_float_comparing_tests_pass_under_another_capability(capability):
    if capability.upper() == torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"{capability} is this process's own capability: the suite itself runs under it")
    env = machine_env(capability)
    if capability_under(env) != capability.upper():
        pytest.skip(f"this CPU cannot run {capability} kernels")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"under {MACHINES[capability]}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"


def test_a_timing_names_the_cpu_and_the_kernels_it_ran_on():
    """What bench/results/request_times.json records of its machine, one record per capability."""
    probe = "import json; from csd.experiments.timing import machine; print(json.dumps(machine()))"
    env = machine_env("default")
    got = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True).stdout)
    assert got["capability"] == "DEFAULT" and got["kernel_env"] == MACHINES["default"]
    assert got["cpu"] and got["torch"] == torch.__version__
