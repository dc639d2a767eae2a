"""Small hand-made models for tests: linear-Gaussian token chains whose output law is known."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from csd.core.chain import HeadCondition
from csd.family import FamilyTraits
from csd.models.mar.adapter import MaskedARFamily


class LinearGaussianChain:
    """y_{k+1} = a_k y_k + b_k + z[:, :d] + c_k eps_k (k < T-1); x = a_{T-1} y + b_{T-1} + z[:, :d].

    std at the last step is c_{T-1} (the "learned" std of the noise-free step)."""

    def __init__(self, a: list[float], b: list[float], c: list[float], token_dim: int):
        self.a, self.b, self.c = (torch.tensor(v, dtype=torch.float32) for v in (a, b, c))
        self.token_dim = token_dim

    def num_steps(self) -> int:
        return len(self.a)

    def transition(self, y: Tensor, step, cond: HeadCondition) -> tuple[Tensor, Tensor]:
        pick = (lambda v: v[step]) if isinstance(step, int) else (lambda v: v.to(y.device)[step].unsqueeze(-1))
        shift = cond.z[:, : self.token_dim]
        mean = pick(self.a) * y + pick(self.b) + shift
        return mean, (pick(self.c) * torch.ones_like(y))

    def output_law(self, shift: float, temperature: float = 1.0) -> tuple[float, float]:
        """Mean and variance of x given a condition shift, from y_0 ~ N(0, 1)."""
        m, v = 0.0, 1.0
        for k in range(self.num_steps()):
            a, b, c = float(self.a[k]), float(self.b[k]), float(self.c[k])
            m, v = a * m + b + shift, a * a * v + (0.0 if k == self.num_steps() - 1 else (temperature * c) ** 2)
        return m, v


class _Head:
    def __init__(self, chain: LinearGaussianChain):
        self._chain = chain

    def chain(self, steps: int | None = None) -> LinearGaussianChain:
        if steps not in (None, self._chain.num_steps()):
            raise ValueError(f"head_steps must be {self._chain.num_steps()} for this test head")
        return self._chain


class ToyARModel(MaskedARFamily, nn.Module):
    """A masked-AR model whose condition is a per-class vector, whatever the context: tokens are i.i.d."""

    def __init__(self, chain: LinearGaussianChain, seq_len: int = 4, num_classes: int = 3, shifts=None):
        super().__init__()
        self.seq_len, self.token_dim = seq_len, chain.token_dim
        self.traits = FamilyTraits("toy", "classes", num_classes=num_classes)
        shifts = shifts if shifts is not None else [float(i) for i in range(num_classes)]
        self.table = nn.Parameter(torch.tensor(shifts).unsqueeze(-1).repeat(1, chain.token_dim), requires_grad=False)
        self.head = _Head(chain)

    def conditions(self, tokens: Tensor, mask: Tensor, labels: Tensor, guided: bool, known: int | None = None):
        z = self.table[labels].unsqueeze(1).expand(-1, self.seq_len, -1)
        return z, (z if guided else None)


def normal_cdf(x, mean: float, var: float):
    return 0.5 * (1.0 + torch.special.erf((torch.as_tensor(x, dtype=torch.float64) - mean) / math.sqrt(2 * var)))


def save_tiny_pixel_pair(folder, seed: int = 0) -> tuple[str, str]:
    """A tiny random pixel MAR target (width 32) and draft (width 16) saved in the project format.

    Weights are perturbed away from MAR's zero-initialised head outputs, so images vary with the seed."""
    from csd.models.mar import MAR, tiny_pixel_config
    from csd.models.registry import save_model

    gen = torch.Generator().manual_seed(seed)
    paths = []
    for name, width in (("target", 32), ("draft", 16)):
        with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
            torch.manual_seed(seed)
            model = MAR(tiny_pixel_config(width, 1))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        paths.append(str(save_model(model, f"{folder}/{name}")))
    return paths[0], paths[1]


