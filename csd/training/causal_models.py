"""Train an embedded causal model (the NextStep-1 layout: a small LLaMA-style decoder over the caption vocabulary
and the image's pixel tokens in raster order, a flow-matching head) on the shapes images and their captions.

    python -m csd.training.causal_models --config shapes_causal_target --out assets/models/shapes_causal_target \\
        --steps 20000 --max-minutes 240 --threads 1

Everything else (files written, EMA, resume, time budget, seeded generators) is :mod:`csd.training.trainer`'s.
The loss is the official one (:meth:`csd.models.nextstep.NextStep.forward`): every token's flow matching given
the decoder's hidden state before it, in one causal pass, 10% of the captions dropped to the null prompt.
``--distill-from`` adds the gap to a frozen target's velocity at the same (x_t, t) (a draft distilled from its
target); ``--init-weights`` starts from a shipped model of the same config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import Tensor, nn

from csd.models.nextstep import NextStep, NextStepConfig
from csd.models.registry import load_model
from csd.run_setup import check_pair
from csd.shapes.text import CAUSAL_CONFIGS, caption_tokenizer
from csd.training.trainer import TrainConfig, Trainer, build_parser, run, shape_token_weight


@dataclass(frozen=True)
class CausalTrainConfig(TrainConfig):
    """A :class:`TrainConfig` for a causal model; ``model_overrides`` replaces fields of its NextStepConfig."""

    # A token's loss weight is 1 + (shape_weight - 1) x the share of its pixels the shape covers: the shape is
    # a minority of the tokens, and the prompt decides its class and colour.
    shape_weight: float = 1.0

    def _check_model(self) -> None:
        if self.config not in CAUSAL_CONFIGS:
            raise ValueError(f"TrainConfig.config must be one of {sorted(CAUSAL_CONFIGS)}, got {self.config!r}")
        w = self.shape_weight
        if not (isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            raise ValueError(f"CausalTrainConfig.shape_weight must be a finite number > 0, got {w!r}")
        self.model_config()

    def model_config(self) -> NextStepConfig:
        try:
            return replace(CAUSAL_CONFIGS[self.config], **self.model_overrides)
        except TypeError as exc:
            raise ValueError(f"TrainConfig.model_overrides: {exc}") from exc


class CausalTrainer(Trainer):
    def build_model(self) -> nn.Module:
        model = NextStep(self.model_config, caption_tokenizer())
        if self.cfg.init_weights:
            self.load_shipped(model, self.cfg.init_weights)
        return model

    def load_teacher(self, path: str) -> nn.Module:
        teacher = load_model(path, self.device).requires_grad_(False)
        try:
            check_pair(teacher, self.model)  # the student plays the draft, the teacher the target
        except ValueError as exc:
            raise ValueError(f"distill_from {path}: {exc}") from exc
        return teacher

    def pixel_layout(self) -> tuple[int, int]:
        c = self.model_config
        return c.latent_patch_size, c.grid_side * c.latent_patch_size

    def conditions(self, idx: Tensor):
        captions = [self.captions[i] for i in idx.tolist()]
        return self.model.check_conditions(captions, len(captions), self.device)

    def batch(self) -> tuple[Tensor, object]:
        """Tokens (B, N, d), and as conditions the prompts and each token's loss weight (None: alike)."""
        idx, images, flip = self.draw()
        return self.tokenizer.encode(images), (self.conditions(idx), self.token_weight(idx, flip))

    def token_weight(self, idx: Tensor, flip: Tensor | None) -> Tensor | None:
        """(B, N): 1 + (shape_weight - 1) x the share of each token's pixels the shape covers."""
        cover = self.coverage[idx.to(self.device)]
        return shape_token_weight(cover, flip, self.tokenizer.patch_size, self.cfg.shape_weight)

    def objective(self, tokens: Tensor, conditions) -> Tensor:
        prompts, weight = conditions
        return self.net(tokens, prompts, self.model_gen, self.teacher, self.cfg.distill_weight, weight)


def parse_args(argv: Sequence[str] | None = None) -> CausalTrainConfig:
    p = build_parser("python -m csd.training.causal_models", __doc__.split("\n")[0], CAUSAL_CONFIGS)
    p.add_argument(
        "--shape-weight", type=float, default=1.0, help="loss weight of tokens the shape covers (1: all alike)"
    )
    return CausalTrainConfig(**vars(p.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv), CausalTrainer)


if __name__ == "__main__":
    main()
