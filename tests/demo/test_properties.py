"""Property-based: whatever a client sends as any parameter of any named endpoint, the answer is a result
or a refusal that names what was wrong (never Gradio's generic "Error", a 500 or a dropped connection),
before any model runs for a refused request, and the server still serves a good request afterwards.

Requests go over plain HTTP (the queue protocol, as demo.soak speaks it), each in a new session.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import App
from demo.limits import Limits
from demo.soak import call, default_requests, endpoints

pytestmark = pytest.mark.usefixtures("shared_rates")  # each pair timed once per session (tests/demo/conftest.py)
LIMITS = Limits(max_batch=2, max_steps=8, max_images=2, max_analysis_steps=16)
ANY_VALUE = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=60),
    st.lists(st.integers(0, 9), max_size=3),
    st.just("x" * 3000),
)


@pytest.fixture(scope="module")
def live():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    demo = server.build(application)
    url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False).rstrip("/")
    good = default_requests(url)
    for values in good.values():
        values.update({k: v for k, v in {"ar_steps": 8, "gamma": 4}.items() if k in values})
    yield application, url, endpoints(url), good
    demo.close()


def _mutated(draw, good: dict) -> dict:
    values = dict(good)
    for name in draw(st.lists(st.sampled_from(sorted(good)), min_size=1, max_size=2, unique=True)):
        values[name] = draw(ANY_VALUE)
    return values


@pytest.mark.parametrize(
    "endpoint,examples", [("/generate", 25), ("/inspect", 20), ("/toy", 25), ("/analyze", 12), ("/frontier", 12)]
)
def test_every_value_of_every_parameter_gets_a_result_or_a_named_refusal(live, endpoint, examples):
    application, url, eps, good = live
    before = len(application.history)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def check(data):
        values = _mutated(data.draw, good[endpoint])
        outcome = call(url, eps[endpoint], values, timeout=120)
        assert outcome.kind in ("served", "refused"), (values, outcome.detail)

    check()
    # Model runs happened only for requests that were served or stopped by the time limit, never refused ones.
    runs = list(application.history)[before:]
    assert all(r["status"] in ("done", "over time") for r in runs), runs
    assert call(url, eps[endpoint], good[endpoint]).kind == "served"  # still answering
