"""The Analysis tab: the paper's panels (draft-target distances with and without alignment, acceptance per
AR step under pre-fill, resampler iterations, sweeps), precomputed for the default setting and
recomputed for the Generate tab's controls; and quality against time among the cheap alternatives."""

from __future__ import annotations

import gradio as gr

from csd.experiments.analysis import Analysis, AnalysisSettings
from csd.experiments.grid import deciding_points, grid
from csd.experiments.small_frontier import SmallFrontier
from demo.application import App, pair_defaults, steps_job
from demo.controls import slider, take
from demo.errors import refuse
from demo.faults import Load
from demo.gpu import task
from demo.requests import Request, twin_events
from demo.tab import Page, shown_refusal
from demo.views import ANALYSIS_KEYS, analysis_figures, analysis_status, frontier_outputs, frontier_status, panels_json

SECTIONS = (  # (title, panels in the row), in the order of ANALYSIS_KEYS
    ("(a) Draft-target distance with and without alignment", 2),
    ("(b) Acceptance per AR step under pre-fill", 1),
    ("(c) Resampler", 2),
    ("Acceptance vs draft length, CFG scale, temperature", 3),
    ("The split of log r", 1),
    ("Where the time goes", 1),
)


FEWER = "fewer images (Images (n))"  # what a recompute refused for the line's length may ask for instead
# The benchmark's two regimes, each a committed frontier per pair (frontier_b<batch>.json).
REGIMES = {1: "batch 1 (latency: one image at a time)", 8: "batch 8 (throughput)"}


def regime_batch(regime) -> int:
    """The batch of a regime value, refused by name unless it is one of REGIMES."""
    if isinstance(regime, bool) or not isinstance(regime, int | float | str) or str(regime) not in map(str, REGIMES):
        raise refuse(f"Regime must be one of the batches {sorted(REGIMES)}, got {regime!r}", control="regime")
    return int(regime)


def _images(components: dict | None, n_images):
    """The images (n) value, checked against its slider where the page gave it."""
    component = (components or {}).get("n_images")
    if component is None:
        return n_images
    try:
        return take(component, n_images)
    except gr.Error as err:
        err.control = "n_images"
        raise


def plan_analysis(
    app: App, n_images: int, components: dict | None = None, load: bool = True, **controls
) -> tuple[Request, Analysis] | None:
    """The request and the planned runs of an analysis recompute, refused by name when over the server's work
    limit (``load=False``: a validator's check, :meth:`demo.application.App.request`); nothing is estimated here."""
    r = app.request(components, load, **controls, batch_size=1)
    if r is None:
        return None
    n_images = _images(components, n_images)
    work = n_images * r.sampling.num_steps
    if work > app.limits.max_analysis_steps:
        raise refuse(
            f"Images (n) x AR steps must be at most {app.limits.max_analysis_steps} on this server "
            f"(--max-analysis-steps, CSD_MAX_ANALYSIS_STEPS), got {n_images} x {r.sampling.num_steps} = {work}: "
            "ask for fewer images or AR steps",
            control="n_images",
        )
    settings = AnalysisSettings(n_images=n_images, seed=r.seeds[0], sampling=r.sampling, csd=r.csd, **r.condition())
    return r, Analysis(r.pair, settings)


def check_analysis(
    app: App, n_images: int, components: dict | None = None, load: bool = True, within: float | None = None, **controls
) -> tuple[Analysis, float] | None:
    """The planned runs of an analysis recompute and their estimated seconds, refused by name when over the
    server's limits (``within``: also when estimated past that many seconds)."""
    planned = plan_analysis(app, n_images, components, load, **controls)
    if planned is None:
        return None
    r, analysis = planned
    seconds = app.estimate_runs(r, analysis.planned(), analysis.settings.n_images, measure=load)
    app.check_fits(seconds, "ask for fewer images (n) or AR steps", "n_images", within)
    return analysis, seconds


def analysis_panels(app: App, n_images: int, progress, components: dict | None = None, **controls):
    """Recompute every panel over ``n_images`` images (image i: seed + i) at the controls, in one GPU call:
    yields status lines, returns the panels."""
    analysis, seconds = check_analysis(app, n_images, components, **controls)
    values, settings = {"pair_name": analysis.pair.name, "settings": analysis.settings}, analysis.settings
    load = Load(settings.n_images, settings.sampling.num_steps, "Images (n)")
    return (yield from app.run_all("analysis", values, seconds, progress, load))


