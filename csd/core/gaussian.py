"""Diagonal Gaussian log-densities (the only densities the method needs)."""

from __future__ import annotations

import math

from torch import Tensor

LOG_2PI = math.log(2.0 * math.pi)


def normal_logpdf(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """log N(x; mean, diag(std^2)), summed over the last dimension: (..., d) -> (...)."""
    z = (x - mean) / std
    return (-0.5 * z * z - std.log() - 0.5 * LOG_2PI).sum(-1)
