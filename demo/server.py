"""Serving the demo: the command line (flags made from :class:`demo.limits.Limits`), the app on every
installed pair, the page of tabs, warm-up and launch.

    python app.py [--host 127.0.0.1] [--port 7860] [--checkpoints DIR] [--hub-repo REPO] [limits ...]

Settings also come from the environment (``CSD_CHECKPOINTS``, ``CSD_HUB_REPO``, ``CSD_THREADS`` and each
limit's variable, e.g. ``CSD_MAX_SECONDS``); flags win. Models are loaded once and shared read-only by
every request; visitors choose among the pairs the operator installed and never name a file or a
repository. Named API endpoints: ``/generate``, ``/inspect``, ``/analyze``, ``/frontier``, ``/toy``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections import Counter
from pathlib import Path

import gradio as gr
import torch
from starlette.middleware import Middleware

from csd.cli import add_machine_flags, check_threads, start_up
from csd.models import kernels
from csd.models.kernels import EAGER, HeadKernels
from csd.records.panel_data import Panels
from csd.serving.pairs import RANDOM_SOURCE, PairStore, discover, fetch_official
from demo import limits as limits_module
from demo.application import DEVICE, App
from demo.gpu import zero_gpu
from demo.guard import Guard
from demo.limits import Limits
from demo.reference import REFERENCE_FILE
from demo.reference import read as read_reference
from demo.schemas import share_api_schemas
from demo.tab import Page, Tab
from demo.tabs.analyze import AnalysisTab
from demo.tabs.generate import GenerateTab
from demo.tabs.inspect import InspectTab
from demo.tabs.method import MethodTab

ROOT = Path(__file__).resolve().parents[1]
PRECOMPUTED = ROOT / "assets" / "analysis_default.json"
# python -m csd.experiments.bench --frontier (every pair's folder; one file per batch it was timed at)
FRONTIERS = sorted((ROOT / "bench" / "results").rglob("frontier_b*.json"))
DEFAULT_CHECKPOINTS = ROOT / "pretrained_models"  # where --hub-repo fetches to without --checkpoints
# The models are small (64 tokens): a second intra-op thread gains little, while on a CPU shared with
# other work (two cores, a training job) more threads than free cores made generation 20-50x slower.
CPU_THREADS = 1

CSS = """
.csd-img img { image-rendering: pixelated; }
.csd-legend { font-size: 0.9em; margin-top: -6px; }
#gen-status table { font-size: 0.9em; }
#gen-status th, #gen-status td { white-space: nowrap; padding: 2px 6px; }
#gen-status { overflow-x: auto; }
#model-card { font-size: 0.85em; margin-top: -8px; }
/* On a phone, target and CSD stay side by side (two columns), not stacked, and every tab fits. */
@media (max-width: 640px) {
  button[role="tab"] { padding: 4px 6px !important; min-width: 0 !important; }
  .csd-pair { flex-wrap: nowrap !important; }
  .csd-pair > div { min-width: 0 !important; flex: 1 1 50% !important; }
}
"""
GRADIO_THREADS = 40  # Gradio's own thread count, for the page's quick events, beside the requests in line
# System fonts: the default theme would fetch web fonts, and the app must work offline.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def build(app: App) -> gr.Blocks:
    # Generation and analysis share one queue group, whose every request starts at once and waits in the app's
    # line (demo.line: at most `concurrency` model runs at once, each waiting request told its place and wait).
    queue = {"concurrency_id": "models", "concurrency_limit": app.limits.queue_size}
    share_api_schemas()  # an update's skipped outputs would each remake their API schema (demo/schemas.py)
    # Generated images are temporary files: those older than 15 min are deleted every 5 min.
    with gr.Blocks(title="Continuous speculative decoding", delete_cache=(300, 900)) as demo:
        gr.Markdown(
            "# Continuous speculative decoding\nA small *draft* model proposes image tokens, a large *target* "
            "model verifies them in one pass. Same seed, same noise: compare target-only and CSD side by side."
        )
        generate, analysis, page = GenerateTab(app), AnalysisTab(app), Page(queue)
        tabs: list[Tab] = [generate, InspectTab(app), analysis, MethodTab(app)]  # in page order
        with gr.Tabs(overflow_behavior="wrap"):  # on a phone every tab stays in sight, none behind "..."
            for tab in tabs:
                with gr.Tab(tab.title):
                    tab.build(page)
        quick = {"api_visibility": "private", "queue": False}
        controls = page.controls
        loaded = demo.load(generate.from_link, None, [*controls.values(), *generate.panes], **quick).then(
            generate.estimate, inputs_kwargs=controls, outputs=generate.estimate_md, **quick
        )
        # The pairs are timed once the page is served: each visit starts Images (n) at what the rates now fit.
        pair = controls["pair_name"]
        loaded.then(analysis.analysis_images, pair, analysis.n_images, **quick).then(
            analysis.frontier_images, pair, analysis.f_n_images, **quick
        )
    demo.csd_app = app  # serve() links the guard's stream count to the app
    return demo


HEAD_KERNELS = ("auto", "eager", "compiled")


def head_kernels(choice: str) -> HeadKernels:
    """The heads' kernels on CUDA for ``--head-kernels`` (a CPU runs eager whatever is chosen)."""
    if choice == "auto":
        choice = "eager" if zero_gpu() else "compiled"
    return EAGER if choice == "eager" else HeadKernels()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Serve the continuous speculative decoding demo.")
    ap.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),  # Hugging Face Spaces set 0.0.0.0 here
        help="interface to listen on (0.0.0.0 for all)",
    )
    ap.add_argument("--port", type=int, default=limits_module.env_setting("GRADIO_SERVER_PORT", 7860, int))
    ap.add_argument(
        "--checkpoints",
        type=Path,
        default=os.environ.get("CSD_CHECKPOINTS"),
        help="directory with official checkpoints (mar/<config>/checkpoint-last.pth, xar/, harmon/, vae/kl16.ckpt); "
        f"with --hub-repo, where they are fetched (default {DEFAULT_CHECKPOINTS.relative_to(ROOT)}/)",
    )
    ap.add_argument(
        "--hub-repo",
        default=os.environ.get("CSD_HUB_REPO") or None,
        help="Hugging Face Hub repository with the official layout, fetched into --checkpoints before serving "
        "(several GB; the only download the app ever makes, and only when named here)",
    )
    limits_module.add_flags(ap)
    default_threads = CPU_THREADS if DEVICE.type == "cpu" else torch.get_num_threads()
    threads = limits_module.env_setting("CSD_THREADS", default_threads, int)
    add_machine_flags(ap, threads, device=False, where=f"; CSD_THREADS; else {CPU_THREADS} on a CPU-only machine")
    ap.add_argument(
        "--head-kernels",
        choices=HEAD_KERNELS,
        default=os.environ.get("CSD_HEAD_KERNELS", "auto"),
        help="the diffusion heads on CUDA: compiled (each chain one CUDA graph, csd/models/kernels.py) or eager; "
        "auto: eager on ZeroGPU (each GPU call runs in a worker process of its own, where the compiles and "
        "graphs would be made again), compiled elsewhere; CSD_HEAD_KERNELS",
    )
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link (off by default)")
    ap.add_argument(
        "--gradio-env",
        action="store_true",
        help=f"honour Gradio's widening environment variables ({', '.join(WIDENING_ENV)}); off by default",
    )
    args = ap.parse_args(argv)
    if args.head_kernels not in HEAD_KERNELS:  # from the environment: argparse checks only the flag
        ap.error(f"CSD_HEAD_KERNELS must be one of {', '.join(HEAD_KERNELS)}, got {args.head_kernels!r}")
    try:
        limits_module.from_args(args)
        check_threads(args.threads)
    except ValueError as err:
        ap.error(str(err))
    if args.hub_repo is not None and args.checkpoints is None:
        args.checkpoints = DEFAULT_CHECKPOINTS
    return args


