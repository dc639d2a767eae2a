"""GtR (Generation then Reconstruction) for the masked families: its checkerboard stages, plan and head steps
against hand-computed values, FTS's frequency score and detail chains, a setting that skips nothing equal
to plain generation, and its composition with CSD. Runs of the untrained pair are compared in float64 (the
exact reference: equal up to float64 rounding on every CPU, tests/helpers.py)."""

import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise, HeadChain, HeadCondition
from csd.core.schedule import step_sizes
from csd.family import FamilyTraits
from csd.models.mar.gtr import (
    DetailChains,
    detail_rows,
    frequency_score,
    grid_side,
    gtr_plan,
    gtr_sizes,
    stage_of,
    stage_orders,
)
from csd.run_setup import check_settings
from csd.sampling import generate
from csd.speculative import speculative_generate
from tests.helpers import LinearGaussianChain, assert_same64, random_pair64, sampling64

# v = i + j on a 4 x 4 grid:  0 1 2 3 / 1 2 3 4 / 2 3 4 5 / 3 4 5 6
STAGES_4x4_K3 = [[0, 2, 1, 2], [2, 1, 2, 0], [1, 2, 0, 2], [2, 0, 2, 1]]  # odd: 2; v = 2, 6: 1; v = 0, 4: 0


def test_the_stages_are_the_checkerboard_and_its_recursive_bisection():
    pos = torch.arange(16)
    assert stage_of(pos, 4, 3).reshape(4, 4).tolist() == STAGES_4x4_K3
    assert stage_of(pos, 4, 2).reshape(4, 4).tolist() == [[(i + j) % 2 for j in range(4)] for i in range(4)]
    assert stage_of(pos, 4, 1).eq(0).all()
    # 8 x 8, four stages: v = 0, 8 (8 cells), v = 4, 12 (8), v = 2 mod 4 (16), odd (32)
    assert torch.bincount(stage_of(torch.arange(64), 8, 4)).tolist() == [8, 8, 16, 32]
    assert grid_side(64) == 8
    with pytest.raises(ValueError, match="GtR needs a square token grid, got 48 tokens"):
        grid_side(48)


def test_orders_put_stage_0_last_each_stage_in_the_random_orders_sequence():
    stage = torch.tensor([0, 1, 1, 0, 1, 0])
    perm = torch.tensor([[5, 1, 0, 2, 4, 3]])
    # stage 1 entries of perm in perm's order (1, 2, 4), then stage 0's (5, 0, 3): the plan takes the tail first
    assert stage_orders(perm, stage, 2).tolist() == [[1, 2, 4, 5, 0, 3]]
    assert torch.equal(stage_orders(perm, torch.zeros(6, dtype=torch.long), 1), perm)


def test_each_stage_runs_the_cosine_schedule_over_its_own_tokens():
    # 4 tokens in 2 steps: floor(4 cos(pi / 4)) = 2 stay masked after the first
    assert gtr_sizes([4, 4, 8], [2, 1, 2]) == [2, 2, 4, 3, 5] == step_sizes(4, 2) + [4] + step_sizes(8, 2)
    with pytest.raises(ValueError, match="a stage of 4 tokens takes at most 4 AR steps, got 5"):
        gtr_sizes([4, 4], [5, 1])


def test_the_plan_makes_each_stage_in_turn_in_the_images_random_order():
    s = SamplingConfig.from_knobs(num_steps=7, cfg_scale=3.0, gtr_stages=(4, 2, 1))
    plan = gtr_plan([3, 4], 64, s, "cpu")
    assert plan.sizes == step_sizes(16, 4) + step_sizes(16, 2) + [32]
    stage = stage_of(torch.arange(64), 8, 3)
    made = [stage[plan.positions(k)] for k in range(7)]
    assert [int(m.unique().item()) for m in made] == [0, 0, 0, 0, 1, 1, 2]
    assert sorted(torch.cat([plan.positions(k) for k in range(7)], dim=1)[0].tolist()) == list(range(64))
    mar = gtr_plan([3, 4], 64, SamplingConfig.from_knobs(num_steps=7, gtr_stages=(7,)), "cpu")
    first = mar.orders[0].tolist()  # the random order of image 0 (seed 3)
    stage0 = [p for p in first if stage[p] == 0]
    assert plan.orders[0, -16:].tolist() == stage0  # stage 0 in that order, taken first
    assert plan.cfg[-1] == pytest.approx(1.0 + 2.0 * 63 / 64)  # MAR's linear ramp over the tokens made


