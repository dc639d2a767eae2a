"""The dry run's run-time estimate of a paper-scale grid: per pass, max(FLOPs / sustained rate, weight bytes /
memory bandwidth, kernels x per-kernel overhead), on each family's cost shape (its catalog entry's ``paper.cost``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csd.core.checks import check_number
from csd.core.schedule import step_sizes
from csd.experiments.paper_scale.build import construct
from csd.experiments.paper_scale.plan import Cell, GridConfig
from csd.models.spec import CostShape
from csd.records.cost import prefill_steps
from csd.serving.catalog import entry_of


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
# diffusion-head res-block, and the fixed ones of a backbone pass, a head chain step and a flow step
# (embeddings, CFG mixing, the transition); each family's per-layer counts are in its cost shape.
HEAD_BLOCK_KERNELS, PASS_KERNELS, CHAIN_STEP_KERNELS, FLOW_STEP_KERNELS = 12, 80, 72, 100


def model_cost(family: str, name: str, tiny: bool, prompt: int) -> CostShape:
    """A config's :class:`CostShape`, from a meta-device build (parameters counted, nothing allocated)."""
    with torch.device("meta"):
        model = construct(family, name, tiny)
    return entry_of(family).paper.cost(model, prompt)


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


def backbone_seconds(m: CostShape, rows: int, known: int, rates: Rates) -> float:
    """One backbone pass over ``rows`` sequences with ``known`` tokens in the context."""
    enc = m.buffer + known
    flops = m.encoder.flops(enc, enc)
    if m.decoder is not None:
        flops += m.decoder.flops(m.buffer + m.tokens, m.buffer + m.tokens)
    if m.llm is not None:
        flops += m.llm.flops(m.prompt + enc, m.prompt + enc)
    params = sum(s.params for s in m.stacks)
    kernels = PASS_KERNELS + sum(s.layers * s.layer_kernels for s in m.stacks)
    return rates.seconds(rows * flops, params, kernels)


def head_seconds(m: CostShape, token_rows: int, steps: int, rates: Rates) -> float:
    """A diffusion head's chain of ``steps`` transitions over ``token_rows`` rows."""
    kernels = CHAIN_STEP_KERNELS + HEAD_BLOCK_KERNELS * m.head_blocks
    return steps * rates.seconds(2.0 * m.head_params * token_rows, m.head_params, kernels, head=True)


def flow_seconds(m: CostShape, rows: int, first: int, cells: int, flow_steps: int, rates: Rates) -> float:
    """A flow family's cells ``first`` .. ``first + cells - 1``: one pass over the clean context, then one pass
    per flow step."""
    cl, net = m.cell_len, m.encoder
    kernels = net.layers * net.layer_kernels
    context = 0.0
    if first > 0:
        n = first * cl
        context = rates.seconds(rows * net.flops(n, n), net.params, PASS_KERNELS + kernels)
    q = cells * cl
    flow = rates.seconds(rows * net.flops(q, (first + cells) * cl), net.params, FLOW_STEP_KERNELS + kernels)
    return context + flow_steps * flow


def step_seconds(m: CostShape, cell: Cell, known: int, made: int, first_step: int, steps: int, rates: Rates) -> float:
    """A step (or a verified block of ``steps`` AR steps making ``made`` tokens) of one model: its pass(es)
    over the context of ``known`` tokens and the chains of what it makes."""
    rows = cell.batch * (2 if cell.sampling.guided else 1)
    if m.flow:
        return flow_seconds(m, rows, first_step, steps, cell.head_steps, rates)
    return backbone_seconds(m, rows, known, rates) + head_seconds(m, rows * made, cell.head_steps, rates)


def estimate_generations(target: CostShape, draft: CostShape, cell: Cell, prefill: float, rates: Rates) -> dict:
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
    of every run); building the pairs; the total. A pair whose model cannot be built (a text family without
    transformers) is left out and named with the reason."""
    costs, skipped = {}, {}
    for pair in dict.fromkeys(c.pair for c in cells):
        try:
            prompt = entry_of(pair.family).paper.prompt_shape(grid.tiny)[0]
            models = (pair.target, pair.draft)
            costs[pair.paper_name] = tuple(model_cost(pair.family, c, grid.tiny, prompt) for c in models)
        except Exception as err:  # any build failure skips the pair, named with its reason
            skipped[pair.paper_name] = f"{type(err).__name__}: {err}"
    rows = []
    for cell in (c for c in cells if c.pair.paper_name in costs):
        t = estimate_generations(*costs[cell.pair.paper_name], cell, grid.prefill, rates)
        speedups = {g: t["target"] / t[f"csd/{g}"] for g in cell.gammas}
        cell_s = (grid.warmup + grid.repeats) * sum(t.values())
        rows.append(
            {
                "pair": cell.pair.paper_name,
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
