"""Each served pair's rates (:mod:`demo.estimate`) on this server: timed once, the first time they are asked
for, and shared by every request; a request on a pair being timed waits for its timing, hearing how long it
should still take; and what a request's runs should take by them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from csd.serving.pairs import ModelPair, PairStore
from demo.estimate import CALIBRATION_SECONDS, Rates, head_calls, words
from demo.requests import Request

WAIT_SECONDS = 0.5  # how often a request waiting for its pair's timing hears how long it should still wait


class PairTimings:
    """The rates of the pairs of ``store``, each timed by ``measure`` (a GPU call at the pair's default setting)
    once. Known rates are read without any lock; one lock per pair is held while that pair is timed, so a
    request never waits for another pair's timing (for its own pair's, it waits: :meth:`await_rates`)."""

    def __init__(self, store: PairStore, measure: Callable[[ModelPair], Rates]) -> None:
        self.store, self.measure = store, measure
        self.known: dict[str, Rates] = {}  # per pair, measured the first time it is served
        self.locks: dict[str, threading.Lock] = {}  # per pair, held while it is timed
        self._since: dict[str, float] = {}  # per pair, when its timing started (time.monotonic)
        self._took: dict[str, float] = {}  # per pair, the seconds its timing took
        self._locks_lock = threading.Lock()  # held only to make a pair's lock

    def timed(self, pair_name: str) -> bool:
        """Whether the pair's rates are measured already (an estimate needs no calibration run)."""
        return pair_name in self.known

    def timing(self, pair_name: str) -> bool:
        """Whether the pair is being timed right now (its rates are not in yet)."""
        lock = self.locks.get(pair_name)
        return lock is not None and lock.locked() and pair_name not in self.known

    def _lock(self, pair_name: str) -> threading.Lock:
        with self._locks_lock:
            return self.locks.setdefault(pair_name, threading.Lock())

    def rates(self, pair: ModelPair) -> Rates:
        """The pair's rates, timed the first time they are asked for (the server asks for every pair's once it
        serves) and kept here. Known rates are read at once, whatever pair is being timed; a pair is timed once
        however many ask: the others wait for it (a visitor's request through :meth:`await_rates`, which says
        so)."""
        known = self.known.get(pair.name)
        if known is not None:
            return known
        with self._lock(pair.name):
            if pair.name not in self.known:
                t0 = self._since[pair.name] = time.monotonic()
                self.known[pair.name] = self.measure(pair)
                self._took[pair.name] = time.monotonic() - t0
            return self.known[pair.name]

    def timing_left(self, pair_name: str) -> float:
        """Seconds the pair's timing under way should still take: the longest timing of a pair on this server
        so far (each pair is timed at its own default), else :data:`~demo.estimate.CALIBRATION_SECONDS`,
        less the time it has run (at least 1 s)."""
        expected = max(self._took.values(), default=CALIBRATION_SECONDS)
        since = self._since.get(pair_name, time.monotonic())
        return max(1.0, expected - (time.monotonic() - since))

    def await_rates(
        self, pair_name: str, progress=None, check: Callable[[], object] | None = None, poll: float = WAIT_SECONDS
    ) -> Iterator[str]:
        """Wait for the pair's rates, in the handler of a visitor's request: a status line (:func:`waiting_line`,
        also to ``progress``) every ``poll`` seconds while the pair is being timed (as the server starts); a pair
        nobody is timing is timed here (a line says so first). ``check``: the request's checks that need no
        rates (its validator's), run first, so that a value out of range is refused before any wait. Returns at
        once when the rates are known, or when ``pair_name`` is not a served pair (the request's check refuses it)."""
        if not isinstance(pair_name, str) or pair_name not in self.store.names or pair_name in self.known:
            return
        if check is not None:
            self.store.get(pair_name)  # loaded (as the request's own check would): the validator's check is whole
            check()
        while pair_name not in self.known:
            lock = self._lock(pair_name)
            if lock.acquire(timeout=poll):  # nobody is timing it (or its timing has just ended)
                lock.release()
                if pair_name not in self.known:
                    line = f"Timing the {pair_name} pair (its first use on this server) ..."
                    if progress is not None:
                        progress(None, desc=line)
                    yield line
                    self.rates(self.store.get(pair_name))  # waits for a timing that started meanwhile
                return
            line = waiting_line(pair_name, self.timing_left(pair_name))
            if progress is not None:
                progress(None, desc=line)
            yield line

    def estimate_runs(self, r: Request, planned: list[tuple], images: int | None = None, measure: bool = True) -> float:
        """Seconds runs at settings of their own should take: (sampling, csd) or (sampling, csd, kind), csd
        None for target-only (an analysis's sweeps, a frontier's points), each over ``images`` images (default:
        the request's batch). ``measure=False`` (a validator) never waits: 0 while the pair's rates are not in,
        being timed or not; ``measure=True`` (a handler, after :meth:`await_rates`) waits for them."""
        if not measure and r.pair.name not in self.known:
            return 0.0
        rates, images = self.rates(r.pair), images or len(r.seeds)
        seconds = 0.0
        for sampling, csd, *kind in planned:
            kind = kind[0] if kind else "target" if csd is None else "csd"
            calls = head_calls(r.pair, sampling)
            seconds += rates.seconds(sampling, images, {kind: 1}, csd, calls)
        return seconds


def waiting_line(pair_name: str, seconds_left: float) -> str:
    """What a request on a pair being timed shows while it waits for the timing, in the queue."""
    return f"Waiting for the {pair_name} pair's timing as the server starts ({words(seconds_left)}) ..."