def test_the_head_steps_fall_over_the_generation_stages_then_hold_for_the_reconstruction():
    s = SamplingConfig.from_knobs(num_steps=7, gtr_stages=(4, 2, 1), head_steps_min=4, gtr_head_steps=3)
    assert s.head_steps_per_step(10) == [10, 9, 8, 6, 5, 4, 3]  # round(10 - 6 s / 5) over 6 steps, then 3
    fts = s.with_knobs(**{"gtr_detail_fraction": 0.1, "gtr_detail_steps": 12})
    assert fts.head_steps_per_step(10)[-1] == 12  # the detail tokens' chain length; the others run 3
    assert SamplingConfig.from_knobs(num_steps=7, gtr_stages=(4, 2, 1)).head_steps_per_step(10) == [10] * 7


def test_the_frequency_score_weights_the_dft_amplitudes_by_frequency():
    z = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, -1.0, 1.0, -1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, -1.0]])
    # D = 4: n = 1, 2 with weights 1.5 and 2. An impulse: |X_n| = 1; alternating: X_2 = 4; constant: X_0 only;
    # (0, 1, 0, -1): X_1 = -2i
    torch.testing.assert_close(frequency_score(z), torch.tensor([3.5, 8.0, 0.0, 3.0]))


def test_fts_picks_the_top_share_of_each_images_rows():
    score = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.7, 0.6, 0.0, 0.4])  # 2 images of 5 rows
    assert detail_rows(score, 2, 0.4).tolist() == [False, True, False, False, True] + [False, True, True, False, False]
    assert detail_rows(score, 2, 0.01).sum() == 2  # at least one per image
    assert detail_rows(score, 1, 1.0).all()


def test_detail_chains_run_the_long_chain_for_detail_rows_and_the_short_one_on_its_own_noise():
    long_chain = LinearGaussianChain([0.9, 0.8, 0.7, 0.6], [0.1, 0.0, -0.1, 0.2], [0.5, 0.4, 0.3, 0.2], 2)
    short_chain = LinearGaussianChain([0.5, 0.4], [0.3, 0.1], [0.6, 0.1], 2)
    cond = HeadCondition(torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]))
    long, short = HeadChain(long_chain, cond), HeadChain(short_chain, cond)
    detail = torch.tensor([False, True, False])
    g = torch.Generator().manual_seed(0)
    noise = ChainNoise(torch.randn(3, 2, generator=g), torch.randn(3, 3, 2, generator=g))
    chains = DetailChains(long, short, detail)
    traj = chains.run(noise)
    torch.testing.assert_close(traj.x[1], long.run(noise).x[1])
    short_alone = short.run(ChainNoise(noise.xi, noise.eps[:1]))  # xi and the first eps: as without FTS
    torch.testing.assert_close(traj.x[[0, 2]], short_alone.x[[0, 2]])
    assert traj.states.shape == (4, 3, 2) and torch.isnan(traj.mean[2:, [0, 2]]).all()
    assert torch.equal(traj.states[3, [0, 2]], traj.x[[0, 2]])  # a short row's token waits
    mean, std = chains.evaluate(traj.states)
    torch.testing.assert_close(mean[:2, [0, 2]], short_alone.mean[:, [0, 2]])
    torch.testing.assert_close(std[:, 1], traj.std[:, 1])
    assert chains.select(torch.tensor([1])).run(noise.select(torch.tensor([1]))).x.shape == (1, 2)


@pytest.fixture(scope="module")
def pair(one_thread):
    """64 tokens (8 x 8), head 10 steps, in float64."""
    return random_pair64()


@pytest.mark.kernels
def test_one_gtr_stage_of_every_token_is_plain_generation(pair):
    plain = sampling64(num_steps=6, cfg_scale=2.0, head_steps=5)
    one = sampling64(num_steps=6, cfg_scale=2.0, head_steps=5, gtr_stages=(6,))
    assert_same64(
        generate(pair.target, [1, 2], [3, 4], one).tokens, generate(pair.target, [1, 2], [3, 4], plain).tokens
    )
    csd = CSDConfig(gamma=3)
    a = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], one, csd)
    b = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], plain, csd)
    assert_same64(a.tokens, b.tokens)
    assert (a.trace.maker == b.trace.maker).all()


