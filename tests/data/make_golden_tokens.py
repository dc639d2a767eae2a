"""Tokens of short target-only and CSD runs, saved before the package was reorganised, so that a test
can show the same seeds still give the same tokens. Regenerate only on a deliberate change of output:

    python -m tests.data.make_golden_tokens
"""

from pathlib import Path

import torch
from safetensors.torch import save_file

from dataclasses import replace

from csd.experiments.pairs import embedded_pair, random_pair
from tests.helpers import pair_name
from csd.config import SamplingConfig
from csd.sampling import generate
from csd.config import CSDConfig
from csd.speculative import speculative_generate

OUT = Path(__file__).resolve().parent / "golden_tokens.safetensors"
LABELS, SEEDS = [3, 7], [11, 12]
PROMPTS = ["a large red star on a plain white background", "a small blue circle on a black to white gradient"]
SAMPLING = SamplingConfig(num_steps=8, cfg_scale=3.0, cfg_schedule="linear")
CASES = {
    "aligned": CSDConfig(gamma=3, prefill=0.05),
    "exact": CSDConfig(gamma=2, prefill=0.0, criterion="exact", max_tries=20),
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


def runs() -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    out = {}
    for name, pair, conditions, sampling in pairs():
        out[f"{name}/target"] = generate(pair.target, conditions, SEEDS, sampling).tokens
        for case, csd in CASES.items():
            run = speculative_generate(pair.target, pair.draft, conditions, SEEDS, sampling, csd)
            out[f"{name}/csd_{case}"] = run.tokens
    return out


def main(argv: list[str] | None = None) -> None:
    """Write every run's tokens, or with ``--only PAIR ...`` remake those pairs' keys alone (after new
    weights ship for an embedded pair: the others stay the tokens saved before the move)."""
    import argparse

    from safetensors.torch import load_file

    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="+", help="pair names (embedded, text, xar, random, ...)")
    args = p.parse_args(argv)
    fresh = runs()
    if args.only:
        saved = load_file(OUT)
        fresh = saved | {k: v for k, v in fresh.items() if k.split("/")[0] in args.only}
    save_file({k: v.contiguous() for k, v in fresh.items()}, OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
