"""Paper-scale whole images timed in two trees, paired: the device check's "paper scale paired" step
(scripts/gpu_check.py).

Each tree runs this file in its own worker process (``python scripts/paper_scale_probe.py`` with ``PYTHONPATH``
and the working directory set to the tree), which stays alive across the repeats, so each tree's one-time costs
(imports, building the pair, the first run of a shape) are paid once. The worker uses only what the trees
compared share: the paper-scale pair and plan (``csd.experiments.paper_scale.build`` / ``.plan``) and
``csd.Method``. It builds the pair with seeded random weights on the CPU (:func:`weights_digest` of them is in
its first line: the parent checks both trees built the same), moves it to the device, says hello, then reads
one JSON request per line on stdin and answers one JSON line:

* ``{"op": "warm", "case": C}``: one untimed run;
* ``{"op": "time", "case": C, "tokens": bool}``: one run timed (the device synchronised before and after): its
  seconds, a digest of its tokens and decisions and, with ``"tokens": true``, the tokens (float32) and who made
  each (int8), base64;
* a case: ``{"batch": B, "mode": "target" | "csd"}``: the pair's published sampler (``--tiny``: fewer steps)
  at batch B, the conditions and seeds of the paper-scale run, CSD at the worker's gamma.

The parent half (:func:`paired`) asks the two workers in turn, the order flipping every repeat.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

PROBE = Path(__file__).resolve()


def weights_digest(*models: torch.nn.Module) -> str:
    """The state dicts' names, dtypes, shapes and bytes, hashed: equal weights, equal digests."""
    h = hashlib.sha256()
    for model in models:
        for name, t in model.state_dict().items():
            t = t.detach().cpu().contiguous()
            h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Probe:
    """One tree's paper-scale pair (``pair`` key of ``family``) at ``gamma``, and its cases."""

    def __init__(self, family: str, pair: str, gamma: int, device: torch.device, tiny: bool, seed: int):
        from csd import Method
        from csd.experiments.paper_scale.build import load_pair
        from csd.experiments.paper_scale.plan import GridConfig, plan_cells

        self.grid = GridConfig(families=(family,), pairs=(pair,), batches=(1,), gammas=(gamma,), seed=seed, tiny=tiny)
        precision = "bfloat16" if device.type == "cuda" else "float32"
        self.cell = plan_cells(self.grid, precision)[0]
        loaded = load_pair(self.cell.pair, torch.device("cpu"), seed, tiny, None)
        self.digest = weights_digest(loaded.target, loaded.draft)
        self.target, self.draft = loaded.target.to(device), loaded.draft.to(device)
        self.gamma = self.cell.gammas[0]  # a draft length beyond the steps left after the pre-fill: that many
        self.methods = {"target": Method.target(), "csd": Method.speculative(self.grid.csd(self.gamma))}
        self.device = device
        self.hello = {
            "pair": self.cell.pair.paper_name,
            "weights": loaded.weights,
            "weights_digest": self.digest,
            "params": {
                k: sum(p.numel() for p in m.parameters())
                for k, m in (("target", loaded.target), ("draft", loaded.draft))
            },
            "num_steps": self.cell.sampling.num_steps,
            "head_steps": self.cell.head_steps,
            "precision": precision,
            "gamma": self.gamma,
            "device": str(device),
        }

    def run(self, case: dict):
        from csd.experiments.paper_scale.build import conditions_for
        from csd.serving.catalog import entry_of

        prompt_tokens = entry_of(self.cell.pair.family).paper.prompt_shape(self.grid.tiny)[0]
        conditions, seeds = conditions_for(self.target, case["batch"], self.grid.seed, prompt_tokens)
        return self.methods[case["mode"]].run(self.target, self.draft, conditions, seeds, self.cell.sampling)

    def time(self, case: dict, tokens: bool) -> dict:
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.run(case)
        _sync(self.device)
        seconds = time.perf_counter() - t0
        values = out.tokens.detach().float().cpu().numpy()
        maker = np.asarray(out.trace.maker).astype(np.int8)
        answer = {"seconds": seconds, "digest": hashlib.sha256(values.tobytes() + maker.tobytes()).hexdigest()[:16]}
        if tokens:
            answer["tokens_f32"] = base64.b64encode(values.tobytes()).decode()
            answer["maker"] = base64.b64encode(maker.tobytes()).decode()
        return answer


