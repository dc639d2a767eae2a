"""Side-by-side wall time of target-only and CSD (gamma 8) at tau_v 42 and 5, batch 8, 1 thread.

Usage: python -m scripts.tau_v_cost. Block verification makes S / gamma target passes whatever the
acceptance, so a stricter test should cost only the extra resampling."""

import statistics

import torch

from csd.experiments.bench import alternate
from csd.experiments.evaluate import load_models
from csd.sampling import SamplingConfig, generate
from csd.speculative import CSDConfig, speculative_generate

MODELS = "assets/models/shapes_{}.safetensors"


def main() -> None:
    torch.set_num_threads(1)
    target, draft = load_models(MODELS.format("target"), MODELS.format("draft"), torch.device("cpu"))
    s = SamplingConfig(num_steps=32, cfg_scale=3.0, cfg_schedule="linear")
    labels, seeds = list(range(8)), list(range(100, 108))
    runs = {
        "target": lambda: generate(target, labels, seeds, s),
        "csd_tau42": lambda: speculative_generate(target, draft, labels, seeds, s, CSDConfig(tau_v=42.0)),
        "csd_tau5": lambda: speculative_generate(target, draft, labels, seeds, s, CSDConfig(tau_v=5.0)),
    }
    out = alternate(runs, repeats=5)
    t = statistics.median(out["target"].seconds)
    for name, smp in out.items():
        extra = ""
        if name != "target":
            tr = smp.outputs[-1].trace.summary()
            extra = f" acceptance {tr['acceptance_rate']:.3f} tries {tr.get('mean_resample_tries', float('nan')):.2f}"
        print(f"{name}: speedup {t / statistics.median(smp.seconds):.2f}x{extra}")


if __name__ == "__main__":
    main()
