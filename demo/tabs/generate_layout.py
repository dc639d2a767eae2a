"""The Generate tab's page: the controls column (Generate, Stop, the expected time, the presets and every
control), the result panes (target-only, CSD, the token map and draft-only, the status, the slider, the image
to share, the speed chart and the summary) with the gallery of precomputed comparisons, and what the result
panes show for a precomputed comparison, for a pair without one, and after Stop."""

from __future__ import annotations

from urllib.parse import urlencode

import gradio as gr

from csd.experiments.defaults import PRESETS
from csd.serving.pairs import EXAMPLE_PROMPTS
from demo import showcase
from demo.application import App
from demo.cards import model_line
from demo.views import side_by_side, time_figure
from visualize.images import legend_html

IMAGE = {"type": "numpy", "format": "png", "elem_classes": "csd-img", "interactive": False, "min_width": 120}
LINKED = ("pair_name", "class_name", "prompt", "seed", "batch_size", "ar_steps", "gamma", "prefill", "cfg_scale")


def settings_link(controls: dict) -> str:
    """A link that opens the page on these settings (read back by :meth:`demo.tabs.generate.GenerateTab.from_link`)."""
    query = urlencode({k: controls[k] for k in LINKED if k in controls})
    return f"[Link to these settings](?{query})"


class GenerateLayout:
    """The Generate tab's components, made by :meth:`_controls_column` and :meth:`_results_column` (the tab's
    ``build`` adds its session states and events), and what the result panes show; the handlers are
    :class:`demo.tabs.generate.GenerateTab`'s."""

    def __init__(self, app: App):
        self.app = app
        served = {n: app.store.source(n).weights for n in app.store.names}
        self.shown = showcase.load(weights=served)

    def example_of(self, pair_name: str) -> showcase.Shown | None:
        """The pair's first precomputed comparison served (None when it has none)."""
        return next((s for s in self.shown if s.controls.get("pair_name") == pair_name), None)

    def pair_results(self, pair_name: str) -> dict:
        """The result panes for a pair just chosen: its own precomputed comparison, or every pane cleared and
        one line saying to generate; never another pair's results."""
        shown = self.example_of(pair_name)
        if shown is not None:
            return self._shown(shown)
        panes = (self.target, self.csd, self.map, self.draft, self.speed, self.summary, self.slider, self.composite)
        line = f"Press **Generate** to see this pair (*{pair_name}*): no precomputed comparison of it is served."
        return dict.fromkeys(panes) | {self.stats: line, self.link: "", self.results: pair_name}

    def _shown(self, shown: showcase.Shown) -> dict:
        im = shown.images
        return {
            self.target: im["target"],
            self.csd: im["csd"],
            self.map: im["map"],
            self.draft: im["draft"],
            self.stats: shown_stats(shown, " Press **Generate** to run it on this server."),
            self.speed: shown_figure(shown),
            self.summary: shown.summary,
            self.results: shown.controls["pair_name"],
        } | self._extras(im["target"], im["csd"], im["map"], shown.controls)

    def _extras(self, target, csd, token_map, controls: dict) -> dict:
        return {
            self.slider: (target, csd),
            self.composite: side_by_side([target, csd, token_map]),
            self.link: settings_link(controls),
        }

    def generate_stopped(self):
        """What Stop shows: nothing of the stopped run (and nothing to inspect)."""
        message = "Stopped: the run was cancelled, and nothing from it is shown."
        return {**dict.fromkeys(self.outputs), self.stats: message}

    def _controls_column(self) -> tuple[gr.Button, gr.Button, gr.Radio]:
        """Generate, Stop, the expected time, the presets and every control (the advanced ones folded)."""
        app = self.app
        with gr.Row():
            run = gr.Button("Generate", variant="primary", elem_id="generate", scale=2, min_width=100)
            stop = gr.Button("Stop", scale=1, min_width=60)
        self.estimate_md = gr.Markdown("", elem_id="estimate")
        preset = gr.Radio(list(PRESETS), value="default", label="Preset", elem_id="preset")
        self.controls = {}
        for name, c in app.controls.items():
            if c.advanced:
                continue
            self.controls[name] = c.component()
            if name == "pair_name":
                self.card = gr.Markdown(model_line(app.store.source(c.default)), elem_id="model-card")
            if name == "prompt":
                self.examples = self._prompt_examples(self.controls[name])
        with gr.Accordion("Advanced", open=False):
            self.controls |= {name: c.component() for name, c in app.controls.items() if c.advanced}
        return run, stop, preset

    def _results_column(self, first: showcase.Shown | None) -> gr.Gallery | None:
        """The four image panes, the status, the slider, the image to share, the speed chart, the summary and
        the gallery of precomputed examples (None when none is served), opening on ``first``."""
        im = first.images if first else {}
        with gr.Row(equal_height=True, elem_classes="csd-pair"):
            self.target = gr.Image(im.get("target"), elem_id="img-target", label="Target only", **IMAGE)
            self.csd = gr.Image(im.get("csd"), elem_id="img-csd", label="Speculative (CSD)", **IMAGE)
        with gr.Row(equal_height=True, elem_classes="csd-pair"):
            self.map = gr.Image(im.get("map"), elem_id="img-map", label="Who made each token (CSD)", **IMAGE)
            self.draft = gr.Image(im.get("draft"), elem_id="img-draft", label="Draft only (same seeds)", **IMAGE)
        gr.HTML(legend_html())
        intro = "Press **Generate**: target-only, CSD and draft-only run with the same seeds."
        self.stats = gr.Markdown(shown_stats(first) if first else intro, elem_id="gen-status")
        with gr.Accordion("Slide between target-only and CSD", open=False):
            self.slider = gr.ImageSlider(
                (first.images["target"], first.images["csd"]) if first else None,
                label="target-only | CSD",
                elem_id="img-slider",
                interactive=False,
            )
        with gr.Accordion("One image to share: target | CSD | token map", open=False):
            self.composite = gr.Image(
                first.composite() if first else None,
                elem_id="img-composite",
                buttons=["download"],
                **{k: v for k, v in IMAGE.items() if k != "min_width"},
            )
            self.link = gr.Markdown(settings_link(first.controls) if first else "", elem_id="settings-link")
        self.speed = gr.Plot(shown_figure(first) if first else None, label="Speedup", elem_id="speed-plot")
        with gr.Accordion("Run summary (JSON)", open=False):
            self.summary = gr.JSON(first.summary if first else None)
        if not self.shown:
            return None
        return gr.Gallery(
            [(s.composite(), s.title) for s in self.shown],
            label="Precomputed examples (click one to load its settings and images)",
            columns=3,
            height="auto",
            allow_preview=False,
            elem_id="showcase",
        )

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


def shown_stats(shown: showcase.Shown, after: str = "") -> str:
    """A precomputed comparison's numbers, and a line naming it and the pair it was made on."""
    return f"{shown.stats}\n\n*Precomputed on {shown.controls['pair_name']}: {shown.title}.{after}*"


def shown_figure(shown: showcase.Shown):
    """A precomputed comparison's time split, as the chart shows it after a click (None without its phases)."""
    return time_figure(shown.phases, shown.summary) if shown.phases else None


def pick_example(sample: list) -> str:
    return sample[0]
