"""MAR's token head: an MLP with AdaLN conditioning (``SimpleMLPAdaLN``) plus Gaussian diffusion.

Parameter names follow the official checkpoints (``diffloss.net.*``) so they load unchanged.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
from torch import Tensor, nn

from csd.core.chain import ChainNoise, HeadCondition, Trajectory
from csd.core.checks import check_choice, check_int
from csd.models import diffusion as gd
from csd.models.kernels import (
    HeadKernels,
    compiled,
    copy_padded,
    kernels_for,
    product_dtype,
    rows_bucket,
    take_rows,
)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding of (n,) timesteps -> (n, dim), [cos | sin] halves."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class ResBlock(nn.Module):
    """LayerNorm -> AdaLN modulation -> MLP, gated residual."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class MLPAdaLN(nn.Module):
    """The head network: (x_t (n, d), t (n,), z (n, D)) -> (n, out) (MAR: out = 2d, [eps | variance value];
    NextStep-1's flow head: out = d, the velocity)."""

    def __init__(
        self,
        token_dim: int,
        z_dim: int,
        width: int,
        depth: int,
        out_channels: int | None = None,
        time_embedder: type[TimestepEmbedder] | None = None,
    ):
        super().__init__()
        self.token_dim = token_dim
        self.time_embed = (time_embedder or TimestepEmbedder)(width)
        self.cond_embed = nn.Linear(z_dim, width)
        self.input_proj = nn.Linear(token_dim, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * token_dim if out_channels is None else out_channels)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        # Zero-initialised modulation and output: every block starts as the identity.
        for block in self.res_blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for p in (*self.final_layer.adaLN_modulation[-1].parameters(), *self.final_layer.linear.parameters()):
            nn.init.zeros_(p)

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        return self.forward_embedded(x, self.time_embed(t) + self.cond_embed(z))

    def forward_embedded(self, x: Tensor, y: Tensor) -> Tensor:
        """The network given its conditioning y = time_embed(t) + cond_embed(z) (n, width): a chain's
        transitions share the condition's embedding, and a chain's rows one timestep's."""
        h = self.input_proj(x)
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)


class StepEmbeddings:
    """The network's time embedding of one timestep over ``rows`` rows, kept once made: a chain's transition
    embeds one timestep for all of its rows, and the AR steps of a generation repeat those shapes. The same
    numbers as embedding it again (the same call on an equal input), kept per version of the embedder's
    weights (training them, or loading others, makes new ones); at most ``size`` are kept."""

    def __init__(self, embedder: TimestepEmbedder, size: int = 512):
        self.embedder, self.size = embedder, size
        self._weights = tuple(embedder.parameters())  # listed once: listing them per call costs more than a step
        self._kept: dict[tuple, Tensor] = {}

    def __call__(self, timestep: int, rows: int, device: torch.device) -> Tensor:
        weights = tuple((p._version, p.data_ptr(), p.dtype) for p in self._weights)
        key = (timestep, rows, device, weights, torch.is_inference_mode_enabled())
        out = self._kept.get(key)
        if out is None:
            if len(self._kept) >= self.size:
                self._kept.clear()
            out = self._kept[key] = self.embedder(torch.full((rows,), timestep, device=device))
        return out


