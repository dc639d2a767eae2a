"""A paper-scale run as Markdown: the plan (the dry run's table and estimate) and the measured tables."""

from __future__ import annotations

from csd.experiments.paper_scale.plan import Cell, GridConfig, paper_pairs
from csd.records.cost import csd_passes
from csd.serving.catalog import entry_of

RANDOM_NOTE = (
    "RANDOM WEIGHTS (seeded, {sizes}): the timings are real; acceptance, resampling work and image quality are "
    "not those of trained models."
)
QUALITY_NOTE = (
    "Quality is not measured by this command: FID needs real weights and tens of thousands of images "
    "(csd.experiments.fid); with random weights it means nothing."
)


def _f(v, digits: int = 2) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def _g(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _gib(v) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


def plan_text(cells: list[Cell], grid: GridConfig, est: dict, budget: float | None) -> str:
    lines = [
        "# CSD at paper scale: plan (dry run, nothing built or run)",
        "",
        f"Weights: seeded random at {'tiny sizes' if grid.tiny else 'the official sizes'} (official checkpoints "
        f"instead where --checkpoints holds them). Warm-up {grid.warmup} + {grid.repeats} interleaved repeats of "
        f"target-only, draft-only and CSD per gamma; prefill {grid.prefill}.",
        f"Estimate: {est['assumptions']}.",
        "",
        "| pair | batch | gammas | AR steps | head / flow steps | CFG | target passes | est. target-only s | "
        "est. speed-up (model) | est. cell s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_cell = {(r["pair"], r["batch"]): r for r in est["rows"]}
    for cell in cells:
        s, r = cell.sampling, by_cell.get((cell.pair.paper_name, cell.batch))
        passes = ", ".join(str(csd_passes(cell.num_tokens, s, grid.csd(g))[0]) for g in cell.gammas)
        speedups = "skipped" if r is None else ", ".join(f"{v:.2f}x" for v in r["speedups"].values())
        lines.append(
            f"| {cell.pair.paper_name} | {cell.batch} | {', '.join(map(str, cell.gammas))} | {s.num_steps} "
            f"| {cell.head_steps} | {s.cfg_scale} ({s.cfg_schedule}) | {passes} of {s.num_steps} | "
            f"{_g(r and r['target_s'])} | {speedups} | {_g(r and r['cell_s'])} |"
        )
    lines += [""] + [f"Skipped {name}: {why}" for name, why in est["skipped"].items()]
    prompted = {c.pair.family: c.traits.family for c in cells if c.traits.conditions == "prompts"}
    for arch, name in prompted.items():
        p, n = entry_of(arch).paper.prompt_shape(grid.tiny)
        lines.append(f"{name} prompts: {p} tokens (null prompt {n}), the official template's length.")
    total = est["total_s"]
    lines.append(
        f"Estimated total: {total:.0f} s ({total / 60:.1f} min), of which building models {est['setup_s']:.0f} s."
    )
    if budget is not None and total > budget:
        lines.append(
            f"WARNING: the estimate ({total:.0f} s) exceeds --budget-s {budget:g}: shrink the grid (a run skips "
            "the cells whose estimate no longer fits)."
        )
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = ["# CSD at paper scale", ""]
    if result["random_weights"]:
        lines += [f"**{result['weights_note']}**", ""]
    lines += [
        f"{s['device_name']}, backbones {s['precision']}, heads {s['heads']}, torch {s['torch']}; warm-up "
        f"{s['warmup']} + {s['repeats']} interleaved repeats; prefill {s['prefill']}. Speed-up = median target-only "
        "time / median CSD time (min-max of the per-round ratios); bound: the cost model "
        "(csd.records.cost.speedup_bound) "
        "on this run's per-pass costs; est.: the dry run's rough model, for calibrating it.",
        "",
    ]
    for pair in result["pairs"]:
        lines += [f"## {pair['pair']} ({pair.get('weights', 'not built')})", ""]
        if pair.get("skipped"):
            lines += [f"Skipped: {pair['skipped']}", ""]
            continue
        lines += [pair_line(pair, s["tiny"]), "", *cell_table(pair["rows"]), ""]
        if pair.get("quality"):
            lines += [*quality_table(pair, result.get("fid", {})), ""]
    kind = next((r["peak_memory"]["kind"] for p in result["pairs"] for r in p["rows"] if "peak_memory" in r), None)
    if kind:
        lines.append(f"Peak memory: {kind}.")
    if not any(p.get("quality") for p in result["pairs"]):
        lines.append(result["quality"])
    return "\n".join(lines) + "\n"


def quality_table(pair: dict, fid: dict) -> list[str]:
    """Table 1's format for one pair: per sampler the speed-up (at the largest batch timed), FID, IS and the
    acceptance of the images scored."""
    rows = [r for r in pair["rows"] if not r.get("skipped")]
    batch = max((r["batch"] for r in rows), default=None)
    speedup = {f"CSD, gamma {r['gamma']}": r["speedup"] for r in rows if r["batch"] == batch}
    lines = [
        f"Quality ({fid.get('n', '?')} images per sampler, FID against {fid.get('stats', '?')}, Inception "
        f"{fid.get('backend', '?')}; speed-up at batch {batch}):",
        "",
        "| sampler | speed-up | FID | IS | acceptance |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, q in pair["quality"].items():
        sp = 1.0 if name == "target only" else speedup.get(name)
        score = (
            f"{_f(q.get('inception_score'))} +- {_f(q.get('inception_score_std'))}" if "inception_score" in q else "-"
        )
        lines.append(f"| {name} | {_f(sp)}x | {_f(q['fid'])} | {score} | {_f(q['acceptance'])} |")
    return lines


def pair_line(pair: dict, tiny: bool) -> str:
    """A pair's settings, sizes and what its family's catalog entry adds (the paper's speed-ups at the official
    sizes)."""
    sm, params = pair["sampling"], pair["params"]
    paper = entry_of(pair["family"]).paper
    line = (
        f"{sm['num_steps']} AR steps, {pair['head_steps']} {paper.head_name if paper else 'head'} steps, "
        f"cfg {sm['cfg_scale']} ({sm['cfg_schedule']}); {params['target'] / 1e6:.1f}M / {params['draft'] / 1e6:.1f}M "
        "parameters."
    )
    if pair.get("prompt_tokens"):
        line += f" Prompts of {pair['prompt_tokens']} tokens."
    if paper and paper.note:
        line += f" {paper.note}"
    published = next((p.published for p in paper_pairs() if p.paper_name == pair["pair"]), "")
    if published and not tiny:
        line += f" Paper (Table 1): {published}."
    return line


def cell_table(rows: list[dict]) -> list[str]:
    lines = [
        "| batch | gamma | target passes | target-only s | CSD s | speed-up (min-max) | bound | est. | "
        "backbones / heads / accept / resample | acceptance | peak GiB target / CSD |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['batch']} | | | | | skipped: {r['skipped']} | | | | | |")
            continue
        t, m = r["time_split"], r["peak_memory"]
        split = " / ".join(f"{100 * t[k]:.0f}%" for k in ("backbones", "heads", "acceptance", "resampling"))
        est = r.get("estimate", {}).get("speedup")
        lines.append(
            f"| {r['batch']} | {r['gamma']} | {r['target_passes']} of {r['num_steps']} | {_f(r['target_s'], 3)} | "
            f"{_f(r['csd_s'], 3)} | {_f(r['speedup'])}x ({_f(r['speedup_min'])}-{_f(r['speedup_max'])}) | "
            f"{_f(r['speedup_bound'])}x | {_f(est)}x | {split} | {_f(r['acceptance'])} | "
            f"{_gib(m['target'])} / {_gib(m['csd'])} |"
        )
    return lines
