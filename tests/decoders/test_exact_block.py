"""The exact block (``CSDConfig(block="exact")``): the target verifies each drafted AR step given the block's
drafted steps before it, and the block is committed through its first step with a rejection.

Asserted in float64, where a run's logic shows exactly: with the draft equal to the target every drafted token
is accepted and the tokens are target-only's (the published block, whose target sees only the context before
the block, rejects some); at gamma 1 the exact block is the published one; the committed steps, the trace and
the settings' rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csd.config import CSDConfig
from csd.core.checks import SettingError
from csd.models.mar.adapter import block_views
from csd.run_setup import check_settings
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, random_pair64, sampling64

pytestmark = pytest.mark.kernels  # float64 token comparisons: rerun under the kernel perturbations

# Each family's untrained pair and a short setting: (conditions, seeds, sampling).
SETTINGS = {
    "mar": ([1, 2], [3, 4], dict(num_steps=8, cfg_scale=2.0, head_steps=4)),
    "harmon": (["a red circle", "a blue square"], [3, 4], dict(num_steps=8, cfg_scale=2.0, head_steps=4)),
    "xar": ([1, 2], [3, 4], dict(num_steps=16, cfg_scale=2.0, head_steps=3)),
}


def run(family: str, draft: str = "draft", **csd):
    pair = random_pair64(family)
    conditions, seeds, knobs = SETTINGS[family]
    model = pair.target if draft == "target" else pair.draft
    s = sampling64(**knobs)
    spec = speculative_generate(pair.target, model, conditions, seeds, s, CSDConfig.from_knobs(**csd))
    return spec, (pair, conditions, seeds, s)


@pytest.mark.parametrize("family", list(SETTINGS))
def test_with_the_draft_equal_to_the_target_every_token_is_accepted_and_the_tokens_are_target_onlys(one_thread, family):
    spec, (pair, conditions, seeds, s) = run(family, draft="target", gamma=4, prefill=0.0, block="exact")
    trace = spec.trace
    assert trace.count(Maker.RESAMPLED) == trace.count(Maker.CAPPED) == 0
    assert trace.acceptance_rate == 1.0 and all(kept == drafted for kept, drafted in trace.block_steps)
    assert_same64(spec.tokens, generate(pair.target, conditions, seeds, s).tokens, family)


def test_the_published_block_rejects_some_of_the_targets_own_tokens(one_thread):
    """The contrast: its target verifies every drafted step from the context before the block."""
    spec, _ = run("mar", draft="target", gamma=4, prefill=0.0)
    assert spec.trace.acceptance_rate < 0.9


@pytest.mark.parametrize("family", list(SETTINGS))
def test_at_gamma_1_the_exact_block_is_the_published_one(one_thread, family):
    exact, _ = run(family, gamma=1, block="exact")
    published, _ = run(family, gamma=1)
    assert_same64(exact.tokens, published.tokens, family)
    np.testing.assert_array_equal(exact.trace.maker, published.trace.maker)
    np.testing.assert_array_equal(exact.trace.resample_tries, published.trace.resample_tries)


@pytest.mark.parametrize("family", ["mar", "harmon"])
def test_a_block_is_committed_through_its_first_step_with_a_rejection(one_thread, family):
    spec, _ = run(family, gamma=4, block="exact")
    trace = spec.trace
    assert trace.block_steps and all(1 <= kept <= drafted for kept, drafted in trace.block_steps)
    assert any(kept < drafted for kept, drafted in trace.block_steps)  # the untrained draft is rejected early
    assert (trace.maker >= 0).all() and (trace.ar_step >= 0).all()  # every token made, once
    # Each block's last committed step holds a rejection, or the block kept every step it drafted.
    for b in np.unique(trace.block[trace.block >= 0]):
        steps = np.unique(trace.ar_step[trace.block == b])
        kept, drafted = trace.block_steps[b]
        assert len(steps) == kept and list(steps) == list(range(steps[0], steps[0] + kept))
        last = (trace.block == b) & (trace.ar_step == steps[-1])
        assert kept == drafted or (trace.maker[last] != Maker.ACCEPTED).any(), (b, kept, drafted)
        earlier = (trace.block == b) & (trace.ar_step < steps[-1])
        assert (trace.maker[earlier] == Maker.ACCEPTED).all()  # before it, every image accepted every token
    prefilled = len(np.unique(trace.ar_step[trace.block == -1]))
    assert sum(kept for kept, _ in trace.block_steps) == len(trace.step_sizes) - prefilled


def test_the_views_hold_the_drafted_steps_before_each_step():
    tokens, mask = torch.zeros(2, 6, 1), torch.ones(2, 6, dtype=torch.bool)
    pos = torch.tensor([[0, 1, 2], [5, 4, 3]])  # two steps: sizes 1 and 2
    drafted = torch.arange(1.0, 7.0).reshape(6, 1)  # image 0: 1, 2, 3; image 1: 4, 5, 6
    views, masks = block_views(tokens, mask, pos, drafted, [1, 2])
    assert views.shape == (4, 6, 1) and masks.shape == (4, 6)
    assert (views[:2] == 0).all() and masks[:2].all()  # view 0: the context alone
    assert views[2, :, 0].tolist() == [1, 0, 0, 0, 0, 0] and views[3, :, 0].tolist() == [0, 0, 0, 0, 0, 4]
    assert masks[2].tolist() == [False, True, True, True, True, True]


def test_the_exact_block_takes_no_lazymar_cache():
    pair = random_pair64("mar")
    s = sampling64(num_steps=8, cfg_scale=2.0, cond_cache_start=2)
    with pytest.raises(SettingError, match="cond_cache_start must be None under block 'exact'"):
        check_settings(pair.target.traits, pair.target.seq_len, s, CSDConfig(block="exact"))
    with pytest.raises(ValueError, match="block must be one of"):
        CSDConfig(block="strict")
