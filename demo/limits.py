"""What one request may ask for, declared once: each limit's default, flag, environment variable and help
make the server's command line (:func:`add_flags`) and the :class:`Limits` the app enforces."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields

from demo.gpu import ZERO_GPU_SECONDS


def _limit(default, env: str | None, help: str):
    return field(default=default, metadata={"env": env, "help": help})


@dataclass(frozen=True)
class Limits:
    """Serving limits: what one request may ask for."""

    max_batch: int = _limit(8, "CSD_MAX_BATCH", "images of one Generate run")
    max_steps: int = _limit(64, "CSD_MAX_STEPS", "AR steps of one run")
    max_images: int = _limit(8, "CSD_MAX_IMAGES", "images of one analysis recompute")
    concurrency: int = _limit(1, None, "model runs at once; the other requests wait in line, each told its place")
    # The line is bounded by its predicted length (a CPU Space: 5 min); the count is a safety cap on what the
    # waiting requests hold (a thread and an event each), past what the length lets in at the defaults.
    max_wait: float = _limit(
        300.0,
        "CSD_MAX_WAIT",
        "seconds of predicted work the line of model runs may hold (the running requests' time left, the waiting "
        "ones' and a new one's own): a request past it is refused at once, naming the line's length",
    )
    queue_size: int = _limit(64, "CSD_QUEUE_SIZE", "requests waiting or running at most (a safety cap; see --max-wait)")
    # Images x AR steps of one analysis recompute (about 40 runs): 256 took 60-64 s on 2 CPU cores.
    max_analysis_steps: int = _limit(256, "CSD_MAX_ANALYSIS_STEPS", "images x AR steps of one analysis recompute")
    max_seconds: float = _limit(
        75.0, "CSD_MAX_SECONDS", "a run still going after this many seconds stops at its next AR step, with an error"
    )
    # Estimates err by up to a quarter: 36 s keeps the default analysis within 45 s on the slowest CPU served.
    default_seconds: float = _limit(
        36.0,
        "CSD_DEFAULT_SECONDS",
        "the page's analysis and frontier recomputes start at the most images (n) estimated to take at most this",
    )
    gpu_seconds: float = _limit(
        ZERO_GPU_SECONDS,
        "CSD_GPU_SECONDS",
        "on ZeroGPU, the most GPU time one request's call may ask for (its estimate with a margin); a request "
        "estimated past it is refused before it queues",
    )
    per_session: int = _limit(2, None, "requests one visitor may have waiting or running")
    sessions: int = _limit(64, "CSD_SESSIONS", "visitor sessions whose state is kept (the oldest go first)")
    session_ttl: float = _limit(900.0, None, "seconds a visitor's latest run is kept for the Inspect tab")
    max_body_kb: int = _limit(64, None, "kilobytes a request body may have")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be > 0, got {value}")


def env_setting(name: str, default, kind: type):
    """An environment setting parsed as ``kind``; a bad one stops the start, naming it."""
    value = os.environ.get(name)
    try:
        return default if value is None else kind(value)
    except ValueError:
        word = "an integer" if kind is int else "a number"
        raise SystemExit(f"{name} must be {word}, got {value!r}") from None


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per limit (its environment variable, if any, gives the default; flags win)."""
    for f in fields(Limits):
        kind, env = type(f.default), f.metadata["env"]
        default = f.default if env is None else env_setting(env, f.default, kind)
        where = f" ({env})" if env else ""
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=kind, default=default, help=f.metadata["help"] + where
        )


def from_args(args: argparse.Namespace) -> Limits:
    """The limits a parsed command line asks for; a limit <= 0 is an error naming its flag."""
    return Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
