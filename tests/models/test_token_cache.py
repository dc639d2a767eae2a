"""LazyMAR's token cache as a sampler setting (SamplingConfig.token_cache: token_cache_keep / _start / _every): at most
passes the decoder's later blocks recompute part of the rows and reuse the others' keys, values and
outputs. A cache that recomputes every row is plain generation (in float64, up to its rounding: tests/helpers.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.models.mar import token_cache as tc
from csd.sampling import generate
from csd.serving.pairs import random_spec, random_spec_pair
from csd.speculative import speculative_generate
from tests.helpers import assert_differ64, assert_same64, sampling64

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.kernels]
PLAIN = sampling64(num_steps=6, cfg_scale=3.0, head_steps=4)  # runs compared in float64 (tests/helpers.py)
CACHED = PLAIN.with_knobs(token_cache_keep=0.3, token_cache_start=1, token_cache_every=3)


@pytest.fixture(scope="module", params=["mar", "harmon"])
def pair(request):
    spec = random_spec(request.param)
    return random_spec_pair(spec).at_precision("float64")


def conditions(pair, n: int) -> list:
    return list(pair.prompts[:1]) * n if pair.is_text else [i % pair.traits.num_classes for i in range(n)]


def test_the_schedule_refreshes_like_lazymar():
    s = SamplingConfig.from_knobs(token_cache_keep=0.25)  # LazyMAR's start 5, refresh every 9
    assert [i for i in range(64) if s.full_token_pass(i)] == [0, 1, 2, 3, 4, 5, 14, 23, 32, 41, 50, 59]
    assert all(SamplingConfig().full_token_pass(i) for i in range(64))  # no cache: every pass is full


@pytest.mark.parametrize(
    "setting", [{"token_cache_keep": 1.0}, {"token_cache_keep": 0.2, "token_cache_start": 0, "token_cache_every": 1}]
)
def test_a_cache_that_skips_nothing_is_plain_generation_(pair, setting):
    cond, cached = (
        conditions(pair, 2),
        PLAIN.with_knobs(token_cache_start=1, token_cache_every=3) if len(setting) == 1 else PLAIN,
    )
    cached = cached.with_knobs(**setting)
    plain = generate(pair.target, cond, [1, 2], PLAIN).tokens
    assert_same64(generate(pair.target, cond, [1, 2], cached).tokens, plain, "target-only")
    csd = CSDConfig(gamma=2)
    a = speculative_generate(pair.target, pair.draft, cond, [1, 2], cached, csd)
    b = speculative_generate(pair.target, pair.draft, cond, [1, 2], PLAIN, csd)
    assert_same64(a.tokens, b.tokens, "CSD")
    assert (a.trace.maker == b.trace.maker).all()


def test_cached_passes_recompute_part_of_the_rows_always_the_predicted_ones(pair, monkeypatch):
    seen = []  # (full pass?, rows recomputed per image, positions predicted) per decoder pass
    inner = tc.kept_rows

    def recording(change, forced, keep):
        index = inner(change, forced, keep)
        seen.append((index, forced))
        return index

    monkeypatch.setattr(tc, "kept_rows", recording)
    cond = conditions(pair, 2)
    cached = generate(pair.target, cond, [1, 2], CACHED)
    assert len(seen) == 3  # of 6 passes 0, 1 and 4 are full (start 1, every 3), 2, 3 and 5 cached
    for index, forced in seen:
        n = forced.shape[1]
        assert index.shape[1] < n  # fewer rows than the sequence
        assert all(set(forced[r].nonzero().flatten().tolist()) <= set(index[r].tolist()) for r in range(len(index)))
        assert (index.diff(dim=1) > 0).all()  # ascending, distinct
    plain = generate(pair.target, cond, [1, 2], PLAIN)
    assert_differ64(cached.tokens, plain.tokens, "cached")  # reused rows change the numbers a little ...
    assert torch.isfinite(cached.tokens).all()


def test_kept_rows_take_every_forced_row_then_the_most_changed():
    change = torch.tensor([[0.0, 0.9, 0.1, 0.5, 0.2, 0.0]])
    forced = torch.tensor([[True, False, False, False, False, True]])
    assert tc.kept_rows(change, forced, keep=0.6).tolist() == [[0, 1, 3, 5]]  # 4 of 6: 2 forced + the 2 most changed
    assert tc.kept_rows(change, forced, keep=0.1).tolist() == [[0, 5]]  # never fewer than the forced
    assert tc.kept_rows(change, forced, keep=1.0).tolist() == [list(range(6))]


def test_the_cache_is_refused_by_name_where_it_does_not_apply():
    spec = random_spec("xar")
    xar = random_spec_pair(spec)
    with pytest.raises(ValueError, match="token_cache_keep must be None for this xAR model"):
        generate(xar.target, [0], [0], replace(CACHED, num_steps=xar.traits.fixed_num_steps, precision="float32"))
    with pytest.raises(
        ValueError, match=r"token_cache_keep \(fraction of decoder rows recomputed\) must be in \(0, 1\]"
    ):
        SamplingConfig.from_knobs(token_cache_keep=0.0)
    with pytest.raises(ValueError, match="token_cache_every"):
        SamplingConfig.from_knobs(token_cache_every=0)


def test_the_command_line_takes_the_token_cache():
    import argparse

    from csd.experiments.evaluate import add_setting_args, settings_from_args

    parser = argparse.ArgumentParser()
    add_setting_args(parser)
    s, _ = settings_from_args(parser.parse_args(["--token-cache", "0.25", "5", "9"]))
    assert (s.token_cache.keep, s.token_cache.start, s.token_cache.every) == (0.25, 5, 9)
    with pytest.raises(ValueError, match="--token-cache START must be an integer, got '5.5'"):
        settings_from_args(parser.parse_args(["--token-cache", "0.25", "5.5", "9"]))
    assert settings_from_args(parser.parse_args([]))[0].token_cache is None
