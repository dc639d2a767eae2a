"""Gaussian token chains: the common shape of a diffusion or flow token head.

A head turns a condition z into a token through T Gaussian transitions

    y_0 = xi,   y_{k+1} = mu_k(y_k) + tau * sigma_k(y_k) * eps_k   (k < T-1),   x = mu_{T-1}(y_{T-1})

(step k counts transitions in the order they are applied; the last one is noise-free, as in
MAR). Anything implementing :class:`GaussianChain` can be drafted, verified and resampled.
The noise is always an argument, so draft and target can share it (trajectory alignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class HeadCondition:
    """What a head is conditioned on, one row per token.

    z: (n, D) conditional backbone output; z_uncond: (n, D) or None (no guidance);
    cfg: (n,) guidance scale per row (rows of one block may come from AR steps with different
    scales under the linear schedule).
    """

    z: Tensor
    z_uncond: Tensor | None = None
    cfg: Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.z.shape[0])

    def repeat(self, times: int) -> HeadCondition:
        """The condition tiled ``times`` times along rows (to evaluate T steps in one call)."""
        rep = lambda a: None if a is None else a.repeat(times, *([1] * (a.dim() - 1)))  # noqa: E731
        return HeadCondition(rep(self.z), rep(self.z_uncond), rep(self.cfg))

    def select(self, index: Tensor) -> HeadCondition:
        pick = lambda a: None if a is None else a[index]  # noqa: E731
        return HeadCondition(pick(self.z), pick(self.z_uncond), pick(self.cfg))


class GaussianChain(Protocol):
    """A token head seen as a chain of Gaussian transitions."""

    token_dim: int

    def num_steps(self) -> int:
        """T, the number of transitions (the last one noise-free)."""

    def transition(self, y: Tensor, step: int | Tensor, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        """Mean and standard deviation (before temperature) of transition ``step`` at states y.

        y: (n, d); step: an int for all rows or an (n,) tensor; returns two (n, d) tensors.
        """


@dataclass(frozen=True)
class ChainNoise:
    """All the randomness of n chains: xi (n, d) and eps (T-1, n, d)."""

    xi: Tensor
    eps: Tensor

    def select(self, index: Tensor) -> ChainNoise:
        return ChainNoise(self.xi[index], self.eps[:, index])


@dataclass(frozen=True)
class Trajectory:
    """One run of a chain for n tokens.

    x: (n, d) the token. states: (T, n, d), states[k] is the input of transition k (states[0] = xi).
    mean, std: (T, n, d) mean and standard deviation of every transition, std including the
    temperature (it is the std actually used for sampling; the last one is never sampled from,
    it is the Gaussian the learned variance defines at the noise-free step).
    """

    x: Tensor
    states: Tensor
    mean: Tensor
    std: Tensor

    @property
    def final_mean(self) -> Tensor:
        return self.mean[-1]

    @property
    def final_std(self) -> Tensor:
        return self.std[-1]

    def select(self, index: Tensor) -> Trajectory:
        return Trajectory(self.x[index], self.states[:, index], self.mean[:, index], self.std[:, index])


def standard_noise(n: int, d: int, num_steps: int, generator: torch.Generator, device, dtype) -> ChainNoise:
    """Noise for n chains from one generator (tests and single-stream use)."""
    xi = torch.randn((n, d), generator=generator, device=device, dtype=dtype)
    eps = torch.randn((num_steps - 1, n, d), generator=generator, device=device, dtype=dtype)
    return ChainNoise(xi, eps)


def run_chain(head: GaussianChain, cond: HeadCondition, noise: ChainNoise, temperature: float = 1.0) -> Trajectory:
    """Sample n tokens with the given noise; one head call per transition, vectorised over rows."""
    steps = head.num_steps()
    if noise.eps.shape[0] != steps - 1:
        raise ValueError(f"noise has {noise.eps.shape[0]} eps steps, the head needs {steps - 1}")
    y = noise.xi
    states, means, stds = [], [], []
    for k in range(steps):
        mu, sd = head.transition(y, k, cond)
        sd = sd * temperature
        states.append(y)
        means.append(mu)
        stds.append(sd)
        y = mu + sd * noise.eps[k] if k < steps - 1 else mu
    return Trajectory(x=y, states=torch.stack(states), mean=torch.stack(means), std=torch.stack(stds))


def evaluate_path(
    head: GaussianChain, cond: HeadCondition, states: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Every transition of ``head`` at the given states, in one batched call.

    states: (T, n, d) (e.g. another model's trajectory). Returns mean, std (T, n, d), std with
    temperature. Used by the exact criterion, where the draft path is known in advance.
    """
    steps, n, d = states.shape
    step_idx = torch.arange(steps, device=states.device).repeat_interleave(n)  # (T*n,)
    mu, sd = head.transition(states.reshape(steps * n, d), step_idx, cond.repeat(steps))
    return mu.reshape(steps, n, d), sd.reshape(steps, n, d) * temperature
