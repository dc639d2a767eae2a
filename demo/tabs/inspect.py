"""The Inspect tab: the session's latest Generate run replayed block by block beside target-only, a token
inspector (both chains, the acceptance test's terms, the candidates in place) and the likely artifacts."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import gradio as gr

from csd.experiments.analysis import Run, run_csd, run_single
from csd.experiments.inspection import artifact_hints, inspect_token, token_index
from csd.records.replay_frames import Frame, replay_frames
from csd.serving.jobs import Job
from demo.application import App, drain
from demo.controls import named, refuse_invalid, take
from demo.errors import refuse, short
from demo.gpu import task
from demo.requests import Request, validator
from demo.tab import Page
from demo.views import token_markdown, token_patches
from visualize.images import legend_html, locate
from visualize.render import to_plotly
from visualize.replay import REPLAY_STYLE, chains_chart, frame_images

PLAY_SECONDS = 0.5  # between frames of the replay
RUNS = {"target": 1, "csd": 1}  # the runs of an inspection, by kind
IMAGE = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False}


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


def _position(components: dict | None, image, row, column) -> tuple:
    """The token's position, each value checked against its box where the page gave it."""
    values = {"image": image, "row": row, "column": column}
    for name, component in (components or {}).items():
        if name in values:
            try:
                values[name] = take(component, values[name])
            except gr.Error as err:
                err.control = name
                raise
    return values["image"], values["row"], values["column"]


