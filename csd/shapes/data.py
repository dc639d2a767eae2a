"""Procedural class-conditional "shapes" dataset: tiny images the project renders itself (no downloads).

Each image is one anti-aliased shape of a class (random colour, size, position, rotation) on a flat,
gradient or textured background, with a short caption such as
"a small red star on a blue to white gradient". Rendering is vectorised with numpy over batches of
images (signed distance fields on a pixel grid, one numpy pass per class group), so 50k 32x32 images
take a few seconds on a 2-core CPU.

Determinism: image ``i`` depends only on ``(seed, i)`` and its label; its random parameters come from
its own generator seeded with ``SeedSequence([seed, i])``, so a dataset of 1000 images starts with the
same 100 images as a dataset of 100.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from csd.core.checks import check_int

CLASS_NAMES: tuple[str, ...] = (
    "circle",
    "square",
    "triangle",
    "star",
    "ring",
    "cross",
    "diamond",
    "heart",
    "stripes",
    "checker",
)
NUM_CLASSES = len(CLASS_NAMES)

# Caption nouns; the two pattern classes are filled regions, and their nouns keep the class name.
_CLASS_NOUNS = {"stripes": "stripes pattern", "checker": "checker pattern"}

# Named colours (RGB in [0, 1]): shape colours are drawn from these (plus a small jitter), and every
# colour in a caption is the nearest entry.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.10, 0.10),
    "orange": (1.00, 0.55, 0.05),
    "yellow": (0.96, 0.90, 0.12),
    "green": (0.12, 0.68, 0.20),
    "cyan": (0.10, 0.80, 0.85),
    "blue": (0.12, 0.26, 0.90),
    "purple": (0.55, 0.16, 0.75),
    "pink": (1.00, 0.52, 0.76),
    "brown": (0.50, 0.30, 0.10),
    "white": (0.97, 0.97, 0.97),
    "gray": (0.50, 0.50, 0.50),
    "black": (0.05, 0.05, 0.05),
}
_PALETTE_NAMES = tuple(PALETTE)
_PALETTE_RGB = np.array([PALETTE[n] for n in _PALETTE_NAMES], dtype=np.float64)
_LUMA = np.array([0.299, 0.587, 0.114])  # Rec. 601 weights; they sum to 1

BACKGROUNDS = ("plain", "gradient", "textured")

# Layout of each image's uniform draws (offsets into its row); the texture noise grid follows them.
_U_SIZE, _U_CX, _U_CY, _U_ROT = 0, 1, 2, 3
_U_FG, _U_JIT = 4, 5  # palette pick; per-channel jitter 5..7
_U_BG_KIND, _U_SIDE, _U_Y1, _U_Y2 = 8, 9, 10, 11
_U_DIR1, _U_SAT1, _U_DIR2, _U_SAT2 = 12, 15, 16, 19  # chroma directions take 3 draws each
_U_ANGLE = 20
_N_PARAMS = 21

# Pixels rendered per numpy pass (1024 images at 32x32): large enough to amortise numpy overhead,
# small enough to keep the float64 working set near 100 MB at any image size.
_CHUNK_PIXELS = 1024 * 32 * 32


@dataclass(frozen=True)
class ShapesConfig:
    """Rendering parameters. Sizes and positions are fractions of the image side."""

    image_size: int = 32
    size_range: tuple[float, float] = (0.40, 0.75)  # shape's bounding-circle diameter / image side
    max_rotation_deg: float = 30.0  # kept small so heart/triangle/cross keep their canonical look
    max_overhang: float = 0.10  # fraction of the shape's radius allowed to leave the image
    min_luminance_gap: float = 0.30  # between the shape colour and every background colour
    color_jitter: float = 0.06  # per-channel jitter around the palette colour
    texture_amplitude: float = 0.08  # luminance noise amplitude of textured backgrounds
    background_probs: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)  # plain, gradient, textured

    def __post_init__(self) -> None:
        size = self.image_size
        if not (isinstance(size, int) and 16 <= size <= 128 and size % 4 == 0):
            raise ValueError(f"image_size must be an int in 16..128 and a multiple of 4, got {size!r}")
        lo, hi = self.size_range
        if not 0.1 <= lo <= hi <= 1.0:
            raise ValueError(f"size_range must satisfy 0.1 <= low <= high <= 1.0, got {self.size_range!r}")
        _check_range("max_rotation_deg", self.max_rotation_deg, 0.0, 180.0)
        _check_range("max_overhang", self.max_overhang, 0.0, 0.5)
        _check_range("min_luminance_gap", self.min_luminance_gap, 0.0, 0.4)
        _check_range("color_jitter", self.color_jitter, 0.0, 0.2)
        _check_range("texture_amplitude", self.texture_amplitude, 0.0, 0.1)
        probs = self.background_probs
        if len(probs) != 3 or min(probs) < 0 or sum(probs) <= 0:
            raise ValueError(
                "background_probs must be 3 non-negative weights (plain, gradient, textured) with a "
                f"positive sum, got {probs!r}"
            )


def _check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")


@dataclass
class ShapesDataset:
    """Rendered images (N,3,H,W) float32 in [-1, 1], labels (N,) int64, one caption per image and the
    shape's coverage of each pixel (N,H,W) uint8 (0: background, 255: shape), what a loss weighted toward
    the shape's tokens reads."""

    images: torch.Tensor
    labels: torch.Tensor
    captions: list[str]
    coverage: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def class_id(name_or_id: str | int) -> int:
    """Class index for a class name (case-insensitive) or an index; ValueError lists valid classes."""
    valid = ", ".join(f"{i}={n}" for i, n in enumerate(CLASS_NAMES))
    if isinstance(name_or_id, str):
        key = name_or_id.strip().lower()
        if key in CLASS_NAMES:
            return CLASS_NAMES.index(key)
    elif isinstance(name_or_id, (int, np.integer)) and not isinstance(name_or_id, bool):
        if 0 <= name_or_id < NUM_CLASSES:
            return int(name_or_id)
    raise ValueError(f"unknown class {name_or_id!r}; valid classes: {valid}")


