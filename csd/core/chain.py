"""Gaussian token chains: the common shape of a diffusion or flow token head.

A head turns a condition z into a token through T Gaussian transitions

    y_0 = xi,   y_{k+1} = mu_k(y_k) + tau * sigma_k(y_k) * eps_k   (k < T-1),   x = mu_{T-1}(y_{T-1})

(step k counts transitions in the order they are applied; the last one is noise-free, as in
MAR). Anything implementing :class:`GaussianChain` can be drafted, verified and resampled.
The noise is always an argument, so draft and target can share it (trajectory alignment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor


def cat_rows(parts: list[Tensor], batch: int, dim: int = 0) -> Tensor:
    """Concatenate per-step row tensors (rows image-major within each step, along ``dim``) into
    image-major rows over all the steps: image 0's rows of every step, then image 1's, ..."""
    # the row count is given, not inferred, so a part with no leading entries (a one-transition chain's
    # eps: zero steps) reshapes too
    split = [p.reshape(*p.shape[:dim], batch, p.shape[dim] // batch, *p.shape[dim + 1 :]) for p in parts]
    joined = torch.cat(split, dim=dim + 1)
    return joined.reshape(*joined.shape[:dim], batch * joined.shape[dim + 1], *joined.shape[dim + 2 :])


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
    # What a head makes of these rows once and reads at every transition of their chain (its embedding of
    # them), by the head's key: see :meth:`derived`.
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def rows(self) -> int:
        return int(self.z.shape[0])

    def derived(self, key, make: Callable[[HeadCondition], Tensor]) -> Tensor:
        """``make(self)``, made once per ``key`` and kept with this condition (a chain's transitions share it)."""
        if key not in self._derived:
            self._derived[key] = make(self)
        return self._derived[key]

    def repeat(self, times: int) -> HeadCondition:
        """The condition tiled ``times`` times along rows (to evaluate T steps in one call)."""
        rep = lambda a: None if a is None else a.repeat(times, *([1] * (a.dim() - 1)))
        return HeadCondition(rep(self.z), rep(self.z_uncond), rep(self.cfg))

    def select(self, index: Tensor) -> HeadCondition:
        pick = lambda a: None if a is None else a[index]
        return HeadCondition(pick(self.z), pick(self.z_uncond), pick(self.cfg))

    @staticmethod
    def join(conds: list[HeadCondition], batch: int) -> HeadCondition:
        """The conditions of several AR steps as one, rows image-major (:func:`cat_rows`)."""
        pick = lambda name: (
            None if getattr(conds[0], name) is None else cat_rows([getattr(c, name) for c in conds], batch)
        )
        return HeadCondition(pick("z"), pick("z_uncond"), pick("cfg"))


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

    @staticmethod
    def join(noises: list[ChainNoise], batch: int) -> ChainNoise:
        return ChainNoise(cat_rows([z.xi for z in noises], batch), cat_rows([z.eps for z in noises], batch, dim=1))


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

    @staticmethod
    def join(trajs: list[Trajectory], batch: int) -> Trajectory:
        return Trajectory(
            x=cat_rows([t.x for t in trajs], batch),
            states=cat_rows([t.states for t in trajs], batch, dim=1),
            mean=cat_rows([t.mean for t in trajs], batch, dim=1),
            std=cat_rows([t.std for t in trajs], batch, dim=1),
        )


def standard_noise(n: int, d: int, num_steps: int, generator: torch.Generator, device, dtype) -> ChainNoise:
    """Noise for n chains from one generator (tests and single-stream use)."""
    xi = torch.randn((n, d), generator=generator, device=device, dtype=dtype)
    eps = torch.randn((num_steps - 1, n, d), generator=generator, device=device, dtype=dtype)
    return ChainNoise(xi, eps)


def run_chain(head: GaussianChain, cond: HeadCondition, noise: ChainNoise, temperature: float = 1.0) -> Trajectory:
    """Sample n tokens with the given noise: the head's own fused sampler where it has one (``head.sample``,
    the same numbers up to float rounding), else :func:`run_transitions`."""
    sample = getattr(head, "sample", None)
    traj = None if sample is None else sample(cond, noise, temperature)
    return run_transitions(head, cond, noise, temperature) if traj is None else traj


def run_transitions(
    head: GaussianChain, cond: HeadCondition, noise: ChainNoise, temperature: float = 1.0
) -> Trajectory:
    """Sample n tokens with the given noise; one head call per transition, vectorised over rows: the reference
    every fused sampler is tested against."""
    steps = head.num_steps()
    if noise.eps.shape[0] != steps - 1:
        raise ValueError(f"noise has {noise.eps.shape[0]} eps steps, the head needs {steps - 1}")
    y = noise.xi
    states, means, stds = [], [], []
    for k in range(steps):
        mu, sd = head.transition(y, k, cond)
        sd = sd if temperature == 1.0 else sd * temperature  # x * 1.0 is x: no copy
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
    sd = sd.reshape(steps, n, d)
    return mu.reshape(steps, n, d), sd if temperature == 1.0 else sd * temperature


@dataclass(frozen=True)
class HeadChain:
    """A :class:`GaussianChain` bound to the conditions of its rows and a temperature: the
    :class:`csd.family.TokenChain` of every family whose head is a separate chain (MAR, Harmon)."""

    head: GaussianChain
    cond: HeadCondition
    temperature: float = 1.0

    @property
    def rows(self) -> int:
        return self.cond.rows

    def num_steps(self) -> int:
        return self.head.num_steps()

    def run(self, noise: ChainNoise) -> Trajectory:
        return run_chain(self.head, self.cond, noise, self.temperature)

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        return evaluate_path(self.head, self.cond, states, self.temperature)

    def select(self, rows: Tensor) -> HeadChain:
        return HeadChain(self.head, self.cond.select(rows), self.temperature)