class DiffusionHead(nn.Module):
    """MAR's DiffLoss: the network plus its diffusion process.

    :meth:`chain` gives a :class:`~csd.core.chain.GaussianChain` view for a number of sampling steps;
    views share the network and hold no mutable state, so concurrent users cannot disturb each
    other by choosing different step counts.
    """

    def __init__(
        self,
        token_dim: int,
        z_dim: int,
        width: int,
        depth: int,
        sampling_steps: int = 100,
        train_steps: int = 1000,
        clip_x0: float | None = None,
    ):
        super().__init__()
        self.token_dim = token_dim
        self.net = MLPAdaLN(token_dim, z_dim, width, depth)
        self.train_steps = train_steps
        self.sampling_steps = sampling_steps
        self.clip_x0 = clip_x0
        self.train_schedule = gd.Schedule.cosine(train_steps)
        self._schedules: dict[int, gd.Schedule] = {}
        self._step_embeddings = StepEmbeddings(self.net.time_embed)  # shared by every chain of this head
        self.kernels: HeadKernels | None = None  # None: the device's default (csd.models.kernels.kernels_for)
        self.graphs = ChainGraphs()

    def use_kernels(self, kernels: HeadKernels | None) -> None:
        """Run this head's DDPM chains with ``kernels`` (:class:`csd.models.kernels.HeadKernels`: compiled steps,
        CUDA graphs; :data:`csd.models.kernels.EAGER` op by op) on every device, or None: the device's
        default. Drops the graphs captured so far (made again for new weights)."""
        self.kernels, self.graphs = kernels, ChainGraphs()

    def chain(
        self, steps: int | None = None, sampler: str = "ddpm", eta: float = 0.0, autocast: torch.dtype | None = None
    ) -> DiffusionChain:
        """The head at ``steps`` sampling steps (None: its default) with ``sampler`` "ddpm" (the trained
        one) or "ddim" (with ``eta``); ``autocast``: the run's autocast dtype, which a compiled head's products
        take (:func:`csd.models.kernels.product_dtype`)."""
        steps = self.sampling_steps if steps is None else steps
        check_int("head_steps", steps, 1, self.train_steps)
        check_choice("head_sampler (a diffusion head's)", sampler, ("ddpm", "ddim"))
        if steps not in self._schedules:  # a benign race: both writers store equal schedules
            self._schedules[steps] = gd.Schedule.cosine(self.train_steps, steps)
        eta = None if sampler == "ddpm" else eta
        chain = DiffusionChain(self.net, self._schedules[steps], self.clip_x0, eta, self._step_embeddings)
        chain.kernels, chain.graphs, chain.autocast = self.kernels, self.graphs, autocast
        return chain

    # --- training ------------------------------------------------------------------------------

    def loss(
        self,
        x0: Tensor,
        z: Tensor,
        generator: torch.Generator | None = None,
        teacher: tuple[DiffusionHead, Tensor] | None = None,
        distill_weight: float = 1.0,
    ) -> Tensor:
        """Per-row training loss (n,) for tokens x0 (n, d) under conditions z (n, D).

        teacher: another head and its conditions (n, D') for the same tokens; adds ``distill_weight``
        times :func:`csd.models.diffusion.distill_loss` towards its output at the same (x_t, t)."""
        n = x0.shape[0]
        t = torch.randint(0, self.train_steps, (n,), generator=generator, device=x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        x_t = gd.q_sample(self.train_schedule, x0, t, noise)
        out = self.net(x_t, t, z)
        loss = gd.diffusion_loss(self.train_schedule, out, x0, x_t, t, noise)
        if teacher is None:
            return loss
        head, teacher_z = teacher
        with torch.no_grad():
            ref = head.net(x_t, t, teacher_z)
        return loss + distill_weight * gd.distill_loss(self.train_schedule, out, ref.to(out.dtype), t)


class DiffusionChain:
    """A diffusion head at a fixed number of sampling steps, seen as a Gaussian chain: DDPM's transitions
    (learned variance), or DDIM's with ``ddim_eta`` (None: DDPM), whose std is eta times the posterior's
    and does not depend on the model; DDIM's last transition reports DDPM's learned std at t = 0 (the
    two last means are both x0), the width the acceptance test gives the final token."""

    def __init__(
        self,
        net: MLPAdaLN,
        schedule: gd.Schedule,
        clip_x0: float | None,
        ddim_eta: float | None = None,
        step_embeddings: StepEmbeddings | None = None,
    ):
        self.net, self.schedule, self.clip_x0, self.ddim_eta = net, schedule, clip_x0, ddim_eta
        self.token_dim = net.token_dim
        self.step_embeddings = step_embeddings or StepEmbeddings(net.time_embed)
        self.kernels: HeadKernels | None = None  # None: the device's default
        self.graphs = ChainGraphs()  # its CUDA graphs (a head's chains share the head's)
        self.autocast: torch.dtype | None = None  # the run's autocast dtype

    def num_steps(self) -> int:
        return self.schedule.num_steps

    def eps_and_var(self, y: Tensor, t: int | Tensor, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        """Guided eps and the (conditional) variance value at diffusion index t. All (n, d). One network call
        for both branches (the chain state is shared, the variance is the conditional one). The network's
        embedding of the condition is made once per condition (every transition of its chain reads it), of
        an int t's timestep once per row count: the numbers of the network's own forward."""
        d, guided = self.token_dim, cond.z_uncond is not None
        x = torch.cat([y, y]) if guided else y
        if isinstance(t, int):
            time = self.step_embeddings(self.schedule.timesteps[t], x.shape[0], x.device)
        else:
            tt = gd.model_timesteps(self.schedule, t, y.shape[0], y.device)
            time = self.net.time_embed(torch.cat([tt, tt]) if guided else tt)
        out = self.net.forward_embedded(x, time + cond.derived(self.net, self._embed_condition))
        if not guided:
            return out[:, :d], out[:, d:]
        out_c, out_u = out.chunk(2)
        scale = cond.cfg if cond.cfg is not None else 1.0
        return gd.guide_eps(out_c[:, :d], out_u[:, :d], scale), out_c[:, d:]

    def _embed_condition(self, cond: HeadCondition) -> Tensor:
        """The network's embedding of a condition's rows: (n, width), or (2n, width) for [z; z_uncond]."""
        return self.net.cond_embed(cond.z if cond.z_uncond is None else torch.cat([cond.z, cond.z_uncond]))

    def sample(self, cond: HeadCondition, noise: ChainNoise, temperature: float = 1.0) -> Trajectory | None:
        """The whole chain of ``cond``'s rows in one call: the numbers of :func:`csd.core.chain.run_chain` (up to
        float rounding) at a fraction of its op calls (:class:`FusedSampler`), its steps compiled and the
        chain one CUDA graph where the device's kernels say so (:func:`csd.models.kernels.kernels_for`); None
        for DDIM and where autograd records (it writes into buffers), which the transition loop runs."""
        if self.ddim_eta is not None or torch.is_grad_enabled():
            return None
        kernels = kernels_for(noise.xi.device, self.kernels)
        products = product_dtype(self.autocast, kernels)
        if kernels.graphs:
            return self.graphs.run(self, cond, noise, temperature, kernels, products)
        return FusedSampler(self, cond, kernels.compiled, products).run(noise, temperature)

    def transition(self, y: Tensor, step: int | Tensor, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        t = self.num_steps() - 1 - step  # transition k runs at diffusion index T-1-k
        eps, v = self.eps_and_var(y, t, cond)
        if self.ddim_eta is None:
            mean, logvar = gd.p_mean_logvar(self.schedule, y, t, eps, v, self.clip_x0)
            return mean, (0.5 * logvar).exp()
        mean, std = gd.ddim_mean_std(self.schedule, y, t, eps, self.ddim_eta, self.clip_x0)
        final = (0.5 * gd.learned_log_variance(self.schedule, v, t)).exp()
        return mean, torch.where(torch.as_tensor(t, device=y.device).reshape(-1, 1) == 0, final, std)


# Elements of modulation kept at once by FusedSampler: (steps x rows x width x (3 x depth + 2)) is made in
# chunks of steps under this, so a large batch of a wide head does not hold every step's at once.
MODULATION_ELEMENTS = 1 << 22


class FusedSampler:
    """A DDPM :class:`DiffusionChain` run from noise to token with as few op calls as the arithmetic allows.

    What the transition-by-transition loop recomputes at every step is made once per chain, over all its steps
    in one product per layer: the time-plus-condition embedding's SiLU, each block's AdaLN shift, scale and
    gate, with the LayerNorm's affine folded into them (``(g x + b)(1 + s) + h = x (g (1 + s)) + (b (1 + s) +
    h)``). A transition is then the network's own products and a handful of fused element-wise ops: the
    unguided and guided halves share the input projection and the first LayerNorm (they read the same
    state), the guided eps is one ``lerp``, DDPM's posterior mean two ops and its learned std three (``exp(v
    (log b - log p) / 4 + (log b + log p) / 4)``), the next state one ``addcmul``, each written straight into
    the trajectory's (T, n, d) buffers. Only the conditional half's variance is computed (the only one read).

    The same arithmetic as the loop up to reassociation: float64 runs agree to ~1e-15, float32 runs within
    float32 rounding (``tests/models/test_fast_paths.py``).

    ``compiled``: each transition is :func:`ddpm_step` through torch.compile (its coefficients a row of a
    tensor, so one graph serves every step), the network's element-wise ops fused around its products;
    ``products``: the dtype of the network's and the modulations' products (None: the weights'), their
    weights cast once per chain, every other op in the weights' dtype."""

    def __init__(
        self, chain: DiffusionChain, cond: HeadCondition, compiled: bool = False, products: torch.dtype | None = None
    ):
        net = chain.net
        self.chain, self.cond, self.net, self.compiled = chain, cond, net, compiled
        self.groups = 1 if cond.z_uncond is None else 2  # G: conditional rows, then unconditional ones
        self.rows = cond.rows  # n per group
        d, width = net.token_dim, net.input_proj.out_features
        self.width, self.dtype = width, net.input_proj.weight.dtype
        self.products = None if products == self.dtype else products
        self.mm = torch.addmm if self.products is None else self._low_addmm
        low = self._low
        self.input = low(net.input_proj.bias, net.input_proj.weight.t())
        self.blocks = [
            (b.in_ln, low(b.mlp[0].bias, b.mlp[0].weight.t()), low(b.mlp[2].bias, b.mlp[2].weight.t()))
            for b in net.res_blocks
        ]
        final = net.final_layer.linear
        self.eps_out = low(final.bias[:d], final.weight[:d].t())
        self.var_out = (final.bias[d:], final.weight[d:].t())
        self.eps_ln = net.final_layer.norm_final.eps

    def _low(self, bias: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        """A layer's (bias, weight) in the products' dtype."""
        return (bias, weight) if self.products is None else (bias.to(self.products), weight.to(self.products))

    def _low_addmm(self, bias: Tensor, x: Tensor, weight: Tensor) -> Tensor:
        """``bias + x @ weight`` in the products' dtype (bias and weight already in it), back in the weights'."""
        return torch.addmm(bias, x.to(self.products), weight).to(self.dtype)

    def modulations(self, steps: range) -> list[Tensor]:
        """For transitions ``steps``: per block its shift and scale (LayerNorm affine folded in) and gate, then
        the final layer's shift and 1 + scale; contiguous, (len(steps), G, n, width) for the first block (its
        input is one state for both groups) and (len(steps), G n, width) for the others."""
        chain, net, cond = self.chain, self.net, self.cond
        r = self.groups * self.rows
        device = cond.z.device
        tsteps = chain.schedule.timesteps
        last = chain.num_steps() - 1
        time = torch.stack([chain.step_embeddings(tsteps[last - k], r, device) for k in steps])  # (S, R, W)
        y = nn.functional.silu(time + cond.derived(net, chain._embed_condition))  # (S, R, W)
        flat = y.reshape(-1, self.width)
        out = []
        for j, block in enumerate(net.res_blocks):
            lin = block.adaLN_modulation[1]
            shape = (len(steps), self.groups, self.rows, -1) if j == 0 else (len(steps), r, -1)
            bias, weight = self._low(lin.bias, lin.weight.t())
            shift, scale, gate = self.mm(bias, flat, weight).reshape(shape).chunk(3, dim=-1)
            one_scale = scale + 1.0
            ln = block.in_ln
            shift = torch.addcmul(shift, ln.bias, one_scale)  # before one_scale takes the LayerNorm's gain
            out += [shift, one_scale.mul_(ln.weight), gate.contiguous()]
        lin = net.final_layer.adaLN_modulation[1]
        bias, weight = self._low(lin.bias, lin.weight.t())
        shift, scale = self.mm(bias, flat, weight).reshape(len(steps), r, -1).chunk(2, dim=-1)
        return out + [shift.contiguous(), scale.add(1.0)]

    def chunks(self) -> list[range]:
        depth = len(self.net.res_blocks)
        per_step = self.groups * self.rows * self.width * (3 * depth + 2)
        size = max(1, MODULATION_ELEMENTS // max(per_step, 1))
        steps = self.chain.num_steps()
        return [range(a, min(a + size, steps)) for a in range(0, steps, size)]

    def run(self, noise: ChainNoise, temperature: float = 1.0) -> Trajectory:
        steps, n = self.chain.num_steps(), self.rows
        if noise.eps.shape[0] != steps - 1:
            raise ValueError(f"noise has {noise.eps.shape[0]} eps steps, the head needs {steps - 1}")
        xi = noise.xi
        states = xi.new_empty((steps, *xi.shape))
        means, stds = torch.empty_like(states), torch.empty_like(states)
        states[0] = xi
        guide = None
        if self.groups == 2:
            cfg = self.cond.cfg
            guide = 1.0 if cfg is None else cfg.to(xi.dtype).unsqueeze(-1)  # (n, 1)
        clip, coefficients = self.chain.clip_x0, self.chain.schedule.ddpm_coefficients
        state, mean, std, eps_noise = states.unbind(), means.unbind(), stds.unbind(), noise.eps.unbind()
        log_std = self.log_std_layers(temperature)
        step = None
        if self.compiled:
            step, coefs = compiled(ddpm_step), self.chain.schedule.step_coefficients(xi.dtype, xi.device)
            guide = xi.new_ones(n, 1) if isinstance(guide, float) else guide
        for chunk in self.chunks():
            mods = [m.unbind() for m in self.modulations(chunk)]
            for i, k in enumerate(chunk):
                if step is not None:
                    last = k == steps - 1
                    outs = (mean[k], std[k], None if last else state[k + 1])
                    noise_k = None if last else eps_noise[k]
                    layer = (log_std[0][k], log_std[1][k])
                    step(self.network, state[k], [m[i] for m in mods], coefs[k], clip, guide, layer, noise_k, outs)
                    continue
                y = state[k]
                eps, x = self.network(y, [m[i] for m in mods])
                if guide is not None:
                    eps = torch.lerp(eps[n:], eps[:n], guide)
                a, b, c1, c2, _, _ = coefficients[steps - 1 - k]
                x0 = torch.add(y * a, eps, alpha=-b)
                if clip is not None:
                    x0.clamp_(-clip, clip)
                torch.add(x0 * c1, y, alpha=c2, out=mean[k])
                torch.addmm(log_std[1][k], x[:n], log_std[0][k], out=std[k]).exp_()
                if k < steps - 1:
                    torch.addcmul(mean[k], std[k], eps_noise[k], out=state[k + 1])
        return Trajectory(x=means[-1], states=states, mean=means, std=stds)

    def log_std_layers(self, temperature: float) -> tuple[list[Tensor], list[Tensor]]:
        """Per transition k, the variance output layer with DDPM's learned range and the temperature folded in:
        weights (W, d) and bias (d,) giving log(temperature x std) = v p + q + log(temperature) from the final
        layer's input (v = x W_v^T + b_v, the variance value)."""
        bias, weight = self.var_out
        p, q = self.chain.schedule.log_std_coefficients(bias.dtype, bias.device).unbind(-1)  # (T,) each
        shift = q + math.log(temperature)
        return list((weight * p[:, None, None]).unbind()), list(
            torch.addcmul(shift[:, None], p[:, None], bias).unbind()
        )

    def network(self, y: Tensor, mods: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The head network at states y (n, d) under one step's modulations: eps (G n, d) and the final layer's
        input (G n, W), whose conditional half the variance layer reads."""
        g, n, width = self.groups, self.rows, self.width
        mm = self.mm
        h = mm(self.input[0], y, self.input[1])  # (n, W): both groups read the same state
        for j, (ln, (b1, w1), (b2, w2)) in enumerate(self.blocks):
            shift, scale, gate = mods[3 * j : 3 * j + 3]  # (G, n, W) in the first block, else (G n, W)
            x = nn.functional.layer_norm(h, (width,), None, None, ln.eps)
            x = torch.addcmul(shift, x, scale)
            u = nn.functional.silu(mm(b1, x.view(g * n, width) if j == 0 else x, w1), inplace=True)
            u = mm(b2, u, w2)
            if j == 0:  # the state's rows, shared by the groups, become each group's own
                h = torch.addcmul(h, gate, u.view(g, n, width)).view(g * n, width)
            else:
                h.addcmul_(gate, u)
        shift, one_scale = mods[-2:]
        x = nn.functional.layer_norm(h, (width,), None, None, self.eps_ln)
        x = torch.addcmul(shift, x, one_scale)
        return mm(self.eps_out[0], x, self.eps_out[1]), x


def ddpm_step(
    network: Callable[[Tensor, list[Tensor]], tuple[Tensor, Tensor]],
    y: Tensor,
    mods: list[Tensor],
    coefficients: Tensor,
    clip: float | None,
    guide: Tensor | None,
    log_std_layer: tuple[Tensor, Tensor],
    noise: Tensor | None,
    out: tuple[Tensor, Tensor, Tensor | None],
) -> None:
    """One DDPM transition of a :class:`FusedSampler`, written into ``out`` = (mean, std, next state): the
    network at states y (n, d) under one step's modulations, guidance as a lerp by ``guide`` (n, 1) (None:
    unguided), x0 = a y - b eps (clipped), mean = c1 x0 + c2 y with ``coefficients`` = (a, b, c1, c2) a (4,)
    tensor, std = exp(x W + c) by the folded variance layer ``log_std_layer`` = (W (width, d), c (d,)), and
    the next state mean + std noise (None: the last transition). Tensors only, so one compiled graph serves
    every step of every chain of a shape."""
    mean, std, state = out
    n = y.shape[0]
    eps, x = network(y, mods)
    if guide is not None:
        eps = torch.lerp(eps[n:], eps[:n], guide)
    a, b, c1, c2 = coefficients.unbind()
    x0 = y * a - eps * b
    if clip is not None:
        x0 = x0.clamp(-clip, clip)
    mean.copy_(x0 * c1 + y * c2)
    weight, bias = log_std_layer
    std.copy_(torch.addmm(bias, x[:n], weight).exp())
    if noise is not None:
        state.copy_(torch.addcmul(mean, std, noise))


def graph_key(
    chain: DiffusionChain,
    cond: HeadCondition,
    noise: ChainNoise,
    temperature: float,
    kernels: HeadKernels,
    products: torch.dtype | None,
) -> tuple:
    """What a captured chain is made for: its steps and schedule, its rows' bucket, guidance (and whether the
    scale is per row), the noise's dtype and device, the temperature (folded into the graph), compiled
    steps, products' dtype and clip. Chains whose keys are equal replay one graph."""
    guided, scaled = cond.z_uncond is not None, cond.cfg is not None
    bucket = rows_bucket(cond.rows, kernels.least_rows)
    shape = (chain.num_steps(), id(chain.schedule), bucket, guided, scaled, noise.xi.dtype, noise.xi.device)
    return (*shape, temperature, kernels.compiled, products, chain.clip_x0)


class ChainGraphs:
    """A diffusion head's fused chains as CUDA graphs, one per :func:`graph_key` (rows padded up to their
    bucket, the padding rows' results dropped), captured at the first chain of a key and replayed after: a
    replay launches the whole chain in one call, so the CPU no longer paces the GPU.

    The inputs (conditions, cfg, noise) are copied into the graph's own tensors before each replay (zeros in
    the padding rows) and the real rows of the trajectory copied out after, so callers keep what they get;
    one caller at a time (a lock: a graph's tensors are shared by its replays). The head's weights must not
    change while its graphs are kept (:meth:`DiffusionHead.use_kernels` makes new ones)."""

    def __init__(self):
        self.graphs: dict[tuple, tuple] = {}
        self.lock = threading.Lock()

    def __reduce__(self):
        return ChainGraphs, ()  # a copy (of a head, for other weights) starts with no graphs

    def run(
        self,
        chain: DiffusionChain,
        cond: HeadCondition,
        noise: ChainNoise,
        temperature: float,
        kernels: HeadKernels,
        products: torch.dtype | None,
    ) -> Trajectory:
        key = graph_key(chain, cond, noise, temperature, kernels, products)
        values, n = (cond.z, cond.z_uncond, cond.cfg, noise.xi, noise.eps), cond.rows
        with self.lock:
            if key not in self.graphs:
                inputs = graph_inputs(values, key[2])
                self.graphs[key] = (inputs, *self.capture(chain, inputs, temperature, kernels.compiled, products))
            inputs, out, graph = self.graphs[key]
            for static, value, dim in zip(inputs, values, DIMS, strict=True):
                if static is not None:
                    copy_padded(static, value, dim)
            graph.replay()
            return Trajectory(
                take_rows(out.x, n), take_rows(out.states, n, 1), take_rows(out.mean, n, 1), take_rows(out.std, n, 1)
            )

    @staticmethod
    def capture(
        chain: DiffusionChain, inputs: list, temperature: float, compiled: bool, products: torch.dtype | None
    ) -> tuple[Trajectory, torch.cuda.CUDAGraph]:
        z, z_uncond, cfg, xi, eps = inputs
        static = lambda: (HeadCondition(z, z_uncond, cfg), ChainNoise(xi, eps))  # a fresh condition: no kept embedding
        run = lambda: FusedSampler(chain, static()[0], compiled, products).run(static()[1], temperature)
        stream = torch.cuda.Stream(device=xi.device)
        stream.wait_stream(torch.cuda.current_stream(xi.device))
        with torch.cuda.stream(stream):  # warm-up: compiles, and makes and keeps the step embeddings and coefficients
            for _ in range(2):
                run()
        torch.cuda.current_stream(xi.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        return out, graph


DIMS = (0, 0, 0, 0, 1)  # the rows' dim of z, z_uncond, cfg, xi and eps


def graph_inputs(values: tuple[Tensor | None, ...], rows: int) -> list[Tensor | None]:
    """A graph's own input tensors for (z, z_uncond, cfg, xi, eps) ``values``: zeros like each, with ``rows``
    rows along its rows' dim (:data:`DIMS`); None where a value is None."""
    shaped = lambda x, dim: (*x.shape[:dim], rows, *x.shape[dim + 1 :])
    return [None if v is None else v.new_zeros(shaped(v, dim)) for v, dim in zip(values, DIMS, strict=True)]
