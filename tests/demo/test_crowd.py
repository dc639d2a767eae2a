"""A crowd at once: 24 clients submit /generate together to a server on this machine, on the untrained pair (cheap),
from a process of their own, as a crowd's browsers are (in the server's, their threads took its interpreter from the
runs: each turn about 0.1 s longer than the line had learned, predicted waits 0.36-0.77 of the measured at load
average 5-6 on the 2 cores). Each request is served, or refused by name; none is lost and none hangs; each served
result equals that request's result alone (same seed, same images); every client that waited saw its place and
predicted wait before its result, and the first predicted waits of the back half of the line are within a factor 2
of the measured ones. The line learns what a turn takes beyond its estimate from a burst of 8 first: after 3
visitors one at a time it had learned 0.08-0.25 s, while a turn in the burst took 0.25-0.3 s beyond (a status line
to each waiting client) and its first turns 1-1.7 s (24 joins at once), and the back half's predictions were
0.49-0.61 of the measured in two runs at load 3.5-4.6; after the burst of 8, 0.57-0.86 in three runs at load 4-4.7
with other tests on the other core, 0.72-1.12 with the CPU its own (marked ``alone``: tests/cpu_lock.py; the waits
of the last run are in tests/.times/crowd.json; the measured burst has no page load beside it, since a load
delayed every waiting request by 3-4.5 s). While a second burst is in line the server answers a page load (in
Chromium), whose visitor's Generate waits in line with its place and wait on its status line, then runs; and a
request that would make the line longer than its limit is refused at once, in words that give the line's length."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("gradio_client")

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import App
from demo.limits import Limits
from demo.soak import SEED_STEP, Outcome, call, endpoints
from demo.tabs.generate import compare
from tests.demo.browser import chromium, open_page, require_browser

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.alone, pytest.mark.usefixtures("shared_rates")]
CLIENTS = 24
WARM_UP = 8  # clients of the earlier burst (the line learns from its latest 8 turns)
SETTING = {"batch_size": 2, "ar_steps": 16, "gamma": 4}  # runs of 0.2-0.3 s here, a turn of 0.5-0.7 s in a burst
UNTOLD = 5.0  # seconds a client may wait (its request's start) without being told its place
# The predicted waits compared: those told at a place in the back half of the line (12 turns or more ahead of
# them). The page's load in Chromium, on the same 2 cores, delays every request waiting then by 3-4.5 s at load
# average 5-7, which the line cannot foresee: a wait of 6.8 s near the front was told 3 s.
BACK_HALF = CLIENTS // 2
IMAGES = {0: "target", 1: "csd", 2: "map", 3: "draft"}  # /generate's image outputs, by position
ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / ".times" / "crowd.json"  # the back half's predicted and measured waits of the last run
HANG_S = 300  # a burst not over by then hangs (a guard, not a timing)
PAGE_MS = 60_000  # the page's visitor is told its place by then, or never (a guard, not a timing)


def png(url: str) -> np.ndarray:
    with Image.open(io.BytesIO(httpx.get(url, timeout=60).content)) as image:
        return np.asarray(image.convert("RGB"))


# The clients run in a process of their own, as a crowd's browsers do: not in the server's (its GIL, its CPU time).
CLIENTS_APART = """
import dataclasses, json, sys
from demo.soak import burst
url, clients, values = json.loads(sys.argv[1])
print(json.dumps([dataclasses.asdict(o) for o in burst(url, clients, values)]))
"""


def burst_apart(url: str, clients: int, values: dict) -> list[Outcome]:
    """:func:`demo.soak.burst` run in a process of its own; its outcomes."""
    run = subprocess.run(
        [sys.executable, "-c", CLIENTS_APART, json.dumps([url, clients, values])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [Outcome(**o) for o in json.loads(run.stdout)]


@pytest.fixture(scope="module")
def served():
    require_browser()
    limits = Limits(max_batch=2, max_steps=64, max_images=2, max_seconds=600.0)  # the line's limit: 300 s
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits)
    application.idle_work()  # the pair timed, as the server does while its line is empty
    demo = server.build(application)
    url = server.serve(demo, limits, "127.0.0.1", None, block=False).rstrip("/")
    yield application, url
    demo.close()


def test_a_burst_waits_in_line_each_visitor_told_its_place_and_wait_and_past_the_limit_is_refused(served):
    burst_in_line(*served)


def burst_in_line(application, url):
    values = application.default_controls() | SETTING
    generate = endpoints(url)["/generate"]
    # Earlier visitors, a few at once: the line learns what a busy turn takes beyond its estimate.
    assert [o.kind for o in burst_apart(url, WARM_UP, values | {"seed": 10_000})] == ["served"] * WARM_UP
    # The measured burst: nothing else joins it (a page's load in Chromium delayed every waiting request by 3-4.5 s,
    # which the line cannot foresee and which is most of a short wait).
    outcomes = burst_apart(url, CLIENTS, values)
    assert len(outcomes) == CLIENTS and all(o is not None for o in outcomes)  # none lost
    assert [o.kind for o in outcomes] == ["served"] * CLIENTS, [o.detail for o in outcomes if o.kind != "served"]
    waits = []
    for k, o in enumerate(outcomes):
        alone = list(compare(application, lambda *a, **kw: None, **(values | {"seed": values["seed"] + SEED_STEP * k})))
        for position, key in IMAGES.items():  # the same images as the request alone
            np.testing.assert_array_equal(png(o.output[position]["url"]), alone[-1].images[key])
        assert o.places or o.queued - o.joined < UNTOLD, f"client {k} waited without being told its place"
        if o.places and o.places[0][1] >= BACK_HALF:
            told_at, _, predicted = o.places[0]
            waits.append((predicted, o.queued - told_at))
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps({"load": os.getloadavg(), "waits": waits, "overhead": application.line.overhead}))
    assert len(waits) >= CLIENTS // 4, waits  # the burst was in line at once
    assert all(0.5 <= predicted / measured <= 2.0 for predicted, measured in waits), waits
    # A second burst, and a visitor's page load while it is in line.
    chromium()  # launched before the burst: what the test measures is the page's load, not the browser's start
    second: list = []
    crowd = threading.Thread(
        target=lambda: second.extend(burst_apart(url, CLIENTS, values | {"seed": 20_000})), daemon=True
    )
    crowd.start()
    while len(application.line.waiting) < CLIENTS // 2 and crowd.is_alive():
        time.sleep(0.01)
    with open_page(url) as page:  # a visitor arrives while the burst is in line
        page.wait_for_function("() => document.querySelector('#estimate')?.innerText.includes('Expected')")
        assert application.line.waiting, "the page loaded only after the line had emptied"
        page.get_by_role("button", name="Generate", exact=True).click()
        status = page.locator("#gen-status")
        status.get_by_text(" in line: ", exact=False).wait_for(state="visible", timeout=PAGE_MS)
        assert re.search(r"Place \d+ of \d+ in line: about \d+ s to wait", status.inner_text()), status.inner_text()
        application.line.max_wait = application.line.length()  # the line is as long as it may be
        too_long = call(url, generate, values)  # refused at once, naming the line's length
        status.get_by_text("Speedup", exact=False).wait_for(state="visible", timeout=HANG_S * 1000)  # its turn came
    crowd.join(HANG_S)
    assert not crowd.is_alive(), "the burst hung"
    assert [o.kind for o in second] == ["served"] * CLIENTS, [o.detail for o in second if o.kind != "served"]
    assert too_long.kind == "refused" and too_long.seconds < 5, too_long
    assert re.match(r"This request would be about \d+ s in line here \(about \d+ s to wait", too_long.detail), too_long
    assert too_long.detail.endswith("(--max-wait): try again later, or fewer images (Images)"), too_long
