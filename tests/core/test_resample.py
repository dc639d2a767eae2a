"""The resampler draws exactly from max(0, p - q) / Z and needs 1/Z tries on average.

Statistical tests use fixed seeds; tolerances are stated next to each assertion."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from csd.core.gaussian import normal_logpdf
from csd.core.resample import keep_probability, resample_gaussian


def _draws(g: torch.Generator, d: int):
    def draws(k: int, pending: torch.Tensor):
        m = int(pending.sum())
        return torch.randn(m, k, d, generator=g, dtype=torch.float64), torch.rand(
            m, k, generator=g, dtype=torch.float64
        )

    return draws


def _resample(n, p, q, seed, max_tries=10_000):
    (mp, sp), (mq, sq) = p, q
    d = len(mp)
    t = lambda v: torch.tensor(v, dtype=torch.float64).expand(n, d)
    return resample_gaussian(
        t(mp),
        t(sp),
        t(mq),
        t(sq),
        _draws(torch.Generator().manual_seed(seed), d),
        fallback=torch.full((n, d), float("nan"), dtype=torch.float64),
        max_tries=max_tries,
    )


def _modified_density_1d(x, p, q):
    pdf = lambda m, s: np.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    return np.maximum(0.0, pdf(*p) - pdf(*q))


def test_resampled_1d_tokens_follow_modified_distribution():
    p, q = (0.0, 1.0), (0.8, 0.7)
    res = _resample(20_000, ([p[0]], [p[1]]), ([q[0]], [q[1]]), seed=0)
    grid = np.linspace(-10, 10, 200_001)
    dens = _modified_density_1d(grid, p, q)
    cdf = np.cumsum(dens) * (grid[1] - grid[0])
    cdf /= cdf[-1]
    ks = stats.kstest(res.x[:, 0].numpy(), lambda v: np.interp(v, grid, cdf))
    assert ks.pvalue > 0.01  # fixed seed; a wrong sampler (e.g. plain p) gives p-values ~1e-100
    assert not res.capped.any()


def test_plain_target_samples_fail_the_same_test():
    # The test above has power: samples of p itself are rejected as samples of p'.
    p, q = (0.0, 1.0), (0.8, 0.7)
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0)).numpy()
    grid = np.linspace(-10, 10, 200_001)
    cdf = np.cumsum(_modified_density_1d(grid, p, q))
    cdf /= cdf[-1]
    assert stats.kstest(x, lambda v: np.interp(v, grid, cdf)).pvalue < 1e-6


def test_mean_tries_match_inverse_total_variation():
    p, q = (0.0, 1.0), (0.8, 0.7)
    grid = np.linspace(-10, 10, 200_001)
    z = _modified_density_1d(grid, p, q).sum() * (grid[1] - grid[0])  # = TV(p, q)
    res = _resample(20_000, ([p[0]], [p[1]]), ([q[0]], [q[1]]), seed=1)
    tries = res.tries.double()
    se = math.sqrt((1 - z) / z**2 / len(tries))  # geometric(Z) standard error
    assert abs(tries.mean().item() - 1 / z) < 4 * se


def test_resampled_2d_tokens_follow_modified_distribution_chi_square():
    p, q = ([0.0, 0.0], [1.0, 0.6]), ([0.5, -0.3], [0.7, 0.8])
    n = 20_000
    res = _resample(n, p, q, seed=2)
    edges = np.linspace(-4, 4, 9)
    xs = np.linspace(-8, 8, 1601)
    gx, gy = np.meshgrid(xs, xs, indexing="ij")
    pts = torch.tensor(np.stack([gx, gy], -1))
    lp = normal_logpdf(pts, torch.tensor(p[0], dtype=torch.float64), torch.tensor(p[1], dtype=torch.float64))
    lq = normal_logpdf(pts, torch.tensor(q[0], dtype=torch.float64), torch.tensor(q[1], dtype=torch.float64))
    dens = np.maximum(0.0, lp.exp().numpy() - lq.exp().numpy())
    cell = lambda v: np.clip(np.digitize(v, edges) - 1, -1, len(edges) - 1)  # -1 / 8: outside
    # Expected probability of each of the 10x10 cells (8x8 inner + outer ring bins), by grid integration.
    expected = np.zeros((10, 10))
    np.add.at(expected, (cell(gx.ravel()) + 1, cell(gy.ravel()) + 1), dens.ravel())
    expected /= expected.sum()
    observed = np.zeros((10, 10))
    x = res.x.numpy()
    np.add.at(observed, (cell(x[:, 0]) + 1, cell(x[:, 1]) + 1), 1)
    keep = expected * n >= 5
    obs, exp = observed[keep], expected[keep] * n
    exp *= obs.sum() / exp.sum()
    chi = stats.chisquare(obs, exp)
    assert chi.pvalue > 0.01  # fixed seed


def test_two_dimensional_mean_tries_match_inverse_z():
    p, q = ([0.0, 0.0], [1.0, 1.0]), ([1.0, 0.0], [1.0, 1.0])
    z = 2 * stats.norm.cdf(0.5) - 1  # TV of two unit Gaussians one unit apart
    res = _resample(20_000, p, q, seed=3)
    se = math.sqrt((1 - z) / z**2 / 20_000)
    assert abs(res.tries.double().mean().item() - 1 / z) < 4 * se


def test_cap_returns_fallback_and_flags_it():
    # q = p: every try is rejected (alpha = 0), so each token hits the cap.
    res = _resample(7, ([0.0], [1.0]), ([0.0], [1.0]), seed=4, max_tries=9)
    assert res.capped.all() and torch.all(res.tries == 9) and torch.isnan(res.x).all()


def test_weight_on_q_changes_acceptance():
    # With log w = -inf q vanishes, so the first proposal is always kept.
    n = 50
    t = lambda v: torch.full((n, 1), v, dtype=torch.float64)
    res = resample_gaussian(
        t(0.0),
        t(1.0),
        t(0.0),
        t(1.0),
        _draws(torch.Generator().manual_seed(5), 1),
        fallback=t(0.0),
        max_tries=5,
        log_weight=torch.full((n,), -1e9, dtype=torch.float64),
    )
    assert torch.all(res.tries == 1)


@pytest.mark.parametrize("log_ratio,alpha", [(-1e9, 1.0), (0.0, 0.0), (50.0, 0.0), (math.log(0.25), 0.75)])
def test_keep_probability(log_ratio, alpha):
    assert keep_probability(torch.tensor(log_ratio, dtype=torch.float64)).item() == pytest.approx(alpha)
