"""The measuring half of :mod:`csd.experiments.roofline`: one process, one tree's ``csd``, one case at a time.

Runs as a worker script (``python roofline_probe.py`` with ``PYTHONPATH`` set to the tree being measured), so
it imports nothing of ``csd.experiments`` and only the public API every tree has had (``generate``,
``speculative_generate``, the embedded pairs, the default setting), running them through ``csd.dispatch.Method``
where the tree has it (:func:`method_run`): an older tree is measured by the same code as this one. Reads one
JSON request per line on stdin and answers one JSON line:

* ``{"op": "count", "case": C}``: a run under a dispatch mode that records every matrix product (its op,
  shapes, strides, dtype: the bound replays them) and counts every op, and a run under ``torch.profiler``
  (op calls at every nesting level, as the profiler shows them, and self time by op class);
* ``{"op": "time", "case": C}``: one timed run, then the bound: the same matrix products, the same number of
  times, in the run's order, timed alone on tensors of the same shapes and strides;
* a case: ``{"pair": name, "batch": B, "mode": "target" | "csd"}`` at the app's default setting, with
  ``"profile": false`` to count without the profiled run (no op calls, no self time by op class).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Matrix products as the dispatcher sees them (nn.Linear reaches it as addmm or mm; attention as the fused
# CPU kernel, which the bound replays as its two batched products).
MATMULS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.matmul.default,
    aten.linear.default,
}
ATTENTION = {aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default}


def _spec(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))


class MatmulRecorder(TorchDispatchMode):
    """Records the matrix products a run makes (as replayable specs) and counts every op it dispatches."""

    def __init__(self):
        super().__init__()
        self.products: list[tuple] = []  # (op, args with every tensor as its spec, flops)
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops[func.overloadpacket.__name__] += 1
        out = func(*args, **kwargs)
        if func in MATMULS:
            first = args[1] if func in (aten.addmm.default, aten.baddbmm.default) else args[0]  # (..., k)
            spec = [(_spec(a),) if isinstance(a, torch.Tensor) else a for a in args]
            self.products.append((func, spec, 2 * out.numel() * first.shape[-1]))
        elif func in ATTENTION:
            q, k = args[:2]  # (B, heads, m, hd), (B, heads, n, hd): q k^T, then the weights times v
            b, h, m, d = q.shape
            n, dtype = k.shape[2], str(q.dtype).removeprefix("torch.")
            scores = (((b * h, m, d), (m * d, d, 1), dtype),), (((b * h, d, n), (n * d, 1, d), dtype),)
            mix = (((b * h, m, n), (m * n, n, 1), dtype),), (((b * h, n, d), (n * d, d, 1), dtype),)
            self.products += [(aten.bmm.default, list(scores), 2 * b * h * m * n * d)]
            self.products += [(aten.bmm.default, list(mix), 2 * b * h * m * n * d)]
        return out


class Bound:
    """The recorded products replayed alone: one tensor per distinct operand spec, the ops in the run's order."""

    def __init__(self, products: list[tuple], device: torch.device):
        gen = torch.Generator().manual_seed(0)
        made: dict[tuple, torch.Tensor] = {}

        def tensor(spec: tuple) -> torch.Tensor:
            if spec not in made:
                shape, stride, dtype = spec
                size = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) if all(shape) else 0
                flat = torch.randn(max(size, 1), generator=gen).to(device=device, dtype=getattr(torch, dtype))
                made[spec] = flat.as_strided(shape, stride)
            return made[spec]

        arg = lambda a: tensor(a[0]) if isinstance(a, tuple) and len(a) == 1 and isinstance(a[0], tuple) else a
        self.calls = [(op, [arg(a) for a in spec]) for op, spec, _ in products]
        self.device = device

    @torch.inference_mode()
    def run(self) -> float:
        _sync(self.device)
        t0 = time.perf_counter()
        for op, args in self.calls:
            op(*args)
        _sync(self.device)
        return time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


OP_CLASSES = (
    ("matmul", ("addmm", "mm", "bmm", "baddbmm", "linear", "matmul")),
    ("attention", ("scaled_dot_product", "flash_attention", "softmax")),
    ("norm", ("layer_norm", "native_layer_norm", "rms_norm", "group_norm")),
    (
        "copy and layout",
        (
            "copy",
            "cat",
            "stack",
            "clone",
            "contiguous",
            "index",
            "gather",
            "scatter",
            "to",
            "_to_copy",
            "empty",
            "zeros",
            "full",
            "fill",
            "ones",
            "repeat",
            "expand",
            "where",
            "masked",
            "split",
            "chunk",
            "narrow",
            "select",
            "slice",
            "view",
            "reshape",
            "permute",
            "transpose",
            "t",
            "as_strided",
            "unsqueeze",
            "squeeze",
            "flatten",
            "unbind",
            "detach",
            "alias",
            "resize",
        ),
    ),
    ("random", ("randn", "rand", "normal", "uniform", "multinomial", "bernoulli")),
    (
        "element-wise",
        (
            "add",
            "sub",
            "mul",
            "div",
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "pow",
            "clamp",
            "silu",
            "gelu",
            "tanh",
            "sigmoid",
            "neg",
            "abs",
            "lerp",
            "addcmul",
            "addcdiv",
            "sin",
            "cos",
            "square",
            "sum",
            "mean",
            "max",
            "min",
            "amax",
            "eq",
            "ne",
            "lt",
            "gt",
            "le",
            "ge",
            "logical",
            "any",
            "all",
            "erf",
            "reciprocal",
            "sign",
            "norm",
        ),
    ),
)


