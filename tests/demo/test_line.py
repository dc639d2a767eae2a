"""The line of model runs (demo.line): requests run in the order they came, each told its place and predicted wait
as the line moves; a request is refused at once when the line would grow past its limit in seconds (or past the
safety cap in count); the server's own work runs only while the line is empty and gives way to any request."""

from __future__ import annotations

import threading

import gradio as gr
import pytest
import torch

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import App
from demo.limits import from_args as limits_from
from demo.line import Line, Where


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_requests_start_in_the_order_they_came_each_told_its_place_and_wait():
    clock = Clock()
    line = Line(slots=1, max_wait=100.0, most=10, clock=clock)
    first, second, third = (line.join(s, "fewer images") for s in (10.0, 4.0, 6.0))
    assert first.started == 0.0 and second.started is None and third.started is None
    assert line.where(first) is None  # running: no place
    assert line.where(second) == Where(1, 2, 10.0) and line.where(third) == Where(2, 2, 14.0)
    clock.now = 3.0
    assert line.where(third) == Where(2, 2, 11.0)  # the running request's time left, then the second's
    line.leave(first, done=True)
    assert second.started == 3.0 and line.where(third) == Where(1, 1, 4.0)
    assert line.where(third).text() == "Place 1 of 1 in line: about 4 s to wait ..."


def test_a_request_past_the_lines_limit_in_seconds_is_refused_at_once_naming_its_length():
    line = Line(slots=1, max_wait=300.0, most=100, clock=Clock())
    for _ in range(5):
        line.join(50.0, "fewer images")  # 250 s of work
    with pytest.raises(gr.Error) as refused:
        line.join(60.0, "fewer images (Images)")
    assert refused.value.message == (
        "This request would be about 5.2 min in line here (about 4.2 min to wait, then its own run), more than the "
        "300 s the line may hold on this server (--max-wait): try again later, or fewer images (Images)"
    )
    assert line.join(50.0, "fewer images") is not None  # one that fits is let in: the bound is the length


def test_the_lines_limit_is_set_per_deployment_by_its_variable_and_its_flag(monkeypatch):
    """``CSD_MAX_WAIT`` (a Space's variable) sets the limit of the app's line; ``--max-wait`` wins; 300 s without."""
    assert App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits_from(server.parse_args([]))).line.max_wait == 300
    monkeypatch.setenv("CSD_MAX_WAIT", "120")
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits_from(server.parse_args([])))
    assert application.line.max_wait == 120.0
    assert limits_from(server.parse_args(["--max-wait", "45"])).max_wait == 45.0
    with pytest.raises(SystemExit):
        server.parse_args(["--max-wait", "0"])
    monkeypatch.setenv("CSD_MAX_WAIT", "5 min")
    with pytest.raises(SystemExit, match="CSD_MAX_WAIT must be a number"):
        server.parse_args([])


def test_the_count_is_a_safety_cap_beside_the_length():
    line = Line(slots=1, max_wait=1e6, most=3, clock=Clock())
    for _ in range(3):
        line.join(0.1, "fewer images")
    with pytest.raises(gr.Error, match=r"The line is full: 3 requests are waiting or running, at most 3 on this "):
        line.join(0.1, "fewer images")


def test_two_slots_run_two_requests_and_share_the_wait():
    clock = Clock()
    line = Line(slots=2, max_wait=100.0, most=10, clock=clock)
    a, b, c = (line.join(8.0, "fewer images") for _ in range(3))
    assert a.started == b.started == 0.0 and line.where(c) == Where(1, 1, 8.0)  # (8 + 8) / 2


