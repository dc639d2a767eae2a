"""Paper scale: CSD against target-only decoding at the official model sizes, timed side by side in one process.

    python -m csd.experiments.paper_scale [--families mar xar harmon] [--pairs H/B L/B] [--batches 1 8 64 256]
        [--gammas 8 16 32] [--checkpoints DIR] [--device auto|cpu|cuda] [--out bench/results/gpu]
    python -m csd.experiments.paper_scale --dry-run --estimate-device h200 --budget-s 600   # plan + estimate only
    python -m csd.experiments.paper_scale --tiny                                          # the same path, tiny

The setting of Table 1 of Continuous Speculative Decoding (Wang et al., arXiv 2411.11925): a large target and
a small draft of one family (MAR-H / MAR-B and MAR-L / MAR-B, and the same pairs of xAR; Harmon-1.5B /
Harmon-0.5B), batch 1 to 256, draft length gamma 8 / 16 / 32. Without ``--checkpoints`` the models have seeded
random weights at the official sizes: the timings are real (a pass costs what it costs whatever the weights),
acceptance and image quality mean nothing, and every output says so.

The published settings used here, and where they come from:

* MAR (LTH14/mar README, "Evaluation"): MAR-B / L / H have 208M / 479M / 943M parameters and are evaluated
  with 100 diffusion-head steps (``--num_sampling_steps 100``), temperature 1.0 and a linear CFG schedule at
  cfg 2.9 / 3.0 / 3.2. The CSD code (MarkXCloud/CSpD ``main_mar.py``) defaults to 64 AR steps
  (``--num_iter 64``); its demo pairs a MAR-H target with a MAR-B draft, pre-fills 5%
  (``SpecDecodeRunner(..., ratio=0.05)``) and samples under CUDA autocast. A CSD pair runs with the target's
  CFG scale.
* xAR (OliverRensu/xAR README): xAR-B 40 flow steps at cfg 2.7, xAR-L 50 at 2.3, xAR-H 50 at 2.2
  (``--num_steps``, ``--cfg``); 172.6M / 608.4M / 1186.0M parameters (tests/test_xar.py). One AR step per cell
  (4 cells; ``--num_iter`` is unused, /work/shared/FAMILIES.md), CFG ramped over the cells (schedule "linear").
  The draft runs on the target's flow steps (the aligned test needs one time grid, as
  :func:`csd.experiments.pairs.load_official_xar_pair`), so at most 3 cells are drafted after the pre-filled
  one: a gamma above 3 is gamma 3, and the grid keeps each distinct draft length once.
* Harmon (wusize/Harmon ``scripts/text2image.py`` and ``configs/models``): 64 AR steps, cfg 3.0 constant,
  temperature 1.0, 512 px (1024 KL-16 tokens), Qwen2.5-1.5B + MAR-H generator (1.5B) and Qwen2.5-0.5B + MAR-B
  (0.5B), 100 head steps. With random weights the prompt tokenizer is a stand-in :class:`WordTokenizer` and
  every prompt has the official length: :data:`PROMPT_TOKENS` tokens, the template
  ``<|im_start|>user\\nGenerate an image: {prompt}<|im_end|>\\n<|im_start|>assistant\\n`` around the script's
  default prompt "a dog on the left and a cat on the right." (8 template + 16 prompt tokens, counted by hand
  for Qwen2.5's tokenizer), and a null prompt of :data:`NULL_PROMPT_TOKENS` ("Generate an image.").

Timing reuses :mod:`csd.experiments.timing` (interleaved repeats after a warm-up, medians, per-round ratio
spread, per-pass costs from the traces, phase shares) and :mod:`csd.cost` (the bound from the same run's
costs; xAR's charges a block's flow chain once, ``head_per_block``). Backbones run in bfloat16 on CUDA; the
library keeps heads and densities in float32, and ``--heads bfloat16`` autocasts the heads too, as the
published code samples (xAR's network ignores ``SamplingConfig.precision``, so its runs are autocast here).
``--dry-run`` prints the plan and a rough run-time estimate from FLOP counts, weight reads and kernel launches
(:meth:`Rates.seconds`) without building a model. See docs/paper_scale.md.

Quality is not scored here: FID needs tens of thousands of images and real weights
(:mod:`csd.experiments.fid`); with random weights it means nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from csd import CSDConfig, Maker, SamplingConfig, generate, speculative_generate
from csd.checks import check_choice, check_int, check_number, is_int
from csd.cost import csd_passes, prefill_steps, speedup_bound
from csd.experiments.timing import Samples, alternate, cost_breakdown, measured_costs, ratio_spread
from csd.family import FamilyTraits
from csd.models.harmon import Harmon, HarmonConfig, WordTokenizer, harmon_config
from csd.models.mar import MAR, MARConfig, mar_config
from csd.models.registry import FAMILIES as FAMILY_TABLE
from csd.models.xar import XAR, XARConfig, xar_config
from csd.schedule import step_sizes

FAMILIES = ("mar", "xar", "harmon")
PAIR_KEYS = ("H/B", "L/B")
HEAD_MODES = ("float32", "tf32", "bfloat16")
DEFAULT_OUT = "bench/results/gpu"
HARMON_PROMPT = "a dog on the left and a cat on the right."  # wusize/Harmon scripts/text2image.py's default
PROMPT_TOKENS, NULL_PROMPT_TOKENS = 24, 12  # it and the null prompt in the official template, in Qwen2.5 tokens
RERANDOM_STD = 0.02  # zero-initialised layers get N(0, 0.02^2): otherwise every random head outputs zeros
RANDOM_NOTE = (
    "RANDOM WEIGHTS (seeded, {sizes}): the timings are real; acceptance, resampling work and image quality are "
    "not those of trained models."
)
QUALITY_NOTE = (
    "Quality is not measured by this command: FID needs real weights and tens of thousands of images "
    "(csd.experiments.fid); with random weights it means nothing."
)
# Table 1 of the paper (MAR, ImageNet 256, gamma 32), as /work/shared/DESIGN.md section 8 records it.
PAPER_SPEEDUPS = {
    "MAR-H / MAR-B": "1.44x at batch 1, 2.17x at 128, 2.33x at 256 (gamma 32)",
    "MAR-L / MAR-B": "1.18x at batch 1 to 1.49x at 256 (gamma 32)",
}


# --- the pairs and the published settings --------------------------------------------------------------


@dataclass(frozen=True)
class PairSpec:
    family: str
    key: str  # "H/B" or "L/B": which of the paper's pairs
    name: str
    target: str  # config names
    draft: str


PAIRS = (
    PairSpec("mar", "H/B", "MAR-H / MAR-B", "mar_huge", "mar_base"),
    PairSpec("mar", "L/B", "MAR-L / MAR-B", "mar_large", "mar_base"),
    PairSpec("xar", "H/B", "xAR-H / xAR-B", "xar_huge", "xar_base"),
    PairSpec("xar", "L/B", "xAR-L / xAR-B", "xar_large", "xar_base"),
    # Harmon-1.5B's generator is MAR-H and Harmon-0.5B's MAR-B: the family's one pair, its H/B.
    PairSpec("harmon", "H/B", "Harmon-1.5B / Harmon-0.5B", "harmon_1.5b", "harmon_0.5b"),
)


@dataclass(frozen=True)
class PaperSetting:
    """A family's published sampler: AR steps (None: one per cell), head steps (None: the model's flow
    steps), CFG scale per target config, CFG schedule, temperature."""

    num_steps: int | None
    head_steps: int | None
    cfg: dict[str, float]
    cfg_schedule: str
    temperature: float = 1.0


SETTINGS = {
    "mar": PaperSetting(64, 100, {"mar_huge": 3.2, "mar_large": 3.0, "mar_base": 2.9}, "linear"),
    "xar": PaperSetting(None, None, {"xar_huge": 2.2, "xar_large": 2.3, "xar_base": 2.7}, "linear"),
    "harmon": PaperSetting(64, 100, {"harmon_1.5b": 3.0, "harmon_0.5b": 3.0}, "constant"),
}
# --tiny: the same code path on shrunken configs (widths by size, depth 1, a 4 x 4 token grid).
TINY_WIDTH = {"huge": 64, "large": 48, "base": 32}
TINY_STEPS = {"mar": (8, 4), "xar": (None, None), "harmon": (8, 4)}  # (AR steps, head steps); xAR: its config
TINY_FLOW_STEPS = {"huge": 4, "large": 4, "base": 3}  # B fewer, as the official 40 against 50
TINY_PROMPT_TOKENS, TINY_NULL_TOKENS = 6, 3
HARMON_SIZE = {"harmon_1.5b": "huge", "harmon_0.5b": "base"}


def _size(name: str) -> str:
    return HARMON_SIZE.get(name) or name.split("_")[1]


def sampling_for(pair: PairSpec, tiny: bool, precision: str) -> SamplingConfig:
    s = SETTINGS[pair.family]
    steps, head = TINY_STEPS[pair.family] if tiny else (s.num_steps, s.head_steps)
    if steps is None:  # xAR: one AR step per cell
        steps = xar_cfg(pair.target, tiny).cells
    return SamplingConfig(
        num_steps=steps,
        cfg_scale=s.cfg[pair.target],
        cfg_schedule=s.cfg_schedule,
        temperature=s.temperature,
        head_steps=head,
        precision=precision,
    )


# --- configs and models --------------------------------------------------------------------------------


def mar_cfg(name: str, tiny: bool) -> MARConfig:
    if not tiny:
        return mar_config(name)
    w = TINY_WIDTH[_size(name)]
    dims = dict(encoder_embed_dim=w, decoder_embed_dim=w, encoder_num_heads=2, decoder_num_heads=2)
    return mar_config(
        name, img_size=64, encoder_depth=1, decoder_depth=1, buffer_size=4, diffloss_d=1, diffloss_w=w, **dims
    )


def xar_cfg(name: str, tiny: bool, flow_steps: int | None = None) -> XARConfig:
    over = {} if flow_steps is None else {"flow_steps": flow_steps}
    if tiny:
        w = TINY_WIDTH[_size(name)]
        over = dict(grid=4, cells=4, embed_dim=w, encoder_depth=1, decoder_depth=1)
        over |= dict(encoder_num_heads=2, decoder_num_heads=2)
        over["flow_steps"] = flow_steps or TINY_FLOW_STEPS[_size(name)]
    return xar_config(name, **over)


def prompt_shape(tiny: bool) -> tuple[int, int]:
    return (TINY_PROMPT_TOKENS, TINY_NULL_TOKENS) if tiny else (PROMPT_TOKENS, NULL_PROMPT_TOKENS)


def word_tokenizer() -> WordTokenizer:
    return WordTokenizer([f"word{i}" for i in range(64)])


def harmon_cfg(name: str, tiny: bool) -> HarmonConfig:
    """Harmon's official config with a word-level prompt template (the stand-in tokenizer's null prompt has
    the official null prompt's length); --tiny shrinks the generator and the LLM."""
    tok, (_, null) = word_tokenizer(), prompt_shape(tiny)
    over = dict(template="{input}", prefix="{prompt}", null_prompt=" ".join(tok.words[: null - 1]))
    if tiny:
        w, llm = TINY_WIDTH[_size(name)], harmon_config(name).llm
        sizes = dict(hidden_size=w, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        llm = {**llm, **sizes, "intermediate_size": 2 * w, "vocab_size": 128}
        generator = {"huge": "mar_huge", "base": "mar_base"}[_size(name)]
        over |= dict(mar=mar_cfg(generator, True), llm=llm, grid_side=None)
    return harmon_config(name, **over)


def construct(family: str, name: str, tiny: bool, flow_steps: int | None = None) -> nn.Module:
    """An untrained model of the named config, built on the current default device (Harmon's LLM needs
    ``transformers``)."""
    if family == "mar":
        return MAR(mar_cfg(name, tiny))
    if family == "xar":
        return XAR(xar_cfg(name, tiny, flow_steps))
    return Harmon(harmon_cfg(name, tiny), word_tokenizer())


def parameter_count(family: str, name: str, tiny: bool = False) -> int:
    """Parameters of a config, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in construct(family, name, tiny).parameters())


def random_model(family: str, name: str, seed: int, tiny: bool, flow_steps: int | None = None) -> nn.Module:
    """Seeded random weights on the CPU (the same on every machine): layer init under a forked, seeded
    global generator, then zero-initialised tensors redrawn from a seeded Generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = construct(family, name, tiny, flow_steps)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, RERANDOM_STD, generator=gen)
    return model


