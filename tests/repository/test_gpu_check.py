"""The prepared device check runs end to end on any machine at tiny sizes (``--tiny``): every step ok, the
JSON, the Markdown summary and the screenshot written (a GPU's run is committed under bench/results/gpu/); its
head roofline counts the head's weights and products as the fused sampler makes them."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from csd.core.chain import HeadCondition, standard_noise
from csd.models.kernels import EAGER
from csd.models.mar.network import MAR_CONFIGS
from scripts.gpu_check import HEAD_SIZES, _random_head, chain_traffic
from scripts.paper_scale_probe import paired, weights_digest
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
        "exact block",
        "head chain",
        "head roofline",
        "serve",
        "generate api",
        "token statistics",
        "screenshot",
        "paper scale cell",
        "paper scale paired",
    ]
    assert all(s["ok"] for s in steps.values())
    assert set(steps["paper scale paired"]["result"]) == {"skipped"}  # no --before TREE
    syncs = steps["host syncs"]["result"]
    assert set(syncs) == {f"{f} {m}" for f in ("mar", "xar", "harmon") for m in ("target", "csd", "exact block")}
    assert all(row["per_step"] == 0 and not row["where"] for row in syncs.values())  # a CPU never waits
    assert {row["resampler"] for row in syncs.values()} == {None, "rounds"}  # "auto" on a CPU: the rounds
    exact = steps["exact block"]["result"]
    assert exact["target-only"]["vs_target_only"] == 1.0 and exact["target-only"]["steps_kept_per_block"] is None
    for gamma in (4, 8):  # one target pass per block: as many as the blocks, each keeping one step or more
        row, each = exact[f"exact, gamma {gamma}"], exact[f"exact, gamma {gamma}, a pass per view"]
        assert 1 <= row["steps_kept_per_block"] <= gamma and row["target_passes"] <= exact["num_steps"]
        assert each["target_passes"] > row["target_passes"]  # a pass per drafted step
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


BEFORE = "e1b9e0a"  # the tree the paired paper-scale step was first asked to compare with


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["HEAD", BEFORE])
def test_the_paired_paper_scale_step_times_both_trees_on_the_same_weights(tmp_path, commit):
    """The step at --tiny against a worktree of ``commit``: both trees build the same weights, every cell has
    both trees' medians of three paired repeats and a finite positive speed-up, each tree's repeats make the
    same tokens; against HEAD itself (the same code both sides) the tokens and decisions are the same."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"{commit} is not in this checkout's history")
    tree = tmp_path / "before"
    assert _git("worktree", "add", "--detach", str(tree), commit).returncode == 0
    try:
        cmd = [sys.executable, "-m", "scripts.gpu_check", "--out", str(tmp_path / "out"), "--tiny", "--skip-tests"]
        cmd += ["--skip-serve", "--device", "cpu", "--only", "paper scale paired", "--before", str(tree)]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        _git("worktree", "remove", "--force", str(tree))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["steps"]
    assert list(steps) == ["paper scale paired"] and steps["paper scale paired"]["ok"]
    result = steps["paper scale paired"]["result"]
    assert result["trees"]["before"].split()[0] == _git("rev-parse", "--short", commit).stdout.strip()
    assert (result["pair"], result["precision"], result["gamma"], result["repeats"]) == (
        "MAR-L / MAR-B",
        "float32",
        2,
        3,
    )
    assert (result["num_steps"], result["head_steps"]) == (8, 4)  # the tiny sampler
    assert result["weights"] == "random (seed 0)"  # and the same in both trees: the step checks their digests
    assert set(result["cells"]) == {f"batch {b} {m}" for b in (1, 2) for m in ("target", "csd")}
    for cell in result["cells"].values():
        assert len(cell["before_samples"]) == len(cell["after_samples"]) == 3
        assert (
            cell["before_s"] == sorted(cell["before_samples"])[1]
            and cell["after_s"] == sorted(cell["after_samples"])[1]
        )
        assert math.isfinite(cell["speedup"]) and cell["speedup"] > 0
        assert cell["repeatable"]
        if commit == "HEAD":
            assert cell["max_token_diff"] == 0.0 and cell["same_decisions"]


def _linear(seed: int) -> torch.nn.Linear:
    layer, gen = torch.nn.Linear(4, 3), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return layer


def test_the_weights_digest_tells_equal_weights_from_different_ones():
    a, b, c = _linear(0), _linear(0), _linear(1)
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)
    with torch.no_grad():
        b.bias[0] = torch.nextafter(b.bias[0], torch.tensor(math.inf))  # one float's last bit
    assert weights_digest(a) != weights_digest(b)
    assert weights_digest(_linear(0).to(torch.float64)) != weights_digest(a)  # the dtype counts too


class _FakeWorker:
    """Answers a worker's requests from a list of seconds, logging the order it was asked in."""

    def __init__(self, name: str, seconds: list[float], tokens: np.ndarray, asked: list[str]):
        self.name, self.seconds, self.tokens, self.asked = name, list(seconds), tokens, asked

    def ask(self, request: dict) -> dict:
        self.asked.append(f"{self.name} {request['op']}")
        if request["op"] == "warm":
            return {"warm": True}
        answer = {"seconds": self.seconds.pop(0), "digest": "same"}
        if request["tokens"]:
            answer["tokens_f32"] = base64.b64encode(self.tokens.astype(np.float32).tobytes()).decode()
            answer["maker"] = base64.b64encode(np.array([0, 1, 1], dtype=np.int8).tobytes()).decode()
        return answer


def test_the_paired_timing_alternates_the_trees_and_takes_the_median_of_the_paired_ratios():
    asked: list[str] = []
    workers = {
        "before": _FakeWorker("before", [2.0, 9.0, 3.0], np.array([1.0, 2.0, 3.0]), asked),
        "after": _FakeWorker("after", [1.0, 1.0, 2.0], np.array([1.0, 2.5, 3.0]), asked),
    }
    rows = paired(workers, [{"batch": 1, "mode": "csd"}], repeats=3, log=lambda s: None)
    assert asked == ["before warm", "after warm"] + ["before time", "after time", "after time", "before time"] + [
        "before time",
        "after time",
    ]
    row = rows["batch 1 csd"]
    assert (row["before_s"], row["after_s"]) == (3.0, 1.0)
    assert row["speedup"] == 2.0  # the median of 2 / 1, 9 / 1 and 3 / 2: not 3 / 1, the ratio of the medians
    assert row["max_token_diff"] == 0.5 and row["same_decisions"] and row["repeatable"]
    late = paired(workers, [{"batch": 8, "mode": "target"}], 3, deadline=time.perf_counter() - 1, log=None)
    assert late == {"batch 8 target": {"skipped": "the step's time budget (--paired-budget-s) was spent"}}


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


def test_an_exported_tree_is_named_by_its_tree_commit_file_else_by_git(tmp_path):
    from scripts.gpu_check import tree_commit

    assert tree_commit(tmp_path, lambda tree: "from git") == "from git"
    (tmp_path / "TREE_COMMIT").write_text("e1b9e0a\n")
    assert tree_commit(tmp_path, lambda tree: "from git") == "e1b9e0a"
