"""Tokens of short target-only and CSD runs, saved before the package was reorganised, so that a test
can show the same seeds still give the same tokens (tests/decoders/test_same_tokens.py). Beside each run's tokens
(key ``pair/run``) the file keeps what the test compares exactly: the orders (``pair/run/ar_step``, the AR
step that made each position) and, for CSD runs, who made each token (``maker``), its draft block
(``block``), the resampler's tries (``tries``), the two terms of log r (``log_ratio_trajectory``,
``log_ratio_final``) and the uniform u each drafted token was tested with (``draw``). The file's metadata
(``made_by``) names the CPU capability (``torch.backends.cpu.get_cpu_capability()``) and torch version
that made each array. The tokens were saved before the move (b99b9b6); an embedded pair's arrays are remade
when its weights change (``--only xar``, ``--only text``), and fields are added beside unchanged tokens with
``--keep-tokens``.

Regenerate only on a deliberate change of output:

    python -m tests.data.make_golden_tokens                # every array
    python -m tests.data.make_golden_tokens --only xar     # one pair's arrays (new weights shipped)
    python -m tests.data.make_golden_tokens --keep-tokens  # every array but the tokens (a new trace field)

and, after any of them, measure the saved runs' rounding against their float64 reruns (the bounds of
tests/decoders/test_same_tokens.py stand on it):

    python -m tests.data.make_golden_tokens --measure      # writes tests/data/golden_rounding.json
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from csd.config import CSDConfig, SamplingConfig
from csd.decoding import Generation
from csd.serving.pairs import embedded_pair, random_pair
from csd.sampling import generate
from csd.speculative import speculative_generate
from tests.helpers import pair_name

OUT = Path(__file__).resolve().parent / "golden_tokens.safetensors"
ROUNDING = OUT.with_name("golden_rounding.json")
LABELS, SEEDS = [3, 7], [11, 12]
PROMPTS = ["a large red star on a plain white background", "a small blue circle on a black to white gradient"]
SAMPLING = SamplingConfig(num_steps=8, cfg_scale=3.0, cfg_schedule="linear")
CASES = {
    "aligned": CSDConfig(gamma=3, prefill=0.05),
    "exact": CSDConfig.from_knobs(gamma=2, prefill=0.0, criterion="exact", max_tries=20),
}


# xAR makes one cell per AR step (16 here); few flow steps keep it quick.
XAR_SAMPLING = replace(SAMPLING, num_steps=16, head_steps=6)


def pairs():
    """(name, pair, conditions, sampling) of every family: untrained and embedded pairs."""
    yield "random", random_pair(family="mar"), LABELS, SAMPLING
    yield "embedded", embedded_pair(pair_name("mar", "embedded")), LABELS, SAMPLING
    yield "random_text", random_pair(family="harmon"), PROMPTS, SAMPLING
    yield "text", embedded_pair(pair_name("harmon", "embedded")), PROMPTS, SAMPLING
    yield "random_xar", random_pair(family="xar"), LABELS, XAR_SAMPLING
    yield "xar", embedded_pair(pair_name("xar", "embedded")), LABELS, XAR_SAMPLING


def runs(precision: str = "float32") -> dict[str, Generation]:
    """Every run; CSD runs keep their details (the acceptance draws). The file's runs are float32 ones, made
    on one torch thread; the test's are float64 ones (the same runs without their rounding, the same on
    every CPU: csd.core.precision), which it compares with the file's."""
    if precision == "float32":
        torch.set_num_threads(1)
    out = {}
    for name, pair, conditions, sampling in pairs():
        pair, sampling = pair.at_precision(precision), replace(sampling, precision=precision)
        out[f"{name}/target"] = generate(pair.target, conditions, SEEDS, sampling)
        for case, csd in CASES.items():
            out[f"{name}/csd_{case}"] = speculative_generate(
                pair.target, pair.draft, conditions, SEEDS, sampling, csd, keep_details=True
            )
    return out


