"""Cost model of block CSD (DESIGN.md section 6): pass counts and the speedup bound.

Target-only with S AR steps costs S (C_p + H_p). Block CSD with P pre-fill steps drafts the other
S - P steps and verifies them in ceil((S - P) / gamma) target passes:

    (S - P)(C_q + H_q) + (P + ceil((S - P) / gamma)) C_p + S H_p   (+ resampling and overhead)

With P = 0 and gamma dividing S this is DESIGN.md's ``S (C_q + H_q) + (S / gamma) C_p + S H_p``.

The model charges the target head per AR step (S H_p, as measured in target-only runs), but CSD runs
it once per block over every drafted token; where per-call overhead dominates the head (batch 1 on a
CPU) that is much cheaper, so a measured speedup can exceed this "bound".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from csd.schedule import step_sizes


def prefill_steps(sizes: list[int], prefill: float) -> int:
    """AR steps the target makes alone: as in ``speculative_generate``, until prefill * N tokens exist."""
    n, steps, made = sum(sizes), 0, 0
    while steps < len(sizes) and made < prefill * n:
        made += sizes[steps]
        steps += 1
    return steps


def csd_passes(num_tokens: int, num_steps: int, gamma: int, prefill: float) -> tuple[int, int]:
    """(target passes, draft passes) of one block-CSD generation."""
    p = prefill_steps(step_sizes(num_tokens, num_steps), prefill)
    return p + math.ceil((num_steps - p) / gamma), num_steps - p


@dataclass(frozen=True)
class StepCosts:
    """Seconds per AR step: backbone passes C and head chains H of target p and draft q."""

    target_backbone: float
    target_head: float
    draft_backbone: float
    draft_head: float

    def __post_init__(self) -> None:
        for name in ("target_backbone", "target_head", "draft_backbone", "draft_head"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"{name} cost must be finite and >= 0, got {v!r}")
        if self.target_backbone + self.target_head <= 0.0:
            raise ValueError("target costs must not both be zero")


def speedup_bound(costs: StepCosts, num_steps: int, gamma: int, prefill_steps: int) -> float:
    """Target-only cost over block-CSD cost for the same S, without resampling and overhead."""
    if not 0 <= prefill_steps <= num_steps:
        raise ValueError(f"prefill_steps must be in [0, {num_steps}], got {prefill_steps}")
    s, p = num_steps, prefill_steps
    c_p, h_p, c_q, h_q = costs.target_backbone, costs.target_head, costs.draft_backbone, costs.draft_head
    csd = (s - p) * (c_q + h_q) + (p + math.ceil((s - p) / gamma)) * c_p + s * h_p
    return s * (c_p + h_p) / csd


def simple_bound(target_backbone: float, draft_backbone: float, gamma: int) -> float:
    """C_p / (C_q + C_p / gamma): the bound when the heads are free and nothing is pre-filled."""
    return target_backbone / (draft_backbone + target_backbone / gamma)
