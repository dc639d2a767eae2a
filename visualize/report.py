"""Benchmark results into the repository: each result's tables (Markdown) and each frontier's charts beside
its JSON, each benchmark's tables into docs/results.md and its headline into the README (the class
pair's blocks, or the text and xAR pairs' own: ``text-bench`` / ``xar-bench``, ``text-headline`` /
``xar-headline``). A decision (``csd.experiments.decide``) gets its table beside it, and the decisions named
together their summary on stdout, for the README.

    python -m visualize.report bench/results/bench.json bench/results/frontier_b1.json [...]

The measurements themselves (``python -m csd.experiments.bench``) only write JSON; the verdict rule is
:mod:`csd.verdict`'s.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from csd.verdict import METRICS, SLACK, result_metrics, verdict, verdict_line
from visualize.frontier import cost_chart, frontier_chart
from visualize.render import save_png

ROOT = Path(__file__).resolve().parents[1]
# The blocks of docs/results.md and the README that hold each embedded pair's results, by its family.
DOCS_PREFIX = {"MAR": "", "Harmon": "text-", "xAR": "xar-"}


# --- a benchmark's tables -----------------------------------------------------------------------------


def _f(v: float, digits: int = 2) -> str:
    return "nan" if v != v else f"{v:.{digits}f}"


def bench_markdown(result: dict) -> str:
    """A benchmark's tables (bench.md): the speed-up grid, quality per sampler, alignment, where the time goes."""
    s = result["settings"]
    sampling = s["sampling"]
    criterion, term = s["csd"]["criterion"], s["csd"]["trajectory_term"]
    non_default = "" if (criterion, term) == ("aligned", "derived") else f", criterion {criterion}"
    if non_default and criterion == "aligned":
        non_default += f" (trajectory term {term})"
    lines = [
        "# CSD benchmark",
        "",
        f"S = {sampling['num_steps']} AR steps, cfg {sampling['cfg_scale']} ({sampling['cfg_schedule']}), "
        f"prefill {s['csd']['prefill']}, tau_v {s['csd']['tau_v']}{non_default}; "
        f"{s['device']}, {s['threads']} threads, "
        f"{s['bench']['repeats']} interleaved repeats. Times are ratios to target-only with the same S.",
        "",
        "| batch | gamma | target passes | speedup (min-max) | bound | simple bound | fewer-steps time | acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['gamma']} | {r['target_passes']} | {_f(r['speedup'])}x "
            f"({_f(r['speedup_min'])}-{_f(r['speedup_max'])}) | {_f(r['speedup_bound'])}x | "
            f"{_f(r['speedup_bound_simple'])}x | {_f(r['fewer_steps_time'])} | {_f(r['acceptance'])} |"
        )
    n = s["bench"]["n"]
    lines += [
        "",
        f"Quality at batch {s['default_batch']}, gamma {s['csd']['gamma']}: {n} images per sampler, Frechet distance "
        f"to {s['bench']['n_ref']} held-out real images (two real sets of {n}: {_f(result['fd_real'])}).",
        "",
        "| sampler | time vs target | class accuracy |" + _prompt_header(result)[0] + " Frechet distance |",
        "| --- | --- | --- |" + _prompt_header(result)[1] + " --- |",
    ]
    for key, name, rel_time in (
        ("target", "target only", 1.0),
        ("csd", "CSD", 1.0 / result["speedup"]),
        ("csd_unaligned", "CSD without alignment", float("nan")),
        ("fewer", f"target, {_fewer(result)}", result["fewer_steps_time"]),
        ("draft", "draft only", result["draft_time"]),
    ):
        acc, fd = result[f"accuracy_{key}"], result[f"fd_{key}"]
        colour = _prompt_cells(result, key)
        lines.append(f"| {name} | {_f(rel_time)} | {_f(acc, 3)} |{colour} {_f(fd)} |")
    by_gamma = result.get("quality_by_gamma", [])
    if len(by_gamma) > 1:
        lines += [
            "",
            f"CSD against draft length, same labels and seeds (speedup at batch {s['default_batch']} where the grid "
            "timed that gamma):",
            "",
            "| gamma | target passes | speedup | acceptance | class accuracy | Frechet distance | FD to target-only |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| target only | {sampling['num_steps']} | 1.00x | | {_f(result['accuracy_target'], 3)} | "
            f"{_f(result['fd_target'])} | 0 |",
        ]
        lines += [
            f"| {q['gamma']} | {q['target_passes']} | {_f(q['speedup'])}x | {_f(q['acceptance'], 3)} | "
            f"{_f(q['accuracy'], 3)} | {_f(q['fd'])} | {_f(q['fd_vs_target'])} |"
            for q in by_gamma
        ]
    lines += [
        "",
        f"Frechet distance CSD vs target-only images: {_f(result['fd_csd_vs_target'])}.",
        "",
        "| | aligned | unaligned |",
        "| --- | --- | --- |",
        f"| acceptance | {_f(result['acceptance_aligned'], 3)} | {_f(result['acceptance_unaligned'], 3)} |",
        f"| mean draft-target distance | {_f(result['distance_aligned'], 3)} | {_f(result['distance_unaligned'], 3)} |",
        f"| mean resampler tries | {_f(result['resample_tries_aligned'])} | {_f(result['resample_tries_unaligned'])} |",
        f"| cap hits | {result['cap_hits_aligned']} | {result['cap_hits_unaligned']} |",
    ]
    if "acceptance_token_aligned" in result:
        lines.append(
            f"| acceptance per token (each token of a cell tested alone) | "
            f"{_f(result['acceptance_token_aligned'], 3)} | {_f(result['acceptance_token_unaligned'], 3)} |"
        )
    lines += [
        "",
        f"Where CSD's time goes (batch {result['cost']['batch']}, gamma {result['cost']['gamma']}):",
        "",
        "| phase | share |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {_f(100 * v, 1)}% |" for k, v in result["cost"]["fractions_of_csd_time"].items()]
    return "\n".join(lines) + "\n"


