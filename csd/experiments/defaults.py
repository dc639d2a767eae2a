"""Default settings of the embedded shapes pair, in one place so the app, evaluation and benchmark agree."""

from __future__ import annotations

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.pairs import EMBEDDED_DIR

TARGET_PATH = EMBEDDED_DIR / "shapes_target.safetensors"
DRAFT_PATH = EMBEDDED_DIR / "shapes_draft.safetensors"

SAMPLING = SamplingConfig(num_steps=32, cfg_scale=3.0, cfg_schedule="linear", temperature=1.0)
CSD = CSDConfig(gamma=8, prefill=0.05)
BATCH_SIZE = 8
