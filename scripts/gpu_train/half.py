"""float16 <-> float32 copies of a safetensors file and its .json record: how weights cross the device tool's
64 MiB limit (the trained weights come back rounded to float16, relative error <= 4.9e-4 per weight).

    python scripts/gpu_train/half.py to16|to32 SRC DST
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(mode: str, src: Path, dst: Path) -> None:
    w = load_file(str(src))
    if mode == "to16":
        finite = [t[t.isfinite()] for t in w.values() if t.is_floating_point() and t.isfinite().any()]
        big = max(float(t.abs().max()) for t in finite)
        if big >= 6e4:
            raise SystemExit(f"{src}: a weight of {big:.3g} does not fit float16")
        out = {k: (t.half() if t.dtype == torch.float32 else t) for k, t in w.items()}
        rel = max(
            float(((out[k].float() - t).abs() / t.abs().clamp_min(1e-3)).nan_to_num(0.0).max())
            for k, t in w.items()
            if t.dtype == torch.float32
        )
        print(f"{src.name}: max |w| {big:.3g}, max relative rounding {rel:.2e}")
    else:
        out = {k: (t.float() if t.dtype == torch.float16 else t) for k, t in w.items()}
    save_file(out, str(dst))
    if src.with_suffix(".json").exists():
        shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
