"""The benchmark's frontier commands (``python -m csd.experiments.bench --frontier ...``): their flags, a run
written as frontier_b<batch>.json, parts run at once and merged, a grid that grew merged with the rows kept
from an earlier run, and a committed frontier timed again."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from csd.config import CSDConfig, SamplingConfig
from csd.experiments import frontier
from csd.experiments.evaluate import recorded_models
from csd.experiments.grid import pair_grid, select
from csd.experiments.parts import kept_rows, merge_parts, part
from csd.models.checkpoint import file_digest
from csd.records.verdict import verdict_line
from csd.shapes.metrics import REFERENCE_SEED, load_classifier, reference_features


def frontier_part_arg(text: str) -> tuple[int, int]:
    """--frontier-part K/N -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--frontier-part must be K/N, e.g. 1/2, got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--frontier-part K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def merge_parts_arg(values: list[str], parser: argparse.ArgumentParser) -> list[tuple[int, int]]:
    """--merge-parts N -> [(1, N) .. (N, N)]; --merge-parts K/N ... -> those parts, each once."""
    try:
        if len(values) == 1 and "/" not in values[0]:
            n = int(values[0])
            if n < 1:
                raise ValueError
            return [(k, n) for k in range(1, n + 1)]
        specs = [frontier_part_arg(v) for v in values]
    except (ValueError, argparse.ArgumentTypeError):
        parser.error(f"--merge-parts takes N >= 1 or parts K/N (1 <= K <= N), got {' '.join(values)!r}")
    if len(set(specs)) != len(specs):
        parser.error(f"--merge-parts names a part twice: {' '.join(values)!r}")
    return specs


def add_frontier_args(parser: argparse.ArgumentParser) -> None:
    """The frontier's flags of the benchmark's command line."""
    group = parser.add_argument_group("the quality-time frontier")
    group.add_argument(
        "--frontier",
        action="store_true",
        help="instead: the quality-time frontier of target-only and CSD settings, "
        "timed at every --batches (default 1 and 8): frontier_b<batch>.json in --out",
    )
    group.add_argument(
        "--retime",
        metavar="FRONTIER_JSON",
        help="time a committed frontier again at its batch (same settings; quality kept) and rewrite it",
    )
    group.add_argument(
        "--frontier-only",
        nargs="+",
        metavar="KEY",
        help="with --frontier: only the baseline and the settings these name by key (frontier_subset_b<batch>.json): "
        "every setting whose key holds each comma-separated part ('csd', 'gamma=4,tau_v=5', 'flow_grid=uniform', "
        "a bare knob such as 'cond_cache_start'), or '=' and a whole key for that setting alone ('=csd')",
    )
    group.add_argument(
        "--frontier-part",
        type=frontier_part_arg,
        metavar="K/N",
        help="with --frontier: part K of N of the grid, for N processes at once, one per core "
        "(frontier_part<K>of<N>_b<batch>.json); then --merge-parts N",
    )
    group.add_argument(
        "--merge-parts",
        nargs="+",
        metavar="N",
        help="put the N parts in --out together into frontier_b<batch>.json (same --target/--draft and settings); "
        "or the parts named as K/N, which together cover the grid (e.g. 1/2 2/4 4/4: half 2 run as two quarters)",
    )
    group.add_argument(
        "--keep-rows",
        metavar="DIR",
        help="with --merge-parts, for a grid that grew: the parts ran only the new settings (--frontier-only, "
        "given again here), the other rows are kept from DIR/frontier_b<batch>.json once the settings measured "
        "in both agree on quality; then --retime the result",
    )


