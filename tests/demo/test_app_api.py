"""The app's named API endpoints, called over HTTP with gradio_client against a live local server.

The server runs small untrained models (fast); what is checked is the contract of each endpoint:
outputs present and consistent, and every bad input rejected with an error naming its control.
"""

import json
import math

import gradio as gr
import pytest
import torch
from PIL import Image

pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError, ValidationError

from csd.config import CSDConfig
from csd.records.panel_data import Panels
from csd.records.verdict import verdict as frontier_verdict
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import server
from demo.application import App
from demo.limits import Limits
from demo.requests import library_errors
from demo.tab import Page
from demo.tabs.analyze import frontier_result
from demo.tabs.generate import Comparison, GenerateTab, compare
from demo.views import ANALYSIS_KEYS, analysis_status, frontier_status, stats_markdown
from tests.demo.local_client import local_client

pytestmark = pytest.mark.usefixtures("shared_rates")  # each pair timed once per session (tests/demo/conftest.py)
REFUSED = (AppError, ValidationError)  # a named refusal: in the handler, or by the validator before queueing
LIMITS = Limits(max_batch=2, max_steps=8, max_images=2)
SMALL = {"batch_size": 2, "ar_steps": 8, "gamma": 4}  # within LIMITS


@pytest.fixture(scope="module")
def served():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    demo = server.build(application)
    url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False)
    yield application, local_client(url)
    demo.close()


@pytest.fixture(scope="module")
def client(served):
    return served[1]


def controls(served_app: App, **overrides) -> dict:
    return {**served_app.default_controls(), **SMALL, **overrides}


def analysis_controls(served_app: App, **overrides) -> dict:
    """The analysis takes the generate controls less the batch size (one image per seed), plus n_images."""
    return {k: v for k, v in controls(served_app, **overrides).items() if k != "batch_size"}


def test_named_endpoints_are_public(client):
    assert {"/generate", "/analyze", "/frontier", "/toy", "/inspect"} <= set(
        client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    )


def test_generate_returns_both_images_the_token_map_and_consistent_numbers(served):
    application, client = served
    out = client.predict(**controls(application), api_name="/generate")
    target, csd, token_map, draft, stats, plot, summary, slider, composite, link = out
    for path in (target, csd, token_map, draft, composite):
        with Image.open(path) as img:
            assert min(img.size) >= 256  # 32 px images are upscaled so tokens are visible
    assert "Speedup" in stats and plot is not None
    assert summary["batch_size"] == 2
    assert summary["target_passes"]["target-only"] == 8
    assert summary["target_passes"]["CSD"] < 8  # block verification: one target pass per gamma draft steps
    assert summary["draft_passes"]["draft-only"] == 8
    assert sum(summary["tokens"].values()) == 2 * 64
    assert math.isclose(summary["speedup"], summary["seconds"]["target-only"] / summary["seconds"]["CSD"])
    assert 0.0 <= summary["acceptance_rate"] <= 1.0
    assert len(slider) == 2  # target-only | CSD, the before/after slider
    with Image.open(composite) as img, Image.open(target) as one:
        assert img.size[0] > 3 * one.size[0] and img.format == "PNG"  # target | CSD | map, to download
    assert link.startswith("[Link to these settings](?") and "seed=0" in link


def test_analyze_recomputes_every_panel_for_a_tiny_n(served):
    application, client = served
    status, *figures, data = client.predict(n_images=1, **analysis_controls(application), api_name="/analyze")
    assert "Recomputed" in status and "over 1 images" in status
    assert len(figures) == len(ANALYSIS_KEYS) and all(f is not None for f in figures)
    panels = Panels.from_dict(data)
    assert panels.n_images == 1 and panels.settings["sampling"]["num_steps"] == 8
    assert set(panels.prefill.per_step) == {"0%", "5%", "15%"}
    assert set(panels.distance.acceptance) == {"aligned", "independent"}
    assert panels.weights == RANDOM_SOURCE.weights


