"""The prepared device check: what a GPU machine must show, in one command, within 8 minutes.

    python -m scripts.gpu_check --out DIR            # on one GPU: official sizes, random weights
    python -m scripts.gpu_check --out DIR --tiny     # the same steps on any machine, tiny models (a CPU: ~2 min)

1. ``pytest -m cuda tests/decoders/test_cuda.py`` (skipped where there is no CUDA);
2. MAR-B and MAR-L with random weights written in the official layout (scripts/random_official.py) and served
   as a Space serves them (the app's GPU calls; the pair timed as the server starts);
3. ``/generate`` at batch 1 and 8 through gradio_client;
4. target-only and CSD tokens of the same requests finite, and their statistics alike (CSD's tokens come from
   the target's distribution: mean within a quarter of a standard deviation, standard deviations within 2x);
5. one paper-scale cell timed (``python -m csd.experiments.paper_scale``, MAR-L / MAR-B, batch 8, gamma 8);
6. with ``--before TREE`` (a git worktree of an older tree; else recorded as skipped), MAR-L / MAR-B whole
   images at paper scale (64 AR steps, bfloat16, random weights both trees build alike) at batch 1, 8 and 64,
   target-only and CSD (gamma 8), in this tree and in TREE, each in its own worker
   (scripts/paper_scale_probe.py), alternating every repeat: each tree's median seconds per batch, the
   speed-up (median of the paired ratios) and whether the tokens are the same;
7. host synchronisations per AR step inside the loop, at the default settings (the resampler "auto": one pass on
   CUDA): target-only, CSD and the exact block (gamma 4) on each family's untrained pair (MAR, xAR, Harmon)
   under ``torch.cuda.set_sync_debug_mode("warn")``, counted up to two numbers of AR steps and differenced
   (:func:`csd.core.host_reads.reads_per_step`: set-up and teardown cancel), by the line that synchronised;
   the exact block's one read per block (where the next block starts) is its by design;
8. the exact block at gamma 4 and 8, its views as rows of one target pass and a pass each, against target-only
   and CSD at gamma 1, MAR-L / MAR-B with random weights (``--tiny``: the tiny stand-ins) at batch 8, 16 AR
   steps, 25 head steps, bfloat16 backbones on CUDA: seconds per image (median of 3 after a warm-up), target
   passes and steps kept per block;
9. the head chain eager, compiled and compiled with CUDA graphs (``DiffusionHead.use_kernels``,
   csd/models/kernels.py), a MAR-L-size head (random weights, 100 steps, guided) at batch 1 and 256 (4 tokens
   per AR step): milliseconds per chain (on a CPU eager and compiled only);
10. the head roofline: the head chain of MAR-B, MAR-L and MAR-H's head sizes (``MAR_CONFIGS``, random weights,
   100 steps, guided, 4, 32, 256 and 1024 tokens per chain) run as in 8, against the device's memory bound: the
   bandwidth of a 1 GiB ``copy_`` and the bytes the chain must move at least (each transition's weights, in
   its products' dtype, and its AdaLN modulations); per run milliseconds, the bound's milliseconds, their
   ratio and GFLOP/s;
11. ``DIR/gpu_check.json``, ``DIR/gpu_check.md`` and ``DIR/screenshot.png`` (the page in Chromium where
    Playwright and Chromium are installed, else the images ``/generate`` returned, side by side).

A step that fails is recorded and the next one still runs; the exit code is 1 if any failed. gradio,
gradio_client and spaces must be installed (on a machine without a registry, carry them as wheels that
``python -m scripts.device_wheels`` prepares: docs/space.md). Commit the result under bench/results/gpu/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 8)


def _step(record: dict, name: str, fn, show=lambda out: out) -> object:
    """Run one step, recording its seconds and outcome in ``record``: ``show(out)`` of what it returned, or the
    error's last lines. A step outside ``record["only"]`` (where set) is left out."""
    if record.get("only") and name not in record["only"]:
        return None
    t0 = time.perf_counter()
    entry = record["steps"].setdefault(name, {})
    try:
        out = fn()
        entry |= {"ok": True, "result": show(out)}
        return out
    except Exception as err:  # recorded; the check goes on
        entry |= {"ok": False, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-2000:]}
        return None
    finally:
        entry["seconds"] = round(time.perf_counter() - t0, 1)


