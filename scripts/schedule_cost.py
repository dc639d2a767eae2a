"""Side-by-side wall time of target-only and CSD with constant and growing draft lengths.

Usage: python -m scripts.schedule_cost. Batch 8, one thread, 32 AR steps, tau_v 5, five interleaved
repeats after a warm-up (``csd.experiments.bench.alternate``); prints each CSD setting's target passes and its
speed-up over target-only (median over median). The benchmark's grid times constant draft lengths
only; this times the schedules of the README's "growing blocks" table beside them."""

import statistics

import torch

from csd.cost import csd_passes
from csd.experiments.bench import alternate
from csd.experiments.evaluate import load_models
from csd.sampling import SamplingConfig, generate
from csd.speculative import CSDConfig, speculative_generate

MODELS = "assets/models/shapes_{}.safetensors"
SETTINGS = {
    "gamma 4": CSDConfig(gamma=4, tau_v=5.0),
    "gamma 8": CSDConfig(gamma=8, tau_v=5.0),
    "2, 2, 4, 4, then 8": CSDConfig(gamma=8, gamma_schedule=(2, 2, 4, 4), tau_v=5.0),
    "4, 4, 4, then 8": CSDConfig(gamma=8, gamma_schedule=(4, 4, 4), tau_v=5.0),
}


def main() -> None:
    torch.set_num_threads(1)
    target, draft = load_models(MODELS.format("target"), MODELS.format("draft"), torch.device("cpu"))
    s = SamplingConfig(num_steps=32, cfg_scale=3.0, cfg_schedule="linear")
    labels, seeds = list(range(8)), list(range(100, 108))
    runs = {"target": lambda: generate(target, labels, seeds, s)}
    for name, csd in SETTINGS.items():
        runs[name] = lambda csd=csd: speculative_generate(target, draft, labels, seeds, s, csd)
    out = alternate(runs, repeats=5)
    t = statistics.median(out["target"].seconds)
    for name, csd in SETTINGS.items():
        passes, _ = csd_passes(target.seq_len, s.num_steps, csd.gamma, csd.prefill, csd.gamma_schedule)
        print(f"{name}: {passes} target passes, speedup {t / statistics.median(out[name].seconds):.2f}x")


if __name__ == "__main__":
    main()
