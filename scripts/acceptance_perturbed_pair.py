"""Acceptance of every criterion on a pair that differs slightly: a trained model and a copy of it with
1% Gaussian weight noise (per-tensor std). Usage: python -m scripts.acceptance_perturbed_pair [model]."""

import sys

import torch

from csd.models.registry import load_model
from csd.sampling import SamplingConfig
from csd.speculative import CSDConfig, speculative_generate

VARIANTS = {
    "aligned": CSDConfig(gamma=4, counterfactual=True),
    "unaligned": CSDConfig(gamma=4, align=False, counterfactual=True),
    "aligned, published sign": CSDConfig(gamma=4, trajectory_term="published"),
    "aligned, final step only": CSDConfig(gamma=4, trajectory_term="none"),
    "exact": CSDConfig(gamma=4, criterion="exact"),
}


def main(path: str = "assets/models/shapes_draft.safetensors") -> None:
    target, draft = load_model(path), load_model(path)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(0.01 * w.std() * torch.randn(w.shape, generator=g))
    sampling = SamplingConfig(num_steps=16, cfg_scale=3.0)
    labels, seeds = [i % 10 for i in range(16)], list(range(16))
    print(
        "| criterion | acceptance | log r trajectory term (mean, std) | final term (mean) | distance aligned | "
        "distance independent |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, cfg in VARIANTS.items():
        tr = speculative_generate(target, draft, labels, seeds, sampling, cfg).trace
        s, v = tr.summary(), tr.verified
        print(
            f"| {name} | {s['acceptance_rate']:.3f} | {tr.log_ratio_trajectory[v].mean():.2f}, "
            f"{tr.log_ratio_trajectory[v].std():.2f} | {tr.log_ratio_final[v].mean():.2f} | "
            f"{s['distance_aligned']:.3f} | {s['distance_independent']:.3f} |"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