def arrays(key: str, run: Generation) -> dict[str, torch.Tensor]:
    """What the file keeps of one run: its tokens under ``key``, its orders and, for a CSD run, its decisions."""
    t = run.trace
    out = {key: run.tokens.contiguous(), f"{key}/ar_step": torch.from_numpy(t.ar_step)}
    if t.details is not None:
        out |= {
            f"{key}/maker": torch.from_numpy(t.maker),
            f"{key}/block": torch.from_numpy(t.block),
            f"{key}/tries": torch.from_numpy(t.resample_tries),
            f"{key}/log_ratio_trajectory": torch.from_numpy(t.log_ratio_trajectory),
            f"{key}/log_ratio_final": torch.from_numpy(t.log_ratio_final),
            f"{key}/draw": torch.from_numpy(t.details.accept_draw),
        }
    return out


def this_machine() -> str:
    """The capability and torch version of this process, as the metadata records them."""
    return f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"


def cpu_model() -> str:
    """This CPU's vendor, family, model and name (/proc/cpuinfo; the platform's processor elsewhere): float64
    reruns are alike under every kernel choice of one CPU model, not across models (their BLAS kernels differ)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    info = dict(line.split(":", 1) for line in lines if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    return (
        f"{info.get('vendor_id')} family {info.get('cpu family')} model {info.get('model')}: {info.get('model name')}"
    )


def made_by(path: Path = OUT) -> dict[str, str]:
    """Which capability and torch version made each saved array (the file's ``made_by`` metadata)."""
    with safe_open(path, "pt") as f:
        return json.loads((f.metadata() or {}).get("made_by", "{}"))


def log_ratio_scale(data: dict[str, torch.Tensor], key: str) -> np.ndarray:
    """(B, N) the size log r's rounding scales with: its two terms' magnitudes (they can nearly cancel), plus 1."""
    traj, final = (data[f"{key}/log_ratio_{t}"].double().numpy() for t in ("trajectory", "final"))
    return np.abs(traj) + np.abs(final) + 1.0


def log_ratio(data: dict[str, torch.Tensor], key: str) -> np.ndarray:
    return (data[f"{key}/log_ratio_trajectory"].double() + data[f"{key}/log_ratio_final"].double()).numpy()


def rounding(saved: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per saved run, how far its float32 values lie from ``fresh`` (the float64 reruns): the greatest token
    difference, its 99th percentile, and for a CSD run the greatest log r difference in units of
    :func:`log_ratio_scale`."""
    out = {}
    for key in sorted(k for k in saved if k.count("/") == 1):
        diff = (fresh[key].double() - saved[key].double()).abs().reshape(-1)
        out[key] = {"most": diff.max().item(), "q99": diff.quantile(0.99).item()}
        if f"{key}/maker" in saved:
            moved = np.abs(log_ratio(fresh, key) - log_ratio(saved, key)) / log_ratio_scale(saved, key)
            out[key]["log_ratio"] = float(np.nanmax(moved))
    return out


def measure() -> None:
    fresh = {name: a for key, run in runs("float64").items() for name, a in arrays(key, run).items()}
    record = {"what": "saved float32 runs against their float64 reruns", "by": this_machine(), "cpu": cpu_model()}
    ROUNDING.write_text(json.dumps(record | {"runs": rounding(load_file(OUT), fresh)}, indent=1) + "\n")
    print(f"wrote {ROUNDING}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", help="pair names (embedded, text, xar, random, ...): remake their arrays")
    p.add_argument("--keep-tokens", action="store_true", help="keep every saved token array, remake the rest")
    p.add_argument("--measure", action="store_true", help="write the saved runs' rounding (golden_rounding.json)")
    args = p.parse_args(argv)
    if args.measure:
        return measure()
    fresh = {name: a for key, run in runs().items() for name, a in arrays(key, run).items()}
    saved, origin = (load_file(OUT), made_by()) if OUT.exists() else ({}, {})
    remade = {k for k in fresh if not args.only or k.split("/")[0] in args.only}
    if args.keep_tokens:
        remade -= {k for k in saved if k.count("/") == 1}
    out = saved | {k: fresh[k] for k in remade}
    origin |= dict.fromkeys(remade, this_machine())
    save_file({k: v.contiguous() for k, v in sorted(out.items())}, OUT, metadata={"made_by": json.dumps(origin)})
    print(f"wrote {OUT}: {len(remade)} arrays made by {this_machine()}, {len(out) - len(remade)} kept")


if __name__ == "__main__":
    main()
