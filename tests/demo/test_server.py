"""Serving a public demo: no visitor reaches the server's files or the Hub, official checkpoints come
from the operator at start, runs report progress and stop when asked, and the limits hold.

Hub traffic goes to a stand-in on 127.0.0.1 (tests/fake_hub.py); nothing leaves the machine."""

import os
import threading
import time

import gradio as gr
import pytest
import torch

pytest.importorskip("gradio_client")

from csd.serving import pairs
from csd.serving.pairs import HUB_FILES, PairStore, discover, fetch_official
from csd.trace import Maker
from demo import server
from demo.application import App
from demo.limits import Limits
from demo.tab import Page
from demo.tabs.analyze import analysis_panels, analyze_stopped
from demo.tabs.generate import GenerateTab, compare
from tests.demo.local_client import local_client
from tests.demo.slow_pair import STEP_DELAY, slowed
from tests.fake_hub import fake_hub

OFFICIAL_REPO = {name: name.encode() * 3 for name in HUB_FILES} | {"README.md": b"not fetched"}
RANDOM_NAME = pairs.RANDOM_SOURCE.name
SLOW_SOURCE = slowed()  # runs long enough to stop midway
LIMITS = Limits(max_batch=2, max_steps=64, max_images=2)


@pytest.fixture(scope="module")
def served():
    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), LIMITS)
    demo = server.build(application)
    url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False)
    yield application, demo, local_client(url)
    demo.close()


def _controls(application, **overrides):
    return {**application.default_controls(), "batch_size": 1, "ar_steps": 64, "gamma": 4, **overrides}


# --- no visitor reaches the server's files or the Hub ---------------------------------------------


def test_the_page_offers_no_control_that_takes_a_path_or_a_repository(served):
    _, demo, _ = served
    kinds = {c["type"] for c in demo.config["components"]}
    assert not kinds & {"file", "uploadbutton", "fileexplorer", "code"}, kinds
    # The one free-text field is the prompt, which only a text pair's tokenizer reads (and the hidden
    # textbox the example prompts are rendered with).
    texts = [c["props"] for c in demo.config["components"] if c["type"] == "textbox"]
    assert [t.get("label") for t in texts if t.get("visible") is not False or t.get("elem_id")] == ["Prompt"]
    labels = " ".join(str(c.get("props", {}).get("label", "")) for c in demo.config["components"]).lower()
    for word in ("repository", "directory", "path", "download"):
        assert word not in labels


def test_every_handler_is_a_known_one_and_none_can_download(served, monkeypatch):
    application, demo, client = served
    handlers = {fn.fn.__name__ for fn in demo.fns.values() if fn.fn is not None}  # None: a front-end-only event
    known = {"generate", "analyze", "toy", "pair_changed", "generate_stopped", "analyze_stopped"}
    known |= {"generate_ui", "analyze_page", "frontier_page"}  # the page's events beside the API's
    known |= {"recompute_frontier", "frontier_stopped", "pick_example"}  # the frontier section, example prompts
    known |= {"after_run", "replay", "show_token", "select_on_map", "select_hint", "inspect_api", "play"}  # Inspect
    known |= {"apply_preset", "estimate", "from_link", "show_example"}  # presets, the estimate, a link, the gallery
    known |= {"analysis_images", "frontier_images"}  # the Images (n) that fit the chosen pair
    known |= {"committed_outputs"}  # the committed frontier of the chosen pair and regime
    assert handlers <= known, handlers

    def refuse(*args, **kwargs):
        raise AssertionError("a request reached the Hub")

    monkeypatch.setattr(pairs, "fetch_official", refuse)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", refuse)
    client.predict(**_controls(application, ar_steps=4), api_name="/generate")  # would fail if it fetched
    for name in client.view_api(print_info=False, return_format="dict")["named_endpoints"]:
        assert name in {"/generate", "/analyze", "/frontier", "/toy", "/inspect"}


