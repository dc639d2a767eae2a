"""xAR's flow samplers (the official Euler-Maruyama one, the probability-flow ODE) as Gaussian chains over
cells (:class:`csd.family.TokenChain`): one cell per image (an AR step), a drafted block's cells at once
(block verification), the draft's per-step chains joined into one, and some rows of a block (the exact
criterion's resampler)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from csd.core.chain import ChainNoise, Trajectory, run_chain
from csd.core.checks import check_choice
from csd.models.kernels import compiled, kernels_for
from csd.settings import FLOW_GRIDS

FLOW_SAMPLERS = ("euler-maruyama", "euler", "heun")


def flow_times(num_steps: int, grid: str = "official") -> Tensor:
    """The ``num_steps + 1`` times of a flow chain (float64), from 1 to 0: the official grid, ``num_steps``
    times from 1 to 0.04 then 0 (num_steps - 1 stochastic steps and a deterministic last one), or the
    uniform one, num_steps equal steps. At 25 steps the two are one grid (steps of 0.96 / 24 = 1 / 25)."""
    if not isinstance(num_steps, int) or num_steps < 2:
        raise ValueError(f"flow steps must be an int >= 2, got {num_steps!r}")
    check_choice("flow_grid", grid, FLOW_GRIDS)
    if grid == "uniform":
        return torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return torch.cat([torch.linspace(1.0, 0.04, num_steps, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])


@functools.cache
def flow_time_floats(num_steps: int, grid: str = "official") -> tuple[float, ...]:
    """:func:`flow_times` as Python floats, made once per grid: what every transition reads on the host."""
    return tuple(flow_times(num_steps, grid).tolist())


@dataclass(frozen=True)
class CellCondition:
    """What the chains of ``cells`` consecutive cells per image, from cell ``first``, are conditioned on:
    labels (B,), the cache of every clean cell before the last of them (the context, then the drafted
    cells; of the doubled batch [labels; null] when guided) and the guidance scale per row (B * cells,)."""

    labels: Tensor
    first: int
    cells: int
    cache: list | None
    cfg: Tensor | None = None  # None: unguided

    def attention_mask(self, cell_len: int, device, dtype: torch.dtype = torch.float32) -> Tensor | None:
        """Drafted cell j attends to the clean cells before it and to itself: (1, 1, Q, K) additive, in the
        queries' ``dtype`` (scaled_dot_product_attention misreads a float32 mask beside float64 queries), made
        once per block shape: every velocity call of a chain reads it; never written."""
        if self.cells == 1:
            return None  # all of the cache is earlier
        # (an inference tensor is kept apart: autograd may not save one)
        inference = torch.is_inference_mode_enabled()
        return _block_mask(self.first, self.cells, cell_len, torch.device(device), inference, dtype)

    def positions(self, cell_len: int) -> slice:
        """Where the chains' tokens sit in the cell order."""
        return slice(self.first * cell_len, (self.first + self.cells) * cell_len)


@functools.lru_cache(maxsize=256)
def _block_mask(first: int, cells: int, cell_len: int, device: torch.device, inference: bool, dtype) -> Tensor:
    clean = first + cells - 1
    query_cell = first + torch.arange(cells * cell_len, device=device) // cell_len  # absolute
    clean_cell = torch.arange(clean * cell_len, device=device) // cell_len
    own = torch.arange(cells * cell_len, device=device) // cell_len
    allowed = torch.cat([clean_cell[None] < query_cell[:, None], own[None] == (query_cell[:, None] - first)], dim=1)
    return torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))[None, None]


