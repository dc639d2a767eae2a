"""The prepared device check runs end to end on any machine at tiny sizes (``--tiny``): every step ok, the
JSON, the Markdown summary and the screenshot written (a GPU's run is committed under bench/results/gpu/); its
head roofline counts the head's weights and products as the fused sampler makes them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from csd.core.chain import HeadCondition, standard_noise
from csd.models.kernels import EAGER
from csd.models.mar.network import MAR_CONFIGS
from scripts.gpu_check import HEAD_SIZES, _random_head, chain_traffic
from scripts.random_official import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_device_check_runs_every_step_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, "-m", "scripts.gpu_check", "--out", str(tmp_path), "--tiny", "--skip-tests"]
    cmd += ["--device", "cpu"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = record["steps"]
    assert list(steps) == [
        "host syncs",
        "head chain",
        "head roofline",
        "serve",
        "generate api",
        "token statistics",
        "screenshot",
        "paper scale cell",
    ]
    assert all(s["ok"] for s in steps.values())
    syncs = steps["host syncs"]["result"]
    assert set(syncs) == {f"{f} {m}" for f in ("mar", "xar", "harmon") for m in ("target", "csd", "csd one_pass")}
    assert all(row["callbacks"] >= 2 and row["in_loop"] == 0 for row in syncs.values())  # a CPU never waits
    chains = steps["head chain"]["result"]  # on a CPU: eager and compiled, no CUDA graph
    assert set(chains) == {"batch 1", "batch 256"}
    assert all(set(r) == {"rows", "eager ms", "compiled ms", "compiled token diff"} for r in chains.values())
    assert all(r["compiled token diff"] < 1e-4 for r in chains.values())  # relative: float32 rounding (~1e-6)
    check_head_roofline(steps["head roofline"]["result"])
    assert steps["serve"]["result"]["pairs"] == ["MAR-L / MAR-B (ImageNet)"]
    assert set(steps["generate api"]["result"]) >= {"batch 1", "batch 8"}
    assert all(row["finite"] and row["alike"] for row in steps["token statistics"]["result"].values())
    assert (tmp_path / "screenshot.png").stat().st_size > 10_000
    assert "| generate api | yes |" in (tmp_path / "gpu_check.md").read_text()


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def check_head_roofline(result: dict) -> None:
    """The head roofline step at --tiny sizes on a CPU: every size's rows against the copy bandwidth, its
    bytes and FLOPs from :func:`chain_traffic`, each derived figure from the measured ones."""
    assert set(result) == {"bandwidth GB/s", "copy", "MAR-B", "MAR-L", "MAR-H"}
    copy, bandwidth = result["copy"], result["bandwidth GB/s"]
    assert copy["bytes"] == 2 * (64 << 20) and bandwidth == copy["GB/s"] > 0  # read + written, --tiny's 64 MiB
    assert _close(bandwidth, copy["bytes"] / (copy["ms"] * 1e-3) / 1e9)
    for size, name in (("MAR-B", "mar_base"), ("MAR-L", "mar_large"), ("MAR-H", "mar_huge")):
        config, entry = TINY[name], result[size]
        assert (entry["width"], entry["depth"]) == (config.diffloss_w, config.diffloss_d)
        assert (entry["z dim"], entry["steps"]) == (config.decoder_embed_dim, config.num_sampling_steps)
        assert set(entry) - {"width", "depth", "z dim", "steps"} == {"tokens 4", "tokens 32"}
        for tokens in (4, 32):
            row = entry[f"tokens {tokens}"]
            assert row["rows"] == 2 * tokens and set(row) == {"rows", "eager", "compiled"}  # a CPU: no graphs
            for run_ in (row["eager"], row["compiled"]):  # float32 products on a CPU
                assert {k: run_[k] for k in ("bytes", "flops")} == chain_traffic(config, tokens, 4)
                assert all(math.isfinite(v) and v > 0 for v in run_.values())
                assert _close(run_["bound ms"], run_["bytes"] / (bandwidth * 1e9) * 1e3)
                assert _close(run_["ratio"], run_["ms"] / run_["bound ms"])
                assert _close(run_["GFLOP/s"], run_["flops"] / (run_["ms"] * 1e-3) / 1e9)


@pytest.mark.parametrize("tokens", [1, 4, 512])
def test_the_chain_traffic_counts_the_weights_a_transition_reads_and_the_products_the_chain_makes(tokens):
    config = TINY["mar_huge"]
    steps, width, depth = config.num_sampling_steps, config.diffloss_w, config.diffloss_d
    gen = torch.Generator().manual_seed(0)
    head = _random_head(config.token_dim, config.decoder_embed_dim, width, depth, steps, gen, torch.device("cpu"))
    net = head.net
    numel = lambda modules: sum(p.numel() for m in modules for p in m.parameters())
    per_step = numel([net.input_proj, *(b.mlp for b in net.res_blocks), net.final_layer.linear])
    modulation = numel([*(b.adaLN_modulation for b in net.res_blocks), net.final_layer.adaLN_modulation])
    made = 2 * tokens * width * (3 * depth + 2)  # the modulations of one transition's rows
    traffic = chain_traffic(config, tokens, product_bytes=4)
    assert traffic["bytes"] == steps * 4 * (per_step + min(modulation, made))
    assert made < modulation if tokens <= 4 else modulation < made  # both ways of the modulations are reached
    # The FLOPs of the fused sampler's products, counted by torch, once the chain's embeddings are made.
    cond = HeadCondition(*(torch.randn(tokens, config.decoder_embed_dim, generator=gen) for _ in range(2)), None)
    noise = standard_noise(tokens, config.token_dim, steps, gen, torch.device("cpu"), torch.float32)
    head.use_kernels(EAGER)
    chain = head.chain(steps)
    with torch.inference_mode():
        chain.sample(cond, noise)
        with FlopCounterMode(display=False) as counter:
            chain.sample(cond, noise)
    assert traffic["flops"] == counter.get_total_flops()


def test_at_the_official_sizes_a_chain_reads_its_modulations_made_once_rather_than_their_weights():
    for name in HEAD_SIZES.values():
        config = MAR_CONFIGS[name]
        width, depth, steps = config.diffloss_w, config.diffloss_d, config.num_sampling_steps
        for product_bytes in (2, 4):
            traffic = lambda tokens, b=product_bytes, c=config: chain_traffic(c, tokens, b)["bytes"]
            # from 1 to 256 tokens the bytes grow by the modulations made, the weights' way never taken
            assert traffic(256) - traffic(1) == steps * 2 * 255 * width * (3 * depth + 2) * 4
