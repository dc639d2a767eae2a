"""Soak and fault test of a running demo server, for operators: N clients for T seconds, each request a new
session (as every API call is), a share of them sent with a bad value on purpose.

    python -m demo.soak --url http://127.0.0.1:7860 --clients 4 --seconds 120 [--pid SERVER_PID] [--out F.json]
    python -m demo.soak --url http://127.0.0.1:7860 --burst 40 [--out F.json]   # 40 visitors at once, one each

It speaks the queue protocol over plain HTTP (join, then read the result stream), so it sees what any
client sees: served requests, named refusals (the validator's, the guard's 413/429, the handler's), unnamed
errors (a generic "Error", a 500, a dropped connection: what must never happen), latency (p50, p95), the
time a request waited in the queue, and, with ``--pid``, the server's resident memory over time. With
``--burst N``, N visitors send /generate at the page's defaults at once, one request each: served, refused (and
the words), each one's place in line and predicted wait as it was told them, and its measured wait.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from gradio_client.utils import apply_diff

SEED_STEP = 100  # seeds between two requests of a burst (a request's images take seed, seed + 1, ...)
# Values a careless or hostile client sends; each replaces one parameter of an otherwise good request.
BAD_VALUES = (True, -1, 1.5, float("nan"), "x", None, [1, 2], "A" * 5000, 10**12, {"a": 1})


@dataclass(frozen=True)
class Endpoint:
    name: str  # "/generate"
    fn_index: int
    parameters: tuple[str, ...]  # in the order the server takes them


# A waiting request's status line (demo.line.Where.text): its place, how many wait, its predicted wait.
IN_LINE = re.compile(r"Place (\d+) of (\d+) in line: (?:under 1 s|about ([\d.]+) (s|min)) to wait")


@dataclass
class Outcome:
    kind: str  # "served", "refused" (named), "unnamed"
    seconds: float
    queued: float = 0.0  # seconds from sending the request to its run's start (its first status past its place in line)
    joined: float = 0.0  # seconds from sending the request to the server's answer that it joined the queue
    detail: str = ""
    places: list[tuple[float, int, float]] = field(default_factory=list)  # (seconds in, place, predicted wait)
    eta: float | None = None  # Gradio's own first estimate of the wait in its queue, where it sent one
    output: list | None = None  # a served request's outputs


def in_line(outputs: list) -> tuple[int, float] | None:
    """The place and predicted wait (seconds; under 1 s: 0) an update's status line gives, or None."""
    for value in outputs:
        match = IN_LINE.search(value) if isinstance(value, str) else None
        if match:
            wait = float(match.group(3) or 0) * (60 if match.group(4) == "min" else 1)
            return int(match.group(1)), wait
    return None


def endpoints(url: str) -> dict[str, Endpoint]:
    """The server's named endpoints, their function indices and parameter order (its /info and /config)."""
    info = httpx.get(f"{url}/gradio_api/info", timeout=30).json()["named_endpoints"]
    config = httpx.get(f"{url}/config", timeout=30).json()
    index = {d["api_name"]: i for i, d in enumerate(config["dependencies"]) if d.get("api_name")}
    return {
        name: Endpoint(name, index[name.lstrip("/")], tuple(p["parameter_name"] for p in spec["parameters"]))
        for name, spec in info.items()
        if name.lstrip("/") in index
    }


def named(message: str, parameters) -> bool:
    """A refusal is named when it says which control or limit it is about."""
    words = ("must be", "at most", "limit", "would take", "not in the vocabulary", "per visitor", "not listening")
    words += ("in line", "stopped listening")
    return bool(message) and message.strip() not in ("Error", "None") and any(w in message for w in words)


