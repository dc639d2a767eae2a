"""How close decoding runs to the machine's limit: each run against its own matrix products timed alone.

    python -m csd.experiments.roofline [--pairs mar xar harmon] [--batches 1 8] [--modes target csd] \\
        [--threads 1] [--repeats 5] [--before TREE] [--no-profile] [--out bench/results/roofline]

For every embedded pair, target-only and CSD at the app's default setting (the pair's fixed AR steps and
CFG ramp on xAR), in a worker process per tree (:mod:`csd.experiments.roofline_probe`, ``threads`` torch
threads):

* **flops**: the run's floating-point operations, counted from the shapes of every matrix product it makes
  (backbone passes, head-chain steps, both guidance halves, verification; attention as its two products);
* **op calls per AR step**: aten ops at every nesting level as ``torch.profiler`` counts them (not with
  ``--no-profile``, which skips the profiled run: minutes for xAR at batch 8);
* **wall**: the run's seconds; **bound**: the same matrix products (same shapes, strides and dtypes, the same
  number of times, in the run's order) timed alone in the same process, right after it;
* **efficiency** = bound / wall (the median of the paired ratios), and the achieved GFLOP/s.

With ``--before TREE`` (``git worktree add TREE COMMIT``) the older tree runs the same cases in its own
worker, the trees alternating every repeat (the order flipping), and the table gives both trees' rows, the
speed-up of the wall time and the largest token difference and whether every decision (who made each
token) is the same. Absolute seconds are this machine's; the ratios are the result.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import numpy as np

from csd.experiments.timing import machine

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("roofline_probe.py")
FAMILIES = ("mar", "xar", "harmon")


class Worker:
    """The probe in its own process, importing ``csd`` from ``tree``."""

    def __init__(self, tree: Path, threads: int):
        env = dict(os.environ, PYTHONPATH=str(tree), GRADIO_ANALYTICS_ENABLED="False")
        cmd = [sys.executable, str(PROBE), str(threads)]
        self.tree = tree
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the roofline worker of {self.tree} stopped")
        return json.loads(line)

    def ask(self, op: str, case: dict) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, "case": case}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def tokens_of(answer: dict) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.frombuffer(base64.b64decode(answer["tokens_f32"]), dtype=np.float32)
    return tokens, np.frombuffer(base64.b64decode(answer["maker"]), dtype=np.int8)


def measure(workers: dict[str, Worker], cases: list[dict], repeats: int, log=print) -> list[dict]:
    """Count each case once per tree, then time it ``repeats`` times per tree, interleaved."""
    rows = []
    for case in cases:
        counts = {tree: w.ask("count", case) for tree, w in workers.items()}
        runs = {tree: [] for tree in workers}
        order = list(workers)
        for rep in range(repeats):
            for tree in order if rep % 2 == 0 else order[::-1]:
                runs[tree].append(workers[tree].ask("time", case))
            walls = ", ".join(f"{t} {r[-1]['wall']:.3f} s" for t, r in runs.items())
            log(f"{case} repeat {rep + 1}/{repeats}: {walls}")
        row = {"case": case, "trees": {}}
        for tree, samples in runs.items():
            c = counts[tree]
            wall, bound = median(s["wall"] for s in samples), median(s["bound"] for s in samples)
            row["trees"][tree] = {
                "flops": c["flops"],
                "ar_steps": c["ar_steps"],
                "op_calls": c.get("op_calls"),
                "op_calls_per_step": c.get("op_calls_per_step"),
                "profile_s": c.get("profile_s", {}),
                "top_ops": c.get("top_ops", []),
                "wall_s": wall,
                "bound_s": bound,
                "efficiency": median(s["bound"] / s["wall"] for s in samples),
                "gflops": c["flops"] / wall / 1e9,
                "bound_gflops": c["flops"] / bound / 1e9,
                "walls": [s["wall"] for s in samples],
                "bounds": [s["bound"] for s in samples],
            }
        if "before" in runs:
            before, after = runs["before"][0], runs["after"][0]
            (tb, mb), (ta, ma) = tokens_of(before), tokens_of(after)
            row["speedup"] = median(b["wall"] / a["wall"] for b, a in zip(runs["before"], runs["after"], strict=True))
            row["max_token_diff"] = float(np.abs(tb.astype(np.float64) - ta).max())
            row["same_decisions"] = bool(np.array_equal(mb, ma))
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"Roofline of decoding on {m['cpu']} ({m['capability']}), {result['threads']} thread(s), torch "
        f"{m['torch']}; median of {result['repeats']} interleaved repeats. Efficiency = the run's own matrix "
        "products timed alone / the run's wall time; op calls = aten ops per AR step (torch.profiler).",
        "",
        "| pair | batch | run | tree | GFLOP | wall s | bound s | efficiency | GFLOP/s | op calls / AR step |"
        + (" speed-up | max token diff | same decisions |" if result["trees"].get("before") else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if result["trees"].get("before") else ""),
    ]
    for row in result["rows"]:
        c = row["case"]
        for tree, r in row["trees"].items():
            cells = [c["family"], str(c["batch"]), c["mode"], tree, f"{r['flops'] / 1e9:.2f}", f"{r['wall_s']:.3f}"]
            cells += [f"{r['bound_s']:.3f}", f"{r['efficiency']:.0%}", f"{r['gflops']:.1f}"]
            cells += ["" if r["op_calls_per_step"] is None else f"{r['op_calls_per_step']:.0f}"]
            if "speedup" in row:
                last = tree == "after"
                cells += [f"{row['speedup']:.2f}x" if last else "", f"{row['max_token_diff']:.1e}" if last else ""]
                cells += [("yes" if row["same_decisions"] else "**no**") if last else ""]
            lines.append("| " + " | ".join(cells) + " |")
    if not any(r["profile_s"] for row in result["rows"] for r in row["trees"].values()):
        return "\n".join(lines) + "\n"
    lines += ["", "Self time by op class (torch.profiler, one run; the profiler's own overhead included):", ""]
    lines += ["| pair | batch | run | tree | " + " | ".join(CLASSES) + " |", "|---" * (4 + len(CLASSES)) + "|"]
    for row in result["rows"]:
        c = row["case"]
        for tree, r in row["trees"].items():
            total = sum(r["profile_s"].values()) or 1.0
            shares = [f"{r['profile_s'].get(k, 0.0) / total:.0%}" for k in CLASSES]
            lines.append(f"| {c['family']} | {c['batch']} | {c['mode']} | {tree} | " + " | ".join(shares) + " |")
    return "\n".join(lines) + "\n"


CLASSES = ("matmul", "attention", "norm", "element-wise", "copy and layout", "random", "other")


def _commit(tree: Path) -> str:
    git = lambda *a: subprocess.run(["git", "-C", str(tree), *a], capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + (" (modified)" if git("status", "--porcelain", "--", "csd") else "")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m csd.experiments.roofline", description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=list(FAMILIES), choices=FAMILIES, help="embedded pairs by family")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--modes", nargs="+", default=["target", "csd"], choices=["target", "csd"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--num-steps", type=int, default=None, help="AR steps (default: the app's; xAR keeps its own)")
    ap.add_argument("--before", type=Path, default=None, help="an older tree to compare with (git worktree add)")
    ap.add_argument("--after", type=Path, default=ROOT, help="the tree measured (default: this one)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled run (op calls, time by op class)")
    ap.add_argument("--out", type=Path, default=None, help="folder for roofline.json and roofline.md")
    args = ap.parse_args(argv)
    counts = [("--threads", args.threads), ("--repeats", args.repeats), *(("--batches", b) for b in args.batches)]
    counts += [("--num-steps", args.num_steps)] if args.num_steps is not None else []
    for name, value in counts:
        if value < 1:
            ap.error(f"{name} must be >= 1, got {value}")
    trees = {"after": args.after.resolve()} if args.before is None else {"before": args.before.resolve()}
    if args.before is not None:
        trees["after"] = args.after.resolve()
    workers = {name: Worker(tree, args.threads) for name, tree in trees.items()}
    try:
        from csd.serving.pairs import pair_specs

        names = {s.family: s.name for s in pair_specs("embedded")}
        cases = [
            {"pair": names[f], "family": f, "batch": b, "mode": m}
            | ({"num_steps": n} if (n := args.num_steps) else {})
            | ({"profile": False} if args.no_profile else {})
            for f in args.pairs
            for b in args.batches
            for m in args.modes
        ]
        rows = measure(workers, cases, args.repeats, log=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        for w in workers.values():
            w.close()
    result = {
        "machine": machine() | {"threads": args.threads},
        "threads": args.threads,
        "repeats": args.repeats,
        "trees": {name: _commit(path) for name, path in trees.items()},
        "rows": rows,
    }
    table = markdown(result)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "roofline.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "roofline.md").write_text(table)
    return result


if __name__ == "__main__":
    main()
