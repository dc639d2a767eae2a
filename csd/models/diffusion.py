"""Gaussian diffusion for token heads (MAR's DiffLoss recipe), written for this project.

Cosine noise schedule over ``train_steps`` (1000) steps, respaced to any number of sampling
steps; the network predicts eps and a learned-range variance; classifier-free guidance mixes eps
only. Every function takes its noise as an argument.

Index conventions: ``t`` is a diffusion index into a (possibly respaced) :class:`Schedule`,
``t = 0`` being the last, noise-free transition. The network is always called with the
*original* timestep ``schedule.timestep_map[t]``, as MAR does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from torch import Tensor


def cosine_betas(num_steps: int, max_beta: float = 0.999) -> np.ndarray:
    """Betas of the cosine schedule (Nichol & Dhariwal), float64, shape (num_steps,)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")

    def alpha_bar(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = [min(1.0 - alpha_bar((i + 1) / num_steps) / alpha_bar(i / num_steps), max_beta) for i in range(num_steps)]
    return np.asarray(betas, dtype=np.float64)


def respaced_timesteps(train_steps: int, sampling_steps: int) -> list[int]:
    """Evenly spaced original timesteps kept for sampling (MAR/ADM's single-section striding)."""
    if not 1 <= sampling_steps <= train_steps:
        raise ValueError(f"head sampling steps must be in [1, {train_steps}], got {sampling_steps}")
    if sampling_steps == 1:
        return [0]
    # Accumulated (not multiplied) stride and Python's round, so the kept steps equal MAR's exactly.
    stride, pos, kept = (train_steps - 1) / (sampling_steps - 1), 0.0, []
    for _ in range(sampling_steps):
        kept.append(round(pos))
        pos += stride
    return kept


@dataclass(frozen=True)
class Schedule:
    """Precomputed float64 coefficients of a (respaced) diffusion process, each of shape (T,)."""

    betas: Tensor
    alphas_cumprod: Tensor
    alphas_cumprod_prev: Tensor
    sqrt_alphas_cumprod: Tensor
    sqrt_one_minus_alphas_cumprod: Tensor
    sqrt_recip_alphas_cumprod: Tensor
    sqrt_recipm1_alphas_cumprod: Tensor
    posterior_log_variance_clipped: Tensor
    posterior_mean_coef1: Tensor
    posterior_mean_coef2: Tensor
    timestep_map: Tensor  # (T,) int64, original timestep given to the network
    # Coefficients cast for the tensors they scale, one 0-dim tensor per step (see :meth:`scalars`).
    _scalars: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_steps(self) -> int:
        return int(self.betas.shape[0])

    @cached_property
    def log_betas(self) -> Tensor:
        return self.betas.log()

    @cached_property
    def ddpm_coefficients(self) -> list[tuple[float, float, float, float, float, float]]:
        """DDPM's transition at each diffusion index t as Python floats (a, b, c1, c2, p, q): x0 = a y - b eps,
        mean = c1 x0 + c2 y, std = exp(v p + q) (the learned range between log beta and the clipped posterior
        log variance, halved: :func:`learned_log_variance`)."""
        lb, lp = self.log_betas.tolist(), self.posterior_log_variance_clipped.tolist()
        cols = zip(
            self.sqrt_recip_alphas_cumprod.tolist(),
            self.sqrt_recipm1_alphas_cumprod.tolist(),
            self.posterior_mean_coef1.tolist(),
            self.posterior_mean_coef2.tolist(),
            lb,
            lp,
            strict=True,
        )
        return [(a, b, c1, c2, (u - w) / 4.0, (u + w) / 4.0) for a, b, c1, c2, u, w in cols]

    @cached_property
    def timesteps(self) -> list[int]:
        """The original timestep of every diffusion index (``timestep_map`` as ints)."""
        return self.timestep_map.tolist()

    def log_std_coefficients(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(T, 2): DDPM's (p, q) of :attr:`ddpm_coefficients` by transition (k = T-1-t), in ``dtype`` on
        ``device``; made once per (dtype, device), so a chain run (or its CUDA-graph capture) copies nothing."""
        key = ("log_std", dtype, device)
        if key not in self._scalars:  # a benign race: both writers store equal tensors
            rows = [c[4:] for c in reversed(self.ddpm_coefficients)]
            self._scalars[key] = torch.tensor(rows, dtype=torch.float64).to(device=device, dtype=dtype)
        return self._scalars[key]

    def step_coefficients(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(T, 4): DDPM's (a, b, c1, c2) of :attr:`ddpm_coefficients` by transition (k = T-1-t), in ``dtype`` on
        ``device``, made once per (dtype, device): a compiled step reads its row as a tensor (one graph for
        every step, where Python floats would make one per step)."""
        key = ("step", dtype, device)
        if key not in self._scalars:  # a benign race: both writers store equal tensors
            rows = [c[:4] for c in reversed(self.ddpm_coefficients)]
            self._scalars[key] = torch.tensor(rows, dtype=torch.float64).to(device=device, dtype=dtype)
        return self._scalars[key]

    def scalars(self, name: str, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
        """Coefficient ``name`` cast to ``dtype`` on ``device``, one 0-dim tensor per step: cast once, since a
        chain reads them at every transition (the same numbers as casting ``coef[t]`` each time)."""
        key = (name, dtype, device)
        if key not in self._scalars:  # a benign race: both writers store equal lists
            self._scalars[key] = list(getattr(self, name).to(device=device, dtype=dtype).unbind())
        return self._scalars[key]

    @classmethod
    def cosine(cls, train_steps: int = 1000, sampling_steps: int | None = None) -> Schedule:
        base = cosine_betas(train_steps)
        kept = respaced_timesteps(train_steps, sampling_steps or train_steps)
        base_ac = np.cumprod(1.0 - base)
        # Respacing keeps alpha_bar at the kept steps and recomputes betas between them.
        ac = base_ac[kept]
        betas = 1.0 - ac / np.append(1.0, ac[:-1])
        return cls.from_betas(betas, kept)

    @classmethod
    def from_betas(cls, betas: np.ndarray, timestep_map: list[int]) -> Schedule:
        betas = np.asarray(betas, dtype=np.float64)
        ac = np.cumprod(1.0 - betas)
        ac_prev = np.append(1.0, ac[:-1])
        post_var = betas * (1.0 - ac_prev) / (1.0 - ac)
        # The posterior variance is 0 at t = 0; MAR (like ADM) uses the t = 1 value there.
        post_logvar = np.log(np.append(post_var[1], post_var[1:])) if len(betas) > 1 else np.log(betas)
        f64 = lambda a: torch.as_tensor(a, dtype=torch.float64)
        return cls(
            betas=f64(betas),
            alphas_cumprod=f64(ac),
            alphas_cumprod_prev=f64(ac_prev),
            # In float64: at small t, 1/ab - 1 ~ 1e-5 loses most of its digits in float32.
            sqrt_alphas_cumprod=f64(np.sqrt(ac)),
            sqrt_one_minus_alphas_cumprod=f64(np.sqrt(1.0 - ac)),
            sqrt_recip_alphas_cumprod=f64(np.sqrt(1.0 / ac)),
            sqrt_recipm1_alphas_cumprod=f64(np.sqrt(1.0 / ac - 1.0)),
            posterior_log_variance_clipped=f64(post_logvar),
            posterior_mean_coef1=f64(betas * np.sqrt(ac_prev) / (1.0 - ac)),
            posterior_mean_coef2=f64((1.0 - ac_prev) * np.sqrt(1.0 - betas) / (1.0 - ac)),
            timestep_map=torch.as_tensor(timestep_map, dtype=torch.long),
        )


def _at(schedule: Schedule, name: str, t: int | Tensor, like: Tensor) -> Tensor:
    """Coefficient ``name`` of the schedule at t, cast to ``like``; an int t gives a scalar, a (n,) t a column
    that broadcasts over d."""
    if isinstance(t, int):
        return schedule.scalars(name, like.dtype, like.device)[t]
    return getattr(schedule, name).to(like.device)[t].to(like.dtype).unsqueeze(-1)


def model_timesteps(schedule: Schedule, t: int | Tensor, rows: int, device: torch.device) -> Tensor:
    """Original timesteps (rows,) to feed the network for diffusion index t."""
    tmap = schedule.timestep_map.to(device)
    if isinstance(t, int):
        return tmap[t].expand(rows)
    return tmap[t]


def q_sample(schedule: Schedule, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """Forward process: x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) noise. x0, noise: (n, d); t: (n,)."""
    return (
        _at(schedule, "sqrt_alphas_cumprod", t, x0) * x0 + _at(schedule, "sqrt_one_minus_alphas_cumprod", t, x0) * noise
    )


def predict_x0(schedule: Schedule, x_t: Tensor, t: int | Tensor, eps: Tensor) -> Tensor:
    return (
        _at(schedule, "sqrt_recip_alphas_cumprod", t, x_t) * x_t
        - _at(schedule, "sqrt_recipm1_alphas_cumprod", t, x_t) * eps
    )


def posterior_mean(schedule: Schedule, x0: Tensor, x_t: Tensor, t: int | Tensor) -> Tensor:
    return _at(schedule, "posterior_mean_coef1", t, x_t) * x0 + _at(schedule, "posterior_mean_coef2", t, x_t) * x_t


def learned_log_variance(schedule: Schedule, v: Tensor, t: int | Tensor) -> Tensor:
    """Learned-range variance: v in [-1, 1] interpolates log beta_t and the clipped posterior log var."""
    frac = (v + 1.0) / 2.0
    max_log = _at(schedule, "log_betas", t, v)
    min_log = _at(schedule, "posterior_log_variance_clipped", t, v)
    return frac * max_log + (1.0 - frac) * min_log


def p_mean_logvar(
    schedule: Schedule, x_t: Tensor, t: int | Tensor, eps: Tensor, v: Tensor, clip_x0: float | None = None
) -> tuple[Tensor, Tensor]:
    """Mean and log-variance of p(x_{t-1} | x_t) from the network's (eps, v). All (n, d)."""
    x0 = predict_x0(schedule, x_t, t, eps)
    if clip_x0 is not None:
        # Bounded tokens (pixels): without the clip, eps errors at the noisiest step are
        # amplified by 1/sqrt(alpha_bar) ~ 2e4 and tokens blow up.
        x0 = x0.clamp(-clip_x0, clip_x0)
    return posterior_mean(schedule, x0, x_t, t), learned_log_variance(schedule, v, t)


def predict_eps(schedule: Schedule, x_t: Tensor, t: int | Tensor, x0: Tensor) -> Tensor:
    """The eps that x_t and x0 imply: (x_t / sqrt(ab_t) - x0) / sqrt(1 / ab_t - 1)."""
    return (_at(schedule, "sqrt_recip_alphas_cumprod", t, x_t) * x_t - x0) / _at(
        schedule, "sqrt_recipm1_alphas_cumprod", t, x_t
    )


def ddim_mean_std(
    schedule: Schedule, x_t: Tensor, t: int | Tensor, eps: Tensor, eta: float, clip_x0: float | None = None
) -> tuple[Tensor, Tensor]:
    """DDIM's step from diffusion index t (Song et al. 2021, eq. 12) on the respaced schedule: with
    ab = alpha_bar_t, ab' = alpha_bar_{t-1} (1 at t = 0),

        sigma = eta sqrt((1 - ab') / (1 - ab)) sqrt(1 - ab / ab'),
        mean = sqrt(ab') x0 + sqrt(1 - ab' - sigma^2) eps,

    x0 predicted from eps (clipped for bounded tokens, and eps recomputed from the clipped x0, as ADM's
    DDIM does). eta = 0 is deterministic; at t = 0 the mean is x0 and sigma 0. Returns (mean, sigma)."""
    x0 = predict_x0(schedule, x_t, t, eps)
    if clip_x0 is not None:
        x0 = x0.clamp(-clip_x0, clip_x0)
        eps = predict_eps(schedule, x_t, t, x0)
    ab, ab_prev = _at(schedule, "alphas_cumprod", t, x_t), _at(schedule, "alphas_cumprod_prev", t, x_t)
    sigma = eta * ((1.0 - ab_prev) / (1.0 - ab) * (1.0 - ab / ab_prev)).sqrt()
    mean = ab_prev.sqrt() * x0 + (1.0 - ab_prev - sigma**2).clamp(min=0.0).sqrt() * eps
    return mean, sigma.expand_as(mean)


def guide_eps(eps_cond: Tensor, eps_uncond: Tensor, scale: Tensor | float) -> Tensor:
    """Classifier-free guidance on eps only; ``scale`` is a float or a per-row (n,) tensor."""
    if isinstance(scale, Tensor):
        scale = scale.to(eps_cond.dtype).unsqueeze(-1)
    return eps_uncond + scale * (eps_cond - eps_uncond)


# --- training loss -----------------------------------------------------------------------------


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + (logvar1 - logvar2).exp() + (mean1 - mean2) ** 2 * (-logvar2).exp())


def _approx_std_normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def discretized_gaussian_log_likelihood(x: Tensor, mean: Tensor, log_scale: Tensor) -> Tensor:
    """Log-likelihood (nats) of x in [-1, 1] under a Gaussian integrated over 8-bit bins."""
    inv_std = torch.exp(-log_scale)
    cdf_plus = _approx_std_normal_cdf(inv_std * (x - mean + 1.0 / 255.0))
    cdf_min = _approx_std_normal_cdf(inv_std * (x - mean - 1.0 / 255.0))
    log_cdf_plus = cdf_plus.clamp(min=1e-12).log()
    log_one_minus_cdf_min = (1.0 - cdf_min).clamp(min=1e-12).log()
    log_delta = (cdf_plus - cdf_min).clamp(min=1e-12).log()
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))


def diffusion_loss(schedule: Schedule, net_out: Tensor, x0: Tensor, x_t: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """Per-row MAR loss: eps MSE + variational bound (bits/dim) that trains only the variance.

    net_out: (n, 2d) network output at (x_t, t); x0, x_t, noise: (n, d); t: (n,). Returns (n,).
    """
    d = x0.shape[-1]
    eps, v = net_out[:, :d], net_out[:, d:]
    mse = ((noise - eps) ** 2).mean(-1)
    # The bound sees a frozen mean so that it only shapes the variance (as in improved DDPM).
    mean, logvar = p_mean_logvar(schedule, x_t, t, eps.detach(), v)
    true_mean = posterior_mean(schedule, x0, x_t, t)
    true_logvar = _at(schedule, "posterior_log_variance_clipped", t, x0)
    kl = normal_kl(true_mean, true_logvar, mean, logvar).mean(-1) / math.log(2.0)
    nll = -discretized_gaussian_log_likelihood(x0, mean, 0.5 * logvar).mean(-1) / math.log(2.0)
    return mse + torch.where(t == 0, nll, kl)


def distill_loss(schedule: Schedule, net_out: Tensor, teacher_out: Tensor, t: Tensor) -> Tensor:
    """Per-row distillation loss (n,) towards a teacher head's output at the same (x_t, t).

    eps MSE plus the squared gap of the learned log-variances, (log var - log var_teacher)^2: the
    second term is what the aligned acceptance test's trajectory term sums over a chain, so a
    student trained on it has the teacher's per-step stds. net_out, teacher_out: (n, 2d); t: (n,).
    """
    d = net_out.shape[-1] // 2
    eps_gap = ((net_out[:, :d] - teacher_out[:, :d]) ** 2).mean(-1)
    logvar = learned_log_variance(schedule, net_out[:, d:], t)
    logvar_teacher = learned_log_variance(schedule, teacher_out[:, d:], t)
    return eps_gap + ((logvar - logvar_teacher) ** 2).mean(-1)