def test_panels_of_other_weights_are_shown_with_a_warning(served):
    application, client = served
    *_, data = client.predict(n_images=1, **analysis_controls(application), api_name="/analyze")
    panels = Panels.from_dict(data)
    assert "Warning" not in analysis_status(panels, current_weights=panels.weights)
    assert "other weights" in analysis_status(panels, current_weights="sha256:0123")


def test_frontier_recomputes_every_alternative_for_the_current_controls(served):
    application, client = served
    status, plot, table, data = client.predict(
        n_images=1, **analysis_controls(application, gamma=2), api_name="/frontier"
    )
    assert "Recomputed" in status and "1 images each" in status and plot is not None
    rows = data["rows"]
    assert rows[0]["name"].startswith("target-only (8 AR steps") and rows[0]["time"] == 1.0
    methods = {"target, fewer AR steps", "target, cheaper head", "target, DiSA", "target, GtR", "CSD"}
    assert {r["method"] for r in rows} == methods  # GtR: the alternative that decided the paired verdicts
    assert data["weights"] == RANDOM_SOURCE.weights and data["n"] == 1
    assert table.count("\n|") == len(rows) + 2
    assert any(r["front_accuracy"] for r in rows)


def test_frontier_refuses_more_work_than_the_server_allows():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_analysis_steps=8))
    values = {k: v for k, v in controls(application, ar_steps=8).items() if k != "batch_size"}
    with pytest.raises(gr.Error, match=r"Images \(n\) x AR steps of the frontier must be at most 4.*1 x 8 = 8"):
        next(frontier_result(application, 1, lambda *a, **k: None, **values))


def committed_result(weights: str, batch: int, fd: float = 9.0) -> dict:
    sampling = {"num_steps": 8, "cfg_scale": 3.0}
    row = {"name": "target-only", "method": "target, fewer AR steps", "time": 1.0, "sampling": sampling}
    row |= {"fd": fd, "fd_se": 1.0, "front_fd": True, "csd": None}
    csd = row | {"name": "CSD, gamma 4", "method": "CSD", "time": 0.5, "fd": fd + 1, "front_fd": True}
    rows = [row, csd, row | {"name": "target, 4 AR steps", "time": 0.52, "fd": fd + 30, "front_fd": False}]
    result = {"rows": rows, "metrics": ["fd"], "n": 200, "timing": "median", "weights": weights, "batch": batch}
    return result | {"verdict": frontier_verdict(rows)}


def test_the_benchmark_frontier_is_shown_only_for_the_weights_it_measured(tmp_path):
    store = PairStore([RANDOM_SOURCE], torch.device("cpu"))
    path = tmp_path / "frontier_b8.json"
    assert server.precomputed_frontier(path, store) is None  # no file
    path.write_text(json.dumps(committed_result("sha256:other", 8)))
    assert server.precomputed_frontier(path, store) is None  # measured on other weights
    path.write_text(json.dumps(committed_result(RANDOM_SOURCE.weights, 8)))
    shown = server.precomputed_frontier(path, store)
    assert shown["pair"] == RANDOM_SOURCE.name
    assert "Precomputed" in frontier_status(shown) and "CSD on the front" in frontier_status(shown)
    assert "**Verdict:** CSD is clearly ahead at batch 8" in frontier_status(shown)
    assert "press **Recompute frontier**" in frontier_status(None)