class CellFlow:
    """xAR's flow sampler as a :class:`csd.core.chain.GaussianChain` over flattened cells (cell_len * d per row;
    rows image-major), on the times of :func:`flow_times`. v is the velocity, guided on the doubled batch
    as v_u + cfg (v_c - v_u). At time t with step dt < 0, the official Euler-Maruyama sampler

        mu = y + dt ((2 - t) v + y),   sigma = sqrt(2 t |dt|)   (N - 1 steps),   x = mu at the last,

    or the probability-flow ODE of the same velocity (``sampler`` "euler": mu = y + dt v; "heun": the
    trapezoid of v at (y, t) and at the Euler point (y + dt v, t + dt), two velocity calls a step), with
    sigma 0 before the last step. Every sampler reports the last step's sigma by the same formula (at
    t = 0.04 on the official grid) as the final token's width. sigma does not depend on the model.
    Several cells per image advance together, one backbone pass per velocity call (block verification).
    States are float64 (as the official sampler's); the network runs in its dtype, under autocast when
    ``precision`` (a lower backbone precision, :data:`csd.config.PRECISIONS`) is given, and compiled
    (:func:`flow_network` through torch.compile: each block's RMSNorm, modulation, gate and residual fused
    around its products) where the model's kernels say so (:func:`csd.models.kernels.kernels_for`: by
    default on CUDA)."""

    def __init__(
        self,
        model: nn.Module,
        num_steps: int,
        precision: torch.dtype | None = None,
        sampler: str = "euler-maruyama",
        grid: str = "official",
    ):
        check_choice("head_sampler (a flow chain's)", sampler, FLOW_SAMPLERS)
        self.model, self.times = model, flow_times(num_steps, grid)  # an xAR network (csd.models.xar.network.XAR)
        self._times = flow_time_floats(num_steps, grid)  # read at every transition, as Python floats
        self.token_dim, self.precision, self.sampler = model.token_dim, precision, sampler
        # the chains' tokens and statistics come out in the run's dtype: float64 for a float64 model
        self.out_dtype = torch.float64 if model.z_proj.weight.dtype == torch.float64 else torch.float32
        kernels = kernels_for(model.z_proj.weight.device, getattr(model, "kernels", None))
        self.network = compiled(flow_network) if kernels.compiled else flow_network

    def num_steps(self) -> int:
        return len(self.times) - 1

    def velocity(self, x: Tensor, t: float, cond: CellCondition) -> Tensor:
        """The guided velocity (float64) of the block's cells at tokens x (B, k * cell_len, d) and time t."""
        m, c = self.model, self.model.config
        b, k = cond.labels.shape[0], cond.cells
        dtype, dev = m.z_proj.weight.dtype, x.device
        positions, mask = cond.positions(c.cell_len), cond.attention_mask(c.cell_len, dev, dtype)

        def net(xx: Tensor, labels: Tensor) -> Tensor:
            with torch.autocast(dev.type, dtype=self.precision or torch.float32, enabled=self.precision is not None):
                times = xx.new_full((xx.shape[0], k), t, dtype=dtype)
                tokens = m.cell_conditions(labels, times).repeat_interleave(c.cell_len, dim=1)  # (B, L, D)
                v = self.network(m, xx.to(dtype), tokens, positions.start, positions.stop, mask, cond.cache)
                return v.to(torch.float64)

        if cond.cfg is None:
            return net(x, cond.labels)
        vv = net(torch.cat([x, x]), torch.cat([cond.labels, torch.full_like(cond.labels, m.null_class)]))
        v_c, v_u = vv[:b], vv[b:]
        scale = cond.cfg.to(torch.float64).reshape(b, k).repeat_interleave(c.cell_len, dim=1)[..., None]
        return v_u + scale * (v_c - v_u)

    def transition(self, y: Tensor, step: int, cond: CellCondition) -> tuple[Tensor, Tensor]:
        c = self.model.config
        t, t_next = self._times[step], self._times[step + 1]
        dt, b, k = t_next - t, cond.labels.shape[0], cond.cells
        x = y.reshape(b, k * c.cell_len, c.token_dim)
        v = self.velocity(x, t, cond)
        x64 = x.to(torch.float64)
        if self.sampler == "euler-maruyama":
            mu = (x64 + dt * ((2.0 - t) * v + x64)).reshape(b * k, -1)
        elif self.sampler == "euler":
            mu = (x64 + dt * v).reshape(b * k, -1)
        else:  # heun
            mu = (x64 + 0.5 * dt * (v + self.velocity(x64 + dt * v, t_next, cond))).reshape(b * k, -1)
        # The last step is deterministic (never sampled from); its std, by the same formula at its t, is the
        # width the acceptance test's final-step term and the resampler give the final token.
        stochastic = self.sampler == "euler-maruyama" or step == self.num_steps() - 1
        return mu, torch.full_like(mu, math.sqrt(2.0 * t * abs(dt)) if stochastic else 0.0)


def flow_network(
    model: nn.Module, x: Tensor, cond: Tensor, start: int, stop: int, mask: Tensor | None, cache
) -> Tensor:
    """xAR's encoder-decoder (``model._trunk``) on tokens x at the cells ``[start, stop)`` of the cell order,
    under every token's cell condition ``cond`` (B, L, D): the step function a compiled flow chain runs (ints,
    not a slice, so that the position can vary in one graph; the condition's float32 time embedding made
    outside, as the eager run makes it)."""
    return model._trunk(x, cond, slice(start, stop), mask, cache)


