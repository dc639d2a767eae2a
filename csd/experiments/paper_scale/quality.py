"""Table 1's quality column: FID and Inception Score of N images per sampler (target-only and CSD at each draft
length), from official checkpoints, on the user's GPUs.

Image i of every sampler has class ``i mod 1000`` and seed i (MAR's evaluation: 50 images per class at 50 000).
The images are generated in chunks of ``batch``; each chunk's Inception features (and logits, for the IS) go
to a ``.npz`` shard named by its pair, sampler and first image, so a run stopped midway resumes where it was
(chunks already written are skipped) and ``torchrun --nproc_per_node=K`` shares the chunks out (rank r takes
chunks r, r + K, ...). Then one process merges every shard of a sampler (each image exactly once, or an error
naming the images missing or repeated), fits the features' Gaussian and compares it with the reference
statistics (an ``.npz`` with ``mu`` and ``sigma``: ADM's ImageNet 256 ones), and computes the IS from the
logits (10 splits, as torch-fidelity and the ADM evaluation do).

The features come from a maintained package's standard Inception (:mod:`csd.experiments.fid`:
torch-fidelity or clean-fid, an optional extra, with weights from a path the user gives); the tests pass a
stand-in feature network. Nothing is downloaded: a missing package, weight file or statistics file is an
error that names it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from csd.config import CSDConfig, SamplingConfig
from csd.dispatch import Method
from csd.experiments.fid import inception_features, load_reference_stats
from csd.experiments.paper_scale.plan import Cell
from csd.shapes.metrics import frechet_from_stats, gaussian_stats
from csd.trace import Maker

# images (B, 3, H, W) in [-1, 1] -> pool features (B, D) and logits (B, K) or None
Features = Callable[[Tensor], tuple[np.ndarray, np.ndarray | None]]
IS_SPLITS = 10


@dataclass(frozen=True)
class QualityConfig:
    """``n`` images per sampler against the reference statistics ``stats`` (.npz with mu and sigma); Inception
    weights at ``inception`` for ``backend`` (csd.experiments.fid); chunks of ``batch`` images; shards in
    ``shards``."""

    n: int
    stats: Path
    shards: Path
    inception: Path | None = None
    backend: str = "auto"
    batch: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"--fid (images per sampler) must be an int >= 2, got {self.n!r}")
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"--fid-batch must be an int >= 1, got {self.batch!r}")

    def features(self, device: torch.device) -> Features:
        """The package's Inception, checked before any image is made (missing package, weights: named)."""
        if self.inception is None:
            raise ValueError("--fid needs --inception FILE: the Inception weights of torch-fidelity or clean-fid")
        probe = torch.zeros(2, 3, 64, 64)
        inception_features(probe, self.inception, self.backend, device=device)
        return lambda images: _as_numpy(inception_features(images, self.inception, self.backend, device=device))


def _as_numpy(out: tuple[np.ndarray, Tensor | None]) -> tuple[np.ndarray, np.ndarray | None]:
    pool, logits = out
    return pool, None if logits is None else logits.double().numpy()


def samplers(cell: Cell, prefill: float) -> dict[str, CSDConfig | None]:
    """Target-only and CSD at each draft length of the cell (None: target-only)."""
    return {"target only": None} | {f"CSD, gamma {g}": CSDConfig(gamma=g, prefill=prefill) for g in cell.gammas}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def shard_path(shards: Path, pair: str, sampler: str, start: int) -> Path:
    return shards / f"{_slug(pair)}__{_slug(sampler)}__{start:07d}.npz"


def _chunk(
    loaded, tokenizer, sampling: SamplingConfig, csd: CSDConfig | None, indices: list[int], features: Features
) -> dict:
    """One chunk's features, logits and acceptance counts: images i of ``indices`` (class i mod classes, seed i)."""
    classes = loaded.target.traits.num_classes
    labels = [i % classes for i in indices]
    out = Method.of(csd).run(loaded.target, loaded.draft, labels, indices, sampling)
    with torch.inference_mode():
        images = tokenizer.decode(out.tokens.to(next(loaded.target.parameters()).device)).float().cpu()
    pool, logits = features(images)
    trace = out.trace
    chunk = {"index": np.asarray(indices), "pool": np.asarray(pool, dtype=np.float32)}
    chunk |= {"verified": int(trace.verified.sum()), "accepted": int(trace.count(Maker.ACCEPTED))}
    if logits is not None:
        chunk["logits"] = np.asarray(logits, dtype=np.float32)
    return chunk


def make_shards(
    loaded, tokenizer, cell: Cell, cfg: QualityConfig, features: Features, prefill: float, rank: int = 0, world: int = 1
) -> int:
    """This rank's chunks of every sampler of ``cell``'s pair, each saved as a shard unless there already;
    returns the chunks made."""
    cfg.shards.mkdir(parents=True, exist_ok=True)
    made = 0
    for name, csd in samplers(cell, prefill).items():
        for k, start in enumerate(range(0, cfg.n, cfg.batch)):
            path = shard_path(cfg.shards, cell.pair.paper_name, name, start)
            if k % world != rank or path.exists():
                continue
            indices = list(range(start, min(start + cfg.batch, cfg.n)))
            chunk = _chunk(loaded, tokenizer, cell.sampling, csd, indices, features)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, **chunk)
            os.replace(tmp, path)  # a shard is there whole or not at all
            made += 1
    return made


