"""Wall time of the heaviest requests the app's default limits allow, on the embedded pair, as the app
serves them (one torch thread, the request handlers of app.App, the time limit lifted to see the
true time). Writes bench/results/request_times.json.

Usage: python -m scripts.request_times [--out FILE]. Run it alone: it measures wall time."""

import argparse
import json
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

import app

LIMITS = app.Limits()
GENERATE = {  # each at the largest batch and AR steps; the knobs that add work at their extremes
    "default setting": {},
    "batch 8, 64 AR steps, gamma 1": {"ar_steps": 64, "gamma": 1},
    "batch 8, 64 AR steps, gamma 1, exact criterion, cap 1000": {
        "ar_steps": 64,
        "gamma": 1,
        "criterion": "exact",
        "max_tries": 1000,
    },
    "batch 8, 64 AR steps, gamma 32, tau_v 1, widening 100, cap 1000, CFG 10, temperature 2": {
        "ar_steps": 64,
        "gamma": 32,
        "tau_v": 1.0,
        "resample_widening": 100.0,
        "max_tries": 1000,
        "cfg_scale": 10.0,
        "temperature": 2.0,
    },
}
ANALYZE = {  # n x AR steps at the limit (max_analysis_steps)
    "analysis, 8 images x 32 AR steps": (8, {}),
    "analysis, 4 images x 64 AR steps": (4, {"ar_steps": 64}),
}
FRONTIER = {  # n x AR steps at the frontier's limit (half of max_analysis_steps)
    "frontier, 4 images x 32 AR steps": (4, {}),
    "frontier, 2 images x 64 AR steps": (2, {"ar_steps": 64}),
}


def _drain(requests) -> float:
    t0 = time.perf_counter()
    for _ in requests:
        pass
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/request_times.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    application = app.make_app(None, replace(LIMITS, max_seconds=1e9))
    base = {**application.default_controls(), "batch_size": LIMITS.max_batch}
    quiet = lambda *a, **k: None
    rows = {}
    for name, over in GENERATE.items():
        rows[name] = _drain(application.generate(progress=quiet, **{**base, **over}))
        print(f"{name}: {rows[name]:.1f} s", flush=True)
    analysis_base = {k: v for k, v in base.items() if k != "batch_size"}
    for name, (n, over) in ANALYZE.items():
        rows[name] = _drain(application.analyze(n, progress=quiet, **{**analysis_base, **over}))
        print(f"{name}: {rows[name]:.1f} s", flush=True)
    for name, (n, over) in FRONTIER.items():
        rows[name] = _drain(application.recompute_frontier(n, progress=quiet, **{**analysis_base, **over}))
        print(f"{name}: {rows[name]:.1f} s", flush=True)
    result = {
        "limits": asdict(LIMITS),
        "seconds": rows,
        "worst": max(rows, key=rows.get),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread",
        "pair": application.store.names[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"worst: {result['worst']} ({rows[result['worst']]:.1f} s); wrote {args.out}")


if __name__ == "__main__":
    main()
