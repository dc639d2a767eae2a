"""Generate N images with one sampler and score them: class accuracy and Frechet distance to real images.

    python -m csd.experiments.evaluate --target assets/models/shapes_target.safetensors \\
        --draft assets/models/shapes_draft.safetensors --n 200 --mode csd --out eval.json

    torchrun --nproc_per_node=K -m csd.experiments.evaluate --num-images 200 --mode csd ...

Image i has seed ``seed_offset + i`` and label ``i mod classes``. Under torchrun (write
``--num-images``: torchrun's own parser rejects ``--n`` as ambiguous) rank r generates images
r, r + K, ...; rank 0 gathers them in image order and scores them. Every image depends only on its
seed and label, and the scoring runs on the same images in the same order and batches, so the metrics
equal a single-process run's: exactly in float64 (``--precision float64``), and in float32 up to rounding
where the kernels round a batch otherwise than an image alone (docs/specification_notes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from csd.cli import add_config_flags, add_machine_flags, config_from_args, start_up
from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import check_int
from csd.core.precision import at_precision
from csd.decoding import model_device
from csd.dispatch import Method
from csd.experiments import defaults
from csd.family import FamilyTraits
from csd.models.registry import load_model
from csd.records.cost import csd_passes
from csd.serving.pairs import image_tokenizer
from csd.shapes.data import CLASS_NAMES, captions, contact_sheet
from csd.shapes.metrics import (
    DEFAULT_CLASSIFIER,
    REFERENCE_SEED,
    ShapesClassifier,
    class_accuracy,
    confusion_matrix,
    features,
    frechet_distance,
    load_classifier,
    reference_features,
)
from csd.trace import Maker, Trace

MODES = ("csd", "target", "draft", "target-fewer-steps")
# Per-image counts gathered with the images: enough to report acceptance and resampling.
STAT_NAMES = (
    "verified",
    "accepted",
    "resampled",
    "capped",
    "resample_tries",
    "distance_aligned_sum",
    "distance_aligned_count",
    "distance_independent_sum",
    "distance_independent_count",
    # Sums over verified tokens of min(1, r) for log r, its trajectory term alone and its final-step term alone.
    "accept_prob_sum",
    "accept_trajectory_sum",
    "accept_final_sum",
    # Under acceptance_unit "token" (xAR's cells): the accepted fraction of each verified row's tokens.
    "unit_accepted_sum",
    "unit_accepted_count",
    # Drafted tokens the resampler never accepted that were left at zero (the published code's fallback).
    "zeroed",
)


@dataclass(frozen=True)
class EvalConfig:
    mode: str = "csd"
    n: int = 200
    batch_size: int = defaults.BATCH_SIZE
    seed_offset: int = 0
    n_ref: int = 1000  # held-out real images for the Frechet distance
    ref_seed: int = REFERENCE_SEED

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name, lo in (("n", 2), ("batch_size", 1), ("seed_offset", 0), ("n_ref", 2), ("ref_seed", 0)):
            check_int(name, getattr(self, name), lo)


ROOT = Path(__file__).resolve().parents[2]
PROMPT_SEED = 104  # the held-out shapes images whose captions prompt a text model's evaluation


def eval_labels_seeds(n: int, seed_offset: int, traits: FamilyTraits) -> tuple[list, list[int]]:
    """Labels cycled over the classes (balanced) and consecutive seeds. A text model (conditioned on
    prompts) gets prompts instead: the captions of held-out shapes images (seed PROMPT_SEED), which
    follow the data's distribution of classes, colours and backgrounds."""
    seeds = [seed_offset + i for i in range(n)]
    if traits.conditions == "prompts":
        return captions(n, PROMPT_SEED, start=seed_offset), seeds
    return [i % traits.num_classes for i in range(n)], seeds


def fewer_steps(sampling: SamplingConfig, csd: CSDConfig, target) -> SamplingConfig:
    """The fair cheap baseline: target-only with as many AR steps as block CSD makes target passes.

    Where the family's AR steps are fixed (xAR: one per cell) CSD's target passes are whole flow
    chains over a block, so the baseline keeps the AR steps and cuts the flow (head) steps in the same
    proportion: T * passes / S, at least 2."""
    passes, _ = csd_passes(target.seq_len, sampling, csd)
    if target.traits.cheap_knob == "num_steps":
        return replace(sampling, num_steps=passes)
    steps = target.head_steps(sampling.head_steps)
    return replace(sampling, head_steps=max(2, round(steps * passes / sampling.num_steps)), head_anneal=None)


