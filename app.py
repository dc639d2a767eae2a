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

# ruff: noqa: E402  (gradio reads GRADIO_ANALYTICS_ENABLED at import time: set it before importing)
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import argparse
import json
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
from csd.experiments import defaults
from csd.experiments.analysis import Analysis, AnalysisSettings, Panels, Run, cost_model, run_csd, run_single
from csd.experiments.jobs import Job, Step, Stopped
from csd.experiments.pairs import RANDOM_SOURCE, ModelPair, PairStore, discover, fetch_official
from csd.models.schedule import CFG_SCHEDULES
from csd.sampling import SamplingConfig
from csd.speculative import CSDConfig
from csd.toy import speculative_sample, total_variation
from csd.trace import Maker
from visualize.images import display_grid, legend_html, token_map
from visualize.panels import analysis_charts, time_breakdown
from visualize.render import to_plotly
from visualize.toy import toy_chart

try:  # Hugging Face ZeroGPU: a GPU is attached only inside functions decorated with spaces.GPU
    import spaces

    on_gpu = spaces.GPU
except ImportError:

    def on_gpu(fn):
        return fn


ROOT = Path(__file__).resolve().parent
PRECOMPUTED = ROOT / "assets" / "analysis_default.json"
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


# --- controls ----------------------------------------------------------------------------------


def _valid_values(component: gr.components.Component) -> str:
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
        try:
            return check(payload)
        except (gr.Error, TypeError, ValueError):
            raise gr.Error(f"{component.label} must be {_valid_values(component)}, got {payload!r}") from None

    component.preprocess = preprocess
    return component


def slider(*args, **kwargs) -> gr.Slider:
    return named(gr.Slider(*args, **kwargs))


def number(**kwargs) -> gr.Number:
    return named(gr.Number(**kwargs))


def radio(*args, **kwargs) -> gr.Radio:
    return named(gr.Radio(*args, **kwargs))


def dropdown(*args, **kwargs) -> gr.Dropdown:
    return named(gr.Dropdown(*args, **kwargs))


def _flag(label: str, value) -> bool:
    if not isinstance(value, bool):
        raise gr.Error(f"{label} must be true or false, got {value!r}")
    return value


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
    labels: list[int]
    seeds: list[int]
    sampling: SamplingConfig
    csd: CSDConfig


