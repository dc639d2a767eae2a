"""Gradio demo of continuous speculative decoding: target-only and CSD side by side, the analysis
panels, and the method on one 1-D Gaussian.

    python app.py [--host 127.0.0.1] [--port 7860] [--checkpoints DIR] [--hub-repo REPO]
                  [--max-batch 8] [--max-steps 64] [--max-images 8] [--max-analysis-steps 256]
                  [--max-seconds 75] [--threads 1] [--share]

Settings also come from the environment (``CSD_CHECKPOINTS``, ``CSD_HUB_REPO``, ``CSD_MAX_BATCH``,
``CSD_MAX_STEPS``, ``CSD_MAX_IMAGES``, ``CSD_MAX_ANALYSIS_STEPS``, ``CSD_MAX_SECONDS``, ``CSD_THREADS``);
flags win. Models are loaded once and shared read-only by every request; visitors choose among
the pairs the operator installed and never name a file or a repository. Named API endpoints:
``/generate``, ``/analyze``, ``/toy`` (see ``gradio_client``).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import argparse
import json
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np
import torch

from csd.acceptance import CRITERIA, TRAJECTORY_TERMS
from csd.experiments import defaults, frontier
from csd.experiments.analysis import Analysis, AnalysisSettings, Panels, Run, cost_model, run_csd, run_single
from csd.experiments.inspection import Frame, artifact_hints, inspect_token, replay_frames, token_index
from csd.experiments.jobs import Job, Step, Stopped
from csd.experiments.pairs import EXAMPLE_PROMPTS, RANDOM_SOURCE, ModelPair, PairStore, discover, fetch_official
from csd.family import fixed_num_steps, head_per_block
from csd.models.harmon import MAX_PROMPT_CHARS, check_prompt
from csd.models.schedule import CFG_SCHEDULES
from csd.sampling import SamplingConfig
from csd.speculative import CSDConfig
from csd.toy import speculative_sample, total_variation
from csd.trace import Maker
from visualize.frontier import frontier_chart
from visualize.images import display_grid, legend_html, locate, token_map, upscale
from visualize.panels import analysis_charts, time_breakdown
from visualize.render import to_plotly
from visualize.replay import REPLAY_STYLE, chains_chart, frame_images
from visualize.toy import toy_chart

try:  # Hugging Face ZeroGPU: a GPU is attached only inside functions decorated with spaces.GPU
    import spaces

    on_gpu = spaces.GPU
except ImportError:

    def on_gpu(fn):
        return fn


ROOT = Path(__file__).resolve().parent
PRECOMPUTED = ROOT / "assets" / "analysis_default.json"
FRONTIER = ROOT / "bench" / "results" / "frontier.json"  # python -m csd.experiments.bench --frontier --quick
DEFAULT_CHECKPOINTS = ROOT / "pretrained_models"  # where --hub-repo fetches to without --checkpoints
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRECISION = "bfloat16" if DEVICE.type == "cuda" else "float32"  # backbone precision; heads stay float32
MAX_SEED = 2**31 - 1
# The models are small (64 tokens): a second intra-op thread gains little, while on a CPU shared with
# other work (two cores, a training job) more threads than free cores made generation 20-50x slower.
CPU_THREADS = 1


@dataclass(frozen=True)
class Limits:
    """Serving limits: what one request may ask for."""

    max_batch: int = 8
    max_steps: int = 64
    max_images: int = 8  # images of one analysis recompute
    concurrency: int = 1  # requests that run at once; the rest wait in the queue
    queue_size: int = 16
    # Images x AR steps of one analysis recompute (about 40 runs): 256 took 60-64 s on 2 CPU cores.
    max_analysis_steps: int = 256
    max_seconds: float = 75.0  # a run still going after this long stops at its next AR step, with an error


# --- controls ------------------------------------------------------------------------------------


def _valid_values(component: gr.components.Component) -> str:
    if isinstance(component, gr.Checkbox):
        return "true or false"
    if isinstance(component, gr.Slider | gr.Number):
        if component.precision == 0:
            return f"an integer in [{int(component.minimum)}, {int(component.maximum)}]"
        return f"a number in [{component.minimum:g}, {component.maximum:g}]"
    return "one of " + ", ".join(repr(v) for _, v in component.choices)


def named(component: gr.components.Component) -> gr.components.Component:
    """Gradio's own input checks (ranges, choices) raise errors that do not say which control failed, and
    API callers skip the browser's bounds: make this control's errors name it and its valid values.

    (Wrapping the instance, not subclassing: Gradio writes a .pyi file beside any module that defines a
    component class.)"""
    check = component.preprocess

    def preprocess(payload):
        if isinstance(component, gr.Checkbox) and not isinstance(payload, bool):
            raise gr.Error(f"{component.label} must be true or false, got {payload!r}")
        try:
            return check(payload)
        except (gr.Error, TypeError, ValueError):
            raise gr.Error(f"{component.label} must be {_valid_values(component)}, got {payload!r}") from None

    component.preprocess = preprocess
    return component


@dataclass(frozen=True)
class Control:
    """One setting of a run, declared once: the handlers take it by ``name`` (the API's keyword), the
    page shows ``kind(label=..., value=default, **options)``, and ``field`` says which config it sets
    ("sampling.num_steps", "csd.gamma"; None: the request reads it itself)."""

    label: str
    kind: type[gr.components.Component]
    default: object
    options: dict
    field: str | None = None
    advanced: bool = False

    def component(self) -> gr.components.Component:
        return named(self.kind(label=self.label, value=self.default, **self.options))


INTEGER = {"step": 1, "precision": 0}


def _slider(label: str, default, lo, hi, step=1, field=None, info=None, advanced=False) -> Control:
    """A slider control; an int ``step`` makes it take integers only."""
    options = {"minimum": lo, "maximum": hi, **(INTEGER if isinstance(step, int) else {"step": step})}
    return Control(label, gr.Slider, default, options | ({"info": info} if info else {}), field, advanced)


def _radio(label: str, default, choices, field: str, info=None, advanced=False) -> Control:
    return Control(
        label, gr.Radio, default, {"choices": list(choices)} | ({"info": info} if info else {}), field, advanced
    )


def declare_controls(store: PairStore, limits: Limits) -> dict[str, Control]:
    """Every control of the Generate tab (the Analysis tab reuses them but the batch size), in page order,
    with the default setting (:mod:`csd.experiments.defaults`) within the limits."""
    s, c, first = defaults.SAMPLING, defaults.CSD, store.source(store.names[0])
    class_pair = next((store.source(n) for n in store.names if not store.source(n).is_text), None)
    text_pair = next((store.source(n) for n in store.names if store.source(n).is_text), None)
    class_names = list(first.class_names or (class_pair.class_names if class_pair else ("-",)))
    classes = {"choices": class_names, "allow_custom_value": True, "visible": not first.is_text}  # request checks
    prompt = (text_pair.prompts if text_pair else EXAMPLE_PROMPTS)[0]
    prompt_box = {"visible": first.is_text, "max_lines": 2, "max_length": MAX_PROMPT_CHARS, "elem_id": "prompt"}
    return {
        "pair_name": Control("Model pair", gr.Dropdown, first.name, {"choices": store.names}),
        "class_name": Control("Class", gr.Dropdown, class_names[0], classes),
        "prompt": Control("Prompt", gr.Textbox, prompt, prompt_box | {"info": "for text-conditioned pairs"}),
        "seed": Control("Seed", gr.Number, 0, {"minimum": 0, "maximum": MAX_SEED, "precision": 0}),
        "batch_size": _slider("Batch size", min(defaults.BATCH_SIZE, limits.max_batch), 1, limits.max_batch),
        "ar_steps": _slider(
            "AR steps", min(s.num_steps, limits.max_steps), 1, limits.max_steps, 1, "sampling.num_steps"
        ),
        "gamma": _slider("Draft length gamma", c.gamma, 1, 32, 1, "csd.gamma", "AR steps per target pass"),
        "prefill": _slider(
            "Pre-fill ratio",
            c.prefill,
            0.0,
            0.5,
            0.01,
            "csd.prefill",
            "fraction of tokens the target makes before drafting",
        ),
        "cfg_scale": _slider("CFG scale", s.cfg_scale, 1.0, 10.0, 0.1, "sampling.cfg_scale"),
        "cfg_schedule": _radio("CFG schedule", s.cfg_schedule, CFG_SCHEDULES, "sampling.cfg_schedule"),
        "temperature": _slider("Temperature", s.temperature, 0.1, 2.0, 0.05, "sampling.temperature"),
        "align": Control("Trajectory alignment (shared noise)", gr.Checkbox, c.align, {}, "csd.align"),
        "criterion": _radio(
            "Acceptance criterion",
            c.criterion,
            CRITERIA,
            "csd.criterion",
            "aligned: the paper's approximation; exact: path-space reference",
        ),
        "tau_v": _slider("Verification widening tau_v", c.tau_v, 1.0, 100.0, 0.5, "csd.tau_v", advanced=True),
        "trajectory_term": _radio(
            "Trajectory term",
            c.trajectory_term,
            TRAJECTORY_TERMS,
            "csd.trajectory_term",
            "derived sign, published sign, or none (final-step term only)",
            advanced=True,
        ),
        "resample_widening": _slider(
            "Resample widening",
            c.resample_widening,
            1.0,
            100.0,
            0.5,
            "csd.resample_widening",
            "equal to tau_v makes test and resampling self-consistent",
            advanced=True,
        ),
        "max_tries": _slider("Resampler cap", c.max_tries, 1, 1000, 1, "csd.max_tries", advanced=True),
    }


@contextmanager
def library_errors() -> Iterator[None]:
    """The library names the knob and its range in every ValueError; show it as the app's error."""
    try:
        yield
    except ValueError as err:
        raise gr.Error(f"Invalid setting: {err}") from None


@dataclass(frozen=True)
class Request:
    pair: ModelPair
    labels: list  # one condition per image: class ids, or prompts for a text pair
    seeds: list[int]
    sampling: SamplingConfig
    csd: CSDConfig


def condition_of(r: Request) -> dict:
    """The first image's condition as the analyses take it: ``prompt`` for a text pair, else ``label``."""
    return {"prompt": r.labels[0]} if r.pair.is_text else {"label": r.labels[0]}


@dataclass
class Inspected:
    """The latest Generate run of one visitor, kept in that session's gr.State for the Inspect tab:
    the CSD run with its details and the target-only run with the same seeds."""

    pair_name: str
    csd: Run
    target: Run
    frames: list[Frame]
    hints: list[dict]

    @classmethod
    def of(cls, pair_name: str, spec: Run, target: Run) -> Inspected:
        tokens, target_tokens = spec.generation.tokens, target.generation.tokens
        frames = replay_frames(tokens, spec.trace, target_tokens, target.trace)
        return cls(pair_name, spec, target, frames, artifact_hints(tokens, spec.trace, target_tokens))

    def token(self, image: int, row: int, column: int) -> dict:
        index = token_index(self.csd.trace.num_tokens, row, column)
        return inspect_token(self.csd.generation.tokens, self.csd.trace, self.target.generation.tokens, image, index)


class App:
    """Handlers of the UI and the API. Holds only read-only things: the model store and the limits.
    Nothing a visitor sends names a file, a directory or a repository: pairs are chosen by name among
    those the operator installed before serving."""

    def __init__(self, store: PairStore, limits: Limits, panels: Panels | None = None, front: dict | None = None):
        self.store, self.limits, self.panels, self.front = store, limits, panels, front
        self.controls = declare_controls(store, limits)
        # The latest model runs: status ("done", "stopped", "over time", "error"), AR steps run, seconds.
        self.history: deque[dict] = deque(maxlen=64)

    # --- requests -----------------------------------------------------------------------------

    def request(self, **values) -> Request:
        """Validate the controls (each error names its control and range) and load the pair.
        ``values``: one per control of :func:`declare_controls`, by name."""
        if set(values) != set(self.controls):
            missing, unknown = sorted(set(self.controls) - set(values)), sorted(set(values) - set(self.controls))
            raise gr.Error(f"Controls missing: {missing}; unknown: {unknown}")
        pair_name, class_name = values["pair_name"], values["class_name"]
        if pair_name not in self.store.names:
            raise gr.Error(f"Model pair must be one of {self.store.names}, got {pair_name!r}")
        source = self.store.source(pair_name)
        names = source.class_names
        if not source.is_text and class_name not in names:
            raise gr.Error(
                f"Class must be one of the {len(names)} classes of {pair_name} ({names[0]}, ...), got {class_name!r}"
            )
        if source.is_text:
            try:
                check_prompt(values["prompt"])
            except ValueError as err:
                raise gr.Error(str(err).capitalize()) from None
        if not isinstance(values["align"], bool):
            raise gr.Error(f"{self.controls['align'].label} must be true or false, got {values['align']!r}")
        fields = {"sampling": {"precision": PRECISION}, "csd": {}}
        for name, control in self.controls.items():
            if control.field is not None:
                config, field = control.field.split(".")
                fields[config][field] = values[name]
        with library_errors():
            sampling, csd = SamplingConfig(**fields["sampling"]), CSDConfig(**fields["csd"])
        try:
            pair = self.store.get(pair_name)
        except (OSError, ValueError) as err:  # missing or mismatched checkpoint files
            raise gr.Error(f"Model pair {pair_name!r} could not be loaded: {err}") from None
        if source.cells and (sampling.num_steps != source.cells or sampling.cfg_schedule != "linear"):
            raise gr.Error(
                f"AR steps must be {source.cells} for {pair_name} (xAR makes one cell per AR step) and the CFG "
                f"schedule 'linear' (its ramp over the cells), got {sampling.num_steps} and {sampling.cfg_schedule!r}"
            )
        if sampling.num_steps > pair.num_tokens:
            raise gr.Error(
                f"AR steps must be in [1, {pair.num_tokens}] (the tokens of {pair_name}), got {sampling.num_steps}"
            )
        seed, batch = values["seed"], values["batch_size"]
        if pair.is_text:
            unknown = pair.target.tokenizer.unknown(values["prompt"])
            if unknown:
                words = ", ".join(pair.target.tokenizer.words)
                raise gr.Error(
                    f"Prompt words {unknown} are not in the vocabulary of {pair_name}; it knows only these "
                    f"{len(pair.target.tokenizer.words)} words (its captions): {words}"
                )
            conditions = [values["prompt"]] * batch
        else:
            conditions = [names.index(class_name)] * batch
        return Request(pair, conditions, [seed + i for i in range(batch)], sampling, csd)

    def job(self, work) -> Job:
        """A model run for one request: progress per AR step, stopped by Stop or the time limit."""
        return Job(work, time_limit=self.limits.max_seconds)

    def follow(self, job: Job, runs: list[str], progress) -> Iterator[object]:
        """Iterate ``job``: report each AR step to ``progress`` (phase in the label, the bar across
        ``runs``) and pass on the values it posts; always stop the job on the way out (Stop closes
        this generator), and turn its errors into the app's errors."""
        t0, status = time.perf_counter(), "stopped"  # stays so when Stop closes this generator
        try:
            for event in job:
                if isinstance(event, Step):
                    i = runs.index(event.label) if event.label in runs else 0
                    progress((i * event.total + event.done, len(runs) * event.total), desc=event.text, unit="steps")
                yield event
            status = "done"
        except Stopped as err:
            status = "over time" if err.over_time else "stopped"
            if err.over_time:
                raise gr.Error(
                    f"This request {err} per request (--max-seconds, CSD_MAX_SECONDS): "
                    "ask for fewer images, AR steps or a smaller resampler cap"
                ) from None
            raise gr.Error("Stopped.") from None
        except ValueError as err:
            status = "error"
            raise gr.Error(f"Invalid setting: {err}") from None
        finally:
            job.stop()
            self.history.append({"status": status, "steps": job.steps, "seconds": time.perf_counter() - t0})

    def generate(self, progress=gr.Progress(), **controls):  # noqa: B008 (Gradio's documented pattern)
        """Target-only, then CSD, then draft-only with the same seeds. Yields a status line per AR step
        and each image as it is ready; the last message carries every output.

        ``controls`` are the keyword arguments of :meth:`request`."""
        r = self.request(**controls)
        skip = gr.skip()
        runs = ["target-only", "CSD", "draft-only"]

        def work(job: Job) -> tuple[Run, Run, Run]:
            target = run_single(r.pair, r.labels, r.seeds, r.sampling, on_step=job.on_step(runs[0]))
            job.post(("target", _grid(r.pair, target)))
            spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, job.on_step(runs[1]), keep_details=True)
            csd_images = r.pair.images(spec.generation.tokens).numpy()
            job.post(("csd", display_grid(csd_images), token_map(csd_images, spec.trace.maker)))
            draft = run_single(r.pair, r.labels, r.seeds, r.sampling, Maker.DRAFT, on_step=job.on_step(runs[2]))
            return target, spec, draft

        # Clear the outputs of any earlier run first: what is on screen is always from this run.
        yield None, None, None, None, "Starting ...", None, None, None
        job = self.job(work)
        images = {}
        for event in self.follow(job, runs, progress):
            if isinstance(event, Step):
                yield skip, skip, skip, skip, f"Running {event.text} ...", skip, skip, skip
            elif event[0] == "target":
                images["target"] = event[1]
                yield event[1], skip, skip, skip, skip, skip, skip, skip
            else:
                images["csd"], images["map"] = event[1], event[2]
                yield skip, event[1], event[2], skip, skip, skip, skip, skip
        target, spec, draft = job.result
        summary = run_summary(r, target, spec, draft)
        yield (
            images["target"],
            images["csd"],
            images["map"],
            _grid(r.pair, draft),
            stats_markdown(summary),
            speed_figure(target, spec, draft, summary),
            summary,
            Inspected.of(r.pair.name, spec, target),
        )

    @staticmethod
    def generate_stopped():
        """What Stop shows on the Generate tab: nothing of the stopped run (and nothing to inspect)."""
        return None, None, None, None, "Stopped: the run was cancelled, and nothing from it is shown.", None, None, None

    # --- inspect tab --------------------------------------------------------------------------

    def replay(self, run: Inspected | None, frame: int):
        """Frame ``frame`` of the session's latest run: its label, the CSD canvas, its status map and the
        target-only canvas after as many AR steps."""
        if run is None:
            return "Press **Generate** first: the latest run of this page is replayed here.", None, None, None
        if not isinstance(frame, int) or not 0 <= frame < len(run.frames):
            raise gr.Error(f"Frame must be an integer in [0, {len(run.frames) - 1}], got {frame!r}")
        f = run.frames[frame]
        decode = lambda tokens: self.store.get(run.pair_name).images(tokens).numpy()
        csd, status, target = frame_images(f, decode)
        label = f"**Frame {frame + 1} of {len(run.frames)}:** {f.label} ({f.ar_steps} AR steps made)"
        return label, csd, status, target

    def show_token(self, run: Inspected | None, image: int, row: int, column: int):
        """The token at (row, column) of image ``image``: a summary, the candidate values as patches in
        the image, both chains' transitions, and every number as JSON."""
        if run is None:
            return "Press **Generate** first.", None, None, None
        try:
            info = run.token(image, row, column)
        except ValueError as err:
            raise gr.Error(f"Invalid token: {err}") from None
        pair = self.store.get(run.pair_name)
        return token_markdown(info), token_patches(pair, run, info), to_plotly(chains_chart(info)), info

    def select_on_map(self, run: Inspected | None, evt: gr.SelectData):
        """A click on the status map -> (image, row, column) of the token under it."""
        if run is None:
            raise gr.Error("Press **Generate** first.")
        x, y = evt.index
        trace = run.csd.trace
        size = self.store.get(run.pair_name).images(run.csd.generation.tokens[:1]).shape[1]
        return locate(int(x), int(y), trace.batch, trace.num_tokens, size)

    def after_run(self, run: Inspected | None):
        """Once a Generate run is in: the frame slider over its frames at the last one, the hints table, the
        last frame and the top hint opened in the inspector."""
        if run is None:
            return gr.update(maximum=1, value=0), None, *self.replay(None, 0), *self.show_token(None, 0, 0, 0)
        last, top = len(run.frames) - 1, run.hints[0]
        table = [
            [h["image"], h["row"], h["column"], round(h["distance"], 3), h["maker"], h["ar_step"] + 1]
            for h in run.hints
        ]
        return (
            gr.update(maximum=last, value=last),
            table,
            *self.replay(run, last),
            *self.show_token(run, top["image"], top["row"], top["column"]),
        )

    @staticmethod
    def select_hint(run: Inspected | None, evt: gr.SelectData):
        if run is None:
            raise gr.Error("Press **Generate** first.")
        hint = run.hints[evt.index[0]]
        return hint["image"], hint["row"], hint["column"]

    def inspect_api(self, image: int, row: int, column: int, progress=gr.Progress(), **controls):  # noqa: B008
        """For API clients: run target-only and CSD with the given controls and seeds, then return the
        replay (each frame's label, AR steps and per-token status), the token's inspection and the hints."""
        r = self.request(**controls)

        def work(job: Job) -> Inspected:
            target = run_single(r.pair, r.labels, r.seeds, r.sampling, on_step=job.on_step("target-only"))
            spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, job.on_step("CSD"), keep_details=True)
            return Inspected.of(r.pair.name, spec, target)

        job = self.job(work)
        for _ in self.follow(job, ["target-only", "CSD"], progress):
            pass
        run = job.result
        try:
            token = run.token(image, row, column)
        except ValueError as err:
            raise gr.Error(f"Invalid token: {err}") from None
        frames = [{"label": f.label, "ar_steps": f.ar_steps, "status": f.status.tolist()} for f in run.frames]
        return {"frames": frames, "token": token, "hints": run.hints}

    # --- analysis tab -------------------------------------------------------------------------

    def analyze(self, n_images: int, progress=gr.Progress(), **controls):  # noqa: B008
        """Recompute every analysis panel over ``n_images`` images (image i: seed + i) at the current controls.
        The panels on screen change only when every run has finished."""
        r = self.request(**controls, batch_size=1)
        work = n_images * r.sampling.num_steps
        if work > self.limits.max_analysis_steps:
            raise gr.Error(
                f"Images (n) x AR steps must be at most {self.limits.max_analysis_steps} on this server "
                f"(--max-analysis-steps, CSD_MAX_ANALYSIS_STEPS), got {n_images} x {r.sampling.num_steps} = {work}: "
                "ask for fewer images or AR steps"
            )
        settings = AnalysisSettings(
            n_images=n_images, seed=r.seeds[0], sampling=r.sampling, csd=r.csd, **condition_of(r)
        )
        analysis = Analysis(r.pair, settings)
        panels = yield from self.run_all(analysis, analysis.panels, len(ANALYSIS_KEYS) + 1, progress)
        yield analysis_status(panels, recomputed=True), *analysis_figures(panels), panels_json(panels)

    def run_all(self, runs, finish, skipped: int, progress):
        """Run ``runs.steps()`` (one generation each) in a stoppable job, yielding a status line (the run
        within the runs, the AR step within the run) with ``skipped`` outputs left as they are; returns
        ``finish()``, computed in the job once every run is done."""

        def work(job: Job):
            for done, total, label in runs.steps(on_step=lambda label: job.on_step(label)):
                job.post((done, total, label))
            return finish()

        run, skips = (0, len(runs), ""), [gr.skip()] * skipped
        job = self.job(work)
        for event in self.follow(job, [], lambda *args, **kwargs: None):
            if isinstance(event, Step):
                done, total, _ = run
                progress((done * event.total + event.done, total * event.total), desc=event.text, unit="steps")
                yield f"Running {done + 1}/{total}: {event.text} ...", *skips
            else:
                run = event
        return job.result

    @staticmethod
    def analyze_stopped() -> str:
        return "Stopped: the recompute was cancelled; the panels below are the ones shown before it."

    def recompute_frontier(self, n_images: int, progress=gr.Progress(), **controls):  # noqa: B008
        """Every cheap alternative (target-only with fewer AR or head steps, a head schedule, CSD settings
        and combinations) around the current controls, over ``n_images`` images, one run per setting."""
        r = self.request(**controls, batch_size=1)
        work, most = n_images * r.sampling.num_steps, self.limits.max_analysis_steps // 2
        if work > most:
            raise gr.Error(
                f"Images (n) x AR steps of the frontier must be at most {most} on this server (half of "
                f"--max-analysis-steps, CSD_MAX_ANALYSIS_STEPS: it runs 14 settings), got "
                f"{n_images} x {r.sampling.num_steps} = {work}: ask for fewer images or AR steps"
            )
        fixed = fixed_num_steps(r.pair.target) is not None  # xAR: one AR step per cell
        head = r.pair.target.head_steps(r.sampling.head_steps)
        points = frontier.grid(r.sampling, r.csd, head, quick=True, fixed_steps=fixed)
        small = frontier.SmallFrontier(r.pair, points, n_images, seed=r.seeds[0], **condition_of(r))
        result = yield from self.run_all(small, small.result, 3, progress)
        yield frontier_status(result, recomputed=True), *frontier_outputs(result)

    @staticmethod
    def frontier_stopped() -> str:
        return "Stopped: the recompute was cancelled; the frontier below is the one shown before it."

    # --- toy ----------------------------------------------------------------------------------

    def toy(self, target_mean: float, target_std: float, draft_mean: float, draft_std: float, samples: int, seed: int):
        p, q = (target_mean, target_std), (draft_mean, draft_std)
        with library_errors():
            result = speculative_sample(p, q, samples, seed)
        z = total_variation(p, q)
        summary = {
            "acceptance": result.acceptance,
            "one_minus_tv": 1.0 - z,
            "mean_tries": _json_float(result.mean_tries),
            "inverse_z": _json_float(1.0 / z if z > 0 else float("inf")),
            "capped": int(result.capped.sum()),
        }
        tries = "none needed" if summary["mean_tries"] is None else f"{result.mean_tries:.2f}"
        inv_z = "inf" if summary["inverse_z"] is None else f"{1 / z:.2f}"
        stats = (
            f"| | measured | theory |\n|---|---|---|\n"
            f"| acceptance | {result.acceptance:.3f} | 1 - TV(p, q) = {1 - z:.3f} |\n"
            f"| resampler tries per rejection | {tries} | 1 / Z = {inv_z} |\n"
        )
        note = f"{samples} samples: acceptance {result.acceptance:.3f} vs 1 - TV = {1 - z:.3f}"
        return to_plotly(toy_chart(p, q, result.samples, note=note)), stats, summary

    def default_controls(self) -> dict:
        """Keyword arguments of :meth:`request` for the default setting, within the limits."""
        return {name: control.default for name, control in self.controls.items()}

    @staticmethod
    def pick_example(sample: list) -> str:
        return sample[0]

    def classes(self, pair_name: str):
        """The class choice for a class-conditional pair, the prompt (and its examples) for a text pair;
        an xAR pair's fixed AR steps (one per cell) and CFG ramp."""
        source = self.store.source(pair_name)
        steps = gr.update(value=source.cells) if source.cells else gr.update()
        schedule = gr.update(value="linear") if source.cells else gr.update()
        if source.is_text:
            return gr.update(visible=False), gr.update(visible=True), gr.update(visible=True), steps, schedule
        names = list(source.class_names)
        shown = gr.update(choices=names, value=names[0], visible=True)
        return shown, gr.update(visible=False), gr.update(visible=False), steps, schedule