def cuda_tests(out: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/decoders/test_cuda.py"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    (out / "cuda_tests.log").write_text(run.stdout[-20000:] + run.stderr[-5000:])
    summary = (run.stdout.strip().splitlines() or [""])[-1]
    if run.returncode not in (0, 5):
        raise RuntimeError(f"pytest -m cuda failed: {summary}")
    return {"summary": summary}


def serve_official(stack: ExitStack, tiny: bool, device: torch.device):
    """MAR-B and MAR-L in the official layout (random weights), served by the app on ``device``."""
    from csd.serving.pairs import PairStore, discover
    from demo import server
    from demo.application import App
    from demo.limits import Limits
    from scripts.random_official import TINY, tiny_configs, write_official

    if tiny:
        stack.enter_context(tiny_configs())
    from csd.models.mar.network import MAR_CONFIGS

    checkpoints = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="official-"))) / "checkpoints"
    names = ("mar_base", "mar_large")
    write_official(checkpoints, {n: (TINY if tiny else MAR_CONFIGS)[n] for n in names})
    sources = discover(checkpoints, embedded_dir=checkpoints / "none")
    limits = Limits(max_batch=8, max_seconds=600.0, gpu_seconds=300.0)
    application = App(PairStore(sources, device), limits)
    t0 = time.perf_counter()
    application.idle_work()
    demo = server.build(application)
    url = server.serve(demo, limits, "127.0.0.1", None, block=False)
    stack.callback(demo.close)
    return application, url, {"pairs": application.store.names, "timed_s": round(time.perf_counter() - t0, 1)}


def generate_api(application, url: str) -> dict:
    from gradio_client import Client

    # ssl_verify off: the server is local http; on, gradio_client loads the CA bundle for every request and file.
    client, result = Client(url, verbose=False, ssl_verify=False), {}
    for batch in BATCHES:
        values = {**application.default_controls(), "batch_size": batch}
        t0 = time.perf_counter()
        images = client.predict(**values, api_name="/generate")
        summary = next(o for o in images if isinstance(o, dict) and "speedup" in o)
        result[f"batch {batch}"] = {
            "wall_s": round(time.perf_counter() - t0, 2),
            "speedup": summary["speedup"],
            "seconds": summary["seconds"],
            "estimate_s": round(application.estimate(application.request(None, True, **values), _kinds()), 2),
        }
        if batch == BATCHES[-1]:
            result["images"] = [str(p) for p in images[:3] if isinstance(p, str)]
    return result


def _kinds() -> dict:
    from demo.tabs.generate import RUN_KINDS

    return RUN_KINDS


def token_statistics(application) -> dict:
    """Target-only and CSD tokens of the /generate requests (the same GPU task, in-process): finite, alike."""
    from demo.tabs.generate import compare

    stats = {}
    for batch in BATCHES:
        values = {**application.default_controls(), "batch_size": batch}
        *_, c = compare(application, lambda *a, **k: None, **values)
        t, s = c.target.generation.tokens.double(), c.csd.generation.tokens.double()
        row = {"finite": bool(torch.isfinite(t).all() and torch.isfinite(s).all())}
        row |= {"target_mean": float(t.mean()), "target_std": float(t.std()), "csd_mean": float(s.mean())}
        row |= {"csd_std": float(s.std()), "acceptance": c.summary.get("acceptance_rate")}
        row["alike"] = abs(row["csd_mean"] - row["target_mean"]) <= 0.25 * row["target_std"] and (
            0.5 <= row["csd_std"] / row["target_std"] <= 2.0
        )
        stats[f"batch {batch}"] = row
        if not (row["finite"] and row["alike"]):
            raise AssertionError(f"batch {batch}: tokens not finite or not alike: {row}")
    return stats


def paper_scale_cell(out: Path, tiny: bool, device: torch.device) -> dict:
    cmd = [sys.executable, "-m", "csd.experiments.paper_scale", "--families", "mar", "--pairs", "L/B"]
    cmd += ["--batches", "8", "--gammas", "8", "--repeats", "2", "--warmup", "1", "--out", str(out / "paper_scale")]
    cmd += ["--device", device.type] + (["--tiny"] if tiny else [])
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"paper_scale failed: {run.stderr[-1500:]}")
    stem = "paper_scale_tiny" if tiny else "paper_scale"
    result = json.loads((out / "paper_scale" / f"{stem}.json").read_text())
    return {"file": f"paper_scale/{stem}.json", "pairs": result.get("pairs", [])}


