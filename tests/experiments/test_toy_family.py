"""The fourth family (tests/families/toy.py), registered by its row and its catalog entry alone, runs through
every tool: the two samplers, evaluate, bench --quick, paper_scale --tiny and the app's pair list. Nothing
outside its module names it; it is in the table only while these tests run."""

from __future__ import annotations

import pytest
import torch

from csd import CSDConfig, SamplingConfig, generate, speculative_generate
from csd.core.schedule import step_sizes
from csd.experiments import bench, evaluate
from csd.experiments.paper_scale import command as paper_scale
from csd.models.registry import FAMILIES, save_model
from csd.records.cost import csd_passes, prefill_steps
from csd.serving.catalog import CATALOG, report_records
from csd.serving.pairs import PairStore, discover, random_pair
from tests.families import registered
from tests.families.toy import ENTRY, FAMILY
from tests.helpers import assert_same64, sampling64
from visualize.tables import headline_markdown

pytestmark = pytest.mark.usefixtures("one_thread")
SAMPLING64 = sampling64(num_steps=16, cfg_scale=2.0, head_steps=4)  # one AR step per token


@pytest.fixture(scope="module")
def toy():
    """The toy family's row in the table, and its untrained pair."""
    with registered(FAMILY, ENTRY):
        yield random_pair(family="toy")


@pytest.fixture(scope="module")
def toy_files(toy, tmp_path_factory):
    """The untrained pair as project files named as the row's embedded pair: toy_target / toy_draft."""
    folder = tmp_path_factory.mktemp("toy")
    return folder, *(str(save_model(m, folder / n)) for m, n in ((toy.target, "toy_target"), (toy.draft, "toy_draft")))


def test_it_is_registered_only_while_its_tests_run(toy):
    assert FAMILIES["toy"] is FAMILY and CATALOG["toy"] is ENTRY and toy.target.traits.family == "Toy"
    assert toy.weights == "random-toy:0"  # the untrained pair's tag, from its pair's name


@pytest.mark.kernels
def test_both_samplers_run_it_with_the_passes_the_cost_model_counts(toy):
    """In float64, the exact reference (tests/helpers.py): the same seeds again give the same run."""
    labels, seeds, toy64, sampling = [1, 2], [3, 4], toy.at_precision("float64"), SAMPLING64
    plain = generate(toy64.target, labels, seeds, sampling)
    assert plain.tokens.shape == (2, 16, 192) and plain.trace.target_passes == 16
    csd = CSDConfig(gamma=4)
    run = speculative_generate(toy64.target, toy64.draft, labels, seeds, sampling, csd)
    passes, drafts = csd_passes(16, sampling, csd)
    assert (run.trace.target_passes, run.trace.draft_passes) == (passes, drafts)
    again = speculative_generate(toy64.target, toy64.draft, labels, seeds, sampling, csd)
    assert_same64(again.tokens, run.tokens, "the same seeds again")
    assert (again.trace.maker == run.trace.maker).all()
    assert 0.0 <= run.trace.acceptance_rate <= 1.0


def test_evaluate_scores_its_images(toy_files, tmp_path, restore_threads):
    _, target, draft = toy_files
    args = ["--target", target, "--draft", draft, "--mode", "csd", "--n", "4", "--batch-size", "2", "--n-ref", "20"]
    result = evaluate.main([*args, "--num-steps", "16", "--head-steps", "4", "--gamma", "4", "--threads", "1"])
    prefilled = prefill_steps(step_sizes(16, 16), 0.05)
    assert result["drafted_tokens"] == 4 * (16 - prefilled)  # every token after the pre-fill was drafted
    assert 0.0 <= result["accuracy"] <= 1.0 and result["fd"] > 0
    assert result["settings"]["sampling"]["num_steps"] == 16


def test_bench_quick_cuts_its_head_steps_for_the_cheap_baseline(toy_files, tmp_path, restore_threads):
    """Its AR steps are fixed (one per token), so the cheap baseline keeps them and cuts the head's steps,
    as the family's traits say (FamilyTraits.cheap_knob); the report names them from its record, which the
    caller passes while the family is registered (the committed records, docs/families.json, hold only the
    registered families)."""
    _, target, draft = toy_files
    args = ["--quick", "--target", target, "--draft", draft, "--out", str(tmp_path), "--threads", "1"]
    args += ["--n", "4", "--n-ref", "20", "--repeats", "1", "--batches", "2", "--gammas", "4"]
    result = bench.main([*args, "--num-steps", "16", "--head-steps", "4", "--gamma", "4"])
    row = result["rows"][0]
    passes = csd_passes(16, SamplingConfig(num_steps=16), CSDConfig(gamma=4))[0]
    assert result["settings"]["family"] == "Toy" and row["fewer_steps"] == 16
    assert row["fewer_head_steps"] == max(2, round(4 * passes / 16))
    assert f"| target, {row['fewer_head_steps']} head steps |" in headline_markdown(result, report_records())


def test_paper_scale_tiny_times_its_paper_pair(toy, tmp_path, restore_threads):
    argv = ["--tiny", "--families", "toy", "--threads", "1", "--repeats", "1", "--out", str(tmp_path)]
    result = paper_scale.main(argv)
    (pair,) = result["pairs"]
    assert pair["pair"] == "Toy-L / Toy-B" and pair["weights"] == "random (seed 0)"
    assert {(r["batch"], r["gamma"]) for r in pair["rows"]} == {(b, g) for b in (1, 2) for g in (2, 4)}
    assert all(r["num_steps"] == 16 and r["speedup"] > 0 for r in pair["rows"])
    assert "## Toy-L / Toy-B (random (seed 0))" in (tmp_path / "paper_scale_tiny.md").read_text()


def test_the_app_lists_its_embedded_pair_and_generates_with_it(toy_files):
    # The app's modules are imported here, not at the top: the module's kernels test is rerun under four
    # kernel choices (tests/repository/test_perturbations.py), and none of those reruns then imports Gradio (2 s).
    from demo.application import App
    from demo.limits import Limits
    from demo.tabs.generate import compare

    folder, *_ = toy_files
    sources = discover(None, embedded_dir=folder)
    assert [s.name for s in sources] == ["toy (embedded)"] and sources[0].traits.fixed_num_steps == 16
    app = App(PairStore(sources, torch.device("cpu")), Limits(max_batch=2))
    values = {**app.default_controls(), "batch_size": 1, "ar_steps": 16, "cfg_schedule": "linear"}
    done = list(compare(app, lambda *a, **k: None, **values))[-1]  # the last event: the Comparison
    assert done.pair_name == "toy (embedded)" and done.summary["target_passes"]["target-only"] == 16
    csd = CSDConfig(gamma=values["gamma"], prefill=values["prefill"])
    assert done.summary["target_passes"]["CSD"] == csd_passes(16, SamplingConfig(num_steps=16), csd)[0]
