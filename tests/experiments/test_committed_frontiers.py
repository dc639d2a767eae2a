"""The committed frontiers (bench/results/**/frontier_b<batch>.json): four families in two regimes, on
the shipped weights, dense where CSD is, the verdict recomputed from their rows, and the README's
verdict table theirs."""

from pathlib import Path

import pytest

from csd.models.checkpoint import file_digest
from csd.records.verdict import SLACK, verdict
from visualize.report import committed_frontiers
from visualize.tables import verdict_table

ROOT = Path(__file__).resolve().parents[2]
M = ROOT / "assets" / "models"
PAIRS = {  # family -> shipped weights
    "MAR": (M / "shapes_target.safetensors", M / "shapes_draft.safetensors"),
    "Harmon": (M / "shapes_text_target.safetensors", M / "shapes_text_draft.safetensors"),
    "xAR": (M / "shapes_xar_target.safetensors", M / "shapes_xar_draft.safetensors"),
    "NextStep": (M / "shapes_causal_target.safetensors", M / "shapes_causal_draft.safetensors"),
}
RESULTS = committed_frontiers(ROOT)


def test_every_family_has_a_frontier_in_both_regimes_on_its_shipped_weights():
    assert sorted((r["family"], r["batch"]) for r in RESULTS) == sorted((f, b) for f in PAIRS for b in (1, 8))
    for r in RESULTS:
        assert r["weights"] == file_digest(*PAIRS[r["family"]]), r["family"]
        assert r["settings"]["batches"] == [1, 8] and r["n"] >= 100


# Gaps the dense grid leaves (none since issue 43: xAR's 25-setting grid left CSD with 12 flow steps at
# batch 1 faster than the target's fewest flow steps, 6; the ODE samplers at 3 to 5 steps fill it).
KNOWN_GAPS: set[tuple[str, int, str]] = set()


def test_every_csd_setting_on_a_front_has_an_alternative_within_the_slack_of_its_time():
    gaps = set()
    for result in RESULTS:
        rows = result["rows"]
        for r in rows:
            if r["method"] == "CSD" and (r["front_fd"] or r["front_accuracy"]):
                if not [a for a in rows if a["method"] != "CSD" and abs(a["time"] - r["time"]) <= SLACK]:
                    gaps.add((result["family"], result["batch"], r["name"]))
    assert gaps == KNOWN_GAPS


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: f"{r['family']}-b{r['batch']}")
def test_the_stored_verdict_is_the_rule_applied_to_the_rows(result):
    assert result["verdict"] == verdict(result["rows"])
    assert all(r["predicted"] > 0 for r in result["rows"])  # the cost model's time on every row
    methods = {r["method"] for r in result["rows"]}
    assert {"CSD", "target, DiSA", "target, cheaper head"} <= methods
    assert ("target, LazyMAR condition cache" in methods) == (result["family"] not in ("xAR", "NextStep"))


# Issue 43's alternatives, named on every frontier of the family that takes them: the target's few-step
# samplers, DiSA at its floor, GtR (masked families); CSD composed with the ones it composes with.
NEW_ALTERNATIVES = {
    "MAR": (
        "target, DDIM eta 0 head 5 steps",
        "target, DDIM eta 0.5 head 5 steps",
        "target, DiSA floor",
        "target, GtR 12/3/1 AR steps",
        "CSD, gamma 4, tau_v 5, DDIM eta 0.5",
        "CSD, gamma 8, draft DDIM eta 0",
        "CSD, gamma 4, tau_v 5, GtR",
    ),
    "xAR": (
        "target, Euler ODE flow 3 steps, official grid",
        "target, Heun ODE flow 3 steps, uniform grid",
        "target, flow 6 steps, uniform grid",
        "CSD, gamma 4, tau_v 5, flow 8, uniform grid",
        "CSD, gamma 8, draft Euler ODE",
    ),
}
NEW_ALTERNATIVES["Harmon"] = NEW_ALTERNATIVES["MAR"]
# The causal pair's grid is the reduced one (--quick: 25 settings): the flow ODE at 4 and 8 steps on both grids,
# the official sampler on the uniform grid, CSD on it and with an Euler-ODE draft, the exact block.
NEW_ALTERNATIVES["NextStep"] = (
    "target, Euler ODE flow 4 steps, official grid",
    "target, Heun ODE flow 4 steps, uniform grid",
    "target, flow 4 steps, uniform grid",
    "CSD, gamma 4, tau_v 5, flow 8, uniform grid",
    "CSD, gamma 8, draft Euler ODE",
    "CSD, gamma 4, exact block",
)


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: f"{r['family']}-b{r['batch']}")
def test_every_frontier_names_its_familys_strongest_alternatives_and_csd_on_them(result):
    names = [r["name"] for r in result["rows"]]
    missing = [a for a in NEW_ALTERNATIVES[result["family"]] if not any(n.startswith(a) for n in names)]
    assert not missing, f"{result['family']} b{result['batch']}: {missing}"


def test_the_readme_verdict_table_is_that_of_the_committed_frontiers():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("<!-- verdicts:start -->") : readme.index("<!-- verdicts:end -->")]
    assert verdict_table(RESULTS) in block


def test_docs_results_holds_every_frontier_table_and_the_verdicts():
    from visualize.tables import docs_prefix, frontier_markdown

    docs = (ROOT / "docs" / "results.md").read_text()
    for r in RESULTS:
        name = f"{docs_prefix(r)}frontier-b{r['batch']}"
        block = docs[docs.index(f"<!-- {name}:start -->") : docs.index(f"<!-- {name}:end -->")]
        assert frontier_markdown(r).strip() in block
    block = docs[docs.index("<!-- verdicts:start -->") : docs.index("<!-- verdicts:end -->")]
    assert verdict_table(RESULTS) in block


def test_the_token_cache_run_is_on_the_shipped_class_pair_and_in_the_docs():
    from visualize.report import token_cache_runs
    from visualize.tables import frontier_markdown

    runs = token_cache_runs(ROOT)
    assert [r["batch"] for r in runs] == [1, 8]
    docs = (ROOT / "docs" / "results.md").read_text()
    block = docs[docs.index("<!-- token-cache:start -->") : docs.index("<!-- token-cache:end -->")]
    for r in runs:
        assert r["weights"] == file_digest(*PAIRS["MAR"]) and r["verdict"] == verdict(r["rows"])
        assert {"target, LazyMAR token cache", "target, LazyMAR condition cache"} <= {x["method"] for x in r["rows"]}
        assert frontier_markdown(r).strip() in block
