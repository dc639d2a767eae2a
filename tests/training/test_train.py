"""Specification of training (csd.training.trainer) and of the project's model files (csd.models.registry)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from csd.core.precision import at_precision
from csd.models.checkpoint import CheckpointError, safe_torch_load
from csd.models.mar import MAR, mar_config, truncated_normal_ratio
from csd.models.registry import load_model, save_model
from csd.models.tokenizer import PixelTokenizer
from csd.shapes.data import make_dataset
from csd.training.trainer import TrainConfig, Trainer, lr_at, parse_args, train
from tests.helpers import assert_same64

ROOT = Path(__file__).resolve().parents[2]

# A pixel MAR of a few thousand parameters in the embedded layout (32x32 RGB, 4x4 patches).
TINY = {
    "encoder_embed_dim": 32,
    "decoder_embed_dim": 32,
    "encoder_depth": 1,
    "decoder_depth": 1,
    "encoder_num_heads": 2,
    "decoder_num_heads": 2,
    "diffloss_d": 1,
    "diffloss_w": 32,
}


# One thread for speed (tests/conftest.py). The runs compared bit for bit below (a resumed run and an
# uninterrupted one; weights copied or loaded) are the same computation on the same shapes, equal under any
# thread count and kernels (checked under tests/kernels.py's perturbations); outputs of two models are
# compared in float64.
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(out: Path, **kw) -> TrainConfig:
    base = dict(
        config="shapes_draft",
        out=str(out),
        steps=6,
        batch_size=8,
        lr=1e-3,
        warmup_steps=2,
        data_size=32,
        model_overrides=TINY,
        log_every=2,
    )
    return TrainConfig(**{**base, **kw})


def fixed_batch_loss(model: MAR, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Training loss averaged over fixed masks and noise (seeded generators), so runs are comparable."""
    with torch.no_grad():
        return sum(model(tokens, labels, torch.Generator().manual_seed(s)).item() for s in range(4)) / 4


def test_training_reduces_the_loss_on_a_fixed_batch(tmp_path):
    cfg = tiny_config(tmp_path / "m", steps=40, batch_size=16, data_size=16, lr=3e-3, warmup_steps=5)
    trainer = Trainer(cfg)
    data = make_dataset(16, cfg.data_seed)
    tokens, labels = PixelTokenizer(4).encode(data.images), data.labels
    before = fixed_batch_loss(trainer.model, tokens, labels)
    trainer.fit()
    after = fixed_batch_loss(trainer.model, tokens, labels)
    assert after < 0.7 * before, (before, after)  # measured 0.447 x before, under every kernel perturbation