def test_the_analysis_tab_shows_the_committed_frontier_of_the_chosen_pair_and_regime(tmp_path):
    from demo.tabs.analyze import AnalysisTab, regime_batch

    store = PairStore([RANDOM_SOURCE], torch.device("cpu"))
    paths = []
    for b, fd in ((1, 5.0), (8, 7.0)):
        paths.append(tmp_path / f"frontier_b{b}.json")
        paths[-1].write_text(json.dumps(committed_result(RANDOM_SOURCE.weights, b, fd)))
    fronts = server.precomputed_frontiers(paths, store)
    assert sorted(fronts[RANDOM_SOURCE.name]) == [1, 8]
    tab = AnalysisTab(App(store, LIMITS, fronts=fronts))
    tab.f_status, tab.f_plot, tab.f_table, tab.f_data = "status", "plot", "table", "data"  # the outputs' keys
    for b, fd in ((1, 5.0), (8, 7.0)):
        out = tab.committed_outputs(RANDOM_SOURCE.name, b)
        assert out[tab.f_data]["batch"] == b and out[tab.f_data]["rows"][0]["fd"] == fd
        assert f"at batch {b}" in out[tab.f_status] and "Verdict" in out[tab.f_status]
    refused = tab.committed_outputs(RANDOM_SOURCE.name, 3)
    assert list(refused) == [tab.f_status]
    assert "Regime must be one of the batches [1, 8], got 3" in refused[tab.f_status]
    with pytest.raises(gr.Error, match=r"Regime must be one of the batches \[1, 8\]"):
        regime_batch("latency")
    assert App(store, LIMITS).committed_front(RANDOM_SOURCE.name, 1) is None  # nothing committed: nothing shown


def test_toy_acceptance_matches_one_minus_total_variation(client):
    plot, stats, summary = client.predict(0.0, 1.0, 1.0, 1.5, 20_000, 0, api_name="/toy")
    assert plot is not None and "1 - TV" in stats
    assert abs(summary["acceptance"] - summary["one_minus_tv"]) < 0.02  # binomial std ~0.0034 at n = 20000
    assert abs(summary["mean_tries"] - summary["inverse_z"]) < 0.15 * summary["inverse_z"]


@pytest.mark.parametrize(
    "overrides,named",
    [
        ({"batch_size": 99}, r"Batch size must be an integer in \[1, 2\]"),
        ({"ar_steps": 0}, r"AR steps must be an integer in \[1, 8\]"),
        ({"gamma": 0}, r"Draft length gamma must be an integer in \[1, 32\]"),
        ({"prefill": 0.9}, r"Pre-fill ratio must be a number in \[0, 0.5\]"),
        ({"cfg_schedule": "cosine"}, "CFG schedule must be one of 'linear', 'constant'"),
        ({"criterion": "magic"}, "Acceptance criterion must be one of 'aligned', 'exact'"),
        ({"tau_v": 0.5}, r"Verification widening tau_v must be a number in \[1, 100\]"),
        ({"class_name": "blob"}, "Class must be one of the 10 classes"),
        ({"pair_name": "nope"}, "Model pair must be one of"),
        ({"seed": -1}, r"Seed must be an integer in \[0, 2147483647\]"),
        ({"align": "yes"}, r"Trajectory alignment \(shared noise\) must be true or false"),
    ],
)
def test_generate_rejects_bad_input_naming_the_control(served, overrides, named):
    application, client = served
    with pytest.raises(REFUSED, match=named):
        client.predict(**controls(application, **overrides), api_name="/generate")


def test_analyze_rejects_too_many_images(served):
    application, client = served
    with pytest.raises(REFUSED, match=r"Images \(n\) must be an integer in \[1, 2\]"):
        client.predict(n_images=3, **analysis_controls(application), api_name="/analyze")


def test_toy_rejects_a_zero_std_naming_it(client):
    with pytest.raises(REFUSED, match=r"Target p std must be a number in \[0.1, 5\]"):
        client.predict(0.0, 0.0, 1.0, 1.5, 1000, 0, api_name="/toy")


def test_library_errors_become_app_errors_naming_the_knob():
    with pytest.raises(gr.Error, match=r"Invalid setting: gamma \(draft length\)"):
        with library_errors():
            CSDConfig(gamma=0)


def test_limits_come_from_the_environment_and_flags_win(monkeypatch):
    monkeypatch.setenv("CSD_MAX_BATCH", "3")
    monkeypatch.setenv("CSD_MAX_STEPS", "12")
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    args = server.parse_args([])
    assert (args.max_batch, args.max_steps, args.share, args.host) == (3, 12, False, "127.0.0.1")
    assert server.parse_args(["--max-batch", "5"]).max_batch == 5
    with pytest.raises(SystemExit):
        server.parse_args(["--max-steps", "0"])


