"""The prepared device check runs end to end on any machine at tiny sizes (``--tiny``): every step ok, the
JSON, the Markdown summary and the screenshot written (a GPU's run is committed under bench/results/gpu/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_device_check_runs_every_step_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, "-m", "scripts.gpu_check", "--out", str(tmp_path), "--tiny", "--skip-tests"]
    cmd += ["--device", "cpu"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = record["steps"]
    assert list(steps) == [
        "host syncs",
        "head chain",
        "serve",
        "generate api",
        "token statistics",
        "screenshot",
        "paper scale cell",
    ]
    assert all(s["ok"] for s in steps.values())
    syncs = steps["host syncs"]["result"]
    assert set(syncs) == {f"{f} {m}" for f in ("mar", "xar", "harmon") for m in ("target", "csd")}
    assert all(row["callbacks"] >= 2 and row["in_loop"] == 0 for row in syncs.values())  # a CPU never waits
    chains = steps["head chain"]["result"]  # on a CPU: eager and compiled, no CUDA graph
    assert set(chains) == {"batch 1", "batch 256"}
    assert all(set(r) == {"rows", "eager ms", "compiled ms", "compiled token diff"} for r in chains.values())
    assert all(r["compiled token diff"] < 1e-4 for r in chains.values())  # relative: float32 rounding (~1e-6)
    assert steps["serve"]["result"]["pairs"] == ["MAR-L / MAR-B (ImageNet)"]
    assert set(steps["generate api"]["result"]) >= {"batch 1", "batch 8"}
    assert all(row["finite"] and row["alike"] for row in steps["token statistics"]["result"].values())
    assert (tmp_path / "screenshot.png").stat().st_size > 10_000
    assert "| generate api | yes |" in (tmp_path / "gpu_check.md").read_text()
