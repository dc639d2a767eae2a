"""The shipped embedded models: their training records are complete and agree with the weights."""

from __future__ import annotations

import json

import pytest

from csd import defaults
from csd.models.registry import load_model
from visualize.training import chain_logs, read_log

MODELS = defaults.EMBEDDED_DIR


@pytest.mark.parametrize("name", ["shapes_target", "shapes_draft"])
def test_each_stage_of_a_shipped_model_has_its_config_and_log(name):
    """Stage 2 (--init-from) continues stage 1: the JSON records the parent's run, both logs are shipped and
    end where the records say, and the weights load with the recorded config."""
    record = json.loads((MODELS / f"{name}.json").read_text())["train"]
    parent = record["parent"]
    stage1 = json.loads((MODELS / f"{name}_stage1.json").read_text())["train"]
    assert parent["steps_done"] == stage1["steps_done"]
    assert parent["args"]["model_overrides"] == stage1["args"]["model_overrides"] == {}
    assert parent["path"].endswith(f"{name}_stage1.train_state.pt")
    logs = [read_log(MODELS / f"{name}_stage1.log.jsonl"), read_log(MODELS / f"{name}.log.jsonl")]
    assert logs[0][-1]["step"] == stage1["steps_done"]
    assert logs[1][-1]["step"] == record["steps_done"] == record["args"]["steps"]
    assert logs[1][-1]["lr"] < 1e-3 * record["args"]["lr"]  # ends at the bottom of its LR decay
    assert chain_logs(logs)[-1]["step"] == stage1["steps_done"] + record["steps_done"]
    # Stage 2 widened MAR's mask ratios; the shipped config says so.
    config = load_model(MODELS / f"{name}.safetensors").config
    overrides = record["args"]["model_overrides"]
    assert (config.mask_ratio_min, config.mask_ratio_std) == (overrides["mask_ratio_min"], overrides["mask_ratio_std"])
    assert config.mask_ratio_min < 0.7
