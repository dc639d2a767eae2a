"""Specification of the evaluation entry point: seeds, modes, and distributed runs equal to single runs."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.evaluate import PROMPT_SEED, EvalConfig, eval_labels_seeds, fewer_steps, interleave
from csd.family import FamilyTraits
from csd.records.cost import csd_passes
from csd.shapes.data import NUM_CLASSES, make_dataset, render_batch
from csd.speculative import speculative_generate
from tests.helpers import save_tiny_pixel_pair

ROOT = Path(__file__).resolve().parents[2]


def test_labels_cycle_over_classes_and_seeds_are_consecutive():
    labels, seeds = eval_labels_seeds(12, seed_offset=100, traits=FamilyTraits("MAR", num_classes=10))
    assert labels == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert seeds == list(range(100, 112))


def test_a_text_models_prompts_are_the_captions_of_held_out_images_from_the_offset_on(monkeypatch):
    """Held-out shapes images' captions (seed PROMPT_SEED), at the frontier's timing offset, 100 000, as at 0:
    each image's own caption, drawn without rendering the images before it, or any."""
    text = FamilyTraits("Harmon", conditions="prompts")
    seeds = list(range(100_000, 100_006))
    expected = [render_batch([i % NUM_CLASSES], PROMPT_SEED, start=i)[1][0] for i in seeds]
    first = make_dataset(3, PROMPT_SEED).captions
    monkeypatch.setattr("csd.shapes.data._render", lambda *args: pytest.fail("an image was rendered"))
    assert eval_labels_seeds(6, seed_offset=100_000, traits=text) == (expected, seeds)
    assert eval_labels_seeds(3, 0, text)[0] == first


@pytest.mark.parametrize(("n", "world"), [(8, 2), (7, 3), (5, 1), (2, 4)])
def test_interleave_undoes_the_strided_split_across_ranks(n, world):
    items = torch.arange(n * 2).reshape(n, 2)
    rows = -(-n // world)
    shares = [torch.cat([items[r::world], torch.full((rows - len(items[r::world]), 2), -1)]) for r in range(world)]
    assert torch.equal(interleave(shares, n), items)


def test_fewer_steps_baseline_has_as_many_steps_as_csd_has_target_passes():
    sampling, csd = SamplingConfig(num_steps=16), CSDConfig(gamma=4, prefill=0.05)
    passes, _ = csd_passes(64, sampling, csd)
    # The cosine schedule's first steps make 1, 1, 1, 2 tokens: 5% of 64 takes 4 pre-fill steps.
    assert (
        fewer_steps(sampling, csd, SimpleNamespace(seq_len=64, traits=FamilyTraits("MAR", num_classes=10))).num_steps
        == passes
        == 4 + 3
    )  # + ceil(12 / 4) blocks
    growing = CSDConfig(gamma=4, gamma_schedule=(1, 1, 2), prefill=0.05)  # blocks of 1, 1, 2, 4, 4 steps
    assert (
        fewer_steps(
            sampling, growing, SimpleNamespace(seq_len=64, traits=FamilyTraits("MAR", num_classes=10))
        ).num_steps
        == 4 + 5
    )


def test_gamma_schedule_flag_reaches_the_settings():
    import argparse

    from csd.experiments.evaluate import add_setting_args, settings_from_args

    parser = argparse.ArgumentParser()
    add_setting_args(parser)
    _, csd = settings_from_args(parser.parse_args(["--gamma", "8", "--gamma-schedule", "2", "2", "4"]))
    assert (csd.gamma, csd.gamma_schedule) == (8, (2, 2, 4))
    assert settings_from_args(parser.parse_args([]))[1].gamma_schedule == ()
    assert settings_from_args(parser.parse_args([]))[1].align is True
    assert settings_from_args(parser.parse_args(["--no-align"]))[1].align is False
    sampling, csd = settings_from_args(
        parser.parse_args(["--head-steps", "20", "--head-steps-min", "5", "--draft-head-steps", "8"])
    )
    assert (sampling.head_steps, sampling.head_anneal.last, csd.draft_head_steps) == (20, 5, 8)


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"mode": "fast"}, "mode"), ({"n": 1}, "n"), ({"batch_size": 0}, "batch")]
)
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        EvalConfig(**kwargs)


