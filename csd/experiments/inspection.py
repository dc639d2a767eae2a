"""Artifact inspection: a speculative run replayed block by block, any token opened, the likely
artifacts ranked. Everything comes from the run's trace and tokens (and the target-only run with the
same seeds); nothing here runs a model.

* :func:`replay_frames`: the CSD canvas after each pre-fill step, each drafted block (the draft's
  proposal) and each verification (what the target kept), beside the target-only canvas after as
  many AR steps;
* :func:`inspect_token`: who made one token and why it was kept or redrawn;
* :func:`artifact_hints`: the tokens farthest from the target-only image at the same position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from csd.trace import Maker, Trace

DRAFTED = -2  # status of a token the draft proposed and the target has not verified yet
UNKNOWN = -1


@dataclass
class Frame:
    """One moment of a run. tokens (B, N, d) hold the known tokens (zeros elsewhere); status (B, N)
    is a Maker value for committed tokens, DRAFTED for proposals under verification, UNKNOWN."""

    label: str
    ar_steps: int  # AR steps made (drafted included) at this moment
    tokens: np.ndarray
    status: np.ndarray
    target_tokens: np.ndarray  # the target-only run after as many AR steps
    target_known: np.ndarray  # (B, N) bool


def _canvas(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    return np.where(known[..., None], values, 0.0).astype(np.float32)


def replay_frames(tokens: Tensor, trace: Trace, target_tokens: Tensor, target_trace: Trace) -> list[Frame]:
    """Frames of a speculative run, in order; the last one is the final image. Needs the trace's
    details (``speculative_generate(..., keep_details=True)``) for the draft's proposals."""
    if trace.details is None:
        raise ValueError("replay needs the draft's proposals: run speculative_generate with keep_details=True")
    final, target = tokens.numpy(), target_tokens.numpy()
    proposal = trace.details.draft_tokens
    committed = np.full(trace.maker.shape, UNKNOWN, dtype=np.int8)

    def frame(label: str, steps: int, status: np.ndarray, values: np.ndarray) -> Frame:
        shown = status != UNKNOWN
        target_known = (target_trace.ar_step >= 0) & (target_trace.ar_step < steps)
        return Frame(label, steps, _canvas(values, shown), status.copy(), _canvas(target, target_known), target_known)

    frames = []
    prefill_steps = sorted({int(s) for s in np.unique(trace.ar_step[trace.maker == Maker.PREFILL])})
    for s in prefill_steps:
        made = trace.ar_step == s
        committed[made] = Maker.PREFILL
        frames.append(frame(f"pre-fill: AR step {s + 1}", s + 1, committed, final))
    for b in sorted(int(v) for v in np.unique(trace.block[trace.block >= 0])):
        in_block = trace.block == b
        steps = trace.ar_step[in_block]
        first, last = int(steps.min()), int(steps.max())
        drafted = committed.copy()
        drafted[in_block] = DRAFTED
        values = np.where(in_block[..., None], proposal, final)
        frames.append(frame(f"block {b + 1}: drafted AR steps {first + 1}-{last + 1}", last + 1, drafted, values))
        committed[in_block] = trace.maker[in_block]
        frames.append(frame(f"block {b + 1}: verified", last + 1, committed, final))
    return frames


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


def _num(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


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
        "distance_to_target_only": _num(np.linalg.norm(tokens[image, index] - target_tokens[image, index])),
        "accept_prob": _num(trace.accept_prob[image, index]),
        "log_ratio_trajectory": _num(trace.log_ratio_trajectory[image, index]),
        "log_ratio_final": _num(trace.log_ratio_final[image, index]),
        "resample_tries": int(trace.resample_tries[image, index]),
    }
    det = trace.details
    if det is not None:
        draft, target = det.draft_tokens[image, index], det.target_tokens[image, index]
        out |= {
            "draft": _floats(draft),
            "target": _floats(target),
            "distance_draft_target": _num(np.linalg.norm(draft - target)) if np.isfinite(draft).all() else None,
            "accept_draw": _num(det.accept_draw[image, index]),
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
