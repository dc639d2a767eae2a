"""Figures of artifact inspection: replay frames (:mod:`csd.records.replay_frames`) as images, and one token's
two chains (as the inspector reports them) as a chart. The decoder of tokens to pixels is passed in."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from csd.records.replay_frames import DRAFTED, Frame
from visualize.chart import Chart, Series
from visualize.images import MAKER_STYLE, display_grid, token_map

REPLAY_STYLE = MAKER_STYLE | {DRAFTED: ("drafted, being verified", (230, 159, 0))}

Decode = Callable[[torch.Tensor], np.ndarray]  # tokens (B, N, d) -> images (B, H, W, 3) uint8


def frame_images(frame: Frame, decode: Decode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSD canvas, the same canvas tinted by status (drafted, accepted, resampled, ...) and the
    target-only canvas after as many AR steps; unknown tokens are zeros (grey for pixel tokens)."""
    csd = decode(torch.from_numpy(frame.tokens))
    target = decode(torch.from_numpy(frame.target_tokens))
    return display_grid(csd), token_map(csd, frame.status, styles=REPLAY_STYLE), display_grid(target)


def chains_chart(info: dict) -> Chart:
    """One token's two chains per transition: how far apart their means are, and their mean log std
    (the trajectory term sums the gap between the two log stds over every value and step)."""
    chains = info.get("chains")
    if chains is None:
        return Chart("No chain details for this token", "transition", "", [])
    series = []
    draft_mean, target_mean = (np.asarray(chains[k]["mean"], dtype=np.float64) for k in ("draft", "target"))
    steps = list(range(draft_mean.shape[0]))
    gap = np.linalg.norm(draft_mean - target_mean, axis=-1)
    if np.isfinite(gap).any():
        values = [None if not np.isfinite(v) else float(v) for v in gap]
        series.append(Series("||mean q - mean p||", steps, values, color="#009E73"))
    for name, color in (("draft", "#E69F00"), ("target", "#0072B2")):
        log_std = np.log(np.asarray(chains[name]["std"], dtype=np.float64)).mean(axis=-1)
        if np.isfinite(log_std).any():
            values = [None if not np.isfinite(v) else float(v) for v in log_std]
            series.append(Series(f"mean log std, {name}", steps, values, color=color, dash=name == "draft"))
    prob = "n/a" if info["accept_prob"] is None else f"{info['accept_prob']:.3f}"
    note = f"maker {info['maker']}, AR step {info['ar_step'] + 1}; accept prob {prob}"
    title = f"Token ({info['row']}, {info['column']}) of image {info['image']}: the two chains"
    return Chart(title, "transition", "", series, note=note)
