"""What only a GPU can show, run by the device check (``python -m scripts.gpu_check``, which runs
``pytest -m cuda``): the samplers on CUDA keep their logic (float64 batch invariance), a float32 CUDA run
stays within float32's rounding of the CPU's float64 reference, bfloat16 runs keep the heads' tokens in float32,
timed phases synchronise the device, and the app serves a pair on CUDA through its GPU calls. Skipped where
there is no CUDA (every CI machine)."""

from __future__ import annotations

import time

import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.models.kernels import EAGER, HeadKernels
from csd.sampling import generate
from csd.serving.pairs import RANDOM_SOURCE, PairStore, random_pair
from csd.speculative import speculative_generate
from tests.helpers import F32_ATOL, assert_same64, sampling64

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.kernels,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the device check runs it on a GPU)"),
]
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def pair_gpu():
    return random_pair(CUDA)


def test_float64_on_cuda_is_batch_invariant_for_target_only_and_csd(pair_gpu):
    pair = pair_gpu.at_precision("float64")
    s, csd = sampling64(num_steps=8, cfg_scale=2.0, head_steps=5), CSDConfig(gamma=3)
    assert_same64(generate(pair.target, [2], [4], s).tokens, generate(pair.target, [1, 2], [3, 4], s).tokens[1:])
    both = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, csd)
    alone = speculative_generate(pair.target, pair.draft, [2], [4], s, csd)
    assert_same64(alone.tokens, both.tokens[1:])
    assert (alone.trace.maker == both.trace.maker[1:]).all()


def test_a_float32_cuda_run_is_the_cpu_float64_run_up_to_float32_rounding(pair_gpu):
    s = SamplingConfig(num_steps=8, cfg_scale=2.0, head_steps=5)
    on_gpu = generate(pair_gpu.target, [1, 2], [3, 4], s).tokens  # the CPU's random numbers, copied over
    reference = random_pair().at_precision("float64")
    s64 = s.with_knobs(**{"precision": "float64"})
    cpu = generate(reference.target, [1, 2], [3, 4], s64).tokens.to(on_gpu.device)
    gap = float((on_gpu.double() - cpu).abs().max())
    # The streams draw on the host (csd/core/rng.py): the same numbers as the CPU's, so the values compare. A
    # float32 CPU run of this pair lies up to 2.0e-4 from float64 (tests/data/golden_rounding.json, bound 4e-4
    # in test_same_tokens); CUDA's float32 kernels round alike (TF32 is off for products): 2.5x that bound.
    assert torch.isfinite(on_gpu).all() and gap < 1e-3, gap
    again = generate(pair_gpu.target, [1, 2], [3, 4], s).tokens
    assert float((again - on_gpu).abs().max()) < F32_ATOL  # the same seeds: the same image, up to rounding


def test_bfloat16_backbones_on_cuda_keep_heads_in_float32(pair_gpu):
    s32 = SamplingConfig(num_steps=8, cfg_scale=2.0, head_steps=5)
    s16 = s32.with_knobs(**{"precision": "bfloat16"})
    a, b = generate(pair_gpu.target, [1], [0], s32).tokens, generate(pair_gpu.target, [1], [0], s16).tokens
    assert b.dtype == torch.float32 and torch.isfinite(b).all() and float((a - b).abs().mean()) < 0.1


def test_timed_phases_are_the_devices_read_once_the_run_ends(pair_gpu):
    """Each phase's time is the device's (CUDA events, read when the run ends): every phase that ran has a
    positive time, and their sum is within the wall time."""
    s = SamplingConfig(num_steps=16, cfg_scale=2.0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = speculative_generate(pair_gpu.target, pair_gpu.draft, [1] * 8, list(range(8)), s, CSDConfig(gamma=4))
    wall = time.perf_counter() - t0
    assert out.trace.times and all(t > 0 for t in out.trace.times.values())
    assert sum(out.trace.times.values()) <= wall * 1.01


def test_compiled_and_graphed_chains_make_the_eager_chains_tokens(pair_gpu):
    """The head kernels on CUDA (csd/models/kernels.py: compiled steps; each chain one CUDA graph over rows padded
    to their bucket, over eager or compiled steps) against the eager fused sampler: the same tokens within
    float32's bound, target-only and CSD (float32 products at precision float32); a replay repeats its capture."""
    s, csd = SamplingConfig(num_steps=8, cfg_scale=2.0), CSDConfig(gamma=3)
    heads = [pair_gpu.target.head, pair_gpu.draft.head]
    runs = lambda: (
        generate(pair_gpu.target, [1, 2], [3, 4], s).tokens,
        speculative_generate(pair_gpu.target, pair_gpu.draft, [1, 2], [3, 4], s, csd).tokens,
    )
    got = {}
    try:
        for kernels in (EAGER, HeadKernels(graphs=False), HeadKernels(compiled=False), HeadKernels()):
            for head in heads:
                head.use_kernels(kernels)
            got[kernels] = (runs(), runs())  # captured (where graphed), then replayed
    finally:
        for head in heads:
            head.use_kernels(None)
    eager = got.pop(EAGER)[0]
    for kernels, (first, again) in got.items():
        for a, b, c in zip(eager, first, again, strict=True):
            assert float((b - a).abs().max()) < F32_ATOL, kernels
            assert torch.equal(b, c), kernels


def test_the_app_serves_a_pair_on_cuda_through_its_gpu_calls():
    pytest.importorskip("gradio", reason="the app needs gradio (carried as wheels to a machine without it)")
    from demo.application import App
    from demo.limits import Limits
    from demo.tabs.generate import compare

    application = App(PairStore([RANDOM_SOURCE], CUDA), Limits())
    values = {**application.default_controls(), "batch_size": 2, "ar_steps": 16}
    *_, result = compare(application, lambda *a, **k: None, **values)
    assert result.images["csd"].ndim == 3 and result.summary["speedup"] > 0
    assert application.timed(RANDOM_SOURCE.name)