def op_class(name: str) -> str:
    """The class of an op named as the profiler names it (``aten::addmm``): its name, leading and trailing
    underscores dropped, equal to a class's stem or, for stems of four letters or more, starting with one."""
    base = name.removeprefix("aten::").strip("_")
    for label, stems in OP_CLASSES:
        if base in stems or any(len(s) > 3 and base.startswith(s) for s in stems):
            return label
    return "other"


def method_run(mode: str, csd):
    """What a case's ``mode`` runs, as ``run(target, draft, conditions, seeds, sampling)``: target-only ("target")
    or CSD at ``csd``, through the tree's :class:`csd.dispatch.Method`; a tree from before it has the samplers
    called as that calls them."""
    try:
        from csd.dispatch import Method
    except ImportError:  # an older tree: the same calls, written out
        from csd.sampling import generate
        from csd.speculative import speculative_generate

        def run(target, draft, conditions, seeds, sampling):
            if mode == "target":
                return generate(target, conditions, seeds, sampling)
            return speculative_generate(target, draft, conditions, seeds, sampling, csd)

        return run
    return (Method.target() if mode == "target" else Method.speculative(csd)).run


class Case:
    """One setting of one pair: the app's default (the pair's fixed AR steps and CFG ramp on xAR)."""

    def __init__(self, store, case: dict):
        from csd.experiments import defaults

        self.pair = pair = store.get(case["pair"])
        traits = pair.traits
        sampling = replace(defaults.SAMPLING, num_steps=case.get("num_steps") or defaults.SAMPLING.num_steps)
        if traits.fixed_num_steps:
            sampling = replace(sampling, num_steps=traits.fixed_num_steps, cfg_schedule=traits.cfg_schedule)
        self.steps = sampling.num_steps
        batch = case["batch"]
        conditions = list(pair.prompts[:1] or [0]) * batch
        seeds = list(range(batch))
        run = method_run(case["mode"], defaults.CSD)
        self.run = lambda: run(pair.target, pair.draft, conditions, seeds, sampling)
        self._bound: Bound | None = None
        self.profile = case.get("profile", True)  # False: no profiled run (no op calls, no time by op class)

    def count(self) -> dict:
        with MatmulRecorder() as rec:
            out = self.run()
        self._bound = Bound(rec.products, self.pair.device)
        total_flops = sum(f for *_, f in rec.products)
        if not self.profile:
            return {"ar_steps": self.steps, "flops": total_flops, "products": len(rec.products), "tokens": digest(out)}
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            self.run()
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        calls = sum(e.count for e in events)
        by_class: Counter = Counter()
        for e in events:
            by_class[op_class(e.key)] += e.self_cpu_time_total / 1e6
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
        return {
            "ar_steps": self.steps,
            "flops": total_flops,
            "products": len(rec.products),
            "dispatched_ops": sum(rec.ops.values()),
            "op_calls": calls,
            "op_calls_per_step": calls / self.steps,
            "profile_s": {k: round(v, 4) for k, v in by_class.most_common()},
            "top_ops": [[e.key, e.count, round(e.self_cpu_time_total / 1e6, 4)] for e in top],
            "tokens": digest(out),
        }

    def time(self) -> dict:
        if self._bound is None:
            self.count()
        _sync(self.pair.device)
        t0 = time.perf_counter()
        out = self.run()
        _sync(self.pair.device)
        wall = time.perf_counter() - t0
        answer = {"wall": wall, "bound": self._bound.run(), "tokens": digest(out)}
        answer["tokens_f32"] = base64.b64encode(out.tokens.float().numpy().tobytes()).decode()
        answer["maker"] = base64.b64encode(out.trace.maker.astype("int8").tobytes()).decode()
        return answer


def digest(gen) -> str:
    """The run's tokens and who made each, as a hash: equal runs, equal digests."""
    return hashlib.sha256(gen.tokens.numpy().tobytes() + gen.trace.maker.tobytes()).hexdigest()[:16]


def serve(threads: int) -> None:
    from csd.serving.pairs import PairStore, discover

    torch.set_num_threads(threads)
    store = PairStore(discover(None), torch.device("cpu"))
    cases: dict[str, Case] = {}
    hello = {"pairs": store.names, "capability": torch.backends.cpu.get_cpu_capability(), "threads": threads}
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        key = json.dumps(request["case"], sort_keys=True)
        if key not in cases:
            cases[key] = Case(store, request["case"])
            cases[key].run()  # untimed: the first run of a shape pays one-time costs
        case = cases[key]
        print(json.dumps(case.count() if request["op"] == "count" else case.time()), flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
