"""A decision's tables (:mod:`csd.experiments.decide`): the verdicts per batch and slack with their margins in
paired standard errors, every setting's time and quality, each CSD setting against each alternative, the
fastest setting within target-only's standard error; and decisions side by side, for the README."""

from __future__ import annotations

from collections.abc import Sequence

from csd.records.verdict import SLACK
from visualize.tables import digits, family_label


def _pm(c: dict, places: int) -> str:
    """A paired comparison's difference +- its standard error."""
    return f"{c['diff']:+.{places}f} +- {c['se']:.{places}f}"


def _times(result: dict):
    """A row's times at each batch of a decision, as table cells."""
    batches = list(result["keeps_target"])
    return lambda r: " | ".join(f"{r['time'][b]:.2f}" for b in batches)


def decide_markdown(result: dict) -> str:
    """A decision's tables (csd.experiments.decide): the verdicts per batch and slack with their margins in
    paired standard errors, every setting's time and quality, each CSD setting against each alternative, and
    per batch the fastest setting within target-only's standard error."""
    tables = (_verdicts_table, _settings_table, _pairs_tables, _kept_table)
    return "\n".join(line for table in tables for line in table(result)) + "\n"


def _verdicts_table(result: dict) -> list[str]:
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
        lines.append(
            head + f"**{v['verdict']}** | {b['margin']:+.1f} | {b['csd']} ({b['time']:.2f}) | {b['rival']} "
            f"({b['rival_time']:.2f}) | {_pm(b, digits(v['metric']))} |"
        )
    return lines


def _settings_table(result: dict) -> list[str]:
    batches, times = list(result["keeps_target"]), _times(result)
    lines = [
        "",
        "| setting | " + " | ".join(f"time, batch {b}" for b in batches) + " | FD | accuracy "
        "| FD vs target-only (paired) | accuracy vs target-only (paired) |",
        "| --- |" + " --- |" * (len(batches) + 4),
    ]
    for r in result["rows"]:
        vs = r["vs_target"]
        paired = f"{_pm(vs['fd'], 1)} | {_pm(vs['accuracy'], 3)}" if vs else "| "
        lines.append(
            f"| {r['name']} | {times(r)} | {r['fd']:.1f} +- {r['fd_se']:.1f} | {r['accuracy']:.3f} +- "
            f"{r['accuracy_se']:.3f} | {paired} |"
        )
    return lines


def _pairs_tables(result: dict) -> list[str]:
    batches, times, lines = list(result["keeps_target"]), _times(result), []
    by_name = {r["name"]: r for r in result["rows"]}
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
    return lines


def _kept_table(result: dict) -> list[str]:
    return [
        "",
        "The fastest setting within target-only's standard error (FD at most target-only's + its SE, accuracy at "
        "least target-only's - its SE):",
        "",
        "| batch | setting | time | speed-up | FD | accuracy |",
        "| --- | --- | --- | --- | --- | --- |",
    ] + [
        f"| {b} | {k['name']} | {k['time']:.2f} | {k['speedup']:.2f}x | {k['fd']:.1f} | {k['accuracy']:.3f} |"
        for b, k in result["keeps_target"].items()
    ]


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
        rows, label = {r["name"]: r for r in result["rows"]}, family_label(result.get("family"))
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
            f"- {family_label(result.get('family'))}: {kept[0][1]['name'] + ', ' if one else ''}{speeds}; "
            f"target-only: FD {base['fd']:.1f} +- {base['fd_se']:.1f}, accuracy {base['accuracy']:.3f} +- "
            f"{base['accuracy_se']:.3f} ({result['n']} images)."
        )
    return "\n".join(lines) + "\n"
