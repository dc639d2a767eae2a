"""Which acceptance test, and what it does to the images: a pair under the project's derived test,
the published sign, and what the published code computes (criterion "published": its products of densities
in float32 and in float64, its scale slots holding the final step's std, as MarkXCloud/CSpD d91f721 does, or
its variance), on n paired images: image i of every setting has the label and seed of target-only's image i.

For each setting: acceptance, the share of drafted tokens the resampler left at zero (the published
fallback), the Frechet distance and class accuracy, and both differences to target-only with their paired
standard errors (:func:`csd.experiments.decide.compare`: a paired bootstrap for the distance).

    python -m csd.experiments.criteria --target assets/models/shapes_target.safetensors \\
        --draft assets/models/shapes_draft.safetensors --n 200 --threads 1 --out bench/results/criteria/class.json

writes the JSON and its table (:func:`markdown`, the same name with ``.md``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from csd.cli import start_up
from csd.config import CSDConfig, SamplingConfig
from csd.experiments.decide import score
from csd.experiments.evaluate import (
    add_setting_args,
    eval_labels_seeds,
    generate_images,
    load_models,
    settings_from_args,
    summarize_stats,
)
from csd.experiments.paired import Scored, compare
from csd.records.panel_data import json_float
from csd.shapes.metrics import REFERENCE_SEED, frechet_distance, load_classifier, reference_features

KIND = "criteria"  # the result's "kind", as every result file names its own
BATCH = 8  # images generated at once


def criteria_settings(csd: CSDConfig) -> dict[str, CSDConfig]:
    """The tests compared, each over the same other knobs (``csd``)."""
    published = csd.with_knobs(criterion="published")
    return {
        "derived": csd.with_knobs(criterion="aligned", trajectory_term="derived"),
        "published sign": csd.with_knobs(criterion="aligned", trajectory_term="published"),
        "published code, float32": published.with_knobs(product_precision="float32"),
        "published code, float64": published.with_knobs(product_precision="float64"),
        "published code, float64, variances in the scale slots": published.with_knobs(
            product_precision="float64", published_scale="variance"
        ),
    }


def run_criteria(
    target, draft, sampling: SamplingConfig, csd: CSDConfig, n: int, classifier, ref, log: Callable[[str], None]
) -> dict:
    """Target-only and every setting of :func:`criteria_settings` on the same n labels and seeds."""
    labels, seeds = eval_labels_seeds(n, 0, target.traits)
    t0 = time.perf_counter()
    images, _ = generate_images("target", target, draft, labels, seeds, sampling, csd, BATCH)
    base = score(images, labels, classifier)
    rows = {"target only": _row(base, base, ref, None)}
    for name, setting in criteria_settings(csd).items():
        images, stats = generate_images("csd", target, draft, labels, seeds, sampling, setting, BATCH)
        rows[name] = _row(score(images, labels, classifier), base, ref, summarize_stats(stats))
        rows[name]["setting"] = setting.knob_values()
        log(f"{name}: acceptance {rows[name]['acceptance_rate']}, {(time.perf_counter() - t0) / 60:.1f} min")
    return {"kind": KIND, "n": n, "sampling": sampling.knob_values(), "rows": rows}


def _row(scored: Scored, base: Scored, ref, stats: dict | None) -> dict:
    row = {"fd": frechet_distance(scored.feats, ref), "accuracy": float(scored.correct.mean())}
    if stats is None:
        return row
    return row | {
        "acceptance_rate": json_float(stats["acceptance_rate"]),
        "zeroed_share": json_float(stats["zeroed_share"]),
        "cap_hits": stats["cap_hits"],
        "drafted_tokens": stats["drafted_tokens"],
        "vs_target": compare(scored, base, ref),
    }


def _fmt(v, digits: int = 2) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def _versus(vs: dict | None, key: str, digits: int) -> str:
    """A paired difference to target-only and its size in standard errors, said as better or worse."""
    if vs is None:
        return ""
    diff, margin = vs[key]["diff"], vs[key]["margin"]
    return f"{diff:+.{digits}f} ({abs(margin):.1f} SE {'better' if margin > 0 else 'worse'})"


def markdown(result: dict) -> str:
    """The result as a table: per setting acceptance, the share left at zero, FD and accuracy with their paired
    differences to target-only and those in standard errors, better or worse."""
    lines = [
        f"{result['n']} paired images, {result['sampling']['num_steps']} AR steps; differences to target-only "
        "(a - target-only, and its size in paired standard errors).",
        "",
        "| test | acceptance | left at zero | Frechet distance | vs target-only (SE) | accuracy "
        "| vs target-only (SE) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in result["rows"].items():
        vs = row.get("vs_target")
        fd_vs, acc_vs = _versus(vs, "fd", 1), _versus(vs, "accuracy", 3)
        lines.append(
            f"| {name} | {_fmt(row.get('acceptance_rate'))} | {_fmt(row.get('zeroed_share'))} | {row['fd']:.1f} | "
            f"{fd_vs} | {row['accuracy']:.3f} | {acc_vs} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.criteria", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    parser.add_argument("--n", type=int, default=200, help="images per setting (paired: the same labels and seeds)")
    parser.add_argument("--n-ref", type=int, default=1000, help="held-out real images for the Frechet distance")
    parser.add_argument("--out", type=Path, required=True, help="the result's JSON")
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error(f"--n must be at least 2, got {args.n}")
    device = start_up(args, parser)
    sampling, csd = settings_from_args(args)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    classifier = load_classifier(args.classifier)
    ref = reference_features(args.n_ref, REFERENCE_SEED, classifier)
    result = run_criteria(target, draft, sampling, csd, args.n, classifier, ref, lambda s: print(s, flush=True))
    result |= {"target": str(args.target), "draft": str(args.draft), "n_ref": args.n_ref}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return result


if __name__ == "__main__":
    main()
