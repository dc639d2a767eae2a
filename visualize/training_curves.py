"""Training curves of the embedded models from their ``*.log.jsonl`` files (loss and learning rate per step).

python -m visualize.training_curves \\
    assets/history/stages/shapes_target_stage1.log.jsonl+assets/history/stages/shapes_target_stage2.log.jsonl+\\
assets/models/shapes_target.log.jsonl \\
    assets/history/stages/shapes_draft_stage1.log.jsonl+assets/models/shapes_draft.log.jsonl \\
    --out assets/models/training_curves.png

``a.log.jsonl+b.log.jsonl`` draws a run started from another one (``csd.training.trainer --init-from``) after
its parent.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from visualize.chart import Chart, Series
from visualize.render import save_png


def read_log(path: str | Path) -> list[dict]:
    """The records of a training log (one JSON object per line: step, loss, lr, elapsed), in step order."""
    path = Path(path)
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read training log {path}: {exc}") from exc
    missing = [i for i, r in enumerate(records) if not {"step", "loss", "lr"} <= set(r)]
    if not records or missing:
        raise ValueError(f"training log {path} has no records or records without step/loss/lr (lines {missing[:5]})")
    return sorted(records, key=lambda r: r["step"])


def chain_logs(segments: Sequence[list[dict]]) -> list[dict]:
    """Records of runs that each started from the previous one's end (``--init-from``), as one log: the steps
    and elapsed seconds of a segment continue from the last record of the segment before."""
    chained, step0, elapsed0 = [], 0, 0.0
    for records in segments:
        for r in records:
            chained.append({**r, "step": r["step"] + step0, "elapsed": r.get("elapsed", 0.0) + elapsed0})
        if records:
            step0, elapsed0 = chained[-1]["step"], chained[-1]["elapsed"]
    return chained


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` values (shorter at the start), same length as ``values``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    v = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


MAR_LOSS = "diffusion loss on masked tokens"


def loss_curves(
    logs: Mapping[str, list[dict]], window_steps: int = 500, skip_steps: int = 1000, loss: str = MAR_LOSS
) -> Chart:
    """Training loss per step, one line per model, each a trailing mean over ``window_steps`` steps of its
    log records (the runs log at different intervals). Records up to ``skip_steps`` (warm-up) are left
    out before smoothing, so that the interesting range is not squashed."""
    series = []
    for name, records in logs.items():
        kept = [r for r in records if r["step"] > skip_steps]
        if not kept:
            continue
        interval = float(np.median(np.diff([r["step"] for r in records]))) if len(records) > 1 else 1.0
        smooth = moving_average([r["loss"] for r in kept], max(1, round(window_steps / interval)))
        series.append(Series(name, [r["step"] for r in kept], [float(v) for v in smooth]))
    finals = ", ".join(f"{s.name} {s.y[-1]:.4f} at {s.x[-1]}" for s in series)
    return Chart(
        title=f"Training loss ({loss})",
        x_label="step",
        y_label=f"loss, trailing mean over {window_steps} steps",
        series=series,
        note=f"final: {finals}",
    )


def lr_curves(logs: Mapping[str, list[dict]]) -> Chart:
    series = [Series(name, [r["step"] for r in rec], [r["lr"] for r in rec]) for name, rec in logs.items()]
    return Chart(title="Learning rate", x_label="step", y_label="learning rate", series=series)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "logs",
        nargs="+",
        help="<name>.log.jsonl files (the model name is the last file's stem); a+b chains a run after its parent",
    )
    ap.add_argument("--out", type=Path, required=True, help="PNG of the loss curves; the LR goes to <out>_lr.png")
    ap.add_argument("--window-steps", type=int, default=500)
    ap.add_argument("--loss", default=MAR_LOSS, help="what the loss is, for the title")
    args = ap.parse_args(argv)
    logs = {}
    for spec in args.logs:
        parts = [Path(p) for p in spec.split("+")]
        logs[parts[-1].name.removesuffix(".log.jsonl")] = chain_logs([read_log(p) for p in parts])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(save_png(loss_curves(logs, args.window_steps, loss=args.loss), args.out))
    print(save_png(lr_curves(logs), args.out.with_name(args.out.stem + "_lr.png")))


if __name__ == "__main__":
    main()
