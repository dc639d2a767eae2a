"""The Generate tab: Generate and the presets first, each with its expected time on this server; then
target-only, CSD and draft-only with the same seeds side by side, the accepted-token map, the numbers of
the comparison and where the time went. The page opens on a precomputed comparison (:mod:`demo.showcase`),
and a gallery of more is one click away."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr
import numpy as np

from csd.experiments.analysis import Run, run_csd, run_single
from csd.experiments.defaults import PRESETS
from csd.serving.jobs import Job, Step
from csd.trace import Maker
from demo.application import App, fixed_controls
from demo.cards import model_line
from demo.estimate import words
from demo.gpu import task
from demo.requests import Request, twin_events
from demo.tab import Page, shown_refusal
from demo.tabs.generate_layout import LINKED, GenerateLayout
from demo.tabs.inspect import Inspected
from demo.views import image_grid, run_summary, speed_figure, stats_markdown
from visualize.images import display_grid, token_map

RUNS = ["target-only", "CSD", "draft-only"]


@dataclass(frozen=True)
class TargetReady:
    """Target-only's images, posted as soon as they exist (shown before CSD starts)."""

    grid: np.ndarray


@dataclass(frozen=True)
class CsdReady:
    """CSD's images and its token map, posted as soon as they exist."""

    grid: np.ndarray
    token_map: np.ndarray


@dataclass
class Comparison:
    """One Generate run, as its GPU call returns it (plain values: the main process holds the models): the
    three runs and their images, their summary, and the CSD run kept for the Inspect tab."""

    pair_name: str
    target: Run
    csd: Run
    draft: Run
    images: dict[str, np.ndarray]  # "target", "csd", "map", "draft"
    summary: dict
    inspected: Inspected


RUN_KINDS = {"target": 1, "csd": 1, "draft": 1}


def check_generate(
    app: App, components: dict | None = None, load: bool = True, fit: bool = True, **controls
) -> Request | None:
    """The request of a Generate run, refused by name when it would not fit the per-request limit
    (``load=False``: a validator's check, :meth:`demo.application.App.request`; ``fit=False``: the operator's own
    warm-up, which runs whatever the estimate)."""
    r = app.request(components, load, **controls)
    if r is not None and fit:
        seconds = app.estimate(r, RUN_KINDS, measure=load)
        app.check_fits(seconds, "ask for fewer images (batch size) or AR steps", control="batch_size")
    return r


def compare(app: App, progress, fit: bool = True, **controls) -> Iterator[object]:
    """Target-only, then CSD, then draft-only with the same seeds, in one GPU call. The request is checked at
    once (a refusal raises here, before anything runs); the runs then yield a :class:`~csd.serving.jobs.Step`
    per AR step (as the throttle lets them through), :class:`TargetReady` and :class:`CsdReady` as each is
    ready, and last the :class:`Comparison`."""
    r = check_generate(app, None, True, fit, **controls)
    return _compare(app, r, app.estimate(r, RUN_KINDS), progress)


def _compare(app: App, r: Request, seconds: float, progress) -> Iterator[object]:
    call = app.gpu.call("compare", r.plain(), seconds)
    result = yield from app.follow(call, RUNS, progress, app.load(r), (r.pair.name, seconds))
    yield result


@task("compare")
def compare_task(app: App, **request) -> Iterator[object]:
    """The GPU task of :func:`compare` (registered as "compare"): the three runs of the request (checked before
    the call, :meth:`demo.requests.Request.plain`), their images decoded there."""
    r = Request.from_plain(app.store, **request)

    def work(job: Job) -> Comparison:
        target = run_single(r.pair, r.labels, r.seeds, r.sampling, on_step=job.on_step(RUNS[0]))
        images = {"target": image_grid(r.pair, target)}
        job.post(TargetReady(images["target"]))
        spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, job.on_step(RUNS[1]), keep_details=True)
        csd_images = r.pair.images(spec.generation.tokens).numpy()
        images |= {"csd": display_grid(csd_images), "map": token_map(csd_images, spec.trace.maker)}
        job.post(CsdReady(images["csd"], images["map"]))
        draft = run_single(r.pair, r.labels, r.seeds, r.sampling, Maker.DRAFT, on_step=job.on_step(RUNS[2]))
        images["draft"] = image_grid(r.pair, draft)
        summary = run_summary(r, target, spec, draft)
        return Comparison(r.pair.name, target, spec, draft, images, summary, Inspected.of(r.pair.name, spec, target))

    yield from app.job_events(work)


def estimate_line(app: App, **controls) -> str:
    """The expected time of this setting and of every preset, for the current pair and batch."""
    try:
        r = app.request(None, False, **controls)
    except gr.Error as err:
        return f"Not runnable as set: {err.message}"
    if r is None or not app.timed(r.pair.name):
        return "Expected time: measured when this pair is first used."
    runs = {"target": 1, "csd": 1, "draft": 1}
    this = app.estimate(r, runs, measure=False)
    parts = [f"**Expected on this server: {words(this)}**"]
    for name in PRESETS:
        try:
            preset = app.request(None, False, **app.preset(name, controls))
            parts.append(f"{name} {words(app.estimate(preset, runs, measure=False)).removeprefix('about ')}")
        except gr.Error:
            continue
    most = app.limits.max_seconds
    return f"{parts[0]} (presets: {', '.join(parts[1:])}; a request may take up to {most:.0f} s)."


