"""Quality metrics for the embedded shapes models: class accuracy and a Frechet distance.

A small CNN trained on the procedural shapes dataset plays the role Inception plays for FID: its
predictions give class accuracy, its penultimate layer gives the features whose Gaussian statistics
are compared (Frechet distance). Numbers are only comparable for the same classifier file.

Train the shipped classifier with ``python -m csd.shapes.metrics train --out assets/classifier``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from csd.cli import add_config_flags, add_machine_flags, config_from_args, start_up
from csd.models.checkpoint import CheckpointError, load_state_strict, read_safetensors, save_safetensors
from csd.settings import check_knobs, knob
from csd.shapes.data import NUM_CLASSES, PALETTE, caption_colour, make_dataset

DEFAULT_CLASSIFIER = Path(__file__).resolve().parents[2] / "assets" / "classifier.safetensors"
# The same network trained to name the shape's colour (the palette entry its caption names): for
# prompts, whether an image has the colour the prompt asked for.
DEFAULT_COLOUR_CLASSIFIER = DEFAULT_CLASSIFIER.with_name("colour_classifier.safetensors")
TASKS = ("class", "colour")
ARCH = "shapes_classifier"
# Data seeds: training, validation during training, and the held-out reference set of every
# Frechet distance. The generative models are trained on other seeds (see csd.training.trainer).
TRAIN_SEED, VALID_SEED, REFERENCE_SEED = 101, 102, 103


@dataclass(frozen=True)
class ClassifierConfig:
    """A VGG-style CNN: per stage two 3x3 conv + BatchNorm + ReLU, then 2x2 pooling."""

    image_size: int = 32
    channels: tuple[int, ...] = (16, 32, 64)
    feature_dim: int = 64
    num_classes: int = NUM_CLASSES

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))  # JSON gives a list
        if not (isinstance(self.image_size, int) and 8 <= self.image_size <= 256):
            raise ValueError(f"image_size must be an int in [8, 256], got {self.image_size!r}")
        if not self.channels or any(not isinstance(c, int) or c < 1 for c in self.channels):
            raise ValueError(f"channels must be a non-empty tuple of ints >= 1, got {self.channels!r}")
        if self.image_size % 2 ** len(self.channels):
            raise ValueError(
                f"image_size ({self.image_size}) must be divisible by 2**len(channels) ({2 ** len(self.channels)})"
            )
        for name in ("feature_dim", "num_classes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")


class ShapesClassifier(nn.Module):
    """Images (B, 3, H, W) in [-1, 1] -> logits; :meth:`features` is the penultimate layer."""

    def __init__(self, config: ClassifierConfig):
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        c_in = 3
        for c in config.channels:
            for k in range(2):
                layers += [nn.Conv2d(c_in if k == 0 else c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
            layers.append(nn.MaxPool2d(2))
            c_in = c
        self.conv = nn.Sequential(*layers)
        self.embed = nn.Linear(c_in, config.feature_dim)
        self.out = nn.Linear(config.feature_dim, config.num_classes)

    def features(self, images: Tensor) -> Tensor:
        """(B, feature_dim): globally pooled conv features through one linear layer and ReLU."""
        return F.relu(self.embed(self.conv(images).mean(dim=(2, 3))))

    def forward(self, images: Tensor) -> Tensor:
        return self.out(self.features(images))


# --- loading ----------------------------------------------------------------------------------


def load_classifier(path: str | Path = DEFAULT_CLASSIFIER) -> ShapesClassifier:
    """The classifier saved at ``path`` (+ ``.json``), in eval mode on the CPU; cached per path."""
    return _load_classifier(str(Path(path).resolve()))


@lru_cache(maxsize=4)
def _load_classifier(path: str) -> ShapesClassifier:
    state, meta = read_safetensors(path)
    if meta.get("arch") != ARCH:
        raise CheckpointError(f"{path} is not a shapes classifier (arch {meta.get('arch')!r}, expected {ARCH!r})")
    model = ShapesClassifier(ClassifierConfig(**meta["config"]))
    load_state_strict(model, state, path)
    return model.eval().requires_grad_(False)


def _check_images(images: Tensor, classifier: ShapesClassifier) -> None:
    size = classifier.config.image_size
    if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
        raise ValueError(f"images must be (B, 3, {size}, {size}) in [-1, 1], got {tuple(images.shape)}")


@torch.inference_mode()
def _batched(fn, images: Tensor, batch_size: int) -> Tensor:
    # Fixed batches, so the same images in the same order always give bit-identical outputs.
    return torch.cat([fn(images[i : i + batch_size].float().cpu()) for i in range(0, len(images), batch_size)])


def features(images: Tensor, classifier: ShapesClassifier | None = None, batch_size: int = 256) -> np.ndarray:
    """Penultimate-layer features (B, feature_dim) as float64."""
    classifier = classifier or load_classifier()
    _check_images(images, classifier)
    return _batched(classifier.features, images, batch_size).double().numpy()


def predict(images: Tensor, classifier: ShapesClassifier | None = None, batch_size: int = 256) -> np.ndarray:
    """Predicted class ids (B,)."""
    classifier = classifier or load_classifier()
    _check_images(images, classifier)
    return _batched(classifier, images, batch_size).argmax(dim=1).numpy()


def _labels(labels, images: Tensor) -> np.ndarray:
    labels = np.asarray(torch.as_tensor(labels).cpu()).reshape(-1)
    if len(labels) != len(images) or len(labels) == 0:
        raise ValueError(f"need one label per image and at least one image, got {len(labels)} for {len(images)}")
    return labels


def class_accuracy(images: Tensor, labels, classifier: ShapesClassifier | None = None) -> float:
    """Fraction of images the classifier assigns to their conditioning label."""
    labels = _labels(labels, images)
    return float((predict(images, classifier) == labels).mean())


def confusion_matrix(images: Tensor, labels, classifier: ShapesClassifier | None = None) -> np.ndarray:
    """Counts (C, C): row = conditioning label, column = the classifier's prediction."""
    labels = _labels(labels, images)
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise ValueError(f"labels must be class ids in [0, {NUM_CLASSES - 1}], got {labels.min()}..{labels.max()}")
    counts = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=np.int64)
    np.add.at(counts, (labels, predict(images, classifier)), 1)
    return counts


