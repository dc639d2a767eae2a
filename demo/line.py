"""The line of model runs: visitors' requests run ``slots`` at a time (``--concurrency``), in the order they
came, each told its place and its predicted wait as it joins and as the line moves. The line is
bounded by its predicted length, not by a count: a request whose line (the running requests' predicted time
left, the waiting ones' and its own) would pass ``max_wait`` seconds is refused at once, in words that give that
length. A count (``most``) remains as a safety cap on the threads and events the waiting requests hold.

The server's own work (timing its pairs) runs only while the line is empty, and gives way to the first request
that joins (:meth:`Line.idle`): a request never waits for it longer than the work takes to notice.

A request's predicted time is its estimate (:mod:`demo.estimate`) plus the line's ``overhead``: what a request's
turn took beyond its estimate (handling it, sending its result), learned from the requests that ran.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from demo.errors import refuse
from demo.estimate import words

POLL_SECONDS = 1.0  # how often a waiting request hears its place and wait (its handler tells its client less often)
LEARNED = 8  # the latest turns the overhead is learned from
T = TypeVar("T")


@dataclass(eq=False)
class Ticket:
    """One request in the line: its predicted ``seconds`` of work, when it joined and when its turn came
    (``started``, None while it waits); ``idle``: the server's own work, which gives way to any request."""

    seconds: float
    joined: float
    started: float | None = None
    idle: bool = False


@dataclass(frozen=True)
class Where:
    """A waiting request's place (1: next), how many wait in all, and its predicted wait in seconds."""

    place: int
    waiting: int
    wait: float

    def text(self) -> str:
        return f"Place {self.place} of {self.waiting} in line: {words(self.wait)} to wait ..."


class Line:
    def __init__(self, slots: int, max_wait: float, most: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots, self.max_wait, self.most, self.clock = slots, max_wait, most, clock
        self.waiting: list[Ticket] = []
        self.running: list[Ticket] = []
        self.overhead = 0.0  # seconds a turn takes beyond its estimate: the mean over the latest turns, at least 0
        self._beyond: deque[float] = deque(maxlen=LEARNED)  # what each of the latest turns took beyond its estimate
        self._cond = threading.Condition()

    # --- what the line predicts ------------------------------------------------------------------

    def _left(self, ticket: Ticket, now: float) -> float:
        """Predicted seconds ``ticket`` still holds (or will hold) a slot; the server's own work: none."""
        if ticket.idle:
            return 0.0
        seconds = ticket.seconds + self.overhead
        return seconds if ticket.started is None else max(0.0, seconds - (now - ticket.started))

    def _wait(self, ahead: list[Ticket], now: float) -> float:
        """Predicted seconds until a slot is free for the request behind ``ahead`` (waiting requests)."""
        busy = sum(self._left(t, now) for t in self.running) + sum(self._left(t, now) for t in ahead)
        return busy / self.slots

    def length(self) -> float:
        """Predicted seconds of work in the line now (what a request joining would wait)."""
        with self._cond:
            return self._wait(self.waiting, self.clock())

    def where(self, ticket: Ticket) -> Where | None:
        """The ticket's place and predicted wait, or None once its turn has come (or it left)."""
        with self._cond:
            return self._where(ticket) if ticket in self.waiting else None

    def _where(self, ticket: Ticket) -> Where:
        k = self.waiting.index(ticket)
        return Where(k + 1, len(self.waiting), self._wait(self.waiting[:k], self.clock()))

    # --- a request's way through it ----------------------------------------------------------------

    def join(self, seconds: float, advice: str) -> Ticket:
        """A request predicted to run ``seconds`` joins at the end; refused at once (``advice``: what the visitor
        may do) when the line would then hold more than ``max_wait`` seconds of work, or ``most`` requests."""
        with self._cond:
            now = self.clock()
            held = sum(1 for t in self.running if not t.idle) + len(self.waiting)
            if held >= self.most:
                raise refuse(
                    f"The line is full: {held} requests are waiting or running, at most {self.most} on this server "
                    "(--queue-size): try again later"
                )
            wait = self._wait(self.waiting, now)
            length = wait + seconds + self.overhead
            if length > self.max_wait:
                raise refuse(
                    f"This request would be {words(length)} in line here ({words(wait)} to wait, then its own run), "
                    f"more than the {self.max_wait:.0f} s the line may hold on this server (--max-wait): try again "
                    f"later, or {advice}"
                )
            ticket = Ticket(seconds, now)
            self.waiting.append(ticket)
            self._admit(now)
            return ticket

    def turn(self, ticket: Ticket, poll: float = POLL_SECONDS) -> Iterator[Where]:
        """The ticket's place and wait as it joins and then every ``poll`` seconds, until its turn (which ends it
        at once)."""
        while (where := self.where(ticket)) is not None:
            yield where
            with self._cond:
                self._cond.wait_for(lambda: ticket not in self.waiting, poll)

    def leave(self, ticket: Ticket, done: bool = False) -> None:
        """The ticket leaves (its run ended, or it gave up waiting); ``done``: its run finished, and what it took
        beyond its estimate is learned."""
        with self._cond:
            now = self.clock()
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            if ticket in self.running:
                self.running.remove(ticket)
                if done and not ticket.idle:
                    self._beyond.append((now - ticket.started) - ticket.seconds)
                    self.overhead = max(0.0, sum(self._beyond) / len(self._beyond))
            self._admit(now)

    def _admit(self, now: float) -> None:
        """Start the first waiting requests while slots are free (none while the server's own work runs: it
        gives way first); wake every waiting request (the line moved)."""
        while self.waiting and len(self.running) < self.slots and not any(t.idle for t in self.running):
            ticket = self.waiting.pop(0)
            ticket.started = now
            self.running.append(ticket)
        self._cond.notify_all()

    # --- the server's own work ----------------------------------------------------------------------

    def idle(self, work: Callable[[Callable[[], bool]], T]) -> T:
        """Run ``work(give_up)`` once the line is empty, holding every slot: ``give_up()`` is true from the
        moment a request joins, and the request starts once the work returns."""
        with self._cond:
            self._cond.wait_for(lambda: not self.waiting and not self.running)
            now = self.clock()
            ticket = Ticket(0.0, now, now, idle=True)
            self.running.append(ticket)
        try:
            return work(lambda: bool(self.waiting))
        finally:
            self.leave(ticket)
