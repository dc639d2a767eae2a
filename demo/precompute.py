"""Make the page's precomputed comparisons (:mod:`demo.showcase`): every example whose pair is served, run
as a visitor's Generate run is, written to ``assets/showcase/`` with the weights it was made with; or, with
``--rates``, the committed rates (:mod:`demo.reference`): every pair a server offers by default timed at its
default setting and probed, on this machine (a quiet one), written to ``assets/rates.json``.

    python -m demo.precompute [--out DIR] [--threads 1]
    python -m demo.precompute --rates [--out FILE] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from PIL import Image

from csd.cli import add_machine_flags, start_up
from csd.experiments.timing import machine
from csd.serving.pairs import RANDOM_SOURCE, PairStore, discover
from demo import server
from demo.application import App, pair_defaults
from demo.limits import Limits
from demo.reference import REFERENCE_FILE
from demo.showcase import EXAMPLES, SHOWCASE_DIR
from demo.tabs.generate import compare
from demo.views import stats_markdown


def make(app, out: Path = SHOWCASE_DIR) -> list[str]:
    """Run every example the server can (its pair is served) and write it to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, pair_name, changes in EXAMPLES:
        if pair_name not in app.store.names:
            continue
        controls = pair_defaults(app, app.default_controls() | changes, pair_name)  # xAR: its AR steps and CFG ramp
        *_, c = compare(app, lambda *a, **k: None, fit=False, **controls)  # the last event: the Comparison
        images = c.images
        record = {"title": title, "stats": stats_markdown(c.summary), "summary": c.summary}
        runs = {"target-only": c.target, "CSD": c.csd, "draft-only": c.draft}  # the names of the time chart
        record["phases"] = {name: dict(run.trace.times) for name, run in runs.items()}
        record |= {"controls": controls, "weights": app.store.source(pair_name).weights}
        for key, image in images.items():
            Image.fromarray(image).save(out / f"{name}_{key}.png")
        (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
        written.append(name)
    return written


def rates(log=print) -> dict:
    """Every pair a server may offer by default (the embedded ones, and the untrained one it serves without them)
    timed at its default setting and probed here: the committed rates' file, with its weights and setting."""
    app = App(PairStore([*discover(None), RANDOM_SOURCE], torch.device("cpu")), Limits())
    pairs = {}
    for name in app.store.names:
        t0 = time.perf_counter()
        app.rates(app.store.get(name))
        took = time.perf_counter() - t0
        pairs[name] = {
            "weights": app.store.source(name).weights,
            "setting": app.default_setting(name),
            "rates": asdict(app.timings.known[name]),
            "probe_s": app.probe_seconds(name),
            "timed_s": round(took, 1),
        }
        log(f"Timed {name} in {took:.1f} s, its probe {pairs[name]['probe_s']:.3f} s")
    when = {"when": time.strftime("%Y-%m-%d"), "load_average": [round(x, 2) for x in os.getloadavg()]}
    return {"machine": machine(), **when, "pairs": pairs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo.precompute", description=__doc__.split("\n")[0])
    p.add_argument("--rates", action="store_true", help=f"write the committed rates (default --out {REFERENCE_FILE})")
    p.add_argument("--out", type=Path, default=None, help=f"default {SHOWCASE_DIR}")
    add_machine_flags(p, threads=1, device=False)
    args = p.parse_args(argv)
    start_up(args, p)
    if args.rates:
        (args.out or REFERENCE_FILE).write_text(json.dumps(rates(), indent=1) + "\n")
        return
    app = server.make_app(None, server.Limits(max_seconds=600.0))
    print("wrote", ", ".join(make(app, args.out or SHOWCASE_DIR)))


if __name__ == "__main__":
    main()
