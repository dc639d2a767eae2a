"""Train an embedded xAR model on the shapes images with xAR's noisy-context flow matching (every cell
its own time, all cells at once under the block-causal mask, 10% of labels dropped to the null class).

    python -m csd.training.xar_models --config shapes_xar_target --out assets/models/shapes_xar_target \\
        --steps 20000 --max-minutes 240 --threads 1

Everything else (files, EMA, resume, time budget, seeded generators) is :mod:`csd.training.trainer`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import Tensor, nn

from csd.models.tokenizer import cell_order
from csd.models.xar import XAR, XAR_CONFIGS, XARConfig
from csd.training.trainer import TrainConfig, Trainer, build_parser, run

PIXEL_CONFIGS = sorted(name for name, c in XAR_CONFIGS.items() if name.startswith("shapes_"))


@dataclass(frozen=True)
class XARTrainConfig(TrainConfig):
    """A :class:`TrainConfig` for an xAR model; ``model_overrides`` replaces fields of its XARConfig."""

    def _check_model(self) -> None:
        if self.config not in PIXEL_CONFIGS:
            raise ValueError(f"TrainConfig.config must be one of {PIXEL_CONFIGS}, got {self.config!r}")
        if self.distill_from is not None:
            raise ValueError("TrainConfig.distill_from is not supported for xAR models")
        self.model_config()

    def model_config(self) -> XARConfig:
        try:
            return replace(XAR_CONFIGS[self.config], **self.model_overrides)
        except TypeError as exc:
            raise ValueError(f"TrainConfig.model_overrides: {exc}") from exc


class XARTrainer(Trainer):
    def build_model(self) -> nn.Module:
        model = XAR(self.model_config)
        if self.cfg.init_weights:
            self.load_shipped(model, self.cfg.init_weights)
        return model

    def pixel_layout(self) -> tuple[int, int]:
        c = self.model_config
        patch = math.isqrt(c.token_dim // 3)
        return patch, c.grid * patch

    def objective(self, tokens: Tensor, conditions) -> Tensor:
        c = self.model_config
        cells = tokens[:, cell_order(c.grid, c.cells).to(tokens.device)]  # raster -> cell order
        return self.net(cells, conditions, self.model_gen)


def parse_args(argv: Sequence[str] | None = None) -> XARTrainConfig:
    p = build_parser("python -m csd.training.xar_models", __doc__.split("\n")[0], PIXEL_CONFIGS)
    return XARTrainConfig(**vars(p.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv), XARTrainer)


if __name__ == "__main__":
    main()
