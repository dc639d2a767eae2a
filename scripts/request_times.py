"""Wall time of every default request and every preset the app offers, on each embedded pair, as the app
serves them (one torch thread, its request code, the time limit lifted to see the true time), beside the
estimate the page shows before the click and the CPU seconds the process spent (what a machine shared with
other work inflates least). Writes bench/results/request_times.json, one record per CPU capability (the
machine's own, or another's under its environment variables, docs/specification_notes.md), each naming its
CPU and capability and the load average around each pair's requests; a run replaces its capability's record
(with --pairs, those pairs' rows) and keeps the others. Each row has the goal of issue 44 for the slowest CPU
served (a 2-core AVX2 machine), where there is one.

Usage: python -m scripts.request_times [--out FILE] [--pairs NAME ...]. Run it alone, on a quiet machine: it
measures wall time. Both records, as docs/app.md gives them:

    nice -n -5 python -m scripts.request_times                                                 # the machine's own
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 nice -n -5 python -m scripts.request_times  # an AVX2 machine
"""

import argparse
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from csd.experiments.defaults import PRESETS
from csd.experiments.timing import machine
from demo import server
from demo.application import pair_defaults
from demo.estimate import HEADROOM
from demo.limits import Limits
from demo.tabs.analyze import analysis_panels, check_analysis, check_frontier, default_images, frontier_result
from demo.tabs.generate import check_generate, compare

NO_PROGRESS = lambda *a, **k: None
LIMITS = Limits()  # the server's default limits


# Issue 44's goals on the slowest CPU served (2 cores, AVX2 only), in seconds.
GOALS = {"generate, default pair": 12.0, "generate": 20.0, "analysis": 45.0}


def _timed(requests) -> dict:
    """Wall and CPU seconds of draining a request's generator (status lines, then its result)."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in requests:
        pass
    return {"seconds": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (the share of its cores others used)."""
    return [round(x, 2) for x in os.getloadavg()]


def measure(app, pair_name: str) -> dict:
    base = pair_defaults(app, app.default_controls(), pair_name)
    default_pair = pair_name == app.store.names[0]
    rows = {}
    for name in PRESETS:
        values = app.preset(name, base)
        r = check_generate(app, None, True, **values)
        goal = GOALS["generate, default pair"] if default_pair and name == "default" else GOALS["generate"]
        rows[f"generate, preset {name}"] = {
            "batch": len(r.seeds),
            "estimate_s": app.estimate(r, {"target": 1, "csd": 1, "draft": 1}),
            **_timed(compare(app, NO_PROGRESS, **values)),
            "goal_s": goal,
        }
    analysis = {k: v for k, v in base.items() if k != "batch_size"}
    for label, check, run in (
        ("analysis", check_analysis, analysis_panels),
        ("frontier", check_frontier, frontier_result),
    ):
        n = default_images(app, check, pair_name)  # what the page offers for this pair
        r = app.request(None, True, **analysis, batch_size=1)
        planned = check(app, n, None, True, **analysis)[0].planned()
        rows[f"{label}, default ({n} images)"] = {
            "images": n,
            "estimate_s": app.estimate_runs(r, planned, n),
            **_timed(run(app, n, NO_PROGRESS, None, **analysis)),
            "goal_s": GOALS.get(label),
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
    loads = {"start": load_average()}
    timed: list[str] = []
    app.idle_work(timed.append)  # every pair probed or timed at its default setting, as the server does
    records = json.loads(args.out.read_text()) if args.out.exists() else {}
    here = machine()
    kept = records.get(here["capability"], {}).get("pairs", {}) if args.pairs else {}  # other pairs' rows stay
    results = dict(kept)
    for name in args.pairs or app.store.names:
        results[name] = measure(app, name)
        loads[name] = load_average()
    rows = [(p, k, v) for p, pair_rows in results.items() for k, v in pair_rows.items()]
    worst = max(rows, key=lambda row: row[2]["seconds"])
    out = {
        "limits": asdict(limits),
        "refused_above_s": HEADROOM * limits.max_seconds,
        "pairs": results,
        "worst": {"pair": worst[0], "request": worst[1], "seconds": worst[2]["seconds"]},
        "all_within_limit": all(v["seconds"] <= limits.max_seconds for _, _, v in rows),
        "all_within_goal": all(v["seconds"] <= v["goal_s"] for _, _, v in rows if v.get("goal_s")),
        "machine": here,
        "load_average": loads,  # 1, 5, 15 min: at the start and after each pair's requests
        "cores": os.cpu_count(),
        "start_up": timed,
    }
    records[here["capability"]] = out
    args.out.write_text(json.dumps(records, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
