"""Specification of the benchmark: the cost-model bound, the A/B alternation, and the report's keys."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from csd.cli import parse_setting
from csd.config import CSDConfig, SamplingConfig
from csd.core.schedule import step_sizes
from csd.experiments import defaults
from csd.experiments.bench import BenchConfig, compare_settings, main
from csd.experiments.evaluate import eval_labels_seeds, generate_images, load_models, quality
from csd.experiments.timing import alternate
from csd.models.tokenizer import pixel_tokenizer
from csd.records.cost import StepCosts, csd_passes, prefill_steps, simple_bound, speedup_bound
from csd.sampling import generate
from csd.serving.pairs import image_tokenizer
from csd.shapes.metrics import REFERENCE_SEED, load_classifier, reference_features
from csd.speculative import speculative_generate
from tests.helpers import LinearGaussianChain, ToyARModel, save_tiny_pixel_pair, save_tiny_xar_pair
from visualize.report import write_tables
from visualize.tables import docs_prefix, headline_markdown

COSTS = StepCosts(target_backbone=10.0, target_head=2.0, draft_backbone=1.0, draft_head=0.5)


def passes(tokens: int, steps: int, gamma: int, prefill: float, schedule: tuple[int, ...] = ()) -> tuple[int, int]:
    """csd_passes of ``tokens`` tokens in ``steps`` AR steps at that CSD setting."""
    return csd_passes(
        tokens, SamplingConfig(num_steps=steps), CSDConfig(gamma=gamma, gamma_schedule=schedule, prefill=prefill)
    )


def bound(costs: StepCosts, steps: int, gamma: int, prefill: float = 0.0, schedule=(), per_block=False) -> float:
    """speedup_bound of ``steps`` AR steps of one token each: ``prefill`` * steps of them pre-filled."""
    csd = CSDConfig(gamma=gamma, gamma_schedule=schedule, prefill=prefill)
    return speedup_bound(costs, steps, SamplingConfig(num_steps=steps), csd, per_block)


def test_bound_is_design_formula_without_prefill_when_gamma_divides_steps():
    s, g = 16, 4
    c_p, h_p, c_q, h_q = 10.0, 2.0, 1.0, 0.5
    design = s * (c_p + h_p) / (s * (c_q + h_q) + (s / g) * c_p + s * h_p)  # DESIGN.md section 6
    assert bound(COSTS, s, g) == pytest.approx(design)


def test_bound_counts_prefill_steps_as_target_steps_and_partial_blocks_as_full_passes():
    # 16 steps, 4 pre-filled, gamma 8: 12 draft steps, 4 + ceil(12 / 8) = 6 target passes.
    expected = 16 * 12.0 / (12 * 1.5 + 6 * 10.0 + 16 * 2.0)
    assert bound(COSTS, 16, 8, prefill=0.25) == pytest.approx(expected)


def test_bound_counts_the_blocks_of_a_draft_length_schedule():
    # 16 steps, none pre-filled: blocks of 2, 2 and 4 steps, then 8: 4 target passes (gamma 8 alone: 2).
    expected = 16 * 12.0 / (16 * 1.5 + 4 * 10.0 + 16 * 2.0)
    assert bound(COSTS, 16, 8, schedule=(2, 2, 4)) == pytest.approx(expected)
    assert bound(COSTS, 16, 8, schedule=(2, 2, 4)) < bound(COSTS, 16, 8)
    at = (SamplingConfig(num_steps=16), CSDConfig(gamma=8, gamma_schedule=(2, 2, 4)))
    assert simple_bound(COSTS, *at) == pytest.approx(10 / (1 + 10 / 4))  # a mean draft length of 16 / 4
    assert simple_bound(COSTS, *at) < simple_bound(COSTS, at[0], CSDConfig(gamma=8))


def test_bound_reduces_to_simple_bound_when_heads_are_free():
    free_heads = StepCosts(target_backbone=10.0, target_head=0.0, draft_backbone=1.0, draft_head=0.0)
    simple = simple_bound(free_heads, SamplingConfig(num_steps=32), CSDConfig(gamma=8, prefill=0.0))
    assert bound(free_heads, 32, 8) == pytest.approx(simple) == 10 / (1 + 10 / 8)


def test_gamma_one_with_a_free_draft_gains_nothing():
    free_draft = StepCosts(target_backbone=10.0, target_head=2.0, draft_backbone=0.0, draft_head=0.0)
    assert bound(free_draft, 16, 1) == pytest.approx(1.0)


def test_bound_charges_a_whole_block_chain_once_when_the_head_runs_per_block():
    # xAR: 16 cells, 1 pre-filled, gamma 8 -> 1 + ceil(15 / 8) = 3 target chains of (C_p + H_p) each.
    expected = 16 * 12.0 / (15 * 1.5 + 3 * 12.0)
    one = 1 / 16  # pre-fill one cell
    assert bound(COSTS, 16, 8, one, per_block=True) == pytest.approx(expected)
    assert bound(COSTS, 16, 8, one, per_block=True) > bound(COSTS, 16, 8, one)
    # With a free head both charges agree.
    free = StepCosts(target_backbone=10.0, target_head=0.0, draft_backbone=1.0, draft_head=0.5)
    assert bound(free, 16, 8, one, per_block=True) == pytest.approx(bound(free, 16, 8, one))


def test_bad_costs_name_the_parameter():
    with pytest.raises(ValueError, match="draft_head"):
        StepCosts(1.0, 1.0, 1.0, -1.0)


def sequential_passes(sizes: list[int], gamma: int, prefill: float, acceptance: float) -> tuple[float, float]:
    """Expected (target passes, draft passes) of *sequential* CSD, where tokens pass independently: not a
    sampler of the package (docs/results.md says why), the numbers docs/results.md gives for it.

    DESIGN.md's optional sequential verification checks drafted step j with the drafted steps < j as
    context and ends the block at the first step with a rejected token (that step is committed,
    resampled). A step of k tokens passes whole with probability ``acceptance ** k``. One target pass
    verifies a block (the contexts batched), so the expected passes are the pre-fill steps plus the
    expected number of blocks; the draft drafts every step of every block. No bonus step is drawn
    after a fully accepted block. Exact, by recursion over the step where a block starts.
    """
    if not (isinstance(gamma, int) and gamma >= 1):
        raise ValueError(f"gamma (draft length) must be an int >= 1, got {gamma!r}")
    if not (0.0 <= acceptance <= 1.0):
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    num_steps, p = len(sizes), prefill_steps(sizes, prefill)
    blocks, drafts = [0.0] * (num_steps + 1), [0.0] * (num_steps + 1)  # expected from a block start
    for s in range(num_steps - 1, p - 1, -1):
        end = min(s + gamma, num_steps)
        blocks[s], drafts[s] = 1.0, float(end - s)
        reach = 1.0  # P(steps s..j-1 all passed)
        for j in range(s, end):
            whole = acceptance ** sizes[j]
            stop_here = reach if j == end - 1 else reach * (1.0 - whole)
            blocks[s] += stop_here * blocks[j + 1]
            drafts[s] += stop_here * drafts[j + 1]
            reach *= whole
    return p + blocks[p], drafts[p]


def test_sequential_verification_at_full_acceptance_costs_what_block_verification_costs():
    for gamma in (1, 3, 8):
        assert sequential_passes(step_sizes(64, 32), gamma, 0.05, 1.0) == passes(64, 32, gamma, 0.05)


def test_sequential_verification_at_zero_acceptance_commits_one_step_per_block():
    sizes = step_sizes(64, 32)
    p = prefill_steps(sizes, 0.05)
    target, drafts = sequential_passes(sizes, 8, 0.05, 0.0)
    assert target == 32  # pre-fill plus one pass per remaining step, as target-only
    assert drafts == sum(min(8, 32 - s) for s in range(p, 32))


def test_sequential_pass_counts_match_a_simulation():
    sizes, gamma, acceptance = step_sizes(64, 32), 8, 0.4
    p = prefill_steps(sizes, 0.05)
    g = torch.Generator().manual_seed(0)
    runs, blocks, drafts = 4000, 0, 0
    for _ in range(runs):
        s = p
        while s < len(sizes):
            end = min(s + gamma, len(sizes))
            blocks, drafts = blocks + 1, drafts + end - s
            while s < end:
                passed = bool((torch.rand(sizes[s], generator=g) < acceptance).all())
                s += 1
                if not passed:
                    break
    target, drafted = sequential_passes(sizes, gamma, 0.05, acceptance)
    assert p + blocks / runs == pytest.approx(target, rel=0.02)
    assert drafts / runs == pytest.approx(drafted, rel=0.02)
    assert target > 3 * passes(64, 32, gamma, 0.05)[0]  # why it is not the default at this acceptance


def test_sequential_passes_name_bad_parameters():
    with pytest.raises(ValueError, match="acceptance"):
        sequential_passes([1, 2], 2, 0.0, 1.5)
    with pytest.raises(ValueError, match="gamma"):
        sequential_passes([1, 2], 0, 0.0, 0.5)


def test_the_sequential_pass_counts_docs_results_gives():
    sizes = step_sizes(64, 32)
    target, drafted = sequential_passes(sizes, 8, 0.05, 0.37)  # the default's per-token acceptance
    assert (round(target), round(drafted)) == (27, 159) and passes(64, 32, 8, 0.05) == (8, 28)
    assert round(sequential_passes(sizes, 8, 0.05, 0.7)[0]) == 19


@pytest.mark.parametrize(
    ("gamma", "prefill", "schedule"),
    [(1, 0.0, ()), (2, 0.05, ()), (3, 0.3, ()), (8, 0.0, ()), (3, 0.0, (1, 2)), (2, 0.3, (4,)), (1, 0.0, (5, 5))],
)
def test_pass_counts_match_the_speculative_sampler(gamma, prefill, schedule):
    model = ToyARModel(LinearGaussianChain([0.9, 1.0], [0.0, 0.0], [0.5, 0.05], token_dim=2), seq_len=12)
    csd = CSDConfig(gamma=gamma, gamma_schedule=schedule, prefill=prefill)
    out = speculative_generate(model, model, [0], [0], SamplingConfig(num_steps=7), csd)
    assert passes(12, 7, gamma, prefill, schedule) == (out.trace.target_passes, out.trace.draft_passes)


def test_pass_counts_of_a_draft_length_schedule():
    # 32 steps over 64 tokens: 5% pre-fill is 4 steps; blocks of 2, 2, 4, 4 steps, then 8 + 8.
    assert passes(64, 32, 8, 0.05, (2, 2, 4, 4)) == (4 + 6, 28)
    assert passes(64, 32, 8, 0.05, (20, 20, 20)) == (4 + 2, 28)  # the schedule outlasts the steps
    assert passes(64, 32, 4, 0.05, (4, 4)) == passes(64, 32, 4, 0.05)


def test_bench_refuses_a_draft_length_schedule():
    with pytest.raises(ValueError, match="gamma_schedule"):
        main(["--quick", "--gamma-schedule", "2", "4", "--n", "4"])


def test_compare_settings_parse_over_the_base_setting_and_name_bad_keys():
    base, what = CSDConfig.from_knobs(gamma=8, tau_v=42.0), "--compare setting"
    got = parse_setting("gamma=4,tau_v=5,gamma_schedule=2:2,align=false,criterion=exact,max_tries=7", base, what)
    assert got == CSDConfig.from_knobs(
        gamma=4, tau_v=5.0, gamma_schedule=(2, 2), align=False, criterion="exact", max_tries=7
    )
    assert parse_setting("", base, what) == base
    with pytest.raises(ValueError, match=r"--compare setting 'gama=4': expected key=value with a key in \["):
        parse_setting("gama=4", base, what)
    with pytest.raises(ValueError, match=r"--compare setting 'gamma=1.5' must be an integer, got '1.5'"):
        parse_setting("gamma=1.5", base, what)
    with pytest.raises(ValueError, match=r"gamma \(draft length\) must be an int >= 1, got 0"):
        parse_setting("gamma=0", base, what)


def test_compare_times_every_setting_beside_target_only(random_models, one_thread):
    settings = {"g2": CSDConfig(gamma=2), "sched": CSDConfig(gamma=4, gamma_schedule=(1, 2))}
    sampling = SamplingConfig(num_steps=8)
    rows = compare_settings(random_models.target, random_models.draft, sampling, settings, batch=2, repeats=1)
    assert [r["setting"] for r in rows] == ["g2", "sched"]
    for row, csd in zip(rows, settings.values(), strict=True):
        spec = speculative_generate(random_models.target, random_models.draft, [0, 1], [0, 1], sampling, csd)
        assert row["target_passes"] == spec.trace.target_passes
        assert 0 < row["min"] <= row["max"]


def test_prefill_steps_run_until_the_fraction_of_tokens_exists():
    assert prefill_steps([1, 1, 1, 2, 3], 0.0) == 0
    assert prefill_steps([1, 1, 1, 2, 3], 0.3) == 3  # 2 tokens < 2.4 <= 3 tokens
    assert prefill_steps([1, 1, 1, 2, 3], 0.99) == 5


def test_alternate_warms_up_then_interleaves_in_alternating_order():
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or name) for name in ("a", "b", "c")}
    samples = alternate(runs, repeats=3, warmup=1)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] + ["c", "b", "a"] + ["a", "b", "c"]
    assert all(len(s.seconds) == 3 and s.outputs == [name] * 3 for name, s in samples.items())
    assert all(t >= 0 for s in samples.values() for t in s.seconds)


HEADLINE_KEYS = (
    "speedup",
    "speedup_bound",
    "acceptance_aligned",
    "acceptance_unaligned",
    "distance_aligned",
    "distance_unaligned",
    "fd_target",
    "fd_csd",
    "fd_csd_vs_target",
    "accuracy_target",
    "accuracy_csd",
)


def test_quick_bench_writes_every_key_and_a_table(tmp_path, restore_threads):
    target, draft = save_tiny_pixel_pair(tmp_path)
    # One thread: tiny ops on a busy machine are far slower with two spinning OpenMP threads.
    args = ["--quick", "--target", target, "--draft", draft, "--out", str(tmp_path / "out"), "--threads", "1"]
    args += ["--n", "16", "--n-ref", "40", "--repeats", "1", "--batches", "1", "2", "--num-steps", "6"]
    main(args)
    result = json.loads((tmp_path / "out" / "bench.json").read_text())
    for key in HEADLINE_KEYS:
        assert isinstance(result[key], float), key
    assert result["fd_target"] > 0 and not math.isnan(result["distance_unaligned"])
    # Quick grid gamma {4, 8} plus the default gamma, for batches 1 and 2.
    assert {(r["batch"], r["gamma"]) for r in result["rows"]} == {(b, g) for b in (1, 2) for g in (4, 8)}
    assert result["cost"]["batch"] == 2  # the grid's batch closest to the default 8
    assert sum(result["cost"]["fractions_of_csd_time"].values()) == pytest.approx(1.0)
    assert not (tmp_path / "out" / "bench.md").exists()  # the measurement writes JSON; the report its tables
    table = write_tables(tmp_path / "out" / "bench.json").read_text()
    assert "| batch | gamma |" in table and "draft only" in table


def test_quick_bench_on_an_xar_pair_cuts_flow_steps_and_scores_cells_and_tokens(tmp_path, restore_threads):
    """xAR (one AR step per cell): the cheap baseline keeps the AR steps and cuts the flow steps, the bound
    charges a block's chain once, acceptance is reported per cell and per token, the images are decoded
    from cells, and the docs blocks are xAR's own."""
    target_path, draft_path = save_tiny_xar_pair(tmp_path)
    out = tmp_path / "out"
    args = ["--quick", "--target", target_path, "--draft", draft_path, "--out", str(out), "--threads", "1"]
    args += ["--n", "4", "--n-ref", "20", "--repeats", "1", "--batches", "2", "--gammas", "4"]
    with pytest.raises(ValueError, match="AR steps"):
        main(args)  # the default 32 AR steps: xAR needs one per cell
    result = main(args + ["--num-steps", "16", "--cfg-schedule", "linear", "--gamma", "4", "--head-steps", "8"])
    row = result["rows"][0]
    assert result["settings"]["family"] == "xAR" and row["num_steps"] == 16
    target_passes = passes(16, 16, 4, 0.05)[0]
    assert row["target_passes"] == target_passes == 1 + 4 and row["fewer_steps"] == 16
    assert row["fewer_head_steps"] == round(8 * target_passes / 16)
    for key in ("acceptance_token_aligned", "acceptance_token_unaligned", "acceptance_aligned"):
        assert 0.0 <= result[key] <= 1.0, key
    assert "acceptance per token" in write_tables(out / "bench.json").read_text()
    assert "| target, 2 flow steps |" in headline_markdown(result)
    assert docs_prefix(result) == "xar-"

    target, draft = load_models(target_path, draft_path, torch.device("cpu"))
    sampling = SamplingConfig.from_knobs(**result["settings"]["sampling"])
    labels, seeds = eval_labels_seeds(4, 0, target.traits)
    images, _ = generate_images("target", target, draft, labels, seeds, sampling, CSDConfig(), 4)
    tokens = generate(target, labels, seeds, sampling).tokens
    assert torch.equal(images, image_tokenizer(target).decode(tokens))
    assert not torch.equal(images, pixel_tokenizer(target.token_dim).decode(tokens))


