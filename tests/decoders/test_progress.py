"""Per-AR-step progress callbacks of the samplers, and stopping a run between two steps (csd.serving.jobs).
A run with a callback and one without are compared in float64, the exact reference (tests/helpers.py)."""

import threading

import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.core.schedule import step_sizes
from csd.sampling import generate
from csd.serving.jobs import Job, Step, Stopped
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, random_pair64, sampling64

SAMPLING = SamplingConfig(num_steps=8, cfg_scale=2.0)
SAMPLING64 = sampling64(num_steps=8, cfg_scale=2.0)
CSD = CSDConfig(gamma=3, prefill=0.15)


@pytest.fixture(scope="module")
def pair(random_models):
    return random_models


def _recorder():
    calls = []
    return calls, lambda done, total, phase: calls.append((done, total, phase))


@pytest.mark.kernels
@pytest.mark.parametrize(("maker", "phase"), [(Maker.TARGET, "target"), (Maker.DRAFT, "draft")])
def test_generate_reports_every_ar_step_and_the_callback_changes_nothing(maker, phase):
    calls, on_step = _recorder()
    pair, sampling = random_pair64(), SAMPLING64
    model = pair.target if maker == Maker.TARGET else pair.draft
    with_cb = generate(model, [1, 2], [5, 6], sampling, maker=maker, on_step=on_step)
    assert calls == [(s, 8, phase) for s in range(1, 9)]
    assert_same64(with_cb.tokens, generate(model, [1, 2], [5, 6], sampling, maker=maker).tokens)


@pytest.mark.kernels
def test_speculative_generate_reports_prefill_draft_and_verify_steps():
    calls, on_step = _recorder()
    pair, sampling = random_pair64(), SAMPLING64
    spec = speculative_generate(pair.target, pair.draft, [1, 2], [5, 6], sampling, CSD, on_step=on_step)
    # MAR's cosine schedule makes [2, 3, 6, 8, 10, 11, 12, 12] tokens per step: pre-fill takes steps
    # 1-3 (11 >= 0.15 * 64 tokens), then blocks of 3 and 2 steps.
    assert step_sizes(64, 8) == [2, 3, 6, 8, 10, 11, 12, 12]
    assert calls == [
        (1, 8, "pre-fill"),
        (2, 8, "pre-fill"),
        (3, 8, "pre-fill"),
        (4, 8, "draft"),
        (5, 8, "draft"),
        (6, 8, "draft"),
        (6, 8, "verify"),
        (7, 8, "draft"),
        (8, 8, "draft"),
        (8, 8, "verify"),
    ]
    assert spec.trace.target_passes == 3 + 2 and spec.trace.draft_passes == 5
    plain = speculative_generate(pair.target, pair.draft, [1, 2], [5, 6], sampling, CSD)
    assert_same64(spec.tokens, plain.tokens)
    assert (spec.trace.maker == plain.trace.maker).all()


def test_a_raising_callback_stops_the_sampler_at_that_step(pair):
    seen = []

    def on_step(done, total, phase):
        seen.append(done)
        if len(seen) == 4:
            raise Stopped("enough")

    with pytest.raises(Stopped, match="enough"):
        speculative_generate(pair.target, pair.draft, [0], [0], SAMPLING, CSD, on_step=on_step)
    assert seen == [1, 2, 3, 4]


def test_job_yields_steps_and_posts_in_order_and_keeps_the_result(pair):
    def work(job):
        a = generate(pair.target, [0], [0], SAMPLING, on_step=job.on_step("first"))
        job.post("between")
        generate(pair.draft, [0], [0], SamplingConfig(num_steps=2), on_step=job.on_step("second"))
        return a.tokens.shape

    job = Job(work)
    events = list(job)
    assert events[:8] == [Step("first", s, 8, "target") for s in range(1, 9)]
    assert events[8] == "between"
    assert events[9:] == [Step("second", 1, 2, "target"), Step("second", 2, 2, "target")]
    assert job.result == (1, 64, 48) and job.steps == 10 and not job.running
    assert events[0].text == "first: AR step 1/8 (target)"


def test_job_stop_ends_the_worker_within_one_ar_step(pair):
    release = threading.Event()

    def slow_step(done, total, phase):  # the worker waits here until the test has asked for a stop
        release.wait(5)

    def work(job):
        callback = job.on_step("run")
        return generate(pair.target, [0], [0], SAMPLING, on_step=lambda *a: (callback(*a), slow_step(*a)))

    job = Job(work)
    events = iter(job)
    assert next(events) == Step("run", 1, 8, "target")
    stopper = threading.Thread(target=job.stop)
    stopper.start()
    release.set()
    stopper.join(5)
    assert not stopper.is_alive() and not job.running
    assert job.steps == 1 and job.result is None  # stopped at the next callback: step 2 was not reported


def test_job_time_limit_raises_a_named_stop(pair):
    def work(job):
        for _ in range(1000):
            generate(pair.draft, [0], [0], SamplingConfig(num_steps=2), on_step=job.on_step("loop"))

    job = Job(work, time_limit=0.05)
    with pytest.raises(Stopped, match="time limit of 0.05 s") as err:
        for _ in job:
            pass
    assert err.value.over_time and not job.running


def test_job_reraises_the_work_error_and_refuses_a_bad_limit():
    def work(job):
        raise ValueError("gamma must be an int >= 1")

    with pytest.raises(ValueError, match="gamma"):
        list(Job(work))
    with pytest.raises(ValueError, match="time_limit"):
        Job(work, time_limit=0)
