"""Gaussian diffusion of the token head: schedule, respacing, variance, guidance, temperature."""

import math

import numpy as np
import pytest
import torch

from csd.core.chain import HeadCondition, run_chain, standard_noise
from csd.models import diffusion as gd
from csd.models.head import DiffusionHead


def test_cosine_betas_follow_alpha_bar_formula():
    betas = gd.cosine_betas(1000)
    ab = np.cumprod(1 - betas)
    f = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
    assert ab[499] == pytest.approx(f(0.5) / f(0.0), rel=1e-9)
    assert betas.max() <= 0.999


def test_respacing_keeps_mar_timesteps():
    # Values of the official space_timesteps(1000, "100") (ADM striding with Python rounding).
    kept = gd.respaced_timesteps(1000, 100)
    assert kept[:6] == [0, 10, 20, 30, 40, 50] and kept[-3:] == [979, 989, 999] and len(set(kept)) == 100


def test_respaced_schedule_keeps_alpha_bar_at_kept_steps():
    base = np.cumprod(1 - gd.cosine_betas(1000))
    sched = gd.Schedule.cosine(1000, 25)
    kept = sched.timestep_map.numpy()
    np.testing.assert_allclose(sched.alphas_cumprod.numpy(), base[kept], rtol=1e-9)


@pytest.mark.parametrize("steps", [0, 1001])
def test_respacing_rejects_bad_step_counts(steps):
    with pytest.raises(ValueError, match="sampling steps"):
        gd.respaced_timesteps(1000, steps)


def test_learned_range_variance_spans_posterior_to_beta():
    sched = gd.Schedule.cosine(1000, 50)
    t = 20
    lo = gd.learned_log_variance(sched, torch.full((1, 1), -1.0, dtype=torch.float64), t)
    hi = gd.learned_log_variance(sched, torch.full((1, 1), 1.0, dtype=torch.float64), t)
    assert lo.item() == pytest.approx(sched.posterior_log_variance_clipped[t].item())
    assert hi.item() == pytest.approx(math.log(sched.betas[t].item()))


def test_guidance_mixes_eps_only_and_scale_one_is_conditional():
    c, u = torch.randn(4, 3), torch.randn(4, 3)
    torch.testing.assert_close(gd.guide_eps(c, u, 1.0), c)
    torch.testing.assert_close(gd.guide_eps(c, u, 0.0), u)
    torch.testing.assert_close(gd.guide_eps(c, u, torch.tensor([2.0] * 4)), u + 2 * (c - u))


def test_clip_x0_bounds_the_predicted_clean_token():
    sched = gd.Schedule.cosine(1000, 10)
    x_t, eps, v = torch.randn(5, 4), 50 * torch.randn(5, 4), torch.zeros(5, 4)
    mean, _ = gd.p_mean_logvar(sched, x_t, 0, eps, v, clip_x0=1.0)  # t = 0: mean is the predicted x0
    assert mean.abs().max() <= 1.0 + 1e-6


@pytest.fixture()
def head() -> DiffusionHead:
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # layer init reads the global generator
        torch.manual_seed(0)
        h = DiffusionHead(token_dim=4, z_dim=8, width=16, depth=1, sampling_steps=10, clip_x0=1.0)
        for p in h.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return h


def test_chain_std_scales_with_temperature_and_last_step_is_noise_free(head):
    g = torch.Generator().manual_seed(0)
    chain = head.chain()
    noise = standard_noise(3, 4, chain.num_steps(), g, "cpu", torch.float32)
    cond = HeadCondition(torch.randn(3, 8, generator=g))
    with torch.no_grad():
        t1, t2 = run_chain(chain, cond, noise, 1.0), run_chain(chain, cond, noise, 0.5)
    torch.testing.assert_close(t2.std[0], 0.5 * t1.std[0])
    torch.testing.assert_close(t1.x, t1.mean[-1])


def test_head_steps_view_does_not_change_the_shared_head(head):
    assert head.chain(5).num_steps() == 5
    assert head.chain().num_steps() == 10
    with pytest.raises(ValueError, match="head_steps"):
        head.chain(0)


def test_training_loss_decreases_when_fitting_a_point_mass():
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        h = DiffusionHead(token_dim=2, z_dim=4, width=32, depth=2)
    opt = torch.optim.Adam(h.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x0, z = torch.tensor([[0.5, -0.5]]).repeat(256, 1), torch.ones(256, 4)
    first = None
    for _ in range(150):
        loss = h.loss(x0, z, g).mean()
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first  # measured 0.031 x first under every kernel perturbation (tests/kernels.py)
