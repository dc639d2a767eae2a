"""Benchmark: CSD's wall-time speedup over target-only decoding next to the cost-model bound, plus quality.

    python -m csd.experiments.bench [--quick] [--out bench/results] [--target T.safetensors --draft D.safetensors]

One run measures everything and reports ratios (absolute times depend on the machine):

* per batch size, target-only, draft-only, CSD for every gamma and target-only with fewer AR steps
  (as many as CSD's target passes) run interleaved after a warm-up, so drift and background load
  hit all of them alike; speedup = median target-only time / median CSD time;
* the bound of DESIGN.md section 6 (:mod:`csd.records.cost`) from C_p, C_q, H_p, H_q measured in those runs;
* acceptance and draft-target distance with and without alignment, resampler tries and cap hits;
* class accuracy and Frechet distance (:mod:`csd.shapes.metrics`) of target-only, CSD, draft-only and
  fewer-steps target images, and between CSD and target-only images;
* optionally (``--quality-gammas``) CSD's quality at other draft lengths, on the same labels and seeds:
  the quality side of the speed-quality trade-off that gamma sets.

Writes ``bench.json`` to ``--out``; ``python -m visualize.report`` writes its tables (``bench.md``) beside it
and pastes them into the docs.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from csd.cli import parse_setting, start_up
from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import check_int, is_int
from csd.core.schedule import step_sizes
from csd.dispatch import Method
from csd.experiments import defaults
from csd.experiments.evaluate import (
    add_setting_args,
    eval_labels_seeds,
    fewer_steps,
    generate_images,
    load_models,
    quality,
    recorded_models,
    settings_from_args,
    summarize_stats,
)
from csd.experiments.frontier_command import (
    add_frontier_args,
    check_frontier_args,
    merge_frontier,
    retime_frontier,
    write_frontier,
)
from csd.experiments.timing import alternate, cost_breakdown, measured_costs, ratio_spread
from csd.records.cost import csd_passes, prefill_steps, simple_bound, speedup_bound
from csd.shapes.metrics import REFERENCE_SEED, frechet_distance, load_classifier, reference_features

REAL_SEED = REFERENCE_SEED + 1  # a second real set: the Frechet distance a perfect sampler would get at this n


@dataclass(frozen=True)
class BenchConfig:
    gammas: tuple[int, ...] = (2, 4, 8, 16)
    batches: tuple[int, ...] = (1, 8, 32)
    repeats: int = 5  # timed rounds after the warm-up
    warmup: int = 1
    n: int = 500  # images per sampler for the quality metrics
    n_ref: int = 2000  # held-out real images
    quality_gammas: tuple[int, ...] = ()  # extra draft lengths whose CSD images are scored too

    def __post_init__(self) -> None:
        for name in ("gammas", "batches", "quality_gammas"):
            values = getattr(self, name)
            bad = any(not is_int(v) or v < 1 for v in values)
            if bad or (not values and name != "quality_gammas"):
                what = "a tuple" if name == "quality_gammas" else "a non-empty tuple"
                raise ValueError(f"{name} must be {what} of ints >= 1, got {values!r}")
        for name, lo in (("repeats", 1), ("warmup", 0), ("n", 2), ("n_ref", 2)):
            check_int(name, getattr(self, name), lo)


QUICK = BenchConfig(gammas=(4, 8), batches=(1, 8), repeats=3, n=100, n_ref=1000)


def time_batch(target, draft, sampling: SamplingConfig, csd: CSDConfig, batch: int, config: BenchConfig):
    """Interleaved timings of every sampler at one batch size -> (rows, step costs, samples)."""
    labels, seeds = eval_labels_seeds(batch, 0, target.traits)
    # The draft runs its head with as many steps as in CSD, which shares the target's noise shape.
    draft_sampling = replace(sampling, head_steps=target.head_steps(sampling.head_steps))
    runs: dict[str, Callable[[], object]] = {
        "target": partial(Method.target().run, target, draft, labels, seeds, sampling),
        "draft": partial(Method.draft().run, target, draft, labels, seeds, draft_sampling),
    }
    fewer = {g: fewer_steps(sampling, replace(csd, gamma=g), target) for g in config.gammas}
    fewer_key = lambda g: f"target/{fewer[g].num_steps}/{fewer[g].head_steps}"
    for g in config.gammas:
        speculative = Method.speculative(replace(csd, gamma=g))
        runs[f"csd/{g}"] = partial(speculative.run, target, draft, labels, seeds, sampling)
        runs.setdefault(fewer_key(g), partial(Method.target().run, target, draft, labels, seeds, fewer[g]))
    samples = alternate(runs, config.repeats, config.warmup)
    costs = measured_costs(samples["target"], samples["draft"], sampling.num_steps)
    p_steps = prefill_steps(step_sizes(target.seq_len, sampling.num_steps), csd.prefill)
    rows = []
    for g in config.gammas:
        spec, base = samples[f"csd/{g}"], samples["target"]
        at_g = replace(csd, gamma=g)
        passes, drafts = csd_passes(target.seq_len, sampling, at_g)
        lo, hi = ratio_spread(base, spec)
        rows.append(
            {
                "batch": batch,
                "gamma": g,
                "num_steps": sampling.num_steps,
                "prefill_steps": p_steps,
                "target_passes": passes,
                "draft_passes": drafts,
                "speedup": base.median / spec.median,
                "speedup_min": lo,
                "speedup_max": hi,
                "speedup_bound": speedup_bound(costs, target.seq_len, sampling, at_g, target.traits.head_per_block),
                "speedup_bound_simple": simple_bound(costs, sampling, at_g),
                "fewer_steps_time": samples[fewer_key(g)].median / base.median,
                "fewer_steps": fewer[g].num_steps,
                "fewer_head_steps": target.head_steps(fewer[g].head_steps),
                "draft_time": samples["draft"].median / base.median,
                "acceptance": float(np.nanmean([o.trace.acceptance_rate for o in spec.outputs])),
                "cq_over_cp": costs.draft_backbone / costs.target_backbone,
                "hp_over_cp": costs.target_head / costs.target_backbone,
                "hq_over_cp": costs.draft_head / costs.target_backbone,
            }
        )
    return rows, costs, samples


# --- quality -----------------------------------------------------------------------------------------


def quality_section(target, draft, sampling: SamplingConfig, csd: CSDConfig, config: BenchConfig, classifier) -> dict:
    """Accuracy and Frechet distances of every sampler, and CSD's acceptance with and without alignment."""
    labels, seeds = eval_labels_seeds(config.n, 0, target.traits)
    ref = reference_features(config.n_ref, REFERENCE_SEED, classifier)
    gen = lambda mode, c=csd: generate_images(mode, target, draft, labels, seeds, sampling, c, defaults.BATCH_SIZE)
    out, feats = {}, {}
    # Counterfactual runs add the other noise choice's target chain; the committed images are unchanged.
    runs = [
        ("target", "target", csd),
        ("csd", "csd", replace(csd, counterfactual=True)),
        ("csd_unaligned", "csd", replace(csd, align=False, counterfactual=True)),
        ("draft", "draft", csd),
        ("fewer", "target-fewer-steps", csd),
    ]
    per_token = target.traits.tokens_per_row > 1  # xAR: also test every token of a cell alone
    if per_token:
        token = csd.with_knobs(acceptance_unit="token")
        runs += [("csd_token", "csd", token), ("csd_token_unaligned", "csd", replace(token, align=False))]
    for key, mode, setting in runs:
        images, stats = gen(mode, setting)
        scores, feats[key] = quality(images, labels, ref, classifier)
        out[f"accuracy_{key}"], out[f"fd_{key}"] = scores["accuracy"], scores["fd"]
        for score in ("colour_accuracy", "background_accuracy"):  # prompts: the colour and background they ask
            if scores.get(score) is not None:
                out[f"{score}_{key}"] = scores[score]
        if mode == "csd":
            out[key] = summarize_stats(stats)

    def gamma_row(g: int, accuracy: float, fd: float, stats: dict, key: str) -> dict:
        return {
            "gamma": g,
            "target_passes": csd_passes(target.seq_len, sampling, replace(csd, gamma=g))[0],
            "acceptance": stats["acceptance_rate"],
            "accuracy": accuracy,
            "fd": fd,
            "fd_vs_target": frechet_distance(feats[key], feats["target"]),
        }

    rows = [gamma_row(csd.gamma, out["accuracy_csd"], out["fd_csd"], out["csd"], "csd")]
    for g in sorted(set(config.quality_gammas) - {csd.gamma}):
        images, stats = gen("csd", replace(csd, gamma=g))
        scores, feats[f"csd/{g}"] = quality(images, labels, ref, classifier)
        rows.append(gamma_row(g, scores["accuracy"], scores["fd"], summarize_stats(stats), f"csd/{g}"))
    out["quality_by_gamma"] = sorted(rows, key=lambda r: r["gamma"])
    aligned, unaligned = out.pop("csd"), out.pop("csd_unaligned")
    if per_token:  # acceptance of the drafted tokens (not cells) when each token is tested alone
        out["acceptance_token_aligned"] = out.pop("csd_token")["unit_acceptance_rate"]
        out["acceptance_token_unaligned"] = out.pop("csd_token_unaligned")["unit_acceptance_rate"]
    out["fd_csd_vs_target"] = frechet_distance(feats["csd"], feats["target"])
    out["fd_real"] = frechet_distance(reference_features(config.n, REAL_SEED, classifier), ref)
    return out | alignment(aligned, unaligned)


