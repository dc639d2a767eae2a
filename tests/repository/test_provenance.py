"""Provenance of the shipped files: the embedded models' training records are complete and agree with the
weights, the presets are the shipped architectures, and the precomputed panels were made from these weights.
(What the shipped models do is tested in test_shipped_models.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csd.experiments import defaults
from csd.models.checkpoint import file_digest
from csd.models.mar import mar_config
from csd.models.registry import load_model
from visualize.training_curves import chain_logs, read_log

MODELS = defaults.EMBEDDED_DIR
HISTORY = MODELS.parent / "history" / "stages"
DRAFT_TEACHER = "sha256:9f0ddae7e89ad54a"  # file_digest of the target the shipped draft was distilled from


def stages(name: str) -> list[Path]:
    """Files (without suffix) of a model's training stages, oldest first: the earlier stages under
    assets/history/stages/, then the shipped model."""
    found, k = [], 1
    while (HISTORY / f"{name}_stage{k}.json").exists():
        found.append(HISTORY / f"{name}_stage{k}")
        k += 1
    return [*found, MODELS / name]


@pytest.mark.parametrize("name", ["shapes_target", "shapes_draft"])
def test_each_stage_of_a_shipped_model_has_its_config_and_log(name):
    """Each later stage started from the one before (--init-from): its JSON records that run, every stage's
    log is shipped and ends where its record says, and each stage ends at the bottom of its LR decay."""
    stems = stages(name)
    assert len(stems) >= 2, "the shipped models were trained in stages (assets/models/TRAINING.md)"
    records = [json.loads(Path(f"{s}.json").read_text())["train"] for s in stems]
    assert "parent" not in records[0]
    for stem, before, record in zip(stems[1:], records[:-1], records[1:], strict=True):
        parent = record["parent"]
        if "grow_from" in parent["args"]:
            # A stage started through csd.training.grow from the weights shipped before it (under <name> then): its
            # parent is the grown train state (no steps of its own), whose parent is that stage's record.
            assert parent["args"]["grow_from"].endswith(f"{name}.safetensors") and parent["steps_done"] == 0, stem
            parent = parent["parent"]
            assert parent["steps_done"] == before["steps_done"] and parent["args"] == before["args"], stem
            continue
        assert parent["steps_done"] == before["steps_done"], stem
        assert parent["args"] == before["args"], stem
        # The parent is the train state the stage before wrote: under its shipped name, or where that run
        # wrote it when it was trained outside the tree (its args.out).
        written = (f"{stems[stems.index(stem) - 1].name}.train_state.pt", f"{before['args']['out']}.train_state.pt")
        assert parent["path"].endswith(written[0]) or parent["path"] == written[1], (stem, parent["path"])
    logs = [read_log(Path(f"{s}.log.jsonl")) for s in stems]
    for stem, log, record in zip(stems, logs, records, strict=True):
        assert log[-1]["step"] == record["steps_done"] == record["args"]["steps"], stem
        assert log[-1]["lr"] < 1e-3 * record["args"]["lr"], stem  # the end of a linear decay to 0
    assert chain_logs(logs)[-1]["step"] == sum(r["steps_done"] for r in records)


@pytest.mark.parametrize("name", ["shapes_target", "shapes_draft"])
def test_later_stages_train_with_wider_mask_ratios(name):
    """Stage 1 used MAR's mask ratios (>= 0.7); the shipped weights were trained on near-uniform ones."""
    first, *_ = stages(name)
    stage1 = json.loads(Path(f"{first}.json").read_text())["config"]
    assert stage1["mask_ratio_min"] == 0.7 and "mask_ratio_std" not in stage1  # written before the field existed
    config = load_model(MODELS / f"{name}.safetensors").config
    assert (config.mask_ratio_min, config.mask_ratio_std) == (0.05, 1.0)