def serve(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="mar")
    p.add_argument("--pair", default="L/B")
    p.add_argument("--gamma", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    probe = Probe(args.family, args.pair, args.gamma, torch.device(args.device), args.tiny, args.seed)
    print(json.dumps(probe.hello), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "warm":
            probe.run(request["case"])
            answer = {"warm": True}
        else:
            answer = probe.time(request["case"], request.get("tokens", False))
        print(json.dumps(answer), flush=True)


class Worker:
    """This file's :func:`serve` in its own process, importing ``csd`` from ``tree``; its stderr in ``log``."""

    def __init__(self, tree: Path, args: list[str], log: Path):
        env = dict(os.environ, PYTHONPATH=str(tree), GRADIO_ANALYTICS_ENABLED="False")
        self.tree, self.log = tree, log
        self.err = log.open("w")
        cmd = [sys.executable, str(PROBE), *args]
        self.proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True
        )

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = self.log.read_text()[-1500:]
            raise RuntimeError(f"the paper-scale worker of {self.tree} stopped ({self.proc.returncode}): {tail}")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # stuck in a run: this worker is ours to stop
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def _tokens(answer: dict) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.frombuffer(base64.b64decode(answer["tokens_f32"]), dtype=np.float32)
    return tokens, np.frombuffer(base64.b64decode(answer["maker"]), dtype=np.int8)


def paired(
    workers: dict[str, Worker],
    cases: list[dict],
    repeats: int,
    warmup: int = 1,
    deadline: float | None = None,
    log=print,
) -> dict:
    """Every case in the "before" and "after" workers: ``warmup`` untimed runs each, then ``repeats`` timed
    runs, the trees alternating every repeat (the order flipping). Per case: each tree's median seconds and
    samples, the speed-up (median of the paired before / after ratios), the largest token difference and
    whether every decision (who made each token) is the same (the first timed runs' tokens), and whether each
    tree's repeats made the same tokens. A case not started by ``deadline`` (``time.perf_counter()``) is named
    as skipped."""
    rows = {}
    order = ["before", "after"]
    for case in cases:
        key = f"batch {case['batch']} {case['mode']}"
        if deadline is not None and time.perf_counter() > deadline:
            rows[key] = {"skipped": "the step's time budget (--paired-budget-s) was spent"}
            continue
        for _ in range(warmup):
            for name in order:
                workers[name].ask({"op": "warm", "case": case})
        runs: dict[str, list[dict]] = {name: [] for name in order}
        for rep in range(repeats):
            for name in order if rep % 2 == 0 else order[::-1]:
                runs[name].append(workers[name].ask({"op": "time", "case": case, "tokens": rep == 0}))
            log(
                f"{case} repeat {rep + 1}/{repeats}: "
                + ", ".join(f"{n} {r[-1]['seconds']:.3f} s" for n, r in runs.items())
            )
        (tb, mb), (ta, ma) = _tokens(runs["before"][0]), _tokens(runs["after"][0])
        seconds = {name: [r["seconds"] for r in runs[name]] for name in order}
        diff = float(np.abs(tb.astype(np.float64) - ta).max()) if tb.shape == ta.shape else float("inf")
        rows[key] = {
            "before_s": statistics.median(seconds["before"]),
            "after_s": statistics.median(seconds["after"]),
            "speedup": statistics.median(b / a for b, a in zip(seconds["before"], seconds["after"], strict=True)),
            "max_token_diff": diff,
            "same_decisions": bool(mb.shape == ma.shape and np.array_equal(mb, ma)),
            "repeatable": all(len({r["digest"] for r in runs[name]}) == 1 for name in order),
            "before_samples": seconds["before"],
            "after_samples": seconds["after"],
        }
    return rows


if __name__ == "__main__":
    serve()
