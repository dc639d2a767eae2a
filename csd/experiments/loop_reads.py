"""Host reads per AR step inside the decoding loop, for every embedded pair, target-only and CSD
(:mod:`csd.core.host_reads`): each one is a point where a GPU run stops queueing work until the device catches up.

Each pair decodes a batch of 2 at 16 AR steps (xAR: its 16 cells), 2 head steps, guidance 3, CSD at gamma 4
(the published block, and the exact block, which reads on the host once per block by design: where the next
block starts depends on the verdicts), each at the CPU's default (the resampler "auto" runs the rounds there)
and at the CUDA default (:meth:`csd.config.CSDConfig.on_device`: "auto" picks the one pass), with the aligned
criterion and, at the CUDA default, the published one. The runs are on the CPU either way: what is counted is
what the host would have to read. Reads are counted up to 8 and up to 16 committed AR steps; the difference
over the steps between is what the loop reads per AR step.

    python -m csd.experiments.loop_reads --out bench/results/host_reads/cuda_default.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from csd.config import CSDConfig, SamplingConfig
from csd.core.host_reads import reads_per_step
from csd.dispatch import Method
from csd.serving.pairs import embedded_pair, pair_specs

SAMPLING = SamplingConfig(num_steps=16, head_steps=2, cfg_scale=3.0)
CSD = CSDConfig(gamma=4)
EXACT = CSD.with_knobs(block="exact")
METHODS = {
    "target-only": Method.target(),
    "CSD, gamma 4, CPU default (rounds)": Method.speculative(CSD),
    "CSD, gamma 4, CUDA default (one pass)": Method.speculative(CSD.on_device("cuda")),
    "CSD, gamma 4, published criterion, CUDA default": Method.speculative(
        CSD.with_knobs(criterion="published").on_device("cuda")
    ),
    "CSD, gamma 4, exact block, CPU default": Method.speculative(EXACT),
    "CSD, gamma 4, exact block, CUDA default": Method.speculative(EXACT.on_device("cuda")),
}
SEEDS = (0, 1)
STOPS = (8, 16)


def measure(name: str) -> dict[str, dict]:
    """Reads per AR step of each method on the embedded pair ``name``: the total and by op."""
    pair = embedded_pair(name)
    conditions = list(pair.prompts[: len(SEEDS)]) if pair.prompts else list(range(len(SEEDS)))
    rows = {}
    for label, method in METHODS.items():
        run = lambda on_step, m=method: m.run(pair.target, pair.draft, conditions, list(SEEDS), SAMPLING, on_step)
        per_step, by_op = reads_per_step(run, *STOPS)
        rows[label] = {"per_step": per_step, "by_op": dict(sorted(by_op.items()))}
    return rows


def markdown(result: dict) -> str:
    lines = [
        "# Host reads per AR step inside the decoding loop",
        "",
        "| pair | " + " | ".join(METHODS) + " |",
        "| --- |" + " --- |" * len(METHODS),
    ]
    for pair, rows in result["pairs"].items():
        lines.append(f"| {pair} | " + " | ".join(f"{rows[m]['per_step']:.2f}" for m in METHODS) + " |")
    lines += ["", f"Batch {len(SEEDS)}; {result['settings']}. By op:", ""]
    for pair, rows in result["pairs"].items():
        for m, row in rows.items():
            ops = ", ".join(f"{op} {n / (STOPS[1] - STOPS[0]):.2f}" for op, n in row["by_op"].items()) or "none"
            lines.append(f"* {pair}, {m}: {ops}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (and the table beside it, .md)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    result = {
        "settings": f"16 AR steps, 2 head steps, guidance 3, stops after {STOPS[0]} and {STOPS[1]} committed steps",
        "pairs": {spec.name: measure(spec.name) for spec in pair_specs("embedded")},
    }
    text = markdown(result)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
