"""The paper-scale benchmark (csd.experiments.paper_scale): its tiny path end to end on the CPU, the dry run's
plan and estimate, argument checks, and the official sizes it builds."""

import contextlib
import io
import json
import math
import re
import time

import pytest
import torch

from csd import SamplingConfig
from csd.experiments.paper_scale import build, command, run
from csd.experiments.paper_scale import measure as timing
from csd.experiments.paper_scale import plan as grid
from csd.experiments.paper_scale import projection as estimate
from csd.models.registry import FAMILIES
from csd.records.cost import StepCosts

FAMILY_PAIRS = {"mar": {"MAR-H / MAR-B", "MAR-L / MAR-B"}, "xar": {"xAR-H / xAR-B", "xAR-L / xAR-B"}}
FAMILY_PAIRS["harmon"] = {"Harmon-1.5B / Harmon-0.5B"}
ROW_KEYS = {"batch", "gamma", "target_passes", "speedup", "speedup_min", "speedup_max", "speedup_bound"}
ROW_KEYS |= {"time_split", "acceptance", "peak_memory", "per_step_ms", "estimate", "target_s", "csd_s"}


@pytest.fixture
def keep_threads():
    """The command sets the torch thread count (--threads): give the next test back its own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run of every family (batches 1 and 2, gammas 2 and 4), as the command line gives it."""
    pytest.importorskip("transformers")  # Harmon's LLM
    out = tmp_path_factory.mktemp("paper_scale")
    threads, stdout = torch.get_num_threads(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            result = command.main(["--tiny", "--threads", "1", "--repeats", "2", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    (out / "stdout.txt").write_text(stdout.getvalue())
    return result, out


def rows(result: dict):
    return [(pair, r) for pair in result["pairs"] for r in pair["rows"]]


def test_the_tiny_run_writes_json_and_markdown_for_every_family_and_says_the_weights_are_random(tiny_run):
    result, out = tiny_run
    saved = json.loads((out / "paper_scale_tiny.json").read_text())
    markdown = (out / "paper_scale_tiny.md").read_text()
    stdout = (out / "stdout.txt").read_text()
    assert saved["random_weights"] is True and "RANDOM WEIGHTS" in saved["weights_note"]
    assert markdown.startswith("# CSD at paper scale") and "**RANDOM WEIGHTS" in markdown
    assert "Weights: seeded random" in stdout and "**RANDOM WEIGHTS" in stdout  # the plan, then the tables
    assert "Quality is not measured" in markdown
    for family, names in FAMILY_PAIRS.items():
        pairs = [p for p in saved["pairs"] if p["family"] == family]
        assert {p["pair"] for p in pairs} == names
        for pair in pairs:
            assert pair["weights"] == "random (seed 0)" and f"## {pair['pair']} (random (seed 0))" in markdown
            assert {(r["batch"], r["gamma"]) for r in pair["rows"]} == (
                {(b, g) for b in (1, 2) for g in (2, 3)}
                if family == "xar"
                else {(b, g) for b in (1, 2) for g in (2, 4)}
            )
            assert all(ROW_KEYS <= set(r) for r in pair["rows"])
    assert saved["settings"]["tiny"] is True and saved["settings"]["device"] == "cpu"


def test_speedups_are_positive_and_finite_and_inside_their_per_round_spread(tiny_run):
    for _, r in rows(tiny_run[0]):
        assert math.isfinite(r["speedup"]) and r["speedup"] > 0
        assert r["speedup_min"] <= r["speedup"] * (1 + 1e-9) and r["speedup"] <= r["speedup_max"] * (1 + 1e-9)
        assert r["target_s"] > 0 and r["csd_s"] > 0


def bound_of(costs: StepCosts, row: dict, per_block: bool) -> float:
    """csd.records.cost.speedup_bound's formula on a row's steps and passes: S (C_p + H_p) over the drafted steps'
    (C_q + H_q) and the target passes' C_p (+ H_p per pass, or S H_p)."""
    c_p, h_p, c_q, h_q = costs.target_backbone, costs.target_head, costs.draft_backbone, costs.draft_head
    s, passes = row["num_steps"], row["target_passes"]
    verify = passes * (c_p + h_p) if per_block else passes * c_p + s * h_p
    return s * (c_p + h_p) / (row["draft_passes"] * (c_q + h_q) + verify)


def test_the_bound_is_the_cost_model_on_the_runs_own_per_pass_costs(tiny_run):
    for pair, r in rows(tiny_run[0]):
        costs = StepCosts(**{k: v / 1e3 for k, v in r["per_step_ms"].items()})
        per_block = pair["family"] == "xar"  # xAR's flow chain is the backbone: charged once per block
        assert r["speedup_bound"] == pytest.approx(bound_of(costs, r, per_block), rel=1e-9)
        assert r["speedup_bound"] != pytest.approx(bound_of(costs, r, not per_block), rel=1e-6)  # the head charge


def test_the_time_split_and_acceptance_come_from_the_traces(tiny_run):
    for _, r in rows(tiny_run[0]):
        split = r["time_split"]
        assert sum(split.values()) == pytest.approx(1.0)
        assert all(0.0 <= split[k] <= 1.0 for k in ("backbones", "heads", "acceptance", "resampling"))
        assert split["backbones"] + split["heads"] > 0.5  # the passes are most of the time
        assert 0.0 <= r["acceptance"] <= 1.0
        assert r["peak_memory"]["kind"].startswith("process peak RSS") and r["peak_memory"]["target"] > 0


def test_xar_rows_draft_at_most_the_cells_left_after_the_prefilled_one(tiny_run):
    for pair, r in rows(tiny_run[0]):
        if pair["family"] == "xar":
            assert r["num_steps"] == 4 and r["prefill_steps"] == 1 and r["gamma"] <= 3
            assert r["target_passes"] == 1 + math.ceil(3 / r["gamma"])


def test_runs_are_autocast_where_the_library_does_not_apply_the_precision_itself():
    cpu, bf16, fp32 = torch.device("cpu"), SamplingConfig(num_steps=4, precision="bfloat16"), SamplingConfig()
    for sampling, heads, expected in [
        (bf16, "float32", False),  # every family runs its backbone at SamplingConfig.precision itself
        (fp32, "float32", False),  # and keeps its heads float32
        (fp32, "bfloat16", True),  # --heads bfloat16: the whole sampler, as the published code
    ]:
        with timing.autocast_for(sampling, cpu, heads):
            assert torch.is_autocast_enabled("cpu") is expected, (sampling.precision, heads)


def test_an_xar_draft_runs_on_its_targets_flow_steps():
    pair = next(p for p in grid.paper_pairs() if p.family == "xar" and p.key == "H/B")
    loaded = build.load_pair(pair, torch.device("cpu"), 0, True, None)
    assert grid.model_config("xar", pair.draft, True).flow_steps != loaded.target.config.flow_steps  # would differ
    assert loaded.draft.config.flow_steps == loaded.target.config.flow_steps


def test_random_weights_are_seeded_and_no_parameter_is_left_all_zero():
    a, b = (build.random_model("mar", "mar_base", 3, True) for _ in range(2))
    c = build.random_model("mar", "mar_base", 4, True)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        assert pa.any(), name  # zero-initialised layers (the head's output) are redrawn
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))


def test_conditions_and_seeds_are_deterministic():
    model = build.random_model("mar", "mar_base", 0, True)
    first, again, other = (build.conditions_for(model, 8, s, 0) for s in (5, 5, 6))
    assert first == again and first != other
    assert first[1] == list(range(5, 13)) and all(0 <= label < 1000 for label in first[0])


def test_pairs_use_official_checkpoints_where_all_their_files_exist(tmp_path, monkeypatch):
    pair = next(p for p in grid.paper_pairs() if p.paper_name == "MAR-H / MAR-B")
    files = [tmp_path / f for c in (pair.target, pair.draft) for f in FAMILIES["mar"].official_files[c]]
    assert files == [tmp_path / "mar" / c / "checkpoint-last.pth" for c in ("mar_huge", "mar_base")]
    tiny = lambda *_: (build.random_model("mar", "mar_huge", 0, True), build.random_model("mar", "mar_base", 1, True))
    monkeypatch.setattr(build, "official_pair", tiny)
    files[0].parent.mkdir(parents=True)
    files[0].touch()  # the draft's file is missing: random weights, said so
    assert build.load_pair(pair, torch.device("cpu"), 0, True, tmp_path).weights == "random (seed 0)"
    files[1].parent.mkdir(parents=True)
    files[1].touch()
    assert build.load_pair(pair, torch.device("cpu"), 0, True, tmp_path).weights == "official"


def test_a_pair_that_cannot_be_built_is_skipped_by_name_with_the_reason(tmp_path, monkeypatch, keep_threads):
    def fail(family, *args, **kwargs):
        raise ImportError("no module named 'transformers'")

    monkeypatch.setattr(build, "random_model", fail)
    result = command.main(["--tiny", "--families", "harmon", "--threads", "1", "--out", str(tmp_path)])
    (pair,) = result["pairs"]
    assert pair["pair"] == "Harmon-1.5B / Harmon-0.5B" and "transformers" in pair["skipped"]
    assert "Skipped: ImportError: no module named 'transformers'" in (tmp_path / "paper_scale_tiny.md").read_text()


def test_cells_that_do_not_fit_the_budget_are_skipped_and_named(tmp_path, keep_threads):
    argv = ["--tiny", "--families", "mar", "--pairs", "L/B", "--threads", "1", "--budget-s", "1e-6"]
    result = command.main([*argv, "--out", str(tmp_path)])
    (pair,) = result["pairs"]
    assert [r["batch"] for r in pair["rows"]] == [1, 2]
    assert all("--budget-s" in r["skipped"] for r in pair["rows"])


def test_the_budget_guard_scales_the_estimate_by_what_the_cells_so_far_took():
    ctx = run.RunContext(grid.GridConfig(tiny=True), torch.device("cpu"), None, {}, None)
    assert ctx.predicted_s(10.0) == 10.0  # nothing timed yet: the estimate
    ctx.done.extend([(3.0, 1.0), (5.0, 3.0)])
    assert ctx.predicted_s(10.0) == pytest.approx(20.0)  # 8 s measured for 4 s estimated


def test_the_dry_run_prints_every_cell_and_an_estimate_without_building_a_model(capsys, monkeypatch):
    built = lambda *a, **k: pytest.fail("the dry run built a model")
    monkeypatch.setattr(build, "random_model", built)
    monkeypatch.setattr(run, "load_pair", built)
    t0 = time.perf_counter()
    result = command.main(["--dry-run", "--families", "mar", "xar", "--estimate-device", "h200", "--budget-s", "60"])
    assert time.perf_counter() - t0 < 20
    out = capsys.readouterr().out
    assert len(result["plan"]) == 4 * 4  # 4 pairs x batches 1, 8, 64, 256
    for cell in result["plan"]:
        assert f"| {cell['pair']} | {cell['batch']} |" in out
        assert cell["gammas"] == ([3] if cell["pair"].startswith("xAR") else [8, 16, 32])
    mar_h = next(c for c in result["plan"] if c["pair"] == "MAR-H / MAR-B")
    assert (mar_h["num_steps"], mar_h["head_steps"], mar_h["cfg_scale"], mar_h["precision"]) == (
        64,
        100,
        3.2,
        "bfloat16",
    )
    xar_h = next(c for c in result["plan"] if c["pair"] == "xAR-H / xAR-B")
    assert (xar_h["num_steps"], xar_h["head_steps"], xar_h["cfg_scale"]) == (4, 50, 2.2)
    est = result["estimate"]
    assert "H200" in out and "rough estimate" in out and "Estimated total" in out
    assert est["total_s"] > 60 and "WARNING: the estimate" in out and "--budget-s 60" in out
    assert all(r["cell_s"] > 0 and all(v > 0 for v in r["speedups"].values()) for r in est["rows"])


def test_the_estimate_is_the_largest_of_compute_weight_reads_and_kernel_launches():
    rates = estimate.Rates(estimate.PROFILES["h200"], backbone_bf16=True)
    p = estimate.PROFILES["h200"]
    assert rates.seconds(1e9, 10, 10) == pytest.approx(10 * p.kernel_s)  # launch-bound
    assert rates.seconds(4e15, 10, 10) == pytest.approx(4e15 / p.bf16_flops)  # compute-bound
    assert rates.seconds(1e3, 10**10, 10) == pytest.approx(8 * 10**10 / p.bandwidth)  # autocast weight reads
    assert rates.seconds(4e15, 10, 10, head=True) == pytest.approx(4e15 / p.fp32_flops)  # float32 heads
    cells = grid.plan_cells(grid.GridConfig(families=("mar",), pairs=("H/B",), gammas=(32,)), "bfloat16")
    prefill, times = grid.GridConfig().prefill, []
    costs = [estimate.model_cost("mar", c, False, 0) for c in ("mar_huge", "mar_base")]
    for cell in cells:
        times.append(estimate.estimate_generations(*costs, cell, prefill, rates))
    target = [t["target"] for t in times]
    assert target == sorted(target) and target[-1] > 4 * target[0]  # batch 256 is compute-bound, batch 1 not
    assert all(t["csd/32"] < t["target"] for t in times[:1])  # at batch 1 CSD saves launches


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batches", "0"], r"--batches \(batch sizes\) must be one or more ints in \[1, 4096\], got \(0,\)"),
        (["--gammas", "2", "-1"], r"--gammas \(draft lengths\) must be one or more ints in \[1, 1024\]"),
        (["--families", "mar", "dit"], r"--families must be one or more of mar, xar, harmon"),
        (["--pairs", "H/L"], r"--pairs must be one or more of H/B, L/B"),
        (["--repeats", "0"], r"--repeats must be an int in \[1, 100\], got 0"),
        (["--warmup", "11"], r"--warmup must be an int in \[0, 10\], got 11"),
        (["--prefill", "1.0"], r"--prefill \(ratio\) must be in \[0, 1\), got 1.0"),
        (["--budget-s", "-5"], r"--budget-s \(seconds\) must be in \(0, 1e\+09\]"),
        (["--threads", "0"], r"--threads must be an int in \[1, 1024\]"),
        (["--tiny", "--checkpoints", "somewhere"], r"--tiny builds shrunken random models"),
        (["--heads", "fp8"], r"argument --heads: invalid choice: 'fp8'"),
    ],
)
def test_bad_arguments_name_the_parameter_and_its_valid_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command.main([*argv, "--dry-run"])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        command.main(["--device", "cuda", "--dry-run"])
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize(
    "family,name,count,published",
    [
        ("mar", "mar_base", 207_924_768, 208e6),
        ("mar", "mar_large", 478_326_304, 479e6),
        ("mar", "mar_huge", 942_403_104, 943e6),
        ("xar", "xar_base", None, 172.6e6),
        ("xar", "xar_large", None, 608.4e6),
        ("xar", "xar_huge", None, 1186.0e6),
    ],
)
def test_the_official_configurations_have_the_published_parameter_counts(family, name, count, published):
    # Counted on the meta device. MAR: the exact counts of the official classes (tests/models/test_official.py), within
    # 0.2% of the README's 208M / 479M / 943M; xAR: its README's 172.6M / 608.4M / 1186.0M to 0.1M.
    n = build.parameter_count(family, name)
    if count is not None:
        assert n == count and abs(n - published) / published < 2e-3
    else:
        assert round(n / 1e6, 1) == published / 1e6


def test_the_tiny_configs_are_the_official_ones_shrunk():
    assert build.parameter_count("mar", "mar_huge", tiny=True) < 1e6 < build.parameter_count("mar", "mar_base")
    tiny, full = grid.model_config("mar", "mar_huge", True), grid.model_config("mar", "mar_huge", False)
    assert (tiny.class_num, tiny.token_dim, tiny.num_sampling_steps) == (full.class_num, full.token_dim, 100)
