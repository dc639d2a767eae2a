"""CSD class accuracy and acceptance with each trajectory term, at the default setting, on 80 images.

    python -m scripts.trajectory_term_check <target.safetensors> derived none exact

Each argument after the target is a trajectory term of the aligned criterion ("derived",
"published", "none") or "exact" for the path-space criterion. ``--draft X`` picks another draft.

Gamma 8, pre-fill 0.05, tau_v 42, 32 AR steps, CFG 3 linear, the shipped draft; the benchmark's
labels and seeds (csd.experiments.evaluate.eval_labels_seeds).
"""

from __future__ import annotations

import sys

import torch

from csd.experiments.evaluate import eval_labels_seeds, generate_images, summarize_stats
from csd.models.registry import load_model
from csd.sampling import SamplingConfig
from csd.shapes.metrics import DEFAULT_CLASSIFIER, class_accuracy, load_classifier
from csd.speculative import CSDConfig


def main(target_path: str, terms: list[str], draft_path: str = "assets/models/shapes_draft.safetensors") -> None:
    torch.set_num_threads(2)
    target = load_model(target_path)
    draft = load_model(draft_path)
    classifier = load_classifier(DEFAULT_CLASSIFIER)
    labels, seeds = eval_labels_seeds(80, 0, 10)
    sampling = SamplingConfig(num_steps=32, cfg_scale=3.0)
    for term in terms:
        if term == "exact":
            csd = CSDConfig(gamma=8, prefill=0.05, criterion="exact")
        else:
            csd = CSDConfig(gamma=8, prefill=0.05, tau_v=42.0, trajectory_term=term)
        images, stats = generate_images("csd", target, draft, labels, seeds, sampling, csd, 8)
        summary = summarize_stats(stats)
        acceptance = summary["acceptance_rate"]
        accuracy = class_accuracy(images, labels, classifier)
        print(
            f"{target_path} + {draft_path} {term}: accuracy {accuracy:.4f}, acceptance {acceptance:.3f}, "
            f"resampler tries {summary['mean_resample_tries']:.2f}, cap hits {summary['cap_hits']}",
            flush=True,
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    draft_arg = {}
    if "--draft" in args:
        i = args.index("--draft")
        draft_arg["draft_path"] = args[i + 1]
        del args[i : i + 2]
    main(args[0], args[1:], **draft_arg)
