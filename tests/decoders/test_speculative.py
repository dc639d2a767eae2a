"""End-to-end properties of target-only generation and continuous speculative decoding. Runs of the small MAR
pair are compared in float64, the exact reference (tests/helpers.py): equal up to float64 rounding on every
CPU; the distributional tests run the hand-made linear-Gaussian chains in float32."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from csd.config import CSDConfig, SamplingConfig
from csd.core.precision import at_precision
from csd.models.mar import MAR, mar_config
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import LinearGaussianChain, ToyARModel, assert_differ64, assert_same64, sampling64

TARGET_CHAIN = LinearGaussianChain([0.9, 0.7, 1.0], [0.0, 0.2, 0.0], [0.6, 0.5, 0.05], token_dim=2)
DRAFT_CHAIN = LinearGaussianChain([0.8, 0.7, 1.0], [0.1, 0.0, 0.0], [0.7, 0.45, 0.05], token_dim=2)


def test_exact_criterion_reproduces_target_head_distribution():
    target, draft = ToyARModel(TARGET_CHAIN), ToyARModel(DRAFT_CHAIN)
    n_img = 1500
    labels = [i % 3 for i in range(n_img)]
    out = speculative_generate(
        target,
        draft,
        labels,
        list(range(n_img)),
        SamplingConfig(num_steps=4),
        CSDConfig.from_knobs(gamma=2, prefill=0.0, criterion="exact"),
    )
    lab = np.array(labels)
    for c in range(3):
        mean, var = TARGET_CHAIN.output_law(shift=float(c))
        x = out.tokens[lab == c].reshape(-1).numpy()  # tokens and dims are i.i.d. under this toy model
        assert stats.kstest(x, stats.norm(mean, math.sqrt(var)).cdf).pvalue > 0.001  # fixed seeds
    assert out.trace.count(Maker.RESAMPLED) > 0 and out.trace.count(Maker.ACCEPTED) > 0


def test_draft_alone_has_a_detectably_different_distribution():
    # Power check for the test above: the draft's own law is rejected by the same KS test.
    draft = ToyARModel(DRAFT_CHAIN)
    out = generate(draft, [0] * 1500, list(range(1500)), SamplingConfig(num_steps=4))
    mean, var = TARGET_CHAIN.output_law(shift=0.0)
    assert stats.kstest(out.tokens.reshape(-1).numpy(), stats.norm(mean, math.sqrt(var)).cdf).pvalue < 1e-6


@pytest.fixture(scope="module")
def mar_pair32() -> tuple[MAR, MAR]:
    """A small MAR target and a slightly perturbed copy as the draft."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # layer init reads the global generator
        torch.manual_seed(0)
        cfg = mar_config("mar_test", clip_x0=1.0)
        target = MAR(cfg).eval()
        for p in target.parameters():
            p.add_(0.05 * torch.randn_like(p))
        draft = MAR(cfg).eval()
        draft.load_state_dict(target.state_dict())
        for p in draft.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return target, draft


@pytest.fixture(scope="module")
def mar_pair(mar_pair32) -> tuple[MAR, MAR]:
    """The same pair in float64."""
    return tuple(at_precision(m, "float64") for m in mar_pair32)


SAMPLING = sampling64(num_steps=6, cfg_scale=2.0)


def test_alignment_lowers_draft_target_distance(mar_pair):
    target, draft = mar_pair
    out = speculative_generate(target, draft, [1, 2, 3, 4], [0, 1, 2, 3], SAMPLING, CSDConfig(counterfactual=True))
    s = out.trace.summary()
    assert s["distance_aligned"] < 0.5 * s["distance_independent"]


@pytest.mark.kernels
def test_same_seed_gives_the_same_tokens(mar_pair):
    target, draft = mar_pair
    a = speculative_generate(target, draft, [1, 2], [7, 8], SAMPLING, CSDConfig(gamma=2))
    b = speculative_generate(target, draft, [1, 2], [7, 8], SAMPLING, CSDConfig(gamma=2))
    assert_same64(a.tokens, b.tokens)
    assert np.array_equal(a.trace.maker, b.trace.maker)


