"""How results are shown: the run summary and its table, the speed chart, the token inspector's text and
patches, the analysis panels and the frontier's status line. Pure functions of results; no model runs."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import torch

from csd.experiments.analysis import Run, cost_model
from csd.records.panel_data import Panels, json_float
from csd.records.verdict import METRICS, result_metrics, verdict_line
from csd.serving.pairs import ModelPair
from csd.trace import Maker
from demo.requests import Request
from visualize.frontier_chart import frontier_chart
from visualize.images import display_grid, upscale
from visualize.panels import analysis_charts, time_breakdown
from visualize.render import to_plotly
from visualize.tables import frontier_markdown


def image_grid(pair: ModelPair, run: Run) -> np.ndarray:
    return display_grid(pair.images(run.generation.tokens).numpy())


def run_summary(r: Request, target: Run, spec: Run, draft: Run) -> dict:
    """The numbers of one comparison, JSON-ready (the API's last output)."""
    t = spec.trace
    model, bound = cost_model(target.trace, draft.trace, r.sampling, r.csd, r.pair.traits.head_per_block)
    return {
        "pair": r.pair.name,
        "batch_size": len(r.seeds),
        "seconds": {"target-only": target.seconds, "CSD": spec.seconds, "draft-only": draft.seconds},
        "speedup": target.seconds / spec.seconds,
        "cost_model_speedup": json_float(model),
        "bound": json_float(bound),
        "target_passes": {"target-only": target.trace.target_passes, "CSD": t.target_passes, "draft-only": 0},
        "draft_passes": {"target-only": 0, "CSD": t.draft_passes, "draft-only": draft.trace.draft_passes},
        "acceptance_rate": json_float(t.acceptance_rate),
        "unit": r.pair.traits.row_name,  # what a drafted row is
        "tokens": {
            k: t.count(m)
            for k, m in (
                ("prefill", Maker.PREFILL),
                ("accepted", Maker.ACCEPTED),
                ("resampled", Maker.RESAMPLED),
                ("capped", Maker.CAPPED),
                ("zeroed", Maker.ZEROED),
                ("next", Maker.NEXT),
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
    wall = {name: run.seconds for name, run in runs.items()}
    return time_figure({name: run.trace.times for name, run in runs.items()}, summary | {"seconds": wall})


def time_figure(phases: dict[str, dict[str, float]], summary: dict):
    """Where each run's time went (seconds per phase, the rest of its wall time as one more segment), titled
    with the speed-up: from a run just made or from a precomputed comparison's record of the same numbers."""
    title = f"Speedup {summary['speedup']:.2f}x: where the time goes"
    wall = {name: summary["seconds"][name] for name in phases}
    note = ", ".join(f"{name} {s:.2f} s" for name, s in wall.items())
    return to_plotly(time_breakdown(phases, title, f"wall: {note}", wall))


def _fmt(v, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def decision_sentence(t: dict) -> str:
    """Why a drafted token was kept or redrawn, in one sentence with its numbers."""
    u, p = t.get("accept_draw"), t.get("accept_prob")
    if t["maker"] == "prefill" or u is None or p is None:
        return ""
    kept = t["maker"] == "accepted"
    relation = "<" if kept else ">="
    outcome = "kept (the draft's token stays)" if kept else "redrawn from max(0, p - q)"
    return f"u = {u:.3f} {relation} min(1, r) = {p:.3f}: {outcome}."


def token_markdown(t: dict, row_name: str = "tokens") -> str:
    """The inspector's summary of one token (:func:`csd.experiments.inspection.inspect_token`); ``row_name``
    "cells" (xAR) adds why the trajectory term is zero there."""
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
            "",
            decision_sentence(t),
        ]
        if row_name == "cells":
            lines.append(
                "On xAR the trajectory term is exactly 0: each flow step's std, sqrt(2 t |dt|), is the same for "
                "draft and target (it depends on the time grid, not on the model), so the sum of log std gaps "
                "vanishes and the final-step term decides alone."
            )
    return "\n".join(lines)


def token_patches(decode: Callable[[torch.Tensor], np.ndarray], tokens: torch.Tensor, t: dict) -> np.ndarray:
    """The token's neighbourhood in the final CSD image with the token set to each candidate: the draft's
    proposal, the target's own sample, the final value and the target-only run's value."""
    tokens = tokens[t["image"] : t["image"] + 1]
    variants = [v for v in ("draft", "target", "final", "target_only") if t.get(v) and None not in t[v]]
    batch = tokens.repeat(len(variants), 1, 1)
    for i, name in enumerate(variants):
        batch[i, t["index"]] = torch.tensor(t[name])
    images = decode(batch)  # (k, H, W, 3) uint8
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


def frontier_status(
    result: dict | None,
    recomputed: bool = False,
    pair: str | None = None,
    regime: str | None = None,
    committed: dict | None = None,
) -> str:
    """The frontier's status line: what is shown, and for the benchmark's run its verdict line;
    ``committed``: the benchmark's frontier a recompute is drawn over."""
    if result is None:
        where = f" at {regime}" if regime else ""
        return f"No precomputed frontier for these models{where}: press **Recompute frontier**."
    steps = result["rows"][0]["sampling"]["num_steps"]
    what = "Recomputed" if recomputed else "Precomputed (default setting, `python -m csd.experiments.bench --frontier`)"
    key = result_metrics(result)[0]
    on = [r["name"] for r in result["rows"] if r["method"] == "CSD" and r[f"front_{key}"]]
    front = (
        f"CSD on the front ({METRICS[key][0]}): {', '.join(on)}."
        if on
        else (f"No CSD setting is on the front ({METRICS[key][0]}).")
    )
    name = result.get("pair", pair)
    where = f" on *{name}*" if name else ""
    line = (
        f"**{what}**{where}: {len(result['rows'])} settings around {steps} AR steps, "
        f"{result['n']} images each; time: {result['timing']}. {front}"
    )
    if not recomputed and "verdict" in result:
        line += f"\n\n**Verdict:** {verdict_line(result)}"
    if committed is not None:
        line += f" Drawn in grey over the benchmark's frontier at batch {committed['batch']} ({committed['n']} images)."
    return line


def frontier_outputs(result: dict | None, committed: dict | None = None) -> list:
    """The frontier's plot, table and JSON; with ``committed`` (the benchmark's), ``result`` is drawn over it."""
    if result is None:
        return [None, "", None]
    if committed is not None and committed is not result:
        chart = frontier_chart(committed, overlay=result)
    else:
        chart = frontier_chart(result)
    return [to_plotly(chart), frontier_markdown(result), result]


def side_by_side(images: list[np.ndarray], gap: int = 8) -> np.ndarray:
    """Images (H, W, 3) of one height, left to right with white gaps (shorter ones padded at the bottom)."""
    h = max(im.shape[0] for im in images)
    pad = lambda im: np.pad(im, ((0, h - im.shape[0]), (0, 0), (0, 0)), constant_values=255)
    spacer = np.full((h, gap, 3), 255, dtype=np.uint8)
    parts = [x for im in images for x in (pad(im), spacer)][:-1]
    return np.concatenate(parts, axis=1)
