"""AR schedules: MAR's cosine mask schedule (tokens per AR step), the CFG schedules over the steps, and
the head-step schedule (DiSA-style annealing of the chain's steps over the AR steps)."""

from __future__ import annotations

import math

CFG_SCHEDULES = ("linear", "constant")
# Head-step schedules from SamplingConfig.head_steps at the first AR step to head_steps_min at the last:
# "linear" rounds to the nearest step; "disa" and "disa-cosine" are DiSA's own (Zhao et al. 2025,
# Qinyu-Allen-Zhao/DiSA: linear or cosine in the AR step index, rounded down toward the lower count).
HEAD_SCHEDULES = ("linear", "disa", "disa-cosine")
DISA_FLOOR = 5  # DiSA's head steps at the last AR step, whatever the first (its MAR setting: 50 -> 5)


def step_sizes(num_tokens: int, num_steps: int) -> list[int]:
    """Tokens predicted at each of ``num_steps`` AR steps (MaskGIT/MAR cosine schedule).

    After step s, floor(N cos(pi/2 (s+1)/S)) tokens stay masked, but every step predicts at least
    one token and leaves at least one for later; the last step predicts all that remain.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if not isinstance(num_steps, int) or not 1 <= num_steps <= num_tokens:
        raise ValueError(f"AR steps must be an int in [1, {num_tokens}] (the number of tokens), got {num_steps!r}")
    sizes, masked = [], num_tokens
    for s in range(num_steps):
        if s == num_steps - 1:
            sizes.append(masked)
            break
        target = math.floor(num_tokens * math.cos(math.pi / 2.0 * (s + 1) / num_steps))
        keep = max(1, min(masked - 1, target))
        sizes.append(masked - keep)
        masked = keep
    return sizes


def cfg_scale_at(cfg: float, schedule: str, num_tokens: int, masked_after: int) -> float:
    """Guidance scale of a step that leaves ``masked_after`` tokens masked (Muse's linear ramp)."""
    if schedule == "constant":
        return cfg
    if schedule == "linear":
        return 1.0 + (cfg - 1.0) * (num_tokens - masked_after) / num_tokens
    raise ValueError(f"cfg_schedule must be one of {CFG_SCHEDULES}, got {schedule!r}")


def step_cfg_scales(cfg: float, schedule: str, sizes: list[int]) -> list[float]:
    """Per-step guidance scales for a schedule of step sizes.

    MAR's linear ramp uses the clamped mask length, which at the last step is 1 rather than 0;
    reproduced here so guidance equals the official sampler's."""
    n = sum(sizes)
    scales, masked = [], n
    for i, k in enumerate(sizes):
        masked -= k
        masked_len = masked if i < len(sizes) - 1 else 1
        scales.append(cfg_scale_at(cfg, schedule, n, masked_len))
    return scales


def head_step_schedule(first: int, last: int | None, num_steps: int, kind: str = "linear") -> list[int]:
    """Head steps of each AR step: ``first`` throughout, or annealed from ``first`` at the first AR step
    to ``last`` at the last. With K = ``num_steps`` and step s in [0, K): "linear" rounds
    first + (last - first) s / (K - 1); DiSA's "disa" is last + floor((first - last) (K - 1 - s) / (K - 1)),
    its "disa-cosine" last + floor((first - last) (cos(pi s / (K - 1)) + 1) / 2)."""
    if kind not in HEAD_SCHEDULES:
        raise ValueError(f"head_schedule must be one of {HEAD_SCHEDULES}, got {kind!r}")
    if last is None or num_steps == 1:
        return [first] * num_steps
    k = num_steps - 1
    if kind == "linear":
        return [round(first + (last - first) * s / k) for s in range(num_steps)]
    if kind == "disa":
        # integer arithmetic: floor of (first - last)(k - s) / k, exact where floats would round 5.999... down
        return [last + (first - last) * (k - s) // k for s in range(num_steps)]
    cosine = [(math.cos(math.pi * s / k) + 1.0) / 2.0 for s in range(num_steps)]
    return [last + math.floor((first - last) * c + 1e-9) for c in cosine]
