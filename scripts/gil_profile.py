"""Where a served app held the interpreter: a py-spy profile taken with ``--gil`` (only the thread holding the
GIL is sampled) of ``python -m scripts.crowd`` and its server, summed for the server's process (``app.py``).

    py-spy record --gil --subprocesses --format raw -r 50 -o gil.txt -- python -m scripts.crowd burst --clients 40
    python -m scripts.gil_profile gil.txt [gil.txt.gz ...] [--rate 50]

Seconds per part, from the samples (``--rate``: py-spy's samples per second): the models (``csd/``), Gradio's
``postprocess_data`` (an update's outputs made into components and configs) and the API schemas made in it
(``model_json_schema``), and all. py-spy is a profiler, not a dependency: ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

PARTS = {  # a part: a sample whose stack holds this text
    "models": "csd/",
    "postprocess": "postprocess_data",
    "api schemas": "model_json_schema",
}


def server_seconds(lines: Iterable[str], rate: float, server: str = "app.py") -> dict[str, float]:
    """Seconds of the samples of the process whose command holds ``server``, in all and per part of
    :data:`PARTS`; ``lines``: py-spy's raw (collapsed) output, ``frames;... count``."""
    seconds = dict.fromkeys(["all", *PARTS], 0.0)
    for line in lines:
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        processes = [frame for frame in stack.split(";") if frame.startswith("process ")]
        if not processes or server not in processes[-1]:
            continue
        seconds["all"] += int(count) / rate
        for part, text in PARTS.items():
            if text in stack:
                seconds[part] += int(count) / rate
    return seconds


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.gil_profile", description=__doc__.split("\n")[0])
    p.add_argument("profiles", nargs="+", type=Path, help="py-spy --format raw files (.gz read as such)")
    p.add_argument("--rate", type=float, default=50.0, help="py-spy's samples per second (-r)")
    args = p.parse_args(argv)
    for path in args.profiles:
        seconds = server_seconds(read_lines(path), args.rate)
        print(json.dumps({"profile": str(path), **{k: round(v, 2) for k, v in seconds.items()}}))


if __name__ == "__main__":
    main()