@task("analysis")
def analysis_task(app: App, pair_name: str, settings: AnalysisSettings):
    """The GPU task of :func:`analysis_panels`: the runs of the analysis planned (and checked) before the call."""
    analysis = Analysis(app.store.get(pair_name), settings)
    yield from app.job_events(steps_job(analysis, analysis.panels))


def plan_frontier(
    app: App, n_images: int, components: dict | None = None, load: bool = True, **controls
) -> tuple[Request, SmallFrontier] | None:
    """The request and the settings of a frontier recompute, refused by name when over the work limit."""
    r = app.request(components, load, **controls, batch_size=1)
    if r is None:
        return None
    n_images = _images(components, n_images)
    work, most = n_images * r.sampling.num_steps, app.limits.max_analysis_steps // 2
    if work > most:
        raise refuse(
            f"Images (n) x AR steps of the frontier must be at most {most} on this server (half of "
            f"--max-analysis-steps, CSD_MAX_ANALYSIS_STEPS: it runs about 15 settings), got "
            f"{n_images} x {r.sampling.num_steps} = {work}: ask for fewer images or AR steps",
            control="n_images",
        )
    fixed = r.pair.traits.fixed_num_steps is not None  # xAR: one AR step per cell
    head = r.pair.target.head_steps(r.sampling.head_steps)
    traits = r.pair.traits
    points = grid(r.sampling, r.csd, head, quick=True, fixed_steps=fixed)
    points += deciding_points(r.sampling, head, traits.head_samplers, traits.takes_gtr)
    return r, SmallFrontier(r.pair, points, n_images, seed=r.seeds[0], **r.condition())


def check_frontier(
    app: App, n_images: int, components: dict | None = None, load: bool = True, within: float | None = None, **controls
) -> tuple[SmallFrontier, float] | None:
    """The settings of a frontier recompute and their estimated seconds, refused by name when over the
    server's limits (or ``within``)."""
    planned = plan_frontier(app, n_images, components, load, **controls)
    if planned is None:
        return None
    r, small = planned
    seconds = app.estimate_runs(r, small.planned(), len(small.seeds), measure=load)
    app.check_fits(seconds, "ask for fewer images (n) or AR steps", "n_images", within)
    return small, seconds


def frontier_result(app: App, n_images: int, progress, components: dict | None = None, **controls):
    """Every cheap alternative (target-only with fewer AR or head steps, a head schedule, CSD settings and
    combinations) around the controls, over ``n_images`` images, one run per setting, in one GPU call: yields
    status lines, returns the frontier."""
    small, seconds = check_frontier(app, n_images, components, **controls)
    load = Load(len(small.seeds), small.points[0].sampling.num_steps, "Images (n)")
    return (yield from app.run_all("frontier", small.plan(), seconds, progress, load))


@task("frontier")
def frontier_task(app: App, pair_name: str, **plan):
    """The GPU task of :func:`frontier_result`: the runs of the frontier planned (and checked) before the call
    (:meth:`csd.experiments.small_frontier.SmallFrontier.plan`)."""
    small = SmallFrontier(app.store.get(pair_name), **plan)
    yield from app.job_events(steps_job(small, small.result))


def default_images(app: App, check, pair_name: str | None = None) -> int:
    """The Images (n) a recompute (``check``: :func:`check_analysis` or :func:`check_frontier`) of the default
    controls of ``pair_name`` (default: the default pair) starts at on the page: the most (at most 4) estimated
    to fit the server's limits and ``--default-seconds``, as measured for that pair; 2 before any measurement."""
    most = min(4, app.limits.max_images)
    controls = {k: v for k, v in app.default_controls().items() if k != "batch_size"}
    if pair_name is not None and pair_name in app.store.names:
        controls = pair_defaults(app, controls, pair_name)
    if app.store.loaded(controls["pair_name"]) is None or not app.timed(controls["pair_name"]):
        return min(2, most)
    for n in range(most, 0, -1):
        try:
            check(app, n, None, False, app.limits.default_seconds, **controls)
            return n
        except gr.Error:
            continue
    return 1


def analyze_stopped() -> str:
    return "Stopped: the recompute was cancelled; the panels below are the ones shown before it."


def frontier_stopped() -> str:
    return "Stopped: the recompute was cancelled; the frontier below is the one shown before it."