def tree_commit(tree: Path, commit_of) -> str:
    """The commit a tree holds: its TREE_COMMIT file where it is an export without git (``git archive``, as a
    device call carries it), else git's (``commit_of``)."""
    named = tree / "TREE_COMMIT"
    return named.read_text().strip() if named.is_file() else commit_of(tree)


def paper_scale_paired(
    out: Path, tiny: bool, device: torch.device, before: Path | None, repeats: int = 3, budget_s: float | None = None
) -> dict:
    """MAR-L / MAR-B whole images (the published sampler: 64 AR steps; ``--tiny``: the tiny configs, 8 steps)
    at batch 1, 8 and 64 (``--tiny``: 1 and 2), target-only and CSD (gamma 8; ``--tiny``: 2), bfloat16
    backbones on CUDA (float32 on a CPU), timed in this tree and in ``before`` (a git worktree of an older
    tree), each in its own worker (scripts/paper_scale_probe.py) alive across the repeats: one untimed run
    per tree, then ``repeats`` timed, the trees alternating every repeat (the order flipping). Per cell each
    tree's median seconds per batch, the speed-up (median of the paired before / after ratios) and whether the
    tokens are the same. Both trees build the same seeded random weights (checked by their digest). A cell
    not started within ``budget_s`` is named as skipped; without ``before`` the step is skipped."""
    from csd.experiments.roofline import _commit
    from scripts.paper_scale_probe import Worker, paired

    if before is None:
        return {"skipped": "no --before TREE (a git worktree of the older tree to compare with)"}
    if repeats < 1:
        raise ValueError(f"--paired-repeats must be >= 1, got {repeats}")
    trees = {"before": before.resolve(), "after": ROOT}
    args = ["--gamma", "2" if tiny else "8", "--device", device.type] + (["--tiny"] if tiny else [])
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    workers: dict = {}
    try:
        for name, tree in trees.items():
            workers[name] = Worker(tree, args, out / f"paper_scale_paired_{name}.log")
        hello = {name: w.read() for name, w in workers.items()}
        digests = {name: h["weights_digest"] for name, h in hello.items()}
        if len(set(digests.values())) != 1:
            raise RuntimeError(f"the trees built different weights: {digests}")
        cases = [{"batch": b, "mode": m} for b in ((1, 2) if tiny else (1, 8, 64)) for m in ("target", "csd")]
        log = lambda s: print(s, file=sys.stderr, flush=True)
        cells = paired(workers, cases, repeats, warmup=1, deadline=deadline, log=log)
    finally:
        for w in workers.values():
            w.close()
    keep = ("pair", "weights", "weights_digest", "num_steps", "head_steps", "precision", "gamma", "device")
    result = {"trees": {name: tree_commit(tree, _commit) for name, tree in trees.items()}, "repeats": repeats}
    return result | {k: hello["after"][k] for k in keep} | {"cells": cells}


def screenshot(url: str, images: list[str], path: Path) -> dict:
    """The page in headless Chromium where Playwright and Chromium are installed; else the images."""
    chromium = "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright

        if not os.path.isfile(chromium):
            raise ImportError(f"no Chromium at {chromium}")
    except ImportError as err:
        from PIL import Image

        tiles = [np.asarray(Image.open(p).convert("RGB")) for p in images]
        height = max(t.shape[0] for t in tiles)
        row = np.concatenate(
            [np.pad(t, ((0, height - t.shape[0]), (0, 8), (0, 0)), constant_values=255) for t in tiles], 1
        )
        Image.fromarray(row).save(path)
        return {"kind": "images /generate returned (target, CSD, token map)", "why": str(err)}
    from tests.demo.browser import CHROMIUM_ARGS

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.get_by_role("button", name="Generate", exact=True).click()
        page.wait_for_function("() => (document.querySelector('#gen-status')?.innerText || '').includes('Speedup')")
        page.screenshot(path=str(path), full_page=True)
        browser.close()
    return {"kind": "the page in Chromium after Generate"}


SYNC_FAMILIES = ("mar", "xar", "harmon", "nextstep")  # every registered family (tests/repository/test_gpu_check.py)


