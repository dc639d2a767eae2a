"""The published code's test (criterion "published", issue 53): what MarkXCloud/CSpD's
``DistributionProcessor`` computes, against a hand transcription of its formulas on random Gaussians in
float64; its float32 products underflow past a few dozen small scales (0 / 0: every token rejected), its
float64 ones accept everything a target drafting for itself proposes at gamma 1; its resampler proposes from
the target's final Gaussian and leaves a token never accepted at zero, labelled in the trace and on the map."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from csd.acceptance import (
    Proposal,
    PublishedCriterion,
    criterion_of,
    published_keep,
    published_ratio,
)
from csd.config import CSDConfig
from csd.core.chain import Trajectory
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, random_pair64, sampling64
from visualize.images import MAKER_STYLE, token_map


def _trajectory(g: torch.Generator, steps: int, n: int, d: int, scale: float) -> Trajectory:
    mean = torch.randn(steps, n, d, generator=g, dtype=torch.float64)
    std = scale * (torch.rand(steps, n, d, generator=g, dtype=torch.float64) + 0.5)
    return Trajectory(
        x=mean[-1] + std[-1] * torch.randn(n, d, generator=g, dtype=torch.float64), states=mean, mean=mean, std=std
    )


def _by_hand(x, q: Trajectory, p: Trajectory, i: int, tau: float, scale: str) -> float:
    """The published test for token i, one float at a time: prod over dims of the target's widened density
    shape over the draft's, times exp(sum (log s_p - log s_q) over the stochastic steps and dims), times the
    draft's product of final scales over the target's."""
    s = (lambda t: t.final_std[i]) if scale == "std" else (lambda t: t.final_std[i] ** 2)
    sp, sq = s(p).tolist(), s(q).tolist()
    mp, mq, xi = p.final_mean[i].tolist(), q.final_mean[i].tolist(), x[i].tolist()
    d = len(xi)
    p_un = math.exp(-0.5 * sum(((xi[j] - mp[j]) / sp[j] / tau) ** 2 for j in range(d)))
    q_un = math.exp(-0.5 * sum(((xi[j] - mq[j]) / sq[j] / tau) ** 2 for j in range(d)))
    steps = p.std.shape[0] - 1
    fixed = math.exp(
        sum(math.log(p.std[k, i, j].item()) - math.log(q.std[k, i, j].item()) for k in range(steps) for j in range(d))
    )
    return p_un * fixed * math.prod(sq) / (q_un * math.prod(sp))


@pytest.mark.parametrize("scale", ["std", "variance"])
def test_the_ratio_is_a_hand_transcription_of_the_published_formula(scale):
    g = torch.Generator().manual_seed(0)
    q, p = _trajectory(g, 5, 4, 3, 0.3), _trajectory(g, 5, 4, 3, 0.3)
    ratio = published_ratio(q.x, q, p, 42.0, torch.float64, scale)
    for i in range(4):
        assert ratio[i].item() == pytest.approx(_by_hand(q.x, q, p, i, 42.0, scale), rel=1e-10)


def test_in_float64_with_stds_it_is_the_aligned_test_with_the_published_sign():
    """The published formula is the project's aligned test (published sign, tau_v 42) written as products."""
    g = torch.Generator().manual_seed(1)
    q, p = _trajectory(g, 6, 5, 4, 0.2), _trajectory(g, 6, 5, 4, 0.2)
    verdict, _ = criterion_of(CSDConfig.from_knobs(criterion="published", product_precision="float64")).verdict(
        Proposal(q, p, None, None)
    )
    aligned, _ = criterion_of(CSDConfig.from_knobs(trajectory_term="published")).verdict(Proposal(q, p, None, None))
    torch.testing.assert_close(verdict.log_ratio, aligned.log_ratio, rtol=1e-10, atol=1e-10)


def test_float32_products_of_48_small_scales_underflow_to_nan_and_reject_every_token():
    """The embedded pair's 48-dim tokens at a final std of 0.08: 0.08^48 = 2e-53 is 0 in float32, 0 / 0 NaN."""
    g = torch.Generator().manual_seed(2)
    q = _trajectory(g, 4, 6, 48, 0.08)
    p = Trajectory(q.x.clone(), q.states, q.mean.clone(), q.std.clone())  # identical draft and target
    proposal = Proposal(q, p, None, None)
    for precision, accepted in (("float32", False), ("float64", True)):
        criterion = criterion_of(CSDConfig.from_knobs(criterion="published", product_precision=precision))
        verdict, _ = criterion.verdict(proposal)
        u = torch.full((6,), 0.999, dtype=torch.float64)
        assert bool((torch.log(u) < verdict.log_ratio).all()) is accepted, precision
        if not accepted:
            assert torch.isnan(verdict.log_ratio).all()