def test_untrained_models_are_served_when_nothing_is_installed(monkeypatch):
    monkeypatch.setattr(server, "discover", lambda checkpoints: [])
    assert server.make_app(None, LIMITS).store.names == [RANDOM_SOURCE.name]


def test_inspect_returns_the_replay_the_token_and_the_hints(served):
    application, client = served
    out = client.predict(image=1, row=3, column=4, **controls(application), api_name="/inspect")
    frames, token, hints = out["frames"], out["token"], out["hints"]
    assert frames[-1]["label"].endswith("verified") and frames[0]["label"].startswith("pre-fill")
    assert all(v >= 0 for row in frames[-1]["status"] for v in row)  # every token made by the end
    assert (token["image"], token["row"], token["column"], token["index"]) == (1, 3, 4, 28)
    assert token["maker"] in {"prefill", "accepted", "resampled", "capped"} and len(token["final"]) == 48
    assert [h["distance"] for h in hints] == sorted((h["distance"] for h in hints), reverse=True)
    # The same seeds give the same run: the token equals the one a direct inspection of that run reports.
    again = client.predict(image=1, row=3, column=4, **controls(application), api_name="/inspect")
    assert again["token"] == token


def test_inspect_rejects_a_token_off_the_grid_naming_it(served):
    application, client = served
    with pytest.raises(REFUSED, match=r"row: Token row must be an integer in \[0, 7\] \(the 8 x 8 grid"):
        client.predict(image=0, row=8, column=0, **controls(application), api_name="/inspect")


# --- a text-conditioned pair: the prompt by keyword -----------------------------------------------


@pytest.fixture(scope="module")
def served_text():
    from csd.serving.pairs import random_source, random_spec

    text_source = random_source(random_spec("harmon"))
    application = App(PairStore([text_source, RANDOM_SOURCE], torch.device("cpu")), LIMITS)
    demo = server.build(application)
    url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False)
    yield application, local_client(url)
    demo.close()


def test_generate_takes_the_prompt_by_keyword(served_text):
    application, client = served_text
    prompt = "a small blue circle on a black to white gradient"
    *_, stats, _, summary, _, _, _ = client.predict(**controls(application, prompt=prompt), api_name="/generate")
    assert "Speedup" in stats and summary["batch_size"] == 2
    _, _, _, data = client.predict(n_images=1, **analysis_controls(application, prompt=prompt), api_name="/frontier")
    assert data["metrics"] == ["accuracy"]  # the class the prompt names, by the shapes classifier
    status, *figures, panels = client.predict(
        n_images=1, **analysis_controls(application, prompt=prompt), api_name="/analyze"
    )
    assert "Recomputed" in status and all(f is not None for f in figures)  # every panel, for a prompt
    assert Panels.from_dict(panels).settings["prompt"] == prompt


@pytest.mark.parametrize(
    "prompt,named",
    [
        ("", "Prompt must not be empty"),
        ("x" * 10_000, r"Prompt must be text of at most 1000 characters, got 'xxxxx"),
        ("a purple dragon", r"Prompt words \['dragon'\] are not in the vocabulary.*circle, square"),
    ],
)
def test_bad_prompts_are_named_errors(served_text, prompt, named):
    application, client = served_text
    with pytest.raises(REFUSED, match=named):
        client.predict(**controls(application, prompt=prompt), api_name="/generate")


# --- an xAR pair: one cell per AR step ---------------------------------------------------------------