def sync_counts(device: torch.device, tiny: bool) -> dict:
    """Host synchronisations per AR step inside the loop, per family (untrained pairs, batch 2, the default
    settings): target-only, CSD and the exact block at gamma 4 (:func:`_family_syncs`). On a CPU nothing
    synchronises: every count is 0."""
    from csd.serving.pairs import random_pair

    result = {}
    for family in SYNC_FAMILIES:
        try:
            result |= _family_syncs(device, family, random_pair(device, family=family))
        except Exception as err:  # recorded per family: one family's failure keeps the others' counts
            result[family] = {"error": f"{type(err).__name__}: {err}"}
    return result


@contextmanager
def cuda_syncs(device: torch.device) -> Iterator[Counter]:
    """The synchronisations of what runs inside (``torch.cuda.set_sync_debug_mode("warn")`` on CUDA; none
    elsewhere), by the file and line that made each."""
    counts: Counter = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            counts.update(str(w.filename).split("/csd/")[-1] + f":{w.lineno}" for w in syncs)


def _family_syncs(device: torch.device, family: str, pair) -> dict:
    """One family's target-only, CSD and exact-block runs at the default settings (guidance 3, gamma 4), counted
    up to half and all of the AR steps (:func:`csd.core.host_reads.reads_per_step`): per AR step and by line."""
    from csd.config import CSDConfig, SamplingConfig
    from csd.core.host_reads import reads_per_step
    from csd.dispatch import Method

    result = {}
    steps = pair.traits.fixed_num_steps or 8
    sampling = SamplingConfig(num_steps=steps, cfg_scale=3.0, cfg_schedule=pair.traits.cfg_schedule or "linear")
    conditions = list(pair.prompts[:1] or [1]) * 2
    methods = {"target": Method.target(), "csd": Method.speculative(CSDConfig(gamma=4))}
    methods["exact block"] = Method.speculative(CSDConfig.from_knobs(gamma=4, block="exact"))
    for mode, method in methods.items():
        run = lambda cb, m=method: m.run(pair.target, pair.draft, conditions, [0, 1], sampling, on_step=cb)
        per_step, where = reads_per_step(run, steps // 2, steps, lambda: cuda_syncs(device))
        resampler = method.csd and method.csd.on_device(device).knob_values()["resampler"]
        result[f"{family} {mode}"] = {
            "ar_steps": steps,
            "resampler": resampler,
            "per_step": round(per_step, 2),
            "where": dict(where.most_common(12)),
        }
    return result


def exact_block(device: torch.device, tiny: bool) -> dict:
    """The exact block's cost, its views as rows of one target pass and a pass each (``views="per_view"``),
    against target-only and CSD at gamma 1: MAR-L / MAR-B with seeded random weights
    (the paper-scale pair; ``--tiny``: its tiny stand-ins), batch 8, 16 AR steps, 25 head steps, bfloat16
    backbones on CUDA (float32 elsewhere), the paper-scale conditions and seeds. Per setting: seconds per image
    (median of 3 timed runs after a warm-up, the settings taking turns), target passes per batch and the AR
    steps kept per block. Random weights accept nothing, so the exact block keeps one step per block here:
    what the row prices is its drafted and verified work, not a trained pair's speed."""
    from csd.dispatch import Method
    from csd.experiments.paper_scale.build import conditions_for, load_pair
    from csd.experiments.paper_scale.plan import GridConfig, plan_cells

    precision = "bfloat16" if device.type == "cuda" else "float32"
    grid = GridConfig(families=("mar",), pairs=("L/B",), batches=(8,), gammas=(1,), seed=0, tiny=tiny)
    cell = plan_cells(grid, precision)[0]
    sampling = cell.sampling.with_knobs(num_steps=16, head_steps=25)
    loaded = load_pair(cell.pair, torch.device("cpu"), grid.seed, tiny, None)
    target, draft = loaded.target.to(device), loaded.draft.to(device)
    conditions, seeds = conditions_for(target, 8, grid.seed, prompt_tokens=0)  # class labels: no prompt
    methods = {"target-only": Method.target(), "CSD, gamma 1": Method.speculative(grid.csd(1))}
    for gamma in (4, 8):
        exact = grid.csd(gamma).with_knobs(block="exact")
        methods[f"exact, gamma {gamma}"] = Method.speculative(exact)
        methods[f"exact, gamma {gamma}, a pass per view"] = Method.speculative(exact.with_knobs(views="per_view"))
    runs = {name: lambda m=m: m.run(target, draft, conditions, seeds, sampling) for name, m in methods.items()}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    traces = {name: run().trace for name, run in runs.items()}  # warm-up
    for rep in range(3):
        for name, run in list(runs.items())[:: 1 if rep % 2 == 0 else -1]:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[name].append(time.perf_counter() - t0)
    result = {"pair": cell.pair.paper_name, "batch": 8, "num_steps": 16, "head_steps": 25, "precision": precision}
    for name, t in traces.items():
        kept = [k for k, _ in t.block_steps]
        result[name] = {
            "s_per_image": float(np.median(seconds[name])) / 8,
            "target_passes": t.target_passes,
            "steps_kept_per_block": float(np.mean(kept)) if kept else None,
        }
    base = result["target-only"]["s_per_image"]
    for name in runs:
        result[name]["vs_target_only"] = round(result[name]["s_per_image"] / base, 3)
    return result


def head_chain(device: torch.device, tiny: bool) -> dict:
    """A MAR-L-size diffusion head (random weights, 100 steps, guided) at batch 1 and 256 (4 tokens per AR step)
    run eager (the fused sampler op by op, float32), compiled (torch.compile of each step; bfloat16 products
    on CUDA, as a bfloat16 run's head) and, on CUDA, compiled with each chain one CUDA graph: milliseconds per
    chain (median of 10 after 3 warm-ups) and the largest difference of each row's tokens from eager's, relative
    to the largest eager token (an untrained, unclipped head's tokens reach ~1e4)."""
    from csd.core.chain import HeadCondition, standard_noise

    width, depth, z_dim, steps = (64, 2, 32, 10) if tiny else (1280, 8, 1024, 100)
    gen = torch.Generator(device).manual_seed(0)
    head = _random_head(16, z_dim, width, depth, steps, gen, device)
    runs = _head_runs(device)
    result = {}
    for batch in (1, 256):
        n = 4 * batch
        z, zu = (torch.randn(n, z_dim, generator=gen, device=device) for _ in range(2))
        cond = HeadCondition(z, zu, torch.full((n,), 3.0, device=device))
        noise = standard_noise(n, 16, steps, gen, device, torch.float32)
        row = {"rows": 2 * n}
        for name, (kernels, autocast) in runs.items():
            head.use_kernels(kernels)
            ms, out = _time_chain(head.chain(steps, autocast=autocast), cond, noise, device)
            row[f"{name} ms"] = round(ms, 3)
            if name == "eager":
                eager = out
            else:
                row[f"{name} token diff"] = float((out - eager).abs().max() / eager.abs().max())
        head.use_kernels(None)
        result[f"batch {batch}"] = row
    return result


def _random_head(token_dim: int, z_dim: int, width: int, depth: int, steps: int, gen, device: torch.device):
    """A diffusion head of the given size, every parameter 0.02 N(0, 1) from ``gen`` (an untrained head's
    modulations and output layers start at zero: random ones make every layer do work)."""
    from csd.models.head import DiffusionHead

    head = DiffusionHead(token_dim, z_dim, width, depth, sampling_steps=steps).to(device).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.02 * torch.randn(p.shape, generator=gen, device=device))
    return head


