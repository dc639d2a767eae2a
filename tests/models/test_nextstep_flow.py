"""NextStep's flow chain (csd/models/nextstep/flow.py) beyond the official sampler (whose every transition is
pinned to the official code in test_nextstep_parity.py): the probability-flow ODE samplers and the uniform grid
the frontier compares with, and the transitions at one step per row (the exact criterion's path) equal to
those at one step for all rows. In float64."""

from __future__ import annotations

import pytest
import torch

from csd.core.chain import HeadCondition, evaluate_path, run_transitions, standard_noise
from csd.models.head import MLPAdaLN
from csd.models.nextstep import FlowChain, flow_grid


@pytest.fixture(scope="module")
def net():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = MLPAdaLN(6, 8, 16, 2, out_channels=6).double()
        for p in net.parameters():  # the zero-initialised output and modulations too
            torch.nn.init.normal_(p, std=0.3)
    return net


def condition(rows: int = 3) -> HeadCondition:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(rows, 8, generator=g, dtype=torch.float64)
    return HeadCondition(z, torch.randn(rows, 8, generator=g, dtype=torch.float64), torch.full((rows,), 2.5).double())


def test_the_uniform_grid_is_equal_steps_from_noise_to_data(net):
    chain = FlowChain(net, 5, shift=3.0, last=0.04, grid="uniform")
    assert chain.times == pytest.approx((0.0, 0.2, 0.4, 0.6, 0.8)) and chain.last == pytest.approx(0.2)
    assert FlowChain(net, 5, shift=3.0).times == flow_grid(5, 3.0, 0.04)  # the official grid, shifted


@pytest.mark.parametrize("sampler", ["euler", "heun"])
def test_the_ode_samplers_step_along_the_velocity_without_noise_but_at_the_last(net, sampler):
    chain, cond = FlowChain(net, 4, shift=2.0, sampler=sampler), condition()
    y = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for k in range(4):
        t = torch.full((3,), chain.times[k], dtype=torch.float64)
        dt = chain.last if k == 3 else chain.times[k + 1] - chain.times[k]
        v = chain.velocity(y, t, cond)
        if sampler == "heun" and k < 3:
            v = 0.5 * (v + chain.velocity(y + dt * v, t + dt, cond))
        mean, std = chain.transition(y, k, cond)
        torch.testing.assert_close(mean, y + dt * v, rtol=0.0, atol=1e-14)
        assert (std == 0).all() if k < 3 else (std > 0).all()


@pytest.mark.parametrize("sampler", ["euler-maruyama", "euler", "heun"])
def test_transitions_at_a_step_per_row_equal_those_at_one_step(net, sampler):
    chain, cond = FlowChain(net, 4, shift=2.0, sampler=sampler), condition()
    traj = run_transitions(chain, cond, standard_noise(3, 6, 4, torch.Generator().manual_seed(3), "cpu", torch.float64))
    mean, std = evaluate_path(chain, cond, traj.states)
    torch.testing.assert_close(mean, traj.mean, rtol=0.0, atol=1e-13)
    torch.testing.assert_close(std, traj.std, rtol=0.0, atol=1e-15)


def test_an_unknown_sampler_or_grid_is_refused_by_name(net):
    with pytest.raises(ValueError, match="head_sampler"):
        FlowChain(net, 4, sampler="ddim")
    with pytest.raises(ValueError, match="flow_grid"):
        FlowChain(net, 4, grid="cosine")
