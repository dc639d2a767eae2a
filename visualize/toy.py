"""The 1-D toy: target p and draft q densities, the residual max(0, p - q), and a sample histogram over p."""

from __future__ import annotations

import numpy as np

from visualize.chart import PALETTE, Chart, Series


def _pdf(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))


def toy_chart(
    p: tuple[float, float], q: tuple[float, float], samples: np.ndarray | None = None, note: str = "", bins: int = 60
) -> Chart:
    """p and q are (mean, std); ``samples`` (speculative outputs) are drawn as a density histogram."""
    lo = min(p[0] - 4 * p[1], q[0] - 4 * q[1])
    hi = max(p[0] + 4 * p[1], q[0] + 4 * q[1])
    x = np.linspace(lo, hi, 400)
    dp, dq = _pdf(x, *p), _pdf(x, *q)
    series = [
        Series(
            "max(0, p - q): what resampling adds",
            x.tolist(),
            np.maximum(0.0, dp - dq).tolist(),
            kind="area",
            color=PALETTE[3],
        ),
        Series("target p", x.tolist(), dp.tolist(), color=PALETTE[0]),
        Series("draft q", x.tolist(), dq.tolist(), color=PALETTE[1], dash=True),
    ]
    if samples is not None and samples.size:
        counts, edges = np.histogram(samples, bins=bins, range=(lo, hi), density=True)
        centers = (edges[:-1] + edges[1:]) / 2
        series.insert(
            0,
            Series(
                "speculative samples",
                centers.tolist(),
                counts.tolist(),
                kind="bar",
                width=float(edges[1] - edges[0]),
                color="#999999",
            ),
        )
    return Chart("Speculative sampling of one Gaussian token", "x", "density", series, barmode="overlay", note=note)