def _head_runs(device: torch.device) -> dict:
    """How the head steps run a chain: name -> (kernels, autocast dtype). Eager in float32; compiled with
    bfloat16 products on CUDA (a bfloat16 run's head), float32 elsewhere; on CUDA also compiled + graphs."""
    from csd.models.kernels import EAGER, HeadKernels

    cuda = device.type == "cuda"
    products = torch.bfloat16 if cuda else None
    runs = {"eager": (EAGER, None), "compiled": (HeadKernels(graphs=False), products)}
    if cuda:
        runs["compiled + graphs"] = (HeadKernels(), products)
    return runs


def copy_bandwidth(device: torch.device, tiny: bool) -> dict:
    """The device's achievable memory bandwidth: ``dst.copy_(src)`` of a float32 tensor (1 GiB on CUDA, 256
    MiB on a CPU, 64 MiB with ``--tiny``), the bytes read and written over the median of 10 copies after 3."""
    size = 64 << 20 if tiny else (1 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)
    samples = []
    for rep in range(13):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= 3:
            samples.append(time.perf_counter() - t0)
    seconds = float(np.median(samples))
    return {"bytes": 2 * size, "ms": seconds * 1e3, "GB/s": 2 * size / seconds / 1e9}


def chain_traffic(config, tokens: int, product_bytes: int, state_bytes: int = 4) -> dict:
    """The bytes one guided chain of ``tokens`` tokens (2 x tokens rows: conditional and unconditional) of a
    MAR config's head must move at least, and the products' FLOPs, counted for the fused sampler
    (csd/models/head.py, ``FusedSampler``) over its ``num_sampling_steps`` transitions.

    Per transition, the weights its products read, each once: the input projection, each block's two MLP
    layers and the output layer's eps half in the products' dtype (``product_bytes``), the variance layer in
    the states' (``state_bytes``); and the AdaLN modulations the fewer of two ways: their weights in the
    products' dtype (made per transition) or the modulations themselves in the states' dtype (made once per
    chain, 2 x tokens x width x (3 x depth + 2) read per transition: the fewer at the official sizes up to 256
    tokens). Not counted: the time and condition embeddings (made once per chain or kept across chains), the
    network's other activations (a fused transition keeps them on chip), states, noise and outputs (tokens x
    16 each). Each byte is counted once per transition from memory: a cache that keeps a head's weights
    between transitions lets a run go under the bound (a ratio below 1).

    FLOPs: 2 x rows x weights of each product (biases not counted): the input projection and the variance
    layer on the state's ``tokens`` rows, the blocks, the eps output and the modulations on all 2 x tokens."""
    d, w, depth, steps = config.token_dim, config.diffloss_w, config.diffloss_d, config.num_sampling_steps
    rows = 2 * tokens
    network = (d * w + w + depth * 2 * (w * w + w) + w * d + d) * product_bytes + (w * d + d) * state_bytes
    modulation_weights = (depth * 3 * (w * w + w) + 2 * (w * w + w)) * product_bytes
    modulations = min(modulation_weights, rows * w * (3 * depth + 2) * state_bytes)
    flops = 2 * (tokens * 2 * d * w + rows * (depth * 2 * w * w + w * d) + rows * (depth * 3 + 2) * w * w)
    return {"bytes": steps * (network + modulations), "flops": steps * flops}


