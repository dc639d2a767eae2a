"""How much a pixel-token MAR uses its context: inpaint held-out real images from some of their tokens.

    python -m csd.shapes.probe assets/models/shapes_target.safetensors --fractions 0 0.1 0.3 0.5 0.8 0.95

For each visible fraction f, every image keeps round(f * N) random tokens of a real image; the model
predicts all the others in one step (one backbone pass, then the head chain for every masked token).
The probe reports, per fraction, the mean squared error of the predicted tokens to the real ones and
the class accuracy of the filled-in images. A model that uses its context gets better as f grows.
MAR's training mask ratios (never below 0.7) show a model at most 30% of the tokens, and a model trained
so stops improving there, although sampling ends with almost every token known (assets/models/TRAINING.md).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from csd.cli import add_machine_flags, start_up
from csd.core.chain import HeadCondition, run_chain, standard_noise
from csd.core.checks import check_int, check_number
from csd.core.rng import stream_seed
from csd.models.mar import MAR
from csd.models.tokenizer import PixelTokenizer, pixel_tokenizer
from csd.shapes.data import ShapesConfig, make_dataset
from csd.shapes.metrics import DEFAULT_CLASSIFIER, REFERENCE_SEED, class_accuracy, load_classifier

DEFAULT_FRACTIONS = (0.0, 0.1, 0.3, 0.5, 0.8, 0.95)


@dataclass(frozen=True)
class ProbeConfig:
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    n: int = 200  # held-out real images (classes cycled)
    data_seed: int = REFERENCE_SEED  # not a training seed of the generative models
    seed: int = 0  # visible-token choice and head noise
    cfg_scale: float = 1.0
    head_steps: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        if not self.fractions or any(not (math.isfinite(f) and 0.0 <= f < 1.0) for f in self.fractions):
            raise ValueError(f"fractions (visible tokens) must each be in [0, 1), got {list(self.fractions)}")
        check_int("n", self.n, 1)
        check_number("cfg_scale", self.cfg_scale, 0.0, 100.0)


def visible_mask(batch: int, num_tokens: int, fraction: float, generator: torch.Generator) -> Tensor:
    """(B, N) bool, True = masked (to predict); round(fraction * N) random tokens per row stay visible."""
    visible = round(fraction * num_tokens)
    if visible >= num_tokens:
        raise ValueError(f"fraction {fraction} leaves no token to predict out of {num_tokens}")
    orders = torch.argsort(torch.rand(batch, num_tokens, generator=generator), dim=1)
    mask = torch.ones(batch, num_tokens, dtype=torch.bool)
    mask.scatter_(1, orders[:, :visible], False)
    return mask


@torch.inference_mode()
def inpaint(
    model: MAR,
    tokens: Tensor,
    labels: Tensor,
    mask: Tensor,
    generator: torch.Generator,
    cfg_scale: float = 1.0,
    head_steps: int | None = None,
) -> Tensor:
    """tokens (B, N, d) with the masked ones (mask (B, N), True) predicted in one step; the rest unchanged."""
    b, n, d = tokens.shape
    guided = cfg_scale != 1.0
    z, z_uncond = model.conditions(tokens, mask, labels, guided)
    rows = mask.reshape(-1)
    zr = z.reshape(b * n, -1)[rows]
    if guided:
        cond = HeadCondition(zr, z_uncond.reshape(b * n, -1)[rows], torch.full((zr.shape[0],), cfg_scale))
    else:
        cond = HeadCondition(zr)
    chain = model.head.chain(head_steps)
    noise = standard_noise(zr.shape[0], d, chain.num_steps(), generator, "cpu", torch.float32)
    filled = tokens.reshape(b * n, d).clone()
    filled[rows] = run_chain(chain, cond, noise).x
    return filled.reshape(b, n, d)


def context_curve(model: MAR, config: ProbeConfig, classifier=None) -> list[dict]:
    """One row per visible fraction: ``fraction``, ``visible`` tokens, ``token_mse`` of the predicted tokens,
    ``accuracy`` of the filled-in images. Deterministic for the config (CPU)."""
    model = model.cpu().eval()
    classifier = classifier or load_classifier(DEFAULT_CLASSIFIER)
    tokenizer = pixel_tokenizer(model.token_dim)
    data = make_dataset(config.n, config.data_seed)
    tokens, labels = tokenizer.encode(data.images), data.labels
    rows = []
    for f in config.fractions:
        g = torch.Generator().manual_seed(stream_seed(config.seed, f"probe/{f:.6f}"))
        mask = visible_mask(config.n, model.seq_len, f, g)
        filled = inpaint(model, tokens, labels, mask, g, config.cfg_scale, config.head_steps)
        err = ((filled - tokens) ** 2).mean(-1)[mask]  # per predicted token
        rows.append(
            {
                "fraction": f,
                "visible": int((~mask[0]).sum()),
                "token_mse": err.mean().item(),
                "accuracy": class_accuracy(tokenizer.decode(filled), labels, classifier),
            }
        )
    return rows


def markdown(results: dict[str, list[dict]]) -> str:
    """A table: one row per fraction, token MSE and accuracy per model."""
    names = list(results)
    head = "| visible | " + " | ".join(f"{n}: token MSE | {n}: accuracy" for n in names) + " |"
    sep = "|---" * (1 + 2 * len(names)) + "|"
    lines = [head, sep]
    for i, row in enumerate(results[names[0]]):
        cells = [f"{row['fraction']:.2f} ({row['visible']} tokens)"]
        for n in names:
            r = results[n][i]
            cells += [f"{r['token_mse']:.4f}", f"{r['accuracy']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@torch.no_grad()
def head_log_std_sum(model, n: int = 16, seed: int = 9) -> float:
    """Sum over a chain's stochastic steps of the log head stds, per token (mean over tokens): what the
    aligned criterion's trajectory term compares (draft's minus target's, :mod:`csd.acceptance`).

    ``n`` held-out images with half of their tokens known (the same positions and noise for every
    model, so two models' sums compare), CFG 1, one chain per masked token."""
    data = make_dataset(n, seed, ShapesConfig(image_size=32))
    tokens = PixelTokenizer(4).encode(data.images)
    order = torch.rand(n, tokens.shape[1], generator=torch.Generator().manual_seed(0))
    mask = order.argsort(1).argsort(1) < tokens.shape[1] // 2  # half the tokens unknown
    z, _ = model.conditions(tokens, mask, data.labels, False)
    z = z[mask]
    chain, rows = model.head.chain(None), z.shape[0]
    cond = HeadCondition(z=z, z_uncond=None, cfg=torch.ones(rows))
    y = torch.randn(rows, model.token_dim, generator=torch.Generator().manual_seed(1))
    total = 0.0
    for k in range(chain.num_steps() - 1):  # the stochastic steps
        mean, std = chain.transition(y, k, cond)
        total += std.log().sum(-1).mean().item()
        y = mean + std * torch.randn(rows, model.token_dim, generator=torch.Generator().manual_seed(100 + k))
    return total


def main(argv: Sequence[str] | None = None) -> None:
    from csd.models.registry import load_model

    d = ProbeConfig()
    ap = argparse.ArgumentParser(prog="python -m csd.shapes.probe", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path, help="project model files (.safetensors + .json)")
    ap.add_argument("--fractions", type=float, nargs="+", default=list(d.fractions), help="visible fractions")
    ap.add_argument("--n", type=int, default=d.n)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--cfg-scale", type=float, default=d.cfg_scale)
    ap.add_argument("--head-steps", type=int, default=None)
    add_machine_flags(ap, device=False)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument(
        "--head-stds",
        action="store_true",
        help="instead: each model's sum of log head stds per token (what the trajectory term compares)",
    )
    args = ap.parse_args(argv)
    start_up(args, ap)
    if args.head_stds:
        for path in args.models:
            print(f"{path}: sum of log head std per token {head_log_std_sum(load_model(path)):.1f}")
        return
    config = ProbeConfig(args.fractions, args.n, seed=args.seed, cfg_scale=args.cfg_scale, head_steps=args.head_steps)
    stems = [p.name.removesuffix(".safetensors") for p in args.models]
    names = stems if len(set(stems)) == len(stems) else [str(p) for p in args.models]
    results = {name: context_curve(load_model(p), config) for name, p in zip(names, args.models, strict=True)}
    print(markdown(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": asdict(config), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