def test_run_writes_ema_weights_config_log_and_train_state(tmp_path):
    trainer = train(tiny_config(tmp_path / "run" / "m", save_every=4))
    meta = json.loads((tmp_path / "run" / "m.json").read_text())
    assert meta["arch"] == "mar"
    assert meta["config"] == mar_config("shapes_draft", **TINY).to_dict()
    assert meta["train"]["steps_done"] == 6 and meta["train"]["args"]["lr"] == 1e-3
    assert meta["train"]["final_loss"] == pytest.approx(trainer.loss)
    weights = load_file(str(tmp_path / "run" / "m.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in trainer.ema.state_dict().items())
    log = [json.loads(line) for line in (tmp_path / "run" / "m.log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4, 6] and set(log[0]) == {"step", "loss", "lr", "elapsed"}
    state = safe_torch_load(tmp_path / "run" / "m.train_state.pt")  # weights_only=True
    assert state["step"] == 6 and set(state) >= {"model", "ema", "optimizer", "rng"}


@pytest.mark.kernels
def test_saved_model_loads_back_with_identical_outputs(tmp_path):
    """Every weight comes back bit for bit, so the outputs are the same: compared in float64 (float64 copies of
    both), since in float32 a kernel may round a loaded tensor (another address) otherwise on some CPUs."""
    trainer = train(tiny_config(tmp_path / "m"))
    loaded = load_model(tmp_path / "m.safetensors")
    assert not loaded.training
    saved, back = trainer.ema.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    data = make_dataset(4, 1)
    tokens, labels = PixelTokenizer(4).encode(data.images).double(), data.labels
    mask = torch.rand(4, 64, generator=torch.Generator().manual_seed(0)) < 0.5
    mask[:] = mask[0]  # MAR needs the same number of known tokens in every row
    with torch.no_grad():
        want = at_precision(trainer.ema, "float64").conditions(tokens, mask, labels, guided=True)
        got = at_precision(loaded, "float64").conditions(tokens, mask, labels, guided=True)
    assert_same64(got[0], want[0], "conditions")
    assert_same64(got[1], want[1], "unconditional conditions")
    assert load_model(tmp_path / "m").config == trainer.ema.config  # the suffix is optional


@pytest.mark.kernels
def test_resumed_run_equals_an_uninterrupted_run(tmp_path):
    full = train(tiny_config(tmp_path / "full", steps=6, hflip=True))
    train(tiny_config(tmp_path / "part", steps=3, hflip=True))
    resumed = train(tiny_config(tmp_path / "part", steps=6, hflip=True, resume=True))
    assert resumed.step == 6
    for a, b in ((full.model, resumed.model), (full.ema, resumed.ema)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(x, y), name
    log = [json.loads(line)["step"] for line in (tmp_path / "part.log.jsonl").read_text().splitlines()]
    assert log == [2, 3, 4, 6]


def test_resume_refuses_changed_settings(tmp_path):
    train(tiny_config(tmp_path / "m", steps=2))
    with pytest.raises(ValueError, match=r"settings differ \(lr: 0.001 -> 0.002\)"):
        train(tiny_config(tmp_path / "m", steps=4, lr=2e-3, resume=True))


def test_time_budget_stops_and_saves(tmp_path):
    trainer = train(tiny_config(tmp_path / "m", steps=1000, max_minutes=1e-9))
    assert trainer.step == 1
    assert json.loads((tmp_path / "m.json").read_text())["train"]["steps_done"] == 1


def test_weights_that_do_not_match_the_config_fail_naming_the_file(tmp_path):
    model = MAR(mar_config("shapes_draft", **TINY))
    path = save_model(model, tmp_path / "m")
    meta_path = tmp_path / "m.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["diffloss_w"] = 48
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"(?s){re.escape(str(path))}.*shape mismatches"):
        load_model(path)
    meta["config"]["decoder_depth"] = 2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"(?s){re.escape(str(path))}.*missing keys"):
        load_model(path)
    meta["config"]["no_such_field"] = 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(meta_path))}.*unknown MARConfig fields"):
        load_model(path)
    meta_path.write_text(json.dumps({"arch": "vae", "config": {}}))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(meta_path))}.*arch"):
        load_model(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "absent.safetensors")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"steps": 0}, "steps"),
        ({"lr": float("nan")}, "lr"),
        ({"ema_decay": 1.0}, "ema_decay"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"config": "nope"}, "config"),
        ({"config": "mar_test"}, "config"),  # KL-16 latents, not pixel tokens
        ({"model_overrides": {"depth": 3}}, "model_overrides"),
        ({"max_minutes": 0.0}, "max_minutes"),
        ({"precision": "float8"}, "precision"),
        ({"cooldown_steps": -1}, "cooldown_steps"),
        ({"cooldown_steps": 2, "lr_schedule": "cosine"}, "cooldown_steps"),
        ({"steps": 6, "warmup_steps": 2, "cooldown_steps": 5}, "warmup_steps"),
    ],
)
def test_config_validation_names_the_field(tmp_path, change, field):
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field}"):
        replace(tiny_config(tmp_path / "m"), **change)


def test_lr_warms_up_linearly_then_follows_the_schedule(tmp_path):
    cfg = tiny_config(tmp_path / "m", steps=10, lr=1.0, warmup_steps=4)
    assert [lr_at(s, cfg) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = replace(cfg, lr_schedule="cosine")
    assert lr_at(4, cosine) == 1.0 and lr_at(7, cosine) == pytest.approx(0.5) and lr_at(10, cosine) == 0.0


def test_cooldown_decays_the_constant_rate_linearly_over_the_last_steps(tmp_path):
    cfg = tiny_config(tmp_path / "m", steps=10, lr=1.0, warmup_steps=2, cooldown_steps=4)
    got = [lr_at(s, cfg) for s in range(10)]
    assert got == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])