def test_the_resampler_keeps_a_proposal_with_probability_max_0_p_minus_q_over_fixed_over_p():
    cand = torch.tensor([[[0.1, -0.2], [1.5, 0.3]]], dtype=torch.float64)  # (m=1, k=2, d=2)
    mp, sp = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64), torch.tensor([[[1.0, 0.5]]], dtype=torch.float64)
    mq, sq = torch.tensor([[[1.0, 0.2]]], dtype=torch.float64), torch.tensor([[[0.7, 0.4]]], dtype=torch.float64)
    fixed = torch.tensor([[2.0]], dtype=torch.float64)
    keep = published_keep(cand, (mp, sp), (mq, sq), fixed)

    def pdf(x, m, s):
        return math.prod(
            math.exp(-0.5 * ((xi - mi) / si) ** 2) / math.sqrt(2 * math.pi) / si
            for xi, mi, si in zip(x, m, s, strict=True)
        )

    for k in range(2):
        x = cand[0, k].tolist()
        p_x, q_x = pdf(x, [0.0, 0.0], [1.0, 0.5]), pdf(x, [1.0, 0.2], [0.7, 0.4])
        assert keep[0, k].item() == pytest.approx(max(0.0, p_x - q_x / 2.0) / p_x, rel=1e-10)


def test_a_target_drafting_for_itself_at_gamma_1_is_accepted_everywhere_in_float64_and_nowhere_in_float32():
    pair = random_pair64()
    s = sampling64(num_steps=8, cfg_scale=2.0, head_steps=5)
    for precision, rate in (("float64", 1.0), ("float32", 0.0)):
        csd = CSDConfig.from_knobs(gamma=1, prefill=0.0, criterion="published", product_precision=precision)
        run = speculative_generate(pair.target, pair.target, [1, 2], [3, 4], s, csd)
        assert run.trace.acceptance_rate == rate, precision
    zeroed = run.trace.maker == Maker.ZEROED
    assert zeroed.sum() == run.trace.verified.sum() and not run.tokens[torch.from_numpy(zeroed)].any()
    assert run.trace.summary()["zeroed"] == int(zeroed.sum())


@pytest.mark.kernels  # compares float64 runs within the float64 bound
def test_a_token_never_accepted_is_zero_under_the_published_fallback_and_the_targets_sample_otherwise():
    pair = random_pair64()
    s = sampling64(num_steps=8, cfg_scale=2.0, head_steps=5)
    runs = {}
    for fallback in ("zero", "target"):
        csd = CSDConfig.from_knobs(
            gamma=3, criterion="published", product_precision="float32", fallback=fallback, max_tries=3
        )
        runs[fallback] = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, csd, keep_details=True)
    zero, target = runs["zero"].trace, runs["target"].trace
    assert (zero.maker == Maker.ZEROED).any() and not (target.maker == Maker.ZEROED).any()
    assert np.array_equal(zero.maker == Maker.ZEROED, target.maker == Maker.CAPPED)  # the same tokens capped
    capped = torch.from_numpy(target.maker == Maker.CAPPED)
    assert not runs["zero"].tokens[capped].any()
    assert_same64(runs["target"].tokens[capped], torch.from_numpy(target.details.target_tokens)[capped])


def test_the_token_map_names_a_token_left_at_zero():
    label, colour = MAKER_STYLE[Maker.ZEROED]
    assert "zero" in label and "published" in label
    images = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    maker = np.full((1, 64), int(Maker.ZEROED), dtype=np.int8)
    tile = token_map(images, maker)
    assert tuple(tile[tile.shape[0] // 2, tile.shape[1] // 2 + 3]) == colour


def test_published_knobs_are_checked_by_name():
    with pytest.raises(ValueError, match="product_precision must be one of"):
        CSDConfig.from_knobs(criterion="published", product_precision="float16")
    with pytest.raises(ValueError, match="fallback must be one of"):
        CSDConfig.from_knobs(fallback="nan")
    assert CSDConfig.from_knobs(criterion="published").cap_fallback == "zero" and CSDConfig().cap_fallback == "target"
    assert isinstance(criterion_of(CSDConfig.from_knobs(criterion="published")), PublishedCriterion)