@pytest.mark.kernels
def test_gtr_runs_its_stage_head_steps_and_fts_alone(pair):
    calls = []
    chain = pair.target.head.chain
    pair.target.head.chain = lambda steps=None, *rest, **kw: calls.append(steps) or chain(steps, *rest, **kw)
    try:
        s = sampling64(
            num_steps=6, cfg_scale=2.0, head_steps=8, head_steps_min=4, gtr_stages=(3, 2, 1), gtr_head_steps=3
        )
        out = generate(pair.target, [1, 2], [3, 4], s)
        assert calls[-6:] == [8, 7, 6, 5, 4, 3]
        calls.clear()
        fts = s.with_knobs(**{"gtr_detail_fraction": 0.25, "gtr_detail_steps": 9})
        detailed = generate(pair.target, [1, 2], [3, 4], fts)
        assert calls[-7:] == [8, 7, 6, 5, 4, 9, 3]  # the last step: the detail chain and the others'
    finally:
        pair.target.head.chain = chain
    last = torch.from_numpy(out.trace.ar_step == 5)  # the reconstruction step: 32 odd cells per image
    assert int(last.sum()) == 64
    gap = (detailed.tokens - out.tokens).norm(dim=-1)  # (B, N): FTS changes its detail tokens only
    changed = gap > 1e-3
    assert float(gap[~changed].max()) < 1e-9 and float(gap[changed].min()) > 1e-2  # no token near the line
    assert int(changed.sum()) == 2 * 8 and bool(last[changed].all())  # round(0.25 * 32) per image
    alone = generate(pair.target, [2], [4], fts)
    assert_same64(alone.tokens, detailed.tokens[1:])


@pytest.mark.kernels
def test_gtr_composes_with_csd_but_fts_does_not(pair):
    s = sampling64(num_steps=6, cfg_scale=2.0, head_steps=6, gtr_stages=(3, 2, 1), gtr_head_steps=3)
    csd = CSDConfig(gamma=2)
    out = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, csd)
    plan = pair.target.plan([3, 4], s, "cpu")  # the seeds
    made = torch.from_numpy(out.trace.ar_step)
    for k in range(6):  # draft and target follow GtR's plan
        assert bool((made.gather(1, plan.positions(k)) == k).all())
    alone = speculative_generate(pair.target, pair.draft, [2], [4], s, csd)
    assert_same64(alone.tokens, out.tokens[1:])
    assert (alone.trace.maker == out.trace.maker[1:]).all()
    fts = s.with_knobs(**{"gtr_detail_fraction": 0.1, "gtr_detail_steps": 9})
    with pytest.raises(ValueError, match=r"gtr_detail_fraction \(GtR's FTS\) must be 0 under CSD"):
        speculative_generate(pair.target, pair.draft, [1], [2], fts, csd)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gtr_stages": (3, 2)}, r"must add up to num_steps 6, got \(3, 2\) = 5"),
        ({"gtr_stages": (6,), "gtr_head_steps": 3}, "gtr_head_steps needs gtr_stages of 2 stages or more"),
        (
            {"gtr_stages": (3, 3), "gtr_detail_fraction": 0.1},
            "gtr_detail_fraction > 0 and gtr_detail_steps go together",
        ),
        (
            {"gtr_stages": (3, 3), "gtr_head_steps": 5, "gtr_detail_fraction": 0.1, "gtr_detail_steps": 4},
            "gtr_detail_steps must exceed gtr_head_steps",
        ),
        (
            {"gtr_stages": (3, 3), "gtr_detail_fraction": 1.5},
            r"gtr_detail_fraction \(FTS: share of reconstruction tokens\) must be in",
        ),
        ({"gtr_stages": (3, 0, 3)}, r"gtr_stages \(AR steps of each GtR stage\) must be a sequence of ints >= 1"),
    ],
)
def test_bad_gtr_settings_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        check_settings(
            FamilyTraits("MAR", num_classes=10, takes_gtr=True), 64, SamplingConfig.from_knobs(num_steps=6, **change)
        )


def test_a_stage_of_more_steps_than_tokens_is_refused_when_planned(pair):
    s = sampling64(num_steps=20, gtr_stages=(17, 2, 1))  # stage 0 of an 8 x 8 grid holds 16 tokens
    with pytest.raises(ValueError, match="a stage of 16 tokens takes at most 16 AR steps, got 17"):
        generate(pair.target, [1], [2], s)