def check_inspect(
    app: App, image: int, row: int, column: int, components: dict | None = None, load: bool = True, **controls
) -> Request | None:
    """The request of an inspection, with the token's position checked against it before any model runs."""
    r = app.request(components, load, **controls)
    if r is None:
        return None
    image, row, column = _position(components, image, row, column)
    side = math.isqrt(r.pair.num_tokens)
    for name, value, hi in (("image", image, len(r.seeds) - 1), ("row", row, side - 1), ("column", column, side - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            what = "Image" if name == "image" else f"Token {name}"
            of = "the batch" if name == "image" else f"the {side} x {side} grid of {r.pair.name}"
            raise refuse(f"{what} must be an integer in [0, {hi}] ({of}), got {short(value)}", control=name)
    seconds = app.estimate(r, RUNS, measure=load)
    app.check_fits(seconds, "ask for fewer images or AR steps", "batch_size")
    return r


def inspect_run(
    app: App, image: int, row: int, column: int, progress, components: dict | None = None, **controls
) -> dict:
    """For API clients: run target-only and CSD with the given controls and seeds (one GPU call), then return
    the replay (each frame's label, AR steps and per-token status), the token's inspection and the hints."""
    r = check_inspect(app, image, row, column, components, **controls)
    image, row, column = _position(components, image, row, column)
    seconds = app.estimate(r, RUNS)
    call = app.gpu.call("inspect", r.plain(), seconds)
    run = drain(app.follow(call, ["target-only", "CSD"], progress, app.load(r), (r.pair.name, seconds)))
    try:
        token = run.token(image, row, column)
    except ValueError as err:
        raise refuse(f"Invalid token: {err}") from None
    frames = [{"label": f.label, "ar_steps": f.ar_steps, "status": f.status.tolist()} for f in run.frames]
    return {"frames": frames, "token": token, "hints": run.hints}


@task("inspect")
def inspect_task(app: App, **request):
    """The GPU task of :func:`inspect_run`: target-only and CSD with its details, for the request checked before
    the call (:meth:`demo.requests.Request.plain`)."""
    r = Request.from_plain(app.store, **request)

    def work(job: Job) -> Inspected:
        target = run_single(r.pair, r.labels, r.seeds, r.sampling, on_step=job.on_step("target-only"))
        spec = run_csd(r.pair, r.labels, r.seeds, r.sampling, r.csd, job.on_step("CSD"), keep_details=True)
        return Inspected.of(r.pair.name, spec, target)

    yield from app.job_events(work)


class InspectTab:
    title = "Inspect"

    def __init__(self, app: App):
        self.app = app

    def replay(self, run: Inspected | None, frame: int):
        """Frame ``frame`` (1-based, as the slider shows it) of the session's latest run: its label (with the
        pair it ran on), the CSD canvas, its status map and the target-only canvas after as many AR steps."""
        if run is None:
            return {
                self.label: "Press **Generate** first: the latest run of this page is replayed here."
            } | dict.fromkeys((self.canvas, self.status, self.target))
        if isinstance(frame, bool) or not isinstance(frame, int) or not 1 <= frame <= len(run.frames):
            raise refuse(f"Frame must be an integer in [1, {len(run.frames)}], got {short(frame)}", control="frame")
        f = run.frames[frame - 1]
        csd, status, target = frame_images(f, lambda tokens: self.app.decode(run.pair_name, tokens))
        label = f"**Frame {frame} of {len(run.frames)}:** {f.label} ({f.ar_steps} AR steps made), on *{run.pair_name}*"
        return {self.label: label, self.canvas: csd, self.status: status, self.target: target}

    def show_token(self, run: Inspected | None, image: int, row: int, column: int):
        """The token at (row, column) of image ``image``: a summary, the candidate values as patches in
        the image, both chains' transitions, and every number as JSON."""
        if run is None:
            return {self.token: "Press **Generate** first."} | dict.fromkeys((self.patches, self.chains, self.data))
        refuse_invalid({"image": image, "row": row, "column": column})
        try:
            info = run.token(image, row, column)
        except ValueError as err:
            raise refuse(f"Invalid token: {err}") from None
        decode = lambda tokens: self.app.decode(run.pair_name, tokens)
        return {
            self.token: token_markdown(info, self.app.store.source(run.pair_name).traits.row_name),
            self.patches: token_patches(decode, run.csd.generation.tokens, info),
            self.chains: to_plotly(chains_chart(info)),
            self.data: info,
        }

    def select_on_map(self, run: Inspected | None, evt: gr.SelectData):
        """A click on the status map -> (image, row, column) of the token under it."""
        if run is None:
            raise refuse("Press **Generate** first.")
        x, y = evt.index
        trace = run.csd.trace
        size = self.app.image_side(run.pair_name, run.csd.generation.tokens)
        return locate(int(x), int(y), trace.batch, trace.num_tokens, size)

    def after_run(self, run: Inspected | None):
        """Once a Generate run is in: the frame slider over its frames at the last one, the hints table, the
        last frame and the top hint opened in the inspector."""
        if run is None:
            return (
                {self.frame: gr.update(minimum=1, maximum=2, value=1), self.hints: None}
                | self.replay(None, 1)
                | (self.show_token(None, 0, 0, 0))
            )
        last, top = len(run.frames), run.hints[0]
        table = [
            [h["image"], h["row"], h["column"], round(h["distance"], 3), h["maker"], h["ar_step"] + 1]
            for h in run.hints
        ]
        where = {self.where[k]: top[k] for k in ("image", "row", "column")}  # the boxes say which token is open
        return (
            {self.frame: gr.update(minimum=1, maximum=max(last, 2), value=last), self.hints: table}
            | where
            | self.replay(run, last)
            | self.show_token(run, top["image"], top["row"], top["column"])
        )

    def play(self, run: Inspected | None):
        """Every frame in turn, a few per second: the run block by block."""
        if run is None:
            raise refuse("Press **Generate** first: there is no run to play.")
        for k in range(1, len(run.frames) + 1):
            yield {self.frame: k} | self.replay(run, k)
            time.sleep(PLAY_SECONDS)

    @staticmethod
    def select_hint(run: Inspected | None, evt: gr.SelectData):
        if run is None:
            raise refuse("Press **Generate** first.")
        hint = run.hints[evt.index[0]]
        return hint["image"], hint["row"], hint["column"]

    def inspect_api(self, image: int, row: int, column: int, request: gr.Request, progress=gr.Progress(), **controls):  # noqa: B008
        app, components = self.app, self.p_components
        app.check_client(request)
        check = lambda: check_inspect(app, image, row, column, components, False, **controls)
        estimate = lambda: app.estimate(check_inspect(app, image, row, column, components, True, **controls), RUNS)
        with app.turn(request, controls.get("pair_name"), check, estimate, "fewer images (Images)", progress) as turn:
            drain(iter(turn))  # its place in the line: the API's caller sees only the result
            return inspect_run(app, image, row, column, progress, components, **controls)

    def build(self, page: Page) -> None:
        controls, inspected, generated, queue = page.controls, page.inspected, page.generated, page.queue
        play, position, open_token = self._layout()
        shown = [self.label, self.canvas, self.status, self.target]
        opened = [self.token, self.patches, self.chains, self.data]
        self.where = position
        where = list(position.values())
        private = {"api_visibility": "private"}
        quick = private | {"queue": False}  # decoding a few images: no queue slot
        generated.then(self.after_run, inspected, [self.frame, self.hints, *where, *shown, *opened], **private)
        self.frame.release(self.replay, [inspected, self.frame], shown, **quick)
        self.frame.input(self.replay, [inspected, self.frame], shown, **quick)  # a typed frame number too
        play.click(self.play, inspected, [self.frame, *shown], **private)
        open_token.click(self.show_token, [inspected, *where], opened, **private)
        self.status.select(self.select_on_map, inspected, where, **private).then(
            self.show_token, [inspected, *where], opened, **private
        )
        self.hints.select(self.select_hint, inspected, where, **private).then(
            self.show_token, [inspected, *where], opened, **private
        )
        # For API clients: the same, from the run's settings (the run is made again with the same seeds).
        api = gr.Button(visible=False)
        api_out = gr.JSON(visible=False)
        inputs = {**controls, **position}
        self.p_components = self.app.components | position

        def check(image, row, column, **values):
            return check_inspect(self.app, image, row, column, self.p_components, False, **values)

        api.click(
            self.inspect_api,
            inputs_kwargs=inputs,
            outputs=api_out,
            api_name="inspect",
            validator=validator(check, inputs),
            preprocess=False,
            **queue,
        )

    def _layout(self) -> tuple[gr.Button, dict, gr.Button]:
        """The replay (frame, canvases, status map) and the token's panes; returns Play, the position's
        fields and Open token."""
        gr.Markdown(
            "The latest **Generate** run of this page, replayed: the CSD canvas after each pre-fill step, each "
            "drafted block (the draft's proposal, orange) and each verification, beside the target-only canvas "
            "after as many AR steps. Click a token on the status map, pick a row of the table, or type its position."
        )
        self.label = gr.Markdown(
            "Press **Generate** first: the latest run of this page is replayed here.", elem_id="replay-label"
        )
        with gr.Row():
            self.frame = named(gr.Slider(1, 2, value=1, step=1, precision=0, label="Frame", scale=4))
            play = gr.Button("Play", scale=1, min_width=80, elem_id="replay-play")
        with gr.Row():
            self.canvas = gr.Image(elem_id="replay-csd", label="CSD canvas", **IMAGE)
            self.status = gr.Image(elem_id="replay-map", label="Status (click a token)", **IMAGE)
            self.target = gr.Image(elem_id="replay-target", label="Target only, same AR steps", **IMAGE)
        gr.HTML(legend_html(REPLAY_STYLE))
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                position = {
                    "image": named(gr.Number(value=0, minimum=0, precision=0, label="Image")),
                    "row": named(gr.Number(value=0, minimum=0, precision=0, label="Token row")),
                    "column": named(gr.Number(value=0, minimum=0, precision=0, label="Token column")),
                }
                open_token = gr.Button("Open token")
                self.hints = gr.Dataframe(
                    headers=["img", "row", "col", "dist", "made by", "step"],
                    label="Likely artifacts: tokens farthest from the target-only image",
                    interactive=False,
                    elem_id="hints",
                )
            with gr.Column(scale=2):
                self.token = gr.Markdown(elem_id="token-summary")
                self.patches = gr.Image(
                    label="Draft / target / final / target-only, in place", elem_id="token-patches", **IMAGE
                )
                self.chains = gr.Plot(show_label=False, elem_id="token-chains")
                with gr.Accordion("Token data (JSON)", open=False):
                    self.data = gr.JSON()
        return play, position, open_token
