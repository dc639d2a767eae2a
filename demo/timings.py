"""Each served pair's rates (:mod:`demo.estimate`) on this server, and what a request's runs should take by them.

A pair's rates are, first found: measured on this server (the pair timed once, by the server while its line is
empty, :meth:`demo.line.Line.idle`, or in the turn of the first request on it); else the reference machine's,
committed with the app (:mod:`demo.reference`), times the pair's probe here over its probe there (1 until the
probe is in: the server probes each such pair while its line is empty). What each request's runs took then
refines its pair's estimates (:meth:`PairTimings.observe`), so the estimates follow the machine as it serves (a
busy CPU, a GPU the reference was not timed on)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from csd.serving.pairs import ModelPair, PairStore
from demo.estimate import CALIBRATION_SECONDS, Rates, head_calls, words
from demo.reference import Reference
from demo.requests import Request

WAIT_SECONDS = 0.5  # how often a request waiting for its pair's timing hears how long it should still wait
LEARN = 0.5  # the weight of a request's runs in its pair's factor (a geometric mean)
FACTOR_RANGE = (0.25, 4.0)  # a factor, and what one request moves it by, stay within these
GiveUp = Callable[[], bool]  # true once the work should stop (a request joined the line)


class PairTimings:
    """The rates of the pairs of ``store``: each pair's measured by ``measure`` (a GPU call at the pair's default
    setting, which returns None when ``give_up`` stopped it) at most once, else ``reference``'s scaled by
    its :attr:`scale`. Known rates are read without any lock; one lock per pair is held while that pair is timed."""

    def __init__(
        self,
        store: PairStore,
        measure: Callable[[ModelPair, GiveUp | None], Rates | None],
        reference: Reference | None = None,
    ) -> None:
        self.store, self.measure, self.reference = store, measure, reference
        self.known: dict[str, Rates] = {}  # per pair, measured on this server
        self.scale: dict[str, float] = {}  # per committed pair, its probe here over its probe there
        self.factor: dict[str, float] = {}  # per pair, what its requests' runs took over their estimates
        self.locks: dict[str, threading.Lock] = {}  # per pair, held while it is timed
        self._since: dict[str, float] = {}  # per pair, when its timing started (time.monotonic)
        self._took: dict[str, float] = {}  # per pair, the seconds its timing took
        self._locks_lock = threading.Lock()  # held only to make a pair's lock

    def committed(self, pair_name: str) -> bool:
        """Whether the pair's rates come from the reference machine (not measured here)."""
        return pair_name not in self.known and self.reference is not None and pair_name in self.reference.rates

    def timed(self, pair_name: str) -> bool:
        """Whether the pair has rates without running anything: measured here, or committed."""
        return pair_name in self.known or self.committed(pair_name)

    def timing(self, pair_name: str) -> bool:
        """Whether the pair is being timed right now (its rates are not in yet)."""
        lock = self.locks.get(pair_name)
        return lock is not None and lock.locked() and not self.timed(pair_name)

    def missing(self) -> list[str]:
        """The served pairs without rates, in the store's order."""
        return [name for name in self.store.names if not self.timed(name)]

    def unprobed(self) -> list[str]:
        """The served pairs whose rates are committed and not scaled to this machine yet, in the store's order."""
        return [name for name in self.store.names if self.committed(name) and name not in self.scale]

    def _lock(self, pair_name: str) -> threading.Lock:
        with self._locks_lock:
            return self.locks.setdefault(pair_name, threading.Lock())

    def rates(self, pair: ModelPair, give_up: GiveUp | None = None) -> Rates | None:
        """The pair's rates: measured here, else committed (scaled to this machine), else timed now and kept (a
        pair is timed once however many ask: the others wait for it). None only when ``give_up`` stopped the
        timing."""
        known = self.known.get(pair.name)
        if known is not None:
            return known
        if self.committed(pair.name):
            return self.reference.rates[pair.name].scaled(self.scale.get(pair.name, 1.0))
        with self._lock(pair.name):
            if pair.name not in self.known:
                t0 = self._since[pair.name] = time.monotonic()
                rates = self.measure(pair, give_up)
                if rates is None:
                    return None
                self.known[pair.name] = rates
                self._took[pair.name] = time.monotonic() - t0
            return self.known[pair.name]

    def observe(self, pair_name: str, estimate: float, seconds: float) -> None:
        """A request's runs on the pair were estimated at ``estimate`` seconds and took ``seconds``: the pair's
        later estimates move towards what its runs take (halfway, on a log scale, within :data:`FACTOR_RANGE`)."""
        if not (estimate > 0 and seconds > 0):
            return
        low, high = FACTOR_RANGE
        ratio = min(high, max(low, seconds / estimate))
        factor = self.factor.get(pair_name, 1.0) * ratio**LEARN
        self.factor[pair_name] = min(high, max(low, factor))

    def timing_left(self, pair_name: str) -> float:
        """Seconds the pair's timing should still take: the longest timing of a pair on this server so far
        (each pair is timed at its own default), else :data:`~demo.estimate.CALIBRATION_SECONDS`, less the time
        it has run (at least 1 s)."""
        expected = max(self._took.values(), default=CALIBRATION_SECONDS)
        since = self._since.get(pair_name, time.monotonic()) if self.timing(pair_name) else time.monotonic()
        return max(1.0, expected - (time.monotonic() - since))

    def await_rates(self, pair_name: str, progress=None, poll: float = WAIT_SECONDS) -> Iterator[str]:
        """Status lines while the pair's rates are not in, in the turn of a request on it: the pair is timed here
        (a line says so first), or, while another request's turn times it, waited for (a line every ``poll``
        seconds, also to ``progress``)."""
        while not self.timed(pair_name):
            lock = self._lock(pair_name)
            if lock.acquire(timeout=poll):  # nobody is timing it (or its timing has just ended)
                lock.release()
                if not self.timed(pair_name):
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
        the request's batch). ``measure=False`` (a validator) never times the pair: 0 while it has no rates;
        ``measure=True`` times it first."""
        if not measure and not self.timed(r.pair.name):
            return 0.0
        rates, images = self.rates(r.pair), images or len(r.seeds)
        seconds = 0.0
        for sampling, csd, *kind in planned:
            kind = kind[0] if kind else "target" if csd is None else "csd"
            calls = head_calls(r.pair, sampling)
            seconds += rates.seconds(sampling, images, {kind: 1}, csd, calls)
        return seconds * self.factor.get(r.pair.name, 1.0)


def waiting_line(pair_name: str, seconds_left: float) -> str:
    """What a request on a pair being timed shows while it waits for the timing."""
    return f"Waiting for the {pair_name} pair's timing ({words(seconds_left)}) ..."