def test_fetch_official_takes_only_the_official_files_and_skips_those_present(tmp_path):
    lines = []
    with fake_hub({"org/mar": OFFICIAL_REPO}) as (url, requests):
        fetch_official("org/mar", tmp_path, lines.append, endpoint=url)
        assert all((tmp_path / name).read_bytes() == OFFICIAL_REPO[name] for name in HUB_FILES)
        assert not (tmp_path / "README.md").exists()
        assert "Fetching 4 of 4 official files" in lines[0] and "org/mar" in lines[0] and "free" in lines[0]
        requests.clear()
        fetch_official("org/mar", tmp_path, lines.append, endpoint=url)
        assert "all present" in lines[1] and not any("/resolve/" in r for r in requests)
    mar_pairs = [s.name for s in pairs.pair_specs("official") if s.family == "mar"]
    assert [s.name for s in discover(tmp_path, embedded_dir=tmp_path)] == mar_pairs


def test_fetch_official_checks_the_disk_space_before_downloading(tmp_path):
    with fake_hub({"org/mar": OFFICIAL_REPO}, sizes={"org/mar": {"mar/mar_huge/checkpoint-last.pth": 8 << 30}}) as (
        url,
        requests,
    ):
        with pytest.raises(OSError, match=r"has 2.0 GiB free; fetching 4 files from org/mar needs 8.0 GiB"):
            fetch_official("org/mar", tmp_path, endpoint=url, free_bytes=lambda path: 2 << 30)
        assert not any("/resolve/" in r for r in requests)  # nothing was downloaded


def test_fetch_official_names_a_repository_that_is_not_there_or_not_official(tmp_path):
    with fake_hub({"org/other": {"weights.bin": b"x"}}) as (url, _):
        with pytest.raises(ValueError, match="Hub repository 'nobody/nothing' does not exist"):
            fetch_official("nobody/nothing", tmp_path, endpoint=url)
        with pytest.raises(ValueError, match="'org/other' has no vae/kl16.ckpt"):
            fetch_official("org/other", tmp_path, endpoint=url)


def test_a_missing_hub_repository_named_at_start_stops_the_start(tmp_path, monkeypatch, capsys):
    with fake_hub({}) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("CSD_HUB_REPO", "nobody/nothing")
        with pytest.raises(SystemExit, match="--hub-repo nobody/nothing: Hub repository 'nobody/nothing' does not"):
            server.main(["--checkpoints", str(tmp_path)])
    args = server.parse_args(["--hub-repo", "org/mar"])
    assert args.hub_repo == "org/mar" and args.checkpoints == server.DEFAULT_CHECKPOINTS


def test_a_hub_repository_named_at_start_is_fetched_before_serving(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "discover", lambda checkpoints: [SLOW_SOURCE] if checkpoints == tmp_path else [])
    with fake_hub({"org/mar": OFFICIAL_REPO}) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        application = server.make_app(tmp_path, LIMITS, hub_repo="org/mar")
    assert (tmp_path / "vae" / "kl16.ckpt").is_file() and application.store.names == [RANDOM_NAME]


# --- progress and stop ------------------------------------------------------------------------------


def test_generate_reports_progress_through_the_api_at_each_runs_ends_and_at_most_four_times_a_second(served):
    application, _, client = served
    job = client.submit(**_controls(application, ar_steps=16), api_name="/generate")
    job.result(timeout=120)
    statuses = [out[4] for out in job.outputs() if isinstance(out[4], str)]  # others: "no change" updates
    running = [s for s in statuses if s.startswith("Running")]
    for run in ("target-only", "draft-only"):
        steps = [s for s in running if f"{run}: AR step" in s]
        assert f"{run}: AR step 1/16" in steps[0] and f"{run}: AR step 16/16" in steps[-1] and len(steps) <= 16
    assert any("CSD: AR step 16/16 (verify)" in s for s in running)  # the CSD run's last block
    assert statuses[-1].startswith("### Speedup") and application.history[-1]["status"] == "done"
    assert application.history[-1]["steps"] > 32  # every step ran; the page heard of some