class App:
    """Handlers of the UI and the API. Holds only read-only things: the model store and the limits.
    Nothing a visitor sends names a file, a directory or a repository: pairs are chosen by name among
    those the operator installed before serving."""

    def __init__(self, store: PairStore, limits: Limits, panels: Panels | None = None):
        self.store, self.limits, self.panels = store, limits, panels
        # The latest model runs: status ("done", "stopped", "over time", "error"), AR steps run, seconds.
        self.history: deque[dict] = deque(maxlen=64)

    # --- requests -----------------------------------------------------------------------------

    def request(
        self,
        pair_name: str,
        class_name: str,
        seed: int,
        batch_size: int,
        ar_steps: int,
        gamma: int,
        prefill: float,
        cfg_scale: float,
        cfg_schedule: str,
        temperature: float,
        align: bool,
        criterion: str,
        tau_v: float,
        trajectory_term: str,
        resample_widening: float,
        max_tries: int,
    ) -> Request:
        """Validate the controls (each error names its control and range) and load the pair."""
        if pair_name not in self.store.names:
            raise gr.Error(f"Model pair must be one of {self.store.names}, got {pair_name!r}")
        names = self.store.source(pair_name).class_names
        if class_name not in names:
            raise gr.Error(
                f"Class must be one of the {len(names)} classes of {pair_name} ({names[0]}, ...), got {class_name!r}"
            )
        with library_errors():
            sampling = SamplingConfig(
                num_steps=ar_steps,
                cfg_scale=cfg_scale,
                cfg_schedule=cfg_schedule,
                temperature=temperature,
                precision=PRECISION,
            )
            csd = CSDConfig(
                gamma=gamma,
                prefill=prefill,
                align=_flag("Trajectory alignment", align),
                criterion=criterion,
                trajectory_term=trajectory_term,
                tau_v=tau_v,
                resample_widening=resample_widening,
                max_tries=max_tries,
            )
        try:
            pair = self.store.get(pair_name)
        except (OSError, ValueError) as err:  # missing or mismatched checkpoint files
            raise gr.Error(f"Model pair {pair_name!r} could not be loaded: {err}") from None
        if ar_steps > pair.num_tokens:
            raise gr.Error(f"AR steps must be in [1, {pair.num_tokens}] (the tokens of {pair_name}), got {ar_steps}")
        label = names.index(class_name)
        return Request(pair, [label] * batch_size, [seed + i for i in range(batch_size)], sampling, csd)

    # --- generate tab -------------------------------------------------------------------------

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
            spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, on_step=job.on_step(runs[1]))
            csd_images = r.pair.images(spec.generation.tokens).numpy()
            job.post(("csd", display_grid(csd_images), token_map(csd_images, spec.trace.maker)))
            draft = run_single(r.pair, r.labels, r.seeds, r.sampling, Maker.DRAFT, on_step=job.on_step(runs[2]))
            return target, spec, draft

        # Clear the outputs of any earlier run first: what is on screen is always from this run.
        yield None, None, None, None, "Starting ...", None, None
        job = self.job(work)
        images = {}
        for event in self.follow(job, runs, progress):
            if isinstance(event, Step):
                yield skip, skip, skip, skip, f"Running {event.text} ...", skip, skip
            elif event[0] == "target":
                images["target"] = event[1]
                yield event[1], skip, skip, skip, skip, skip, skip
            else:
                images["csd"], images["map"] = event[1], event[2]
                yield skip, event[1], event[2], skip, skip, skip, skip
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
        )

    @staticmethod
    def generate_stopped():
        """What Stop shows on the Generate tab: nothing of the stopped run."""
        return None, None, None, None, "Stopped: the run was cancelled, and nothing from it is shown.", None, None

    # --- analysis tab -------------------------------------------------------------------------

    def analyze(self, n_images: int, progress=gr.Progress(), **controls):  # noqa: B008
        """Recompute every analysis panel over ``n_images`` images (image i: seed + i) at the current controls.
        The panels on screen change only when every run has finished."""
        r = self.request(batch_size=1, **controls)
        work = n_images * r.sampling.num_steps
        if work > self.limits.max_analysis_steps:
            raise gr.Error(
                f"Images (n) x AR steps must be at most {self.limits.max_analysis_steps} on this server "
                f"(--max-analysis-steps, CSD_MAX_ANALYSIS_STEPS), got {n_images} x {r.sampling.num_steps} = {work}: "
                "ask for fewer images or AR steps"
            )
        settings = AnalysisSettings(
            n_images=n_images, seed=r.seeds[0], label=r.labels[0], sampling=r.sampling, csd=r.csd
        )
        analysis = Analysis(r.pair, settings)
        skips = [gr.skip()] * (len(ANALYSIS_KEYS) + 1)

        def work(job: Job) -> Panels:
            for done, total, label in analysis.steps(on_step=lambda label: job.on_step(label)):
                job.post((done, total, label))
            return analysis.panels()

        run = (0, len(analysis), "")
        job = self.job(work)
        for event in self.follow(job, [], lambda *args, **kwargs: None):
            if isinstance(event, Step):
                done, total, _ = run
                progress((done * event.total + event.done, total * event.total), desc=event.text, unit="steps")
                yield f"Running {done + 1}/{total}: {event.text} ...", *skips
            else:
                run = event
        panels = job.result
        yield analysis_status(panels, recomputed=True), *analysis_figures(panels), panels_json(panels)

    @staticmethod
    def analyze_stopped() -> str:
        return "Stopped: the recompute was cancelled; the panels below are the ones shown before it."

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
        """Keyword arguments of :meth:`request` for the default setting (:mod:`csd.experiments.defaults`),
        within the limits."""
        s, c = defaults.SAMPLING, defaults.CSD
        first = self.store.source(self.store.names[0])
        return {
            "pair_name": first.name,
            "class_name": first.class_names[0],
            "seed": 0,
            "batch_size": min(defaults.BATCH_SIZE, self.limits.max_batch),
            "ar_steps": min(s.num_steps, self.limits.max_steps),
            "gamma": c.gamma,
            "prefill": c.prefill,
            "cfg_scale": s.cfg_scale,
            "cfg_schedule": s.cfg_schedule,
            "temperature": s.temperature,
            "align": c.align,
            "criterion": c.criterion,
            "tau_v": c.tau_v,
            "trajectory_term": c.trajectory_term,
            "resample_widening": c.resample_widening,
            "max_tries": c.max_tries,
        }

    def classes(self, pair_name: str):
        names = self.store.source(pair_name).class_names
        return gr.update(choices=list(names), value=names[0])


