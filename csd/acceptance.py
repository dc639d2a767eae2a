"""Acceptance criteria for a drafted continuous token (DESIGN.md section 3).

Both criteria return a :class:`Verdict`: log r split into a trajectory term and a final-step
term, so the UI can show which one decides. A token is accepted with probability min(1, r).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from csd.chain import Trajectory
from csd.gaussian import normal_logpdf

CRITERIA = ("aligned", "exact")
TRAJECTORY_TERMS = ("derived", "published", "none")


@dataclass(frozen=True)
class Verdict:
    """Per-token log acceptance ratio log r = trajectory + final, each (n,)."""

    trajectory: Tensor
    final: Tensor

    @property
    def log_ratio(self) -> Tensor:
        return self.trajectory + self.final

    @property
    def accept_prob(self) -> Tensor:
        return self.log_ratio.clamp(max=0.0).exp()


def accept(verdict: Verdict, uniforms: Tensor) -> Tensor:
    """Accept where u < min(1, r), i.e. log u < log r. uniforms: (n,) in [0, 1)."""
    return uniforms.log() < verdict.log_ratio


def trajectory_log_std_gap(draft: Trajectory, target: Trajectory) -> Tensor:
    """sum over stochastic steps and dims of log sigma^q - log sigma^p: (n,).

    With shared noise every stochastic transition has density phi(eps) / prod sigma under its own
    model; the phi factors cancel in p(Y_p) / q(Y_q), leaving the ratio of std products."""
    return (draft.std[:-1].log() - target.std[:-1].log()).sum(dim=(0, 2))


def final_step_term(x: Tensor, draft: Trajectory, target: Trajectory, tau_v: float) -> Tensor:
    """log N(x; mu^p_0, (tau_v s^p_0)^2) - log N(x; mu^q_0, (tau_v s^q_0)^2) for draft tokens x (n, d)."""
    return normal_logpdf(x, target.final_mean, tau_v * target.final_std) - normal_logpdf(
        x, draft.final_mean, tau_v * draft.final_std
    )


def aligned_verdict(draft: Trajectory, target: Trajectory, tau_v: float, trajectory_term: str = "derived") -> Verdict:
    """Criterion (a): the paper's approximation p(Y_p) / q(Y_q) for trajectories made from the same noise.

    trajectory_term: "derived" (the sign that follows from the densities), "published" (the sign
    of the reference code) or "none" (final-step term only)."""
    if trajectory_term not in TRAJECTORY_TERMS:
        raise ValueError(f"trajectory_term must be one of {TRAJECTORY_TERMS}, got {trajectory_term!r}")
    if trajectory_term == "none":  # also for chains of different lengths (a cheaper draft head)
        traj = torch.zeros(draft.x.shape[0], dtype=draft.x.dtype, device=draft.x.device)
    else:
        gap = trajectory_log_std_gap(draft, target)
        traj = gap if trajectory_term == "derived" else -gap
    return Verdict(trajectory=traj, final=final_step_term(draft.x, draft, target, tau_v))


def path_log_ratio(states: Tensor, num_mean: Tensor, num_std: Tensor, den_mean: Tensor, den_std: Tensor) -> Tensor:
    """sum over stochastic transitions of log N_num(y_{k+1} | y_k) - log N_den(y_{k+1} | y_k): (n,).

    states: (T, n, d) a path (states[k] is the input of transition k); the means and stds are the
    two models' transitions evaluated at those states, (T, n, d)."""
    nxt = states[1:]
    return normal_logpdf(nxt, num_mean[:-1], num_std[:-1]).sum(0) - normal_logpdf(nxt, den_mean[:-1], den_std[:-1]).sum(
        0
    )


def exact_verdict(draft: Trajectory, target_mean: Tensor, target_std: Tensor) -> Verdict:
    """Criterion (b): speculative sampling on paths; the target's transitions evaluated on the draft path.

    target_mean, target_std: (T, n, d) from :func:`csd.chain.evaluate_path` on ``draft.states``.
    xi has the same density under both models and the last step is deterministic, so only the
    stochastic transitions enter. Accepted tokens commit the target's last mean on that path."""
    traj = path_log_ratio(draft.states, target_mean, target_std, draft.mean, draft.std)
    return Verdict(trajectory=traj, final=torch.zeros_like(traj))