def test_the_page_hears_of_a_runs_first_and_last_step_and_of_the_others_at_most_every_quarter_second():
    from csd.serving.jobs import Step
    from demo.runs import PROGRESS_SECONDS, Throttle

    now = [0.0]
    throttle = Throttle(clock=lambda: now[0])
    heard = []
    for done in range(1, 21):  # 20 steps, 0.1 s apart
        heard += [done] if throttle.due(Step("target-only", done, 20, "target")) else []
        now[0] += 0.1
    assert heard == [1, 4, 7, 10, 13, 16, 19, 20] and PROGRESS_SECONDS == 0.25
    assert throttle.due(Step("CSD", 1, 20, "pre-fill"))  # a new run's first step, at once


def test_stop_ends_the_run_within_an_ar_step_and_the_queue_serves_the_next_request(served):
    application, _, client = served
    job = client.submit(**_controls(application), api_name="/generate")  # 3 runs of 64 steps: several seconds
    deadline = time.monotonic() + 60
    while not any(isinstance(out[4], str) and "CSD: AR step" in out[4] for out in job.outputs()):
        assert time.monotonic() < deadline, "the run never reached CSD"
        time.sleep(0.02)
    job.cancel()
    t0 = time.monotonic()
    while not application.history or application.history[-1]["status"] != "stopped":
        assert time.monotonic() - t0 < 10, f"the run did not stop: {list(application.history)}"
        time.sleep(0.01)
    stopped_after = time.monotonic() - t0
    assert not any(t.name == "csd-job" and t.is_alive() for t in threading.enumerate())  # the worker has ended
    record = application.history[-1]
    assert 64 < record["steps"] < 64 + 64  # target-only finished, CSD stopped midway, draft-only never ran
    assert stopped_after < 2.0  # one AR step is ~0.05 s here; leave room for a busy machine
    # The next request runs at once and completes; the stopped one left no final result.
    t1 = time.monotonic()
    out = client.predict(**_controls(application, ar_steps=4), api_name="/generate")
    assert out[4].startswith("### Speedup") and time.monotonic() - t1 < 30
    assert not any(isinstance(o[4], str) and o[4].startswith("### Speedup") for o in job.outputs())


def test_the_stop_button_shows_nothing_of_the_stopped_run():
    import gradio as gr

    tab = GenerateTab(App(PairStore([SLOW_SOURCE], torch.device("cpu")), LIMITS))
    with gr.Blocks():
        tab.build(Page({}))
    shown = tab.generate_stopped()
    assert set(shown) == set(tab.outputs) and "Stopped" in shown.pop(tab.stats)
    assert all(v is None for v in shown.values())  # no image, plot, summary, nothing to inspect
    assert "panels below are the ones shown before" in analyze_stopped()


def test_a_refused_page_run_leaves_what_is_shown_and_says_why_while_the_api_raises():
    """The page's Generate and Analysis handlers share one refusal wrapper (demo.tab.shown_refusal): a
    refused request yields one update, the status line, and nothing that would clear what is shown."""
    import gradio as gr

    from demo.tabs.analyze import AnalysisTab

    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), LIMITS)
    generate, analysis, page = GenerateTab(application), AnalysisTab(application), Page({})
    with gr.Blocks():
        generate.build(page)
        analysis.build(page)
    bad = _controls(application, batch_size=3)  # over the server's 2
    with pytest.warns(UserWarning, match="Batch size"):  # gr.Warning outside an event: the message, as a warning
        updates = list(generate.generate_ui(None, **bad))
    assert len(updates) == 1 and set(updates[0]) == {generate.stats}
    assert updates[0][generate.stats].startswith("**Not run:** Batch size must be")
    with pytest.raises(gr.Error, match="Batch size must be"):
        next(generate.generate(None, **bad))
    controls = {k: v for k, v in _controls(application).items() if k != "batch_size"}
    (update,) = list(analysis.analyze_page(3, None, **controls))  # images over the server's 2
    assert set(update) == {analysis.status} and update[analysis.status].startswith("**Not recomputed:** Images")
    assert update[analysis.status].endswith("The panels below are the ones shown before.")


