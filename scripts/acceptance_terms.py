"""Acceptance of CSD on the embedded pair, split into the two terms of log r (aligned vs independent noise).

Each row: the mean of min(1, r) over the verified tokens of 24 images (32 AR steps, CFG 3, gamma 8,
pre-fill 5%), for the full log r, the trajectory term alone and the final-step term alone.
Usage (from the repository root): python -m scripts.acceptance_terms [TARGET DRAFT]
(the shipped pair by default; TARGET, DRAFT: .safetensors with their .json beside them).
"""

import sys

import numpy as np
import torch

from csd.experiments import defaults
from csd.models.registry import load_model
from csd.sampling import SamplingConfig
from csd.speculative import CSDConfig, speculative_generate


def mean_accept(log_r: np.ndarray) -> float:
    return float(np.exp(np.minimum(log_r, 0.0)).mean())


def main() -> None:
    torch.set_num_threads(2)
    paths = sys.argv[1:] or [defaults.TARGET_PATH, defaults.DRAFT_PATH]
    if len(paths) != 2:
        sys.exit("usage: python -m scripts.acceptance_terms [TARGET DRAFT]")
    target, draft = load_model(paths[0]), load_model(paths[1])
    sampling = SamplingConfig(num_steps=32, cfg_scale=3.0)
    labels, seeds = [i % 10 for i in range(24)], list(range(24))
    for align in (True, False):
        csd = CSDConfig(gamma=8, prefill=0.05, align=align)
        trace = speculative_generate(target, draft, labels, seeds, sampling, csd).trace
        verified = ~np.isnan(trace.log_ratio_final)
        traj, final = trace.log_ratio_trajectory[verified], trace.log_ratio_final[verified]
        print(
            f"align={align}: accept prob {mean_accept(traj + final):.3f}; trajectory term alone "
            f"{mean_accept(traj):.3f}; final term alone {mean_accept(final):.3f}; "
            f"median log r terms: trajectory {np.median(traj):.1f}, final {np.median(final):.2f}"
        )


if __name__ == "__main__":
    main()
