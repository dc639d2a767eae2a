"""Per-phase time of target-only and CSD generation on the embedded pairs, in this tree and in an older one,
side by side: what a change to the samplers saved, phase by phase, and that it changed no token.

    git worktree add /tmp/before COMMIT
    git worktree add /tmp/after HEAD  # optional: pins the newer tree while others edit this one
    ATEN_CPU_CAPABILITY=avx2 python -m scripts.profile_phases --before /tmp/before [--after /tmp/after] \\
        [--batches 1 8] [--repeats 5] [--out bench/results/profile_phases.json]

Each tree runs in its own worker process (its own ``csd`` package and models, one torch thread, this
environment's CPU capability) at the app's default setting (the pair's fixed AR steps and CFG ramp on xAR).
Runs alternate between the trees, the order flipping every repeat, after an untimed run of each case, so
a machine whose load drifts charges both alike. Every phase (``Trace.times``; "other" is the rest of the
run) is timed twice: wall seconds, and the CPU seconds of the sampling thread, which a machine shared with
other work inflates far less. The report gives each tree's median and the median of the paired ratios
(this tree / before). Both trees must make the same tokens and decisions (``torch.equal``), else it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

from csd.experiments.timing import machine

ROOT = Path(__file__).resolve().parents[1]

# The worker: runs in a tree's own directory with only that tree's packages; reads one case per line
# ({"pair": i, "batch": b, "mode": "target" | "csd"}) and answers one JSON line per case.
WORKER = r"""
import hashlib, json, sys, time, types
import torch
import csd.decoding
from csd.config import CSDConfig
from csd.experiments import defaults
from csd.serving.pairs import PairStore, discover
from dataclasses import replace

try:
    from csd.dispatch import Method
except ImportError:  # a tree from before csd.dispatch: the samplers called as its Method calls them
    from csd.sampling import generate
    from csd.speculative import speculative_generate

    def method_run(mode):
        if mode == "target":
            return lambda target, draft, c, s, sampling: generate(target, c, s, sampling)
        return lambda target, draft, c, s, sampling: speculative_generate(target, draft, c, s, sampling, defaults.CSD)
else:
    def method_run(mode):
        return (Method.target() if mode == "target" else Method.speculative(defaults.CSD)).run


class Clock:
    # (wall, cpu) seconds; the phase timer adds and subtracts these as it would floats
    def __init__(self, wall, cpu):
        self.wall, self.cpu = wall, cpu
    def __sub__(self, other):
        return Clock(self.wall - other.wall, self.cpu - other.cpu)
    def __add__(self, other):
        return self if other == 0 else Clock(self.wall + other.wall, self.cpu + other.cpu)
    __radd__ = __add__


now = lambda: Clock(time.perf_counter(), time.thread_time())
csd.decoding.time = types.SimpleNamespace(perf_counter=now)  # the phase timer's clock, in this process only
torch.set_num_threads(1)
store = PairStore(discover(None), torch.device("cpu"))
names = store.names  # discover(None): the embedded pairs
print(json.dumps({"pairs": names, "capability": torch.backends.cpu.get_cpu_capability()}), flush=True)
for line in sys.stdin:
    case = json.loads(line)
    pair = store.get(names[case["pair"]])
    t = pair.traits
    sampling = defaults.SAMPLING
    if t.fixed_num_steps:
        sampling = replace(sampling, num_steps=t.fixed_num_steps, cfg_schedule=t.cfg_schedule)
    conditions = list(pair.prompts[:1] or [0]) * case["batch"]
    seeds = list(range(case["batch"]))
    method = method_run(case["mode"])
    run = lambda: method(pair.target, pair.draft, conditions, seeds, sampling)
    t0 = now()
    gen = run()
    total = now() - t0
    phases = {k: (v.wall, v.cpu) for k, v in gen.trace.times.items()}
    other = Clock(total.wall - sum(w for w, _ in phases.values()), total.cpu - sum(c for _, c in phases.values()))
    digest = hashlib.sha256(gen.tokens.numpy().tobytes() + gen.trace.maker.tobytes()).hexdigest()
    phases |= {"other": (other.wall, other.cpu), "total": (total.wall, total.cpu)}
    print(json.dumps({"pair": pair.name, "phases": phases, "tokens": digest}), flush=True)
