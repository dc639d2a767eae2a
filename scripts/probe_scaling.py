"""How well the committed rates, scaled by each pair's probe, estimate a request on another machine, against the
pair timed in full there (demo/reference.py): for each CPU capability (a kernel choice emulates another machine,
docs/specification_notes.md), a process of its own probes each embedded pair, times it in full, and runs its
default Generate twice; the record gives both estimates and the measured seconds, and the load average.

Usage, from the repository root, on a quiet machine (about 2 minutes per capability here)::

    python -m scripts.probe_scaling [--capabilities native avx2 default] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# A capability's kernel variables: "native" is this machine's own choice.
CAPABILITIES = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def measure() -> dict:
    """In this process: each embedded pair's probe, its estimates of its default Generate from the committed rates
    scaled by the probe and from its full timing, and that Generate's seconds (twice)."""
    import torch

    from demo import server
    from demo.application import pair_defaults
    from demo.limits import Limits
    from demo.tabs.generate import RUN_KINDS, compare

    torch.set_num_threads(1)
    app = server.make_app(None, Limits(max_seconds=1e9))
    out = {"load_average": [os.getloadavg()[0]], "pairs": {}}
    for name in app.store.names:
        values = pair_defaults(app, app.default_controls(), name)
        r = app.request(None, True, **values)
        probe = app.probe_seconds(name)
        app.timings.scale[name] = probe / app.timings.reference.probes[name]
        scaled = app.estimate(r, RUN_KINDS)
        t0 = time.perf_counter()
        app.timings.known[name] = app.timings.measure(r.pair, None)
        timed_s = time.perf_counter() - t0
        timed = app.estimate(r, RUN_KINDS)
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            for _ in compare(app, lambda *a, **k: None, fit=False, **values):
                pass
            runs.append(time.perf_counter() - t0)
        out["pairs"][name] = {
            "probe_s": round(probe, 3),
            "scale": round(app.timings.scale[name], 2),
            "estimate_scaled_s": round(scaled, 2),
            "estimate_timed_s": round(timed, 2),
            "timing_s": round(timed_s, 1),
            "generate_s": [round(x, 2) for x in runs],
        }
    out["load_average"].append(os.getloadavg()[0])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.probe_scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--capabilities", nargs="+", default=list(CAPABILITIES), choices=list(CAPABILITIES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # one capability, in this process
    args = ap.parse_args(argv)
    if args.here:
        print(json.dumps(measure()))
        return
    record = {}
    for cap in args.capabilities:
        env = os.environ | CAPABILITIES[cap] | {"GRADIO_ANALYTICS_ENABLED": "False"}
        run = subprocess.run(
            [sys.executable, "-m", "scripts.probe_scaling", "--here"], env=env, capture_output=True, text=True
        )
        if run.returncode != 0:
            raise SystemExit(run.stderr[-3000:])
        record[cap] = json.loads(run.stdout.splitlines()[-1])
        print(cap, json.dumps(record[cap]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
