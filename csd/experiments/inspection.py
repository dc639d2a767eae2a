"""Artifact inspection: any token opened, the likely artifacts ranked (the replay block by block is
:mod:`csd.records.replay_frames`). Everything comes from the run's trace and tokens (and the target-only run with the
same seeds); nothing here runs a model.

* :func:`inspect_token`: who made one token and why it was kept or redrawn;
* :func:`artifact_hints`: the tokens farthest from the target-only image at the same position.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from csd.records.panel_data import json_float
from csd.trace import Maker, Trace


def grid_side(num_tokens: int) -> int:
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f"tokens must form a square grid, got {num_tokens}")
    return side


def token_index(num_tokens: int, row: int, col: int) -> int:
    """Grid position of (row, col), checked; raises a ValueError naming the valid ranges."""
    side = grid_side(num_tokens)
    for name, v in (("row", row), ("column", col)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < side:
            raise ValueError(f"token {name} must be an int in [0, {side - 1}], got {v!r}")
    return row * side + col


def _floats(a: np.ndarray) -> list:
    return [None if not math.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64).reshape(-1)]


def inspect_token(tokens: Tensor, trace: Trace, target_tokens: Tensor, image: int, index: int) -> dict:
    """Everything the run knows about token ``index`` of image ``image``, JSON-ready: who made it, at
    which AR step and block; the draft's proposal, the target's own sample and the final token (and
    the target-only run's token there); the acceptance probability, its two terms and the draw it was
    compared with; the resampler's tries; both chains' per-step means and stds (T, d)."""
    batch, n = trace.maker.shape
    if not isinstance(image, int) or isinstance(image, bool) or not 0 <= image < batch:
        raise ValueError(f"image must be an int in [0, {batch - 1}], got {image!r}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise ValueError(f"token index must be an int in [0, {n - 1}], got {index!r}")
    maker = Maker(int(trace.maker[image, index]))
    side = grid_side(n)
    out = {
        "image": image,
        "index": index,
        "row": index // side,
        "column": index % side,
        "maker": maker.name.lower(),
        "ar_step": int(trace.ar_step[image, index]),
        "block": int(trace.block[image, index]),
        "final": _floats(tokens[image, index].numpy()),
        "target_only": _floats(target_tokens[image, index].numpy()),
        "distance_to_target_only": json_float(np.linalg.norm(tokens[image, index] - target_tokens[image, index])),
        "accept_prob": json_float(trace.accept_prob[image, index]),
        "log_ratio_trajectory": json_float(trace.log_ratio_trajectory[image, index]),
        "log_ratio_final": json_float(trace.log_ratio_final[image, index]),
        "resample_tries": int(trace.resample_tries[image, index]),
    }
    det = trace.details
    if det is not None:
        draft, target = det.draft_tokens[image, index], det.target_tokens[image, index]
        out |= {
            "draft": _floats(draft),
            "target": _floats(target),
            "distance_draft_target": json_float(np.linalg.norm(draft - target)) if np.isfinite(draft).all() else None,
            "accept_draw": json_float(det.accept_draw[image, index]),
            "chains": {
                "draft": {"mean": det.draft_mean[image, index].tolist(), "std": det.draft_std[image, index].tolist()},
                "target": {
                    "mean": det.target_mean[image, index].tolist(),
                    "std": det.target_std[image, index].tolist(),
                },
            },
        }
    return out


def artifact_hints(tokens: Tensor, trace: Trace, target_tokens: Tensor, top: int = 10) -> list[dict]:
    """The ``top`` tokens whose final value is farthest from the target-only image at the same position
    (same seeds, so the same orders and noise), with their makers: where to look first."""
    distance = np.linalg.norm(tokens.numpy() - target_tokens.numpy(), axis=-1)  # (B, N)
    order = np.argsort(-distance, axis=None, kind="stable")[:top]
    side = grid_side(distance.shape[1])
    hints = []
    for flat in order:
        image, index = divmod(int(flat), distance.shape[1])
        hints.append(
            {
                "image": image,
                "index": index,
                "row": index // side,
                "column": index % side,
                "distance": float(distance[image, index]),
                "maker": Maker(int(trace.maker[image, index])).name.lower(),
                "ar_step": int(trace.ar_step[image, index]),
            }
        )
    return hints
