"""What the decoder and its recorder share: a run's result (:class:`Generation`), its progress callback, a
drafted block's record (:class:`Block`), the device a model is on, and committing tokens to the canvas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.core.chain import ChainNoise, Trajectory
from csd.family import TokenChain
from csd.trace import Trace

StepCallback = Callable[[int, int, str], None]
"""``on_step(done, total, phase)``: called by a sampler after each AR step (``done`` of ``total`` steps
processed, ``phase`` what the step was: "target", "draft", "pre-fill", "verify"). It may raise to
stop the run there (the app's Stop button does); a sampler without one pays nothing."""


@dataclass
class Generation:
    tokens: Tensor  # (B, N, d) on the CPU, float32 (float64 under precision "float64")
    trace: Trace


@dataclass
class Block:
    """A drafted block: its index, AR steps and positions (B, k), the tokens (rows) per image of each of its
    AR steps, the head steps of the target's chains and of the draft's (equal unless draft_head_steps says
    otherwise), and the draft's trajectories, noise and chains (rows image-major over the block)."""

    index: int
    steps: range
    pos: Tensor
    sizes: list[int]
    t_p: int
    t_q: int
    draft: Trajectory
    noise: ChainNoise
    chain_q: TokenChain
    kept: int = 0  # AR steps committed, once decided (all of them unless under the exact block)
    agreed: int = 0  # leading AR steps whose every token was accepted in every image (under the exact block)

    @property
    def kept_rows(self) -> int:
        """Rows per image committed: those of the kept steps."""
        return sum(self.sizes[: self.kept])

    def kept_of(self, t: Tensor) -> Tensor:
        """The committed rows of ``t`` (rows image-major over the block, as the decision's)."""
        b = self.pos.shape[0]
        return t.reshape(b, -1, *t.shape[1:])[:, : self.kept_rows].reshape(-1, *t.shape[1:])


def sync_cuda() -> None:
    """Wait for every queued CUDA kernel, where CUDA is in use (a no-op on a CPU, and where it was never
    initialised): a timed span starts and ends with it, so GPU work lands in the span that queued it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def finished(tokens: Tensor) -> Tensor:
    """A run's tokens as :class:`Generation` holds them: on the CPU, float32 (float64 in a float64 run)."""
    return tokens.cpu() if tokens.dtype == torch.float64 else tokens.float().cpu()


def commit(tokens: Tensor, mask: Tensor, pos: Tensor, x: Tensor) -> None:
    """Write x (B*k, d) at positions (B, k) and unmask them, in place."""
    b, k = pos.shape
    tokens.scatter_(1, pos.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]), x.reshape(b, k, -1).to(tokens.dtype))
    mask.scatter_(1, pos, False)