class AnalysisTab:
    title = "Analysis"

    def __init__(self, app: App):
        self.app = app

    def analyze_page(self, n_images: int, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008
        """For the page: the panels on screen change only when every run has finished; a refused or stopped
        recompute leaves them as they were and says why, in the status line, until the next action."""
        run = self.analyze(n_images, request, progress, **controls)
        yield from shown_refusal(run, self.status, "Not recomputed", " The panels below are the ones shown before.")

    def analyze(self, n_images: int, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008
        """For API clients (after the validator): a refusal is an error."""
        app, components = self.app, self.a_components
        app.check_client(request)
        check = lambda: check_analysis(app, n_images, components, False, **controls)
        estimate = lambda: check_analysis(app, n_images, components, True, **controls)[1]
        with app.turn(request, controls.get("pair_name"), check, estimate, FEWER, progress) as turn:
            for line in turn:
                yield {self.status: line}
            work = analysis_panels(app, n_images, progress, components, **controls)
            panels = yield from self._statuses(work, self.status)
            figures = dict(zip(self.plots, analysis_figures(panels), strict=True))
            yield {self.status: analysis_status(panels, recomputed=True), **figures, self.data: panels_json(panels)}

    def frontier_page(self, n_images: int, request: gr.Request, progress=gr.Progress(), regime=1, **controls):  # noqa: B008
        """For the page: a refused or stopped recompute leaves the frontier shown as it was and says why."""
        run = self.recompute_frontier(n_images, request, progress, regime, **controls)
        yield from shown_refusal(run, self.f_status, "Not recomputed", " The frontier below is the one shown before.")

    def recompute_frontier(self, n_images: int, request: gr.Request, progress=gr.Progress(), regime=1, **controls):  # noqa: B008
        """For API clients (after the validator): a refusal is an error; the recompute is drawn over the
        benchmark's frontier of the same pair in the chosen ``regime`` (a batch of REGIMES), never in its
        place."""
        batch = regime_batch(regime)
        app, components = self.app, self.f_components
        app.check_client(request)
        check = lambda: check_frontier(app, n_images, components, False, **controls)
        estimate = lambda: check_frontier(app, n_images, components, True, **controls)[1]
        with app.turn(request, controls.get("pair_name"), check, estimate, FEWER, progress) as turn:
            for line in turn:
                yield {self.f_status: line}
            work = frontier_result(app, n_images, progress, components, **controls)
            result = yield from self._statuses(work, self.f_status)
            committed = app.committed_front(result.get("pair"), batch)
            chart, table, data = frontier_outputs(result, committed)
            yield {
                self.f_status: frontier_status(result, recomputed=True, committed=committed),
                self.f_plot: chart,
                self.f_table: table,
                self.f_data: data,
            }

    def committed_outputs(self, pair_name: str | None, regime) -> dict:
        """The benchmark's frontier of the chosen pair and regime, with its status and verdict line."""
        try:
            batch = regime_batch(regime)
        except gr.Error as err:
            return {self.f_status: f"**Not shown:** {err.message}"}
        pair = pair_name if pair_name in self.app.store.names else None
        result = self.app.committed_front(pair, batch)
        chart, table, data = frontier_outputs(result)
        status = frontier_status(result, pair=pair_name, regime=REGIMES[batch])
        return {self.f_status: status, self.f_plot: chart, self.f_table: table, self.f_data: data}

    def analysis_images(self, pair_name: str) -> int:
        """The Images (n) an analysis recompute of the chosen pair starts at."""
        return default_images(self.app, check_analysis, pair_name)

    def frontier_images(self, pair_name: str) -> int:
        """The Images (n) a frontier recompute of the chosen pair starts at."""
        return default_images(self.app, check_frontier, pair_name)

    @staticmethod
    def _statuses(work, status):
        """Pass a recompute's status lines on as updates of ``status``; return its result."""
        while True:
            try:
                yield {status: next(work)}
            except StopIteration as done:
                return done.value

    def build(self, page: Page) -> None:
        app, controls, queue = self.app, page.controls, page.queue
        served_weights = app.store.source(app.panels.pair).weights if app.panels is not None else None
        self.status = gr.Markdown(
            analysis_status(app.panels, current_weights=served_weights), elem_id="analysis-status"
        )
        gr.Markdown(
            "Panels over *n* images (image *i*: seed + i, class + i) at the current Generate-tab controls; "
            "each sweep varies one knob around them. Recomputing takes a few dozen runs."
        )
        with gr.Row():
            lim = app.limits
            n_images = slider("Images (n)", default_images(app, check_analysis), 1, lim.max_images)
            n_images = self.n_images = n_images.component()
            recompute = gr.Button("Recompute for current controls", variant="primary")
            stop = gr.Button("Stop")
        quick = {"api_visibility": "private", "queue": False}
        # A chosen pair gets the most images that fit its own measured rates (xAR's runs cost more).
        controls["pair_name"].change(self.analysis_images, controls["pair_name"], n_images, **quick)
        figures, self.plots = iter(analysis_figures(app.panels)), []
        for title, count in SECTIONS:
            gr.Markdown(f"#### {title}")
            with gr.Row():
                for _ in range(count):
                    key = ANALYSIS_KEYS[len(self.plots)]
                    self.plots.append(gr.Plot(next(figures), show_label=False, elem_id=f"panel-{key}"))
        with gr.Accordion("Panel data (JSON)", open=False):
            self.data = gr.JSON(panels_json(app.panels))
        # One image per seed: the batch size plays no role in the analysis.
        inputs = {name: c for name, c in controls.items() if name != "batch_size"}
        outputs = [self.status, *self.plots, self.data]
        inputs = inputs | {"n_images": n_images}
        self.a_components = app.components | {"n_images": n_images}

        def check(n_images, **values):
            return check_analysis(app, n_images, self.a_components, False, **values)

        event = twin_events(recompute, self.analyze_page, self.analyze, "analyze", inputs, outputs, check, queue)
        stop.click(None, None, None, cancels=[event], api_visibility="private").then(
            analyze_stopped, None, self.status, api_visibility="private"
        )
        self._frontier_section({k: v for k, v in inputs.items() if k != "n_images"}, controls, queue)

    def _frontier_section(self, inputs: dict, controls: dict, queue: dict) -> None:
        """Quality against time for every cheap alternative of the current family: the benchmark's run for
        the default setting, or a recompute at a few images for the current controls."""
        app = self.app
        gr.Markdown("#### Quality vs time: CSD among the cheap alternatives")
        gr.Markdown(
            "Target-only with fewer AR steps, fewer head steps or a head-step schedule, CSD at several draft "
            "lengths, tests and pre-fills, and their combinations, at the current controls. Time is a ratio to "
            "target-only measured in the same run; the dashed line is the Pareto front (nothing is both faster "
            "and better); the verdict's two settings are ringed. Hover a point for its setting. The chart opens "
            "on the settings that decide the verdict: those far off it are triangles at its edge (hover one for "
            "its value; double-click the chart to see them all). A recompute runs each setting once over *n* "
            "images: its error bars are wide, the benchmark's (hundreds of images) are not."
        )
        first = app.committed_front(None, 1)
        self.f_status = gr.Markdown(frontier_status(first, regime=REGIMES[1]), elem_id="frontier-status")
        with gr.Row():
            lim = app.limits
            regime = gr.Radio(
                [(label, b) for b, label in REGIMES.items()],
                value=1,
                label="Regime of the committed frontier",
                info="Speculative decoding is meant for latency: at batch 1 one target pass costs about as much "
                "for one token as for many.",
                elem_id="frontier-regime",
            )
            n_default = default_images(app, check_frontier)
            n_images = slider("Images (n) for the frontier", n_default, 1, lim.max_images).component()
            n_images.elem_id = "frontier-n"
            self.f_n_images = n_images
            quick = {"api_visibility": "private", "queue": False}
            controls["pair_name"].change(self.frontier_images, controls["pair_name"], n_images, **quick)
            recompute = gr.Button("Recompute frontier", variant="primary")
            stop = gr.Button("Stop")
        chart, table, data = frontier_outputs(first)
        self.f_plot = gr.Plot(chart, show_label=False, elem_id="panel-frontier")
        with gr.Accordion("Frontier table", open=False):
            self.f_table = gr.Markdown(table, elem_id="frontier-table")
        with gr.Accordion("Frontier data (JSON)", open=False):
            self.f_data = gr.JSON(data)
        outputs = [self.f_status, self.f_plot, self.f_table, self.f_data]
        for trigger in (controls["pair_name"], regime):
            trigger.change(self.committed_outputs, [controls["pair_name"], regime], outputs, **quick)
        inputs = inputs | {"n_images": n_images, "regime": regime}
        self.f_components = app.components | {"n_images": n_images}

        def check(n_images, regime=1, **values):
            regime_batch(regime)
            return check_frontier(app, n_images, self.f_components, False, **values)

        fns = (self.frontier_page, self.recompute_frontier)
        event = twin_events(recompute, *fns, "frontier", inputs, outputs, check, queue)
        stop.click(None, None, None, cancels=[event], api_visibility="private").then(
            frontier_stopped, None, self.f_status, api_visibility="private"
        )