def call(url: str, endpoint: Endpoint, values: dict, timeout: float = 300.0) -> Outcome:
    """One request in a new session: join the queue, read the result stream to its end (each update's outputs,
    from the server's diffs), noting each place in line it was told and when its run started."""
    session, t0 = uuid.uuid4().hex[:11], time.perf_counter()
    body = {"data": [values.get(p) for p in endpoint.parameters], "fn_index": endpoint.fn_index}
    body |= {"session_hash": session, "event_data": None, "trigger_id": None}
    try:
        with httpx.Client(timeout=timeout) as http:
            headers = {"content-type": "application/json"}
            joined = http.post(f"{url}/gradio_api/queue/join", content=json.dumps(body), headers=headers)
            joined_s = time.perf_counter() - t0
            if joined.status_code != 200:
                detail = refusal_text(joined)
                kind = "refused" if joined.status_code in (413, 422, 429, 503) and named(detail, ()) else "unnamed"
                return Outcome(kind, time.perf_counter() - t0, detail=f"{joined.status_code} {detail}")
            started, outputs, places, eta = None, None, [], None
            with http.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg, now = json.loads(line[5:]), time.perf_counter()
                    if msg.get("msg") == "estimation" and eta is None:
                        eta = msg.get("rank_eta")
                    if msg.get("msg") == "process_generating":
                        data = msg["output"]["data"]
                        outputs = list(data) if outputs is None else list(map(apply_diff, outputs, data))
                        place = in_line(outputs)
                        if place is not None and started is None:
                            places.append((now - t0, *place))
                        started = started or (None if place is not None else now)
                    if msg.get("msg") == "process_completed":
                        queued = (started or now) - t0
                        seen = {"places": places, "eta": eta, "joined": joined_s}
                        if msg.get("success"):
                            return Outcome("served", now - t0, queued, output=msg["output"]["data"], **seen)
                        error = str((msg.get("output") or {}).get("error") or "")
                        kind = "refused" if named(error, endpoint.parameters) else "unnamed"
                        return Outcome(kind, now - t0, queued, detail=error[:300], **seen)
        return Outcome("unnamed", time.perf_counter() - t0, detail="the stream ended without a result")
    except httpx.HTTPError as err:
        return Outcome("unnamed", time.perf_counter() - t0, detail=f"{type(err).__name__}: {err}")


def refusal_text(response: httpx.Response) -> str:
    """What a refused join says: the validator's messages (the invalid parameters'), or the detail."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:300]
    if isinstance(detail, list):
        return "; ".join(
            f"{d.get('parameter_name')}: {d.get('message')}" for d in detail if not d.get("is_valid", True)
        )
    return str(detail)[:300]


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU seconds process ``pid`` has used (user and system, its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_idle(pid: int, quiet: float = 3.0, share: float = 0.05, most: float = 600.0) -> float:
    """Seconds until process ``pid`` has used under ``share`` of a core for ``quiet`` seconds (at most ``most``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < most:
        before = cpu_seconds(pid)
        time.sleep(quiet)
        if cpu_seconds(pid) - before < share * quiet:
            break
    return time.monotonic() - t0


def resident_mib(pid: int | str = "self") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Soak:
    """Clients calling endpoints with their requests (``requests[name]``: the good values) for a while."""

    url: str
    requests: dict[str, dict]
    bad_share: float = 0.2
    seed: int = 0
    outcomes: list[tuple[str, Outcome]] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MiB)

    def run(self, clients: int, seconds: float | None = None, calls: int | None = None, pid="self") -> dict:
        """Until ``seconds`` pass or ``calls`` requests were made; returns :meth:`report`."""
        eps = endpoints(self.url)
        lock, t0, made = threading.Lock(), time.perf_counter(), [0]

        def more() -> bool:
            with lock:
                if (seconds is not None and time.perf_counter() - t0 > seconds) or (
                    calls is not None and made[0] >= calls
                ):
                    return False
                made[0] += 1
                return True

        def client(k: int) -> None:
            rng = random.Random(self.seed * 1000 + k)
            while more():
                name = rng.choice(sorted(self.requests))
                values = dict(self.requests[name])
                if rng.random() < self.bad_share:
                    values[rng.choice(sorted(values))] = rng.choice(BAD_VALUES)
                outcome = call(self.url, eps[name], values)
                with lock:
                    self.outcomes.append((name, outcome))

        def watch() -> None:
            while any(t.is_alive() for t in threads):
                mib = resident_mib(pid)
                if mib is not None:
                    self.memory.append((time.perf_counter() - t0, mib))
                time.sleep(1.0)

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
        for t in threads:
            t.start()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for t in threads:
            t.join()
        watcher.join()
        return self.report(time.perf_counter() - t0)

    def report(self, wall: float) -> dict:
        kinds = Counter(o.kind for _, o in self.outcomes)
        served = [o.seconds for _, o in self.outcomes if o.kind == "served"]
        queued = [o.queued for _, o in self.outcomes if o.kind == "served"]
        pct = lambda xs, q: statistics.quantiles(xs, n=20)[q] if len(xs) >= 2 else (xs[0] if xs else None)
        return {
            "requests": len(self.outcomes),
            "wall_s": round(wall, 1),
            "by_kind": dict(kinds),
            "by_endpoint": dict(Counter(f"{n} {o.kind}" for n, o in self.outcomes)),
            "unnamed_examples": [f"{n}: {o.detail}" for n, o in self.outcomes if o.kind == "unnamed"][:10],
            "latency_p50_s": pct(served, 9),
            "latency_p95_s": pct(served, 18),
            "queue_wait_p95_s": pct(queued, 18),
            "memory_mib": {
                "start": self.memory[0][1] if self.memory else None,
                "end": self.memory[-1][1] if self.memory else None,
                "max": max((m for _, m in self.memory), default=None),
            },
        }