def checkpoint_files(pair: PairSpec, checkpoints: Path) -> list[Path]:
    """The official files a pair needs, target's first (each family's layout, csd/models/<family>/official.py)."""
    files = FAMILY_TABLE[pair.family].official_files
    return [checkpoints / f for name in (pair.target, pair.draft) for f in files[name]]


def official_pair(pair: PairSpec, checkpoints: Path) -> tuple[nn.Module, nn.Module]:
    """Target and draft from the official files (a family may match its draft to the target: xAR's flow steps)."""
    load = FAMILY_TABLE[pair.family].load_official
    target = load(checkpoints, pair.target)
    return target, load(checkpoints, pair.draft, target)


@dataclass(frozen=True)
class LoadedPair:
    spec: PairSpec
    target: nn.Module
    draft: nn.Module
    weights: str  # "random (seed S)" or "official"


def load_pair(pair: PairSpec, device: torch.device, seed: int, tiny: bool, checkpoints: Path | None) -> LoadedPair:
    """Official checkpoints where all of a pair's files exist under ``checkpoints``, else seeded random weights
    (an xAR draft on its target's flow steps)."""
    if checkpoints is not None and all(f.is_file() for f in checkpoint_files(pair, checkpoints)):
        target, draft = official_pair(pair, checkpoints)
        weights = "official"
    else:
        target = random_model(pair.family, pair.target, seed, tiny)
        flow = target.config.flow_steps if pair.family == "xar" else None
        draft = random_model(pair.family, pair.draft, seed + 1, tiny, flow)
        weights = f"random (seed {seed})"
    frozen = lambda m: m.to(device).eval().requires_grad_(False)
    return LoadedPair(pair, frozen(target), frozen(draft), weights)


