"""Tokens of short target-only and CSD runs, saved before the package was reorganised, so that a test
can show the same seeds still give the same tokens. Regenerate only on a deliberate change of output:

    python -m tests.data.make_golden_tokens
"""

from pathlib import Path

import torch
from safetensors.torch import save_file

from csd.experiments.pairs import load_embedded, random_pair, EMBEDDED_DIR
from csd.sampling import SamplingConfig, generate
from csd.speculative import CSDConfig, speculative_generate

OUT = Path(__file__).resolve().parent / "golden_tokens.safetensors"
LABELS, SEEDS = [3, 7], [11, 12]
SAMPLING = SamplingConfig(num_steps=8, cfg_scale=3.0, cfg_schedule="linear")
CASES = {
    "aligned": CSDConfig(gamma=3, prefill=0.05),
    "exact": CSDConfig(gamma=2, prefill=0.0, criterion="exact", max_tries=20),
}


def runs() -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    out = {}
    for name, pair in (("random", random_pair()), ("embedded", load_embedded(EMBEDDED_DIR, torch.device("cpu")))):
        out[f"{name}/target"] = generate(pair.target, LABELS, SEEDS, SAMPLING).tokens
        for case, csd in CASES.items():
            out[f"{name}/csd_{case}"] = speculative_generate(pair.target, pair.draft, LABELS, SEEDS, SAMPLING, csd).tokens
    return out


if __name__ == "__main__":
    save_file({k: v.contiguous() for k, v in runs().items()}, OUT)
    print(f"wrote {OUT}")