def test_what_a_turn_took_beyond_its_estimate_is_learned_into_the_waits():
    clock = Clock()
    line = Line(slots=1, max_wait=100.0, most=10, clock=clock)
    first = line.join(1.0, "fewer images")
    clock.now = 3.0  # took 2 s more than its estimate
    line.leave(first, done=True)
    assert line.overhead == pytest.approx(2.0)
    line.join(1.0, "fewer images")
    waiting = line.join(1.0, "fewer images")
    assert line.where(waiting).wait == pytest.approx(3.0)
    stopped = line.join(1.0, "fewer images")
    line.leave(stopped)  # gave up or stopped: nothing learned
    assert line.overhead == pytest.approx(2.0)
    for _ in range(8):  # the mean of the latest eight turns: the first is forgotten
        clock.now += 1.0
        line.leave(line.running[0], done=True)
        line.join(1.0, "fewer images")
    assert line.overhead == pytest.approx(0.0)


def test_a_waiting_request_hears_its_place_every_poll_and_its_turn_at_once():
    line = Line(slots=1, max_wait=100.0, most=10)
    running = line.join(5.0, "fewer images")
    ahead, waiting = line.join(5.0, "fewer images"), line.join(5.0, "fewer images")
    heard: list[Where] = []
    follower = threading.Thread(target=lambda: heard.extend(line.turn(waiting, poll=0.2)))
    follower.start()
    while len(heard) < 2:  # told as it joined, then again a poll later
        pass
    line.leave(running, done=True)
    while heard[-1].place != 1:  # the line moved: the next poll tells it
        pass
    slow = threading.Thread(target=lambda: heard.extend(line.turn(waiting, poll=30.0)))
    slow.start()
    while len(heard) < 4:
        pass
    line.leave(ahead, done=True)  # its turn: heard at once, not after the 30 s poll
    slow.join(5)
    follower.join(5)
    assert not slow.is_alive() and waiting.started is not None
    assert [w.place for w in heard[:2]] == [2, 2] and heard[-1].place == 1


def test_the_servers_own_work_waits_for_an_empty_line_and_gives_way_to_the_first_request():
    line = Line(slots=1, max_wait=100.0, most=10)
    busy = line.join(1.0, "fewer images")
    gave_way, started = threading.Event(), threading.Event()

    def work(give_up):
        started.set()
        while not give_up():
            pass
        gave_way.set()
        return "given up"

    results = []
    worker = threading.Thread(target=lambda: results.append(line.idle(work)))
    worker.start()
    assert not started.wait(0.2)  # a request runs: the work waits
    line.leave(busy, done=True)
    assert started.wait(5)
    visitor = line.join(1.0, "fewer images")
    assert visitor.started is None  # the work holds the slot until it notices
    worker.join(5)
    assert gave_way.is_set() and results == ["given up"] and visitor.started is not None
    assert line.where(line.join(2.0, "fewer images")).wait == pytest.approx(1.0, abs=0.1)  # the work counted none


def test_a_request_whose_client_stops_listening_while_it_waits_leaves_the_line():
    """Its place is given up within a poll of the client's stream closing (demo.guard counts the streams), so it
    neither runs for nobody nor counts in the waits of those behind it."""
    from types import SimpleNamespace

    import torch

    from csd.serving.pairs import RANDOM_SOURCE, PairStore
    from demo.application import App
    from demo.estimate import Rates
    from demo.limits import Limits

    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_steps=8))
    application.timings.known[RANDOM_SOURCE.name] = Rates(dict.fromkeys(("target", "draft", "csd"), 0.01), {})
    running = application.line.join(60.0, "fewer images")  # someone else's run, ahead of it
    application.streams["visitor"] = 1
    turn = application.turn(SimpleNamespace(session_hash="visitor"), RANDOM_SOURCE.name, None, lambda: 1.0, "")
    told, outcome = [], []

    def wait() -> None:
        try:
            with turn:
                told.extend(turn)
        except gr.Error as err:
            outcome.append(err.message)

    waiter = threading.Thread(target=wait)
    waiter.start()
    while not told:
        pass
    assert told == ["Place 1 of 1 in line: about 60 s to wait ..."] and len(application.line.waiting) == 1
    del application.streams["visitor"]  # its client closed the stream
    waiter.join(5)
    assert outcome == ["the client that asked for this run stopped listening for its result: not run"]
    assert application.line.waiting == [] and application.line.running == [running] and application.gone == 1