# --- the grid ------------------------------------------------------------------------------------------


def _check_values(name: str, values, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(values, tuple | list) or not values or not all(is_int(v) and lo <= v <= hi for v in values):
        raise ValueError(f"{name} must be one or more ints in [{lo}, {hi}], got {values!r}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class GridConfig:
    """What to time. ``batches`` / ``gammas`` None: the paper's grid (1, 8, 64, 256 / 8, 16, 32), or with
    ``tiny`` (1, 2 / 2, 4)."""

    families: tuple[str, ...] = FAMILIES
    pairs: tuple[str, ...] = PAIR_KEYS
    batches: tuple[int, ...] | None = None
    gammas: tuple[int, ...] | None = None
    repeats: int = 3
    warmup: int = 1
    prefill: float = 0.05
    seed: int = 0
    tiny: bool = False
    heads: str = "float32"  # head matmuls: the library's float32, TF32, or bf16 autocast (the published code's)

    def __post_init__(self) -> None:
        for name, values, choices in (("--families", self.families, FAMILIES), ("--pairs", self.pairs, PAIR_KEYS)):
            if not isinstance(values, tuple | list) or not values or any(v not in choices for v in values):
                raise ValueError(f"{name} must be one or more of {', '.join(choices)}, got {values!r}")
        if self.batches is not None:
            object.__setattr__(self, "batches", _check_values("--batches (batch sizes)", self.batches, 1, 4096))
        if self.gammas is not None:
            object.__setattr__(self, "gammas", _check_values("--gammas (draft lengths)", self.gammas, 1, 1024))
        check_int("--repeats", self.repeats, 1, 100)
        check_int("--warmup", self.warmup, 0, 10)
        check_number("--prefill (ratio)", self.prefill, 0.0, 1.0, hi_open=True)
        check_int("--seed", self.seed, 0, 2**31 - 1)
        check_choice("--heads", self.heads, HEAD_MODES)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.batches or ((1, 2) if self.tiny else (1, 8, 64, 256))

    @property
    def draft_lengths(self) -> tuple[int, ...]:
        return self.gammas or ((2, 4) if self.tiny else (8, 16, 32))

    def selected_pairs(self) -> list[PairSpec]:
        return [p for p in PAIRS if p.family in self.families and p.key in self.pairs]


@dataclass(frozen=True)
class Cell:
    """One timed unit: a pair at one batch size, every draft length interleaved."""

    pair: PairSpec
    batch: int
    gammas: tuple[int, ...]
    sampling: SamplingConfig
    num_tokens: int  # AR tokens of an image (xAR: cells)
    head_steps: int  # diffusion-head steps (xAR: flow steps)
    traits: FamilyTraits  # the target's (csd.family): what verifying a block costs, ...

    def prefill_steps(self, prefill: float) -> int:
        return prefill_steps(step_sizes(self.num_tokens, self.sampling.num_steps), prefill)


def model_config(family: str, name: str, tiny: bool):
    return {"mar": mar_cfg, "xar": xar_cfg, "harmon": harmon_cfg}[family](name, tiny)


def pair_layout(pair: PairSpec, tiny: bool, sampling: SamplingConfig) -> tuple[int, int]:
    """(AR tokens of an image, head steps) from the target's config alone."""
    if pair.family == "xar":
        c = xar_cfg(pair.target, tiny)
        return c.cells, c.flow_steps
    if pair.family == "harmon":
        c = harmon_cfg(pair.target, tiny)
        return c.side**2, sampling.head_steps
    return mar_cfg(pair.target, tiny).seq_len, sampling.head_steps


def plan_cells(grid: GridConfig, precision: str) -> list[Cell]:
    """Every cell of the grid. Draft lengths beyond the steps left after the pre-fill are that many
    (xAR: 3 cells), so each pair keeps each distinct effective gamma once."""
    cells = []
    for pair in grid.selected_pairs():
        sampling = sampling_for(pair, grid.tiny, precision)
        tokens, head = pair_layout(pair, grid.tiny, sampling)
        left = sampling.num_steps - prefill_steps(step_sizes(tokens, sampling.num_steps), grid.prefill)
        gammas = tuple(dict.fromkeys(min(g, max(left, 1)) for g in grid.draft_lengths))
        traits = FAMILY_TABLE[pair.family].traits(model_config(pair.family, pair.target, grid.tiny))
        cells += [Cell(pair, b, gammas, sampling, tokens, head, traits) for b in grid.batch_sizes]
    return cells


def conditions_for(model: nn.Module, family: str, batch: int, seed: int, prompt_tokens: int) -> tuple[list, list[int]]:
    """Deterministic conditions and seeds: class labels drawn from a seeded Generator (MAR, xAR), or prompts
    of ``prompt_tokens`` tokens (random Harmon: stand-in words; official Harmon: :data:`HARMON_PROMPT`)."""
    gen = torch.Generator().manual_seed(seed)
    seeds = list(range(seed, seed + batch))
    if family != "harmon":
        return torch.randint(model.config.class_num, (batch,), generator=gen).tolist(), seeds
    words = getattr(model.tokenizer, "words", None)
    if words is None:  # an official Harmon reads the official script's default prompt
        return [HARMON_PROMPT] * batch, seeds
    ids = torch.randint(len(words), (batch, prompt_tokens - 1), generator=gen)  # + the start token
    return [" ".join(words[i] for i in row) for row in ids.tolist()], seeds


# --- timing --------------------------------------------------------------------------------------------


def autocast_for(
    family: str, sampling: SamplingConfig, device: torch.device, heads: str
) -> contextlib.AbstractContextManager:
    """Autocast around a whole run where the library does not lower the precision itself: the library runs
    backbones (every family's) at SamplingConfig.precision and heads in float32; ``heads`` "bfloat16" puts
    the heads under bfloat16 too, as the published code samples. Densities stay float32 or float64:
    autocast only lowers matmul-like ops and never touches float64."""
    if heads == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def measured_run(
    fn: Callable[[], object],
    device: torch.device,
    peaks: dict[str, int],
    name: str,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> Callable[[], object]:
    """``fn`` with device synchronisation around it (so the wall time holds the GPU work) and, on CUDA, its
    peak allocated memory (reset first) kept in ``peaks[name]`` (the largest over the repeats)."""

    def run() -> object:
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with autocast():
            out = fn()
        if cuda:
            torch.cuda.synchronize(device)
            peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))
        return out

    return run


def process_peak_rss() -> int | None:
    """The process's peak resident memory in bytes (never reset; None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if platform.system() == "Darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def time_cell(loaded: LoadedPair, cell: Cell, grid: GridConfig, device: torch.device) -> list[dict]:
    """Target-only, draft-only and CSD at every gamma of a cell, interleaved: one row per gamma."""
    target, draft, sampling = loaded.target, loaded.draft, cell.sampling
    conditions, seeds = conditions_for(target, cell.pair.family, cell.batch, grid.seed, prompt_shape(grid.tiny)[0])
    csd = {g: CSDConfig(gamma=g, prefill=grid.prefill) for g in cell.gammas}
    fns: dict[str, Callable[[], object]] = {
        "target": partial(generate, target, conditions, seeds, sampling),
        "draft": partial(generate, draft, conditions, seeds, sampling, Maker.DRAFT),
        **{f"csd/{g}": partial(speculative_generate, target, draft, conditions, seeds, sampling, csd[g]) for g in csd},
    }
    peaks: dict[str, int] = {}
    autocast = partial(autocast_for, cell.pair.family, sampling, device, grid.heads)
    runs = {name: measured_run(fn, device, peaks, name, autocast) for name, fn in fns.items()}
    samples = alternate(runs, grid.repeats, grid.warmup)
    costs = measured_costs(samples["target"], samples["draft"], sampling.num_steps)
    return [_row(cell, g, samples, costs, grid.prefill, peak_memory(peaks, device, g)) for g in cell.gammas]


def peak_memory(peaks: dict[str, int], device: torch.device, gamma: int) -> dict:
    if device.type == "cuda":
        kind = "torch.cuda.max_memory_allocated, reset per run"
        return {"kind": kind, "target": peaks.get("target"), "csd": peaks.get(f"csd/{gamma}")}
    rss = process_peak_rss()
    return {"kind": "process peak RSS (resource.getrusage; not reset per run)", "target": rss, "csd": rss}


def _row(cell: Cell, g: int, samples: dict[str, Samples], costs, prefill: float, memory: dict) -> dict:
    base, spec = samples["target"], samples[f"csd/{g}"]
    lo, hi = ratio_spread(base, spec)
    steps, p_steps = cell.sampling.num_steps, cell.prefill_steps(prefill)
    passes, drafts = csd_passes(cell.num_tokens, steps, g, prefill)
    split = cost_breakdown(spec)
    per_block = cell.traits.head_per_block  # xAR's flow chain is the backbone: a block's chain costs one step's
    return {
        "batch": cell.batch,
        "gamma": g,
        "num_steps": steps,
        "head_steps": cell.head_steps,
        "prefill_steps": p_steps,
        "target_passes": passes,
        "draft_passes": drafts,
        "target_s": base.median,
        "draft_s": samples["draft"].median,
        "csd_s": spec.median,
        "speedup": base.median / spec.median,
        "speedup_min": lo,
        "speedup_max": hi,
        "speedup_bound": speedup_bound(costs, steps, g, p_steps, per_block),
        "per_step_ms": {k: 1e3 * v for k, v in asdict(costs).items()},
        "time_split": {
            "backbones": split["draft_backbone"] + split["target_backbone"],
            "heads": split["draft_heads"] + split["target_heads"],
            "acceptance": split["acceptance_test"],
            "resampling": split["resampling"],
            "other": split["other"],
        },
        "cost_breakdown": split,
        "acceptance": float(np.nanmean([o.trace.acceptance_rate for o in spec.outputs])),
        "peak_memory": memory,
    }


# --- the run-time estimate -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProfile:
    """Assumed sustained rates of a device (rough: eager PyTorch, no fused kernels)."""

    name: str
    bf16_flops: float  # FLOP/s of bf16 matmuls at large batch
    fp32_flops: float  # FLOP/s of float32 matmuls (the heads), without TF32
    tf32_flops: float  # the same with TF32 allowed (--heads tf32)
    bandwidth: float  # bytes/s of memory
    kernel_s: float  # seconds per kernel: launch and eager dispatch

    def __post_init__(self) -> None:
        for name in ("bf16_flops", "fp32_flops", "tf32_flops", "bandwidth", "kernel_s"):
            check_number(f"DeviceProfile.{name}", getattr(self, name), 0.0, 1e18, lo_open=True)


PROFILES = {
    "h200": DeviceProfile("H200 (bf16 989 TFLOP/s peak, 4.8 TB/s)", 400e12, 45e12, 200e12, 4.8e12, 8e-6),
    "h100": DeviceProfile("H100 SXM (bf16 989 TFLOP/s peak, 3.35 TB/s)", 400e12, 45e12, 200e12, 3.35e12, 8e-6),
    "a100": DeviceProfile("A100 80GB (bf16 312 TFLOP/s peak, 2.0 TB/s)", 150e12, 14e12, 80e12, 2.0e12, 8e-6),
    "cpu": DeviceProfile("a 2-4 core CPU", 30e9, 30e9, 30e9, 10e9, 7e-6),
}
# Kernels (aten ops) counted with a TorchDispatchMode on the tiny models (3600-5200 per generation): per
# layer of MAR's ViT, of Qwen2 and of xAR (adaLN, RoPE, KV cache), per head res-block, and the fixed ones of a
# backbone pass, a head chain step and an xAR flow step (embeddings, CFG mixing, the transition).
MAR_LAYER_KERNELS, LLM_LAYER_KERNELS, XAR_LAYER_KERNELS, HEAD_BLOCK_KERNELS = 18, 60, 60, 12
PASS_KERNELS, CHAIN_STEP_KERNELS, FLOW_STEP_KERNELS = 80, 72, 100


@dataclass(frozen=True)
class Stack:
    """Transformer layers applied to every token: their parameters, count, width and kernels per layer."""

    params: int
    layers: int
    width: int
    layer_kernels: int

    def flops(self, queries: int, keys: int) -> float:
        """2 FLOPs per parameter per token, plus attention's two L_q x L_k x width products."""
        return 2.0 * self.params * queries + 4.0 * self.layers * queries * keys * self.width


@dataclass(frozen=True)
class ModelCost:
    """What a pass of one model reads and computes: its stacks (MAR: encoder, decoder; Harmon: + LLM; xAR:
    all blocks as ``encoder``), head size, token layout."""

    family: str
    params: int  # all of the model's
    encoder: Stack
    decoder: Stack | None = None
    llm: Stack | None = None
    head_params: int = 0
    head_blocks: int = 0
    tokens: int = 0  # tokens of an image
    buffer: int = 0
    cell_len: int = 0
    prompt: int = 0

    @property
    def stacks(self) -> list[Stack]:
        return [s for s in (self.encoder, self.decoder, self.llm) if s is not None]


def _stack(modules: Sequence[nn.Module], width: int, layer_kernels: int) -> Stack:
    return Stack(sum(p.numel() for m in modules for p in m.parameters()), len(modules), width, layer_kernels)


def model_cost(family: str, name: str, tiny: bool, prompt: int) -> ModelCost:
    """A config's :class:`ModelCost`, from a meta-device build (parameters counted, nothing allocated)."""
    with torch.device("meta"):
        model = construct(family, name, tiny)
    total = sum(p.numel() for p in model.parameters())
    if family == "xar":
        c = model.config
        blocks = _stack([*model.encoder_blocks, *model.decoder_blocks], c.embed_dim, XAR_LAYER_KERNELS)
        return ModelCost(family, total, blocks, tokens=c.seq_len, cell_len=c.cell_len)
    mar = model.mar if family == "harmon" else model
    c = mar.config
    enc = _stack(mar.encoder_blocks, c.encoder_embed_dim, MAR_LAYER_KERNELS)
    dec = _stack(mar.decoder_blocks, c.decoder_embed_dim, MAR_LAYER_KERNELS)
    llm = None
    if family == "harmon":
        llm = _stack(model.llm.model.layers, model.config.llm["hidden_size"], LLM_LAYER_KERNELS)
    head = sum(p.numel() for p in mar.diffloss.parameters())
    prompt = prompt if llm else 0
    return ModelCost(family, total, enc, dec, llm, head, c.diffloss_d, model.seq_len, c.buffer_size, prompt=prompt)


@dataclass(frozen=True)
class Rates:
    """A profile with the run's dtypes: backbones bf16 or float32, heads one of :data:`HEAD_MODES`."""

    profile: DeviceProfile
    backbone_bf16: bool
    heads: str = "float32"

    def rate(self, head: bool) -> float:
        p = self.profile
        if head:
            return {"float32": p.fp32_flops, "tf32": p.tf32_flops, "bfloat16": p.bf16_flops}[self.heads]
        return p.bf16_flops if self.backbone_bf16 else p.fp32_flops

    def weight_bytes(self, head: bool) -> int:
        """Bytes moved per parameter per pass: autocast re-casts every float32 weight (read 4, write 2, read 2;
        there is no cast cache without grad), float32 (and TF32) read 4."""
        return 8 if (self.heads == "bfloat16" if head else self.backbone_bf16) else 4

    def seconds(self, flops: float, params: int, kernels: int, head: bool = False) -> float:
        """max(compute, weight reads, kernel launches): whichever bounds the pass."""
        p = self.profile
        return max(flops / self.rate(head), params * self.weight_bytes(head) / p.bandwidth, kernels * p.kernel_s)


def backbone_seconds(m: ModelCost, rows: int, known: int, rates: Rates) -> float:
    """One MAR / Harmon backbone pass over ``rows`` sequences with ``known`` tokens in the context."""
    enc = m.buffer + known
    flops = m.encoder.flops(enc, enc) + m.decoder.flops(m.buffer + m.tokens, m.buffer + m.tokens)
    if m.llm is not None:
        flops += m.llm.flops(m.prompt + enc, m.prompt + enc)
    params = sum(s.params for s in m.stacks)
    kernels = PASS_KERNELS + sum(s.layers * s.layer_kernels for s in m.stacks)
    return rates.seconds(rows * flops, params, kernels)


def head_seconds(m: ModelCost, token_rows: int, steps: int, rates: Rates) -> float:
    """A diffusion head's chain of ``steps`` transitions over ``token_rows`` rows."""
    kernels = CHAIN_STEP_KERNELS + HEAD_BLOCK_KERNELS * m.head_blocks
    return steps * rates.seconds(2.0 * m.head_params * token_rows, m.head_params, kernels, head=True)


def xar_seconds(m: ModelCost, rows: int, first: int, cells: int, flow_steps: int, rates: Rates) -> float:
    """xAR's cells ``first`` .. ``first + cells - 1``: one pass over the clean context, then one pass per flow step."""
    cl, net = m.cell_len, m.encoder
    kernels = net.layers * net.layer_kernels
    context = 0.0
    if first > 0:
        n = first * cl
        context = rates.seconds(rows * net.flops(n, n), net.params, PASS_KERNELS + kernels)
    q = cells * cl
    flow = rates.seconds(rows * net.flops(q, (first + cells) * cl), net.params, FLOW_STEP_KERNELS + kernels)
    return context + flow_steps * flow


def step_seconds(m: ModelCost, cell: Cell, known: int, made: int, first_step: int, steps: int, rates: Rates) -> float:
    """A step (or a verified block of ``steps`` AR steps making ``made`` tokens) of one model: its pass(es)
    over the context of ``known`` tokens and the chains of what it makes."""
    rows = cell.batch * (2 if cell.sampling.guided else 1)
    if m.family == "xar":
        return xar_seconds(m, rows, first_step, steps, cell.head_steps, rates)
    return backbone_seconds(m, rows, known, rates) + head_seconds(m, rows * made, cell.head_steps, rates)


def estimate_generations(target: ModelCost, draft: ModelCost, cell: Cell, prefill: float, rates: Rates) -> dict:
    """Estimated seconds of target-only, draft-only and CSD at every gamma of a cell."""
    sizes = step_sizes(cell.num_tokens, cell.sampling.num_steps)
    known = [sum(sizes[:s]) for s in range(len(sizes))]
    alone = lambda m: sum(step_seconds(m, cell, known[s], sizes[s], s, 1, rates) for s in range(len(sizes)))
    out = {"target": alone(target), "draft": alone(draft)}
    p = prefill_steps(sizes, prefill)
    pre = sum(step_seconds(target, cell, known[s], sizes[s], s, 1, rates) for s in range(p))
    drafted = sum(step_seconds(draft, cell, known[s], sizes[s], s, 1, rates) for s in range(p, len(sizes)))
    for g in cell.gammas:
        verify = 0.0
        for start in range(p, len(sizes), g):
            stop = min(start + g, len(sizes))
            verify += step_seconds(target, cell, known[start], sum(sizes[start:stop]), start, stop - start, rates)
        out[f"csd/{g}"] = pre + drafted + verify
    return out


def setup_seconds(params: int) -> float:
    """Building a pair: float32 init on the host (~40M parameters/s on 2 shared cores, ~100M assumed) and the
    copy to the device (rough)."""
    return 1.0 + params / 1e8


def estimate(cells: list[Cell], grid: GridConfig, rates: Rates) -> dict:
    """Per cell: estimated target-only seconds, speed-up per gamma and the cell's seconds (warm-up and repeats
    of every run); building the pairs; the total. A pair whose model cannot be built (Harmon without
    transformers) is left out and named with the reason."""
    costs, skipped = {}, {}
    for pair in dict.fromkeys(c.pair for c in cells):
        try:
            prompt = prompt_shape(grid.tiny)[0]
            costs[pair.name] = tuple(model_cost(pair.family, c, grid.tiny, prompt) for c in (pair.target, pair.draft))
        except Exception as err:  # any build failure skips the pair, named with its reason
            skipped[pair.name] = f"{type(err).__name__}: {err}"
    rows = []
    for cell in (c for c in cells if c.pair.name in costs):
        t = estimate_generations(*costs[cell.pair.name], cell, grid.prefill, rates)
        speedups = {g: t["target"] / t[f"csd/{g}"] for g in cell.gammas}
        cell_s = (grid.warmup + grid.repeats) * sum(t.values())
        rows.append(
            {
                "pair": cell.pair.name,
                "batch": cell.batch,
                "target_s": t["target"],
                "speedups": speedups,
                "cell_s": cell_s,
            }
        )
    setup = sum(setup_seconds(target.params + draft.params) for target, draft in costs.values())
    total = setup + sum(r["cell_s"] for r in rows)
    out = {"device": rates.profile.name, "assumptions": assumptions(rates), "rows": rows}
    return out | {"setup_s": setup, "total_s": total, "skipped": skipped}


def assumptions(rates: Rates) -> str:
    p = rates.profile
    backbone = "bf16" if rates.backbone_bf16 else "float32"
    return (
        f"rough estimate for {p.name}: per pass max(FLOPs / sustained rate, weight bytes / "
        f"{p.bandwidth / 1e12:g} TB/s, kernels x {p.kernel_s * 1e6:g} us); backbones {backbone} "
        f"{rates.rate(False) / 1e12:g} TFLOP/s, heads {rates.heads} {rates.rate(True) / 1e12:g} TFLOP/s; "
        "FLOPs = 2 x parameters x tokens + attention; acceptance, resampling and noise drawing not counted"
    )


# --- report --------------------------------------------------------------------------------------------


def _f(v, digits: int = 2) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def _g(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _gib(v) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


def plan_text(cells: list[Cell], grid: GridConfig, est: dict, budget: float | None) -> str:
    lines = [
        "# CSD at paper scale: plan (dry run, nothing built or run)",
        "",
        f"Weights: seeded random at {'tiny sizes' if grid.tiny else 'the official sizes'} (official checkpoints "
        f"instead where --checkpoints holds them). Warm-up {grid.warmup} + {grid.repeats} interleaved repeats of "
        f"target-only, draft-only and CSD per gamma; prefill {grid.prefill}.",
        f"Estimate: {est['assumptions']}.",
        "",
        "| pair | batch | gammas | AR steps | head / flow steps | CFG | target passes | est. target-only s | "
        "est. speed-up (model) | est. cell s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_cell = {(r["pair"], r["batch"]): r for r in est["rows"]}
    for cell in cells:
        s, r = cell.sampling, by_cell.get((cell.pair.name, cell.batch))
        passes = ", ".join(str(csd_passes(cell.num_tokens, s.num_steps, g, grid.prefill)[0]) for g in cell.gammas)
        speedups = "skipped" if r is None else ", ".join(f"{v:.2f}x" for v in r["speedups"].values())
        lines.append(
            f"| {cell.pair.name} | {cell.batch} | {', '.join(map(str, cell.gammas))} | {s.num_steps} "
            f"| {cell.head_steps} | {s.cfg_scale} ({s.cfg_schedule}) | {passes} of {s.num_steps} | "
            f"{_g(r and r['target_s'])} | {speedups} | {_g(r and r['cell_s'])} |"
        )
    lines += [""] + [f"Skipped {name}: {why}" for name, why in est["skipped"].items()]
    if "harmon" in grid.families:
        p, n = prompt_shape(grid.tiny)
        lines.append(f"Harmon prompts: {p} tokens (null prompt {n}), the official template's length.")
    total = est["total_s"]
    lines.append(
        f"Estimated total: {total:.0f} s ({total / 60:.1f} min), of which building models {est['setup_s']:.0f} s."
    )
    if budget is not None and total > budget:
        lines.append(
            f"WARNING: the estimate ({total:.0f} s) exceeds --budget-s {budget:g}: shrink the grid (a run skips "
            "the cells whose estimate no longer fits)."
        )
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = ["# CSD at paper scale", ""]
    if result["random_weights"]:
        lines += [f"**{result['weights_note']}**", ""]
    lines += [
        f"{s['device_name']}, backbones {s['precision']}, heads {s['heads']}, torch {s['torch']}; warm-up "
        f"{s['warmup']} + {s['repeats']} interleaved repeats; prefill {s['prefill']}. Speed-up = median target-only "
        "time / median CSD time (min-max of the per-round ratios); bound: the cost model (csd.cost.speedup_bound) "
        "on this run's per-pass costs; est.: the dry run's rough model, for calibrating it.",
        "",
    ]
    for pair in result["pairs"]:
        lines += [f"## {pair['pair']} ({pair.get('weights', 'not built')})", ""]
        if pair.get("skipped"):
            lines += [f"Skipped: {pair['skipped']}", ""]
            continue
        lines += [pair_line(pair, s["tiny"]), "", *cell_table(pair["rows"]), ""]
    kind = next((r["peak_memory"]["kind"] for p in result["pairs"] for r in p["rows"] if "peak_memory" in r), None)
    if kind:
        lines.append(f"Peak memory: {kind}.")
    lines.append(result["quality"])
    return "\n".join(lines) + "\n"


def pair_line(pair: dict, tiny: bool) -> str:
    sm, params = pair["sampling"], pair["params"]
    line = (
        f"{sm['num_steps']} AR steps, {pair['head_steps']} {'flow' if pair['family'] == 'xar' else 'head'} steps, "
        f"cfg {sm['cfg_scale']} ({sm['cfg_schedule']}); {params['target'] / 1e6:.1f}M / {params['draft'] / 1e6:.1f}M "
        "parameters."
    )
    if pair.get("prompt_tokens"):
        line += f" Prompts of {pair['prompt_tokens']} tokens."
    if pair["family"] == "xar":
        line += " Heads: xAR's flow chain (a backbone pass per flow step)."
    if pair["pair"] in PAPER_SPEEDUPS and not tiny:
        line += f" Paper (Table 1): {PAPER_SPEEDUPS[pair['pair']]}."
    return line


def cell_table(rows: list[dict]) -> list[str]:
    lines = [
        "| batch | gamma | target passes | target-only s | CSD s | speed-up (min-max) | bound | est. | "
        "backbones / heads / accept / resample | acceptance | peak GiB target / CSD |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['batch']} | | | | | skipped: {r['skipped']} | | | | | |")
            continue
        t, m = r["time_split"], r["peak_memory"]
        split = " / ".join(f"{100 * t[k]:.0f}%" for k in ("backbones", "heads", "acceptance", "resampling"))
        est = r.get("estimate", {}).get("speedup")
        lines.append(
            f"| {r['batch']} | {r['gamma']} | {r['target_passes']} of {r['num_steps']} | {_f(r['target_s'], 3)} | "
            f"{_f(r['csd_s'], 3)} | {_f(r['speedup'])}x ({_f(r['speedup_min'])}-{_f(r['speedup_max'])}) | "
            f"{_f(r['speedup_bound'])}x | {_f(est)}x | {split} | {_f(r['acceptance'])} | "
            f"{_gib(m['target'])} / {_gib(m['csd'])} |"
        )
    return lines


# --- the command ---------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available here (use --device cpu or auto)")
    return device


def profile_for(name: str, device: torch.device) -> str:
    """--estimate-device auto: the profile of the device the run uses (a GPU by its name, H200 if unknown)."""
    if name != "auto":
        return name
    if device.type != "cuda":
        return "cpu"
    gpu = torch.cuda.get_device_name(device).lower()
    return next((k for k in PROFILES if k != "cpu" and k in gpu), "h200")


@dataclass(frozen=True)
class RunContext:
    """What every cell of a run shares: the grid, the device, where checkpoints are, the estimate per cell
    (pair, batch), a deadline (perf_counter seconds, None: none) and the (measured, estimated) seconds of
    the cells done, which scale the estimate of the next one."""

    grid: GridConfig
    device: torch.device
    checkpoints: Path | None
    estimates: dict[tuple[str, int], dict]
    deadline: float | None
    done: list[tuple[float, float]] = field(default_factory=list)

    def predicted_s(self, estimated: float) -> float:
        """A cell's estimate, times the measured / estimated ratio of the cells timed so far."""
        measured, guessed = (sum(v) for v in zip(*self.done, strict=True)) if self.done else (1.0, 1.0)
        return estimated * measured / guessed


def run_pair(pair: PairSpec, cells: list[Cell], ctx: RunContext, entry: dict, save: Callable[[], None]) -> None:
    """Every cell of one pair into ``entry``, saved after each. A pair that cannot be built, a batch that runs
    out of memory and a cell the deadline leaves no time for are named as skipped, with the reason."""
    try:
        loaded = load_pair(pair, ctx.device, ctx.grid.seed, ctx.grid.tiny, ctx.checkpoints)
    except Exception as err:  # e.g. Harmon without transformers, or too little memory
        entry |= {"weights": "not built", "skipped": f"{type(err).__name__}: {err}"}
        print(f"skipped {pair.name}: {entry['skipped']}")
        return
    count = lambda m: sum(p.numel() for p in m.parameters())
    entry |= {"weights": loaded.weights, "params": {"target": count(loaded.target), "draft": count(loaded.draft)}}
    if pair.family == "harmon":  # as the model tokenises it, start token and template included
        prompts, _ = conditions_for(loaded.target, "harmon", 1, ctx.grid.seed, prompt_shape(ctx.grid.tiny)[0])
        entry["prompt_tokens"] = int(loaded.target.check_conditions(prompts, 1, torch.device("cpu")).ids.shape[1])
    for cell in cells:
        entry["rows"] += time_or_skip(loaded, cell, ctx)
        save()
    del loaded
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def time_or_skip(loaded: LoadedPair, cell: Cell, ctx: RunContext) -> list[dict]:
    """The cell's rows, each with its estimate next to it (to calibrate the estimate), or one skipped row."""
    est = ctx.estimates.get((cell.pair.name, cell.batch))
    skip = lambda why: [{"batch": cell.batch, "skipped": why}]
    if ctx.deadline is not None and est is not None:
        predicted = ctx.predicted_s(est["cell_s"])
        if time.perf_counter() + predicted > ctx.deadline:
            return skip(f"--budget-s: its predicted {predicted:.0f} s do not fit in the time left")
    t0 = time.perf_counter()
    try:
        rows = time_cell(loaded, cell, ctx.grid, ctx.device)
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return skip(f"out of memory ({str(err).splitlines()[0]})")
    wall = time.perf_counter() - t0
    if est is not None:
        ctx.done.append((wall, est["cell_s"]))
    for r in rows:
        r["cell_wall_s"] = wall
        if est is not None:
            r["estimate"] = {
                "cell_s": est["cell_s"],
                "target_s": est["target_s"],
                "speedup": est["speedups"][r["gamma"]],
            }
    print(f"{cell.pair.name} batch {cell.batch}: " + ", ".join(f"gamma {r['gamma']} {r['speedup']:.2f}x" for r in rows))
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m csd.experiments.paper_scale", description=__doc__.split("\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), help=f"model families, of {', '.join(FAMILIES)}")
    p.add_argument("--pairs", nargs="+", default=list(PAIR_KEYS), help="target/draft sizes: H/B, L/B")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 8 64 256; --tiny 1 2)")
    p.add_argument("--gammas", type=int, nargs="+", help="draft lengths (default 8 16 32; --tiny 2 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--prefill", type=float, default=0.05, help="fraction of tokens the target makes first")
    p.add_argument("--seed", type=int, default=0, help="weights, conditions and image seeds")
    p.add_argument("--checkpoints", type=Path, help="official checkpoints (DIR/mar, DIR/xar, DIR/harmon) where present")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="backbone precision (auto: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--heads",
        default="float32",
        choices=HEAD_MODES,
        help="head matmuls: float32 (the library), tf32 (CUDA TF32), bfloat16 (autocast, as the published code)",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--tiny", action="store_true", help="the same code path at tiny sizes (a CPU, under a minute)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and a run-time estimate, run nothing")
    p.add_argument("--estimate-device", default="auto", choices=("auto", *PROFILES), help="device of the estimate")
    p.add_argument(
        "--budget-s",
        type=float,
        help="warn when the estimated run time exceeds this many seconds; a run skips the cells that no longer fit",
    )
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="folder for paper_scale[_tiny].json and .md")
    return p


