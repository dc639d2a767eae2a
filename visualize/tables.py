"""A result's Markdown tables: a benchmark's (bench.md, the README's headline), a frontier's with its verdict,
the verdicts of every family side by side, and a prompt-following run's. Families are named by their plain
records (docs/families.json, written from :mod:`csd.serving.catalog`; a caller may pass its own
``families``); :mod:`visualize.report` writes the tables beside their results and pastes them into the docs,
:mod:`visualize.decisions` makes a decision's."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache, partial
from pathlib import Path

from csd.records.verdict import METRICS, result_metrics, verdict, verdict_line

FAMILIES_FILE = Path(__file__).resolve().parents[1] / "docs" / "families.json"


@cache
def committed_families() -> dict[str, dict]:
    """The families' records as committed (docs/families.json), by the name results record a family by."""
    return json.loads(FAMILIES_FILE.read_text())


def family_record(name: str | None, families: Mapping[str, dict] | None = None) -> dict | None:
    """The record of the family a result names (its traits' name, or its arch): ``arch``, ``cheap_knob``
    (what its cheap baseline cuts), ``head_name`` (what its head's steps are called) and ``docs`` (where it
    stands in the docs, or None); None for none or an unknown one. ``families``: the records (default: the
    committed ones)."""
    families = committed_families() if families is None else families
    if name is None:
        return None
    return families.get(name) or next((r for r in families.values() if r.get("arch") == name), None)


def family_docs(result: dict, families: Mapping[str, dict] | None = None) -> dict | None:
    """Where the family of a result (a frontier's ``family``, a benchmark's ``settings.family``) stands in the
    docs (``label``, ``prefix``, ``rank``); None for a result that predates the family's record, or a family
    that stands nowhere."""
    record = family_record(result.get("family") or result.get("settings", {}).get("family"), families)
    return record.get("docs") if record is not None else None


def family_label(name: str | None, unknown: str = "?", families: Mapping[str, dict] | None = None) -> str:
    """How the docs' tables name a family's row: its docs label, else ``unknown``."""
    docs = family_docs({"family": name}, families)
    return docs["label"] if docs is not None else unknown


def docs_prefix(result: dict, families: Mapping[str, dict] | None = None) -> str:
    """The prefix of a result's docs blocks: its family's or, for a result that predates the family's record,
    the text pair's ("text-") where it scored colours, else the class pair's ("")."""
    docs = family_docs(result, families)
    return docs["prefix"] if docs is not None else "text-" if _colours(result) else ""


# --- a benchmark's tables -----------------------------------------------------------------------------


def _f(v: float, digits: int = 2) -> str:
    return "nan" if v != v else f"{v:.{digits}f}"


def bench_markdown(result: dict, families: Mapping[str, dict] | None = None) -> str:
    """A benchmark's tables (bench.md): the speed-up grid, quality per sampler and per draft length,
    alignment, where the time goes (``families``: as :func:`family_record` takes them)."""
    tables = (_speedup_table, partial(_quality_table, families=families), _gamma_table, _alignment_table, _time_table)
    return "\n".join(line for table in tables for line in table(result)) + "\n"


def _speedup_table(result: dict) -> list[str]:
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
    return lines + [
        f"| {r['batch']} | {r['gamma']} | {r['target_passes']} | {_f(r['speedup'])}x "
        f"({_f(r['speedup_min'])}-{_f(r['speedup_max'])}) | {_f(r['speedup_bound'])}x | "
        f"{_f(r['speedup_bound_simple'])}x | {_f(r['fewer_steps_time'])} | {_f(r['acceptance'])} |"
        for r in result["rows"]
    ]


def _quality_table(result: dict, families: Mapping[str, dict] | None = None) -> list[str]:
    s, n = result["settings"], result["settings"]["bench"]["n"]
    lines = [
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
        ("fewer", f"target, {_fewer(result, families)}", result["fewer_steps_time"]),
        ("draft", "draft only", result["draft_time"]),
    ):
        acc, fd = result[f"accuracy_{key}"], result[f"fd_{key}"]
        lines.append(f"| {name} | {_f(rel_time)} | {_f(acc, 3)} |{_prompt_cells(result, key)} {_f(fd)} |")
    return lines