HEAD_SIZES = {"MAR-B": "mar_base", "MAR-L": "mar_large", "MAR-H": "mar_huge"}


def head_roofline(device: torch.device, tiny: bool) -> dict:
    """The head chain of MAR-B, MAR-L and MAR-H's sizes (``MAR_CONFIGS``: head width and depth, 16-dim tokens,
    z of the decoder's width, 100 steps; with ``--tiny`` scripts/random_official.py's tiny stand-ins, 10
    steps) against the device's memory bound: random weights, guided, 4, 32, 256 and 1024 tokens per chain
    (batch 1, 8, 64 and 256 at MAR's 4 tokens per AR step; 4 and 32 with ``--tiny``), run as the head chain
    step runs it (eager, compiled, on CUDA compiled + graphs). Per run: milliseconds per chain (median of 10
    after 3 warm-ups), the bytes it must move at least (:func:`chain_traffic`, in the run's products' dtype),
    the bound = bytes / the copy bandwidth (:func:`copy_bandwidth`), ratio = ms / bound ms, and GFLOP/s."""
    from csd.core.chain import HeadCondition, standard_noise
    from csd.models.kernels import product_dtype
    from csd.models.mar.network import MAR_CONFIGS
    from scripts.random_official import TINY

    bandwidth = copy_bandwidth(device, tiny)
    result = {"bandwidth GB/s": bandwidth["GB/s"], "copy": bandwidth}
    gen = torch.Generator(device).manual_seed(0)
    runs = _head_runs(device)
    for size, name in HEAD_SIZES.items():
        c = (TINY if tiny else MAR_CONFIGS)[name]
        steps, z_dim = c.num_sampling_steps, c.decoder_embed_dim
        head = _random_head(c.token_dim, z_dim, c.diffloss_w, c.diffloss_d, steps, gen, device)
        entry = {"width": c.diffloss_w, "depth": c.diffloss_d, "z dim": z_dim, "steps": steps}
        for tokens in (4, 32) if tiny else (4, 32, 256, 1024):  # batch 1, 8, 64, 256 at 4 tokens per AR step
            z, zu = (torch.randn(tokens, z_dim, generator=gen, device=device) for _ in range(2))
            cond = HeadCondition(z, zu, torch.full((tokens,), 3.0, device=device))
            noise = standard_noise(tokens, c.token_dim, steps, gen, device, torch.float32)
            row = {"rows": 2 * tokens}
            for mode, (kernels, autocast) in runs.items():
                head.use_kernels(kernels)
                ms, _ = _time_chain(head.chain(steps, autocast=autocast), cond, noise, device)
                products = product_dtype(autocast, kernels) or torch.float32  # the head's weights: float32
                traffic = chain_traffic(c, tokens, products.itemsize)
                bound_ms = traffic["bytes"] / (bandwidth["GB/s"] * 1e9) * 1e3
                row[mode] = {"ms": ms, "bound ms": bound_ms, "ratio": ms / bound_ms} | traffic
                row[mode]["GFLOP/s"] = traffic["flops"] / (ms * 1e-3) / 1e9
            head.use_kernels(None)
            entry[f"tokens {tokens}"] = row
        result[size] = entry
    return result


