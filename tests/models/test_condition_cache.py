"""LazyMAR's condition cache as a sampler setting (SamplingConfig.cond_cache: cond_cache_start / cond_cache_every):
between full CFG passes a masked model runs only the conditional half and reuses the last full pass's
unconditional-minus-conditional difference. A cache that skips nothing is plain generation (in float64, up to
its rounding: tests/helpers.py)."""

from __future__ import annotations

import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.sampling import generate
from csd.serving.pairs import random_spec, random_spec_pair
from csd.speculative import speculative_generate
from tests.helpers import assert_differ64, assert_same64, sampling64

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.kernels]
PLAIN = sampling64(num_steps=6, cfg_scale=3.0, head_steps=4)  # runs compared in float64 (tests/helpers.py)


@pytest.fixture(scope="module", params=["mar", "harmon"])
def pair(request):
    spec = random_spec(request.param)
    return random_spec_pair(spec).at_precision("float64")


def conditions(pair, n: int) -> list:
    return list(pair.prompts[:1]) * n if pair.is_text else [i % pair.traits.num_classes for i in range(n)]


def count_guided(model, calls: list):
    """Record the ``guided`` flag of every backbone pass the model makes."""
    inner = model.conditions

    def recording(tokens, mask, labels, guided, **generation):  # a text model's prompt caches
        calls.append(guided)
        return inner(tokens, mask, labels, guided, **generation)

    model.conditions = recording
    return inner


def test_the_schedule_is_lazymars():
    s = SamplingConfig.from_knobs(cond_cache_start=5, cond_cache_every=9)
    full = [i for i in range(64) if s.full_guidance_pass(i)]
    assert full == [0, 1, 2, 3, 4, 5, 14, 23, 32, 41, 50, 59]  # LazyMAR's 12 of 64 (start 5, refresh every 9)
    assert all(SamplingConfig().full_guidance_pass(i) for i in range(64))  # no cache: every pass is full


@pytest.mark.parametrize("setting", [{"cond_cache_start": 0, "cond_cache_every": 1}, {"cond_cache_start": 6}])
def test_a_cache_that_skips_nothing_is_plain_generation_(pair, setting):
    cond = conditions(pair, 2)
    cached = PLAIN.with_knobs(**setting)
    plain = generate(pair.target, cond, [1, 2], PLAIN).tokens
    assert_same64(generate(pair.target, cond, [1, 2], cached).tokens, plain, "target-only")
    csd = CSDConfig(gamma=2)
    a = speculative_generate(pair.target, pair.draft, cond, [1, 2], cached, csd)
    b = speculative_generate(pair.target, pair.draft, cond, [1, 2], PLAIN, csd)
    assert_same64(a.tokens, b.tokens, "CSD")
    assert (a.trace.maker == b.trace.maker).all()


def test_cached_passes_run_the_conditional_half_only_and_reuse_the_difference(pair):
    cond, cached = conditions(pair, 2), PLAIN.with_knobs(cond_cache_start=2, cond_cache_every=3)
    calls: list = []
    inner = count_guided(pair.target, calls)
    try:
        out = generate(pair.target, cond, [1, 2], cached)
        assert calls == [cached.full_guidance_pass(i) for i in range(PLAIN.num_steps)]
        assert calls == [True, True, True, False, False, True]  # passes 0, 1, then 2 + 3k
        calls.clear()
        again = generate(pair.target, cond, [1, 2], cached)  # a new generation starts its own cache
        assert calls[:2] == [True, True]
        assert_same64(out.tokens, again.tokens, "a second generation")
    finally:
        pair.target.conditions = inner
    plain = generate(pair.target, cond, [1, 2], PLAIN)
    assert_differ64(out.tokens, plain.tokens, "cached")  # the reused difference is an approximation
    assert_same64(out.tokens[1:], generate(pair.target, cond[1:], [2], cached).tokens, "image 1 alone")


def test_under_csd_each_model_keeps_its_own_cache(pair):
    cond, cached = conditions(pair, 2), PLAIN.with_knobs(cond_cache_start=0, cond_cache_every=100)
    target_calls, draft_calls = [], []
    inner_t, inner_d = count_guided(pair.target, target_calls), count_guided(pair.draft, draft_calls)
    try:
        run = speculative_generate(pair.target, pair.draft, cond, [1, 2], cached, CSDConfig(gamma=2))
    finally:
        pair.target.conditions, pair.draft.conditions = inner_t, inner_d
    for calls in (target_calls, draft_calls):
        assert calls and calls[0] is True and not any(calls[1:])  # one full pass each, then conditional only
    assert run.tokens.shape == (2, pair.target.seq_len, pair.target.token_dim)


def test_the_cache_is_refused_by_name_where_it_does_not_apply():
    xar = random_spec_pair(random_spec("xar"))
    s = xar.traits.cheapest().with_knobs(cond_cache_start=2)
    with pytest.raises(ValueError, match="cond_cache_start must be None for this xAR model"):
        generate(xar.target, [0], [0], s)
    with pytest.raises(ValueError, match=r"cond_cache_every \(passes between full CFG passes\) must be"):
        SamplingConfig.from_knobs(cond_cache_every=0)
    with pytest.raises(ValueError, match=r"cond_cache_start \(full CFG passes first\) must be"):
        SamplingConfig.from_knobs(cond_cache_start=-1)


def test_the_command_line_takes_the_cache_and_the_schedule():
    import argparse

    from csd.experiments.evaluate import add_setting_args, settings_from_args

    parser = argparse.ArgumentParser()
    add_setting_args(parser)
    args = ["--cond-cache", "5", "9", "--head-schedule", "disa-cosine", "--head-steps-min", "4"]
    s, _ = settings_from_args(parser.parse_args(args))
    assert (s.cond_cache.start, s.cond_cache.every, s.head_anneal.schedule, s.head_anneal.last) == (
        5,
        9,
        "disa-cosine",
        4,
    )
    s, _ = settings_from_args(parser.parse_args([]))
    assert s.cond_cache is None and s.head_anneal is None
    with pytest.raises(ValueError, match="head_schedule 'disa-cosine' needs head_steps_min"):
        settings_from_args(parser.parse_args(args[:-2]))
