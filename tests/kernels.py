"""Kernel perturbations: settings that change which CPU kernels run, the way another machine does.

On another CPU the BLAS and oneDNN pick other kernels (by instruction set, and on some CPUs by matrix
shape, so a batch of one and a batch of two round differently), and a chain of head steps amplifies the
last bits. The suite's float-comparing tests rerun under each perturbation here
(tests/repository/test_perturbations.py), so a bound set on this machine is a bound that holds on others.

A perturbation is environment variables for a fresh process; ``CSD_TEST_KERNELS`` names the ones the test
session applies itself (:func:`apply`, from tests/conftest.py):

* ``threads2``: two torch threads wherever a test asks for one (the ``one_thread`` fixture): reductions
  split across threads, as on a machine whose kernels block by other sizes;
* ``no-onednn``: ``torch.backends.mkldnn.enabled = False`` (convolutions, linear layers and matmuls that
  oneDNN ran fall back to ATen's and MKL's kernels);
* the CPU capabilities (``ATEN_CPU_CAPABILITY`` with oneDNN's and MKL's instruction sets capped to match).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

KERNELS_VAR = "CSD_TEST_KERNELS"

PERTURBATIONS: dict[str, dict[str, str]] = {
    "threads2": {KERNELS_VAR: "threads2"},
    "no-onednn": {KERNELS_VAR: "no-onednn"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "ALL", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}
CAPABILITIES = ("default", "avx2", "avx512")


def active() -> set[str]:
    """The in-process perturbations this session runs under."""
    return {k for k in os.environ.get(KERNELS_VAR, "").split(",") if k}


def threads_for_tests() -> int:
    """Torch threads for a test that asks for one (two under ``threads2``)."""
    return 2 if "threads2" in active() else 1


def apply() -> None:
    """Apply the in-process perturbations named in ``CSD_TEST_KERNELS`` (at session start)."""
    unknown = active() - {"threads2", "no-onednn"}
    if unknown:
        raise ValueError(f"{KERNELS_VAR} must name threads2 and / or no-onednn, got {sorted(unknown)}")
    if "no-onednn" in active():
        torch.backends.mkldnn.enabled = False


def capability_under(env: dict[str, str]) -> str:
    """What torch runs under ``env`` on this CPU (a capability the CPU lacks falls back to its best)."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def runnable(name: str) -> bool:
    """Whether this CPU can run perturbation ``name`` as something other than its own kernels."""
    if name not in CAPABILITIES:
        return True
    own = torch.backends.cpu.get_cpu_capability()
    return name.upper() != own and capability_under(os.environ | PERTURBATIONS[name]) == name.upper()
