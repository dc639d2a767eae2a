"""The exact block (``CSDConfig.from_knobs(block="exact")``): the target verifies each drafted AR step given the block's
drafted steps before it, and the block is committed through its first step with a rejection.

Asserted in float64, where a run's logic shows exactly: with the draft equal to the target every drafted token
is accepted and the tokens are target-only's (the published block, whose target sees only the context before
the block, rejects some); at gamma 1 the exact block is the published one; the committed steps, the trace and
the settings' rules. A masked family verifies the block's views (one per drafted step) as rows of one backbone
pass, each padded to the last view's kept rows with the padding out of attention: every view gets the
conditions a pass of its own gives it (within 1e-12), and a run makes the decisions and tokens of one with a
pass per view (``views="per_view"``), for one target pass per block."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from csd.config import CSDConfig
from csd.core.checks import SettingError
from csd.core.schedule import step_sizes
from csd.models.mar.adapter import block_views
from csd.run_setup import check_settings
from csd.sampling import generate
from csd.serving.pairs import embedded_pair
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, pair_name, random_pair64, sampling64

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


def test_a_pass_per_view_needs_a_block_of_views_on_a_masked_family():
    with pytest.raises(SettingError, match="views 'per_view' needs block 'context' or 'exact'") as e:
        CSDConfig.from_knobs(views="per_view")  # under the published block
    assert e.value.field == "views"
    pair = random_pair64("xar")
    s = sampling64(num_steps=pair.traits.fixed_num_steps, cfg_scale=2.0)
    with pytest.raises(SettingError, match="views 'per_view' needs a family that verifies a block from one") as e:
        check_settings(
            pair.target.traits, pair.target.seq_len, s, CSDConfig.from_knobs(block="exact", views="per_view")
        )
    assert e.value.field == "views"


def test_the_exact_block_takes_no_lazymar_cache():
    pair = random_pair64("mar")
    s = sampling64(num_steps=8, cfg_scale=2.0, cond_cache_start=2)
    with pytest.raises(SettingError, match="cond_cache_start must be None under block 'exact'"):
        check_settings(pair.target.traits, pair.target.seq_len, s, CSDConfig.from_knobs(block="exact"))
    with pytest.raises(ValueError, match="block must be one of"):
        CSDConfig.from_knobs(block="strict")


# --- the views as rows of one pass ---------------------------------------------------------------------------


@functools.cache
def masked_pair(name: str):
    """A masked family's pair in float64: the untrained MAR and Harmon pairs, the embedded class and text pairs."""
    if name.startswith("embedded "):
        return embedded_pair(pair_name(name.removeprefix("embedded "), "embedded")).at_precision("float64")
    return random_pair64(name)


MASKED = ("mar", "harmon", "embedded mar", "embedded harmon")


def conditions_of(pair, batch: int):
    return list(pair.prompts[:batch]) if pair.is_text else list(range(1, batch + 1))


@pytest.mark.parametrize("gamma", [2, 4, 8])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", MASKED)
def test_every_view_in_one_pass_gets_the_conditions_a_pass_of_its_own_gives_it(one_thread, name, batch, gamma):
    """A block of ``gamma`` AR steps (MAR's schedule at 16 steps, from step 4) on a canvas of random tokens,
    both guidance halves: the one pass's conditions of view k are those of view k's own pass within 1e-12."""
    pair = masked_pair(name)
    model, n, d = pair.target, pair.target.seq_len, pair.target.token_dim
    g = torch.Generator().manual_seed(10 * batch + gamma)
    sizes = step_sizes(n, 16)
    known, sizes = sum(sizes[:4]), sizes[4 : 4 + gamma]
    order = torch.stack([torch.randperm(n, generator=g) for _ in range(batch)])
    tokens = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    mask = torch.ones(batch, n, dtype=torch.bool).scatter(1, order[:, :known], False)
    pos, drafted = (
        order[:, known : known + sum(sizes)],
        torch.randn(batch * sum(sizes), d, generator=g, dtype=torch.float64),
    )
    state = model.start(
        model.check_conditions(conditions_of(pair, batch), batch, pos.device), sampling64(cfg_scale=2.0)
    )
    views, view_mask = block_views(tokens, mask, pos, drafted, sizes)
    z, z_uncond = model._conditions(state, views, view_mask, True, known=known + sum(sizes[:-1]), views=gamma)
    for k in range(gamma):
        rows = slice(k * batch, (k + 1) * batch)
        own, own_uncond = model._conditions(state, views[rows], view_mask[rows], True, known=known + sum(sizes[:k]))
        torch.testing.assert_close(z[rows], own, rtol=0.0, atol=1e-12)
        torch.testing.assert_close(z_uncond[rows], own_uncond, rtol=0.0, atol=1e-12)


WHOLE_RUNS = [(f, b, g) for f in ("mar", "harmon") for b in (1, 2) for g in (2, 4, 8)]
WHOLE_RUNS += [("embedded mar", 2, 4), ("embedded harmon", 2, 4)]


@pytest.mark.parametrize(("name", "batch", "gamma"), WHOLE_RUNS)
def test_a_run_makes_the_decisions_and_tokens_of_a_pass_per_view_in_one_target_pass_per_block(
    one_thread, name, batch, gamma
):
    """The same run with a target pass per view (``views="per_view"``): every decision the same, one target
    pass per block where those took one per drafted step, and the tokens within float64 rounding amplified by
    a chain (the views' conditions differ in their last bits: the test above). On the trained embedded pairs
    that rounding compounds from AR step to AR step, each step's tokens the next one's context (3.2e-8 by the
    text pair's last step, as any change of kernels moves it): there the tokens are compared through the
    first block, the decisions throughout."""
    pair = masked_pair(name)
    seeds, s = list(range(3, 3 + batch)), sampling64(num_steps=8, cfg_scale=2.0, head_steps=3)
    run = lambda views: speculative_generate(
        pair.target,
        pair.draft,
        conditions_of(pair, batch),
        seeds,
        s,
        CSDConfig.from_knobs(gamma=gamma, block="exact", views=views),
    )
    one_pass, reference = run("one_pass"), run("per_view")
    a, r = one_pass.trace, reference.trace
    assert a.block_steps == r.block_steps and any(drafted > 1 for _, drafted in a.block_steps)
    np.testing.assert_array_equal(a.maker, r.maker)
    np.testing.assert_array_equal(a.resample_tries, r.resample_tries)
    prefilled = len(np.unique(a.ar_step[a.block == -1]))
    assert a.target_passes == prefilled + len(a.block_steps)  # one pass per block
    assert r.target_passes == prefilled + sum(drafted for _, drafted in r.block_steps)  # one per view
    through_first = torch.as_tensor(a.ar_step < prefilled + a.block_steps[0][0])
    compared = through_first if name.startswith("embedded") else slice(None)
    assert_same64(one_pass.tokens[compared], reference.tokens[compared], f"{name}, batch {batch}, gamma {gamma}")