def alignment(aligned: dict, unaligned: dict) -> dict:
    """CSD's acceptance, draft-target distance, resampler tries and cap hits with and without alignment, from
    the two runs' summaries (:func:`csd.experiments.evaluate.summarize_stats`)."""
    return {
        "acceptance_aligned": aligned["acceptance_rate"],
        "acceptance_unaligned": unaligned["acceptance_rate"],
        # Both from the aligned run: the committed draft vs the target's aligned / independent sample.
        "distance_aligned": aligned["distance_aligned"],
        "distance_unaligned": aligned["distance_independent"],
        "resample_tries_aligned": aligned["mean_resample_tries"],
        "resample_tries_unaligned": unaligned["mean_resample_tries"],
        "cap_hits_aligned": aligned["cap_hits"],
        "cap_hits_unaligned": unaligned["cap_hits"],
        "drafted_tokens": aligned["drafted_tokens"],
    }


# --- report ----------------------------------------------------------------------------------------


def run_bench(target, draft, sampling: SamplingConfig, csd: CSDConfig, config: BenchConfig, classifier) -> dict:
    """Every measurement of the benchmark; the headline keys are for batch 8 (or the closest) and csd.gamma."""
    if csd.gamma_schedule:
        raise ValueError(
            "gamma_schedule must be empty for the benchmark, whose grid times constant draft lengths; "
            f"got {csd.gamma_schedule} (time one with --compare 'gamma_schedule=2:2:4', score it with evaluate)"
        )
    config = replace(config, gammas=tuple(sorted({*config.gammas, csd.gamma})))
    t0 = time.perf_counter()
    rows, default_samples = [], None
    default_batch = min(config.batches, key=lambda b: abs(b - defaults.BATCH_SIZE))
    for b in config.batches:
        batch_rows, costs, samples = time_batch(target, draft, sampling, csd, b, config)
        rows += batch_rows
        if b == default_batch:
            default_samples, default_costs = samples, costs
    head = next(r for r in rows if r["batch"] == default_batch and r["gamma"] == csd.gamma)
    result = {
        "speedup": head["speedup"],
        "speedup_bound": head["speedup_bound"],
        "speedup_bound_simple": head["speedup_bound_simple"],
        "fewer_steps_time": head["fewer_steps_time"],
        "draft_time": head["draft_time"],
        **quality_section(target, draft, sampling, csd, config, classifier),
        "rows": rows,
        "cost": {
            "batch": default_batch,
            "gamma": csd.gamma,
            "fractions_of_csd_time": cost_breakdown(default_samples[f"csd/{csd.gamma}"]),
            "per_step_ms": {k: 1e3 * v for k, v in asdict(default_costs).items()},
        },
    }
    for q in result["quality_by_gamma"]:  # the speed side of each quality row, where the grid timed it
        timed = [r for r in rows if r["batch"] == default_batch and r["gamma"] == q["gamma"]]
        q["speedup"] = timed[0]["speedup"] if timed else float("nan")
    result["settings"] = {
        "bench": asdict(config),
        "default_batch": default_batch,
        "sampling": sampling.knob_values(),
        "csd": csd.knob_values(),
        "num_tokens": target.seq_len,
        "family": target.traits.family,
        "threads": torch.get_num_threads(),
        "device": str(next(target.parameters()).device),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "wall_time_s": time.perf_counter() - t0,
    }
    return result


