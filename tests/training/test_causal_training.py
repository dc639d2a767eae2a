"""The causal trainer (csd.training.causal_models: the NextStep layout on the shapes captions) and the shipped
causal pair's provenance: a resumed run equals an uninterrupted one, a draft is distilled from a teacher of its
layout, the loss weighs tokens by the shape's cover, and the shipped files' records agree with each other."""

from __future__ import annotations

import json

import pytest
import torch

from csd.experiments import defaults
from csd.models.checkpoint import file_digest
from csd.models.registry import load_model
from csd.training.causal_models import CausalTrainConfig, CausalTrainer, parse_args
from csd.training.trainer import train
from visualize.training_curves import read_log

MODELS = defaults.EMBEDDED_DIR
HISTORY = MODELS.parent / "history" / "stages"
TINY = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
TINY_HEAD = dict(fm_head_dim=16, fm_head_layers=1)


def config(out, **kw) -> CausalTrainConfig:
    overrides = kw.pop("model_overrides", TINY | TINY_HEAD)
    base = dict(config="shapes_causal_draft", out=str(out), steps=4, batch_size=4, data_size=16, log_every=1)
    return CausalTrainConfig(**base | dict(model_overrides=overrides, warmup_steps=1, threads=1) | kw)


def test_a_resumed_causal_run_equals_an_uninterrupted_one(tmp_path):
    full = train(config(tmp_path / "full", steps=4, hflip=True, shape_weight=3.0), CausalTrainer)
    train(config(tmp_path / "part", steps=2, hflip=True, shape_weight=3.0), CausalTrainer)
    resumed = train(config(tmp_path / "part", steps=4, hflip=True, shape_weight=3.0, resume=True), CausalTrainer)
    for a, b in ((full.model, resumed.model), (full.ema, resumed.ema)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(x, y), name
    assert torch.isfinite(torch.tensor(resumed.loss))


def test_a_draft_distils_from_a_teacher_of_its_layout_and_the_record_names_it(tmp_path):
    teacher = train(config(tmp_path / "teacher", steps=1), CausalTrainer)
    student = train(config(tmp_path / "student", steps=1, distill_from=str(tmp_path / "teacher")), CausalTrainer)
    record = json.loads((tmp_path / "student.json").read_text())["train"]
    assert record["distill_from_digest"] == file_digest(tmp_path / "teacher.safetensors")
    assert student.teacher is not None and not any(p.requires_grad for p in student.teacher.parameters())
    assert type(student.teacher) is type(teacher.model)


def test_the_shape_weight_weighs_each_token_by_the_shapes_cover(tmp_path):
    trainer = CausalTrainer(config(tmp_path / "w", shape_weight=5.0))
    idx = torch.arange(4)
    weight = trainer.token_weight(idx, None)  # (B, N): 1 where no shape, up to 5 where it covers a token
    assert weight.shape == (4, 64) and weight.min() == 1.0 and 1.0 < weight.max() <= 5.0
    assert CausalTrainer(config(tmp_path / "u")).token_weight(idx, None) is None


def test_the_command_line_refuses_a_config_of_another_family(tmp_path):
    with pytest.raises(SystemExit):
        parse_args(["--config", "shapes_draft", "--out", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="shape_weight"):
        config(tmp_path / "x", shape_weight=0.0)


def test_the_shipped_causal_pairs_records_agree_with_their_files():
    """The target's log ends where its record says, at the bottom of its decay; the draft's stage 2 started from
    its stage 1 (--init-weights, its record under assets/history/stages/) and was distilled from the shipped
    target (the teacher's content hash is the shipped file's)."""
    target = json.loads((MODELS / "shapes_causal_target.json").read_text())["train"]
    log = read_log(MODELS / "shapes_causal_target.log.jsonl")
    assert log[-1]["step"] == target["steps_done"] == target["args"]["steps"]
    assert log[-1]["lr"] <= 1.01 * target["args"]["lr"] / target["args"]["cooldown_steps"]  # a linear decay's last step
    draft = json.loads((MODELS / "shapes_causal_draft.json").read_text())["train"]
    stage1 = json.loads((HISTORY / "shapes_causal_draft_stage1.json").read_text())["train"]
    assert draft["parent"]["train"] == stage1 and draft["parent"]["file_digest"]
    assert draft["distill_from_digest"] == file_digest(MODELS / "shapes_causal_target.safetensors")
    for record, name in ((draft, "shapes_causal_draft"), (stage1, "shapes_causal_draft_stage1")):
        where = MODELS if record is draft else HISTORY
        assert read_log(where / f"{name}.log.jsonl")[-1]["step"] == record["steps_done"]
    models = [load_model(MODELS / f"shapes_causal_{m}.safetensors") for m in ("target", "draft")]
    assert [m.config.num_hidden_layers for m in models] == [8, 2]