def reference_features(n: int, seed: int = REFERENCE_SEED, classifier: ShapesClassifier | None = None) -> np.ndarray:
    """Features of ``n`` real held-out images (classes cycled, as in the evaluation)."""
    return features(make_dataset(n, seed).images, classifier)


# --- Frechet distance ---------------------------------------------------------------------------


def gaussian_stats(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of (n, d) features, in float64."""
    x = np.asarray(feats, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"features must be (n, d) with n >= 2, got shape {x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _psd_sqrt(sigma: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((sigma + sigma.T) / 2)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T  # rounding can leave tiny negative eigenvalues


def frechet_from_stats(mu_a: np.ndarray, sigma_a: np.ndarray, mu_b: np.ndarray, sigma_b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + tr(A + B - 2 (A^1/2 B A^1/2)^1/2).

    tr((A B)^1/2) equals tr((A^1/2 B A^1/2)^1/2), whose argument is symmetric PSD: eigendecompositions
    replace the non-symmetric sqrtm of FID code, with no complex parts to discard."""
    root_a = _psd_sqrt(sigma_a)
    middle = root_a @ sigma_b @ root_a
    w = np.linalg.eigvalsh((middle + middle.T) / 2)
    cross = np.sqrt(np.clip(w, 0.0, None)).sum()
    diff = mu_a - mu_b
    value = float(diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2.0 * cross)
    return max(value, 0.0)  # >= 0 in exact arithmetic; only rounding can push it below


def frechet_distance(feats_a: np.ndarray, feats_b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to two feature sets (n_a, d) and (n_b, d)."""
    a, b = np.asarray(feats_a), np.asarray(feats_b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"feature sets must be (n, d) with the same d, got {a.shape} and {b.shape}")
    return frechet_from_stats(*gaussian_stats(a), *gaussian_stats(b))


# --- training -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    train_size: int = knob(20000, "training images", "int", lo=1)
    valid_size: int = knob(2000, "held-out images", "int", lo=1)
    steps: int = knob(1500, "optimiser steps", "int", lo=1)
    batch_size: int = knob(128, "images per step", "int", lo=1)
    lr: float = knob(3e-3, "learning rate", "number", lo=0.0, hi=1.0, lo_open=True)
    weight_decay: float = knob(1e-4, "AdamW weight decay", "number", lo=0.0, hi=1.0)
    # Generated images are noisier than the data: each training image gets pixel noise of std ~ U(0, max_noise).
    max_noise: float = knob(0.15, "largest per-image pixel noise std", "number", lo=0.0, hi=1.0)
    seed: int = knob(0, "weights and batch order (the data seeds are the module constants)", "int", lo=0)
    task: str = knob(
        "class", "colour: name the shape's palette colour (12 classes) instead of its class", "choice", choices=TASKS
    )

    def __post_init__(self) -> None:
        check_knobs(self)


def task_labels(data, task: str) -> Tensor:
    """What a classifier of ``task`` learns to name: the class, or the palette colour of the shape."""
    if task == "class":
        return data.labels
    return torch.tensor([caption_colour(c) for c in data.captions], dtype=torch.long)


def train_classifier(
    config: ClassifierConfig, train: TrainConfig, log_every: int = 100
) -> tuple[ShapesClassifier, dict]:
    """AdamW with a one-cycle schedule on freshly rendered images; returns the model and its record."""
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(train.seed)
    data = make_dataset(train.train_size, TRAIN_SEED)
    valid = make_dataset(train.valid_size, VALID_SEED)
    targets, valid_targets = task_labels(data, train.task), task_labels(valid, train.task)
    with torch.random.fork_rng(devices=[]):  # layer init draws from the global generator: seed it, then restore
        torch.manual_seed(train.seed)
        model = ShapesClassifier(config)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=train.lr, total_steps=train.steps)
    order = torch.randperm(len(data), generator=gen)
    cursor = 0
    for step in range(train.steps):
        if cursor + train.batch_size > len(order):
            order, cursor = torch.randperm(len(data), generator=gen), 0
        idx = order[cursor : cursor + train.batch_size]
        cursor += train.batch_size
        x = data.images[idx]
        flip = torch.rand(len(idx), generator=gen) < 0.5  # every class is symmetric under a left-right flip
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        sigma = train.max_noise * torch.rand(len(idx), 1, 1, 1, generator=gen)
        x = (x + sigma * torch.randn(x.shape, generator=gen)).clamp(-1.0, 1.0)
        loss = F.cross_entropy(model(x), targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if log_every and (step + 1) % log_every == 0:
            print(
                f"step {step + 1}/{train.steps} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f} s)", flush=True
            )
    model.eval().requires_grad_(False)
    accuracy = float((predict(valid.images, model) == valid_targets.numpy()).mean())
    record = {
        "train": asdict(train),
        "data_seeds": {"train": TRAIN_SEED, "valid": VALID_SEED, "reference": REFERENCE_SEED},
        "valid_accuracy": accuracy,
        "parameters": sum(p.numel() for p in model.parameters()),
        "wall_time_s": round(time.perf_counter() - t0, 1),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return model, record


def save_classifier(model: ShapesClassifier, path: str | Path, record: dict) -> None:
    save_safetensors(model, path, {"arch": ARCH, "config": asdict(model.config), "training": record})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m csd.shapes.metrics", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train the shapes classifier and save it")
    tr.add_argument("--out", default=str(DEFAULT_CLASSIFIER.with_suffix("")), help="path without suffix")
    add_config_flags(tr, TrainConfig, TrainConfig())
    add_machine_flags(tr, threads=1, device=False, where=": keeps the run reproducible")
    args = parser.parse_args(argv)

    start_up(args, tr)
    train = config_from_args(args, TrainConfig, TrainConfig())
    classes = NUM_CLASSES if train.task == "class" else len(PALETTE)
    model, record = train_classifier(ClassifierConfig(num_classes=classes), train)
    out = Path(args.out).with_suffix(".safetensors")
    save_classifier(model, out, record)
    print(json.dumps(record, indent=2))
    print(f"saved {out} and {out.with_suffix('.json')}; held-out accuracy {record['valid_accuracy']:.4f}")


if __name__ == "__main__":
    main()
