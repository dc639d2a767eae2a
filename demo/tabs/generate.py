"""The Generate tab: the controls, then target-only, CSD and draft-only with the same seeds side by side,
the accepted-token map, the numbers of the comparison and where the time went."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from csd.experiments.analysis import Run, run_csd, run_single
from csd.experiments.jobs import Job, Step
from csd.experiments.pairs import EXAMPLE_PROMPTS, ModelPair
from csd.trace import Maker
from demo.core import App
from demo.requests import Request, validator
from demo.tabs.inspect import Inspected
from demo.views import image_grid, run_summary, speed_figure, stats_markdown
from visualize.images import display_grid, legend_html, token_map

RUNS = ["target-only", "CSD", "draft-only"]
IMAGE = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False}


@dataclass
class Comparison:
    """One Generate run: the three runs and their summary, and the CSD run kept for the Inspect tab."""

    pair: ModelPair
    target: Run
    csd: Run
    draft: Run
    summary: dict
    inspected: Inspected


def check_generate(app: App, components: dict | None = None, load: bool = True, **controls) -> Request | None:
    """The request of a Generate run, refused by name when it would not fit the per-request limit
    (``load=False``: a validator's check, :meth:`demo.core.App.request`)."""
    r = app.request(components, load, **controls)
    if r is not None:
        seconds = app.estimate(r, {"target": 1, "csd": 1, "draft": 1}, measure=load)
        app.check_fits(seconds, "ask for fewer images (batch size) or AR steps", control="batch_size")
    return r


def compare(app: App, progress, **controls) -> Iterator[tuple]:
    """Target-only, then CSD, then draft-only with the same seeds. Yields ("step", text) per AR step,
    ("target", grid) and ("csd", grid, map) as each is ready, and last ("done", Comparison)."""
    r = check_generate(app, **controls)

    def work(job: Job) -> tuple[Run, Run, Run]:
        target = run_single(r.pair, r.labels, r.seeds, r.sampling, on_step=job.on_step(RUNS[0]))
        job.post(("target", image_grid(r.pair, target)))
        spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, job.on_step(RUNS[1]), keep_details=True)
        csd_images = r.pair.images(spec.generation.tokens).numpy()
        job.post(("csd", display_grid(csd_images), token_map(csd_images, spec.trace.maker)))
        draft = run_single(r.pair, r.labels, r.seeds, r.sampling, Maker.DRAFT, on_step=job.on_step(RUNS[2]))
        return target, spec, draft

    job = app.job(work)
    for event in app.follow(job, RUNS, progress):
        yield ("step", event.text) if isinstance(event, Step) else event
    target, spec, draft = job.result
    summary = run_summary(r, target, spec, draft)
    yield "done", Comparison(r.pair, target, spec, draft, summary, Inspected.of(r.pair.name, spec, target))


def pick_example(sample: list) -> str:
    return sample[0]