def test_bfloat16_autocast_trains_close_to_float32(tmp_path):
    losses = {}
    for precision in ("float32", "bfloat16"):
        trainer = Trainer(tiny_config(tmp_path / precision, precision=precision))
        losses[precision] = [trainer.train_step() for _ in range(3)]
    assert losses["float32"] != losses["bfloat16"]  # autocast really ran
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.05)  # measured within 4.2e-4, any perturbation


def test_resume_may_switch_precision_and_add_a_cooldown(tmp_path):
    train(tiny_config(tmp_path / "m", steps=3))
    with (tmp_path / "m.log.jsonl").open("a") as f:  # a run killed after step 3's save logged further steps
        f.write(json.dumps({"step": 4, "loss": 1.0, "lr": 1e-3, "elapsed": 1.0}) + "\n")
    resumed = train(tiny_config(tmp_path / "m", steps=6, precision="bfloat16", cooldown_steps=2, resume=True))
    assert resumed.step == 6
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["train"]["args"]["precision"] == "bfloat16" and meta["train"]["args"]["cooldown_steps"] == 2
    log = [json.loads(line)["step"] for line in (tmp_path / "m.log.jsonl").read_text().splitlines()]
    assert log == [2, 3, 4, 6]  # the stale step-4 record was dropped, the re-run's kept