def test_the_page_shows_target_only_before_csd_starts_and_csd_before_draft_only(monkeypatch):
    """Generate streams through the page's refusal wrapper: each run's images are on the page before the next
    run starts (each next run waits until the page has them), and the last update carries every output."""
    import demo.tabs.generate as generate_module

    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), LIMITS)
    tab = GenerateTab(application)
    with gr.Blocks():
        tab.build(Page({}))
    shown = {"target": threading.Event(), "csd": threading.Event()}
    real_csd, real_single = generate_module.run_csd, generate_module.run_single

    def after(event: str, run):
        def gated(*args, **kwargs):
            assert shown[event].wait(20), f"the next run started before the page showed the {event} images"
            return run(*args, **kwargs)

        return gated

    monkeypatch.setattr(generate_module, "run_csd", after("target", real_csd))
    draft_only = after("csd", real_single)
    pick = lambda *a, **k: (draft_only if Maker.DRAFT in a else real_single)(*a, **k)  # target-only runs at once
    monkeypatch.setattr(generate_module, "run_single", pick)
    updates = []
    for update in tab.generate_ui(None, **_controls(application, ar_steps=8)):
        updates.append(update)
        for event, image in (("target", tab.target), ("csd", tab.csd)):
            if update.get(image) is not None:
                shown[event].set()
    images = {"target": tab.target, "csd": tab.csd, "draft": tab.draft}
    first = {key: next(i for i, u in enumerate(updates) if u.get(c) is not None) for key, c in images.items()}
    assert first["target"] < first["csd"] < first["draft"] == len(updates) - 1
    assert all(updates[-1].get(c) is not None for c in (tab.target, tab.csd, tab.map, tab.draft, tab.speed))
    assert application.history[-1]["status"] == "done"


# --- limits -------------------------------------------------------------------------------------------


def test_a_request_estimated_past_the_limit_is_refused_by_name_before_it_runs():
    limits = Limits(max_batch=1, max_steps=64, max_seconds=0.2)
    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), limits)
    with pytest.raises(gr.Error, match=r"would take about \d+ s on this server, more than the 0 s .*fewer images"):
        next(compare(application, lambda *a, **k: None, **_controls(application)))
    assert not application.history  # nothing ran


def test_a_run_past_the_time_limit_still_ends_with_an_error_naming_the_limit():
    """The estimate can be wrong (a busy machine): the per-request limit still stops a run at its next step."""
    from demo.estimate import Rates

    limits = Limits(max_batch=1, max_steps=64, max_seconds=0.2)
    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), limits)
    zero = dict.fromkeys(("target", "draft", "csd"), 0.0)
    application.timings.known[RANDOM_NAME] = Rates(zero, zero)  # a (wrong) estimate that fits
    controls = _controls(application)
    with pytest.raises(
        gr.Error, match=r"ran past the time limit of 0.2 s per request on this server and was stopped: ask for fewer"
    ):
        for _ in compare(application, lambda *a, **k: None, **controls):
            pass
    assert application.history[-1]["status"] == "over time"
    assert application.history[-1]["seconds"] < 0.2 + 10 * STEP_DELAY + 1.0


def test_the_time_limit_comes_from_the_environment_and_flags_win(monkeypatch):
    monkeypatch.setenv("CSD_MAX_SECONDS", "12.5")
    assert server.parse_args([]).max_seconds == 12.5
    assert server.parse_args(["--max-seconds", "3"]).max_seconds == 3.0
    with pytest.raises(SystemExit):
        server.parse_args(["--max-seconds", "0"])
    monkeypatch.setenv("CSD_MAX_SECONDS", "soon")
    with pytest.raises(SystemExit, match="CSD_MAX_SECONDS must be a number"):
        server.parse_args([])