def test_quality_by_gamma_scores_images_made_with_that_gamma(tmp_path, restore_threads):
    """Each row of the quality-vs-gamma table is the score of CSD images with that draft length: the
    default gamma's row is the headline CSD result, another gamma's row equals a fresh generation."""
    target_path, draft_path = save_tiny_pixel_pair(tmp_path, seed=3)
    out = tmp_path / "out"
    args = ["--quick", "--target", target_path, "--draft", draft_path, "--out", str(out), "--threads", "1"]
    args += ["--n", "12", "--n-ref", "30", "--repeats", "1", "--batches", "2", "--gammas", "2", "--num-steps", "6"]
    result = main(args + ["--gamma", "2", "--quality-gammas", "1", "2", "3"])
    rows = {r["gamma"]: r for r in result["quality_by_gamma"]}
    assert sorted(rows) == [1, 2, 3]
    assert (rows[2]["fd"], rows[2]["accuracy"]) == (result["fd_csd"], result["accuracy_csd"])
    assert rows[2]["speedup"] == result["speedup"] and math.isnan(rows[1]["speedup"])  # only gamma 2 was timed
    assert [rows[g]["target_passes"] for g in (1, 2, 3)] == [passes(64, 6, g, 0.05)[0] for g in (1, 2, 3)]

    target, draft = load_models(target_path, draft_path, torch.device("cpu"))
    sampling = SamplingConfig.from_knobs(**result["settings"]["sampling"])
    csd = CSDConfig.from_knobs(**{**result["settings"]["csd"], "gamma": 3})
    labels, seeds = eval_labels_seeds(12, 0, target.traits)
    images, _ = generate_images("csd", target, draft, labels, seeds, sampling, csd, defaults.BATCH_SIZE)
    classifier = load_classifier()  # the bench's default
    scores, _ = quality(images, labels, reference_features(30, REFERENCE_SEED, classifier), classifier)
    assert rows[3]["fd"] == pytest.approx(scores["fd"]) and rows[3]["accuracy"] == scores["accuracy"]
    assert rows[1]["fd"] != rows[3]["fd"]
    table = write_tables(out / "bench.json").read_text()
    assert "CSD against draft length" in table and "| 3 | " in table