def grid_from_args(args: argparse.Namespace) -> GridConfig:
    """The grid the flags ask for; raises ValueError naming a bad flag and its valid range."""
    tup = lambda v: None if v is None else tuple(v)
    grid = GridConfig(
        families=tuple(args.families),
        pairs=tuple(args.pairs),
        batches=tup(args.batches),
        gammas=tup(args.gammas),
        repeats=args.repeats,
        warmup=args.warmup,
        prefill=args.prefill,
        seed=args.seed,
        tiny=args.tiny,
        heads=args.heads,
    )
    if args.budget_s is not None:
        check_number("--budget-s (seconds)", args.budget_s, 0.0, 1e9, lo_open=True)
    if args.threads is not None:
        check_int("--threads", args.threads, 1, 1024)
    if args.tiny and args.checkpoints is not None:
        raise ValueError("--tiny builds shrunken random models: it cannot load --checkpoints")
    return grid


def main(argv: list[str] | None = None) -> dict:
    """Print the plan and its estimate; unless --dry-run, time every cell and write JSON and Markdown."""
    args_parser = parser()
    args = args_parser.parse_args(argv)
    try:
        grid = grid_from_args(args)
        device = resolve_device(args.device)
        if not args.dry_run and grid.heads == "tf32" and device.type != "cuda":
            raise ValueError("--heads tf32 needs a CUDA device (TF32 is a CUDA matmul mode)")
    except ValueError as err:
        args_parser.error(str(err))  # exits with the message and the usage
    if args.threads:
        torch.set_num_threads(args.threads)
    profile = profile_for(args.estimate_device, device)
    # The plan's dtypes: those of the device estimated (dry run) or used.
    gpu = profile != "cpu" if args.dry_run else device.type == "cuda"
    precision = args.precision if args.precision != "auto" else ("bfloat16" if gpu else "float32")
    cells = plan_cells(grid, precision)
    est = estimate(cells, grid, Rates(PROFILES[profile], precision != "float32", grid.heads))
    print(plan_text(cells, grid, est, args.budget_s))
    if args.dry_run:
        return {"plan": [_cell_dict(c, grid) for c in cells], "estimate": est}
    if grid.heads == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    stem = "paper_scale_tiny" if grid.tiny else "paper_scale"
    deadline = None if args.budget_s is None else time.perf_counter() + args.budget_s
    estimates = {(r["pair"], r["batch"]): r for r in est["rows"]}
    ctx = RunContext(grid, device, args.checkpoints, estimates, deadline)
    result = run(cells, ctx, est, partial(write_result, out=args.out, stem=stem))
    print(markdown(result))
    print(f"wrote {args.out / (stem + '.json')} and {args.out / (stem + '.md')}")
    return result


