"""Soak and fault test of a running demo server, for operators: N clients for T seconds, each request a new
session (as every API call is), a share of them sent with a bad value on purpose.

    python -m demo.soak --url http://127.0.0.1:7860 --clients 4 --seconds 120 [--pid SERVER_PID] [--out F.json]

It speaks the queue protocol over plain HTTP (join, then read the result stream), so it sees what any
client sees: served requests, named refusals (the validator's, the guard's 413/429, the handler's), unnamed
errors (a generic "Error", a 500, a dropped connection: what must never happen), latency (p50, p95), the
time a request waited in the queue, and, with ``--pid``, the server's resident memory over time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# Values a careless or hostile client sends; each replaces one parameter of an otherwise good request.
BAD_VALUES = (True, -1, 1.5, float("nan"), "x", None, [1, 2], "A" * 5000, 10**12, {"a": 1})


@dataclass(frozen=True)
class Endpoint:
    name: str  # "/generate"
    fn_index: int
    parameters: tuple[str, ...]  # in the order the server takes them


@dataclass
class Outcome:
    kind: str  # "served", "refused" (named), "unnamed"
    seconds: float
    queued: float = 0.0  # seconds between joining and the run's start
    detail: str = ""


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
    return bool(message) and message.strip() not in ("Error", "None") and any(w in message for w in words)


def call(url: str, endpoint: Endpoint, values: dict, timeout: float = 300.0) -> Outcome:
    """One request in a new session: join the queue, read the result stream to its end."""
    session, t0 = uuid.uuid4().hex[:11], time.perf_counter()
    body = {"data": [values.get(p) for p in endpoint.parameters], "fn_index": endpoint.fn_index}
    body |= {"session_hash": session, "event_data": None, "trigger_id": None}
    try:
        with httpx.Client(timeout=timeout) as http:
            headers = {"content-type": "application/json"}
            joined = http.post(f"{url}/gradio_api/queue/join", content=json.dumps(body), headers=headers)
            if joined.status_code != 200:
                detail = refusal_text(joined)
                kind = "refused" if joined.status_code in (413, 422, 429, 503) and named(detail, ()) else "unnamed"
                return Outcome(kind, time.perf_counter() - t0, detail=f"{joined.status_code} {detail}")
            started = None
            with http.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_starts":
                        started = time.perf_counter()
                    if msg.get("msg") == "process_completed":
                        queued = (started or time.perf_counter()) - t0
                        if msg.get("success"):
                            return Outcome("served", time.perf_counter() - t0, queued)
                        error = str((msg.get("output") or {}).get("error") or "")
                        kind = "refused" if named(error, endpoint.parameters) else "unnamed"
                        return Outcome(kind, time.perf_counter() - t0, queued, error[:300])
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


def default_requests(url: str, make: Callable[[dict], dict] | None = None) -> dict[str, dict]:
    """Good values of every named endpoint: the page's defaults, small (batch 1, few AR steps)."""
    config = httpx.get(f"{url}/config", timeout=30).json()
    eps = endpoints(url)
    by_id = {c["id"]: c.get("props", {}) for c in config["components"]}
    out = {}
    for name, ep in eps.items():
        dep = config["dependencies"][ep.fn_index]
        values = {p: by_id.get(i, {}).get("value") for p, i in zip(ep.parameters, dep["inputs"], strict=False)}
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
    args = p.parse_args(argv)
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