def test_the_shipped_target_was_grown_deeper_and_the_draft_distilled_from_it():
    """Stage 10 of the target grew 6 + 6 -> 8 + 8 blocks and stage 11 grew 8 + 8 -> 10 + 10. The draft kept its
    size: stage 3 was trained against the stage-10 target's head (--distill-from; that target was in
    assets/history/tried/ then, and is in the git history now), stage 4 against the shipped stage-11 target's
    (a copy of assets/models/shapes_target.safetensors outside the tree, TRAINING.md)."""
    target = json.loads((MODELS / "shapes_target.json").read_text())["train"]
    assert target["parent"]["args"]["encoder_depth"] == target["parent"]["args"]["decoder_depth"] == [8, 10]
    model = load_model(MODELS / "shapes_target.safetensors")
    assert (model.config.encoder_depth, model.config.decoder_depth) == (10, 10)
    stage10 = json.loads((HISTORY / "shapes_target_stage10.json").read_text())["train"]
    assert stage10["parent"]["args"]["encoder_depth"] == stage10["parent"]["args"]["decoder_depth"] == [6, 8]
    draft3 = json.loads((HISTORY / "shapes_draft_stage3.json").read_text())["train"]
    assert draft3["args"]["distill_from"].endswith("shapes_target_stage10.safetensors")
    draft = json.loads((MODELS / "shapes_draft.json").read_text())["train"]
    assert draft["args"]["distill_from"].endswith("/shapes_target.safetensors")
    for record in (draft3, draft):
        assert record["args"]["distill_weight"] == 1.0 and record["parent"]["args"]["encoder_depth"] == [2, 2]
    assert draft3["steps_done"] == 4000 and draft["steps_done"] == 6000
    # The teacher was a copy of the shipped target (TRAINING.md gives its sha256): a new target needs a new
    # distillation, so this fails until the draft is distilled again (csd.training.trainer now records the hash itself).
    assert file_digest(MODELS / "shapes_target.safetensors") == DRAFT_TEACHER, (
        "the shipped target is not the draft's teacher"
    )
    assert stage10["steps_done"] == 6500 and target["steps_done"] == 5000


@pytest.mark.parametrize("name", ["shapes_target", "shapes_draft"])
def test_the_presets_are_the_shipped_architectures(name):
    assert load_model(MODELS / f"{name}.safetensors").config == mar_config(name)


def test_shipped_analysis_panels_were_made_from_the_shipped_weights():
    """The Analysis tab's precomputed panels must describe the embedded models in this commit."""
    from csd.records.panel_data import Panels

    panels = Panels.load(MODELS.parent / "analysis_default.json")
    assert panels.weights == file_digest(defaults.TARGET_PATH, defaults.DRAFT_PATH), (
        "rerun python -m csd.experiments.analysis"
    )


def test_the_shipped_text_draft_was_distilled_from_the_shipped_text_target():
    """The text target was continued on a GPU and the text draft distilled from it as it ships (the
    float16 round trip both crossed the device tool in, scripts/gpu_train/text_pair.sh): the draft's record
    names the shipped target's content, and the chain of the target's stages ends at the shipped weights."""
    draft = json.loads((MODELS / "shapes_text_draft.json").read_text())["train"]
    assert draft["distill_from_digest"] == file_digest(MODELS / "shapes_text_target.safetensors")
    assert draft["args"]["distill_weight"] > 0
    logs = [read_log(Path(f"{s}.log.jsonl")) for s in stages("shapes_text_target")]
    records = [json.loads(Path(f"{s}.json").read_text())["train"] for s in stages("shapes_text_target")]
    assert len(logs) == 4  # the pair of issue 42's first run, its 1400 CPU steps, two GPU runs
    for stem, log, record in zip(stages("shapes_text_target"), logs, records, strict=True):
        assert log[-1]["step"] == record["steps_done"], stem
    for log, record in zip(logs[1:], records[1:], strict=True):  # each later stage ends at the bottom of its decay
        assert log[-1]["lr"] < 1e-2 * record["args"]["lr"]


def test_the_shipped_xar_target_is_its_second_stage_continued_on_a_gpu():
    """Stage 3 of the xAR target continued stage 2 on a GPU from a float16 copy of it (the device tool's
    64 MiB, scripts/gpu_train/half.py): its record holds stage 2's own record as its parent's, names the
    copy's digest, and the chain of the three stages' logs ends at the shipped weights."""
    stems = stages("shapes_xar_target")
    records = [json.loads(Path(f"{s}.json").read_text())["train"] for s in stems]
    assert len(stems) == 3
    stage2, shipped = records[1], records[2]
    assert shipped["parent"]["train"] == stage2  # the whole record, its own parent (stage 1's weights) too
    assert shipped["args"]["init_weights"] == shipped["parent"]["path"]
    # the float16 round trip of stage 2's weights (git show 833fb60:assets/models/shapes_xar_target.safetensors, then
    # half.py to16 and to32; TRAINING.md)
    assert shipped["parent"]["file_digest"] == "sha256:782535b5f8a9056b"
    logs = [read_log(Path(f"{s}.log.jsonl")) for s in stems]
    for stem, log, record in zip(stems, logs, records, strict=True):
        assert log[-1]["step"] == record["steps_done"] == record["args"]["steps"], stem
        assert log[-1]["lr"] < 1e-3 * record["args"]["lr"], stem  # each stage ends at the bottom of its decay
    assert chain_logs(logs)[-1]["step"] == sum(r["steps_done"] for r in records) == 5800 + 4000 + 4012
