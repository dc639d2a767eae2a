"""CSD class accuracy and acceptance with each trajectory term, at the default setting, on 80 images.

    python -m scripts.trajectory_term_check <target.safetensors> derived none

Gamma 8, pre-fill 0.05, tau_v 42, 32 AR steps, CFG 3 linear, the shipped draft; the benchmark's
labels and seeds (csd.evaluate.eval_labels_seeds).
"""

from __future__ import annotations

import sys

import torch

from csd.evaluate import eval_labels_seeds, generate_images, summarize_stats
from csd.metrics import DEFAULT_CLASSIFIER, class_accuracy, load_classifier
from csd.models.registry import load_model
from csd.sampling import SamplingConfig
from csd.speculative import CSDConfig


def main(target_path: str, terms: list[str]) -> None:
    torch.set_num_threads(2)
    target = load_model(target_path)
    draft = load_model("assets/models/shapes_draft.safetensors")
    classifier = load_classifier(DEFAULT_CLASSIFIER)
    labels, seeds = eval_labels_seeds(80, 0, 10)
    sampling = SamplingConfig(num_steps=32, cfg_scale=3.0)
    for term in terms:
        csd = CSDConfig(gamma=8, prefill=0.05, tau_v=42.0, trajectory_term=term)
        images, stats = generate_images("csd", target, draft, labels, seeds, sampling, csd, 8)
        acceptance = summarize_stats(stats)["acceptance_rate"]
        accuracy = class_accuracy(images, labels, classifier)
        print(f"{target_path} trajectory_term={term}: accuracy {accuracy:.4f}, acceptance {acceptance:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
