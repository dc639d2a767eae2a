"""Wall time of every default request and every preset the app offers, on each embedded pair, as the app
serves them (one torch thread, its request code, the time limit lifted to see the true time), beside the
estimate the page shows before the click. Writes bench/results/request_times.json, one record per CPU
capability (the machine's own, or another's under its environment variables, docs/specification_notes.md),
each naming its CPU and capability; a run replaces its capability's record (with --pairs, those pairs' rows)
and keeps the others.

Usage: python -m scripts.request_times [--out FILE] [--pairs NAME ...]. Run it alone: it measures wall time.
As an AVX2 machine: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m scripts.request_times"""

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from csd.experiments.timing import machine
from demo import server
from demo.controls import PRESETS, preset_values
from demo.estimate import HEADROOM
from demo.limits import Limits
from demo.tabs.analysis import analysis_panels, check_analysis, check_frontier, frontier_result
from demo.tabs.generate import check_generate, compare

NO_PROGRESS = lambda *a, **k: None
LIMITS = Limits()  # the server's default limits


def _drain(requests) -> float:
    t0 = time.perf_counter()
    for _ in requests:
        pass
    return time.perf_counter() - t0


def _runs(generator) -> float:
    """A recompute generator (status lines, then its result) to its end."""
    t0 = time.perf_counter()
    while True:
        try:
            next(generator)
        except StopIteration:
            return time.perf_counter() - t0


def fitting_images(app, check, controls: dict) -> int:
    """The Images (n) the page starts a recompute of this pair at: the most (at most 4) that the real limit
    takes (demo.tabs.analysis.AnalysisTab.fitting_images, with the limit the script lifts put back)."""
    lifted, app.limits = app.limits, LIMITS
    try:
        for k in range(min(4, LIMITS.max_images), 0, -1):
            try:
                check(app, k, None, False, **controls)
                return k
            except Exception:
                continue
        return 1
    finally:
        app.limits = lifted


def measure(app, pair_name: str) -> dict:
    source = app.store.source(pair_name)
    base = app.default_controls() | {"pair_name": pair_name}
    if source.traits.fixed_num_steps:
        base |= {"ar_steps": source.traits.fixed_num_steps, "cfg_schedule": source.traits.cfg_schedule}
    if not source.is_text:
        base["class_name"] = source.class_names[0]
    rows = {}
    for name in PRESETS:
        values = preset_values(name, base, base)
        r = check_generate(app, None, True, **values)
        estimate = app.estimate(r, {"target": 1, "csd": 1, "draft": 1})
        rows[f"generate, preset {name}"] = {
            "estimate_s": estimate,
            "seconds": _drain(compare(app, NO_PROGRESS, **values)),
        }
    analysis = {k: v for k, v in base.items() if k != "batch_size"}
    for label, check, run in (
        ("analysis", check_analysis, analysis_panels),
        ("frontier", check_frontier, frontier_result),
    ):
        n = fitting_images(app, check, analysis)  # what the page offers for this pair
        r = app.request(None, True, **analysis, batch_size=1)
        planned = check(app, n, None, True, **analysis)
        runs = planned.run_counts() if hasattr(planned, "run_counts") else {"csd": len(planned)}
        rows[f"{label}, default ({n} images)"] = {
            "estimate_s": app.estimate(r, runs, n),
            "seconds": _runs(run(app, n, NO_PROGRESS, None, **analysis)),
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/request_times.json"))
    ap.add_argument("--pairs", nargs="+", default=None, help="pair names (default: every served pair)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    limits = LIMITS
    app = server.make_app(None, replace(limits, max_seconds=1e9))  # see the true time; the estimate uses `limits`
    server.warm_up(app)
    records = json.loads(args.out.read_text()) if args.out.exists() else {}
    here = machine()
    kept = records.get(here["capability"], {}).get("pairs", {}) if args.pairs else {}  # other pairs' rows stay
    results = kept | {name: measure(app, name) for name in (args.pairs or app.store.names)}
    most = HEADROOM * limits.max_seconds
    worst = max(((p, k, v["seconds"]) for p, rows in results.items() for k, v in rows.items()), key=lambda x: x[2])
    out = {
        "limits": asdict(limits),
        "refused_above_s": most,
        "pairs": results,
        "worst": {"pair": worst[0], "request": worst[1], "seconds": worst[2]},
        "all_within_limit": all(v["seconds"] <= limits.max_seconds for rows in results.values() for v in rows.values()),
        "machine": here,
    }
    records[here["capability"]] = out
    args.out.write_text(json.dumps(records, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