def test_an_xar_pair_generates_and_names_its_fixed_ar_steps():
    from csd.serving.pairs import random_source, random_spec

    xar_source = random_source(random_spec("xar"))
    application = App(PairStore([xar_source], torch.device("cpu")), Limits(max_batch=2))
    values = {**application.default_controls(), "batch_size": 1, "ar_steps": 16, "cfg_schedule": "linear"}
    done = list(compare(application, lambda *a, **k: None, **values))[-1]
    summary = done.summary
    assert isinstance(done, Comparison) and done.pair_name == xar_source.name
    assert summary["target_passes"]["target-only"] == 16 and summary["target_passes"]["CSD"] < 16
    assert summary["unit"] == "cells" and "drafted cells accepted" in stats_markdown(summary)
    assert done.inspected.frames  # the Inspect tab replays it, cell by cell
    with pytest.raises(gr.Error, match=r"random xAR.*AR steps\) must equal 16 for this xAR model"):
        next(compare(application, lambda *a, **k: None, **{**values, "ar_steps": 32}))
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    update = tab.pair_changed(xar_source.name, 32, "constant", None)
    steps, schedule = update[tab.controls["ar_steps"]], update[tab.controls["cfg_schedule"]]
    assert steps["value"] == 16 and schedule["value"] == "linear"  # choosing the pair sets them,
    assert steps["interactive"] is False and schedule["interactive"] is False  # and locks them
    assert update[tab.saved] == {"ar_steps": 32, "cfg_schedule": "constant"}  # the visitor's own, kept


def test_a_preset_on_a_pair_with_fixed_steps_keeps_them():
    """A pair's fixed knobs are set in one place (demo.application.pair_defaults): a preset chosen on the xAR pair, on
    the page as in App.preset (the estimate line, the start-up timing's script), keeps its AR steps and CFG
    ramp, and the request it makes is accepted."""
    from csd.experiments.defaults import PRESETS
    from csd.serving.pairs import random_source, random_spec
    from demo.application import fixed_controls, pair_defaults

    xar_source = random_source(random_spec("xar"))
    application = App(PairStore([RANDOM_SOURCE, xar_source], torch.device("cpu")), Limits(max_batch=2))
    assert fixed_controls(xar_source.traits) == {"ar_steps": 16, "cfg_schedule": "linear"}
    assert fixed_controls(RANDOM_SOURCE.traits) == {}
    assert fixed_controls(random_source(random_spec("nextstep")).traits) == {"ar_steps": 16}  # a token per AR step
    on_xar = pair_defaults(application, application.default_controls(), xar_source.name)
    assert application.default_controls()["ar_steps"] != 16  # a preset starts from the default setting's knobs
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    for name in PRESETS:
        values = application.preset(name, on_xar)
        assert (values["ar_steps"], values["cfg_schedule"], values["pair_name"]) == (16, "linear", xar_source.name)
        assert application.request(None, True, **values).sampling.num_steps == 16
        update = tab.apply_preset(name, **on_xar)
        shown = {k: on_xar[k] if update[c] == gr.skip() else update[c] for k, c in tab.controls.items()}
        assert (shown["ar_steps"], shown["cfg_schedule"]) == (16, "linear")
    assert application.preset("faithful", on_xar)["gamma"] == 2
    on_mar = application.preset("faithful", application.default_controls())  # a pair that fixes none: the default
    assert on_mar["ar_steps"] == application.default_controls()["ar_steps"]


def app_sampling_checks(monkeypatch) -> list[str]:
    """The modules of the app (demo) that call the settings check from now on; the calls of a run's set-up
    (csd, the library's guard of each run) are not the app's."""
    import sys

    from csd import run_setup

    seen, check = [], run_setup.check_settings

    def counted(*args, **kwargs):
        caller = sys._getframe(1).f_globals["__name__"]
        if caller.split(".")[0] == "demo":
            seen.append(caller)
        return check(*args, **kwargs)

    monkeypatch.setattr(run_setup, "check_settings", counted)
    return seen