@pytest.mark.kernels
def test_batch_invariance_image_matches_single_run(mar_pair):
    target, draft = mar_pair
    batch = speculative_generate(target, draft, [1, 2, 3], [10, 11, 12], SAMPLING, CSDConfig(gamma=2))
    for i, (label, seed) in enumerate(zip([1, 2, 3], [10, 11, 12], strict=True)):
        alone = speculative_generate(target, draft, [label], [seed], SAMPLING, CSDConfig(gamma=2))
        assert_same64(batch.tokens[i], alone.tokens[0], f"image {i}")
        assert np.array_equal(batch.trace.maker[i], alone.trace.maker[0])
    base = generate(target, [1, 2, 3], [10, 11, 12], SAMPLING)
    for i in range(3):
        assert_same64(base.tokens[i], generate(target, [i + 1], [10 + i], SAMPLING).tokens[0], f"image {i}")


@pytest.mark.kernels
def test_draft_equal_to_target_reproduces_target_only_generation(mar_pair):
    # Same orders and noise as the baseline: with q = p and gamma = 1 (the target verifies with the
    # draft's context) every token is accepted and equals the target-only token.
    target, _ = mar_pair
    base = generate(target, [0, 5], [3, 4], SAMPLING)
    spec = speculative_generate(target, target, [0, 5], [3, 4], SAMPLING, CSDConfig(gamma=1, prefill=0.0))
    assert_same64(spec.tokens, base.tokens)
    assert spec.trace.acceptance_rate == 1.0


def test_block_verification_sees_stale_context_even_when_draft_equals_target(mar_pair):
    # With gamma > 1 the target conditions every drafted token on the context before the block, while
    # the draft saw its own earlier tokens of the block: only the first step of each block is certain.
    target, _ = mar_pair
    spec = speculative_generate(target, target, [0, 5], [3, 4], SAMPLING, CSDConfig(gamma=3, prefill=0.0))
    tr = spec.trace
    first_step_of_block = np.isin(tr.ar_step, [0, 3])
    assert (tr.maker[first_step_of_block] == Maker.ACCEPTED).all()
    assert tr.acceptance_rate < 1.0


@pytest.mark.kernels
def test_prefill_makes_the_first_tokens_with_the_target(mar_pair):
    target, draft = mar_pair
    rho = 0.25
    out = speculative_generate(target, draft, [1, 2], [5, 6], SAMPLING, CSDConfig(gamma=2, prefill=rho))
    base = generate(target, [1, 2], [5, 6], SAMPLING)
    tr = out.trace
    n = target.seq_len
    pre = tr.maker == Maker.PREFILL
    assert pre.sum(1).min() >= math.ceil(rho * n)
    # Pre-filled tokens are exactly the first AR steps, made as in target-only generation.
    last_prefill_step = tr.ar_step[pre].max()
    assert np.all(tr.ar_step[~pre] > last_prefill_step)
    assert_same64(out.tokens[torch.from_numpy(pre)], base.tokens[torch.from_numpy(pre)])


def test_trace_counts_add_up_and_passes_follow_block_structure(mar_pair):
    target, draft = mar_pair
    gamma = 2
    out = speculative_generate(target, draft, [1, 2, 3], [0, 1, 2], SAMPLING, CSDConfig(gamma=gamma, prefill=0.0))
    tr, s = out.trace, out.trace.summary()
    assert s["prefill"] + s["accepted"] + s["resampled"] + s["capped"] == 3 * target.seq_len
    assert (tr.maker >= 0).all() and (tr.ar_step >= 0).all()
    assert tr.draft_passes == SAMPLING.num_steps
    assert tr.target_passes == math.ceil(SAMPLING.num_steps / gamma)
    verified = tr.verified
    assert np.isfinite(tr.accept_prob[verified]).all() and np.isnan(tr.accept_prob[~verified]).all()
    assert (tr.resample_tries[tr.maker == Maker.RESAMPLED] >= 1).all()
    assert (tr.resample_tries[tr.maker == Maker.ACCEPTED] == 0).all()


