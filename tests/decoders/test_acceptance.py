"""Acceptance criteria: the aligned criterion's terms and the exact path criterion."""

import math

import pytest
import torch

from csd.acceptance import Verdict, aligned_verdict, exact_verdict
from csd.core.chain import HeadCondition, Trajectory, evaluate_path, run_chain, standard_noise
from tests.helpers import LinearGaussianChain


def _random_trajectory(g: torch.Generator, steps: int = 4, n: int = 3, d: int = 2) -> Trajectory:
    mean = torch.randn(steps, n, d, generator=g, dtype=torch.float64)
    std = torch.rand(steps, n, d, generator=g, dtype=torch.float64) + 0.05
    states = torch.randn(steps, n, d, generator=g, dtype=torch.float64)
    return Trajectory(x=mean[-1].clone(), states=states, mean=mean, std=std)


def _log_normal(x: float, m: float, s: float) -> float:
    return -0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)


def test_aligned_terms_match_brute_force_formula():
    g = torch.Generator().manual_seed(0)
    q, p = _random_trajectory(g), _random_trajectory(g)
    tau_v = 3.0
    v = aligned_verdict(q, p, tau_v)
    steps, n, d = q.mean.shape
    for i in range(n):
        traj = sum(
            math.log(q.std[t, i, j].item()) - math.log(p.std[t, i, j].item())
            for t in range(steps - 1)
            for j in range(d)
        )
        final = sum(
            _log_normal(q.x[i, j].item(), p.mean[-1, i, j].item(), tau_v * p.std[-1, i, j].item())
            - _log_normal(q.x[i, j].item(), q.mean[-1, i, j].item(), tau_v * q.std[-1, i, j].item())
            for j in range(d)
        )
        assert v.trajectory[i].item() == pytest.approx(traj, rel=1e-10)
        assert v.final[i].item() == pytest.approx(final, rel=1e-10)
        assert v.log_ratio[i].item() == pytest.approx(traj + final, rel=1e-10)


def test_published_sign_flips_trajectory_term_and_none_drops_it():
    g = torch.Generator().manual_seed(1)
    q, p = _random_trajectory(g), _random_trajectory(g)
    derived = aligned_verdict(q, p, 2.0, "derived")
    torch.testing.assert_close(aligned_verdict(q, p, 2.0, "published").trajectory, -derived.trajectory)
    none = aligned_verdict(q, p, 2.0, "none")
    assert torch.all(none.trajectory == 0)
    torch.testing.assert_close(none.final, derived.final)


def test_identical_trajectories_are_always_accepted():
    g = torch.Generator().manual_seed(2)
    q = _random_trajectory(g)
    v = aligned_verdict(q, q, 5.0)
    assert torch.all(v.log_ratio == 0)
    assert torch.all(v.accept(torch.rand(3, generator=g)))


def test_accept_compares_uniform_with_min_one_ratio():
    v = Verdict(trajectory=torch.log(torch.tensor([0.3, 0.3, 2.0])), final=torch.zeros(3))
    assert v.accept(torch.tensor([0.29, 0.31, 0.999])).tolist() == [True, False, True]
    torch.testing.assert_close(v.accept_prob, torch.tensor([0.3, 0.3, 1.0]))


def test_exact_ratio_is_the_path_density_ratio_of_linear_gaussian_chains():
    q = LinearGaussianChain([0.9, 0.8, 1.0], [0.0, 0.1, 0.0], [0.5, 0.4, 0.1], token_dim=1)
    p = LinearGaussianChain([0.9, 0.7, 1.0], [0.1, 0.0, 0.0], [0.6, 0.4, 0.1], token_dim=1)
    g = torch.Generator().manual_seed(3)
    cond = HeadCondition(torch.zeros(5, 1))
    draft = run_chain(q, cond, standard_noise(5, 1, 3, g, "cpu", torch.float32))
    mean_p, std_p = evaluate_path(p, cond, draft.states)
    v = exact_verdict(draft, mean_p, std_p)
    y = draft.states[:, :, 0]
    for i in range(5):
        lp = _log_normal(y[1, i], 0.9 * y[0, i] + 0.1, 0.6) + _log_normal(y[2, i], 0.7 * y[1, i], 0.4)
        lq = _log_normal(y[1, i], 0.9 * y[0, i], 0.5) + _log_normal(y[2, i], 0.8 * y[1, i] + 0.1, 0.4)
        assert v.log_ratio[i].item() == pytest.approx(float(lp - lq), rel=1e-4, abs=1e-5)
    torch.testing.assert_close(mean_p[-1], draft.states[-1] * 1.0)  # the target's last step on the draft path