@pytest.mark.parametrize("kind", ["generate", "analysis", "frontier"])
def test_the_sampling_check_runs_once_per_request_and_the_gpu_call_takes_the_checked_request(monkeypatch, kind):
    """The settings check (in build_request) runs once, in the main process; the GPU task takes the
    checked request as plain values (Request.plain, the analysis' settings, the frontier's plan) and does not
    check it again."""
    from demo.application import drain
    from demo.tabs.analyze import analysis_panels

    limits = Limits(max_batch=2, max_steps=8, max_images=2, max_seconds=3600)  # however busy this machine is
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), limits)
    application.rates(application.store.get(RANDOM_SOURCE.name))  # the start-up timing: a request of its own
    calls, call = [], application.gpu.call
    monkeypatch.setattr(application.gpu, "call", lambda name, values, s: calls.append(values) or call(name, values, s))
    seen = app_sampling_checks(monkeypatch)
    no_progress = lambda *a, **k: None
    if kind == "generate":
        done = list(compare(application, no_progress, **controls(application)))[-1]
        assert isinstance(done, Comparison)
    else:
        run = analysis_panels if kind == "analysis" else frontier_result
        assert drain(run(application, 1, no_progress, **analysis_controls(application))) is not None
    assert seen == ["demo.requests"]
    (values,) = calls
    assert "ar_steps" not in values and values["pair_name"] == RANDOM_SOURCE.name  # no controls: the checked plan
    plain = {
        "generate": {"pair_name", "labels", "seeds", "sampling", "csd"},
        "analysis": {"pair_name", "settings"},
        "frontier": {"pair_name", "points", "n_images", "seed", "label"},
    }
    assert set(values) == plain[kind]


def test_leaving_a_pair_with_fixed_steps_restores_the_visitors_own():
    from csd.serving.pairs import random_source, random_spec

    xar_source = random_source(random_spec("xar"))
    application = App(PairStore([RANDOM_SOURCE, xar_source], torch.device("cpu")), Limits(max_batch=2))
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    there = tab.pair_changed(xar_source.name, 24, "constant", None)
    back = tab.pair_changed(RANDOM_SOURCE.name, 16, "linear", there[tab.saved])
    steps, schedule = back[tab.controls["ar_steps"]], back[tab.controls["cfg_schedule"]]
    assert (steps["value"], schedule["value"]) == (24, "constant") and steps["interactive"] is True
    assert back[tab.saved] is None


def test_choosing_another_pair_shows_its_own_example_or_clears_the_panes_never_the_last_pairs():
    import numpy as np

    from csd.serving.pairs import random_source, random_spec
    from demo.showcase import IMAGES, Shown

    xar_source = random_source(random_spec("xar"))
    application = App(PairStore([RANDOM_SOURCE, xar_source], torch.device("cpu")), Limits(max_batch=2))
    tab = GenerateTab(application)
    images = {k: np.full((8, 8, 3), 30 * i, dtype=np.uint8) for i, k in enumerate(IMAGES)}
    made = {"pair_name": RANDOM_SOURCE.name, "class_name": RANDOM_SOURCE.class_names[2]}
    tab.shown = [Shown("mine", "Its example", images, "### Speedup 1.50x", {"pair": "x"}, made, "w")]
    with gr.Blocks():
        tab.build(Page({}))
    panes = [tab.target, tab.csd, tab.map, tab.draft, tab.speed, tab.summary, tab.slider, tab.composite]
    # The panes hold the class pair's example; the xAR pair has none: every pane is cleared, and a line says so.
    there = tab.pair_changed(xar_source.name, 16, "linear", None, RANDOM_SOURCE.name)
    assert all(there[p] is None for p in panes) and there[tab.results] == xar_source.name
    assert "Generate** to see this pair" in there[tab.stats] and xar_source.name in there[tab.stats]
    # Back on the class pair: its own example, with the class it was made for, and no earlier time chart.
    back = tab.pair_changed(RANDOM_SOURCE.name, 16, "linear", there[tab.saved], there[tab.results])
    assert all(np.array_equal(back[p], images[k]) for p, k in zip(panes, IMAGES, strict=False))
    assert back[tab.speed] is None and back[tab.summary] == {"pair": "x"} and back[tab.results] == RANDOM_SOURCE.name
    assert f"Precomputed on {RANDOM_SOURCE.name}: Its example" in back[tab.stats]
    assert back[tab.controls["class_name"]]["value"] == made["class_name"]
    # A gallery example or a link that set the pair and its results together: nothing is replaced.
    kept = tab.pair_changed(RANDOM_SOURCE.name, 16, "linear", None, RANDOM_SOURCE.name)
    assert not set(panes) & set(kept) and "value" not in kept[tab.controls["class_name"]]
