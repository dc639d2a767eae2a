"""Sum of log head stds along one chain per token: what the aligned criterion's trajectory term compares.

    python -m scripts.trajectory_stds /tmp/stage9/shapes_target.safetensors assets/models/shapes_draft.safetensors

16 held-out images, half of their tokens known (the same for every model), CFG 1; one chain per masked
token from the same noise. The trajectory term of a drafted token is (draft's sum) - (target's sum)
(csd.acceptance.trajectory_log_std_gap); this prints the mean sum per token for each model.
"""

from __future__ import annotations

import sys

import torch

from csd.chain import HeadCondition
from csd.models.registry import load_model
from csd.models.tokenizer import PixelTokenizer
from csd.shapes.data import ShapesConfig, make_dataset


def mean_log_std_sum(path: str) -> float:
    data = make_dataset(16, 9, ShapesConfig(image_size=32))
    tokens = PixelTokenizer(4).encode(data.images)
    order = torch.rand(16, 64, generator=torch.Generator().manual_seed(0))
    mask = order.argsort(1).argsort(1) < 32  # 32 unknown tokens per image
    model = load_model(path)
    with torch.no_grad():
        z, _ = model.conditions(tokens, mask, data.labels, False)
        z = z[mask]
        chain = model.head.chain(None)
        n = z.shape[0]
        cond = HeadCondition(z=z, z_uncond=None, cfg=torch.ones(n))
        y = torch.randn(n, model.token_dim, generator=torch.Generator().manual_seed(1))
        total = 0.0
        for k in range(chain.num_steps() - 1):  # the stochastic steps
            mean, std = chain.transition(y, k, cond)
            total += std.log().sum(-1).mean().item()
            noise = torch.randn(n, model.token_dim, generator=torch.Generator().manual_seed(100 + k))
            y = mean + std * noise
    return total


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"{p}: sum of log std per token {mean_log_std_sum(p):.1f}")
