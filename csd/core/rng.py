"""Per-image random streams.

Every image of a batch owns one ``torch.Generator`` per purpose (orders, chain noise, acceptance
draws, ...), seeded from (image seed, stream name). Draws are made image by image, so image i
of a batch gets exactly the numbers it would get when generated alone with the same seed, and a
speculative run sees the same orders and chain noise as a target-only run with that seed.

The generators are the CPU's on every device: a draw is made on the host and reaches an accelerator as one
copy (from pinned memory, without waiting for the device), not as one generator kernel per image, and a
seed gives the same numbers on a GPU as on a CPU (the same image, up to the devices' rounding).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from csd.core.checks import is_int

STREAMS = ("order", "chain", "accept", "resample", "independent")


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for (seed, stream), stable across runs, platforms and Python versions."""
    digest = hashlib.blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@contextmanager
def drawing_from(generator: torch.Generator) -> Iterator[None]:
    """Run code that draws from the global CPU generator (a module's layer init: torch offers no other way)
    on ``generator``'s numbers instead: inside, the global generator continues ``generator``'s stream;
    after, ``generator`` has advanced by what was drawn and the caller's global generator is as it was.
    A generator seeded with s gives the numbers ``torch.manual_seed(s)`` would."""
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator (layer init draws on the CPU), got {generator.device}")
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(generator.get_state())
        yield
        generator.set_state(torch.get_rng_state())


def check_seeds(seeds: Sequence[int]) -> list[int]:
    out = []
    for s in seeds:
        if not is_int(s) or not 0 <= s < 2**63:
            raise ValueError(f"seed must be an int in [0, 2**63), got {s!r}")
        out.append(int(s))
    if not out:
        raise ValueError("seeds must name at least one image (batch size >= 1)")
    return out


class ImageStreams:
    """One CPU generator per image for one named stream; draws return (B, *shape) tensors on ``device``."""

    def __init__(self, seeds: Sequence[int], stream: str, device: torch.device | str = "cpu"):
        if stream not in STREAMS:
            raise ValueError(f"unknown random stream {stream!r}; choose from {STREAMS}")
        self.device = torch.device(device)
        self.generators = [torch.Generator().manual_seed(stream_seed(s, stream)) for s in check_seeds(seeds)]

    def __len__(self) -> int:
        return len(self.generators)

    def _placed(self, drawn: Tensor) -> Tensor:
        """A host draw on the streams' device: on CUDA copied from pinned memory without a host wait."""
        if self.device.type == "cpu":
            return drawn
        if self.device.type == "cuda":
            drawn = drawn.pin_memory()
        return drawn.to(self.device, non_blocking=True)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return self._placed(torch.stack([torch.randn(shape, generator=g, dtype=dtype) for g in self.generators]))

    def rand(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return self._placed(torch.stack([torch.rand(shape, generator=g, dtype=dtype) for g in self.generators]))

    def randperm(self, n: int) -> Tensor:
        return self._placed(torch.stack([torch.randperm(n, generator=g) for g in self.generators]))

    def randn_rows(self, counts: Tensor, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """``counts[i]`` rows of shape ``shape`` for image i, concatenated image by image: (sum, *shape).

        Images with no rows draw nothing, so what an image gets never depends on the others."""
        return self._rows(torch.randn, counts, shape, dtype)

    def rand_rows(self, counts: Tensor, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return self._rows(torch.rand, counts, shape, dtype)

    def _rows(self, draw, counts: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        parts = [
            draw((int(c), *shape), generator=g, dtype=dtype)
            for g, c in zip(self.generators, counts.tolist(), strict=True)
            if c
        ]
        return self._placed(torch.cat(parts) if parts else torch.empty((0, *shape), dtype=dtype))