def compare_settings(
    target, draft, sampling: SamplingConfig, settings: dict[str, CSDConfig], batch: int, repeats: int
) -> list[dict]:
    """Target-only and every CSD setting timed side by side (interleaved after a warm-up, one process):
    per setting its target passes (from the cost model, equal to the sampler's) and its speed-up,
    median over median, with the spread of the per-round ratios."""
    labels, seeds = eval_labels_seeds(batch, 100, target.traits)
    runs = {"target-only": lambda: Method.target().run(target, draft, labels, seeds, sampling)}
    for name, csd in settings.items():
        runs[name] = lambda csd=csd: Method.speculative(csd).run(target, draft, labels, seeds, sampling)
    timed = alternate(runs, repeats)
    base = timed["target-only"]
    rows = []
    for name, csd in settings.items():
        lo, hi = ratio_spread(base, timed[name])
        passes, _ = csd_passes(target.seq_len, sampling, csd)
        speedup = base.median / timed[name].median
        rows.append({"setting": name, "target_passes": passes, "speedup": speedup, "min": lo, "max": hi})
    return rows


def single_batch(config: BenchConfig, batches: list[int] | None) -> int:
    """The batch of a one-batch mode (--compare, --frontier): the first --batches, else the grid's largest."""
    return config.batches[-1] if batches is None else batches[0]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m csd.experiments.bench", description=__doc__.split("\n")[0])
    add_setting_args(parser)
    parser.add_argument("--quick", action="store_true", help="reduced grid and sample sizes (minutes on a CPU)")
    parser.add_argument(
        "--out", default="bench/results", help="folder for bench.json (frontier_b<batch>.json with --frontier)"
    )
    parser.add_argument("--gammas", type=int, nargs="+", help="override the grid's draft lengths")
    parser.add_argument("--batches", type=int, nargs="+", help="override the grid's batch sizes")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--n", type=int, help="images per sampler for the quality metrics")
    parser.add_argument("--n-ref", type=int, help="held-out real images")
    parser.add_argument(
        "--quality-gammas", type=int, nargs="+", help="also score CSD images made with these draft lengths"
    )
    add_frontier_args(parser)
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="SETTING",
        help="only time target-only against these CSD settings side by side, e.g. 'gamma=4,tau_v=5' "
        "'gamma=8,gamma_schedule=2:2:4:4' (each over the --gamma/--tau-v/... setting); batch: the first --batches",
    )
    args = parser.parse_args(argv)

    check_frontier_args(args, parser)
    device = start_up(args, parser)
    config = QUICK if args.quick else BenchConfig()
    grid = {"gammas": args.gammas, "batches": args.batches, "repeats": args.repeats, "n": args.n, "n_ref": args.n_ref}
    grid |= {"quality_gammas": args.quality_gammas}
    config = replace(config, **{k: tuple(v) if isinstance(v, list) else v for k, v in grid.items() if v is not None})
    sampling, csd = settings_from_args(args)
    target, draft = load_models(args.target, args.draft, device, sampling.precision)
    if args.retime:
        return retime_frontier(target, draft, args, config.repeats)
    if args.merge_parts:
        return merge_frontier(target, sampling, csd, args)
    if args.frontier:
        return write_frontier(target, draft, sampling, csd, args, config.n, config.n_ref, config.repeats)
    if args.compare:
        settings = {spec: parse_setting(spec, csd, "--compare setting") for spec in args.compare}
        batch = single_batch(config, args.batches)
        rows = compare_settings(target, draft, sampling, settings, batch, config.repeats)
        print(f"batch {batch}, {sampling.num_steps} AR steps, {config.repeats} repeats; vs target-only:")
        for r in rows:
            spread = f"({r['min']:.2f}-{r['max']:.2f})"
            print(f"  {r['setting']}: {r['target_passes']} target passes, {r['speedup']:.2f}x {spread}")
        return {"compare": rows, "batch": batch}
    result = run_bench(target, draft, sampling, csd, config, load_classifier(args.classifier))
    result["settings"]["models"] = recorded_models(args.target, args.draft)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"speedup {result['speedup']:.2f}x, acceptance {result['acceptance_aligned']:.3f}; wrote {out / 'bench.json'}; "
        f"its tables (bench.md) and the docs blocks: python -m visualize.report {out / 'bench.json'}"
    )
    return result


if __name__ == "__main__":
    main()
