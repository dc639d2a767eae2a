"""Image grids and the accepted-token map (who made each token, as a colour over the image)."""

from __future__ import annotations

import html
import math

import numpy as np

from csd.trace import Maker

# Okabe-Ito colours, one per maker of a CSD token.
MAKER_STYLE: dict[Maker, tuple[str, tuple[int, int, int]]] = {
    Maker.PREFILL: ("pre-fill (target)", (0, 114, 178)),
    Maker.ACCEPTED: ("draft, accepted", (0, 158, 115)),
    Maker.RESAMPLED: ("rejected, resampled", (240, 228, 66)),
    Maker.CAPPED: ("resampler cap hit", (204, 121, 167)),
}
DISPLAY_SIDE = 256  # pixels a single image is upscaled to (at least), so 32 px tokens are visible


def upscale_factor(side: int) -> int:
    return max(1, DISPLAY_SIDE // side)


def upscale(images: np.ndarray, factor: int) -> np.ndarray:
    """(B, H, W, C) -> (B, H f, W f, C) by nearest neighbour: every pixel stays a crisp square."""
    return images.repeat(factor, axis=1).repeat(factor, axis=2)


def tile(images: np.ndarray, pad: int = 4, fill: int = 255) -> np.ndarray:
    """(B, H, W, C) -> one (rows H', cols W', C) grid, ceil(sqrt(B)) images per row."""
    b, h, w, c = images.shape
    cols = math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    out = np.full((rows * h + (rows - 1) * pad, cols * w + (cols - 1) * pad, c), fill, dtype=images.dtype)
    for i in range(b):
        r, k = divmod(i, cols)
        out[r * (h + pad) : r * (h + pad) + h, k * (w + pad) : k * (w + pad) + w] = images[i]
    return out


def locate(x: int, y: int, batch: int, num_tokens: int, image_side: int, pad: int = 4) -> tuple[int, int, int]:
    """The (image, token row, token column) under pixel (x, y) of a :func:`display_grid` or
    :func:`token_map` of ``batch`` images of ``image_side`` pixels; ValueError on padding or outside."""
    side = upscale_factor(image_side) * image_side
    cols = math.ceil(math.sqrt(batch))
    (c, dx), (r, dy) = divmod(x, side + pad), divmod(y, side + pad)
    image = r * cols + c
    if dx >= side or dy >= side or c >= cols or image >= batch or x < 0 or y < 0:
        raise ValueError(f"pixel ({x}, {y}) is not on an image of the grid")
    grid = math.isqrt(num_tokens)
    return image, dy * grid // side, dx * grid // side


def display_grid(images: np.ndarray) -> np.ndarray:
    """A batch of uint8 images as one upscaled grid."""
    return tile(upscale(images, upscale_factor(images.shape[1])))


def token_map(images: np.ndarray, maker: np.ndarray, alpha: float = 0.55, styles: dict | None = None) -> np.ndarray:
    """Tint each token cell of the (upscaled) images with its maker's colour and outline the cells.

    images (B, H, W, 3) uint8; maker (B, N) Maker values over a square grid of N cells; ``styles``
    maps values to (label, colour), :data:`MAKER_STYLE` by default (other values stay untinted)."""
    big = upscale(images, upscale_factor(images.shape[1])).astype(np.float32)
    b, h, w, _ = big.shape
    side = math.isqrt(maker.shape[1])
    cell_h, cell_w = h // side, w // side
    colours = np.zeros((b, side, side, 3), dtype=np.float32)
    tinted = np.zeros((b, side, side), dtype=bool)
    for m, (_, rgb) in (styles or MAKER_STYLE).items():
        hit = (maker == m).reshape(b, side, side)
        colours[hit] = rgb
        tinted |= hit
    colours = colours.repeat(cell_h, axis=1).repeat(cell_w, axis=2)
    tinted = tinted.repeat(cell_h, axis=1).repeat(cell_w, axis=2)[..., None]
    out = np.where(tinted, (1 - alpha) * big + alpha * colours, big)
    out[:, ::cell_h] = out[:, :, ::cell_w] = 40  # cell outlines
    return tile(out.round().astype(np.uint8))


def legend_html(styles: dict | None = None) -> str:
    swatch = (
        '<span style="display:inline-block;width:14px;height:14px;margin:0 4px 0 12px;'
        'vertical-align:middle;background:rgb{rgb}"></span>{label}'
    )
    styles = styles or MAKER_STYLE
    items = "".join(swatch.format(rgb=rgb, label=html.escape(label)) for label, rgb in styles.values())
    return f'<div class="csd-legend">{items}</div>'
