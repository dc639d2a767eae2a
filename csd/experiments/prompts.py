"""Does a text model draw what its prompt says? Class, shape colour and background, scored on the held-out
captions (the committed protocol: :func:`csd.experiments.evaluate.evaluate`) and on the app's example
prompts, each over several seeds.

    python -m csd.experiments.prompts --target assets/models/shapes_text_target.safetensors \\
        --draft assets/models/shapes_text_draft.safetensors --modes target draft csd --n 100 \\
        --out bench/results/text/prompts.json
    python -m visualize.report bench/results/text/prompts.json   # prompts.md and the docs' block

Every sampler runs the same settings (the embedded pair's defaults, csd.experiments.defaults: 32 AR steps,
CFG 3 on the linear ramp, unless told otherwise), so a screen of training recipes, the shipped pair's card
and the tests read the same numbers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from csd.cli import add_config_flags, add_machine_flags, config_from_args, start_up
from csd.config import CSDConfig, SamplingConfig
from csd.experiments import defaults
from csd.experiments.evaluate import EvalConfig, evaluate, generate_images, load_models
from csd.models.checkpoint import file_digest
from csd.serving.pairs import EXAMPLE_PROMPTS
from csd.shapes.metrics import load_classifier
from csd.shapes.text import prompt_scores

MODES = ("target", "draft", "csd")
KIND = "prompts"  # a result's "kind": visualize.report writes prompts.md and the docs' text-prompts block


def example_scores(
    mode: str,
    target,
    draft,
    prompts: Sequence[str],
    seeds: int,
    sampling: SamplingConfig,
    csd: CSDConfig,
    batch_size: int = 8,
) -> dict[str, dict[str, float | None]]:
    """Per prompt, the fraction of ``seeds`` images (seeds 0..seeds-1) showing its class, shape colour and
    background (:func:`csd.shapes.text.prompt_scores`)."""
    out = {}
    for prompt in prompts:
        asked = [prompt] * seeds
        images, _ = generate_images(mode, target, draft, asked, list(range(seeds)), sampling, csd, batch_size)
        out[prompt] = prompt_scores(images, asked)
    return out


def score_pair(
    target,
    draft,
    modes: Sequence[str] = MODES,
    n: int = 100,
    seeds_per_prompt: int = 8,
    sampling: SamplingConfig = defaults.SAMPLING,
    csd: CSDConfig = defaults.CSD,
    prompts: Sequence[str] = EXAMPLE_PROMPTS,
) -> dict:
    """Held-out captions (``n``; class, colour and background accuracy and Frechet distance) and example
    prompts (``seeds_per_prompt`` each) for every mode."""
    classifier = load_classifier()
    result: dict = {"sampling": sampling.knob_values(), "csd": csd.knob_values(), "modes": {}}
    for mode in modes:
        held_out = evaluate(target, draft, sampling, csd, EvalConfig(mode=mode, n=n, batch_size=8), classifier)
        keep = ("accuracy", "colour_accuracy", "background_accuracy", "fd", "acceptance_rate", "generation_wall_s")
        examples = example_scores(mode, target, draft, prompts, seeds_per_prompt, sampling, csd)
        result["modes"][mode] = {
            "held_out": {k: held_out[k] for k in keep if k in held_out},
            "examples": examples,
            "examples_mean": {
                key: float(np.mean([e[key] for e in examples.values()]))
                for key in ("class_accuracy", "colour_accuracy", "background_accuracy")
            },
        }
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m csd.experiments.prompts", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="text target (.safetensors + .json)")
    p.add_argument("--draft", required=True, help="text draft (.safetensors + .json)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--n", type=int, default=100, help="held-out captions")
    p.add_argument("--seeds-per-prompt", type=int, default=8, help="images per example prompt")
    add_config_flags(p, SamplingConfig, defaults.SAMPLING)
    add_config_flags(p, CSDConfig, defaults.CSD)
    add_machine_flags(p, threads=1)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    device = start_up(args, p)
    sampling = config_from_args(args, SamplingConfig, defaults.SAMPLING)
    csd = config_from_args(args, CSDConfig, defaults.CSD)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    result = score_pair(target, draft, args.modes, args.n, args.seeds_per_prompt, sampling, csd)
    result["models"] = {"target": args.target, "draft": args.draft}
    result |= {"kind": KIND, "weights": file_digest(Path(args.target), Path(args.draft)), "n": args.n}
    result["seeds_per_prompt"] = args.seeds_per_prompt
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