def test_an_analysis_past_the_work_limit_is_refused_naming_it():
    limits = Limits(max_batch=1, max_steps=64, max_images=8, max_analysis_steps=16)
    application = App(PairStore([SLOW_SOURCE], torch.device("cpu")), limits)
    controls = {k: v for k, v in _controls(application, ar_steps=16).items() if k != "batch_size"}
    with pytest.raises(gr.Error, match=r"Images \(n\) x AR steps must be at most 16 .*got 2 x 16 = 32"):
        next(analysis_panels(application, 2, lambda *a, **k: None, **controls))
    assert server.parse_args(["--max-analysis-steps", "99"]).max_analysis_steps == 99


def test_nothing_a_visitor_can_read_holds_a_path_of_the_machine(served):
    """The page's config (every component's value, the precomputed results) names no absolute path."""
    import re

    import httpx

    _, _, client = served
    config = httpx.get(client.src.rstrip("/") + "/config", timeout=30).text
    found = re.findall(r'"(/(?:root|home|work|usr|opt)/[^"]{0,60})', config)
    assert not found, found


def test_results_record_model_paths_relative_to_the_repository(tmp_path):
    from csd.experiments.evaluate import ROOT, recorded_path

    assert (
        recorded_path(ROOT / "assets" / "models" / "shapes_target.safetensors")
        == "assets/models/shapes_target.safetensors"
    )
    assert recorded_path(tmp_path / "elsewhere" / "x.safetensors") == "x.safetensors"


# --- fair sharing -------------------------------------------------------------------------------------


def _join(url: str, fn_index: int, data: list, session: str):
    import httpx

    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    return httpx.post(f"{url}/gradio_api/queue/join", json=body, timeout=30)


def test_one_visitor_cannot_fill_the_queue_or_hold_it_for_nobody(served):
    """A session that joins more than its share is refused by name (429); requests whose client never reads
    the result are not run; another visitor is served meanwhile, without waiting for them."""
    from demo.soak import call, default_requests, endpoints

    application, _, client = served
    url = client.src.rstrip("/")
    eps = endpoints(url)
    good = default_requests(url)["/generate"] | {"ar_steps": 4, "gamma": 2}
    ep = eps["/generate"]
    data = [good[p] for p in ep.parameters]
    gone = application.gone
    answers = [_join(url, ep.fn_index, data, "flooder0001") for _ in range(3)]
    assert [a.status_code for a in answers[:2]] == [200, 200]  # the session's share: 2 at a time
    assert answers[2].status_code == 429 and "per visitor" in answers[2].json()["detail"]
    t0 = time.monotonic()
    outcome = call(url, ep, good)  # another visitor, who reads its result
    assert outcome.kind == "served"
    while application.gone < gone + 2:  # the flooder's two requests are dropped, not run
        assert time.monotonic() - t0 < 30, "the requests of a client that never listened were not dropped"
        time.sleep(0.1)
    assert time.monotonic() - t0 < 2 * 2.0 + 20  # at most the grace before dropping each, plus its own run


def test_bodies_past_the_cap_and_uploads_are_refused(served):
    import httpx

    _, _, client = served
    url = client.src.rstrip("/")
    big = httpx.post(f"{url}/gradio_api/queue/join", content=b"{" + b" " * (70 * 1024) + b"}", timeout=30)
    assert big.status_code == 413 and "at most" in big.json()["detail"]
    upload = httpx.post(f"{url}/gradio_api/upload", files={"files": ("a.txt", b"hello")}, timeout=30)
    assert upload.status_code == 403 and "uploads are disabled" in upload.json()["detail"]


def test_gradio_settings_that_widen_exposure_are_pinned_off(monkeypatch):
    monkeypatch.setenv("GRADIO_ALLOWED_PATHS", "/")
    monkeypatch.setenv("GRADIO_MCP_SERVER", "True")
    monkeypatch.delenv("GRADIO_SHARE", raising=False)
    assert sorted(server.pin_gradio_env()) == ["GRADIO_ALLOWED_PATHS", "GRADIO_MCP_SERVER"]
    assert "GRADIO_ALLOWED_PATHS" not in os.environ and "GRADIO_MCP_SERVER" not in os.environ
    assert server.parse_args(["--gradio-env"]).gradio_env and not server.parse_args([]).gradio_env


