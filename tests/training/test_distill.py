"""Specification of distillation in csd.training.trainer: a student that also matches a frozen teacher's head."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from csd.models.checkpoint import CheckpointError, file_digest
from csd.models.diffusion import Schedule, distill_loss, learned_log_variance
from csd.models.mar import MAR
from csd.models.registry import load_model
from csd.models.tokenizer import PixelTokenizer
from csd.shapes.data import make_dataset
from csd.training.trainer import parse_args, train
from tests.training.test_train import TINY, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

# The teacher: wider than the student (TINY), with its own head.
TEACHER = {**TINY, "encoder_embed_dim": 48, "decoder_embed_dim": 48, "diffloss_w": 48}


def _teacher(tmp_path) -> str:
    """A teacher trained for a few steps from another seed, so it differs from any student."""
    train(tiny_config(tmp_path / "teacher", steps=8, seed=7, model_overrides=TEACHER))
    return str(tmp_path / "teacher.safetensors")


def _batch(n: int = 16):
    data = make_dataset(n, 5)
    return PixelTokenizer(4).encode(data.images), data.labels


def head_gap(student: MAR, teacher: MAR) -> float:
    """Mean distillation term on a fixed batch, masks and noise: the loss with the teacher minus without."""
    tokens, labels = _batch()
    total = 0.0
    with torch.no_grad():
        for s in range(4):
            with_teacher = student(tokens, labels, torch.Generator().manual_seed(s), teacher, 1.0)
            alone = student(tokens, labels, torch.Generator().manual_seed(s))
            total += (with_teacher - alone).item()
    return total / 4


def test_distill_loss_is_zero_only_at_the_teachers_output():
    schedule = Schedule.cosine(1000)
    gen = torch.Generator().manual_seed(0)
    out, t = torch.randn(6, 8, generator=gen).clamp(-1, 1), torch.randint(0, 1000, (6,), generator=gen)
    assert torch.equal(distill_loss(schedule, out, out, t), torch.zeros(6))
    eps_off = out.clone()
    eps_off[:, :4] += 0.1
    assert distill_loss(schedule, eps_off, out, t) == pytest.approx(torch.full((6,), 0.01), rel=1e-4)
    var_off = out.clone()
    var_off[:, 4:] += 0.2  # v shifts the log-variance by 0.1 * (log beta_t - log posterior variance)
    logvar = lambda o: learned_log_variance(schedule, o[:, 4:], t)
    want = ((logvar(var_off) - logvar(out)) ** 2).mean(-1)
    assert torch.allclose(distill_loss(schedule, var_off, out, t), want) and (want > 0).all()


def test_distillation_pulls_the_students_head_towards_the_teachers(tmp_path):
    teacher_path = _teacher(tmp_path)
    teacher = load_model(teacher_path)
    common = dict(steps=40, batch_size=16, data_size=16, lr=3e-3, warmup_steps=5, seed=1)
    plain = train(tiny_config(tmp_path / "plain", **common))
    taught = train(tiny_config(tmp_path / "taught", distill_from=teacher_path, distill_weight=3.0, **common))
    without, with_teacher = head_gap(plain.model, teacher), head_gap(taught.model, teacher)
    assert with_teacher < 0.2 * without, (without, with_teacher)  # measured 0.066 x without, under every perturbation
    # The student keeps its own architecture; its record names the teacher.
    assert load_model(tmp_path / "taught.safetensors").config == plain.model.config
    record = json.loads((tmp_path / "taught.json").read_text())["train"]
    assert (record["args"]["distill_from"], record["args"]["distill_weight"]) == (teacher_path, 3.0)
    # ... and its content, which outlives the path (a copy, a renamed stage).
    assert record["distill_from_digest"] == file_digest(Path(teacher_path))
    assert "distill_from_digest" not in json.loads((tmp_path / "plain.json").read_text())["train"]


@pytest.mark.kernels
def test_weight_zero_trains_exactly_as_without_a_teacher(tmp_path):
    """The teacher draws no random numbers: with weight 0 the run is the plain run, bit for bit."""
    teacher_path = _teacher(tmp_path)
    plain = train(tiny_config(tmp_path / "plain", steps=4))
    zero = train(tiny_config(tmp_path / "zero", steps=4, distill_from=teacher_path, distill_weight=0.0))
    for (name, a), b in zip(plain.model.state_dict().items(), zero.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_teacher_of_another_layout_or_a_missing_one_is_named(tmp_path):
    teacher_path = _teacher(tmp_path)
    layout = r"distill_from .*number of tokens \(seq_len\) is 16 for the draft and 64 for the target"
    with pytest.raises(ValueError, match=layout):
        train(tiny_config(tmp_path / "s", distill_from=teacher_path, model_overrides={**TINY, "img_size": 16}))
    missing = tmp_path / "absent.safetensors"
    with pytest.raises(CheckpointError, match=re.escape(str(missing))):
        train(tiny_config(tmp_path / "s", distill_from=str(missing)))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match=r"TrainConfig\.distill_weight"):
            replace(tiny_config(tmp_path / "s"), distill_weight=bad)


def test_distillation_flags_map_onto_the_config_and_resume_keeps_them(tmp_path):
    cfg = parse_args(
        ["--config", "shapes_draft", "--out", "x", "--distill-from", "t.safetensors", "--distill-weight", "2"]
    )
    assert (cfg.distill_from, cfg.distill_weight) == ("t.safetensors", 2.0)
    assert parse_args(["--config", "shapes_draft", "--out", "x"]).distill_from is None
    teacher_path = _teacher(tmp_path)
    train(tiny_config(tmp_path / "s", steps=2, distill_from=teacher_path))
    with pytest.raises(ValueError, match=r"settings differ \(distill_weight: 1.0 -> 2.0\)"):
        train(tiny_config(tmp_path / "s", steps=4, distill_from=teacher_path, distill_weight=2.0, resume=True))
    assert train(tiny_config(tmp_path / "s", steps=4, distill_from=teacher_path, resume=True)).step == 4


# --- text models (the Harmon layout): the same distillation through TextTrainer ----------------------


def _text_config(out: Path, config: str, **kw):
    from csd.training.text_models import TextTrainConfig

    base = dict(config=config, out=str(out), steps=6, batch_size=8, lr=1e-3, warmup_steps=2, data_size=16)
    return TextTrainConfig(**(base | dict(log_every=2, save_every=0, threads=1, prompt_only=0.25) | kw))


def text_head_gap(student, teacher) -> float:
    """Mean distillation term of a text student on a fixed batch, masks and noise (as :func:`head_gap`)."""
    data = make_dataset(8, 5)
    tokens = PixelTokenizer(4).encode(data.images)
    prompts = student.check_conditions(list(data.captions), 8, torch.device("cpu"))
    total = 0.0
    with torch.no_grad():
        for s in range(4):
            with_teacher = student(tokens, prompts, torch.Generator().manual_seed(s), 0.25, None, teacher)
            total += (with_teacher - student(tokens, prompts, torch.Generator().manual_seed(s), 0.25)).item()
    return total / 4


def test_a_text_student_is_pulled_towards_a_text_teachers_head(tmp_path):
    """A text draft distilled from a text target: the student sees the teacher's
    z at the same masks, dropped prompts and prompt-only rows, and its head moves towards the teacher's."""
    from csd.training.text_models import TextTrainer

    train(_text_config(tmp_path / "teacher", "random_text_target", steps=6, seed=7), TextTrainer)
    teacher_path = str(tmp_path / "teacher.safetensors")
    teacher = load_model(teacher_path)
    common = dict(steps=30, lr=3e-3, seed=1)
    plain = train(_text_config(tmp_path / "plain", "random_text_draft", **common), TextTrainer)
    taught = train(
        _text_config(tmp_path / "taught", "random_text_draft", distill_from=teacher_path, distill_weight=3.0, **common),
        TextTrainer,
    )
    without, with_teacher = text_head_gap(plain.model, teacher), text_head_gap(taught.model, teacher)
    assert with_teacher < 0.5 * without, (without, with_teacher)
    record = json.loads((tmp_path / "taught.json").read_text())["train"]
    assert record["distill_from_digest"] == file_digest(Path(teacher_path))
    # weight 0: the teacher draws no random numbers, so the run is the plain one bit for bit
    zero = train(
        _text_config(tmp_path / "zero", "random_text_draft", distill_from=teacher_path, distill_weight=0.0, **common),
        TextTrainer,
    )
    for (name, a), b in zip(plain.model.state_dict().items(), zero.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_class_model_is_no_teacher_for_a_text_student(tmp_path):
    from csd.training.text_models import TextTrainer

    teacher_path = _teacher(tmp_path)
    with pytest.raises(ValueError, match=r"distill_from .*family is Harmon for the draft and MAR for the target"):
        train(_text_config(tmp_path / "s", "random_text_draft", distill_from=teacher_path), TextTrainer)