def test_quality_gammas_must_be_positive_ints():
    with pytest.raises(ValueError, match="quality_gammas"):
        BenchConfig(quality_gammas=(0,))
    assert BenchConfig(quality_gammas=()).quality_gammas == ()


@pytest.mark.slow
def test_quick_bench_command_runs_on_the_shipped_pair(tmp_path):
    """The README's command on the embedded models, as a user runs it (20 images, one repeat, one batch of 4)."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "csd.experiments.bench", "--quick", "--n", "20", "--n-ref", "200", "--repeats", "1"]
    cmd += ["--batches", "4", "--gammas", "8", "--quality-gammas", "2", "--threads", "1", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    for key in HEADLINE_KEYS:
        assert math.isfinite(result[key]), key
    assert result["settings"]["models"]["target"].endswith("shapes_target.safetensors")
    assert [(r["batch"], r["gamma"]) for r in result["rows"]] == [(4, 8)]
    assert [q["gamma"] for q in result["quality_by_gamma"]] == [2, 8]
    # Seeded, so these are fixed numbers of the shipped weights; the margins between them are wide. Measured here
    # at n 20: FD 28.3 against 47.9, accuracy 0.80, distances 0.875 against 1.126; at n 40, under oneDNN off and
    # the AVX2 and default capabilities (tests/kernels.py), FD 19.92 against 32.34-32.37, accuracy 0.85,
    # distances 0.921 against 1.205, each moving by at most 0.04.
    assert result["fd_target"] < result["fd_fewer"] and result["accuracy_target"] > 0.2
    assert result["distance_aligned"] < result["distance_unaligned"]
    assert write_tables(out / "bench.json").read_text().startswith("# CSD benchmark")
