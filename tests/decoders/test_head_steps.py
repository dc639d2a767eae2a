"""Cheaper token heads as sampler settings: a head-step schedule over the AR steps (target-only and CSD)
and a draft head with its own number of steps; each stays seeded and batch-invariant. Runs are compared in
float64, the exact reference (tests/helpers.py)."""

import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.core.schedule import head_step_schedule
from csd.sampling import generate
from csd.serving.pairs import random_pair
from csd.speculative import speculative_generate
from tests.helpers import assert_differ64, assert_same64, random_pair64, sampling64

SCHEDULED = sampling64(num_steps=8, cfg_scale=2.0, head_steps=10, head_steps_min=2)
INDEPENDENT = {"align": False, "trajectory_term": "none"}


@pytest.fixture
def recorded():
    """A fresh untrained pair, in float64, whose heads record the step counts they are asked for."""
    pair = random_pair().at_precision("float64")
    calls = {"target": [], "draft": []}
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        chain = model.head.chain

        def record(steps=None, *args, chain=chain, log=calls[name], **kwargs):
            log.append(steps)
            return chain(steps, *args, **kwargs)

        model.head.chain = record
    return pair, calls


def test_the_schedule_is_linear_from_the_first_to_the_last_ar_step():
    assert head_step_schedule(25, None, 4) == [25, 25, 25, 25]
    assert head_step_schedule(25, 5, 5) == [25, 20, 15, 10, 5]
    assert head_step_schedule(10, 2, 8) == [10, 9, 8, 7, 5, 4, 3, 2]
    assert head_step_schedule(10, 2, 1) == [10]


def test_disas_schedules_are_its_published_formulas():
    """DiSA (Qinyu-Allen-Zhao/DiSA diffloss): with K AR steps, step s, upper U and lower L, linear
    L + floor((U - L)(K - 1 - s) / (K - 1)) and cosine L + floor((U - L)(cos(pi s / (K - 1)) + 1) / 2)."""
    linear = head_step_schedule(50, 5, 64, "disa")
    assert linear[:6] == [50, 49, 48, 47, 47, 46] and linear[-2:] == [5, 5] and len(linear) == 64
    assert linear == [5 + (45 * (63 - s)) // 63 for s in range(64)]
    assert sum(linear) == 1733  # mean 27.08 head steps per AR step, against 50 unannealed
    cosine = head_step_schedule(50, 5, 64, "disa-cosine")
    assert cosine[0] == 50 and cosine[-1] == 5 and cosine[32] == 26 and cosine == sorted(cosine, reverse=True)
    assert head_step_schedule(10, 2, 8, "disa") != head_step_schedule(10, 2, 8, "linear")  # rounds down, not nearest
    for kind in ("linear", "disa", "disa-cosine"):
        assert head_step_schedule(7, 7, 5, kind) == [7] * 5 and head_step_schedule(7, None, 3, kind) == [7] * 3


@pytest.mark.kernels
def test_a_disa_schedule_that_anneals_nothing_is_plain_generation():
    pair = random_pair64()
    plain, csd = sampling64(num_steps=6, cfg_scale=2.0, head_steps=8), CSDConfig(gamma=3)
    plain_tokens = generate(pair.target, [1, 2], [3, 4], plain).tokens  # the plain runs, once for both kinds
    b = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], plain, csd)
    for kind in ("disa", "disa-cosine"):
        flat = sampling64(num_steps=6, cfg_scale=2.0, head_steps=8, head_steps_min=8, head_schedule=kind)
        assert_same64(generate(pair.target, [1, 2], [3, 4], flat).tokens, plain_tokens, kind)
        a = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], flat, csd)
        assert_same64(a.tokens, b.tokens, kind)
        assert (a.trace.maker == b.trace.maker).all()


def test_generation_follows_disas_schedule_alone_and_under_csd(recorded):
    pair, calls = recorded
    s = sampling64(num_steps=8, cfg_scale=2.0, head_steps=10, head_steps_min=2, head_schedule="disa")
    generate(pair.target, [1, 2], [3, 4], s)
    assert calls["target"][-8:] == head_step_schedule(10, 2, 8, "disa") == [10, 8, 7, 6, 5, 4, 3, 2]
    calls["target"].clear()
    out = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, CSDConfig(gamma=3))
    assert set(calls["target"]) <= set(head_step_schedule(10, 2, 8, "disa")) and 10 in calls["target"]
    assert out.trace.settings["sampling"]["head_schedule"] == "disa"


def test_an_unknown_head_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="head_schedule must be one of"):
        SamplingConfig.from_knobs(head_schedule="cosine")