"""


class Worker:
    """One tree's worker process."""

    def __init__(self, tree: Path):
        env = dict(os.environ, PYTHONPATH=str(tree), GRADIO_ANALYTICS_ENABLED="False")
        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.hello = json.loads(self.proc.stdout.readline())

    def run(self, case: dict) -> dict:
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the worker of {self.tree} stopped (case {case})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _commit(tree: Path) -> str:
    """The tree's commit, marked when it has uncommitted changes."""
    git = lambda *a: subprocess.run(["git", "-C", str(tree), *a], capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + (" (modified)" if git("status", "--porcelain", "--", "csd") else "")


def summary(samples: dict[str, list[dict]]) -> dict:
    """Per phase: each tree's median wall and CPU seconds and the median paired ratio (after / before)."""
    out = {}
    phases = sorted({p for runs in samples.values() for run in runs for p in run["phases"]})
    for phase in phases:
        row = {}
        for k, clock in enumerate(("wall", "cpu")):
            pairs = [
                (b["phases"][phase][k], a["phases"][phase][k])
                for b, a in zip(samples["before"], samples["after"], strict=True)
                if phase in b["phases"] and phase in a["phases"]
            ]
            if not pairs:
                continue
            row[f"{clock}_before"] = median(b for b, _ in pairs)
            row[f"{clock}_after"] = median(a for _, a in pairs)
            row[f"{clock}_ratio"] = median(a / b for b, a in pairs if b > 0) if any(b > 0 for b, _ in pairs) else None
        out[phase] = row
    return out


def markdown(result: dict) -> str:
    lines = [
        f"Per-phase seconds, median of {result['repeats']} interleaved repeats; ratio = median of after / before "
        f"({result['cpu']}, ATEN_CPU_CAPABILITY {result['capability']}, load average {result['load_average']}).",
        "",
        "| pair | batch | run | phase | CPU before | CPU after | CPU ratio | wall before | wall after | wall ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in result["cases"]:
        for phase, r in case["phases"].items():
            cells = [f"{r.get(k, float('nan')):.3f}" for k in ("cpu_before", "cpu_after", "cpu_ratio")]
            cells += [f"{r.get(k, float('nan')):.3f}" for k in ("wall_before", "wall_after", "wall_ratio")]
            lines.append(f"| {case['pair']} | {case['batch']} | {case['mode']} | {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def interleaved(workers: dict, cases: list[dict], repeats: int) -> tuple[dict, list]:
    """Every case run by both trees ``repeats`` times, after an untimed run of each, the trees' order flipping
    every repeat: (each case's runs by tree, keyed by the case as JSON; the load averages, one per repeat and
    one before)."""
    loads = [load_average()]
    samples = {json.dumps(c, sort_keys=True): {"before": [], "after": []} for c in cases}
    for case in cases:  # untimed: the first run of a shape pays one-time costs
        for w in workers.values():
            w.run(case)
    for rep in range(repeats):
        order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
        for case in cases:
            runs = {tree: workers[tree].run(case) for tree in order}
            if runs["before"]["tokens"] != runs["after"]["tokens"]:
                raise SystemExit(f"tokens differ between the trees: {case} ({runs['after']['pair']})")
            key = json.dumps(case, sort_keys=True)
            for tree, run in runs.items():
                samples[key][tree].append(run)
            print(
                f"repeat {rep + 1}/{repeats} {case}: CPU {runs['before']['phases']['total'][1]:.2f} -> "
                f"{runs['after']['phases']['total'][1]:.2f} s",
                flush=True,
            )
        loads.append(load_average())
    return samples, loads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the older tree (git worktree add DIR COMMIT)")
    ap.add_argument("--after", type=Path, default=ROOT, help="the newer tree (default: this one)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--modes", nargs="+", default=["target", "csd"], choices=["target", "csd"])
    ap.add_argument("--pairs", type=int, nargs="+", default=None, help="indices of the embedded pairs (default: all)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="JSON file (the Markdown table goes beside it)")
    args = ap.parse_args()
    workers = {"before": Worker(args.before.resolve()), "after": Worker(args.after.resolve())}
    names = workers["after"].hello["pairs"]
    cases = [
        {"pair": p, "batch": b, "mode": m}
        for p in (args.pairs if args.pairs is not None else range(len(names)))
        for b in args.batches
        for m in args.modes
    ]
    try:
        samples, loads = interleaved(workers, cases, args.repeats)
    finally:
        for w in workers.values():
            w.close()
    result = {
        "cpu": machine()["cpu"],
        "kernel_env": machine()["kernel_env"],
        "capability": workers["after"].hello["capability"],
        "load_average": loads,
        "repeats": args.repeats,
        "trees": {name: _commit(path) for name, path in (("before", args.before), ("after", args.after))},
        "cases": [
            {
                "pair": names[c["pair"]],
                "batch": c["batch"],
                "mode": c["mode"],
                "phases": summary(samples[json.dumps(c, sort_keys=True)]),
            }
            for c in cases
        ],
    }
    table = markdown(result)
    print(table)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