def make_dataset(
    n: int,
    seed: int,
    config: ShapesConfig | None = None,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None = None,
) -> ShapesDataset:
    """Render ``n`` images; without ``labels`` the classes are cycled (0, 1, ..., 9, 0, ...), balanced."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    labels_arr = np.arange(n) % NUM_CLASSES if labels is None else _as_labels(labels)
    if len(labels_arr) != n:
        raise ValueError(f"got {len(labels_arr)} labels for n={n}")
    config = config or ShapesConfig()
    size = config.image_size
    images = torch.empty((n, 3, size, size), dtype=torch.float32)
    coverage = torch.empty((n, size, size), dtype=torch.uint8)
    captions: list[str] = []
    step = max(1, _CHUNK_PIXELS // size**2)
    for start in range(0, n, step):
        chunk, chunk_captions, chunk_coverage = _render(labels_arr[start : start + step], seed, config, start)
        images[start : start + len(chunk)] = chunk
        coverage[start : start + len(chunk)] = torch.from_numpy(np.round(chunk_coverage * 255.0).astype(np.uint8))
        captions.extend(chunk_captions)
    return ShapesDataset(images, torch.from_numpy(labels_arr.astype(np.int64)), captions, coverage)


def render_batch(
    labels: Sequence[int] | np.ndarray | torch.Tensor,
    seed: int,
    config: ShapesConfig | None = None,
    start: int = 0,
) -> tuple[torch.Tensor, list[str]]:
    """Render one image per label; image ``k`` is the dataset image ``start + k`` of ``seed``.

    Returns images (B,3,H,W) float32 in [-1, 1] and their captions.
    """
    images, captions, _ = _render(labels, seed, config, start)
    return images, captions


def _render(
    labels: Sequence[int] | np.ndarray | torch.Tensor, seed: int, config: ShapesConfig | None, start: int
) -> tuple[torch.Tensor, list[str], np.ndarray]:
    """:func:`render_batch`, and the shape's coverage of each pixel (B,H,W) float64 in [0, 1]."""
    config = config or ShapesConfig()
    labels_arr = _as_labels(labels)
    size = config.image_size
    p, noise = _draw(seed, start, len(labels_arr), config)

    coords = (np.arange(size) + 0.5) / size * 2.0 - 1.0  # pixel centres in [-1, 1]
    x = coords[None, None, :]
    y = -coords[None, :, None]  # image rows go down; shapes are defined with y up

    # Background (B,3,H,W): colour 1, blended to colour 2 along a direction, plus luminance texture.
    cos_a, sin_a = np.cos(p["angle"])[:, None, None], np.sin(p["angle"])[:, None, None]
    ramp = np.clip(0.5 + 0.5 * (cos_a * x + sin_a * y), 0.0, 1.0) * (p["bg_kind"] == 1)[:, None, None]
    texture = _upsample(noise, size) * (config.texture_amplitude * (p["bg_kind"] == 2))[:, None, None]
    bg1, bg2 = p["bg1"][:, :, None, None], p["bg2"][:, :, None, None]
    image = bg1 + (bg2 - bg1) * ramp[:, None] + texture[:, None]

    # Shape: per-pixel coverage from a signed distance (1 px anti-aliasing ramp), per class group.
    coverage = np.zeros((len(labels_arr), size, size))
    pattern = np.ones((len(labels_arr), size, size))
    cos_r, sin_r = np.cos(p["rot"]), np.sin(p["rot"])
    for cls in np.unique(labels_arr):
        idx = np.flatnonzero(labels_arr == cls)
        r = p["radius"][idx, None, None]
        dx, dy = x - p["cx"][idx, None, None], y - p["cy"][idx, None, None]
        c, s = cos_r[idx, None, None], sin_r[idx, None, None]
        lx, ly = (c * dx + s * dy) / r, (-s * dx + c * dy) / r  # local frame: unit bounding circle
        px_per_unit = r * size / 2.0
        dist, pat = _shape(CLASS_NAMES[cls], lx, ly, px_per_unit)
        coverage[idx] = np.clip(0.5 - dist * px_per_unit, 0.0, 1.0)
        if pat is not None:
            pattern[idx] = pat
    fg = p["fg"][:, :, None, None] * pattern[:, None] + p["fg2"][:, :, None, None] * (1.0 - pattern[:, None])
    image = image + (fg - image) * coverage[:, None]

    images = torch.from_numpy(np.clip(image * 2.0 - 1.0, -1.0, 1.0).astype(np.float32))
    captions = [_caption(int(cls), p, k, config) for k, cls in enumerate(labels_arr)]
    return images, captions, coverage