def precomputed_frontier(path: Path, store: PairStore) -> dict | None:
    """The benchmark's frontier, when it was measured on a pair this server serves (same weights)."""
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    for name in store.names:
        if store.source(name).weights == result.get("weights"):
            return result | {"pair": name}
    return None


def precomputed_frontiers(paths: list[Path], store: PairStore) -> dict[str, dict[int, dict]]:
    """Every benchmark frontier measured on a served pair: pair name -> batch -> result."""
    fronts: dict[str, dict[int, dict]] = {}
    for path in paths:
        result = precomputed_frontier(path, store)
        if result is not None:
            fronts.setdefault(result["pair"], {})[int(result["batch"])] = result
    return fronts


def make_app(
    checkpoints: Path | None, limits: Limits, hub_repo: str | None = None, reference: Path | None = REFERENCE_FILE
) -> App:
    """The app on every pair found (the untrained pair only when nothing is installed). With ``hub_repo``
    the official checkpoints are fetched into ``checkpoints`` first; a failure ends the start. ``reference``: the
    committed rates (:mod:`demo.reference`), used on a CPU (a GPU times its pairs itself); None: none."""
    if hub_repo is not None:
        try:
            log = lambda line: print(line, flush=True)
            fetch_official(hub_repo, checkpoints or DEFAULT_CHECKPOINTS, log, endpoint=os.environ.get("HF_ENDPOINT"))
        except Exception as err:  # not found, no space, no network: the server does not start
            raise SystemExit(f"--hub-repo {hub_repo}: {err}") from None
    sources = discover(checkpoints)
    if not sources:
        print("No embedded models in assets/models and no official checkpoints: serving untrained models.")
        sources = [RANDOM_SOURCE]
    store = PairStore(sources, DEVICE)
    panels = Panels.load(PRECOMPUTED) if PRECOMPUTED.is_file() else None
    if panels is not None and panels.pair not in store.names:
        panels = None  # computed for a pair this server does not have
    app = App(store, limits, panels, precomputed_frontiers(FRONTIERS, store))
    if reference is not None and DEVICE.type == "cpu" and not zero_gpu():
        served = {name: (store.source(name).weights, app.default_setting(name)) for name in store.names}
        app.timings.reference = read_reference(reference, served)
    return app