def _cell_dict(cell: Cell, grid: GridConfig) -> dict:
    s = cell.sampling
    return {
        "pair": cell.pair.name,
        "batch": cell.batch,
        "gammas": list(cell.gammas),
        "num_steps": s.num_steps,
        "head_steps": cell.head_steps,
        "cfg_scale": s.cfg_scale,
        "precision": s.precision,
        "target_passes": [csd_passes(cell.num_tokens, s.num_steps, g, grid.prefill)[0] for g in cell.gammas],
    }


def run(cells: list[Cell], ctx: RunContext, est: dict, write: Callable[[dict], None]) -> dict:
    """Every pair's cells, one pair in memory at a time; the result so far is written after every cell (a
    run stopped half-way keeps what it measured)."""
    t0 = time.perf_counter()
    grid = ctx.grid
    result = {
        "random_weights": False,
        "weights_note": "",
        "quality": QUALITY_NOTE,
        "pairs": [],
        "estimate": est,
        "settings": {
            **asdict(grid),
            "batches": list(grid.batch_sizes),
            "gammas": list(grid.draft_lengths),
            "precision": cells[0].sampling.precision if cells else None,
            "device": str(ctx.device),
            "device_name": device_name(ctx.device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }

    def save() -> None:
        result["random_weights"] = any(p.get("weights", "").startswith("random") for p in result["pairs"])
        sizes = "tiny configs" if grid.tiny else "official sizes"
        result["weights_note"] = RANDOM_NOTE.format(sizes=sizes) if result["random_weights"] else "official checkpoints"
        result["settings"]["wall_time_s"] = time.perf_counter() - t0
        write(result)

    for pair in dict.fromkeys(c.pair for c in cells):
        pair_cells = [c for c in cells if c.pair == pair]
        entry = {"pair": pair.name, "family": pair.family, "target": pair.target, "draft": pair.draft}
        entry |= {"sampling": asdict(pair_cells[0].sampling), "head_steps": pair_cells[0].head_steps, "rows": []}
        result["pairs"].append(entry)
        run_pair(pair, pair_cells, ctx, entry, save)
        save()
    return result


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"


def write_result(result: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = markdown(result)
    (out / f"{stem}.md").write_text(table)


if __name__ == "__main__":
    main()