@dataclass(frozen=True)
class CellChain:
    """The :class:`csd.family.TokenChain` of ``cond.cells`` cells per image (rows image-major)."""

    flow: CellFlow
    cond: CellCondition
    temperature: float = 1.0

    @property
    def rows(self) -> int:
        return int(self.cond.labels.shape[0]) * self.cond.cells

    def num_steps(self) -> int:
        return self.flow.num_steps()

    def run(self, noise: ChainNoise) -> Trajectory:
        noise = ChainNoise(noise.xi.to(torch.float64), noise.eps.to(torch.float64))  # float64 states
        traj = run_chain(self.flow, self.cond, noise, self.temperature)
        # float64 inside the chain; the run's dtype out, as every other family's tokens and statistics
        out = self.flow.out_dtype
        return Trajectory(x=traj.x.to(out), states=traj.states.to(out), mean=traj.mean.to(out), std=traj.std.to(out))

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """Every transition at another path's states (T, rows, d): one pass per step."""
        out = [self.flow.transition(states[k].to(torch.float64), k, self.cond) for k in range(states.shape[0])]
        mean, std = torch.stack([mu for mu, _ in out]), torch.stack([sd for _, sd in out]) * self.temperature
        return mean.to(self.flow.out_dtype), std.to(self.flow.out_dtype)

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self, rows)


@dataclass(frozen=True)
class JoinedCells:
    """The draft's chains of a block, one AR step (one cell per image) each, as one chain whose rows are
    image-major over the block: row b * k + j is image b's cell j, a row of ``chains[j]``."""

    chains: tuple

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chains)

    def num_steps(self) -> int:
        return self.chains[0].num_steps()

    def _split(self, x: Tensor) -> list[Tensor]:  # (..., B * k, d) -> k of (..., B, d)
        k = len(self.chains)
        return list(x.reshape(*x.shape[:-2], -1, k, x.shape[-1]).unbind(-2))

    @staticmethod
    def _merge(parts: list[Tensor]) -> Tensor:  # k of (..., B, d) -> (..., B * k, d)
        x = torch.stack(parts, dim=-2)
        return x.reshape(*x.shape[:-3], -1, x.shape[-1])

    def run(self, noise: ChainNoise) -> Trajectory:
        xis, epss = self._split(noise.xi), self._split(noise.eps)
        trajs = [c.run(ChainNoise(xi, eps)) for c, xi, eps in zip(self.chains, xis, epss, strict=True)]
        return Trajectory(*(self._merge([getattr(t, f) for t in trajs]) for f in ("x", "states", "mean", "std")))

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        out = [c.evaluate(s) for c, s in zip(self.chains, self._split(states), strict=True)]
        return self._merge([m for m, _ in out]), self._merge([s for _, s in out])

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self, rows)


@dataclass(frozen=True)
class SelectedCells:
    """Some rows of a block's chains (the exact criterion resamples the rejected ones). The rows of a
    block are independent given its clean cells (a noisy cell attends to the clean cells and to itself
    only), so the whole chain runs with the other rows' noise (states) at zero and the selected rows
    are kept: the same numbers as the rows alone, at the cost of the whole block."""

    chain: CellChain | JoinedCells
    index: Tensor  # (m,) rows of ``chain``

    @property
    def rows(self) -> int:
        return int(self.index.numel())

    def num_steps(self) -> int:
        return self.chain.num_steps()

    def _pad(self, x: Tensor) -> Tensor:  # (..., m, d) -> (..., chain.rows, d), zeros elsewhere
        full = x.new_zeros(*x.shape[:-2], self.chain.rows, x.shape[-1])
        full[..., self.index, :] = x
        return full

    def run(self, noise: ChainNoise) -> Trajectory:
        return self.chain.run(ChainNoise(self._pad(noise.xi), self._pad(noise.eps))).select(self.index)

    def evaluate(self, states: Tensor) -> tuple[Tensor, Tensor]:
        mean, std = self.chain.evaluate(self._pad(states))
        return mean[:, self.index], std[:, self.index]

    def select(self, rows: Tensor) -> SelectedCells:
        return SelectedCells(self.chain, self.index[rows])