# Gradio settings from the environment that widen what a visitor can reach: off unless an operator flag asks.
WIDENING_ENV = ("GRADIO_ALLOWED_PATHS", "GRADIO_MCP_SERVER", "GRADIO_SHARE", "GRADIO_VIBE_MODE", "GRADIO_DEBUG")


def pin_gradio_env() -> list[str]:
    """Remove the widening Gradio settings from the environment; returns the names that were set."""
    return [name for name in WIDENING_ENV if os.environ.pop(name, None) is not None]


def serve(
    demo: gr.Blocks,
    limits: Limits,
    host: str,
    port: int | None,
    share: bool = False,
    block: bool = True,
    gradio_env: bool = False,
) -> str:
    """Queue (every model request joins the app's line at once, at most ``limits.queue_size``; the line runs
    ``limits.concurrency`` at a time, demo.line) and launch; returns the local URL.
    ``port=None`` takes the first free port from 7860; ``block=False`` returns while serving. The guard
    (:class:`demo.guard.Guard`) caps bodies, refuses uploads and limits each session's queued requests;
    ``gradio_env``: keep the widening Gradio environment variables (:data:`WIDENING_ENV`)."""
    if not gradio_env:
        for name in pin_gradio_env():
            print(f"{name} ignored (pass --gradio-env to honour it)", flush=True)
    # Gradio switches matplotlib's backend around each API call; the first switch imports pyplot, 0.7-0.9 s of a
    # first visitor's wait on the server's event loop (python app.py on 2 busy cores): made here, before serving.
    import matplotlib

    matplotlib.get_backend()
    demo.queue(default_concurrency_limit=limits.concurrency, max_size=limits.queue_size)
    # Each request in the app's line holds one of Gradio's threads while it waits: Gradio's 40 stay for the rest.
    streams = demo.csd_app.streams if hasattr(demo, "csd_app") else Counter()
    guard = Middleware(
        Guard, blocks=demo, max_body=limits.max_body_kb * 1024, per_session=limits.per_session, streams=streams
    )
    _, url, _ = demo.launch(
        app_kwargs={"middleware": [guard]},
        max_threads=limits.queue_size + GRADIO_THREADS,
        state_session_capacity=limits.sessions,
        max_file_size=limits.max_body_kb * 1024,
        mcp_server=False,
        server_name=host,
        server_port=port,
        share=share,
        prevent_thread_lock=not block,
        theme=THEME,
        css=CSS,
        footer_links=["api"],
        ssr_mode=False,  # plain client-side rendering: no Node server needed
    )
    return url


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Expected refusals are one line each (demo.errors); real faults keep their tracebacks.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start_up(args)
    kernels.ON_CUDA = head_kernels(args.head_kernels)
    limits = limits_module.from_args(args)
    app = make_app(args.checkpoints, limits, args.hub_repo)
    log = lambda line: print(line, flush=True)
    # The page first, then each pair's timing (each in a GPU call: on ZeroGPU they are granted once the Space is
    # up, docs/space.md): a request on a pair being timed waits for it in the queue and says so, one on a pair
    # timed already runs at once; the page says "measured when this pair is first used" until it is in.
    where = f"ZeroGPU (GPU calls of at most {limits.gpu_seconds:.0f} s)" if zero_gpu() else f"device {DEVICE}"
    where += f", heads {'compiled' if kernels.ON_CUDA.compiled else 'eager'} on CUDA" if DEVICE.type == "cuda" else ""
    for name in app.store.names:  # loaded before the page is served: a visitor's first run does not load its pair
        app.store.get(name)
    committed = [name for name in app.store.names if app.timings.committed(name)]
    log(f"Pairs: {app.store.names}; {where}; committed rates for {committed}; serving, then timing while idle")
    demo = build(app)
    serve(demo, limits, args.host, args.port, args.share, block=False, gradio_env=args.gradio_env)
    app.idle_work(log)
    demo.block_thread()
