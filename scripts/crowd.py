"""What visitors see of a server started anew with ``python app.py`` (one torch thread), two ways:

* ``cold``: for each embedded pair, a fresh server and one /generate at that pair's page defaults sent the
  moment the page answers; then, once the server has been idle for a while (its process using under 5% of a core
  for 3 s), the same request again ``--repeats`` times (the steady state: the median), and their ratio;
* ``burst``: one fresh server, idle, then ``--clients`` visitors sending /generate at the page's defaults at once
  (each its own session and seed), for each count given, the server idle again between: served, refused (and
  the words), each one's predicted wait (what the line told it first, else Gradio's own estimate), measured wait
  and time to its result (:func:`demo.soak.burst`).

Usage, from the repository root (``--tree``: the tree whose ``app.py`` is served, default this one)::

    python -m scripts.crowd cold [--tree DIR] [--pairs NAME ...] [--repeats 2] [--out FILE.json]
    python -m scripts.crowd burst [--tree DIR] [--clients 16 40] [--out FILE.json]

``--out`` writes the record as JSON, with the command that made it, and beside it the same as a table (``.md``).

It speaks to the server over HTTP only (the pair's defaults are read from this tree's controls), so it measures
another tree's server as well as this one's. Each record gives the load average around each measurement and the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from csd.experiments.timing import machine
from demo import server
from demo.application import pair_defaults
from demo.limits import Limits
from demo.soak import burst, burst_report, default_requests, until_idle

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def generate_seconds(url: str, values: dict) -> float:
    """Seconds of one /generate through the API client, from its submission to its result."""
    from gradio_client import Client

    client = Client(url, verbose=False, ssl_verify=False)
    t0 = time.perf_counter()
    client.predict(**values, api_name="/generate")
    return time.perf_counter() - t0


@contextmanager
def fresh_server(tree: Path, log: Path) -> Iterator[tuple[str, subprocess.Popen, float]]:
    """``python app.py`` of ``tree`` started anew on a free port: its URL, its process and the seconds until its
    page answered; stopped after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False", "CSD_THREADS": "1"}
    env.pop("SPACES_ZERO_GPU", None)
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        while not answers(url):
            if proc.poll() is not None or time.monotonic() - t0 > 300:
                raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url, proc, time.monotonic() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def cold(tree: Path, values: dict, repeats: int, log: Path) -> dict:
    """One pair's first /generate on a fresh server, and its steady state."""
    loads = {"start": os.getloadavg()[0]}
    with fresh_server(tree, log) as (url, proc, to_page):
        first = generate_seconds(url, values)
        loads["first"] = os.getloadavg()[0]
        idle = until_idle(proc.pid)
        steady = [generate_seconds(url, values) for _ in range(repeats)]
        loads["steady"] = os.getloadavg()[0]
    median = statistics.median(steady)
    return {
        "seconds_to_page": round(to_page, 2),
        "first_generate_s": round(first, 2),
        "steady_generate_s": [round(s, 2) for s in steady],
        "first_over_steady": round(first / median, 2),
        "idle_after_s": round(idle, 1),
        "load_average": {k: round(v, 2) for k, v in loads.items()},
    }


def bursts(tree: Path, counts: list[int], log: Path) -> dict:
    """Bursts of visitors on one fresh server, idle before each."""
    out = {}
    with fresh_server(tree, log) as (url, proc, _):
        values = default_requests(url.rstrip("/"), small=False)["/generate"]
        for n in counts:
            until_idle(proc.pid)
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            out[n] = burst_report(burst(url.rstrip("/"), n, values))
            out[n] |= {"wall_s": round(time.perf_counter() - t0, 1), "load_average": [load, os.getloadavg()[0]]}
            print(n, json.dumps(out[n]), flush=True)
    return out


def _span(values: list) -> str:
    values = [v for v in values if v is not None]
    return "-" if not values else f"{min(values)}-{max(values)}" if min(values) != max(values) else f"{values[0]}"


def markdown(record: dict) -> str:
    """The record as a table, with its command, machine and time."""
    head = f"`{record['command']}` ({record['machine']}, {record['cpus']} cores, {record['when']})\n\n"
    if record["mode"] == "cold":
        rows = [
            "| pair | page s | first /generate s | steady s | first / steady | load average (start, first, steady) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for pair, c in record["pairs"].items():
            steady = ", ".join(str(s) for s in c["steady_generate_s"])
            loads = ", ".join(str(v) for v in c["load_average"].values())
            rows.append(
                f"| {pair} | {c['seconds_to_page']} | {c['first_generate_s']} | {steady} | {c['first_over_steady']} "
                f"| {loads} |"
            )
    else:
        rows = [
            "| clients | served | refused | unnamed | saw a place | predicted wait s | measured wait s "
            "| predicted / measured (waits of 5 s or more) | median s | longest s | burst s | load average |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for n, b in record["bursts"].items():
            kinds = b["by_kind"]
            rows.append(
                f"| {n} | {kinds.get('served', 0)} | {kinds.get('refused', 0)} | {kinds.get('unnamed', 0)} "
                f"| {b['saw_a_place']} | {_span(b['predicted_wait_s'])} | {_span(b['measured_wait_s'])} "
                f"| {_span(b['predicted_over_measured'])} | {b['median_s']} | {b['longest_s']} | {b['wall_s']} "
                f"| {b['load_average'][0]:.2f}, {b['load_average'][1]:.2f} |"
            )
        refusals = sorted({r for b in record["bursts"].values() for r in b["refusals"]})
        rows += ["", *(f"Refused: {r}" for r in refusals)]
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.crowd", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("cold", "burst"))
    ap.add_argument("--tree", type=Path, default=ROOT, help="the tree whose app.py is served")
    ap.add_argument("--pairs", nargs="+", default=None, help="cold: pair names (default: every embedded pair)")
    ap.add_argument("--repeats", type=int, default=2, help="cold: steady-state requests per pair")
    ap.add_argument("--clients", type=int, nargs="+", default=[16, 40], help="burst: visitors at once, per burst")
    ap.add_argument("--out", type=Path, default=None, help="write the record as JSON")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"crowd_{os.getpid()}.log"
    record = {"command": "python -m scripts.crowd " + shlex.join(argv), "mode": args.mode, "tree": str(args.tree)}
    if args.mode == "cold":
        app = server.make_app(None, Limits(), reference=None)  # the pairs' names and page defaults (none loaded)
        record["pairs"] = {}
        for pair in args.pairs or app.store.names:
            values = pair_defaults(app, app.default_controls(), pair)
            record["pairs"][pair] = cold(args.tree, values, args.repeats, log)
            print(pair, json.dumps(record["pairs"][pair]), flush=True)
    else:
        record["bursts"] = bursts(args.tree, args.clients, log)
    record |= {"cpus": os.cpu_count(), "machine": machine()["cpu"]}
    record["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        args.out.with_suffix(".md").write_text(markdown(record))


if __name__ == "__main__":
    main()