def pair_name(family: str, kind: str) -> str:
    """The name of a family's pair of one kind ("embedded", "official", "random"), from its catalog entry."""
    from csd.serving.catalog import entry_of

    return next(p.name for p in entry_of(family).pairs if p.kind == kind)


def save_tiny_text_pair(folder) -> tuple[str, str]:
    """The untrained text pair of csd.serving.pairs (Harmon layout) saved in the project format."""
    from csd.models.registry import save_model
    from csd.serving.pairs import random_pair

    pair = random_pair(family="harmon")
    return str(save_model(pair.target, f"{folder}/text_target")), str(save_model(pair.draft, f"{folder}/text_draft"))


def save_tiny_xar_pair(folder) -> tuple[str, str]:
    """The untrained xAR pair of csd.serving.pairs (16 cells on the embedded layout) saved in the
    project format."""
    from csd.models.registry import save_model
    from csd.serving.pairs import random_pair

    pair = random_pair(family="xar")
    return str(save_model(pair.target, f"{folder}/xar_target")), str(save_model(pair.draft, f"{folder}/xar_draft"))


# --- float64: the exact reference (csd.core.precision) --------------------------------------------------------

# A float64 run computes what a float32 one does without its rounding; what another CPU's kernels, another
# batch shape, two threads or oneDNN off change is float64's last bits (1e-16), which a chain of head steps
# amplifies (x0 = (x_t - sqrt(1 - ab) eps) / sqrt(ab) divides by up to ~2e4 at the noisiest step). Measured
# (tests/data/kernel_drift.json, ``f64_batch``): at most 7.3e-12 between image i of a batch and image i alone,
# over every family, sampler, cache, GtR and criterion, under this CPU's kernels, two threads, oneDNN off and
# the AVX2 and default capabilities. The bound is over 100x that, and 6 orders of magnitude under what float32
# rounding moves the same runs (``f32_f64``: 5e-3) and under any change of logic (tenths), so a claim asserted
# within it is a claim about logic, not about this CPU's rounding.
F64_ATOL = 1e-9

# float32 runs: image i of a batch against image i alone, and a float32 run against the float64 run of the
# same seeds, move by float32 rounding amplified by a chain. Measured (tests/data/kernel_drift.json): at most
# 5.8e-3 (``f32_batch``, two threads) and 5.2e-3 (``f32_f64``, the default capability) on the untrained pairs;
# on an AVX-512 Xeon with AMX, whose BLAS picks kernels by shape, 1.5e-3 was reported (issue 51). The bound is
# 5x the worst: what holds of float32 runs on any CPU; logic is asserted in float64.
F32_ATOL = 3e-2


def assert_same64(actual, expected, what: str = "") -> None:
    """Two float64 results equal up to float64 rounding amplified by a chain (:data:`F64_ATOL`)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.dtype == expected.dtype == torch.float64, f"{what}: compare float64 runs, got {actual.dtype}"
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=F64_ATOL, msg=lambda m: f"{what}\n{m}")


def random_pair64(family: str | None = None):
    """The untrained pair of a family (csd.serving.pairs.random_pair) in float64, made once per family."""
    return _random_pair64(family)


@functools.cache
def _random_pair64(family):
    from csd.serving.pairs import random_pair

    return random_pair(family=family).at_precision("float64")


def assert_differ64(a, b, what: str = "", by: float = 1e-4) -> None:
    """Two float64 results differ by more than ``by`` somewhere: far beyond any kernel's rounding
    (:data:`F64_ATOL`), so a change that must show shows, on every CPU."""
    gap = float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())
    assert gap > by, f"{what}: expected a difference > {by:g}, got {gap:.3g}"


def sampling64(**knobs):
    """A SamplingConfig at precision "float64" (the exact reference)."""
    from csd.config import SamplingConfig

    return SamplingConfig.from_knobs(**knobs, precision="float64")