def _fewer(result: dict) -> str:
    """The cheap baseline at the headline gamma: what the family's cheap baseline cuts
    (:attr:`csd.family.FamilyTraits.cheap_knob`): AR steps, or where they are fixed (xAR, one per cell) its
    head's steps, named as its row names them ("flow")."""
    from csd.models.registry import family_named  # here, not at the top: the figures load no model table

    s = result["settings"]
    row = next(r for r in result["rows"] if r["batch"] == s["default_batch"] and r["gamma"] == s["csd"]["gamma"])
    family = family_named(s.get("family"))  # None for the results that predate the family's record
    if family is not None and family.shared_traits().cheap_knob == "head_steps":
        head = family.paper.head_name if family.paper else "head"
        return f"{row.get('fewer_head_steps', '?')} {head} steps"
    return f"{row['target_passes']} AR steps"


PROMPT_SCORES = {"colour_accuracy": "colour accuracy", "background_accuracy": "background accuracy"}


def _prompt_scores(result: dict) -> list[str]:
    """The prompt scores a result holds (a text pair's: the shape's colour and, in results since issue 42,
    the background the prompt asked for), in table order."""
    return [k for k in PROMPT_SCORES if f"{k}_target" in result]


def _colours(result: dict) -> bool:
    """Whether a result scored prompts (a text pair): it then has colour accuracies too."""
    return bool(_prompt_scores(result))


def _prompt_header(result: dict) -> tuple[str, str]:
    """The prompt scores' header cells and their separator cells (empty for a class pair)."""
    keys = _prompt_scores(result)
    return "".join(f" {PROMPT_SCORES[k]} |" for k in keys), " --- |" * len(keys)


def _prompt_cells(result: dict, key: str) -> str:
    """A sampler's (``key``: target, csd, fewer, draft) prompt scores as table cells."""
    return "".join(f" {_f(result[f'{k}_{key}'], 3)} |" for k in _prompt_scores(result))