class GenerateTab:
    """Layout and handlers; :meth:`build` returns the controls (the other tabs read them), the session's
    latest run (the Inspect tab reads it) and the Generate event."""

    def __init__(self, app: App):
        self.app = app

    def generate(self, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008 (Gradio's pattern)
        """Each image as it is ready, a status line per AR step; the last message carries every output."""
        self.app.check_client(request)
        # Clear the outputs of any earlier run first: what is on screen is always from this run.
        yield {**dict.fromkeys(self.outputs), self.stats: "Starting ..."}
        images = {}  # shown as they come, and again with the last message (what an API client receives)
        for event in compare(self.app, progress, **controls):
            kind = event[0]
            if kind == "step":
                yield {self.stats: f"Running {event[1]} ..."}
            elif kind == "target":
                images[self.target] = event[1]
                yield {self.target: event[1]}
            elif kind == "csd":
                images |= {self.csd: event[1], self.map: event[2]}
                yield {self.csd: event[1], self.map: event[2]}
            else:
                c: Comparison = event[1]
                yield images | {
                    self.draft: image_grid(c.pair, c.draft),
                    self.stats: stats_markdown(c.summary),
                    self.speed: speed_figure(c.target, c.csd, c.draft, c.summary),
                    self.summary: c.summary,
                    self.inspected: c.inspected,
                }

    def generate_stopped(self):
        """What Stop shows: nothing of the stopped run (and nothing to inspect)."""
        message = "Stopped: the run was cancelled, and nothing from it is shown."
        return {**dict.fromkeys(self.outputs), self.stats: message}

    def pair_changed(self, pair_name: str):
        """The class choice for a class-conditional pair, the prompt (and its examples) for a text pair;
        a pair's fixed AR steps (xAR: one per cell) and CFG schedule (its ramp over the cells)."""
        source, c = self.app.store.source(pair_name), self.controls
        fixed, schedule = source.traits.fixed_num_steps, source.traits.cfg_schedule
        out = {
            c["ar_steps"]: gr.update(value=fixed) if fixed else gr.update(),
            c["cfg_schedule"]: gr.update(value=schedule) if schedule else gr.update(),
            c["prompt"]: gr.update(visible=source.is_text),
            self.examples: gr.update(visible=source.is_text),
        }
        if source.is_text:
            return out | {c["class_name"]: gr.update(visible=False)}
        names = list(source.class_names)
        return out | {c["class_name"]: gr.update(choices=names, value=names[0], visible=True)}

    def build(self, queue: dict):
        app = self.app
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                self.controls = {}
                for name, c in app.controls.items():
                    if c.advanced:
                        continue
                    self.controls[name] = c.component()
                    if name == "prompt":
                        self.examples = self._prompt_examples(self.controls[name])
                with gr.Accordion("Advanced", open=False):
                    self.controls |= {name: c.component() for name, c in app.controls.items() if c.advanced}
                with gr.Row():
                    run = gr.Button("Generate", variant="primary")
                    stop = gr.Button("Stop")
            with gr.Column(scale=3):
                with gr.Row():
                    self.target = gr.Image(elem_id="img-target", label="Target only", **IMAGE)
                    self.csd = gr.Image(elem_id="img-csd", label="Speculative (CSD)", **IMAGE)
                with gr.Row():
                    self.map = gr.Image(elem_id="img-map", label="Accepted-token map (CSD)", **IMAGE)
                    self.draft = gr.Image(elem_id="img-draft", label="Draft only (same seeds)", **IMAGE)
                gr.HTML(legend_html())
                self.stats = gr.Markdown(
                    "Press **Generate**: target-only, CSD and draft-only run with the same seeds.", elem_id="gen-status"
                )
                self.speed = gr.Plot(label="Speedup", elem_id="speed-plot")
                with gr.Accordion("Run summary (JSON)", open=False):
                    self.summary = gr.JSON()
        # This visitor's latest run, for the Inspect tab: kept a limited time, and only for the latest sessions
        # (the server's state capacity), so memory stays bounded however many visitors come.
        self.inspected = gr.State(None, time_to_live=app.limits.session_ttl)
        self.outputs = [self.target, self.csd, self.map, self.draft, self.stats, self.speed, self.summary]
        self.outputs.append(self.inspected)
        check = validator(lambda **values: check_generate(app, self.controls, False, **values), self.controls)
        gen = {"inputs_kwargs": self.controls, "outputs": self.outputs, "api_name": "generate", "validator": check}
        event = run.click(self.generate, **gen, **queue)
        # Cancel first, then say so: a message the run had already sent cannot overwrite "Stopped".
        stopped = stop.click(None, None, None, cancels=[event], api_visibility="private")
        stopped.then(self.generate_stopped, None, self.outputs, api_visibility="private")
        shown = [self.controls[k] for k in ("class_name", "prompt", "ar_steps", "cfg_schedule")] + [self.examples]
        pair = self.controls["pair_name"]
        pair.change(self.pair_changed, pair, shown, api_visibility="private")
        with gr.Accordion("Official checkpoints", open=False):
            gr.Markdown(
                "Official pairs are offered when the operator starts the server with `--checkpoints DIR` holding "
                "the official files beside `vae/kl16.ckpt`: MAR-H or MAR-L drafted by MAR-B "
                "(`mar/mar_base/checkpoint-last.pth`, ...; `--hub-repo REPO` fetches that layout before serving), "
                "xAR-H or xAR-L drafted by xAR-B (`xar/xAR-B.pth`, ...), Harmon-1.5B drafted by Harmon-0.5B "
                "(`harmon/`, see docs/families.md). "
                f"This server has: {', '.join(app.store.names)}."
            )
        return self.controls, self.inspected, event

    def _prompt_examples(self, prompt: gr.Textbox) -> gr.Dataset:
        """Example prompts one click away: the first text pair's."""
        store = self.app.store
        text = [store.source(n) for n in store.names if store.source(n).is_text]
        examples = gr.Dataset(
            components=[gr.Textbox(visible=False)],
            samples=[[p] for p in (text[0].prompts if text else EXAMPLE_PROMPTS)],
            label="Example prompts",
            visible=store.source(store.names[0]).is_text,
            elem_id="prompt-examples",
        )
        examples.click(pick_example, examples, prompt, api_visibility="private")
        return examples
