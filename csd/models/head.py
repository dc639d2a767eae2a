"""MAR's token head: an MLP with AdaLN conditioning (``SimpleMLPAdaLN``) plus Gaussian diffusion.

Parameter names follow the official checkpoints (``diffloss.net.*``) so they load unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from csd.core.chain import ChainNoise, HeadCondition, Trajectory
from csd.core.checks import check_choice, check_int
from csd.models import diffusion as gd


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
    """The head network: (x_t (n, d), t (n,), z (n, D)) -> (n, 2d) = [eps | variance value]."""

    def __init__(self, token_dim: int, z_dim: int, width: int, depth: int):
        super().__init__()
        self.token_dim = token_dim
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_dim, width)
        self.input_proj = nn.Linear(token_dim, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * token_dim)
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
        self.cuda_graphs: CUDAGraphs | None = None  # opt-in: see use_cuda_graphs

    def use_cuda_graphs(self, enabled: bool = True) -> None:
        """Opt in (or out) to running this head's DDPM chains on CUDA as captured CUDA graphs, one per shape
        (:class:`CUDAGraphs`): the first chain of a shape pays a capture, every later one replays it. The same
        numbers as the fused sampler; nothing changes on a CPU."""
        self.cuda_graphs = CUDAGraphs() if enabled else None

    def chain(self, steps: int | None = None, sampler: str = "ddpm", eta: float = 0.0) -> DiffusionChain:
        """The head at ``steps`` sampling steps (None: its default) with ``sampler`` "ddpm" (the trained
        one) or "ddim" (with ``eta``)."""
        steps = self.sampling_steps if steps is None else steps
        check_int("head_steps", steps, 1, self.train_steps)
        check_choice("head_sampler (a diffusion head's)", sampler, ("ddpm", "ddim"))
        if steps not in self._schedules:  # a benign race: both writers store equal schedules
            self._schedules[steps] = gd.Schedule.cosine(self.train_steps, steps)
        eta = None if sampler == "ddpm" else eta
        chain = DiffusionChain(self.net, self._schedules[steps], self.clip_x0, eta, self._step_embeddings)
        chain.cuda_graphs = self.cuda_graphs
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
        self.cuda_graphs: CUDAGraphs | None = None

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
        float rounding) at a fraction of its op calls (:class:`FusedSampler`); None for DDIM and where autograd
        records (it writes into buffers), which the transition-by-transition loop runs."""
        if self.ddim_eta is not None or torch.is_grad_enabled():
            return None
        if self.cuda_graphs is not None and noise.xi.is_cuda:
            return self.cuda_graphs.run(self, cond, noise, temperature)
        return FusedSampler(self, cond).run(noise, temperature)

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
    float32 rounding (``tests/models/test_fast_paths.py``)."""

    def __init__(self, chain: DiffusionChain, cond: HeadCondition):
        net = chain.net
        self.chain, self.cond, self.net = chain, cond, net
        self.groups = 1 if cond.z_uncond is None else 2  # G: conditional rows, then unconditional ones
        self.rows = cond.rows  # n per group
        d, width = net.token_dim, net.input_proj.out_features
        self.width = width
        self.input = (net.input_proj.bias, net.input_proj.weight.t())
        self.blocks = [
            (b.in_ln, (b.mlp[0].bias, b.mlp[0].weight.t()), (b.mlp[2].bias, b.mlp[2].weight.t()))
            for b in net.res_blocks
        ]
        final = net.final_layer.linear
        self.eps_out = (final.bias[:d], final.weight[:d].t())
        self.var_out = (final.bias[d:], final.weight[d:].t())
        self.eps_ln = net.final_layer.norm_final.eps

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
            shift, scale, gate = torch.addmm(lin.bias, flat, lin.weight.t()).reshape(shape).chunk(3, dim=-1)
            one_scale = scale + 1.0
            ln = block.in_ln
            shift = torch.addcmul(shift, ln.bias, one_scale)  # before one_scale takes the LayerNorm's gain
            out += [shift, one_scale.mul_(ln.weight), gate.contiguous()]
        lin = net.final_layer.adaLN_modulation[1]
        shift, scale = torch.addmm(lin.bias, flat, lin.weight.t()).reshape(len(steps), r, -1).chunk(2, dim=-1)
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
        for chunk in self.chunks():
            mods = [m.unbind() for m in self.modulations(chunk)]
            for i, k in enumerate(chunk):
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
        h = torch.addmm(self.input[0], y, self.input[1])  # (n, W): both groups read the same state
        for j, (ln, (b1, w1), (b2, w2)) in enumerate(self.blocks):
            shift, scale, gate = mods[3 * j : 3 * j + 3]  # (G, n, W) in the first block, else (G n, W)
            x = nn.functional.layer_norm(h, (width,), None, None, ln.eps)
            x = torch.addcmul(shift, x, scale)
            u = nn.functional.silu(torch.addmm(b1, x.view(g * n, width) if j == 0 else x, w1), inplace=True)
            u = torch.addmm(b2, u, w2)
            if j == 0:  # the state's rows, shared by the groups, become each group's own
                h = torch.addcmul(h, gate, u.view(g, n, width)).view(g * n, width)
            else:
                h.addcmul_(gate, u)
        shift, one_scale = mods[-2:]
        x = nn.functional.layer_norm(h, (width,), None, None, self.eps_ln)
        x = torch.addcmul(shift, x, one_scale)
        return torch.addmm(self.eps_out[0], x, self.eps_out[1]), x


class CUDAGraphs:
    """A diffusion head's fused chains as CUDA graphs, captured once per shape and replayed after: a replay
    launches the whole chain (hundreds of small kernels) in one call, so the CPU no longer paces the GPU.

    Keyed by the chain's steps, rows, guidance, dtype, device and temperature; the inputs (conditions, cfg,
    noise) are copied into the captured graph's own tensors before each replay and the trajectory is copied
    out after, so callers keep what they get. The head's weights must not change while its graphs are kept
    (:meth:`DiffusionHead.use_cuda_graphs` again makes new ones)."""

    def __init__(self):
        self.graphs: dict[tuple, tuple] = {}

    def run(self, chain: DiffusionChain, cond: HeadCondition, noise: ChainNoise, temperature: float) -> Trajectory:
        guided, scaled = cond.z_uncond is not None, cond.cfg is not None
        key = (chain.num_steps(), id(chain.schedule), cond.rows, guided, scaled, noise.xi.dtype, noise.xi.device)
        key += (temperature,)
        if key not in self.graphs:
            self.graphs[key] = self.capture(chain, cond, noise, temperature)
        inputs, out, graph = self.graphs[key]
        for static, value in zip(inputs, (cond.z, cond.z_uncond, cond.cfg, noise.xi, noise.eps), strict=True):
            if static is not None:
                static.copy_(value)
        graph.replay()
        return Trajectory(out.x.clone(), out.states.clone(), out.mean.clone(), out.std.clone())

    @staticmethod
    def capture(chain: DiffusionChain, cond: HeadCondition, noise: ChainNoise, temperature: float) -> tuple:
        inputs = [None if t is None else t.clone() for t in (cond.z, cond.z_uncond, cond.cfg, noise.xi, noise.eps)]
        z, z_uncond, cfg, xi, eps = inputs
        static = lambda: (HeadCondition(z, z_uncond, cfg), ChainNoise(xi, eps))  # a fresh condition: no kept embedding
        stream = torch.cuda.Stream(device=xi.device)
        stream.wait_stream(torch.cuda.current_stream(xi.device))
        with torch.cuda.stream(stream):  # warm-up: the step embeddings and coefficients are made and kept here
            for _ in range(2):
                FusedSampler(chain, static()[0]).run(static()[1], temperature)
        torch.cuda.current_stream(xi.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            c, n = static()
            out = FusedSampler(chain, c).run(n, temperature)
        return inputs, out, graph
