"""How far kernels move the samplers' numbers: the measurement behind the test suite's float bounds
(tests/helpers.py ``F64_ATOL``, the float32 bounds that name this file) and docs/specification_notes.md,
"Numbers on other CPUs".

For every family's untrained pair and every sampler path (target-only and CSD; DDPM, DDIM, the flow ODE,
GtR, both caches, both criteria, a deterministic draft, per-token acceptance), it measures:

* ``f64_batch``: image i of a batch of two against image i alone, in float64 (the greatest |difference|);
* ``f32_batch``: the same in float32 (CSD runs: over the images whose decisions agree);
* ``f32_f64``: a float32 run against the float64 run of the same seeds (the float32 rounding; CSD runs:
  where both made the same decisions);
* ``flips``: CSD decisions (who made a token) that differ between the float32 and float64 runs.

under each kernel perturbation of tests/kernels.py this CPU can run, each in a fresh process. Usage:

    python -m tests.data.measure_kernel_drift            # every perturbation, writes tests/data/kernel_drift.json
    python -m tests.data.measure_kernel_drift --here     # this process's kernels only, printed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from csd.config import CSDConfig, SamplingConfig
from csd.serving.pairs import random_pair
from csd.sampling import generate
from csd.speculative import speculative_generate
from tests import kernels

OUT = Path(__file__).resolve().parent / "kernel_drift.json"
SEEDS, ALONE = [5, 6], [6]


def cases(family: str, traits) -> list[tuple[str, SamplingConfig, CSDConfig | None]]:
    """(name, sampling, csd or None for target-only) of every path the family takes."""
    base = dict(num_steps=traits.fixed_num_steps or 8, cfg_scale=2.0, cfg_schedule=traits.cfg_schedule or "linear")
    base["head_steps"] = max(traits.min_head_steps, 5)
    out = [
        ("ddpm/flow", base, None),
        ("aligned", base, CSDConfig(gamma=3)),
        ("exact", base, CSDConfig.from_knobs(gamma=3, criterion="exact", max_tries=20)),
    ]
    if family in ("mar", "harmon"):
        out += [
            ("ddim eta 1", base | dict(head_sampler="ddim", ddim_eta=1.0), None),
            ("ddim eta 0", base | dict(head_sampler="ddim"), None),
            ("csd ddim eta 0.5", base | dict(head_sampler="ddim", ddim_eta=0.5), CSDConfig(gamma=3)),
            ("condition cache", base | dict(cond_cache_start=2, cond_cache_every=3), CSDConfig(gamma=3)),
            (
                "token cache",
                base | dict(token_cache_keep=0.5, token_cache_start=2, token_cache_every=3),
                CSDConfig(gamma=3),
            ),
            (
                "gtr + fts",
                base | dict(gtr_stages=(4, 2, 2), gtr_head_steps=3, gtr_detail_fraction=0.25, gtr_detail_steps=6),
                None,
            ),
            ("csd gtr", base | dict(gtr_stages=(4, 2, 2), gtr_head_steps=3), CSDConfig(gamma=2)),
            ("deterministic draft", base, CSDConfig.from_knobs(gamma=3, draft_head_sampler="ddim", trajectory_term="none")),
        ]
    if family == "xar":
        out += [
            ("heun uniform", base | dict(head_sampler="heun", flow_grid="uniform"), None),
            ("euler", base | dict(head_sampler="euler"), None),
            ("csd uniform", base | dict(flow_grid="uniform"), CSDConfig(gamma=3)),
            ("euler draft", base, CSDConfig.from_knobs(gamma=3, draft_head_sampler="euler", trajectory_term="none")),
            ("per token", base, CSDConfig.from_knobs(gamma=3, acceptance_unit="token")),
        ]
    return [(name, SamplingConfig.from_knobs(**s), c) for name, s, c in out]


def _run(pair, conditions, seeds, sampling, csd):
    if csd is None:
        return generate(pair.target, conditions, seeds, sampling)
    return speculative_generate(pair.target, pair.draft, conditions, seeds, sampling, csd)


def _makers(gen, csd):
    return None if csd is None else gen.trace.maker


def _gap(a, b, maker_a=None, maker_b=None) -> float:
    """The greatest |a - b| (float64) over the images whose makers agree (every image without makers)."""
    a, b = a.double(), b.double()
    if maker_a is not None:
        same = torch.from_numpy((maker_a == maker_b).all(axis=-1))
        a, b = a[same], b[same]
    return float((a - b).abs().max()) if a.numel() else 0.0


def _flips(a, b) -> int:
    return 0 if a is None else int((a != b).sum())


def measure_case(pair32, pair64, conditions, sampling, csd) -> dict[str, float]:
    s64 = sampling.with_knobs(**{"precision": "float64"})
    b32, a32 = _run(pair32, conditions, SEEDS, sampling, csd), _run(pair32, conditions[1:], ALONE, sampling, csd)
    b64, a64 = _run(pair64, conditions, SEEDS, s64, csd), _run(pair64, conditions[1:], ALONE, s64, csd)
    m = {k: _makers(g, csd) for k, g in (("b32", b32), ("a32", a32), ("b64", b64), ("a64", a64))}
    first = lambda a: None if a is None else a[1:]
    return {
        "f64_batch": _gap(b64.tokens[1:], a64.tokens, first(m["b64"]), m["a64"]),
        "f32_batch": _gap(b32.tokens[1:], a32.tokens, first(m["b32"]), m["a32"]),
        "f32_f64": _gap(b32.tokens, b64.tokens, m["b32"], m["b64"]),
        "flips": _flips(m["b32"], m["b64"]),
        "batch_flips64": _flips(first(m["b64"]), m["a64"]),
    }


def measure_family(family: str) -> dict[str, dict[str, float]]:
    pair32 = random_pair(family=family)
    pair64 = pair32.at_precision("float64")
    conditions = list(pair32.prompts[:2]) if pair32.is_text else [3, 1]
    return {name: measure_case(pair32, pair64, conditions, s, c) for name, s, c in cases(family, pair32.traits)}


def measure_here() -> dict:
    kernels.apply()
    torch.set_num_threads(kernels.threads_for_tests())
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.enabled,
        "families": {f: measure_family(f) for f in ("mar", "harmon", "xar")},
    }


def summary(record: dict) -> dict[str, float]:
    """The greatest of each measure over every family and case."""
    rows = [r for fam in record["families"].values() for r in fam.values()]
    return {k: max(r[k] for r in rows) for k in ("f64_batch", "f32_batch", "f32_f64", "flips", "batch_flips64")}


def measure_all() -> dict:
    records = {}
    for name in ("own", *kernels.PERTURBATIONS):
        env = os.environ | kernels.PERTURBATIONS.get(name, {})
        if not kernels.runnable(name):
            continue  # this CPU cannot run it, or it is the process's own
        cmd = [sys.executable, "-m", "tests.data.measure_kernel_drift", "--here", "--json"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        records[name] = json.loads(out.strip().splitlines()[-1])
        print(name, summary(records[name]), flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--here", action="store_true", help="this process's kernels only")
    parser.add_argument("--json", action="store_true", help="with --here: print the record as one JSON line")
    args = parser.parse_args()
    if args.here:
        record = measure_here()
        print(json.dumps(record) if args.json else json.dumps(record | {"summary": summary(record)}, indent=1))
        return
    records = measure_all()
    meta = {
        "cpu": records["own"]["capability"],
        "torch": torch.__version__,
        "made_by": "python -m tests.data.measure_kernel_drift",
    }
    OUT.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