@pytest.mark.kernels
@pytest.mark.parametrize("criterion", ["aligned", "exact"])
@pytest.mark.parametrize("align", [True, False])
def test_every_criterion_and_alignment_makes_every_token_and_keeps_the_target_only_prefill(mar_pair, criterion, align):
    target, draft = mar_pair
    csd = CSDConfig.from_knobs(gamma=3, prefill=0.2, criterion=criterion, align=align, counterfactual=True)
    out = speculative_generate(target, draft, [0, 1], [0, 1], SAMPLING, csd)
    tr, base = out.trace, generate(target, [0, 1], [0, 1], SAMPLING)
    assert (tr.maker >= 0).all() and torch.isfinite(out.tokens).all()  # every token made, once
    made = sum(tr.count(m) for m in (Maker.PREFILL, Maker.ACCEPTED, Maker.RESAMPLED, Maker.CAPPED))
    assert made == 2 * target.seq_len and tr.count(Maker.PREFILL) > 0
    prefill = torch.from_numpy(tr.maker == Maker.PREFILL)
    assert_same64(out.tokens[prefill], base.tokens[prefill], "pre-fill")  # the same orders and noise as target-only
    drafted = torch.from_numpy(tr.maker != Maker.PREFILL)
    assert_differ64(out.tokens[drafted], base.tokens[drafted], "drafted")  # the draft's tokens are not the target's
    for distance in (tr.distance_aligned, tr.distance_independent):  # both noise choices recorded (counterfactual)
        assert np.isfinite(distance[tr.verified]).all() and (distance[tr.verified] > 0).all()


def test_cap_hit_takes_target_sample_and_is_recorded(mar_pair):
    # widening the resampling Gaussians hugely makes p and q overlap almost fully: tries exceed a cap of 1.
    target, draft = mar_pair
    out = speculative_generate(
        target,
        draft,
        [1, 2],
        [0, 1],
        SAMPLING,
        CSDConfig.from_knobs(gamma=2, tau_v=1.0, resample_widening=1e4, max_tries=1, trajectory_term="none"),
    )
    tr = out.trace
    assert tr.count(Maker.CAPPED) > 0
    assert (tr.resample_tries[tr.maker == Maker.CAPPED] == 1).all()


def test_bfloat16_backbone_keeps_heads_in_float32_and_stays_close(mar_pair32):
    target, draft = mar_pair32
    cfg16 = SamplingConfig(num_steps=6, cfg_scale=2.0, precision="bfloat16")
    a = generate(target, [1], [0], SamplingConfig(num_steps=6, cfg_scale=2.0))
    b = generate(target, [1], [0], cfg16)
    assert b.tokens.dtype == torch.float32
    assert (a.tokens - b.tokens).abs().mean() < 0.1
    out = speculative_generate(target, draft, [1], [0], cfg16, CSDConfig(gamma=2))
    assert torch.isfinite(out.tokens).all()


@pytest.mark.kernels
def test_gamma_schedule_sets_the_first_blocks_and_a_uniform_one_equals_constant_gamma(mar_pair):
    target, draft = mar_pair
    labels, seeds = [1, 2], [3, 4]
    const = speculative_generate(target, draft, labels, seeds, SAMPLING, CSDConfig(gamma=2, prefill=0.0))
    uniform = speculative_generate(
        target, draft, labels, seeds, SAMPLING, CSDConfig(gamma=5, gamma_schedule=(2, 2, 2), prefill=0.0)
    )
    assert_same64(const.tokens, uniform.tokens)
    assert np.array_equal(const.trace.maker, uniform.trace.maker)

    # Blocks of 1 and 2 steps, then gamma = 3: AR steps {0}, {1, 2}, {3, 4, 5}.
    growing = speculative_generate(
        target, draft, labels, seeds, SAMPLING, CSDConfig(gamma=3, gamma_schedule=[1, 2], prefill=0.0)
    )
    tr = growing.trace
    block_of_step = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2}
    assert all(tr.block[i, k] == block_of_step[tr.ar_step[i, k]] for i in range(2) for k in range(target.seq_len))
    assert tr.target_passes == 3 and tr.draft_passes == SAMPLING.num_steps
    assert growing.trace.settings["csd"]["gamma_schedule"] == (1, 2)
    assert_differ64(growing.tokens, const.tokens, "another schedule")


@pytest.mark.parametrize("schedule", [(2, 0), (2, True), (1.5,), 3])
def test_bad_gamma_schedule_is_refused_by_name(schedule):
    with pytest.raises(ValueError, match="gamma_schedule"):
        CSDConfig(gamma_schedule=schedule)