def check_frontier_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse --keep-rows without --merge-parts; read --merge-parts into its parts."""
    if args.keep_rows and not args.merge_parts:
        parser.error("--keep-rows goes with --merge-parts N")
    if args.merge_parts:
        args.merge_parts = merge_parts_arg(args.merge_parts, parser)


def frontier_batches(batches: list[int] | None) -> tuple[int, ...]:
    """The batches a frontier is timed at: every --batches, else the latency and throughput regimes."""
    return tuple(dict.fromkeys(batches)) if batches else (1, 8)


def frontier_file(batch: int, only=None, part_: tuple[int, int] | None = None) -> str:
    """frontier_b<batch>.json; frontier_subset_b<batch>.json (--frontier-only); frontier_part<k>of<n>_b<batch>.json
    (--frontier-part k/n)."""
    if part_:
        return f"frontier_part{part_[0]}of{part_[1]}_b{batch}.json"
    return f"frontier_subset_b{batch}.json" if only else f"frontier_b{batch}.json"


def _written(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{verdict_line(result)}\nwrote {path}; its table (.md) and charts: python -m visualize.report {path}")


def write_frontier(
    target, draft, sampling: SamplingConfig, csd: CSDConfig, args, n: int, n_ref: int, repeats: int
) -> dict[int, dict]:
    """The frontier at every batch of --batches (default 1 and 8), one run, ``n`` images per setting against
    ``n_ref`` real ones, ``repeats`` timing rounds: frontier_b<batch>.json in --out (frontier_subset_b<batch>
    for a run of some settings, --frontier-only)."""
    points = select(pair_grid(target, sampling, csd, args.quick), args.frontier_only)
    if args.frontier_part:
        points = part(points, *args.frontier_part)
    classifier = load_classifier(args.classifier)
    ref = reference_features(n_ref, REFERENCE_SEED, classifier)
    batches = frontier_batches(args.batches)
    t0 = time.perf_counter()
    results = frontier.run_frontier(target, draft, points, classifier, ref, n, batches, repeats)
    minutes = (time.perf_counter() - t0) / 60
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for b, result in results.items():
        result["settings"] = {"sampling": sampling.knob_values(), "csd": csd.knob_values(), "n_ref": n_ref}
        result["settings"]["batches"] = list(batches)
        result["minutes"] = round(minutes, 1)  # the whole run, every batch
        result["models"] = recorded_models(args.target, args.draft)
        result["weights"] = file_digest(Path(args.target), Path(args.draft))  # as ModelPair.weights: the app checks it
        result["family"] = target.traits.family
        _written(result, out / frontier_file(b, args.frontier_only, args.frontier_part))
    return results


def _parts(out: Path, batch: int, args) -> list[dict]:
    """The parts --merge-parts names at ``batch``, measured on the --target / --draft weights."""
    names = " ".join(f"{k}/{m}" for k, m in args.merge_parts)
    paths = [out / frontier_file(batch, part_=spec) for spec in args.merge_parts]
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise SystemExit(f"--merge-parts {names}: missing {', '.join(missing)}")
    parts = [json.loads(p.read_text()) for p in paths]
    if {p["weights"] for p in parts} != {file_digest(Path(args.target), Path(args.draft))}:
        raise SystemExit(f"--merge-parts {names}: the parts were measured on other weights than --target / --draft")
    return parts


def _kept(parts: list[dict], batch: int, args) -> tuple[dict, dict]:
    """--keep-rows: the earlier frontier's rows the parts did not run, as one more part, and where they came
    from."""
    earlier_path = Path(args.keep_rows) / frontier_file(batch)
    earlier = json.loads(earlier_path.read_text())
    if earlier["weights"] != parts[0]["weights"] or earlier["batch"] != batch or earlier["n"] != parts[0]["n"]:
        raise SystemExit(f"--keep-rows: {earlier_path} was measured on other weights, batch or n")
    try:
        kept = kept_rows(earlier, parts)
    except ValueError as e:
        raise SystemExit(f"--keep-rows {earlier_path}: {e}") from None
    return kept, {"from": str(earlier_path), "rows": len(kept["rows"]), "minutes": earlier["minutes"]}


def merge_frontier(target, sampling: SamplingConfig, csd: CSDConfig, args) -> dict[int, dict]:
    """--merge-parts N (or K/N ...): the parts 1..N of a frontier run at once (--frontier-part k/N), or the
    parts named, put together into frontier_b<batch>.json, the rows in the grid's order; its minutes: the
    longest part's (each part's under ``parts``)."""
    only = None if args.keep_rows else args.frontier_only  # kept rows: the parts were a subset of the grid
    grid = select(pair_grid(target, sampling, csd, args.quick), only)
    out, merged = Path(args.out), {}
    for b in frontier_batches(args.batches):
        parts = _parts(out, b, args)
        minutes = max(p["minutes"] for p in parts)  # the parts ran at once
        if args.keep_rows:
            kept, source = _kept(parts, b, args)
            parts.append(kept)
        try:
            result = merge_parts(parts, grid)
        except ValueError as e:  # the parts do not cover the grid (a part missing or from another grid)
            raise SystemExit(f"--merge-parts {' '.join(f'{k}/{m}' for k, m in args.merge_parts)}: {e}") from None
        result["minutes"] = minutes
        if args.keep_rows:
            result["kept_rows"] = source
        _written(result, out / frontier_file(b, only))
        merged[b] = result
    return merged


def retime_frontier(target, draft, args, repeats: int) -> dict:
    """--retime FILE: the frontier in FILE timed again (same settings, models and batch) over ``repeats``
    rounds, its quality kept, written back to FILE."""
    path = Path(args.retime)
    result = json.loads(path.read_text())
    if result.get("weights") != file_digest(Path(args.target), Path(args.draft)):
        raise SystemExit(f"--retime {path}: measured on other weights than --target / --draft")
    t0 = time.perf_counter()
    out = frontier.retime(target, draft, result, repeats)
    out["retime_minutes"] = round((time.perf_counter() - t0) / 60, 1)
    _written(out, path)
    return out