def test_init_from_starts_a_new_run_from_another_runs_weights(tmp_path):
    parent = train(tiny_config(tmp_path / "parent", steps=4))
    # A new run: another mask-ratio distribution, LR and schedule, from the parent's weights and moments.
    child_cfg = tiny_config(
        tmp_path / "child",
        steps=3,
        lr=5e-4,
        seed=5,
        init_from=str(tmp_path / "parent.train_state.pt"),
        model_overrides={**TINY, "mask_ratio_min": 0.05, "mask_ratio_std": 1.0},
    )
    child = Trainer(child_cfg)
    child.init_from(child_cfg.init_from)
    for a, b in ((parent.model, child.model), (parent.ema, child.ema)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(x, y), name
    assert child.step == 0 and lr_at(0, child_cfg) == pytest.approx(2.5e-4)  # a fresh warm-up
    assert [g["weight_decay"] for g in child.optimizer.param_groups] == [0.0, child_cfg.weight_decay]
    moments = child.optimizer.state_dict()["state"]
    assert moments and all(int(v["step"]) == 4 for v in moments.values())  # the parent's AdamW moments

    done = train(child_cfg)
    assert done.step == 3
    record = json.loads((tmp_path / "child.json").read_text())["train"]
    assert record["parent"]["steps_done"] == 4 and record["parent"]["path"].endswith("parent.train_state.pt")
    assert record["args"]["model_overrides"]["mask_ratio_min"] == 0.05
    # The lineage survives a resume of the child.
    resumed = train(replace(child_cfg, steps=5, resume=True))
    assert resumed.step == 5 and resumed.parent["steps_done"] == 4


def test_init_from_refuses_another_architecture_naming_the_file(tmp_path):
    train(tiny_config(tmp_path / "parent", steps=2))
    state = tmp_path / "parent.train_state.pt"
    wider = tiny_config(tmp_path / "child", init_from=str(state), model_overrides={**TINY, "diffloss_w": 48})
    with pytest.raises(CheckpointError, match=re.escape(str(state))):
        train(wider)
    with pytest.raises(CheckpointError, match="not found"):
        train(tiny_config(tmp_path / "child", init_from=str(tmp_path / "absent.train_state.pt")))


def test_init_weights_starts_a_new_run_from_a_shipped_model(tmp_path):
    parent = train(tiny_config(tmp_path / "parent", steps=4))
    cfg = tiny_config(tmp_path / "child", steps=2, init_weights=str(tmp_path / "parent.safetensors"))
    child = Trainer(cfg)
    for (name, x), y in zip(parent.ema.state_dict().items(), child.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name  # the shipped file holds the EMA weights: they start model and EMA
    assert not child.optimizer.state_dict()["state"]  # fresh AdamW moments
    assert child.parent["path"].endswith("parent.safetensors") and child.parent["train"]["steps_done"] == 4
    train(cfg)
    record = json.loads((tmp_path / "child.json").read_text())["train"]
    assert record["parent"]["train"]["steps_done"] == 4 and record["parent"]["file_digest"].startswith("sha256:")


def test_init_weights_refuses_another_architecture_and_init_from_together(tmp_path):
    train(tiny_config(tmp_path / "parent", steps=2))
    wider = tiny_config(
        tmp_path / "child",
        init_weights=str(tmp_path / "parent.safetensors"),
        model_overrides={**TINY, "diffloss_w": 48},
    )
    with pytest.raises(ValueError, match="init_weights .*architecture differs"):
        train(wider)
    with pytest.raises(ValueError, match="init_weights and init_from are exclusive"):
        tiny_config(tmp_path / "c", init_weights="a.safetensors", init_from="b.train_state.pt")


def test_lr_multipliers_scale_the_named_submodules_only():
    from csd.training.trainer import param_groups

    model = MAR(mar_config("shapes_draft", **TINY))
    groups = param_groups(model, 0.02, {"diffloss": 10.0})
    by_mult = {}
    for g in groups:
        by_mult.setdefault(g["lr_mult"], set()).update(id(p) for p in g["params"])
    assert by_mult[10.0] == {id(p) for p in model.diffloss.parameters()}
    assert by_mult[1.0] == {id(p) for n, p in model.named_parameters() if not n.startswith("diffloss.")}
    assert {g["weight_decay"] for g in groups if all(p.ndim <= 1 for p in g["params"])} == {0.0}
    with pytest.raises(ValueError, match="not submodules"):
        param_groups(model, 0.02, {"llm": 2.0})


def test_mask_ratios_follow_the_truncated_normal(tmp_path):
    def ratios(lo, std):
        g = torch.Generator().manual_seed(0)
        return torch.tensor([truncated_normal_ratio(lo, g, "cpu", std) for _ in range(4000)])

    mar = ratios(0.7, 0.25)  # MAR's training distribution: mostly near 1, never below 0.7
    assert mar.min() >= 0.7 and mar.max() <= 1.0 and 0.85 < mar.mean() < 0.9
    wide = ratios(0.05, 1.0)  # close to uniform on [0.05, 1]: the model also sees mostly-known images
    assert wide.min() >= 0.05 and (wide < 0.3).float().mean() > 0.15 and 0.5 < wide.mean() < 0.62
    with pytest.raises(ValueError, match=r"MARConfig\.mask_ratio_std"):
        mar_config("shapes_draft", mask_ratio_std=0.0)


def test_command_line_maps_onto_the_config():
    cfg = parse_args(
        ["--config", "shapes_target", "--out", "x", "--steps", "7", "--hflip", "--model-overrides", '{"diffloss_d": 2}']
    )
    assert (cfg.config, cfg.out, cfg.steps, cfg.hflip, cfg.model_overrides) == (
        "shapes_target",
        "x",
        7,
        True,
        {"diffloss_d": 2},
    )


def test_two_process_gloo_run(tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "csd.training.trainer",
    ]
    cmd += ["--config", "shapes_draft", "--out", str(out), "--steps", "3", "--batch-size", "4", "--data-size", "16"]
    cmd += ["--log-every", "1", "--threads", "1", "--device", "cpu", "--model-overrides", json.dumps(TINY)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["train"]["world_size"] == 2 and meta["train"]["global_batch_size"] == 8
    assert len(safe_torch_load(out.with_name("ddp.train_state.pt"))["rng"]) == 2
    load_model(out)


def test_the_init_is_the_runs_seed_whatever_the_callers_generator_holds(tmp_path):
    """Layer init draws the run's own seed stream (what torch.manual_seed of it gives, through
    csd.core.rng.drawing_from), not whatever the caller's global generator holds."""
    from csd.core.rng import stream_seed

    cfg = tiny_config(tmp_path / "run")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(cfg.seed, "train/init"))
        expected = MAR(cfg.model_config()).state_dict()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        trainer = Trainer(cfg)
    for name, value in expected.items():
        assert torch.equal(trainer.model.state_dict()[name], value), name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(999)
        other = Trainer(cfg)
    assert all(torch.equal(a, b) for a, b in zip(other.model.parameters(), trainer.model.parameters(), strict=True))