def captions(n: int, seed: int, start: int = 0, config: ShapesConfig | None = None) -> list[str]:
    """The captions of the dataset images ``start`` to ``start + n - 1`` of ``seed``, classes cycled as in
    :func:`make_dataset`: ``make_dataset(start + n, seed).captions[start:]``, drawn without rendering an image."""
    check_int("n", n, 0)
    check_int("start", start, 0)
    config = config or ShapesConfig()
    labels = np.arange(start, start + n) % NUM_CLASSES
    p, _ = _draw(seed, start, n, config)
    return [_caption(int(cls), p, k, config) for k, cls in enumerate(labels)]


def _draw(seed: int, start: int, n: int, config: ShapesConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Images ``start`` to ``start + n - 1`` of ``seed``: their shape and background parameters and their
    texture noise (n, grid, grid) in [-1, 1], one texture node per 4 px."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    grid = config.image_size // 4
    u = _uniforms(seed, start, n, _N_PARAMS + grid * grid)
    return _sample_params(u[:, :_N_PARAMS], config), u[:, _N_PARAMS:].reshape(-1, grid, grid) * 2.0 - 1.0


def _uniforms(seed: int, start: int, n: int, count: int) -> np.ndarray:
    """(n, count) uniforms; row k comes from its own generator seeded by (seed, start + k)."""
    rows = [np.random.default_rng(np.random.SeedSequence([seed, start + k])).random(count) for k in range(n)]
    return np.stack(rows) if rows else np.zeros((0, count))


def _as_labels(labels: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    arr = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"labels must be a 1-D sequence of class ids, got {arr.dtype} of shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= NUM_CLASSES):
        raise ValueError(f"labels must be in 0..{NUM_CLASSES - 1}, got values in {arr.min()}..{arr.max()}")
    return arr.astype(np.int64)


def _sample_params(u: np.ndarray, config: ShapesConfig) -> dict[str, np.ndarray]:
    """Map each image's uniforms (B, _N_PARAMS) to its shape and background parameters."""
    lo, hi = config.size_range
    size_frac = lo + (hi - lo) * u[:, _U_SIZE]
    radius = size_frac  # diameter size_frac * 2 in the [-1, 1] frame
    # Keep the bounding circle inside the image up to the allowed overhang.
    reach = np.maximum(1.0 - radius * (1.0 - config.max_overhang), 0.0)
    cx = (2.0 * u[:, _U_CX] - 1.0) * reach
    cy = (2.0 * u[:, _U_CY] - 1.0) * reach
    rot = np.deg2rad(config.max_rotation_deg) * (2.0 * u[:, _U_ROT] - 1.0)

    fg_index = np.minimum((u[:, _U_FG] * len(_PALETTE_NAMES)).astype(int), len(_PALETTE_NAMES) - 1)
    jitter = config.color_jitter * (2.0 * u[:, _U_JIT : _U_JIT + 3] - 1.0)
    fg = np.clip(_PALETTE_RGB[fg_index] + jitter, 0.0, 1.0)
    fg_luma = fg @ _LUMA
    # Pattern classes alternate the shape colour with a shade of it (darker for light colours).
    fg2 = np.where((fg_luma > 0.5)[:, None], fg * 0.35, fg + (1.0 - fg) * 0.6)

    weights = np.asarray(config.background_probs, dtype=np.float64)
    bg_kind = np.searchsorted(np.cumsum(weights / weights.sum()), u[:, _U_BG_KIND], side="right")
    bg_kind = np.minimum(bg_kind, 2)

    # Both background colours lie on one side of the shape's luminance, at least the gap (plus the
    # texture amplitude) away, so the shape stays visible everywhere, including across a gradient.
    gap = config.min_luminance_gap + config.texture_amplitude
    below = np.maximum(fg_luma - gap, 0.0)  # allowed luminance interval [0, below]
    above_lo = np.minimum(fg_luma + gap, 1.0)  # allowed luminance interval [above_lo, 1]
    len_above = 1.0 - above_lo
    total = np.maximum(below + len_above, 1e-9)
    use_below = u[:, _U_SIDE] * total < below
    if_below = np.stack([u[:, _U_Y1], u[:, _U_Y2]], 1) * below[:, None]
    if_above = above_lo[:, None] + np.stack([u[:, _U_Y1], u[:, _U_Y2]], 1) * len_above[:, None]
    lumas = np.where(use_below[:, None], if_below, if_above)
    lumas[:, 1] = np.where(bg_kind == 1, lumas[:, 1], lumas[:, 0])
    bg1 = _colour_with_luma(lumas[:, 0], u[:, _U_DIR1 : _U_DIR1 + 3], u[:, _U_SAT1])
    bg2 = _colour_with_luma(lumas[:, 1], u[:, _U_DIR2 : _U_DIR2 + 3], u[:, _U_SAT2])
    bg2 = np.where((bg_kind == 1)[:, None], bg2, bg1)
    return {
        "size_frac": size_frac,
        "radius": radius,
        "cx": cx,
        "cy": cy,
        "rot": rot,
        "fg": fg,
        "fg2": fg2,
        "fg_index": fg_index,
        "bg_kind": bg_kind,
        "bg1": bg1,
        "bg2": bg2,
        "angle": 2.0 * math.pi * u[:, _U_ANGLE],
    }


def _colour_with_luma(luma: np.ndarray, direction: np.ndarray, saturation: np.ndarray) -> np.ndarray:
    """A random colour of exactly the given luminance: grey ``luma`` plus a luminance-free chroma.

    The chroma is scaled to stay inside the RGB cube, so no clipping shifts the luminance.
    """
    chroma = direction - (direction @ _LUMA)[:, None]
    limit = np.where(chroma > 0, 1.0 - luma[:, None], luma[:, None])  # distance to the cube face
    with np.errstate(divide="ignore"):
        room = np.where(chroma != 0, limit / np.abs(chroma), np.inf)
    scale = np.minimum(room.min(axis=1), 1.0) * saturation
    return np.clip(luma[:, None] + chroma * scale[:, None], 0.0, 1.0)


def _upsample(noise: np.ndarray, size: int) -> np.ndarray:
    """Bilinear upsampling (B,G,G) -> (B,size,size) as two small matrix products."""
    grid = noise.shape[-1]
    pos = np.clip((np.arange(size) + 0.5) / size * grid - 0.5, 0.0, grid - 1.0)
    left = np.minimum(np.floor(pos).astype(int), grid - 2)
    frac = pos - left
    interp = np.zeros((size, grid))
    interp[np.arange(size), left] = 1.0 - frac
    interp[np.arange(size), left + 1] = frac
    return interp @ noise @ interp.T


# --- signed distances (negative inside) in the local frame, where each shape fits the unit circle ---


def _shape(name: str, x: np.ndarray, y: np.ndarray, px_per_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Signed distance of class ``name`` and, for the pattern classes, the fill pattern in [0, 1]."""
    if name == "circle":
        return np.hypot(x, y) - 0.88, None
    if name == "square":
        return _box(x, y, 0.66, 0.66), None
    if name == "triangle":
        return _triangle(x, y, 1.05), None  # slightly past the unit circle: triangles look small
    if name == "star":
        return _star5(x, y + 0.05, 1.0, 0.45), None
    if name == "ring":
        return np.abs(np.hypot(x, y) - 0.66) - 0.24, None
    if name == "cross":
        return np.minimum(_box(x, y, 0.9, 0.26), _box(x, y, 0.26, 0.9)), None
    if name == "diamond":
        return _rhombus(x, y, 0.66, 1.0), None
    if name == "heart":
        scale = 0.62
        return _heart(x * scale, y * scale + 0.58) / scale, None
    if name == "stripes":
        # Disc of 3 bands of the shape colour; ~1 px anti-aliased band edges.
        return np.hypot(x, y) - 0.92, _band(y, 0.62, px_per_unit)
    if name == "checker":
        # 3x3 checkerboard filling a square: cells align with its edges, corners in the shape colour.
        cell = 0.55
        sx = 2.0 * _band(x, 2 * cell, px_per_unit) - 1.0
        sy = 2.0 * _band(y, 2 * cell, px_per_unit) - 1.0
        return _box(x, y, 1.5 * cell, 1.5 * cell), 0.5 + 0.5 * sx * sy
    raise AssertionError(f"no renderer for class {name!r}")


def _band(t: np.ndarray, period: float, px_per_unit: np.ndarray) -> np.ndarray:
    """Anti-aliased bands half a period wide centred at t = k * period: 1 inside, 0 outside."""
    phase = t / period
    to_centre = np.abs(phase - np.round(phase)) * period
    return np.clip(0.5 + (0.25 * period - to_centre) * px_per_unit, 0.0, 1.0)


def _box(x: np.ndarray, y: np.ndarray, hx: float, hy: float) -> np.ndarray:
    qx, qy = np.abs(x) - hx, np.abs(y) - hy
    return np.hypot(np.maximum(qx, 0.0), np.maximum(qy, 0.0)) + np.minimum(np.maximum(qx, qy), 0.0)


def _triangle(x: np.ndarray, y: np.ndarray, circumradius: float) -> np.ndarray:
    """Equilateral triangle pointing up, centroid at the origin (after Inigo Quilez)."""
    k = math.sqrt(3.0)
    r = circumradius * k / 2.0  # half the side length
    px, py = np.abs(x) - r, y + r / k
    fold = px + k * py > 0.0
    px, py = np.where(fold, (px - k * py) / 2.0, px), np.where(fold, (-k * px - py) / 2.0, py)
    px = px - np.clip(px, -2.0 * r, 0.0)
    return -np.hypot(px, py) * np.sign(py)


def _star5(x: np.ndarray, y: np.ndarray, r: float, inner: float) -> np.ndarray:
    """Five-pointed star pointing up (after Inigo Quilez); ``inner`` is the inner/outer radius ratio."""
    k1x, k1y = 0.809016994375, -0.587785252292
    px, py = np.abs(x), y
    d = 2.0 * np.maximum(k1x * px + k1y * py, 0.0)
    px, py = px - d * k1x, py - d * k1y
    d = 2.0 * np.maximum(-k1x * px + k1y * py, 0.0)
    px, py = px + d * k1x, py - d * k1y
    px, py = np.abs(px), py - r
    bax, bay = -inner * k1y, inner * k1x - 1.0
    h = np.clip((px * bax + py * bay) / (bax * bax + bay * bay), 0.0, r)
    return np.hypot(px - bax * h, py - bay * h) * np.sign(py * bax - px * bay)


def _rhombus(x: np.ndarray, y: np.ndarray, bx: float, by: float) -> np.ndarray:
    """Rhombus with half-diagonals ``bx``, ``by`` (after Inigo Quilez)."""
    px, py = np.abs(x), np.abs(y)
    h = np.clip(((bx - 2.0 * px) * bx - (by - 2.0 * py) * by) / (bx * bx + by * by), -1.0, 1.0)
    d = np.hypot(px - 0.5 * bx * (1.0 - h), py - 0.5 * by * (1.0 + h))
    return d * np.sign(px * by + py * bx - bx * by)


def _heart(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Heart with its tip at the origin, about 1.1 tall (after Inigo Quilez)."""
    px = np.abs(x)
    lobe = np.hypot(px - 0.25, y - 0.75) - math.sqrt(2.0) / 4.0
    t = 0.5 * np.maximum(px + y, 0.0)
    body = np.sqrt(np.minimum(px * px + (y - 1.0) ** 2, (px - t) ** 2 + (y - t) ** 2)) * np.sign(px - y)
    return np.where(px + y > 1.0, lobe, body)


# --- captions ---


def colour_name(rgb: Sequence[float] | np.ndarray) -> str:
    """Nearest named palette colour for an RGB triple in [0, 1]."""
    dist = ((_PALETTE_RGB - np.asarray(rgb, dtype=np.float64)) ** 2).sum(axis=1)
    return _PALETTE_NAMES[int(np.argmin(dist))]


def _with_article(words: str) -> str:
    return ("an " if words[0] in "aeiou" else "a ") + words


def _caption(cls: int, p: dict[str, np.ndarray], k: int, config: ShapesConfig) -> str:
    lo, hi = config.size_range
    third = (p["size_frac"][k] - lo) / max(hi - lo, 1e-9)
    size_word = "small" if third < 1 / 3 else ("medium" if third < 2 / 3 else "large")
    name = CLASS_NAMES[cls]
    shape = f"{size_word} {_PALETTE_NAMES[p['fg_index'][k]]} {_CLASS_NOUNS.get(name, name)}"
    bg1, bg2 = colour_name(p["bg1"][k]), colour_name(p["bg2"][k])
    kind = BACKGROUNDS[int(p["bg_kind"][k])]
    if kind == "gradient":
        background = f"{bg1} gradient" if bg1 == bg2 else f"{bg1} to {bg2} gradient"
    else:
        background = f"{kind} {bg1} background"
    return f"{_with_article(shape)} on {_with_article(background)}"


def caption_colour(caption: str) -> int:
    """The palette index of the shape's colour named in a caption ("a small red star on ...")."""
    words = caption.split()
    if len(words) < 3 or words[2] not in PALETTE:
        raise ValueError(f"not a shapes caption: {caption!r}")
    return _PALETTE_NAMES.index(words[2])


# --- contact sheet ---


def contact_sheet(
    data: ShapesDataset | torch.Tensor,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None,
    path: str | Path,
    per_class: int = 8,
    scale: int = 3,
) -> Path:
    """Write a PNG grid: one labelled row per class, the first ``per_class`` images of that class.

    ``data`` is a dataset (``labels`` may then be None) or images (N,3,H,W) in [-1, 1] with labels.
    Images are upscaled ``scale`` times with nearest-neighbour so that pixels stay visible.
    """
    from PIL import Image, ImageDraw  # imported here: only the contact sheet needs Pillow

    images = data.images if isinstance(data, ShapesDataset) else data
    if labels is None and isinstance(data, ShapesDataset):
        labels = data.labels
    if labels is None:
        raise ValueError("labels are required when images are passed as a tensor")
    labels_arr = _as_labels(labels)
    if len(labels_arr) != len(images):
        raise ValueError(f"got {len(labels_arr)} labels for {len(images)} images")
    pixels = ((images.detach().cpu().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).numpy()
    tile = images.shape[-1] * scale
    pad, label_w = 2, 70
    rows = [int(c) for c in np.unique(labels_arr)]
    width, height = label_w + per_class * (tile + pad) + pad, len(rows) * (tile + pad) + pad
    sheet = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(sheet)
    for row, cls in enumerate(rows):
        top = pad + row * (tile + pad)
        draw.text((4, top + tile // 2 - 5), CLASS_NAMES[cls], fill="black")
        for col, i in enumerate(np.flatnonzero(labels_arr == cls)[:per_class]):
            img = Image.fromarray(pixels[i]).resize((tile, tile), Image.NEAREST)
            sheet.paste(img, (label_w + pad + col * (tile + pad), top))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Render a contact sheet of the procedural shapes dataset.")
    parser.add_argument("--out", type=Path, default=Path("assets/shapes_contact_sheet.png"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--scale", type=int, default=3, help="nearest-neighbour upscaling factor")
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args(argv)
    dataset = make_dataset(NUM_CLASSES * args.per_class, args.seed, ShapesConfig(image_size=args.image_size))
    path = contact_sheet(dataset, None, args.out, per_class=args.per_class, scale=args.scale)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