class GenerateTab(GenerateLayout):
    """The handlers of the Generate tab's page (:class:`~demo.tabs.generate_layout.GenerateLayout`);
    :meth:`build` puts the controls (the other tabs read them), the session's latest run (the Inspect tab
    reads it) and the Generate event on the page."""

    title = "Generate"

    # --- handlers ---------------------------------------------------------------------------------

    def generate_ui(self, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008 (Gradio's pattern)
        """For the page: as :meth:`generate`, and a refused request leaves what is shown and says why (in the
        status line, and in a message that stays until it is closed)."""
        run = self.generate(request, progress, **controls)
        yield from shown_refusal(run, self.stats, "Not run", message=True)

    def generate(self, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008 (Gradio's pattern)
        """Its place in the line while it waits; then each image as it is ready, a status line per AR step; the
        last message carries every output."""
        app = self.app
        app.check_client(request)
        check = lambda: check_generate(app, None, False, **controls)
        estimate = lambda: app.estimate(check_generate(app, None, True, **controls), RUN_KINDS)
        with app.turn(request, controls.get("pair_name"), check, estimate, "fewer images (Images)", progress) as turn:
            for line in turn:  # a refusal comes here, before anything is cleared
                yield {self.stats: line}
            events = compare(app, progress, **controls)
            # Clear the outputs of any earlier run first: what is on screen is always from this run.
            yield {**dict.fromkeys(self.outputs), self.stats: "Starting ..."}
            for event in events:  # each image as it comes, and all of them with the last message (an API client's)
                if isinstance(event, Step):
                    yield {self.stats: f"Running {event.text} ..."}
                elif isinstance(event, TargetReady):
                    yield {self.target: event.grid}
                elif isinstance(event, CsdReady):
                    yield {self.csd: event.grid, self.map: event.token_map}
                elif isinstance(event, Comparison):
                    yield self._comparison(event, controls)

    def _comparison(self, c: Comparison, controls: dict) -> dict:
        im = c.images
        return self._extras(im["target"], im["csd"], im["map"], controls) | {
            self.target: im["target"],
            self.csd: im["csd"],
            self.map: im["map"],
            self.draft: im["draft"],
            self.stats: stats_markdown(c.summary),
            self.speed: speed_figure(c.target, c.csd, c.draft, c.summary),
            self.summary: c.summary,
            self.inspected: c.inspected,
            self.results: c.pair_name,
        }

    def pair_changed(self, pair_name: str, ar_steps, cfg_schedule, saved: dict | None, results: str | None = None):
        """The class choice for a class-conditional pair, the prompt (and its examples) for a text pair;
        a pair's fixed AR steps (xAR: one per cell) and CFG schedule (its ramp over the cells) set and locked,
        and the visitor's own values put back when a pair without them is chosen again. Unless the result
        panes already belong to the pair (``results``: a gallery example or a link set both), they show its
        own precomputed comparison (:meth:`pair_results`), and the class or prompt it was made for."""
        source = self.app.store.source(pair_name)
        out = self._knobs(source, ar_steps, cfg_schedule, saved) | {self.card: model_line(source)}
        if results == pair_name:  # the panes show this pair already: the class or prompt stays as set
            return out | self._condition(source, None)
        shown = self.example_of(pair_name)
        return out | self.pair_results(pair_name) | self._condition(source, shown.controls if shown else {})

    def _knobs(self, source, ar_steps, cfg_schedule, saved: dict | None) -> dict:
        """AR steps and the CFG ramp: those a pair fixes (:func:`demo.application.fixed_controls`) set and locked (the
        visitor's kept in ``saved``), the visitor's own put back on a pair that fixes none."""
        traits, current = source.traits, {"ar_steps": ar_steps, "cfg_schedule": cfg_schedule}
        fixed = fixed_controls(traits)
        why = {
            "ar_steps": f"fixed: one AR step per {traits.row_name[:-1]}",
            "cfg_schedule": f"fixed: {traits.family}'s ramp",
        }
        back = {} if fixed else saved or {}
        out = {self.saved: (saved or current) if fixed else None}
        for name, value in current.items():
            if name in fixed:
                out[self.controls[name]] = gr.update(value=fixed[name], interactive=False, info=why[name])
            else:
                out[self.controls[name]] = gr.update(value=back.get(name, value), interactive=True, info="")
        return out

    def _condition(self, source, made: dict | None) -> dict:
        """The class or prompt control of ``source``, with the value in ``made`` (the controls of the
        comparison the panes now show, {} for none: the pair's first class); ``made=None`` keeps the value."""
        c, text = self.controls, source.is_text
        out = {c["prompt"]: gr.update(visible=text), self.examples: gr.update(visible=text)}
        if text:
            value = {"value": made["prompt"]} if made and "prompt" in made else {}
            return out | {c["class_name"]: gr.update(visible=False), c["prompt"]: gr.update(visible=True, **value)}
        names = list(source.class_names)
        value = {} if made is None else {"value": made["class_name"] if made.get("class_name") in names else names[0]}
        return out | {c["class_name"]: gr.update(choices=names, visible=True, **value)}

    def apply_preset(self, name: str, **controls):
        """The controls after a preset (the pair's fixed knobs stay as they are)."""
        if name not in PRESETS:
            return {component: gr.skip() for component in self.controls.values()}
        values = self.app.preset(name, controls)
        out = {component: gr.skip() for component in self.controls.values()}
        return out | {self.controls[k]: v for k, v in values.items() if k in self.controls}

    def show_example(self, evt: gr.SelectData):
        """A gallery example: its settings into the controls and its precomputed images and numbers."""
        shown = self.shown[evt.index]
        out = {self.controls[k]: v for k, v in shown.controls.items() if k in self.controls}
        return out | self._shown(shown)

    def from_link(self, request: gr.Request):
        """Controls from the page's address (a settings link), each as its control would take it; a link to
        another pair than the first sight's also brings that pair's results (:meth:`pair_results`)."""
        params = dict(getattr(request, "query_params", {}) or {})
        out = {component: gr.skip() for component in self.controls.values()}  # what the link does not set
        for name, text in params.items():
            if name in LINKED and name in self.controls:
                default = self.app.controls[name].default
                try:
                    out[self.controls[name]] = type(default)(text) if not isinstance(default, str) else text
                except (TypeError, ValueError):
                    continue
        pair = out[self.controls["pair_name"]]
        first = self.shown[0].controls["pair_name"] if self.shown else None
        if isinstance(pair, str) and pair in self.app.store.names and pair != first:
            out |= self.pair_results(pair)
        return out

    def estimate(self, **controls) -> str:
        return estimate_line(self.app, **controls)

    # --- the page and its events ------------------------------------------------------------------

    def build(self, page: Page) -> None:
        app = self.app
        first = self.shown[0] if self.shown else None
        with gr.Row():
            with gr.Column(scale=1, min_width=280):
                run, stop, preset = self._controls_column()
            with gr.Column(scale=3, min_width=280):
                gallery = self._results_column(first)
        # This visitor's latest run, for the Inspect tab: kept a limited time, and only for the latest sessions
        # (the server's state capacity), so memory stays bounded however many visitors come.
        self.inspected = gr.State(None, time_to_live=app.limits.session_ttl)
        self.saved = gr.State(None, time_to_live=app.limits.session_ttl)  # the visitor's knobs a pair locked
        # The pair the result panes belong to (None while a run is under way or after Stop).
        self.results = gr.State(first.controls["pair_name"] if first else None, time_to_live=app.limits.session_ttl)
        self.outputs = [self.target, self.csd, self.map, self.draft, self.stats, self.speed, self.summary]
        self.outputs += [self.inspected, self.slider, self.composite, self.link, self.results]
        self.panes = [o for o in self.outputs if o is not self.inspected]  # what a pair's example sets
        app.components = self.controls
        event = self._events(page, run, stop, preset, gallery)
        page.controls, page.inspected, page.generated = self.controls, self.inspected, event

    def _events(self, page: Page, run, stop, preset, gallery):
        """Generate (the page's and the API's event), Stop, another pair, an example, a preset and the expected
        time; returns the page's Generate event."""
        app, c = self.app, self.controls
        checker = lambda **values: check_generate(app, None, False, **values)
        # The page's event shows a refusal in the status line; the API's refuses before the queue, by name.
        fns = (self.generate_ui, self.generate)
        event = twin_events(run, *fns, "generate", self.controls, self.outputs, checker, page.queue)
        private = {"api_visibility": "private"}
        # Cancel first, then say so: a message the run had already sent cannot overwrite "Stopped".
        stop.click(None, None, None, cancels=[event], **private).then(
            self.generate_stopped, None, self.outputs, **private
        )
        quick = {"api_visibility": "private", "queue": False}  # instant page events: no queue slot, no job
        shown = [c[k] for k in ("class_name", "prompt", "ar_steps", "cfg_schedule")]
        shown += [self.examples, self.saved, self.card, *self.panes]
        knobs = [c["pair_name"], c["ar_steps"], c["cfg_schedule"], self.saved, self.results]
        # Another pair, or an example, stops a run under way: its images would come in under other controls.
        c["pair_name"].change(self.pair_changed, knobs, shown, cancels=[event], **quick)
        if gallery is not None:
            gallery.select(self.show_example, None, [*c.values(), *self.outputs], cancels=[event], **quick)
        preset.input(self.apply_preset, inputs_kwargs={"name": preset, **c}, outputs=list(c.values()), **quick)
        gr.on([x.change for x in c.values()], self.estimate, inputs_kwargs=c, outputs=self.estimate_md, **quick)
        return event