def _run(args: list[str], out: Path, nproc: int) -> dict:
    # torchrun's parser would take "--n" for an ambiguous abbreviation of its own options: use --num-images.
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone"] if nproc > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same intra-op threads in both runs
    cmd = [sys.executable, *launcher, "-m", "csd.experiments.evaluate", *args, "--out", str(out), "--device", "cpu"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_process_run_equals_single_process_run(tmp_path):
    """Each process makes its share of the images (rank r: images r, r + 2, ...) and rank 0 gathers them in
    order. Batches of one image, so every image is the same computation in both runs, with the same shapes:
    equal on any CPU. (With batches of two, image 0 would share a batch with image 1 in one run and with
    image 2 in the other: equal only up to float32 rounding on a CPU whose kernels round by shape; batch
    invariance is asserted in float64 in tests/decoders/test_speculative.py and tests/decoders/test_families.py.)"""
    target, draft = save_tiny_pixel_pair(tmp_path)
    args = ["--target", target, "--draft", draft, "--mode", "csd", "--num-images", "8", "--batch-size", "1"]
    args += ["--n-ref", "40", "--num-steps", "6", "--gamma", "2", "--seed-offset", "3"]
    single = _run([*args, "--sheet", str(tmp_path / "single.png")], tmp_path / "single.json", nproc=1)
    double = _run([*args, "--sheet", str(tmp_path / "double.png")], tmp_path / "double.json", nproc=2)
    # The gathered images are the single run's, pixel for pixel (the contact sheets are equal files).
    assert (tmp_path / "single.png").read_bytes() == (tmp_path / "double.png").read_bytes()
    assert double["world_size"] == 2 and single["world_size"] == 1
    assert double["accuracy"] == single["accuracy"]
    assert double["confusion"] == single["confusion"] and sum(map(sum, single["confusion"])) == 8
    per_class = single["per_class_accuracy"]
    assert sum(single["confusion"][c][c] for c in range(10)) / 8 == single["accuracy"]
    assert all(math.isnan(per_class[name]) for name in list(per_class)[8:])  # no images of classes 8, 9
    assert double["fd"] == pytest.approx(single["fd"], rel=1e-6) and single["fd"] > 0
    for key in ("acceptance_rate", "drafted_tokens", "cap_hits", "mean_resample_tries"):
        assert double[key] == pytest.approx(single[key], rel=1e-9, nan_ok=True)


def test_criterion_flags_reach_the_sampler(tmp_path, restore_threads):
    """--criterion and --trajectory-term change the acceptance test of the CSD run, and the result
    records them; the exact test scores the same images as a direct call with that setting."""
    from csd.experiments.evaluate import generate_images, load_models, main, summarize_stats

    target_path, draft_path = save_tiny_pixel_pair(tmp_path)
    args = ["--target", target_path, "--draft", draft_path, "--mode", "csd", "--n", "4", "--batch-size", "2"]
    args += ["--n-ref", "30", "--num-steps", "6", "--gamma", "2", "--threads", "1"]
    exact = main([*args, "--criterion", "exact", "--out", str(tmp_path / "exact.json")])
    none = main([*args, "--trajectory-term", "none"])
    default = main(args)
    assert exact["settings"]["csd"]["criterion"] == "exact" and none["settings"]["csd"]["trajectory_term"] == "none"
    assert default["settings"]["csd"]["criterion"] == "aligned"
    assert json.loads((tmp_path / "exact.json").read_text())["acceptance_rate"] == exact["acceptance_rate"]
    assert exact["fd"] != default["fd"]  # other images: the exact test resamples whole paths

    target, draft = load_models(target_path, draft_path, torch.device("cpu"))
    sampling = SamplingConfig.from_knobs(**exact["settings"]["sampling"])
    csd = CSDConfig.from_knobs(**exact["settings"]["csd"])
    labels, seeds = eval_labels_seeds(4, 0, target.traits)
    _, stats = generate_images("csd", target, draft, labels, seeds, sampling, csd, 2)
    for key in ("acceptance_rate", "mean_resample_tries", "drafted_tokens"):
        assert summarize_stats(stats)[key] == pytest.approx(exact[key], nan_ok=True)


def test_unknown_criterion_is_refused_by_name(capsys):
    from csd.experiments.evaluate import main

    with pytest.raises(SystemExit):
        main(["--criterion", "approximate"])
    assert "--criterion" in capsys.readouterr().err


def test_acceptance_terms_are_the_mean_kept_probability_of_each_part_of_log_r(random_models, one_thread):
    from csd.experiments.evaluate import image_stats, summarize_stats

    sampling, csd = SamplingConfig(num_steps=8, cfg_scale=2.0), CSDConfig(gamma=4)
    trace = speculative_generate(random_models.target, random_models.draft, [1, 2, 3], [4, 5, 6], sampling, csd).trace
    got = summarize_stats(image_stats(trace))
    v = trace.verified
    kept = lambda log_r: np.minimum(1.0, np.exp(log_r[v])).mean()
    traj, final = trace.log_ratio_trajectory, trace.log_ratio_final
    assert got["mean_accept_prob"] == pytest.approx(trace.mean_accept_prob, rel=1e-5)
    assert got["accept_prob_trajectory_term_alone"] == pytest.approx(kept(traj), rel=1e-5)
    assert got["accept_prob_final_term_alone"] == pytest.approx(kept(final), rel=1e-5)


def test_perturbed_draft_is_seeded_and_scaled_per_tensor():
    from csd.experiments.evaluate import perturb_weights
    from csd.models.mar import MAR, tiny_pixel_config

    base = MAR(tiny_pixel_config(16, 1))
    a, b = (perturb_weights(copy.deepcopy(base), 0.01) for _ in range(2))
    for wa, wb, w in zip(a.parameters(), b.parameters(), base.parameters(), strict=True):
        torch.testing.assert_close(wa, wb)  # same seed, same noise
        if w.numel() > 100 and w.std() > 0:
            assert 0.005 < ((wa - w).std() / w.std()).item() < 0.02


def test_a_text_pair_is_scored_by_the_class_and_colour_its_prompts_name(tmp_path, restore_threads):
    from csd.experiments.evaluate import main
    from tests.helpers import save_tiny_text_pair

    target, draft = save_tiny_text_pair(tmp_path)
    args = ["--target", target, "--draft", draft, "--mode", "target", "--n", "4", "--batch-size", "2"]
    args += ["--n-ref", "30", "--num-steps", "4", "--threads", "1", "--sheet", str(tmp_path / "sheet.png")]
    result = main(args)
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["colour_accuracy"] <= 1 and result["fd"] > 0
    assert sum(map(sum, result["confusion"])) == 4  # every held-out caption names its class
    assert sum(result["confusion"][c][c] for c in range(10)) / 4 == result["accuracy"]
    assert (tmp_path / "sheet.png").is_file()