def test_expected_refusals_are_one_log_line_without_a_traceback(caplog):
    import logging

    from demo.errors import refuse

    with caplog.at_level(logging.INFO, logger="csd.demo"):
        error = refuse("Seed must be an integer in [0, 10], got 0.5\nsecond line", control="seed")
    (record,) = caplog.records
    assert record.getMessage() == "refused seed: Seed must be an integer in [0, 10], got 0.5 second line"
    assert error.print_exception is False and error.duration is None  # stays on screen until closed


def test_a_chosen_pair_starts_its_recomputes_at_the_images_its_own_rates_fit():
    """Choosing a pair sets Images (n) to the most its measured rates fit within --default-seconds (xAR's runs
    cost more than the class pair's): a recompute at the page's n is never refused for time."""
    from csd.serving.pairs import PairStore, pair_specs, random_source
    from demo.estimate import Rates
    from demo.tabs.analyze import AnalysisTab, check_analysis

    store = PairStore([random_source(s) for s in pair_specs("random")], torch.device("cpu"))
    application = App(store, Limits(max_seconds=75.0))
    tab = AnalysisTab(application)
    mar, xar = (next(n for n in store.names if store.source(n).traits.family == f) for f in ("MAR", "xAR"))
    assert tab.analysis_images(xar) == 2  # before any measurement
    for name, per_step in ((mar, 0.002), (xar, 0.08)):
        store.get(name)
        one = {k: per_step for k in ("target", "draft", "csd")}
        application.timings.known[name] = Rates(one, {k: 4 * v for k, v in one.items()}, batch=4)  # linear in the batch
    assert tab.analysis_images(mar) == 4 and tab.frontier_images(mar) == 4
    n = tab.analysis_images(xar)
    assert 1 <= n < 4
    controls = {k: v for k, v in application.default_controls().items() if k != "batch_size"}
    from demo.tabs.analyze import pair_defaults

    budget = application.limits.default_seconds  # what the page's defaults are sized to (--default-seconds)
    check_analysis(application, n, None, False, budget, **pair_defaults(application, controls, xar))  # fits
    with pytest.raises(gr.Error, match="fewer images"):
        check_analysis(application, n + 1, None, False, budget, **pair_defaults(application, controls, xar))


def test_the_heads_run_eager_on_zero_gpu_and_compiled_on_other_cuda_unless_the_operator_says(monkeypatch, capsys):
    """``--head-kernels auto``: eager on ZeroGPU (each GPU call in a worker process of its own would compile and
    capture again), compiled with graphs elsewhere; the flag and CSD_HEAD_KERNELS choose; a bad value is named."""
    from csd.models.kernels import EAGER, HeadKernels
    from demo.gpu import ZERO_GPU_FLAG

    monkeypatch.delenv("CSD_HEAD_KERNELS", raising=False)
    monkeypatch.setenv(ZERO_GPU_FLAG, "true")
    assert server.head_kernels(server.parse_args([]).head_kernels) is EAGER
    assert server.head_kernels(server.parse_args(["--head-kernels", "compiled"]).head_kernels) == HeadKernels()
    monkeypatch.delenv(ZERO_GPU_FLAG)
    assert server.head_kernels(server.parse_args([]).head_kernels) == HeadKernels(compiled=True, graphs=True)
    monkeypatch.setenv("CSD_HEAD_KERNELS", "eager")
    assert server.head_kernels(server.parse_args([]).head_kernels) is EAGER
    monkeypatch.setenv("CSD_HEAD_KERNELS", "fast")
    with pytest.raises(SystemExit):
        server.parse_args([])
    assert "CSD_HEAD_KERNELS must be one of auto, eager, compiled, got 'fast'" in capsys.readouterr().err