# --- presentation ------------------------------------------------------------------------------


def _grid(pair: ModelPair, run: Run) -> np.ndarray:
    return display_grid(pair.images(run.generation.tokens).numpy())


def _json_float(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def run_summary(r: Request, target: Run, spec: Run, draft: Run) -> dict:
    """The numbers of one comparison, JSON-ready (the API's last output)."""
    t = spec.trace
    model, bound = cost_model(target.trace, draft.trace, r.csd, head_per_block(r.pair.target))
    return {
        "pair": r.pair.name,
        "batch_size": len(r.seeds),
        "seconds": {"target-only": target.seconds, "CSD": spec.seconds, "draft-only": draft.seconds},
        "speedup": target.seconds / spec.seconds,
        "cost_model_speedup": _json_float(model),
        "bound": _json_float(bound),
        "target_passes": {"target-only": target.trace.target_passes, "CSD": t.target_passes, "draft-only": 0},
        "draft_passes": {"target-only": 0, "CSD": t.draft_passes, "draft-only": draft.trace.draft_passes},
        "acceptance_rate": _json_float(t.acceptance_rate),
        "unit": "cells" if fixed_num_steps(r.pair.target) is not None else "tokens",  # what a drafted row is
        "tokens": {
            k: t.count(m)
            for k, m in (
                ("prefill", Maker.PREFILL),
                ("accepted", Maker.ACCEPTED),
                ("resampled", Maker.RESAMPLED),
                ("capped", Maker.CAPPED),
            )
        },
    }


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def stats_markdown(s: dict) -> str:
    sec, tp, dp, tok = s["seconds"], s["target_passes"], s["draft_passes"], s["tokens"]
    drafted = tok["accepted"] + tok["resampled"] + tok["capped"]
    unit = s.get("unit", "tokens")
    passes = "passes" if unit == "tokens" else "passes (a flow chain each)"
    bound = "n/a" if s["bound"] is None else f"{s['bound']:.2f}x"
    model = "n/a" if s["cost_model_speedup"] is None else f"{s['cost_model_speedup']:.2f}x"
    return (
        f"### Speedup {s['speedup']:.2f}x &nbsp;·&nbsp; acceptance {_pct(s['acceptance_rate'])}\n\n"
        "| | target-only | CSD | draft-only |\n|---|---|---|---|\n"
        f"| wall time | {sec['target-only']:.2f} s | {sec['CSD']:.2f} s | {sec['draft-only']:.2f} s |\n"
        f"| target backbone {passes} | {tp['target-only']} | {tp['CSD']} | 0 |\n"
        f"| draft backbone {passes} | 0 | {dp['CSD']} | {dp['draft-only']} |\n\n"
        f"{tok['accepted']} of {drafted} drafted {unit} accepted, {tok['resampled']} resampled, "
        f"{tok['capped']} hit the resampler cap; {tok['prefill']} pre-filled by the target. "
        f"Cost model with the measured per-step costs: {model}; heads-free bound C_p / (C_q + C_p / gamma): {bound}. "
        "With block verification the target's passes do not depend on acceptance: speed comes from gamma "
        "and the cost ratio of the two models."
    )


def speed_figure(target: Run, spec: Run, draft: Run, summary: dict):
    runs = {"target-only": target, "CSD": spec, "draft-only": draft}
    title = f"Speedup {summary['speedup']:.2f}x: where the time goes"
    note = ", ".join(f"{name} {run.seconds:.2f} s" for name, run in runs.items())
    phases = {name: run.trace.times for name, run in runs.items()}
    return to_plotly(time_breakdown(phases, title, f"wall: {note}", {name: run.seconds for name, run in runs.items()}))


def _fmt(v, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def token_markdown(t: dict) -> str:
    """The inspector's summary of one token (:func:`csd.experiments.inspection.inspect_token`)."""
    verdict = {
        "prefill": "made by the target before drafting began (pre-fill)",
        "accepted": "proposed by the draft and **accepted**",
        "resampled": f"proposed by the draft, **rejected** and redrawn from max(0, p - q) in {t['resample_tries']} "
        "tries",
        "capped": f"proposed by the draft, rejected, and the resampler hit its cap ({t['resample_tries']} tries): "
        "the target's own sample was taken",
    }.get(t["maker"], t["maker"])
    lines = [
        f"### Image {t['image']}, token ({t['row']}, {t['column']}): {verdict}",
        f"AR step {t['ar_step'] + 1}" + (f", block {t['block'] + 1}" if t["block"] >= 0 else ""),
        "",
        "| | value |",
        "| --- | --- |",
        f"| draft-target distance (shared noise) | {_fmt(t.get('distance_draft_target'))} |",
        f"| distance to the target-only image here | {_fmt(t['distance_to_target_only'])} |",
    ]
    if t["maker"] != "prefill":
        lines += [
            f"| acceptance probability min(1, r) | {_fmt(t['accept_prob'])} |",
            f"| log r: trajectory term | {_fmt(t['log_ratio_trajectory'], '.2f')} |",
            f"| log r: final-step term | {_fmt(t['log_ratio_final'], '.2f')} |",
            f"| the draw u it was compared with (accept if u < min(1, r)) | {_fmt(t.get('accept_draw'))} |",
        ]
    return "\n".join(lines)


def token_patches(pair: ModelPair, run: Inspected, t: dict) -> np.ndarray:
    """The token's neighbourhood in the final CSD image with the token set to each candidate: the draft's
    proposal, the target's own sample, the final value and the target-only run's value."""
    tokens = run.csd.generation.tokens[t["image"] : t["image"] + 1]
    variants = [v for v in ("draft", "target", "final", "target_only") if t.get(v) and None not in t[v]]
    batch = tokens.repeat(len(variants), 1, 1)
    for i, name in enumerate(variants):
        batch[i, t["index"]] = torch.tensor(t[name])
    images = pair.images(batch).numpy()  # (k, H, W, 3)
    side, grid = images.shape[1], math.isqrt(tokens.shape[1])
    cell = side // grid
    r0, c0 = max(0, (t["row"] - 1) * cell), max(0, (t["column"] - 1) * cell)
    crops = images[:, r0 : r0 + 3 * cell, c0 : c0 + 3 * cell]
    crops = upscale(crops, max(1, 96 // crops.shape[1]))
    pad = np.full((crops.shape[1], 8, 3), 255, dtype=np.uint8)
    return np.concatenate([x for crop in crops for x in (crop, pad)][:-1], axis=1)


ANALYSIS_KEYS = (
    "distance_per_step",
    "distance_overall",
    "acceptance_per_step",
    "resampler_tries",
    "resampler_vs_gamma",
    "acceptance_vs_gamma",
    "acceptance_vs_cfg",
    "acceptance_vs_temperature",
    "log_ratio_split",
    "time",
)


def analysis_figures(panels: Panels | None) -> list:
    if panels is None:
        return [None] * len(ANALYSIS_KEYS)
    charts = analysis_charts(panels)
    return [to_plotly(charts[k]) for k in ANALYSIS_KEYS]


def analysis_status(panels: Panels | None, recomputed: bool = False, current_weights: str | None = None) -> str:
    if panels is None:
        return "No precomputed panels for this model pair: press **Recompute** to compute them."
    s = panels.settings
    sampling, csd = s["sampling"], s["csd"]
    what = "Recomputed" if recomputed else "Precomputed (default setting)"
    text = (
        f"**{what}** on *{panels.pair}* over {panels.n_images} images: {sampling['num_steps']} AR steps, "
        f"gamma {csd['gamma']}, pre-fill {100 * csd['prefill']:g}%, CFG {sampling['cfg_scale']:g} "
        f"({sampling['cfg_schedule']}), temperature {sampling['temperature']:g}, tau_v {csd['tau_v']:g}, "
        f"criterion {csd['criterion']}, trajectory term {csd['trajectory_term']}."
    )
    if current_weights is not None and current_weights != panels.weights:
        text += (
            f"\n\n**Warning:** computed with other weights ({panels.weights}) than the models served now "
            f"({current_weights}): press **Recompute**, or regenerate the file with "
            "`python -m csd.experiments.analysis`."
        )
    return text


def panels_json(panels: Panels | None) -> dict | None:
    return None if panels is None else json.loads(panels.to_json())


def frontier_status(result: dict | None, recomputed: bool = False, pair: str | None = None) -> str:
    if result is None:
        return "No precomputed frontier for these models: press **Recompute frontier**."
    steps = result["rows"][0]["sampling"]["num_steps"]
    what = "Recomputed" if recomputed else "Precomputed (default setting, `python -m csd.experiments.bench --frontier`)"
    key = frontier.result_metrics(result)[0]
    on = [r["name"] for r in result["rows"] if r["method"] == "CSD" and r[f"front_{key}"]]
    verdict = (
        f"CSD on the front ({frontier.METRICS[key][0]}): {', '.join(on)}."
        if on
        else (f"No CSD setting is on the front ({frontier.METRICS[key][0]}).")
    )
    name = result.get("pair", pair)
    where = f" on *{name}*" if name else ""
    return (
        f"**{what}**{where}: {len(result['rows'])} settings around {steps} AR steps, "
        f"{result['n']} images each; time: {result['timing']}. {verdict}"
    )


def frontier_outputs(result: dict | None) -> list:
    """The frontier's plot, table and JSON."""
    if result is None:
        return [None, "", None]
    return [to_plotly(frontier_chart(result)), frontier.frontier_markdown(result), result]


def precomputed_frontier(path: Path, store: PairStore) -> dict | None:
    """The benchmark's frontier, when it was measured on a pair this server serves (same weights)."""
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    for name in store.names:
        if store.source(name).weights == result.get("weights"):
            return result | {"pair": name}
    return None


HOW_IT_WORKS = ROOT / "docs" / "how_it_works.md"  # the "How it works" tab


# --- layout --------------------------------------------------------------------------------------

CSS = """
.csd-img img { image-rendering: pixelated; }
.csd-legend { font-size: 0.9em; margin-top: -6px; }
"""
# System fonts: the default theme would fetch web fonts, and the app must work offline.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def prompt_examples(app: App, prompt: gr.Textbox) -> gr.Dataset:
    """Example prompts one click away: the first text pair's."""
    text = [app.store.source(n) for n in app.store.names if app.store.source(n).is_text]
    first = app.store.source(app.store.names[0])
    examples = gr.Dataset(
        components=[gr.Textbox(visible=False)],
        samples=[[p] for p in (text[0].prompts if text else EXAMPLE_PROMPTS)],
        label="Example prompts",
        visible=first.is_text,
        elem_id="prompt-examples",
    )
    examples.click(App.pick_example, examples, prompt, api_visibility="private")
    return examples


def generate_tab(app: App, queue: dict):
    """Controls, the three runs side by side, Stop. Returns the controls (the Analysis tab reads them),
    the session's latest run (the Inspect tab reads it) and the Generate event."""
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            controls = {}
            for name, c in app.controls.items():
                if c.advanced:
                    continue
                controls[name] = c.component()
                if name == "prompt":
                    examples = prompt_examples(app, controls[name])
            with gr.Accordion("Advanced", open=False):
                controls |= {name: c.component() for name, c in app.controls.items() if c.advanced}
            with gr.Row():
                run = gr.Button("Generate", variant="primary")
                stop = gr.Button("Stop")
        with gr.Column(scale=3):
            img = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False}
            with gr.Row():
                target = gr.Image(elem_id="img-target", label="Target only", **img)
                csd = gr.Image(elem_id="img-csd", label="Speculative (CSD)", **img)
            with gr.Row():
                token_map = gr.Image(elem_id="img-map", label="Accepted-token map (CSD)", **img)
                draft = gr.Image(elem_id="img-draft", label="Draft only (same seeds)", **img)
            gr.HTML(legend_html())
            stats = gr.Markdown(
                "Press **Generate**: target-only, CSD and draft-only run with the same seeds.", elem_id="gen-status"
            )
            speed = gr.Plot(label="Speedup", elem_id="speed-plot")
            with gr.Accordion("Run summary (JSON)", open=False):
                summary = gr.JSON()
    inspected = gr.State(None)  # this visitor's latest run, for the Inspect tab
    outputs = [target, csd, token_map, draft, stats, speed, summary, inspected]
    event = run.click(on_gpu(app.generate), inputs_kwargs=controls, outputs=outputs, api_name="generate", **queue)
    # Cancel first, then say so: a message the run had already sent cannot overwrite "Stopped".
    stopped = stop.click(None, None, None, cancels=[event], api_visibility="private")
    stopped.then(app.generate_stopped, None, outputs, api_visibility="private")
    pair = controls["pair_name"]
    shown = [controls["class_name"], controls["prompt"], examples, controls["ar_steps"], controls["cfg_schedule"]]
    pair.change(app.classes, pair, shown, api_visibility="private")
    with gr.Accordion("Official checkpoints", open=False):
        gr.Markdown(
            "Official pairs are offered when the operator starts the server with `--checkpoints DIR` holding "
            "the official files beside `vae/kl16.ckpt`: MAR-H or MAR-L drafted by MAR-B "
            "(`mar/mar_base/checkpoint-last.pth`, ...; `--hub-repo REPO` fetches that layout before serving), "
            "xAR-H or xAR-L drafted by xAR-B (`xar/xAR-B.pth`, ...), Harmon-1.5B drafted by Harmon-0.5B "
            "(`harmon/`, see docs/families.md). "
            f"This server has: {', '.join(app.store.names)}."
        )
    return controls, inspected, event


ANALYSIS_SECTIONS = (  # (title, panels in the row), in the order of ANALYSIS_KEYS
    ("(a) Draft-target distance with and without alignment", 2),
    ("(b) Acceptance per AR step under pre-fill", 1),
    ("(c) Resampler", 2),
    ("Acceptance vs draft length, CFG scale, temperature", 3),
    ("The split of log r", 1),
    ("Where the time goes", 1),
)


def analysis_tab(app: App, controls: dict[str, gr.components.Component], queue: dict) -> None:
    """The panels, precomputed for the default setting, recomputed for the Generate tab's controls."""
    served_weights = app.store.source(app.panels.pair).weights if app.panels is not None else None
    status = gr.Markdown(analysis_status(app.panels, current_weights=served_weights))
    gr.Markdown(
        "Panels over *n* images (image *i*: seed + i, class + i) at the current Generate-tab controls; "
        "each sweep varies one knob around them. Recomputing takes a few dozen runs."
    )
    with gr.Row():
        lim = app.limits
        n_default = min(AnalysisSettings.n_images, lim.max_images)
        n_images = _slider("Images (n)", n_default, 1, lim.max_images).component()
        recompute = gr.Button("Recompute for current controls", variant="primary")
        stop = gr.Button("Stop")
    figures, plots = iter(analysis_figures(app.panels)), []
    for title, count in ANALYSIS_SECTIONS:
        gr.Markdown(f"#### {title}")
        with gr.Row():
            for _ in range(count):
                key = ANALYSIS_KEYS[len(plots)]
                plots.append(gr.Plot(next(figures), show_label=False, elem_id=f"panel-{key}"))
    with gr.Accordion("Panel data (JSON)", open=False):
        data = gr.JSON(panels_json(app.panels))
    # One image per seed: the batch size plays no role in the analysis.
    inputs = {name: c for name, c in controls.items() if name != "batch_size"} | {"n_images": n_images}
    outputs = [status, *plots, data]
    event = recompute.click(on_gpu(app.analyze), inputs_kwargs=inputs, outputs=outputs, api_name="analyze", **queue)
    stop.click(None, None, None, cancels=[event], api_visibility="private").then(
        app.analyze_stopped, None, status, api_visibility="private"
    )
    frontier_section(app, inputs, queue)


def frontier_section(app: App, inputs: dict, queue: dict) -> None:
    """Quality against time for every cheap alternative of the current family: the benchmark's run for
    the default setting, or a recompute at a few images for the current controls."""
    gr.Markdown("#### Quality vs time: CSD among the cheap alternatives")
    gr.Markdown(
        "Target-only with fewer AR steps, fewer head steps or a head-step schedule, CSD at several draft "
        "lengths, tests and pre-fills, and their combinations, at the current controls. Time is a ratio to "
        "target-only measured in the same run; the dashed line is the Pareto front (nothing is both faster "
        "and better). Hover a point for its setting. A recompute runs each setting once over *n* images: "
        "its error bars are wide, the benchmark's (hundreds of images) are not."
    )
    status = gr.Markdown(frontier_status(app.front), elem_id="frontier-status")
    with gr.Row():
        lim = app.limits
        n_images = _slider("Images (n) for the frontier", min(4, lim.max_images), 1, lim.max_images).component()
        n_images.elem_id = "frontier-n"
        recompute = gr.Button("Recompute frontier", variant="primary")
        stop = gr.Button("Stop")
    chart, table, data = frontier_outputs(app.front)
    plot = gr.Plot(chart, show_label=False, elem_id="panel-frontier")
    with gr.Accordion("Frontier table", open=False):
        table = gr.Markdown(table, elem_id="frontier-table")
    with gr.Accordion("Frontier data (JSON)", open=False):
        data = gr.JSON(data)
    outputs = [status, plot, table, data]
    inputs = {k: v for k, v in inputs.items() if k != "n_images"} | {"n_images": n_images}
    event = recompute.click(
        on_gpu(app.recompute_frontier), inputs_kwargs=inputs, outputs=outputs, api_name="frontier", **queue
    )
    stop.click(None, None, None, cancels=[event], api_visibility="private").then(
        app.frontier_stopped, None, status, api_visibility="private"
    )


def inspect_tab(app: App, controls: dict, inspected: gr.State, generated, queue: dict) -> None:
    """The latest run replayed block by block, a token inspector and the likely artifacts."""
    gr.Markdown(
        "The latest **Generate** run of this page, replayed: the CSD canvas after each pre-fill step, each "
        "drafted block (the draft's proposal, orange) and each verification, beside the target-only canvas "
        "after as many AR steps. Click a token on the status map, pick a row of the table, or type its position."
    )
    label = gr.Markdown(
        "Press **Generate** first: the latest run of this page is replayed here.", elem_id="replay-label"
    )
    frame = named(gr.Slider(0, 1, value=0, step=1, precision=0, label="Frame"))
    img = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False}
    with gr.Row():
        canvas = gr.Image(elem_id="replay-csd", label="CSD canvas", **img)
        status = gr.Image(elem_id="replay-map", label="Status (click a token)", **img)
        target = gr.Image(elem_id="replay-target", label="Target only, same AR steps", **img)
    gr.HTML(legend_html(REPLAY_STYLE))
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            position = {
                "image": named(gr.Number(value=0, minimum=0, precision=0, label="Image")),
                "row": named(gr.Number(value=0, minimum=0, precision=0, label="Token row")),
                "column": named(gr.Number(value=0, minimum=0, precision=0, label="Token column")),
            }
            open_token = gr.Button("Open token")
            hints = gr.Dataframe(
                headers=["image", "row", "column", "distance", "maker", "AR step"],
                label="Likely artifacts: tokens farthest from the target-only image",
                interactive=False,
                elem_id="hints",
            )
        with gr.Column(scale=2):
            token = gr.Markdown(elem_id="token-summary")
            patches = gr.Image(label="Draft / target / final / target-only, in place", elem_id="token-patches", **img)
            chains = gr.Plot(show_label=False, elem_id="token-chains")
            with gr.Accordion("Token data (JSON)", open=False):
                data = gr.JSON()
    shown, opened = [label, canvas, status, target], [token, patches, chains, data]
    where = list(position.values())
    generated.then(app.after_run, inspected, [frame, hints, *shown, *opened], api_visibility="private")
    frame.release(app.replay, [inspected, frame], shown, api_visibility="private")
    open_token.click(app.show_token, [inspected, *where], opened, api_visibility="private")
    status.select(app.select_on_map, inspected, where, api_visibility="private").then(
        app.show_token, [inspected, *where], opened, api_visibility="private"
    )
    hints.select(app.select_hint, inspected, where, api_visibility="private").then(
        app.show_token, [inspected, *where], opened, api_visibility="private"
    )
    # For API clients: the same, from the run's settings (the run is made again with the same seeds).
    api = gr.Button(visible=False)
    api_out = gr.JSON(visible=False)
    api_inputs = {**controls, **position}
    api.click(on_gpu(app.inspect_api), inputs_kwargs=api_inputs, outputs=api_out, api_name="inspect", **queue)


def how_it_works_tab(app: App) -> None:
    """The method in words and formulas, and the 1-D toy."""
    gr.Markdown(HOW_IT_WORKS.read_text(), latex_delimiters=LATEX)
    gr.Markdown("### Try it on one Gaussian token", latex_delimiters=LATEX)
    slider = lambda label, value, lo, hi, step: named(gr.Slider(lo, hi, value=value, step=step, label=label))
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            inputs = [
                slider("Target p mean", 0.0, -5.0, 5.0, 0.1),
                slider("Target p std", 1.0, 0.1, 5.0, 0.05),
                slider("Draft q mean", 1.0, -5.0, 5.0, 0.1),
                slider("Draft q std", 1.5, 0.1, 5.0, 0.05),
                named(gr.Slider(100, 200_000, value=20_000, step=100, precision=0, label="Samples N")),
                named(gr.Number(value=0, minimum=0, maximum=MAX_SEED, precision=0, label="Seed")),
            ]
            sample = gr.Button("Sample", variant="primary")
        with gr.Column(scale=2):
            plot, stats, summary = app.toy(0.0, 1.0, 1.0, 1.5, 20_000, 0)
            outputs = [gr.Plot(plot, show_label=False), gr.Markdown(stats), gr.JSON(summary, label="Toy summary")]
    gr.on([sample.click] + [x.release for x in inputs[:4]], app.toy, inputs, outputs, api_name="toy")


def build(app: App) -> gr.Blocks:
    # Generation and analysis share one queue slot group: at most `concurrency` model runs at once.
    queue = {"concurrency_id": "models", "concurrency_limit": app.limits.concurrency}
    with gr.Blocks(title="Continuous speculative decoding") as demo:
        gr.Markdown(
            "# Continuous speculative decoding\nA small *draft* model proposes image tokens, a large *target* "
            "model verifies them in one pass. Same seed, same noise: compare target-only and CSD side by side."
        )
        with gr.Tab("Generate"):
            controls, inspected, generated = generate_tab(app, queue)
        with gr.Tab("Inspect"):
            inspect_tab(app, controls, inspected, generated, queue)
        with gr.Tab("Analysis"):
            analysis_tab(app, controls, queue)
        with gr.Tab("How it works"):
            how_it_works_tab(app)
    return demo


# --- serving -------------------------------------------------------------------------------------


def _env(name: str, default, kind: type = int):
    """An environment setting parsed as ``kind`` (int or float); a bad one stops the start, naming it."""
    value = os.environ.get(name)
    try:
        return default if value is None else kind(value)
    except ValueError:
        word = "an integer" if kind is int else "a number"
        raise SystemExit(f"{name} must be {word}, got {value!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Serve the continuous speculative decoding demo.")
    ap.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),  # Hugging Face Spaces set 0.0.0.0 here
        help="interface to listen on (0.0.0.0 for all)",
    )
    ap.add_argument("--port", type=int, default=_env("GRADIO_SERVER_PORT", 7860))
    ap.add_argument(
        "--checkpoints",
        type=Path,
        default=os.environ.get("CSD_CHECKPOINTS"),
        help="directory with official MAR checkpoints (mar/<config>/checkpoint-last.pth, vae/kl16.ckpt); "
        f"with --hub-repo, where they are fetched (default {DEFAULT_CHECKPOINTS.relative_to(ROOT)}/)",
    )
    ap.add_argument(
        "--hub-repo",
        default=os.environ.get("CSD_HUB_REPO") or None,
        help="Hugging Face Hub repository with the official layout, fetched into --checkpoints before serving "
        "(several GB; the only download the app ever makes, and only when named here)",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=_env("CSD_MAX_SECONDS", Limits.max_seconds, float),
        help="a request still running after this many seconds stops at its next AR step, with an error",
    )
    ap.add_argument("--max-batch", type=int, default=_env("CSD_MAX_BATCH", Limits.max_batch))
    ap.add_argument("--max-steps", type=int, default=_env("CSD_MAX_STEPS", Limits.max_steps))
    ap.add_argument("--max-images", type=int, default=_env("CSD_MAX_IMAGES", Limits.max_images))
    ap.add_argument(
        "--max-analysis-steps",
        type=int,
        default=_env("CSD_MAX_ANALYSIS_STEPS", Limits.max_analysis_steps),
        help="images x AR steps of one analysis recompute",
    )
    ap.add_argument("--concurrency", type=int, default=Limits.concurrency, help="requests running at once")
    ap.add_argument(
        "--threads",
        type=int,
        default=_env("CSD_THREADS", CPU_THREADS if DEVICE.type == "cpu" else torch.get_num_threads()),
        help=f"torch CPU threads (default {CPU_THREADS} on a CPU-only machine)",
    )
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link (off by default)")
    args = ap.parse_args(argv)
    for name in ("max_batch", "max_steps", "max_images", "max_analysis_steps", "concurrency", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.max_seconds > 0:
        ap.error(f"--max-seconds must be > 0, got {args.max_seconds}")
    if args.hub_repo is not None and args.checkpoints is None:
        args.checkpoints = DEFAULT_CHECKPOINTS
    return args


def make_app(checkpoints: Path | None, limits: Limits, hub_repo: str | None = None) -> App:
    """The app on every pair found (the untrained pair only when nothing is installed). With ``hub_repo``
    the official checkpoints are fetched into ``checkpoints`` first; a failure ends the start."""
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
    return App(store, limits, panels, precomputed_frontier(FRONTIER, store))


def warm_up(app: App) -> None:
    """Run the default comparison once, so the first user's timings do not include one-time costs."""
    for _ in app.generate(progress=lambda *args, **kwargs: None, **app.default_controls()):
        pass


def serve(demo: gr.Blocks, limits: Limits, host: str, port: int | None, share: bool = False, block: bool = True) -> str:
    """Queue (at most ``limits.concurrency`` requests run at once) and launch; returns the local URL.
    ``port=None`` takes the first free port from 7860; ``block=False`` returns while serving."""
    demo.queue(default_concurrency_limit=limits.concurrency, max_size=limits.queue_size)
    _, url, _ = demo.launch(
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
    torch.set_num_threads(args.threads)
    limits = Limits(
        args.max_batch,
        args.max_steps,
        args.max_images,
        args.concurrency,
        max_analysis_steps=args.max_analysis_steps,
        max_seconds=args.max_seconds,
    )
    app = make_app(args.checkpoints, limits, args.hub_repo)
    print(f"Pairs: {app.store.names}; device {DEVICE}; warming up ...", flush=True)
    warm_up(app)
    serve(build(app), limits, args.host, args.port, args.share)


if __name__ == "__main__":
    main()