@pytest.mark.kernels
def test_target_only_generation_follows_the_schedule_and_stays_batch_invariant(recorded):
    pair, calls = recorded
    batch = generate(pair.target, [1, 2], [3, 4], SCHEDULED)
    assert calls["target"][-8:] == head_step_schedule(10, 2, 8)
    alone = generate(pair.target, [2], [4], SCHEDULED)
    assert_same64(batch.tokens[1:], alone.tokens, "image 1 alone")
    flat = generate(pair.target, [1, 2], [3, 4], sampling64(num_steps=8, cfg_scale=2.0, head_steps=10))
    assert_differ64(batch.tokens, flat.tokens, "the schedule", by=1e-2)
    same = sampling64(num_steps=8, cfg_scale=2.0, head_steps=10, head_steps_min=10)
    assert_same64(generate(pair.target, [1, 2], [3, 4], same).tokens, flat.tokens, "a flat schedule")


@pytest.mark.kernels
def test_csd_runs_each_block_at_its_first_steps_head_steps(recorded):
    pair, calls = recorded
    csd = CSDConfig(gamma=3, prefill=0.05)
    out = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], SCHEDULED, csd)
    schedule = head_step_schedule(10, 2, 8)
    trace = out.trace
    blocks = [trace.ar_step[trace.block == b] for b in sorted({int(b) for b in trace.block[trace.block >= 0]})]
    # One draft chain per drafted AR step, all at the head steps of their block's first AR step.
    drafted = [schedule[int(steps.min())] for steps in blocks for _ in range(int(steps.max() - steps.min()) + 1)]
    assert calls["draft"] == drafted and len(set(drafted)) > 1
    alone = speculative_generate(pair.target, pair.draft, [2], [4], SCHEDULED, csd)
    assert_same64(out.tokens[1:], alone.tokens, "image 1 alone")


@pytest.mark.kernels
def test_a_cheaper_draft_head_needs_independent_noise_and_the_final_step_test():
    m, sampling = random_pair64(), sampling64(num_steps=8, cfg_scale=2.0)
    with pytest.raises(
        ValueError, match=r"draft_head_steps 4 differs from the target's head steps \[10\].*align=False"
    ):
        speculative_generate(m.target, m.draft, [1], [3], sampling, CSDConfig(gamma=3, draft_head_steps=4))
    with pytest.raises(ValueError, match="draft_head_steps"):
        speculative_generate(
            m.target,
            m.draft,
            [1],
            [3],
            sampling,
            CSDConfig.from_knobs(gamma=3, draft_head_steps=4, criterion="exact", align=False),
        )
    # The target's own number of steps is no change at all.
    same = CSDConfig(gamma=3, draft_head_steps=10)
    assert_same64(
        speculative_generate(m.target, m.draft, [1], [3], sampling, same).tokens,
        speculative_generate(m.target, m.draft, [1], [3], sampling, CSDConfig(gamma=3)).tokens,
    )


@pytest.mark.kernels
def test_a_cheaper_draft_head_runs_seeded_and_batch_invariant(recorded):
    pair, calls = recorded
    csd = CSDConfig.from_knobs(gamma=3, draft_head_steps=4, **INDEPENDENT)
    sampling = sampling64(num_steps=8, cfg_scale=2.0)
    out = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], sampling, csd, keep_details=True)
    assert set(calls["draft"]) == {4} and torch.isfinite(out.tokens).all()
    det, v = out.trace.details, out.trace.verified
    assert torch.isfinite(torch.from_numpy(det.draft_mean[v][:, :4])).all()
    assert torch.isnan(torch.from_numpy(det.draft_mean[v][:, 4:])).all()  # the draft's chain is 4 steps long
    alone = speculative_generate(pair.target, pair.draft, [2], [4], sampling, csd)
    assert_same64(out.tokens[1:], alone.tokens, "image 1 alone")
    assert (out.trace.maker[1:] == alone.trace.maker).all()
    again = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], sampling, csd)
    assert_same64(out.tokens, again.tokens, "the same seeds again")


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (
            lambda: SamplingConfig.from_knobs(head_steps_min=0),
            r"head_steps_min \(last AR step's head steps\) must be None or an int",
        ),
        (lambda: CSDConfig(draft_head_steps=0), r"draft_head_steps must be None or an int in \[1, 1000\]"),
        (lambda: CSDConfig(draft_head_steps=True), "draft_head_steps"),
    ],
)
def test_bad_head_step_settings_are_refused_by_name(make, name):
    with pytest.raises(ValueError, match=name):
        make()