def merge_shards(shards: Path, pair: str, sampler: str, n: int) -> dict[str, np.ndarray | int]:
    """Every shard of one sampler, in image order: pool (n, D), logits (n, K) or None, acceptance counts.
    Each of the n images must appear exactly once."""
    parts = sorted(shards.glob(f"{_slug(pair)}__{_slug(sampler)}__*.npz"))
    if not parts:
        raise FileNotFoundError(f"no shards of {pair}, {sampler} in {shards}")
    loaded = [dict(np.load(p)) for p in parts]
    index = np.concatenate([c["index"] for c in loaded])
    counts = np.bincount(index, minlength=n)
    missing, repeated = np.flatnonzero(counts[:n] == 0), np.flatnonzero(counts > 1)
    if len(missing) or len(repeated) or len(counts) > n:
        raise ValueError(
            f"shards of {pair}, {sampler} in {shards} do not hold images 0..{n - 1} once each: missing "
            f"{missing[:8].tolist()}{'...' if len(missing) > 8 else ''}, repeated {repeated[:8].tolist()}, "
            f"beyond {n}: {int((index >= n).sum())}"
        )
    order = np.argsort(index)
    stack = lambda key: np.concatenate([c[key] for c in loaded])[order] if all(key in c for c in loaded) else None
    return {
        "pool": stack("pool"),
        "logits": stack("logits"),
        "verified": sum(int(c["verified"]) for c in loaded),
        "accepted": sum(int(c["accepted"]) for c in loaded),
    }


def inception_score(logits: np.ndarray, splits: int = IS_SPLITS) -> tuple[float, float]:
    """exp(E_x KL(p(y | x) || p(y))) over each of ``splits`` equal parts (at most one per image): mean and std
    over the parts."""
    logits = np.asarray(logits, dtype=np.float64)
    splits = min(splits, len(logits))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    scores = []
    for part in np.array_split(p, splits):
        marginal = part.mean(axis=0, keepdims=True)
        kl = (part * (np.log(part + 1e-12) - np.log(marginal + 1e-12))).sum(axis=1)
        scores.append(math.exp(kl.mean()))
    return float(np.mean(scores)), float(np.std(scores))


def quality_row(merged: dict, ref: tuple[np.ndarray, np.ndarray]) -> dict:
    """FID against the reference, IS where there are logits, acceptance, images."""
    row = {"images": int(len(merged["pool"])), "fid": frechet_from_stats(*gaussian_stats(merged["pool"]), *ref)}
    if merged["logits"] is not None:
        row["inception_score"], row["inception_score_std"] = inception_score(merged["logits"])
    verified = merged["verified"]
    row["acceptance"] = merged["accepted"] / verified if verified else None
    return row


def quality_rows(cell: Cell, cfg: QualityConfig, prefill: float) -> dict[str, dict]:
    """Every sampler of ``cell``'s pair, from its merged shards (the reference read once)."""
    ref = load_reference_stats(cfg.stats)
    return {
        name: quality_row(merge_shards(cfg.shards, cell.pair.paper_name, name, cfg.n), ref)
        for name in samplers(cell, prefill)
    }


def tokenizer_for(model, checkpoints: Path | None, device: torch.device):
    """The image tokenizer of an official model: KL-16 from ``checkpoints`` (vae/kl16.ckpt), in the family's
    token layout. FID of random weights means nothing: without the file this is an error naming it."""
    from csd.models import vae
    from csd.models.tokenizer import LatentTokenizer
    from csd.serving.pairs import VAE_FILE

    path = None if checkpoints is None else checkpoints / VAE_FILE
    if path is None or not path.is_file():
        raise FileNotFoundError(f"--fid needs the official tokenizer {VAE_FILE} under --checkpoints (got {path})")
    kl16 = vae.load_kl16(path).to(device).eval().requires_grad_(False)
    return model.token_layout(LatentTokenizer(kl16))


def run_quality(cells: list[Cell], ctx, cfg: QualityConfig, features: Features, rank: int, world: int) -> dict:
    """Every paper pair's shards (this rank's chunks), then, on rank 0 once every rank is done, each sampler's
    row: {pair name: {sampler: row}}. ``ctx``: the run's :class:`~csd.experiments.paper_scale.run.RunContext`."""
    from csd.experiments.paper_scale.build import load_pair

    first = {c.pair: c for c in reversed(cells)}  # a pair's samplers are the same at every batch
    for pair, cell in first.items():
        loaded = load_pair(pair, ctx.device, ctx.grid.seed, ctx.grid.tiny, ctx.checkpoints)
        tokenizer = tokenizer_for(loaded.target, ctx.checkpoints, ctx.device)
        made = make_shards(loaded, tokenizer, cell, cfg, features, ctx.grid.prefill, rank, world)
        print(f"rank {rank}: {pair.paper_name}: {made} chunks of {cfg.batch} images made")
        del loaded, tokenizer
    if world > 1:
        torch.distributed.barrier()
    if rank != 0:
        return {}
    return {pair.paper_name: quality_rows(cell, cfg, ctx.grid.prefill) for pair, cell in first.items()}