# --- presentation ------------------------------------------------------------------------------


def _grid(pair: ModelPair, run: Run) -> np.ndarray:
    return display_grid(pair.images(run.generation.tokens).numpy())


def _json_float(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def run_summary(r: Request, target: Run, spec: Run, draft: Run) -> dict:
    """The numbers of one comparison, JSON-ready (the API's last output)."""
    t = spec.trace
    model, bound = cost_model(target.trace, draft.trace, r.csd)
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
    bound = "n/a" if s["bound"] is None else f"{s['bound']:.2f}x"
    model = "n/a" if s["cost_model_speedup"] is None else f"{s['cost_model_speedup']:.2f}x"
    return (
        f"### Speedup {s['speedup']:.2f}x &nbsp;·&nbsp; acceptance {_pct(s['acceptance_rate'])}\n\n"
        "| | target-only | CSD | draft-only |\n|---|---|---|---|\n"
        f"| wall time | {sec['target-only']:.2f} s | {sec['CSD']:.2f} s | {sec['draft-only']:.2f} s |\n"
        f"| target backbone passes | {tp['target-only']} | {tp['CSD']} | 0 |\n"
        f"| draft backbone passes | 0 | {dp['CSD']} | {dp['draft-only']} |\n\n"
        f"{tok['accepted']} of {drafted} drafted tokens accepted, {tok['resampled']} resampled, "
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
    "quality_vs_time",
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


HOW_IT_WORKS = r"""
### The idea in plain words

A continuous autoregressive image model (MAR) makes an image in **AR steps**: at each step its big
*backbone* looks at the tokens made so far and gives every missing position a condition $z$; a small
*token head* then turns $z$ into a continuous token by running a short chain of Gaussian steps
(a little diffusion model). The backbone is the expensive part.

**Speculative decoding** lets a small *draft* model $q$ make the next $\gamma$ AR steps alone, then
asks the large *target* model $p$ to check all of them with **one** backbone pass. Each drafted token
$x$ is kept with probability $\min(1, p(x)/q(x))$; a rejected token is redrawn from what the draft
under-represents,

$$p'(x) = \frac{\max(0,\, p(x) - q(x))}{Z}, \qquad Z = \int \max(0,\, p - q)\,dx = \mathrm{TV}(p, q).$$

Kept and redrawn tokens together follow $p$ exactly, and a token is kept with probability
$1 - \mathrm{TV}(p, q)$. The toy below runs exactly this on one 1-D Gaussian.

### What is special about continuous tokens

* **No closed-form densities.** The head's output density $p(x)$ is an integral over its whole
  noise chain. The paper compares the two models' chains instead: the draft's path and the target's
  path, made from **the same noise** (trajectory alignment), give $\log r = T + F$ with the
  *trajectory term* and the *final-step term*
  $$T = \sum_t \sum_d \left(\log \sigma^q_{t,d} - \log \sigma^p_{t,d}\right),$$
  $$F = \log \mathcal N\!\left(x^q;\,\mu^p_0,\,(\tau_v\sigma^p_0)^2\right)
      - \log \mathcal N\!\left(x^q;\,\mu^q_0,\,(\tau_v\sigma^q_0)^2\right),$$
  and the token is accepted with probability $\min(1, r)$. This is an approximation; the *exact*
  criterion (the target's densities along the draft's path) is offered as a reference and accepts
  almost nothing on real models.
* **Alignment** makes the two chains start from the same noise, so drafted and target tokens land
  close together and acceptance rises (the *Analysis* tab shows both distances).
* **Resampling without $Z$.** $p'$ has no closed form either. Acceptance-rejection does it: draw
  $x \sim p$, keep it with probability $\max(0, 1 - q(x)/p(x))$; on average this takes $1/Z$ tries
  (capped; a capped token takes the target's own sample).
* **Pre-fill.** The target makes the first few percent of tokens alone, where the draft is worst.

### Why it is faster (and by how much at most)

With block verification the target runs one backbone pass per $\gamma$ drafted steps, whatever is
accepted. With backbone costs $C_p$, $C_q$ and cheap heads, the speedup is bounded by
$$\frac{C_p}{C_q + C_p/\gamma}.$$
Acceptance decides how much of the image is the draft's and how often the resampler runs, not the
number of target passes.

A note on $\tau_v$: the test widens both final Gaussians by $\tau_v$, while the resampler draws from
them widened by *resample widening* (1 by default, as in the published code). Only when the two are
equal is test-and-resample self-consistent.
"""


# --- layout --------------------------------------------------------------------------------------

CSS = """
.csd-img img { image-rendering: pixelated; }
.csd-legend { font-size: 0.9em; margin-top: -6px; }
"""
# System fonts: the default theme would fetch web fonts, and the app must work offline.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def build(app: App) -> gr.Blocks:
    lim, d = app.limits, app.default_controls()
    first = app.store.source(d["pair_name"])
    integer = {"step": 1, "precision": 0}
    # Generation and analysis share one queue slot group: at most `concurrency` model runs at once.
    models_queue = {"concurrency_id": "models", "concurrency_limit": lim.concurrency}
    with gr.Blocks(title="Continuous speculative decoding") as demo:
        gr.Markdown(
            "# Continuous speculative decoding\nA small *draft* model proposes image tokens, a large *target* "
            "model verifies them in one pass. Same seed, same noise: compare target-only and CSD side by side."
        )
        with gr.Tab("Generate"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    # Keyed by the keyword arguments of App.request.
                    controls = {
                        "pair_name": dropdown(app.store.names, value=d["pair_name"], label="Model pair"),
                        # Choices follow the pair, so the handler checks the class.
                        "class_name": dropdown(
                            list(first.class_names), value=d["class_name"], label="Class", allow_custom_value=True
                        ),
                        "seed": number(value=d["seed"], minimum=0, maximum=MAX_SEED, precision=0, label="Seed"),
                        "batch_size": slider(1, lim.max_batch, value=d["batch_size"], label="Batch size", **integer),
                        "ar_steps": slider(1, lim.max_steps, value=d["ar_steps"], label="AR steps", **integer),
                        "gamma": slider(
                            1,
                            32,
                            value=d["gamma"],
                            label="Draft length gamma",
                            info="AR steps per target pass",
                            **integer,
                        ),
                        "prefill": slider(
                            0.0,
                            0.5,
                            value=d["prefill"],
                            step=0.01,
                            label="Pre-fill ratio",
                            info="fraction of tokens the target makes before drafting",
                        ),
                        "cfg_scale": slider(1.0, 10.0, value=d["cfg_scale"], step=0.1, label="CFG scale"),
                        "cfg_schedule": radio(list(CFG_SCHEDULES), value=d["cfg_schedule"], label="CFG schedule"),
                        "temperature": slider(0.1, 2.0, value=d["temperature"], step=0.05, label="Temperature"),
                        "align": gr.Checkbox(value=d["align"], label="Trajectory alignment (shared noise)"),
                        "criterion": radio(
                            list(CRITERIA),
                            value=d["criterion"],
                            label="Acceptance criterion",
                            info="aligned: the paper's approximation; exact: path-space reference",
                        ),
                    }
                    with gr.Accordion("Advanced", open=False):
                        controls["tau_v"] = slider(
                            1.0, 100.0, value=d["tau_v"], step=0.5, label="Verification widening tau_v"
                        )
                        controls["trajectory_term"] = radio(
                            list(TRAJECTORY_TERMS),
                            value=d["trajectory_term"],
                            label="Trajectory term",
                            info="derived sign, published sign, or none (final-step term only)",
                        )
                        controls["resample_widening"] = slider(
                            1.0,
                            100.0,
                            value=d["resample_widening"],
                            step=0.5,
                            label="Resample widening",
                            info="equal to tau_v makes test and resampling self-consistent",
                        )
                        controls["max_tries"] = slider(1, 1000, value=d["max_tries"], label="Resampler cap", **integer)
                    with gr.Row():
                        run = gr.Button("Generate", variant="primary")
                        stop = gr.Button("Stop")
                with gr.Column(scale=3):
                    img_kw = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False}
                    with gr.Row():
                        img_target = gr.Image(elem_id="img-target", label="Target only", **img_kw)
                        img_csd = gr.Image(elem_id="img-csd", label="Speculative (CSD)", **img_kw)
                    with gr.Row():
                        img_map = gr.Image(elem_id="img-map", label="Accepted-token map (CSD)", **img_kw)
                        img_draft = gr.Image(elem_id="img-draft", label="Draft only (same seeds)", **img_kw)
                    gr.HTML(legend_html())
                    stats = gr.Markdown("Press **Generate**: target-only, CSD and draft-only run with the same seeds.")
                    speed = gr.Plot(label="Speedup", elem_id="speed-plot")
                    with gr.Accordion("Run summary (JSON)", open=False):
                        summary = gr.JSON()
            gen_outputs = [img_target, img_csd, img_map, img_draft, stats, speed, summary]
            gen_event = run.click(
                on_gpu(app.generate),
                inputs_kwargs=controls,
                outputs=gen_outputs,
                api_name="generate",
                **models_queue,
            )
            stop.click(app.generate_stopped, None, gen_outputs, cancels=[gen_event], api_visibility="private")
            pair = controls["pair_name"]
            pair.change(app.classes, pair, controls["class_name"], api_visibility="private")
            with gr.Accordion("Official MAR checkpoints", open=False):
                gr.Markdown(
                    "Official pairs (MAR-H or MAR-L target, MAR-B draft) are offered when the operator starts "
                    "the server with `--checkpoints DIR` (the official layout: `mar/mar_base/checkpoint-last.pth`, "
                    "`vae/kl16.ckpt`) or `--hub-repo REPO`, which fetches that layout before serving. "
                    f"This server has: {', '.join(app.store.names)}."
                )

        with gr.Tab("Analysis"):
            served_weights = app.store.source(app.panels.pair).weights if app.panels is not None else None
            status = gr.Markdown(analysis_status(app.panels, current_weights=served_weights))
            gr.Markdown(
                "Panels over *n* images (image *i*: seed + i, class + i) at the current Generate-tab controls; "
                "each sweep varies one knob around them. Recomputing takes a few dozen runs."
            )
            with gr.Row():
                n_images = slider(
                    1,
                    lim.max_images,
                    value=min(AnalysisSettings.n_images, lim.max_images),
                    label="Images (n)",
                    **integer,
                )
                recompute = gr.Button("Recompute for current controls", variant="primary")
                stop_analysis = gr.Button("Stop")
            figures = analysis_figures(app.panels)
            plots = []
            sections = (
                ("(a) Draft-target distance with and without alignment", 2),
                ("(b) Acceptance per AR step under pre-fill", 1),
                ("(c) Resampler", 2),
                ("Acceptance vs draft length, CFG scale, temperature", 3),
                ("The split of log r", 1),
                ("Where the time goes, and quality vs time", 2),
            )
            for title, count in sections:
                gr.Markdown(f"#### {title}")
                with gr.Row():
                    for _ in range(count):
                        plots.append(
                            gr.Plot(figures[len(plots)], show_label=False, elem_id=f"panel-{ANALYSIS_KEYS[len(plots)]}")
                        )
            with gr.Accordion("Panel data (JSON)", open=False):
                data = gr.JSON(panels_json(app.panels))
            ana_event = recompute.click(
                on_gpu(app.analyze),
                # One image per seed: the batch size plays no role in the analysis.
                inputs_kwargs={**{k: v for k, v in controls.items() if k != "batch_size"}, "n_images": n_images},
                outputs=[status, *plots, data],
                api_name="analyze",
                **models_queue,
            )
            stop_analysis.click(app.analyze_stopped, None, status, cancels=[ana_event], api_visibility="private")

        with gr.Tab("How it works"):
            gr.Markdown(HOW_IT_WORKS, latex_delimiters=LATEX)
            gr.Markdown("### Try it on one Gaussian token", latex_delimiters=LATEX)
            with gr.Row():
                with gr.Column(scale=1, min_width=280):
                    p_mean = slider(-5.0, 5.0, value=0.0, step=0.1, label="Target p mean")
                    p_std = slider(0.1, 5.0, value=1.0, step=0.05, label="Target p std")
                    q_mean = slider(-5.0, 5.0, value=1.0, step=0.1, label="Draft q mean")
                    q_std = slider(0.1, 5.0, value=1.5, step=0.05, label="Draft q std")
                    n = slider(100, 200_000, value=20_000, step=100, precision=0, label="Samples N")
                    toy_seed = number(value=0, minimum=0, maximum=MAX_SEED, precision=0, label="Seed")
                    toy_run = gr.Button("Sample", variant="primary")
                with gr.Column(scale=2):
                    toy_inputs = [p_mean, p_std, q_mean, q_std, n, toy_seed]
                    first_toy = app.toy(0.0, 1.0, 1.0, 1.5, 20_000, 0)
                    toy_plot = gr.Plot(first_toy[0], show_label=False)
                    toy_stats = gr.Markdown(first_toy[1])
                    toy_summary = gr.JSON(first_toy[2], label="Toy summary")
            gr.on(
                [toy_run.click] + [x.release for x in toy_inputs[:4]],
                app.toy,
                toy_inputs,
                [toy_plot, toy_stats, toy_summary],
                api_name="toy",
            )
    return demo


# --- serving -------------------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise SystemExit(f"{name} must be an integer, got {value!r}") from None


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    try:
        return default if value is None else float(value)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {value!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Serve the continuous speculative decoding demo.")
    ap.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),  # Hugging Face Spaces set 0.0.0.0 here
        help="interface to listen on (0.0.0.0 for all)",
    )
    ap.add_argument("--port", type=int, default=_env_int("GRADIO_SERVER_PORT", 7860))
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
        default=_env_float("CSD_MAX_SECONDS", Limits.max_seconds),
        help="a request still running after this many seconds stops at its next AR step, with an error",
    )
    ap.add_argument("--max-batch", type=int, default=_env_int("CSD_MAX_BATCH", Limits.max_batch))
    ap.add_argument("--max-steps", type=int, default=_env_int("CSD_MAX_STEPS", Limits.max_steps))
    ap.add_argument("--max-images", type=int, default=_env_int("CSD_MAX_IMAGES", Limits.max_images))
    ap.add_argument(
        "--max-analysis-steps",
        type=int,
        default=_env_int("CSD_MAX_ANALYSIS_STEPS", Limits.max_analysis_steps),
        help="images x AR steps of one analysis recompute",
    )
    ap.add_argument("--concurrency", type=int, default=Limits.concurrency, help="requests running at once")
    ap.add_argument(
        "--threads",
        type=int,
        default=_env_int("CSD_THREADS", CPU_THREADS if DEVICE.type == "cpu" else torch.get_num_threads()),
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
            log = lambda line: print(line, flush=True)  # noqa: E731
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
    return App(store, limits, panels)


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
