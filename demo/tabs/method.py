"""The Method tab: how the method works in words and formulas (docs/how_it_works.md), what a block of drafted
steps costs as one chart per pair (the committed records of ``python -m csd.experiments.blocks``, their tables
in an accordion), the model cards of the pairs served, and the acceptance-rejection step on one 1-D Gaussian
token, with the measured acceptance and resampler tries beside their theory."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from csd.core.one_token import speculative_sample, total_variation
from csd.records.panel_data import json_float
from demo.application import App
from demo.cards import card_markdown
from demo.controls import MAX_SEED, named, refuse_invalid, take
from demo.requests import library_errors
from demo.tab import Page
from visualize.block_chart import block_chart
from visualize.render import to_plotly
from visualize.tables import committed_families, family_label
from visualize.toy import toy_chart

ROOT = Path(__file__).resolve().parents[2]
HOW_IT_WORKS = ROOT / "docs" / "how_it_works.md"
BLOCKS_DIR = ROOT / "bench" / "results" / "blocks"
TABLES = ("<!-- block-tables:start -->", "<!-- block-tables:end -->")
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def lesson_parts(text: str) -> tuple[str, str, str]:
    """docs/how_it_works.md cut around its block tables: (before, the tables and their reading, after)."""
    start, end = text.index(TABLES[0]), text.index(TABLES[1])
    return text[:start], text[start + len(TABLES[0]) : end], text[end + len(TABLES[1]) :]


def block_records(directory: Path = BLOCKS_DIR) -> list[tuple[str, dict]]:
    """Every committed blocks record with its family's label, in the families' docs order."""
    families = committed_families()
    rank = lambda name: (families.get(name, {}).get("docs") or {}).get("rank", len(families))
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    return [(family_label(r["family"], r["family"]), r) for r in sorted(records, key=lambda r: rank(r["family"]))]


def toy(target_mean: float, target_std: float, draft_mean: float, draft_std: float, samples: int, seed: int):
    """Draft from q, accept with min(1, p/q), resample from max(0, p - q): the chart, a table, the numbers."""
    values = dict(target_mean=target_mean, target_std=target_std, draft_mean=draft_mean, draft_std=draft_std)
    refuse_invalid(values | {"samples": samples, "seed": seed})
    p, q = (target_mean, target_std), (draft_mean, draft_std)
    with library_errors():
        result = speculative_sample(p, q, samples, seed)
    z = total_variation(p, q)
    summary = {
        "acceptance": result.acceptance,
        "one_minus_tv": max(0.0, 1.0 - z),
        "mean_tries": json_float(result.mean_tries),
        "inverse_z": json_float(1.0 / z if z > 0 else float("inf")),
        "capped": int(result.capped.sum()),
    }
    tries = "none needed" if summary["mean_tries"] is None else f"{result.mean_tries:.2f}"
    inv_z = "inf" if summary["inverse_z"] is None else f"{1 / z:.2f}"
    one_minus_tv = max(0.0, 1.0 - z)  # 1 - TV is >= 0; a rounding error below zero reads "-0.000"
    stats = (
        f"| | measured | theory |\n|---|---|---|\n"
        f"| acceptance | {result.acceptance:.3f} | 1 - TV(p, q) = {one_minus_tv:.3f} |\n"
        f"| resampler tries per rejection | {tries} | 1 / Z = {inv_z} |\n"
    )
    note = f"{samples} samples: acceptance {result.acceptance:.3f} vs 1 - TV = {one_minus_tv:.3f}"
    return to_plotly(toy_chart(p, q, result.samples, note=note)), stats, summary


class MethodTab:
    title = "Method"

    def __init__(self, app: App):
        self.app = app

    def build(self, page: Page) -> None:
        before, tables, after = lesson_parts(HOW_IT_WORKS.read_text())
        gr.Markdown(before, latex_delimiters=LATEX)
        block_charts()
        with gr.Accordion("The tables behind the charts, and how to read them", open=False):
            gr.Markdown(tables, latex_delimiters=LATEX)
        gr.Markdown(after, latex_delimiters=LATEX)
        store = self.app.store
        with gr.Accordion("The models served here (model card)", open=False):
            gr.Markdown(card_markdown([store.source(n) for n in store.names]), elem_id="model-cards")
        toy_section()


def block_charts() -> None:
    """One chart per pair, two a row: Frechet distance against CPU time per block and draft length."""
    records = block_records()
    for i in range(0, len(records), 2):
        with gr.Row(elem_classes="block-charts"):
            for label, record in records[i : i + 2]:
                gr.Plot(to_plotly(block_chart(record, label)), show_label=False, elem_classes="block-chart")


def toy_section() -> None:
    """The toy: sliders for p and q, the samples against both densities, acceptance and tries beside theory."""
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
            plot, stats, summary = toy(0.0, 1.0, 1.0, 1.5, 20_000, 0)
            outputs = [gr.Plot(plot, show_label=False), gr.Markdown(stats), gr.JSON(summary, label="Toy summary")]

    def checked(*values):  # raw values, each checked against its own control (demo.controls.take)
        return toy(*(take(c, v) for c, v in zip(inputs, values, strict=True)))

    checked.__name__ = "toy"
    triggers = [sample.click] + [x.release for x in inputs[:4]]
    gr.on(triggers, checked, inputs, outputs, api_name="toy", preprocess=False)
