"""How a token head's chains run on a device: op by op (eager), compiled, or compiled and captured.

* **compiled**: the per-transition step function through ``torch.compile`` (inductor, ``fullgraph``: a graph
  break is an error), so each residual block's LayerNorm (RMSNorm in xAR), modulation, activation, gate and
  residual become a few fused kernels around its two products, and one DDPM step a few kernels in all;
* **graphs** (CUDA only): each whole chain captured as one CUDA graph per (rows bucket, steps, ...) and
  replayed after, its rows padded up to a power of two (:func:`rows_bucket`) so that a handful of graphs
  serves every batch; the padding rows' results are dropped.

The default is compiled and graphed on CUDA (:data:`ON_CUDA`; a head's own setting overrides it) and eager
elsewhere: on a CPU nothing changes unless asked.

Products: the official codes sample their heads in reduced precision (MAR: ``sample_tokens``, head
included, under ``torch.cuda.amp.autocast()``, float16; xAR: its flow network under the same autocast with
TF32 allowed; Harmon: every weight, the head's too, in bfloat16). So a compiled head runs its products in the
run's autocast dtype when the run's precision has one (``bfloat16`` / ``float16``), with states, norms,
modulations, residuals and densities in float32; at ``float32`` and ``float64`` every product stays in the
run's dtype (no TF32).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class HeadKernels:
    """How a head's chains run: ``compiled`` (torch.compile of the step function) and ``graphs`` (each chain
    one CUDA graph per rows bucket, over compiled or eager steps; CUDA only); rows are bucketed to powers of
    two of at least ``least_rows``."""

    compiled: bool = True
    graphs: bool = True
    least_rows: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.least_rows, int) or self.least_rows < 1:
            raise ValueError(f"HeadKernels.least_rows must be an int >= 1, got {self.least_rows!r}")


EAGER = HeadKernels(compiled=False, graphs=False)
# The default of every head on CUDA (a head's own setting, ``use_kernels``, overrides it); EAGER turns it off.
ON_CUDA = HeadKernels()


def kernels_for(device: torch.device | str, chosen: HeadKernels | None = None) -> HeadKernels:
    """What runs on ``device``: ``chosen`` where given (its graphs only on CUDA), else :data:`ON_CUDA` on CUDA
    and :data:`EAGER` elsewhere."""
    cuda = torch.device(device).type == "cuda"
    kernels = chosen if chosen is not None else (ON_CUDA if cuda else EAGER)
    if kernels.graphs and not cuda:
        return HeadKernels(compiled=kernels.compiled, graphs=False, least_rows=kernels.least_rows)
    return kernels


def product_dtype(autocast: torch.dtype | None, kernels: HeadKernels) -> torch.dtype | None:
    """The dtype of a compiled head's products: the run's autocast dtype (None: the weights' own); an eager
    head keeps its weights' dtype whatever the run's precision."""
    return autocast if kernels.compiled else None


# --- rows buckets (a CUDA graph per bucket) ------------------------------------------------------------


def rows_bucket(rows: int, least: int = 1) -> int:
    """The captured size that serves ``rows`` rows: the least power of two >= max(rows, least)."""
    if rows < 1 or least < 1:
        raise ValueError(f"rows and least must be >= 1, got {rows} and {least}")
    return 1 << (max(rows, least) - 1).bit_length()


def pad_rows(x: Tensor, rows: int, dim: int = 0, fill: float = 0.0) -> Tensor:
    """``x`` with ``fill`` rows appended along ``dim`` up to ``rows`` (x itself when it has as many)."""
    have = x.shape[dim]
    if have > rows:
        raise ValueError(f"cannot pad {have} rows down to {rows}")
    if have == rows:
        return x
    shape = list(x.shape)
    shape[dim] = rows - have
    return torch.cat([x, x.new_full(shape, fill)], dim=dim)


def take_rows(x: Tensor, rows: int, dim: int = 0) -> Tensor:
    """The first ``rows`` rows of ``x`` along ``dim`` as a tensor of its own (a padded run's real rows, copied
    out of a graph's buffers before the next replay overwrites them)."""
    return x.narrow(dim, 0, rows).clone()


def copy_padded(static: Tensor, value: Tensor, dim: int = 0) -> None:
    """Write ``value`` into the first rows of a captured input ``static`` along ``dim``, zeros after."""
    rows = value.shape[dim]
    static.narrow(dim, 0, rows).copy_(value)
    if rows < static.shape[dim]:
        static.narrow(dim, rows, static.shape[dim] - rows).zero_()


# --- compiled step functions ----------------------------------------------------------------------------


# Graphs one compiled function may keep: one per structure it meets (depth, guided or not, the last step or not,
# dtype, products, clip, autocast), which a server with a pair at two precisions multiplies past dynamo's 8.
RECOMPILE_LIMIT = 64


def compiled(fn: Callable) -> Callable:
    """``fn`` through torch.compile (inductor) in one graph (a break raises), shapes specialised until one
    changes, then dynamic; made once per function, dynamo's recompile limit raised to at least
    :data:`RECOMPILE_LIMIT` (under ``fullgraph`` reaching it is an error)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    return _compiled(fn)


@functools.cache
def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, fullgraph=True)