def _gamma_table(result: dict) -> list[str]:
    s, by_gamma = result["settings"], result.get("quality_by_gamma", [])
    if len(by_gamma) <= 1:
        return []
    return [
        "",
        f"CSD against draft length, same labels and seeds (speedup at batch {s['default_batch']} where the grid "
        "timed that gamma):",
        "",
        "| gamma | target passes | speedup | acceptance | class accuracy | Frechet distance | FD to target-only |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| target only | {s['sampling']['num_steps']} | 1.00x | | {_f(result['accuracy_target'], 3)} | "
        f"{_f(result['fd_target'])} | 0 |",
    ] + [
        f"| {q['gamma']} | {q['target_passes']} | {_f(q['speedup'])}x | {_f(q['acceptance'], 3)} | "
        f"{_f(q['accuracy'], 3)} | {_f(q['fd'])} | {_f(q['fd_vs_target'])} |"
        for q in by_gamma
    ]


def _alignment_table(result: dict) -> list[str]:
    lines = [
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
    return lines


def _time_table(result: dict) -> list[str]:
    cost = result["cost"]
    return [
        "",
        f"Where CSD's time goes (batch {cost['batch']}, gamma {cost['gamma']}):",
        "",
        "| phase | share |",
        "| --- | --- |",
    ] + [f"| {k} | {_f(100 * v, 1)}% |" for k, v in cost["fractions_of_csd_time"].items()]


def _fewer(result: dict, families: Mapping[str, dict] | None = None) -> str:
    """The cheap baseline at the headline gamma: what the family's cheap baseline cuts
    (:attr:`csd.family.FamilyTraits.cheap_knob`): AR steps, or where they are fixed (xAR, one per cell) its
    head's steps, named as its record names them ("flow")."""
    s = result["settings"]
    row = next(r for r in result["rows"] if r["batch"] == s["default_batch"] and r["gamma"] == s["csd"]["gamma"])
    family = family_record(s.get("family"), families)  # None for the results that predate the family's record
    if family is not None and family["cheap_knob"] == "head_steps":
        return f"{row.get('fewer_head_steps', '?')} {family['head_name']} steps"
    return f"{row['target_passes']} AR steps"


PROMPT_SCORES = {"colour_accuracy": "colour accuracy", "background_accuracy": "background accuracy"}


def _prompt_scores(result: dict) -> list[str]:
    """The prompt scores a result holds (a text pair's: the shape's colour and, in results that scored it,
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


def headline_markdown(result: dict, families: Mapping[str, dict] | None = None) -> str:
    """The README's table: every sampler of the quality section at the default batch, time as a speed-up
    (and the colour accuracy of what the prompts asked, for a text pair). ``families``: as
    :func:`family_record` takes them."""
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
        f"| target, {_fewer(result, families)} | {_f(1 / result['fewer_steps_time'])}x "
        f"| {main_row['target_passes']} | | {_f(result['accuracy_fewer'], 3)} |{colour('fewer')} "
        f"{_f(result['fd_fewer'], 1)} |",
        f"| draft only | {_f(1 / result['draft_time'])}x | 0 | | {_f(result['accuracy_draft'], 3)} |"
        f"{colour('draft')} {_f(result['fd_draft'], 1)} |",
    ]
    if docs_prefix(result, families):  # the text and xAR pairs' blocks also say what the speed-up is measured against
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


def _docs_by_prefix(result: dict, families: Mapping[str, dict] | None) -> dict:
    """Where a benchmark's family stands in the docs, found by its blocks' prefix (a result that predates the
    family's record is placed by :func:`docs_prefix`): ``label`` and ``rank``."""
    prefix = docs_prefix(result, families)
    records = committed_families() if families is None else families
    found = [r["docs"] for r in records.values() if (r.get("docs") or {}).get("prefix") == prefix]
    return found[0] if found else {"label": "?", "rank": 99}


def families_markdown(results: Sequence[dict], families: Mapping[str, dict] | None = None) -> str:
    """The README's table of the families: per benchmark (one per pair), its default CSD setting against the
    target alone and the draft alone at its default batch, in the families' docs order. Class accuracy and
    Frechet distance per sampler; each pair's whole tables are in docs/results.md."""
    lines = [
        "| pair (family layout) | AR steps | images | CSD speed-up (cost-model bound) | acceptance, aligned / not "
        "| target: accuracy, FD | CSD: accuracy, FD | draft: accuracy, FD |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: _docs_by_prefix(r, families)["rank"]):
        s = r["settings"]
        quality = lambda who, r=r: f"{_f(r[f'accuracy_{who}'], 2)}, {_f(r[f'fd_{who}'], 1)}"
        lines.append(
            f"| {_docs_by_prefix(r, families)['label']} | {s['sampling']['num_steps']} | {s['bench']['n']} "
            f"| {_f(r['speedup'])}x ({_f(r['speedup_bound'])}x) at gamma {s['csd']['gamma']}, batch "
            f"{s['default_batch']} | {_f(r['acceptance_aligned'], 2)} / {_f(r['acceptance_unaligned'], 2)} "
            f"| {quality('target')} | {quality('csd')} | {quality('draft')} |"
        )
    return "\n".join(lines) + "\n"


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


def verdict_table(results: Sequence[dict], families: Mapping[str, dict] | None = None) -> str:
    """Markdown: one row per family, one column per batch, each cell :func:`verdict_cell` (``families``: as
    :func:`family_record` takes them)."""
    named = list(dict.fromkeys(r.get("family", "?") for r in results))
    batches = sorted({int(r["batch"]) for r in results})
    regime = {1: "latency", 8: "throughput"}
    heads = [f"batch {b}" + (f" ({regime[b]})" if b in regime else "") for b in batches]
    lines = ["| family | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(batches)]
    for fam in named:
        cells = []
        for b in batches:
            mine = [r for r in results if r.get("family", "?") == fam and int(r["batch"]) == b]
            cells.append(verdict_cell(mine[0]) if mine else "not measured")
        label = family_label(fam, fam, families)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def digits(key: str) -> int:
    """The decimals a metric is shown with."""
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
        values = [f"{r[m]:.{digits(m)}f} +- {r[f'{m}_se']:.{digits(m)}f}" for m in metrics]
        fronts = ["yes" if r[f"front_{m}"] else "" for m in metrics]
        pred = f"{r['predicted']:.2f} | " if predicted else ""
        lines.append(f"| {r['name']} | {r['time']:.2f} | {pred}" + " | ".join(values + fronts) + " |")
    return "\n".join(lines) + "\n"


# --- a prompt-following run --------------------------------------------------------------------------


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


# --- what a block costs (csd.experiments.blocks) -----------------------------------------------------------


def _paired(cmp: dict | None) -> str:
    """Paired differences (accuracy; FD) and their standard errors, "+0.010 (0.020); -1.2 (0.8)"."""
    if not cmp:
        return ""
    acc, fd = cmp["accuracy"], cmp["fd"]
    return f"{acc['diff']:+.3f} ({acc['se']:.3f}); {fd['diff']:+.1f} ({fd['se']:.1f})"


def blocks_markdown(result: dict) -> str:
    """The table of a blocks run: per setting its quality, its paired differences from target-only (and, for the
    exact block, from CSD at gamma 1), its CPU time and predicted GPU time against target-only's, target passes
    per batch and AR steps kept per drafted block."""
    rows, text = result["rows"], "colour_accuracy" in result["rows"][0]
    extra = " colour | background |" if text else ""
    head = (
        f"| setting | accuracy | FD |{extra} vs target-only: accuracy, FD | vs gamma 1: accuracy, FD | CPU time "
        "| GPU time (predicted) | target passes | steps kept per block | acceptance |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        scores = f" {_f(r['colour_accuracy'])} | {_f(r['background_accuracy'])} |" if text else ""
        kept = "" if r["steps_kept_per_block"] is None else _f(r["steps_kept_per_block"])
        acceptance = "" if r["acceptance"] is None else _f(r["acceptance"])
        lines.append(
            f"| {r['name']} | {_f(r['accuracy'], 3)} | {_f(r['fd'], 1)} |{scores} {_paired(r.get('vs_target'))} | "
            f"{_paired(r.get('vs_gamma1'))} | {_f(r['cpu_time'])} | {_f(r['gpu_time_predicted'])} | "
            f"{_f(r['target_passes'], 1)} | {kept} | {acceptance} |"
        )
    gpu = result["gpu_costs"]
    n, batch = result["settings"]["n"], result["batch"]
    lines.append(
        f"\n{n} images per setting at batch {batch} (image i: label i, seed i, the same for every setting); paired "
        "differences with their standard errors (FD: a paired bootstrap; accuracy: per-image differences). CPU "
        f"time: wall time against target-only's, the settings taking turns batch by batch ({result['threads']} "
        f"thread). GPU time: the cost model at the per-pass costs of {gpu['pair']} on an H200 (batch "
        f"{gpu['batch']}, {gpu['file']}) applied to each setting's backbone passes and head-chain transitions. "
        "Target passes per batch of images."
    )
    return "\n".join(lines) + "\n"