def burst(url: str, clients: int, values: dict, endpoint: str = "/generate") -> list[Outcome]:
    """``clients`` requests of ``endpoint`` sent at once, each in a session of its own, request k at seed
    ``values["seed"] + SEED_STEP * k`` (distinct images); their outcomes, in that order."""
    ep, outcomes = endpoints(url)[endpoint], [None] * clients
    ready = threading.Barrier(clients)

    def client(k: int) -> None:
        ready.wait()
        outcomes[k] = call(url, ep, values | {"seed": values["seed"] + SEED_STEP * k})

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def burst_report(outcomes: list[Outcome]) -> dict:
    """What a burst's visitors saw: served, refused (by name), unnamed; the messages of the refusals; each served
    request's predicted wait (the first the line told it, or Gradio's own estimate where the server sent its own
    line none), its measured wait and its time to the result."""
    served = [o for o in outcomes if o.kind == "served"]
    r1 = lambda x: None if x is None else round(x, 1)
    return {
        "clients": len(outcomes),
        "by_kind": dict(Counter(o.kind for o in outcomes)),
        "refusals": sorted({o.detail for o in outcomes if o.kind != "served"}),
        "saw_a_place": sum(1 for o in outcomes if o.places),
        "predicted_wait_s": [r1(o.places[0][2]) if o.places else None for o in served],
        "gradio_eta_s": [r1(o.eta) for o in served],
        "measured_wait_s": [r1(o.queued) for o in served],
        # the first predicted wait over the wait measured from when it was told (waits of 5 s or more)
        "predicted_over_measured": [
            round(o.places[0][2] / (o.queued - o.places[0][0]), 2)
            for o in served
            if o.places and o.queued - o.places[0][0] >= 5.0
        ],
        "seconds": [r1(o.seconds) for o in served],
        "median_s": r1(statistics.median(o.seconds for o in served)) if served else None,
        "longest_s": r1(max((o.seconds for o in served), default=None)),
        "refused_after_s": [r1(o.seconds) for o in outcomes if o.kind != "served"],
    }


def default_requests(url: str, make: Callable[[dict], dict] | None = None, small: bool = True) -> dict[str, dict]:
    """Good values of every named endpoint: the page's defaults, small (batch 1, few AR steps) unless ``small``
    is False."""
    config = httpx.get(f"{url}/config", timeout=30).json()
    eps = endpoints(url)
    by_id = {c["id"]: c.get("props", {}) for c in config["components"]}
    out = {}
    for name, ep in eps.items():
        dep = config["dependencies"][ep.fn_index]
        values = {p: by_id.get(i, {}).get("value") for p, i in zip(ep.parameters, dep["inputs"], strict=False)}
        if small:
            values |= {k: v for k, v in {"batch_size": 1, "n_images": 1, "samples": 1000}.items() if k in values}
        out[name] = make(values) if make else values
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo.soak", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--bad-share", type=float, default=0.2, help="share of requests with one bad value")
    p.add_argument("--endpoints", nargs="+", default=["/generate", "/toy", "/inspect"], help="which to call")
    p.add_argument("--pid", default=None, help="the server's process id, for its resident memory over time")
    p.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    p.add_argument(
        "--burst", type=int, default=None, help="instead: this many /generate at the page's defaults at once, once"
    )
    args = p.parse_args(argv)
    if args.burst is not None:
        values = default_requests(args.url, small=False)["/generate"]
        report = burst_report(burst(args.url, args.burst, values))
        report["load_average"] = [round(x, 2) for x in os.getloadavg()]
        text = json.dumps(report, indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return
    requests = {k: v for k, v in default_requests(args.url).items() if k in args.endpoints}
    soak = Soak(args.url, requests, args.bad_share)
    report = soak.run(args.clients, seconds=args.seconds, pid=args.pid or "self")
    report["settings"] = vars(args) | {"out": str(args.out) if args.out else None}
    report["memory_over_time"] = [(round(t, 1), round(m, 1)) for t, m in soak.memory[:: max(1, len(soak.memory) // 60)]]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
