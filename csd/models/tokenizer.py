"""Image <-> token grids. MAR's patch order: a token is one cell's (C, p, p) block, row-major cells."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def patchify(x: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, (H/p)(W/p), C p p)."""
    b, c, h, w = x.shape
    if h % patch or w % patch:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {patch}")
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return torch.einsum("nchpwq->nhwcpq", x).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: Tensor, patch: int, channels: int) -> Tensor:
    """(B, N, C p p) -> (B, C, H, W) for a square grid of N cells."""
    b, n, _ = tokens.shape
    side = int(round(n**0.5))
    if side * side != n:
        raise ValueError(f"token count {n} is not a square grid")
    x = tokens.reshape(b, side, side, channels, patch, patch)
    return torch.einsum("nhwcpq->nchpwq", x).reshape(b, channels, side * patch, side * patch)


@dataclass(frozen=True)
class PixelTokenizer:
    """Raw pixel patches as continuous tokens (the embedded models): values in [-1, 1]."""

    patch_size: int = 4
    channels: int = 3
    network = False  # decoding is arithmetic: no model runs

    @property
    def token_dim(self) -> int:
        return self.channels * self.patch_size**2

    def encode(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.shape[1] != self.channels:
            raise ValueError(f"images must be (B, {self.channels}, H, W), got {tuple(images.shape)}")
        if images.numel() and (images.min() < -1.0 or images.max() > 1.0):
            raise ValueError("images must have values in [-1, 1]")
        return patchify(images, self.patch_size)

    def decode(self, tokens: Tensor) -> Tensor:
        """Tokens -> images, clamped to [-1, 1] (sampled tokens may overshoot slightly)."""
        return unpatchify(tokens, self.patch_size, self.channels).clamp(-1.0, 1.0)


def pixel_tokenizer(token_dim: int) -> PixelTokenizer:
    """The tokenizer of pixel tokens ``token_dim`` wide: 3 x p x p RGB patches."""
    patch = math.isqrt(token_dim // 3)
    if 3 * patch * patch != token_dim:
        raise ValueError(f"token width {token_dim} is not an RGB pixel patch (3 p^2)")
    return PixelTokenizer(patch_size=patch)


def to_uint8(images: Tensor) -> Tensor:
    """(B, C, H, W) in [-1, 1] -> (B, H, W, C) uint8 for saving and display."""
    return ((images.clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()


class LatentTokenizer:
    """KL-16 latents as tokens (official MAR): image -> scaled latent grid -> (B, N, C p p)."""

    network = True  # decoding runs the VAE's decoder

    def __init__(self, vae, patch_size: int = 1):
        self.vae, self.patch_size = vae, patch_size

    @property
    def token_dim(self) -> int:
        return self.vae.embed_dim * self.patch_size**2

    def encode(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Posterior mean (or a sample when a generator is given), scaled as MAR trains on it."""
        return patchify(self.vae.image_to_tokens(images, generator), self.patch_size)

    def decode(self, tokens: Tensor) -> Tensor:
        latents = unpatchify(tokens, self.patch_size, self.vae.embed_dim)
        return self.vae.tokens_to_image(latents).clamp(-1.0, 1.0)


def cell_order(grid: int, cells: int) -> Tensor:
    """Raster index of each position in cell order: cells row-major, tokens row-major inside a cell
    (the official ``clusterify``). (grid*grid,) long."""
    per = math.isqrt(cells)
    side = grid // per
    index = torch.arange(grid * grid).reshape(per, side, per, side)  # (cell row, row in cell, cell col, col)
    return index.permute(0, 2, 1, 3).reshape(-1)


class CellTokenizer:
    """Tokens grouped into cells (xAR): (B, cells, cell_len * d) in raster order of cells, each cell's
    tokens row-major inside it, over an inner tokenizer's (B, grid * grid, d) raster tokens."""

    def __init__(self, inner, grid: int, cells: int):
        self.inner, self.grid, self.cells = inner, grid, cells
        self.order = cell_order(grid, cells)  # cell-order position -> raster index
        self.network = inner.network

    @property
    def token_dim(self) -> int:
        return self.inner.token_dim * self.grid * self.grid // self.cells

    def to_cells(self, raster: Tensor) -> Tensor:
        b = raster.shape[0]
        return raster[:, self.order.to(raster.device)].reshape(b, self.cells, -1)

    def to_raster(self, cells: Tensor) -> Tensor:
        b = cells.shape[0]
        flat = cells.reshape(b, self.grid * self.grid, -1)
        raster = torch.empty_like(flat)
        raster[:, self.order.to(flat.device)] = flat
        return raster

    def encode(self, images: Tensor, *args) -> Tensor:
        return self.to_cells(self.inner.encode(images, *args))

    def decode(self, tokens: Tensor) -> Tensor:
        return self.inner.decode(self.to_raster(tokens))
