"""Train an embedded text-conditioned model (the Harmon layout: a MAR generator conditioned on a small
Qwen2 over the caption vocabulary) on the shapes images and their captions.

    python -m csd.training.text_models --config shapes_text_target --out assets/models/shapes_text_target \\
        --init-generator assets/models/shapes_target.safetensors --steps 20000 --max-minutes 240 --threads 1

Everything else (files written, EMA, resume, time budget, seeded generators) is
:mod:`csd.training.trainer`'s. ``--init-generator`` starts the MAR from a shipped class-conditional model;
the LLM and the projections start fresh, ``proj_out``'s last layer at zero, so the first steps are that
model with its null class, and the prompt's contribution grows from nothing. Given a shipped text model
instead, it starts the whole model from it (a new stage: fresh AdamW moments and schedule), which is how
training continues on a machine that does not have the train state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from csd.models.harmon import Harmon, HarmonConfig
from csd.models.registry import load_model
from csd.shapes.text import TEXT_CONFIGS, caption_tokenizer, text_config
from csd.training.trainer import TrainConfig, Trainer, build_parser, run, shape_token_weight


@dataclass(frozen=True)
class TextTrainConfig(TrainConfig):
    """A :class:`TrainConfig` for a text model; ``model_overrides`` replaces fields of its MAR generator."""

    # A class-conditional MAR (.safetensors) whose weights start the generator, or a text model to start from.
    init_generator: str | None = None
    # The LLM's and the projections' LR as a multiple of the generator's (the schedule's) LR.
    cond_lr_mult: float = 1.0
    # The share of each batch's rows with every token masked: only the prompt can tell them the shape's
    # colour and the background (otherwise the first known shape token tells the colour).
    prompt_only: float = 0.0
    # A token's loss weight is 1 + (shape_weight - 1) x the share of its pixels the shape covers: the shape
    # is a minority of the tokens, and the prompt decides its colour.
    shape_weight: float = 1.0

    def _check_model(self) -> None:
        if self.config not in TEXT_CONFIGS:
            raise ValueError(f"TrainConfig.config must be one of {sorted(TEXT_CONFIGS)}, got {self.config!r}")
        if self.init_weights is not None:
            raise ValueError(
                "TrainConfig.init_weights: text models start from --init-generator (a MAR or a text model)"
            )
        m = self.cond_lr_mult
        if not (isinstance(m, int | float) and not isinstance(m, bool) and math.isfinite(m) and m > 0):
            raise ValueError(f"TextTrainConfig.cond_lr_mult must be a finite number > 0, got {m!r}")
        p = self.prompt_only
        if not (isinstance(p, int | float) and not isinstance(p, bool) and 0.0 <= p <= 1.0):
            raise ValueError(f"TextTrainConfig.prompt_only must be a number in [0, 1], got {p!r}")
        w = self.shape_weight
        if not (isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            raise ValueError(f"TextTrainConfig.shape_weight must be a finite number > 0, got {w!r}")
        self.model_config()

    def model_config(self) -> HarmonConfig:
        try:
            return text_config(self.config, **self.model_overrides)
        except TypeError as exc:
            raise ValueError(f"TrainConfig.model_overrides: {exc}") from exc


class TextTrainer(Trainer):
    def build_model(self) -> nn.Module:
        model = Harmon(self.model_config, caption_tokenizer())
        nn.init.zeros_(model.proj_out[2].weight)
        nn.init.zeros_(model.proj_out[2].bias)
        if self.cfg.init_generator:
            start = load_model(self.cfg.init_generator)
            if start.traits.conditions == "prompts":  # a whole text model: continue from it
                if start.config != self.model_config:
                    raise ValueError(
                        f"init_generator {self.cfg.init_generator}: its config differs from {self.cfg.config}'s"
                    )
                model.load_state_dict(start.state_dict())
            elif start.config != self.model_config.mar:
                raise ValueError(
                    f"init_generator {self.cfg.init_generator}: its MAR config differs from {self.cfg.config}'s"
                )
            else:
                model.mar.load_state_dict(start.state_dict())
        return model

    def pixel_layout(self) -> tuple[int, int]:
        generator = self.model_config.mar
        return generator.patch_size, generator.img_size

    def lr_mults(self) -> dict[str, float]:
        m = float(self.cfg.cond_lr_mult)
        return {} if m == 1.0 else {"llm": m, "proj_in": m, "proj_out": m}

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
        return self.net(
            tokens, prompts, self.model_gen, self.cfg.prompt_only, weight, self.teacher, self.cfg.distill_weight
        )


def parse_args(argv: Sequence[str] | None = None) -> TextTrainConfig:
    p = build_parser("python -m csd.training.text_models", __doc__.split("\n")[0], TEXT_CONFIGS)
    p.add_argument("--init-generator", default=None, help="a shipped class-conditional MAR (.safetensors)")
    p.add_argument(
        "--cond-lr-mult", type=float, default=1.0, help="LR of the LLM and projections as a multiple of the generator's"
    )
    p.add_argument("--prompt-only", type=float, default=0.0, help="share of each batch's rows with every token masked")
    p.add_argument(
        "--shape-weight", type=float, default=1.0, help="loss weight of tokens the shape covers (1: all alike)"
    )
    return TextTrainConfig(**vars(p.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv), TextTrainer)


if __name__ == "__main__":
    main()
