"""Make the page's precomputed comparisons (:mod:`demo.showcase`): every example whose pair is served, run
as a visitor's Generate run is, written to ``assets/showcase/`` with the weights it was made with.

    python -m demo.precompute [--out DIR] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image

from csd.cli import add_machine_flags, start_up
from demo import server
from demo.application import pair_defaults
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo.precompute", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=SHOWCASE_DIR)
    add_machine_flags(p, threads=1, device=False)
    args = p.parse_args(argv)
    start_up(args, p)
    app = server.make_app(None, server.Limits(max_seconds=600.0))
    print("wrote", ", ".join(make(app, args.out)))


if __name__ == "__main__":
    main()
