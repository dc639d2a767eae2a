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
    Maker.ZEROED: ("cap hit, left at zero (published code)", (40, 40, 40)),
    Maker.NEXT: ("target, after an accepted block", (86, 180, 233)),
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


def token_map(images: np.ndarray, maker: np.ndarray, styles: dict | None = None) -> np.ndarray:
    """Each token cell in its maker's colour, exactly the legend's (no blending with the image), the cells
    outlined and each image numbered in its corner, laid out as :func:`display_grid` lays out the images.

    images (B, H, W, 3) uint8 (their size sets the map's); maker (B, N) Maker values over a square grid of
    N cells; ``styles`` maps values to (label, colour), :data:`MAKER_STYLE` by default (other values: grey)."""
    b, h = images.shape[0], images.shape[1] * upscale_factor(images.shape[1])
    side = math.isqrt(maker.shape[1])
    cell = h // side
    colours = np.full((b, side, side, 3), 235, dtype=np.uint8)
    for m, (_, rgb) in (styles or MAKER_STYLE).items():
        colours[(maker == m).reshape(b, side, side)] = rgb
    out = colours.repeat(cell, axis=1).repeat(cell, axis=2)
    out[:, ::cell] = out[:, :, ::cell] = 40  # cell outlines
    return tile(np.stack([numbered(im, i) for i, im in enumerate(out)]))


def numbered(image: np.ndarray, index: int) -> np.ndarray:
    """The image with its index in a small white box at the top left (PIL's built-in font: no files)."""
    from PIL import Image, ImageDraw

    im = Image.fromarray(image)
    draw = ImageDraw.Draw(im)
    text = str(index)
    box = draw.textbbox((3, 2), text)
    draw.rectangle((box[0] - 2, box[1] - 1, box[2] + 2, box[3] + 1), fill=(255, 255, 255))
    draw.text((3, 2), text, fill=(0, 0, 0))
    return np.asarray(im)


def legend_html(styles: dict | None = None) -> str:
    swatch = (
        '<span style="display:inline-block;width:14px;height:14px;margin:0 4px 0 12px;'
        'vertical-align:middle;background:rgb{rgb}"></span>{label}'
    )
    styles = styles or MAKER_STYLE
    items = "".join(swatch.format(rgb=rgb, label=html.escape(label)) for label, rgb in styles.values())
    return f'<div class="csd-legend">{items}</div>'
