"""CSD on a causal family (NextStep-1's layout, csd/models/nextstep): the target verifies a drafted block in one
cached pass, each drafted token given the drafted ones before it; under the exact block a block is committed
through its first rejection, the cache rewound to the tokens accepted before it, and a wholly accepted block is
followed by the target's next token from the same pass (``Maker.NEXT``: no pass of its own).

Logic in float64 (the exact reference, tests/helpers.py); the law of the tokens by a two-sample test on a pair
whose draft is detectably off the target, with the exact criterion (whose tokens follow the target's law)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy import stats

from csd.config import CSDConfig, SamplingConfig
from csd.core.precision import at_precision
from csd.models.nextstep import NextStep, NextStepState
from csd.models.registry import FAMILIES
from csd.sampling import generate
from csd.shapes.text import caption_tokenizer
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, random_pair64, sampling64

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.kernels]

PROMPTS, SEEDS = ["a red circle", "a small blue square on a plain white background"], [3, 4]
SAMPLING = dict(num_steps=16, cfg_scale=2.0, cfg_schedule="constant", head_steps=4)


def run(draft: str = "draft", **csd):
    pair = random_pair64("nextstep")
    model = pair.target if draft == "target" else pair.draft
    s = sampling64(**SAMPLING)
    return speculative_generate(pair.target, model, PROMPTS, SEEDS, s, CSDConfig.from_knobs(**csd)), pair, s


@pytest.mark.parametrize("block", ["published", "exact"])
def test_a_target_drafting_for_itself_accepts_every_token_and_makes_target_onlys(block):
    """Verification reads each drafted token in context: even the published block accepts them all."""
    spec, pair, s = run("target", gamma=4, prefill=0.05, block=block)
    trace = spec.trace
    assert trace.acceptance_rate == 1.0 and trace.count(Maker.RESAMPLED) == trace.count(Maker.CAPPED) == 0
    assert_same64(spec.tokens, generate(pair.target, PROMPTS, SEEDS, s).tokens, block)


def test_under_the_exact_block_a_wholly_accepted_block_is_followed_by_the_targets_next_token_without_a_pass():
    spec, _, _ = run("target", gamma=4, prefill=0.05, block="exact")
    trace, n = spec.trace, 16
    prefilled = trace.count(Maker.PREFILL) // len(SEEDS)  # 1 step: 5% of 16 tokens, rounded up
    blocks = len(trace.block_steps)
    assert all(kept == drafted == 4 for kept, drafted in trace.block_steps)
    assert trace.count(Maker.NEXT) == blocks * len(SEEDS)  # one after each block, in every image
    assert prefilled + 5 * blocks == n  # each pass commits gamma + 1 tokens
    assert trace.target_passes == prefilled + blocks  # the next tokens cost no pass
    assert trace.target_passes / n < 0.3
    nxt = trace.maker[0] == Maker.NEXT
    assert (np.flatnonzero(nxt) == prefilled + 4 + 5 * np.arange(blocks)).all()  # each right after its block


def test_the_published_block_keeps_no_next_token():
    spec, _, _ = run("target", gamma=4, prefill=0.05)
    assert spec.trace.count(Maker.NEXT) == 0


def test_rewinding_to_the_accepted_tokens_equals_reading_every_token_again(monkeypatch):
    """With the untrained draft (rejections at every depth), the cache kept through a block's accepted tokens
    and the next tokens gives the tokens of a run whose states forget every image token after each block."""
    kept, _, _ = run(gamma=4, block="exact")
    assert kept.trace.count(Maker.RESAMPLED) > 0 and kept.trace.count(Maker.ACCEPTED) > 0
    monkeypatch.setattr(NextStepState, "rewind", lambda self, known: setattr(self, "length", 0))
    again, _, _ = run(gamma=4, block="exact")
    assert_same64(kept.tokens, again.tokens, "cache kept vs read again")
    np.testing.assert_array_equal(kept.trace.maker, again.trace.maker)


def _shifted_pair():
    """The untrained 4 x 4-token target and a draft that is the target with its head's velocity shifted by 0.15 in every
    value: its tokens' law is detectably off, and a fair share of its tokens are still accepted."""
    config = FAMILIES["nextstep"].presets["random_nextstep_target"]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        target = NextStep(config, caption_tokenizer()).eval()
        for p in target.parameters():
            p.add_(0.05 * torch.randn_like(p))
        draft = copy.deepcopy(target)
        draft.image_head.net.final_layer.linear.bias.add_(0.15)
    return target, draft


def test_with_the_exact_criterion_the_tokens_follow_the_targets_law_at_gamma_4():
    """Two-sample KS tests (fixed seeds) of three tokens' mean values: the exact block at gamma 4 against target-only,
    p > 0.001 each; the power check, draft-only against target-only, p < 1e-6. (A batch shares its commit point,
    so this one rarely accepts a whole block: the next token's law is the target's own, shown exactly above.)"""
    target, draft = _shifted_pair()
    n, s = 400, SamplingConfig.from_knobs(num_steps=16, cfg_scale=2.0, cfg_schedule="constant", head_steps=4)
    prompts = [PROMPTS[0]] * n
    base = generate(target, prompts, range(n), s).tokens
    alone = generate(draft, prompts, range(n, 2 * n), s).tokens
    csd = CSDConfig.from_knobs(gamma=4, prefill=0.0, block="exact", criterion="exact")
    spec = speculative_generate(target, draft, prompts, range(2 * n, 3 * n), s, csd)
    assert spec.trace.count(Maker.RESAMPLED) > 0 and spec.trace.count(Maker.ACCEPTED) > 0
    assert any(kept < drafted for kept, drafted in spec.trace.block_steps)
    for pos in (1, 7, 14):  # a token's mean value: the draft's shift shows in every one of its values
        mean = lambda tokens, pos=pos: tokens[:, pos].mean(-1)
        assert stats.ks_2samp(mean(base), mean(spec.tokens)).pvalue > 1e-3, pos
        assert stats.ks_2samp(mean(base), mean(alone)).pvalue < 1e-6, pos


def test_a_float64_copy_keeps_the_family():
    pair = random_pair64("nextstep")
    assert isinstance(at_precision(pair.target, "float64"), NextStep)
