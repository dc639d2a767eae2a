"""One Gaussian step: speculative output follows p; acceptance is 1 - TV(p, q); tries are 1/Z."""

import math

import pytest
from scipy import stats

from csd.core.one_token import speculative_sample, total_variation

P, Q = (0.0, 1.0), (1.0, 0.6)


def test_speculative_output_follows_target():
    res = speculative_sample(P, Q, 40_000, seed=0)
    assert stats.kstest(res.samples, stats.norm(*P).cdf).pvalue > 0.01  # fixed seed


def test_draft_samples_alone_do_not_follow_target():
    res = speculative_sample(P, Q, 40_000, seed=0)
    assert stats.kstest(res.samples[res.accepted], stats.norm(*P).cdf).pvalue < 1e-6


def test_acceptance_rate_is_one_minus_total_variation():
    n = 40_000
    tv = total_variation(P, Q)
    res = speculative_sample(P, Q, n, seed=1)
    se = math.sqrt(tv * (1 - tv) / n)
    assert abs(res.acceptance - (1 - tv)) < 4 * se


def test_mean_resampler_tries_are_inverse_z():
    tv = total_variation(P, Q)
    res = speculative_sample(P, Q, 40_000, seed=2)
    m = int((~res.accepted).sum())
    se = math.sqrt((1 - tv) / tv**2 / m)
    assert abs(res.mean_tries - 1 / tv) < 4 * se


def test_total_variation_of_equal_widths_matches_closed_form():
    assert total_variation((0.0, 1.0), (1.0, 1.0)) == pytest.approx(2 * stats.norm.cdf(0.5) - 1, abs=1e-6)


@pytest.mark.parametrize(
    "p,q,n,match", [((0, 0.0), Q, 10, "target std"), (P, (1e9, 1), 10, "draft mean"), (P, Q, 0, "number of samples")]
)
def test_bad_toy_inputs_are_rejected(p, q, n, match):
    with pytest.raises(ValueError, match=match):
        speculative_sample(p, q, n)
