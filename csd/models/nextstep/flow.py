"""NextStep-1's flow-matching sampler (the official ``FlowMatchingHead.sample``) as a Gaussian chain over tokens.

Time runs from noise (t = 0) to data (t = 1); the network predicts the velocity v = x - noise at x_t = t x +
(1 - t) noise. The official grid is ``num_sampling_steps`` times from 0 to 1 - ``last_step_size``, each shifted
by ``timesteps_shift`` (t -> t / (s - (s - 1) t)). At grid time t with step dt > 0, Euler-Maruyama on the
SDE whose drift is v + (1 - t) score, the score read from the velocity ((t v - x) / (1 - t)), is

    mu = y + dt ((1 + t) v - y),   sigma = sqrt(2 (1 - t) dt)     (num_sampling_steps - 1 steps),

then one noise-free step x = y + last_step_size v at the grid's last time: ``num_sampling_steps`` transitions,
the last without noise, the chain shape of :mod:`csd.core.chain`. sigma does not depend on the model, so draft
and target on the same grid share it; the last step's sigma (same formula, dt = last_step_size) is the width
the acceptance test gives the final token. Guidance is on the velocity, v_u + cfg (v_c - v_u), the conditional
and unconditional rows in one network call.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from csd.core.chain import HeadCondition
from csd.core.checks import check_choice
from csd.models.head import MLPAdaLN
from csd.settings import FLOW_GRIDS

FLOW_SAMPLERS = ("euler-maruyama", "euler", "heun")


@functools.cache
def flow_grid(num_steps: int, shift: float = 1.0, last: float = 0.04) -> tuple[float, ...]:
    """The ``num_steps`` times of the official grid (floats, computed in float64)."""
    if not (isinstance(num_steps, int) and num_steps >= 2):
        raise ValueError(f"flow steps must be an int >= 2, got {num_steps!r}")
    t = torch.linspace(0.0, 1.0 - last, num_steps, dtype=torch.float64)
    return tuple((t / (shift - (shift - 1.0) * t)).tolist())


class FlowChain:
    """The head at ``num_steps`` transitions (:class:`csd.core.chain.GaussianChain`): the network (x_t (n, d), t
    (n,), z (n, width)) -> v (n, d), on :func:`flow_grid`'s times. The network's embedding of a chain's
    conditions is made once per condition; the states and statistics are in the network's dtype."""

    def __init__(
        self,
        net: MLPAdaLN,
        num_steps: int,
        shift: float = 1.0,
        last: float = 0.04,
        sampler: str = "euler-maruyama",
        grid: str = "official",
    ):
        check_choice("head_sampler (a flow chain's)", sampler, FLOW_SAMPLERS)
        check_choice("flow_grid", grid, FLOW_GRIDS)
        if grid == "uniform":
            shift, last = 1.0, 1.0 / num_steps
        self.net, self.token_dim, self.last, self.sampler = net, net.token_dim, float(last), sampler
        self.times = flow_grid(num_steps, float(shift), self.last)
        steps = [b - a for a, b in zip(self.times[:-1], self.times[1:], strict=True)] + [self.last]
        self._t = torch.tensor(self.times, dtype=torch.float64)
        self._dt = torch.tensor(steps, dtype=torch.float64)

    def num_steps(self) -> int:
        return len(self.times)

    def velocity(self, y: Tensor, t: Tensor, cond: HeadCondition) -> Tensor:
        """The guided velocity (n, d) at states y (n, d) and times t (n,)."""
        guided = cond.z_uncond is not None
        x, tt = (torch.cat([y, y]), torch.cat([t, t])) if guided else (y, t)
        dtype = self.net.input_proj.weight.dtype
        embedded = self.net.time_embed(tt) + cond.derived(self.net, self._embed_condition)
        v = self.net.forward_embedded(x.to(dtype), embedded).to(y.dtype)
        if not guided:
            return v
        v_c, v_u = v.chunk(2)
        scale = (cond.cfg if cond.cfg is not None else torch.ones(y.shape[0], device=y.device)).to(y.dtype)
        return v_u + scale[:, None] * (v_c - v_u)

    def _embed_condition(self, cond: HeadCondition) -> Tensor:
        return self.net.cond_embed(cond.z if cond.z_uncond is None else torch.cat([cond.z, cond.z_uncond]))

    def transition(self, y: Tensor, step: int | Tensor, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        """Mean and std (n, d) of transition ``step`` (an int, or one per row (n,)) at states y (n, d)."""
        n, last = y.shape[0], self.num_steps() - 1
        if isinstance(step, int):
            t = torch.full((n,), self.times[step], dtype=y.dtype, device=y.device)
            dt = self.last if step == last else self.times[step + 1] - self.times[step]
            v = self.velocity(y, t, cond)
            std = math.sqrt(2.0 * (1.0 - self.times[step]) * dt)
            if step == last or self.sampler == "euler":
                mean = y + dt * v
            elif self.sampler == "heun":
                mean = y + 0.5 * dt * (v + self.velocity(y + dt * v, t + dt, cond))
            else:
                mean = y + dt * ((1.0 + t[:, None]) * v - y)
            stochastic = self.sampler == "euler-maruyama" or step == last
            return mean, torch.full_like(y, std if stochastic else 0.0)
        if self.sampler != "euler-maruyama":
            return self._stack(y, step, cond)
        step = step.to(y.device)
        t, dt = self._t.to(y.device, y.dtype)[step], self._dt.to(y.device, y.dtype)[step]
        v = self.velocity(y, t, cond)
        final = (step == last)[:, None]
        mean = torch.where(final, y + dt[:, None] * v, y + dt[:, None] * ((1.0 + t[:, None]) * v - y))
        std = torch.sqrt(2.0 * (1.0 - t) * dt)[:, None].expand_as(y)
        return mean, std

    def _stack(self, y: Tensor, step: Tensor, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        """An ODE sampler's transitions at one step per row, row by row's step (the exact criterion's path)."""
        means, stds = torch.empty_like(y), torch.empty_like(y)
        for k in step.unique().tolist():
            rows = (step == k).nonzero().squeeze(-1)
            means[rows], stds[rows] = self.transition(y[rows], int(k), cond.select(rows))
        return means, stds