def mode_method(mode: str, csd: CSDConfig) -> Method:
    """What a mode runs: CSD at ``csd``, the draft alone, or the target alone (at fewer steps, "target-fewer-steps":
    :func:`mode_sampling`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return {"csd": Method.speculative(csd), "draft": Method.draft()}.get(mode, Method.target())


def mode_sampling(mode: str, sampling: SamplingConfig, csd: CSDConfig, target) -> SamplingConfig:
    """The setting a mode runs at: :func:`fewer_steps` for "target-fewer-steps", else ``sampling``."""
    return fewer_steps(sampling, csd, target) if mode == "target-fewer-steps" else sampling


def image_stats(trace: Trace) -> np.ndarray:
    """(B, len(STAT_NAMES)) per-image token counts, resampler tries and draft-target distance sums."""
    count = lambda maker: (trace.maker == maker).sum(axis=1)
    columns = [
        trace.verified.sum(axis=1),
        count(Maker.ACCEPTED),
        count(Maker.RESAMPLED),
        count(Maker.CAPPED) + count(Maker.ZEROED),
        trace.resample_tries.sum(axis=1),
    ]
    for distance in (trace.distance_aligned, trace.distance_independent):
        columns += [np.nansum(distance, axis=1), np.isfinite(distance).sum(axis=1)]
    kept = lambda log_r: np.where(trace.verified, np.exp(np.minimum(np.nan_to_num(log_r), 0.0)), 0.0).sum(axis=1)
    traj, final = trace.log_ratio_trajectory, trace.log_ratio_final
    columns += [kept(traj + final), kept(traj), kept(final)]
    unit = trace.unit_accepted if trace.unit_accepted is not None else np.full(trace.maker.shape, np.nan)
    unit = np.where(trace.verified, unit, np.nan)
    columns += [np.nansum(unit, axis=1), np.isfinite(unit).sum(axis=1), count(Maker.ZEROED)]
    return np.stack(columns, axis=1).astype(np.float64)


def generate_images(
    mode: str,
    target,
    draft,
    labels: Sequence[int],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    csd: CSDConfig,
    batch_size: int,
) -> tuple[Tensor, np.ndarray]:
    """Images (n, 3, H, W) in [-1, 1] on the CPU and their per-image stats, in batches, with the sampler a mode
    names (:func:`mode_method`, at :func:`mode_sampling`)."""
    method, at = mode_method(mode, csd), mode_sampling(mode, sampling, csd, target)
    return method_images(method, target, draft, labels, seeds, at, batch_size)


def method_images(
    method: Method,
    target,
    draft,
    labels: Sequence[int],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    batch_size: int,
) -> tuple[Tensor, np.ndarray]:
    """:func:`generate_images` with the sampler ``method`` names, at ``sampling``."""
    tokenizer = image_tokenizer(target)
    images, stats = [], []
    for i in range(0, len(seeds), batch_size):
        out = method.run(target, draft, labels[i : i + batch_size], seeds[i : i + batch_size], sampling)
        images.append(tokenizer.decode(out.tokens))
        stats.append(image_stats(out.trace))
    return torch.cat(images), np.concatenate(stats)


def summarize_stats(stats: np.ndarray) -> dict[str, float | int]:
    """Acceptance, resampler and distance numbers of a set of images (NaN where nothing applies)."""
    total = dict(zip(STAT_NAMES, stats.sum(axis=0), strict=True))
    ratio = lambda a, b: float(total[a] / total[b]) if total[b] else float("nan")
    redrawn = total["resampled"] + total["capped"]
    return {
        "acceptance_rate": ratio("accepted", "verified"),
        "unit_acceptance_rate": ratio("unit_accepted_sum", "unit_accepted_count"),
        "mean_resample_tries": float(total["resample_tries"] / redrawn) if redrawn else float("nan"),
        "cap_hits": int(total["capped"]),
        "zeroed_share": ratio("zeroed", "verified"),
        "drafted_tokens": int(total["verified"]),
        "distance_aligned": ratio("distance_aligned_sum", "distance_aligned_count"),
        "distance_independent": ratio("distance_independent_sum", "distance_independent_count"),
        # Mean min(1, r) over drafted tokens, and what it would be with only one term of log r.
        "mean_accept_prob": ratio("accept_prob_sum", "verified"),
        "accept_prob_trajectory_term_alone": ratio("accept_trajectory_sum", "verified"),
        "accept_prob_final_term_alone": ratio("accept_final_sum", "verified"),
    }


def quality(
    images: Tensor, labels: Sequence[int], ref_feats: np.ndarray, classifier: ShapesClassifier
) -> tuple[dict[str, float], np.ndarray]:
    """Class accuracy and Frechet distance to the reference features; also returns the image features.
    For prompts, the accuracy is that of the class each prompt names; the colour and background accuracies are added."""
    feats = features(images, classifier)
    fd = frechet_distance(feats, ref_feats)
    if labels and isinstance(labels[0], str):
        from csd.shapes.text import prompt_scores

        scores = prompt_scores(images, labels)
        return {
            "accuracy": scores["class_accuracy"],
            "colour_accuracy": scores["colour_accuracy"],
            "background_accuracy": scores["background_accuracy"],
            "fd": fd,
        }, feats
    return {"accuracy": class_accuracy(images, labels, classifier), "fd": fd}, feats


def class_labels(labels: Sequence) -> tuple[list[int], list[int]]:
    """The images that have a class and their classes: every one for class labels; for prompts, those whose
    prompt names a class noun (every held-out caption does), with that class."""
    if not (labels and isinstance(labels[0], str)):
        return list(range(len(labels))), [int(c) for c in labels]
    from csd.shapes.text import prompt_class

    named = [(i, c) for i, p in enumerate(labels) if (c := prompt_class(p)) is not None]
    return [i for i, _ in named], [c for _, c in named]


# --- distribution --------------------------------------------------------------------------------


def interleave(parts: Sequence[Tensor], n: int) -> Tensor:
    """Undo the strided split: parts[r] holds items r, r + K, ... (padded), result holds items 0..n-1."""
    world = len(parts)
    out = parts[0].new_empty((n, *parts[0].shape[1:]))
    for r, part in enumerate(parts):
        count = len(range(r, n, world))
        out[r::world] = part[:count]
    return out


def gather_strided(local: Tensor, n: int, world: int) -> Tensor:
    """All-gather each rank's share (rank r: items r::world) and restore the item order."""
    if world == 1:
        return local
    rows = -(-n // world)  # all_gather needs equal shapes: pad every share to the largest
    padded = torch.zeros((rows, *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return interleave(parts, n)


def init_distributed(device: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device) from torchrun's environment; a plain run is rank 0 of 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device(device)
    cuda = device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    return dist.get_rank(), world, torch.device(f"cuda:{local}" if cuda else device)


def evaluate(
    target,
    draft,
    sampling: SamplingConfig,
    csd: CSDConfig,
    config: EvalConfig,
    classifier: ShapesClassifier,
    rank: int = 0,
    world: int = 1,
    sheet: str | Path | None = None,
) -> dict | None:
    """Generate this rank's share, gather, and (on rank 0) score. Other ranks return None.

    With ``sheet``, rank 0 also writes a contact sheet of the images: a row per class, up to 8 per row."""
    if world > config.n:
        raise ValueError(f"n (images) must be >= the number of processes ({world}), got {config.n}")
    labels, seeds = eval_labels_seeds(config.n, config.seed_offset, target.traits)
    t0 = time.perf_counter()
    images, stats = generate_images(
        config.mode, target, draft, labels[rank::world], seeds[rank::world], sampling, csd, config.batch_size
    )
    wall = time.perf_counter() - t0
    device = model_device(target)  # gloo gathers CPU tensors, nccl CUDA ones: the models' device
    images = gather_strided(images.to(device), config.n, world).cpu()
    stats = gather_strided(torch.from_numpy(stats).to(device), config.n, world).cpu().numpy()
    walls = gather_strided(torch.tensor([wall], dtype=torch.float64, device=device), world, world).cpu()
    if rank != 0:
        return None
    scores, _ = quality(images, labels, reference_features(config.n_ref, config.ref_seed, classifier), classifier)
    result = {"mode": config.mode, "n": config.n, **scores}
    named, classes = class_labels(labels)
    confusion = confusion_matrix(images[named], classes, classifier)
    result["per_class_accuracy"] = {
        name: float(confusion[c, c] / row) if (row := confusion[c].sum()) else float("nan")
        for c, name in enumerate(CLASS_NAMES)
    }
    result["confusion"] = confusion.tolist()  # row: requested class, column: predicted class
    if sheet is not None:
        result["sheet"] = str(contact_sheet(images[named], classes, sheet, per_class=8))
    if config.mode == "csd":
        result.update(summarize_stats(stats))
    result.update(
        {
            "generation_wall_s": float(walls.max()),
            "world_size": world,
            "settings": {
                "eval": asdict(config),
                "sampling": mode_sampling(config.mode, sampling, csd, target).knob_values(),
                "csd": csd.knob_values() if config.mode in ("csd", "target-fewer-steps") else None,
            },
        }
    )
    return result


# --- command line ----------------------------------------------------------------------------------


def add_setting_args(parser: argparse.ArgumentParser) -> None:
    """Model paths, a named preset, every sampling and CSD knob (flags made from the configs' declarations,
    :mod:`csd.cli`, defaulting to :mod:`csd.experiments.defaults`; shared with the bench) and the machine's
    threads and device."""
    parser.add_argument("--target", default=str(defaults.TARGET_PATH), help="target model (.safetensors + .json)")
    parser.add_argument("--draft", default=str(defaults.DRAFT_PATH), help="draft model (.safetensors + .json)")
    parser.add_argument("--classifier", default=str(DEFAULT_CLASSIFIER), help="metrics classifier (.safetensors)")
    parser.add_argument(
        "--preset",
        choices=list(defaults.PRESETS),
        default="default",
        help="a named setting (csd.experiments.defaults.PRESETS) that the flags below change",
    )
    add_config_flags(parser, SamplingConfig, defaults.SAMPLING)
    add_config_flags(parser, CSDConfig, defaults.CSD)
    add_machine_flags(parser)


def settings_from_args(args: argparse.Namespace) -> tuple[SamplingConfig, CSDConfig]:
    """The preset's settings with the knobs the flags set."""
    sampling, csd = defaults.preset(args.preset)
    return config_from_args(args, SamplingConfig, sampling), config_from_args(args, CSDConfig, csd)


def recorded_path(path) -> str:
    """A model path as a result records it: relative to the repository where it lies inside it, so no
    machine's directory layout is written into a committed result (or shown by the app)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name  # outside the repository: the file name alone


def recorded_models(target, draft) -> dict:
    return {"target": recorded_path(target), "draft": recorded_path(draft)}


def load_models(target_path: str | Path, draft_path: str | Path, device: torch.device, precision: str = "float32"):
    """Target and draft from the project's checkpoint format, frozen, on ``device``, their weights as
    ``precision`` needs them (float64 for the exact reference: :func:`csd.core.precision.at_precision`)."""
    models = (load_model(p, device).requires_grad_(False) for p in (target_path, draft_path))
    return tuple(at_precision(m, precision) for m in models)


def perturb_weights(model, relative_std: float, seed: int = 0):
    """Add Gaussian noise of ``relative_std`` times each tensor's std to every weight, in place (seeded):
    a draft that differs from its target by a known small amount."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in model.parameters():
            w.add_(relative_std * w.std() * torch.randn(w.shape, generator=g).to(w.device))
    return model


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.evaluate", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    d = EvalConfig()
    parser.add_argument("--mode", choices=MODES, default=d.mode)
    # --num-images under torchrun, whose own parser reads "--n" as an ambiguous abbreviation
    parser.add_argument("--n", "--num-images", dest="n", type=int, default=d.n, help="images to generate")
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--seed-offset", type=int, default=d.seed_offset)
    parser.add_argument("--n-ref", type=int, default=d.n_ref, help="held-out real images for the Frechet distance")
    parser.add_argument("--ref-seed", type=int, default=d.ref_seed)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    parser.add_argument("--sheet", default=None, help="write a PNG contact sheet of the images here")
    parser.add_argument(
        "--perturb-draft",
        type=float,
        default=0.0,
        metavar="STD",
        help="add seeded weight noise of STD x each tensor's std to the draft (with --draft = --target: a pair "
        "whose heads agree)",
    )
    args = parser.parse_args(argv)

    device = start_up(args, parser)
    sampling, csd = settings_from_args(args)
    config = EvalConfig(args.mode, args.n, args.batch_size, args.seed_offset, args.n_ref, args.ref_seed)
    rank, world, device = init_distributed(str(device))
    try:
        target, draft = load_models(args.target, args.draft, device, sampling.precision)
        if args.perturb_draft:
            perturb_weights(draft, args.perturb_draft)
        classifier = load_classifier(args.classifier)
        result = evaluate(target, draft, sampling, csd, config, classifier, rank, world, args.sheet)
        if world > 1:
            dist.barrier()  # every rank done before any tears the group down (gloo aborts otherwise)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if result is not None:
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