def headline_markdown(result: dict) -> str:
    """The README's table: every sampler of the quality section at the default batch, time as a speed-up
    (and the colour accuracy of what the prompts asked, for a text pair)."""
    s = result["settings"]
    colour = partial(_prompt_cells, result)
    header, rule = _prompt_header(result)
    lines = [
        f"| {s['sampling']['num_steps']} AR steps, batch {s['default_batch']}, {s['bench']['n']} images "
        "| speed-up | target passes | acceptance | class accuracy |" + header + " Frechet distance |",
        "| --- | --- | --- | --- | --- |" + rule + " --- |",
        f"| target only | 1.00x | {s['sampling']['num_steps']} | | {_f(result['accuracy_target'], 3)} |"
        f"{colour('target')} {_f(result['fd_target'], 1)} |",
    ]
    by_gamma = {q["gamma"]: q for q in result.get("quality_by_gamma", [])}
    main_row = next(r for r in result["rows"] if r["batch"] == s["default_batch"] and r["gamma"] == s["csd"]["gamma"])
    by_gamma[s["csd"]["gamma"]] = {
        "speedup": result["speedup"],
        "target_passes": main_row["target_passes"],
        "acceptance": result["acceptance_aligned"],
        "accuracy": result["accuracy_csd"],
        "fd": result["fd_csd"],
        "colour": colour("csd"),
    }
    for g, q in sorted(by_gamma.items()):
        default = " (default)" if g == s["csd"]["gamma"] else ""
        lines.append(
            f"| CSD, gamma {g}{default} | {_f(q['speedup'])}x | {q['target_passes']} | {_f(q['acceptance'], 2)} "
            f"| {_f(q['accuracy'], 3)} |{q.get('colour', ' |' * len(_prompt_scores(result)))} {_f(q['fd'], 1)} |"
        )
    lines += [
        f"| target, {_fewer(result)} | {_f(1 / result['fewer_steps_time'])}x "
        f"| {main_row['target_passes']} | | {_f(result['accuracy_fewer'], 3)} |{colour('fewer')} "
        f"{_f(result['fd_fewer'], 1)} |",
        f"| draft only | {_f(1 / result['draft_time'])}x | 0 | | {_f(result['accuracy_draft'], 3)} |"
        f"{colour('draft')} {_f(result['fd_draft'], 1)} |",
    ]
    if docs_prefix(result):  # the text and xAR pairs' blocks also say what the speed-up is measured against
        lines += [
            "",
            f"Cost-model bound of the same run: {_f(result['speedup_bound'])}x; acceptance with alignment "
            f"{_f(result['acceptance_aligned'], 3)}, without {_f(result['acceptance_unaligned'], 3)}"
            + (
                f" (per cell; per token, each tested alone: {_f(result['acceptance_token_aligned'], 3)} / "
                f"{_f(result['acceptance_token_unaligned'], 3)})"
                if "acceptance_token_aligned" in result
                else ""
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def docs_prefix(result: dict) -> str:
    """The docs blocks of a result (:data:`DOCS_PREFIX`): its family's, or, for a result that predates the
    family's record, the text pair's ("text-") where it scored colours, else the class pair's."""
    return DOCS_PREFIX.get(result["settings"].get("family"), "text-" if _colours(result) else "")


# --- a frontier's table and the verdicts ------------------------------------------------------------------


def verdict_cell(result: dict) -> str:
    """A verdict table's cell: the verdict, CSD's best setting and its rival, the margin in SEs."""
    v = result.get("verdict") or verdict(result["rows"])
    if v["best"] is None:
        return "unrated (no alternative as fast)"
    b = v["best"]
    return (
        f"**{v['verdict']}** ({b['margin']:+.1f} SE): {b['name']} ({b['time']:.2f}, FD {b[v['metric']]:.1f}) "
        f"vs {b['rival']} ({b['rival_time']:.2f}, FD {b['rival_value']:.1f})"
    )


def verdict_table(results: Sequence[dict]) -> str:
    """Markdown: one row per family, one column per batch, each cell :func:`verdict_cell`."""
    families = list(dict.fromkeys(r.get("family", "?") for r in results))
    batches = sorted({int(r["batch"]) for r in results})
    regime = {1: "latency", 8: "throughput"}
    heads = [f"batch {b}" + (f" ({regime[b]})" if b in regime else "") for b in batches]
    lines = ["| family | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(batches)]
    for fam in families:
        cells = []
        for b in batches:
            mine = [r for r in results if r.get("family", "?") == fam and int(r["batch"]) == b]
            cells.append(verdict_cell(mine[0]) if mine else "not measured")
        label = {"MAR": "MAR (class pair)", "Harmon": "Harmon (text pair)", "xAR": "xAR (cells pair)"}.get(fam, fam)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _digits(key: str) -> int:
    return 1 if key == "fd" else 3


def frontier_markdown(result: dict) -> str:
    """A frontier's table: every setting's time (and predicted time), quality and fronts, with its verdict."""
    metrics = result_metrics(result)
    timing = result.get("timing", f"median wall time at batch {result.get('batch')}")
    short = {"fd": "FD", "accuracy": "accuracy", "rms": "RMS distance"}
    predicted = all("predicted" in r for r in result["rows"])
    lines = [
        f"Time: {timing}, as a ratio to the first row"
        + ("; predicted: the cost model's time from per-pass costs measured in the same run" if predicted else "")
        + f". Quality over {result['n']} images (same labels and "
        f"seeds), +- one standard error. Front: no other setting is at most as slow and at least as good "
        f"({' / '.join(short[m] for m in metrics)}).",
        "",
    ]
    if "verdict" in result:
        lines += [verdict_line(result), ""]
    lines += [
        "| setting | time | "
        + ("predicted | " if predicted else "")
        + " | ".join(METRICS[m][0] for m in metrics)
        + " | "
        + " | ".join(f"front ({short[m]})" for m in metrics)
        + " |",
        "| --- | --- |" + (" --- |" if predicted else "") + " --- |" * (2 * len(metrics)),
    ]
    for r in sorted(result["rows"], key=lambda r: r["time"]):
        values = [f"{r[m]:.{_digits(m)}f} +- {r[f'{m}_se']:.{_digits(m)}f}" for m in metrics]
        fronts = ["yes" if r[f"front_{m}"] else "" for m in metrics]
        pred = f"{r['predicted']:.2f} | " if predicted else ""
        lines.append(f"| {r['name']} | {r['time']:.2f} | {pred}" + " | ".join(values + fronts) + " |")
    return "\n".join(lines) + "\n"


# --- a decision: the deciding settings on the same seeds, paired ---------------------------------------------


def _pm(c: dict, digits: int) -> str:
    """A paired comparison's difference +- its standard error."""
    return f"{c['diff']:+.{digits}f} +- {c['se']:.{digits}f}"


def decide_markdown(result: dict) -> str:
    """A decision's tables (csd.experiments.decide): the verdicts per batch and slack with their margins in
    paired standard errors, every setting's time and quality, each CSD setting against each alternative, and
    per batch the fastest setting within target-only's standard error."""
    rows, batches = result["rows"], list(result["keeps_target"])
    times = lambda r: " | ".join(f"{r['time'][b]:.2f}" for b in batches)
    lines = [
        f"# Enough images to decide: {result.get('family', '?')}",
        "",
        f"{result['n']} images per setting on the same labels and seeds; Frechet distance (FD) to "
        f"{result.get('settings', {}).get('n_ref', '?')} held-out real images, class accuracy beside it. Differences "
        f"are paired image by image: the FD's standard error from {result['bootstrap']} bootstrap resamples that draw "
        "the same images for both settings (the reference fixed), the accuracy's from the per-image differences. "
        "A margin is CSD's difference from an alternative in paired standard errors, positive where CSD is "
        "better. Each CSD setting faces every alternative at no more than its time + slack (ratios of "
        "target-only's time at that batch) and its smallest margin counts; the best CSD setting decides: "
        f"clearly ahead above +{result['clear']:g}, behind below -{result['clear']:g}, else on par. Time: "
        + "; ".join(f"batch {b}: {t}" for b, t in result.get("timing", {}).items())
        + ".",
        "",
        "| batch | slack | metric | verdict | margin | CSD setting (time) | rival (time) | difference (paired SE) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in result["verdicts"]:
        head = f"| {v['batch']} | {v['slack']:g} | {'FD' if v['metric'] == 'fd' else v['metric']} | "
        b = v["best"]
        if b is None:
            lines.append(head + "unrated (no alternative as fast) | | | | |")
            continue
        digits = _digits(v["metric"])
        lines.append(
            head + f"**{v['verdict']}** | {b['margin']:+.1f} | {b['csd']} ({b['time']:.2f}) | {b['rival']} "
            f"({b['rival_time']:.2f}) | {_pm(b, digits)} |"
        )
    lines += [
        "",
        "| setting | " + " | ".join(f"time, batch {b}" for b in batches) + " | FD | accuracy "
        "| FD vs target-only (paired) | accuracy vs target-only (paired) |",
        "| --- |" + " --- |" * (len(batches) + 4),
    ]
    for r in rows:
        vs = r["vs_target"]
        paired = f"{_pm(vs['fd'], 1)} | {_pm(vs['accuracy'], 3)}" if vs else "| "
        lines.append(
            f"| {r['name']} | {times(r)} | {r['fd']:.1f} +- {r['fd_se']:.1f} | {r['accuracy']:.3f} +- "
            f"{r['accuracy_se']:.3f} | {paired} |"
        )
    by_name = {r["name"]: r for r in rows}
    for name in dict.fromkeys(p["csd"] for p in result["pairs"]):
        lines += [
            "",
            f"{name} against each alternative (difference: CSD - alternative; margin: positive where CSD is better):",
            "",
            "| alternative | "
            + " | ".join(f"time, batch {b}" for b in batches)
            + " | FD difference | FD margin | accuracy difference | accuracy margin |",
            "| --- |" + " --- |" * (len(batches) + 4),
            f"| (CSD itself) | {times(by_name[name])} | | | | |",
        ]
        for p in sorted(
            (p for p in result["pairs"] if p["csd"] == name),
            key=lambda p: by_name[p["alternative"]]["time"][batches[0]],
        ):
            lines.append(
                f"| {p['alternative']} | {times(by_name[p['alternative']])} | {_pm(p['fd'], 1)} | "
                f"{p['fd']['margin']:+.1f} | {_pm(p['accuracy'], 3)} | {p['accuracy']['margin']:+.1f} |"
            )
    lines += [
        "",
        "The fastest setting within target-only's standard error (FD at most target-only's + its SE, accuracy at "
        "least target-only's - its SE):",
        "",
        "| batch | setting | time | speed-up | FD | accuracy |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for b, k in result["keeps_target"].items():
        lines.append(
            f"| {b} | {k['name']} | {k['time']:.2f} | {k['speedup']:.2f}x | {k['fd']:.1f} | {k['accuracy']:.3f} |"
        )
    return "\n".join(lines) + "\n"


FAMILY_LABELS = {"MAR": "MAR (class pair)", "Harmon": "Harmon (text pair)", "xAR": "xAR (cells pair)"}


def _decided(result: dict, batch: str, metric: str) -> dict[float, dict]:
    """A decision's verdicts at one batch on one metric, by slack."""
    return {v["slack"]: v for v in result["verdicts"] if v["batch"] == int(batch) and v["metric"] == metric}


def _margins(verdicts: dict[float, dict]) -> str:
    return " / ".join("-" if v["best"] is None else f"{v['best']['margin']:+.1f}" for v in verdicts.values())


def decide_summary(results: Sequence[dict], slack: float = SLACK) -> str:
    """Decisions side by side (csd.experiments.decide), for the README: per family and batch the FD verdict
    with its margins in paired SEs at every slack, CSD's deciding setting and the rival at ``slack`` with
    their time, FD and accuracy; then per family the fastest setting within target-only's standard error."""
    slacks = " / ".join(f"{s:g}" for s in results[0]["slacks"]) if results else ""
    lines = [
        f"| family | batch | n | verdict (FD) | FD margin, slack {slacks} | CSD (time, FD, accuracy) | rival at slack "
        f"{slack:g} (time, FD, accuracy) | accuracy margin, slack {slacks} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    quality = lambda r, t: f"{t:.2f}, {r['fd']:.1f}, {r['accuracy']:.3f}"
    for result in results:
        rows, label = {r["name"]: r for r in result["rows"]}, FAMILY_LABELS.get(result.get("family"), "?")
        for b in result["keeps_target"]:
            fd, acc = _decided(result, b, "fd"), _decided(result, b, "accuracy")
            head = f"| {label} | {b} | {result['n']} |"
            at = fd[slack]["best"]
            if at is None:
                lines.append(f"{head} unrated | {_margins(fd)} | | | {_margins(acc)} |")
                continue
            csd, rival = quality(rows[at["csd"]], at["time"]), quality(rows[at["rival"]], at["rival_time"])
            lines.append(
                f"{head} **{fd[slack]['verdict']}** | {_margins(fd)} | {at['csd']} ({csd}) | {at['rival']} ({rival}) "
                f"| {_margins(acc)} |"
            )
    lines.append("")
    for result in results:
        base, kept = result["rows"][0], list(result["keeps_target"].items())
        one = len({k["name"] for _, k in kept}) == 1  # the same setting at every batch: named once
        speeds = "; ".join(
            f"batch {b}: {'' if one else k['name'] + ', '}{k['speedup']:.2f}x "
            f"({'CSD' if k['method'] == 'CSD' else 'not CSD'}, FD {k['fd']:.1f}, accuracy {k['accuracy']:.3f})"
            for b, k in kept
        )
        lines.append(
            f"- {FAMILY_LABELS.get(result.get('family'), '?')}: {kept[0][1]['name'] + ', ' if one else ''}{speeds}; "
            f"target-only: FD {base['fd']:.1f} +- {base['fd_se']:.1f}, accuracy {base['accuracy']:.3f} +- "
            f"{base['accuracy_se']:.3f} ({result['n']} images)."
        )
    return "\n".join(lines) + "\n"


PROMPT_MODES = {"target": "target only", "draft": "draft only", "csd": "CSD (default)"}
EXAMPLE_KEYS = ("class_accuracy", "colour_accuracy", "background_accuracy")


def prompts_markdown(result: dict) -> str:
    """A prompt-following result (``csd.experiments.prompts``): per sampler, the held-out captions' class,
    colour and background accuracy and FD, then each example prompt's class / colour / background."""
    modes = [m for m in PROMPT_MODES if m in result["modes"]]
    s = result["sampling"]
    lines = [
        f"{result.get('n', '?')} held-out captions as prompts, {s['num_steps']} AR steps, CFG {s['cfg_scale']:g} "
        f"({s['cfg_schedule']}); example prompts at {result.get('seeds_per_prompt', '?')} seeds each.",
        "",
        "| sampler | class accuracy | colour accuracy | background accuracy | Frechet distance | acceptance |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in modes:
        h = result["modes"][m]["held_out"]
        acc = f"{h['acceptance_rate']:.2f}" if "acceptance_rate" in h else ""
        lines.append(
            f"| {PROMPT_MODES[m]} | {h['accuracy']:.2f} | {h['colour_accuracy']:.2f} | "
            f"{h['background_accuracy']:.2f} | {h['fd']:.1f} | {acc} |"
        )
    lines += ["", "Example prompts (the app's), class / colour / background:", ""]
    lines.append("| prompt | " + " | ".join(PROMPT_MODES[m] for m in modes) + " |")
    lines.append("| --- |" + " --- |" * len(modes))
    cell = lambda e: " / ".join(f"{e[k]:.2f}" for k in EXAMPLE_KEYS)
    for prompt in result["modes"][modes[0]]["examples"]:
        lines.append(f"| {prompt} | " + " | ".join(cell(result["modes"][m]["examples"][prompt]) for m in modes) + " |")
    means = " | ".join(cell(result["modes"][m]["examples_mean"]) for m in modes)
    lines.append(f"| mean | {means} |")
    return "\n".join(lines) + "\n"


def write_tables(path: Path) -> Path:
    """A result's Markdown beside its JSON: bench.md for a benchmark, frontier_b8.md for frontier_b8.json."""
    path = Path(path)
    result = json.loads(path.read_text())
    if result.get("kind") == "decide":  # csd.experiments.decide
        out = path.with_suffix(".md")
        out.write_text(decide_markdown(result))
    elif result.get("kind") == "prompts":  # csd.experiments.prompts
        out = path.with_suffix(".md")
        out.write_text("# Prompt following\n\n" + prompts_markdown(result))
    elif "metrics" in result:  # a frontier (csd.experiments.frontier.run_frontier)
        out = path.with_suffix(".md")
        out.write_text(f"# Quality-time frontier, batch {result['batch']}\n\n" + frontier_markdown(result))
    else:
        out = path.with_name("bench.md")
        out.write_text(bench_markdown(result))
    return out


# --- into the repository ----------------------------------------------------------------------------------


def paste_block(path: Path, marker: str, text: str) -> None:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in a Markdown file."""
    new, n = re.subn(
        rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)",
        lambda m: m.group(1) + text.strip() + "\n" + m.group(2),
        path.read_text(),
        flags=re.S,
    )
    if n != 1:
        raise ValueError(f"{path}: expected one <!-- {marker}:start --> ... <!-- {marker}:end --> block, found {n}")
    path.write_text(new)


def update_docs(result: dict, root: Path = ROOT) -> None:
    """A benchmark's Markdown into docs/results.md and its headline table into the README."""
    prefix = docs_prefix(result)
    paste_block(root / "docs" / "results.md", f"{prefix}bench", bench_markdown(result).split("\n", 2)[2])
    paste_block(root / "README.md", f"{prefix}headline", headline_markdown(result))


FAMILY_ORDER = ("MAR", "Harmon", "xAR")  # the README's rows: class pair, text pair, xAR pair


def committed_frontiers(root: Path = ROOT) -> list[dict]:
    """Every committed frontier (bench/results/**/frontier_b<batch>.json), in the README's order."""
    results = [json.loads(p.read_text()) for p in sorted((root / "bench" / "results").rglob("frontier_b*.json"))]
    rank = lambda r: (FAMILY_ORDER.index(r["family"]) if r.get("family") in FAMILY_ORDER else 99, int(r["batch"]))
    return sorted(results, key=rank)


def update_verdicts(root: Path = ROOT) -> None:
    """The verdict table of every committed frontier into the ``verdicts`` blocks of the README and
    docs/results.md, and each frontier's table into its block there (``frontier-b1``, ``text-frontier-b8``...)."""
    results = committed_frontiers(root)
    for page in (root / "README.md", root / "docs" / "results.md"):
        paste_block(page, "verdicts", verdict_table(results))
    for r in results:
        block = f"{DOCS_PREFIX.get(r.get('family'), '')}frontier-b{r['batch']}"
        paste_block(root / "docs" / "results.md", block, frontier_markdown(r))
    subsets = token_cache_runs(root)
    if subsets:
        text = "\n".join(f"Batch {r['batch']}:\n\n{frontier_markdown(r)}" for r in subsets)
        paste_block(root / "docs" / "results.md", "token-cache", text)


def token_cache_runs(root: Path = ROOT) -> list[dict]:
    """The class pair's run of LazyMAR's settings (bench/results/lazymar/frontier_subset_b<batch>.json)."""
    paths = sorted((root / "bench" / "results" / "lazymar").glob("frontier_subset_b*.json"))
    return sorted((json.loads(p.read_text()) for p in paths), key=lambda r: int(r["batch"]))


def report(path: Path, root: Path = ROOT) -> str:
    """One result file: its tables (:func:`write_tables`); a frontier also gets its charts
    (``frontier_b8.png`` and ``frontier_b8_cost.png`` beside ``frontier_b8.json``), a benchmark its docs blocks."""
    result = json.loads(Path(path).read_text())
    table = write_tables(path)
    if result.get("kind") == "decide":  # its table only: the docs take its numbers by hand
        return f"wrote {table}"
    if result.get("kind") == "prompts":  # the text pair's: its block in docs/results.md
        paste_block(root / "docs" / "results.md", "text-prompts", prompts_markdown(result))
        return f"wrote {table}; pasted {path} into docs/results.md"
    if "metrics" in result:  # a frontier (csd.experiments.frontier.run_frontier)
        out = Path(path).with_suffix(".png")
        save_png(frontier_chart(result), out)
        if all("predicted" in r for r in result["rows"]):  # and its cost model's chart
            cost = out.with_name(f"{out.stem}_cost.png")
            save_png(cost_chart(result), cost)
            if (root / "bench" / "results").resolve() in Path(path).resolve().parents:  # a committed one
                update_verdicts(root)
                return f"wrote {table}, {out} and {cost}; the README's verdict table from every committed frontier"
            return f"wrote {table}, {out} and {cost}"
        return f"wrote {table} and {out}"
    update_docs(result, root)
    return f"wrote {table}; pasted {path} into docs/results.md and README.md"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m visualize.report", description=__doc__.split("\n")[0])
    p.add_argument(
        "results", nargs="+", type=Path, help="bench.json / frontier.json / decide.json / prompts.json files"
    )
    decisions = []
    for path in p.parse_args(argv).results:
        print(report(path))
        result = json.loads(path.read_text())
        decisions += [result] if result.get("kind") == "decide" else []
    if decisions:  # their summary, for the README
        print(decide_summary(decisions), end="")


if __name__ == "__main__":
    main()