def _time_chain(chain, cond, noise, device: torch.device) -> tuple[float, torch.Tensor]:
    """Milliseconds per chain (median of 10 after 3 warm-ups, the first of which compiles and captures) and the
    last run's tokens."""
    from csd.core.chain import HeadCondition

    samples = []
    with torch.inference_mode():
        for rep in range(13):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = chain.sample(HeadCondition(cond.z, cond.z_uncond, cond.cfg), noise)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rep >= 3:
                samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) * 1e3, out.x


def machine(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}
    return info


def markdown(record: dict) -> str:
    lines = [f"# Device check ({record['machine'].get('gpu', record['machine']['device'])})", ""]
    lines += [
        f"torch {record['machine']['torch']}, {'tiny models' if record['tiny'] else 'official sizes'}, "
        f"{record['total_s']:.0f} s in all.",
        "",
        "| step | ok | seconds | result |",
        "| --- | --- | --- | --- |",
    ]
    for name, step in record["steps"].items():
        result = step.get("error") or json.dumps(step.get("result", ""), default=str)[:160]
        lines.append(f"| {name} | {'yes' if step['ok'] else '**no**'} | {step['seconds']} | {result} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json, gpu_check.md, screenshot.png")
    p.add_argument("--tiny", action="store_true", help="tiny models: the same steps on any machine")
    p.add_argument("--device", default="auto", help="auto (CUDA where there is one), cpu or cuda")
    p.add_argument("--skip-tests", action="store_true", help="skip step 1 (pytest -m cuda)")
    p.add_argument("--skip-serve", action="store_true", help="skip steps 2-4 and the screenshot (the served app)")
    p.add_argument("--only", nargs="+", default=None, help="run only these steps (their names in the summary)")
    p.add_argument("--before", type=Path, default=None, help="an older tree (git worktree) for paper scale paired")
    p.add_argument("--paired-repeats", type=int, default=3, help="timed repeats per tree of paper scale paired")
    p.add_argument("--paired-budget-s", type=float, default=None, help="paper scale paired starts no cell after this")
    args = p.parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from csd.cli import resolve_device

    device = resolve_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"tiny": args.tiny, "machine": machine(device), "steps": {}, "only": args.only}
    t0 = time.perf_counter()
    if not args.skip_tests:
        _step(record, "cuda tests", lambda: cuda_tests(args.out))
    _step(record, "host syncs", lambda: sync_counts(device, args.tiny))
    _step(record, "exact block", lambda: exact_block(device, args.tiny))
    _step(record, "head chain", lambda: head_chain(device, args.tiny))
    _step(record, "head roofline", lambda: head_roofline(device, args.tiny))
    with ExitStack() as stack:
        serve = lambda: serve_official(stack, args.tiny, device)
        served = None if args.skip_serve else _step(record, "serve", serve, lambda out: out[2])
        if served is not None:
            application, url, _ = served
            api = _step(record, "generate api", lambda: generate_api(application, url)) or {}
            _step(record, "token statistics", lambda: token_statistics(application))
            shot = args.out / "screenshot.png"
            _step(record, "screenshot", lambda: screenshot(url, api.get("images", []), shot))
    _step(record, "paper scale cell", lambda: paper_scale_cell(args.out, args.tiny, device))
    paired = lambda: paper_scale_paired(
        args.out, args.tiny, device, args.before, args.paired_repeats, args.paired_budget_s
    )
    _step(record, "paper scale paired", paired)
    record["total_s"] = round(time.perf_counter() - t0, 1)
    steps = record["steps"]
    (args.out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    (args.out / "gpu_check.md").write_text(markdown(record))
    print(markdown(record))
    return 0 if all(s["ok"] for s in steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
