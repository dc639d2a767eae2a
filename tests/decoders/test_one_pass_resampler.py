"""The one-pass resampler (criterion setting ``resampler="one_pass"``, aligned and published criteria): every row of
a block draws ``max_tries`` proposals and uniforms at once, from its image's stream in a fixed count, and a
rejected row takes its first kept proposal. From the same numbers it picks what the rounds pick; from its own
numbers its tokens and tries follow the same law; the loop then reads nothing on the host, and an image's
tokens do not depend on the batch. It is the default on a CUDA device (``"auto"``); on the CPU the default stays
the rounds: tests/decoders/test_same_tokens.py holds their golden tokens."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from csd.acceptance import AlignedCriterion, Proposal, PublishedCriterion, criterion_of
from csd.cli import add_config_flags, config_from_args
from csd.config import CSDConfig
from csd.core.chain import Trajectory
from csd.core.checks import SettingError
from csd.core.host_reads import reads_per_step
from csd.core.resample import resample_gaussian
from csd.models.registry import FAMILIES
from csd.settings import Aligned, Published
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_differ64, assert_same64, random_pair64, sampling64

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64


class Served:
    """Pre-drawn normals (n, K, d) and uniforms (n, K) served to a resampler: each row's tries in order,
    whether it asks in rounds (``pending``: the rows still waiting, all at the same try) or in one pass
    (``pending`` None: every row's first ``k``)."""

    def __init__(self, normal: torch.Tensor, uniform: torch.Tensor):
        self.tables, self.used = {"normal": normal, "uniform": uniform}, {"normal": 0, "uniform": 0}

    def _serve(self, name: str, pending, k: int) -> torch.Tensor:
        start = self.used[name]
        self.used[name] += k
        table = self.tables[name] if pending is None else self.tables[name][pending]
        return table[:, start : start + k]

    def normal(self, pending, k: int, d: int | None = None) -> torch.Tensor:
        return self._serve("normal", pending, k)

    def uniform(self, pending, k: int) -> torch.Tensor:
        return self._serve("uniform", pending, k)

    def pairs(self):
        """As resample_gaussian's ``draws(k, pending)``."""
        return lambda k, pending: (self.normal(pending, k), self.uniform(pending, k))


def _numbers(seed: int, n: int, tries: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, tries, d, generator=g, dtype=F64), torch.rand(n, tries, generator=g, dtype=F64)


def _assert_same_pick(rounds, one_pass) -> None:
    assert torch.equal(rounds.tries, one_pass.tries) and torch.equal(rounds.capped, one_pass.capped)
    assert torch.equal(rounds.x, one_pass.x)  # the same proposal, computed from the same numbers


# --- 1. the same numbers: the same pick ---------------------------------------------------------------------


@pytest.mark.parametrize("max_tries", [1, 6, 10])  # one try; chunks of 4 with a partial last; 4 + 4 + 2
def test_from_the_same_numbers_one_pass_picks_the_first_kept_proposal_the_rounds_pick(max_tries):
    n, d = 400, 2
    g = torch.Generator().manual_seed(0)
    mp, mq = torch.randn(n, d, generator=g, dtype=F64), torch.randn(n, d, generator=g, dtype=F64)
    sp, sq = 0.5 + torch.rand(n, d, generator=g, dtype=F64), 0.5 + torch.rand(n, d, generator=g, dtype=F64)
    log_w = torch.randn(n, generator=g, dtype=F64) * 0.3
    mq[:40], sq[:40], log_w[:40] = mp[:40], sp[:40], 0.0  # q = p: nothing is ever kept, these rows hit the cap
    fallback = torch.randn(n, d, generator=g, dtype=F64)
    normal, uniform = _numbers(1, n, max_tries, d)
    run = lambda one_pass: resample_gaussian(
        mp, sp, mq, sq, Served(normal, uniform).pairs(), fallback, max_tries, log_w, one_pass=one_pass
    )
    rounds, one_pass = run(False), run(True)
    _assert_same_pick(rounds, one_pass)
    assert one_pass.capped[:40].all() and not one_pass.capped.all()
    assert torch.equal(one_pass.x[one_pass.capped], fallback[one_pass.capped])
    assert max_tries == 1 or (one_pass.tries[~one_pass.capped] > 1).any()  # kept after the first try too


def _trajectory(g: torch.Generator, steps: int, n: int, d: int) -> Trajectory:
    mean = torch.randn(steps, n, d, generator=g, dtype=F64)
    std = 0.5 + torch.rand(steps, n, d, generator=g, dtype=F64)
    return Trajectory(x=mean[-1] + std[-1] * torch.randn(n, d, generator=g, dtype=F64), states=mean, mean=mean, std=std)


@pytest.mark.parametrize(
    "criterion",
    [
        AlignedCriterion(widening=1.5, max_tries=7),
        PublishedCriterion(tau_v=3.0, max_tries=7, dtype=F64, fallback="zero"),
        PublishedCriterion(tau_v=3.0, max_tries=7, dtype=F64, scale="variance", fallback="target"),
    ],
    ids=["aligned", "published", "published-variance"],
)
def test_each_criterion_resamples_every_row_in_one_pass_as_its_rounds_do(criterion):
    n, d = 300, 3
    g = torch.Generator().manual_seed(2)
    p = Proposal(_trajectory(g, 3, n, d), _trajectory(g, 3, n, d), None, None)
    verdict, _ = criterion.verdict(p)
    normal, uniform = _numbers(3, n, criterion.max_tries, d)
    rows = torch.arange(n)
    rounds = criterion.resample(p, verdict, rows, Served(normal, uniform))
    one_pass = replace(criterion, one_pass=True).resample(p, verdict, None, Served(normal, uniform))
    _assert_same_pick(rounds, one_pass)
    assert rounds.tries.unique().numel() > 2  # rows kept at different tries: the pick is tested


# --- 2. its own numbers: the same law -------------------------------------------------------------------------


def _dkw(n: int, delta: float) -> float:
    """The Dvoretzky-Kiefer-Wolfowitz bound (Massart's constant): P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2)
    = delta, for any distribution F (discrete ones too)."""
    return math.sqrt(math.log(2 / delta) / (2 * n))


def _sup_gap(samples: np.ndarray, cdf) -> float:
    """sup over x of |empirical CDF - cdf| for a continuous cdf."""
    x = np.sort(samples)
    f, i = cdf(x), np.arange(1, x.size + 1)
    return float(max((i / x.size - f).max(), (f - (i - 1) / x.size).max()))


P, Q, W = (0.0, 1.0), (0.8, 0.7), 0.9  # target, draft, weight of q (a trajectory term: log w = -0.105)


def _modified_cdf():
    """The CDF of max(0, p - w q) / Z by quadrature, and Z (each try's probability of being kept)."""
    grid = np.linspace(-12, 12, 240_001)
    pdf = lambda m, s: np.exp(-0.5 * ((grid - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    dens = np.maximum(0.0, pdf(*P) - W * pdf(*Q))
    cdf = np.cumsum(dens) * (grid[1] - grid[0])
    return (lambda v: np.interp(v, grid, cdf / cdf[-1])), float(cdf[-1])


@pytest.mark.parametrize("one_pass", [False, True], ids=["rounds", "one_pass"])
def test_the_resampled_token_and_its_tries_follow_the_modified_law_in_both_modes(one_pass):
    """n = 20,000 tokens of a 1-D pair, drawn from a fixed seed: their empirical CDF and that of their tries are
    each within the DKW bound at delta = 1e-6 of the analytic ones (max(0, p - w q) / Z; geometric(Z) capped
    at max_tries), so a correct sampler fails this test with probability at most 4e-6 over both modes; the
    quadrature's error (< 1e-4) is added. Plain samples of p, or tries of another law (Z off by 10%), sit
    several bounds away: the test can fail."""
    n, max_tries = 20_000, 200
    cdf, z = _modified_cdf()
    eps = _dkw(n, 1e-6) + 1e-4  # 0.0191
    g = torch.Generator().manual_seed(7 if one_pass else 8)
    col = lambda v: torch.full((n, 1), v, dtype=F64)

    def draws(k, pending):
        m = n if pending is None else int(pending.sum())
        return torch.randn(m, k, 1, generator=g, dtype=F64), torch.rand(m, k, generator=g, dtype=F64)

    log_w = torch.full((n,), math.log(W), dtype=F64)
    res = resample_gaussian(
        col(P[0]), col(P[1]), col(Q[0]), col(Q[1]), draws, col(float("nan")), max_tries, log_w, one_pass=one_pass
    )
    assert not res.capped.any()  # P(a row capped) = (1 - Z)^200 < 1e-20
    assert _sup_gap(res.x[:, 0].numpy(), cdf) < eps
    tries = np.arange(1, max_tries + 1)
    geometric = 1 - (1 - z) ** tries
    empirical = (res.tries.numpy()[:, None] <= tries).mean(0)
    assert np.abs(empirical - geometric).max() < eps
    # the power: the laws the test must tell apart are farther than the bound
    plain = lambda v: 0.5 * (1 + np.vectorize(math.erf)((v - P[0]) / (P[1] * math.sqrt(2))))
    xs = np.linspace(-5, 5, 2001)
    assert np.abs(cdf(xs) - plain(xs)).max() > 5 * eps
    assert np.abs((1 - (1 - 1.1 * z) ** tries) - geometric).max() > 2 * eps


# --- 3. in the loop: nothing read on the host ---------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    """A family's untrained pair in float64 (its draft differs from the target: rows are rejected)."""
    return random_pair64(request.param)


def _steps(pair) -> int:
    return pair.traits.fixed_num_steps or 8


def _run(pair, csd: CSDConfig, seeds=(0, 1), conditions=None, on_step=None, **knobs):
    s = sampling64(num_steps=_steps(pair), cfg_scale=2.0, head_steps=2, **knobs)
    if conditions is None:
        conditions = list(pair.prompts[: len(seeds)]) if pair.is_text else list(range(len(seeds)))
    return speculative_generate(pair.target, pair.draft, conditions, list(seeds), s, csd, on_step)


ONE_PASS = {
    "aligned": CSDConfig.from_knobs(gamma=4, resampler="one_pass"),
    "published": CSDConfig.from_knobs(gamma=4, criterion="published", resampler="one_pass"),
}
# The untrained pairs' final Gaussians barely overlap: a rejected row keeps its first proposal. Widened 1000x they
# overlap, and rows are kept at the first, second or third try, or capped. A flow head's last Gaussian is wider
# (NextStep's: sqrt(2 (1 - t) dt) at the grid's end, not a learned variance at t = 0): 100x does it there.
WIDENING = {"NextStep": 100.0}


def mixed(pair) -> CSDConfig:
    return ONE_PASS["aligned"].with_knobs(max_tries=3, resample_widening=WIDENING.get(pair.traits.family, 1e3))


@pytest.mark.parametrize("criterion", sorted(ONE_PASS))
def test_csd_with_the_one_pass_resampler_reads_nothing_back_per_ar_step(pair, criterion):
    """Gamma 4, the published block, the draft proposing rows the target rejects: the rounds read the
    rejected rows and their tries on the host, the one pass reads nothing."""
    csd, steps = ONE_PASS[criterion], _steps(pair)
    per_step, by_op = reads_per_step(lambda on_step: _run(pair, csd, on_step=on_step), steps // 2, steps)
    assert per_step == 0, by_op
    rounds = csd.with_knobs(resampler="rounds")
    assert reads_per_step(lambda on_step: _run(pair, rounds, on_step=on_step), steps // 2, steps)[0] > 0


def test_the_exact_block_with_the_one_pass_resampler_reads_only_where_the_next_block_starts(pair):
    """One read per block, by design (which step the block is committed through depends on the verdicts): one
    ``int`` of a block that commits at least one AR step."""
    csd, steps = ONE_PASS["aligned"].with_knobs(block="exact"), _steps(pair)
    per_step, by_op = reads_per_step(lambda on_step: _run(pair, csd, on_step=on_step), steps // 2, steps)
    assert set(by_op) == {"__int__"} and 0 < per_step <= 1, by_op


def test_per_token_acceptance_with_the_one_pass_resampler_reads_nothing_back_per_ar_step():
    pair = random_pair64("xar")
    csd = ONE_PASS["aligned"].with_knobs(acceptance_unit="token")
    per_step, by_op = reads_per_step(lambda on_step: _run(pair, csd, on_step=on_step), 8, 16)
    assert per_step == 0, by_op


# --- 4. batch invariance, and what the trace holds ----------------------------------------------------------


@pytest.mark.kernels
def test_an_image_makes_the_same_tokens_alone_and_in_a_batch_of_two_with_the_one_pass_resampler(pair):
    csd = mixed(pair)
    conditions = list(pair.prompts[:2]) if pair.is_text else [1, 2]
    both = _run(pair, csd, seeds=(3, 4), conditions=conditions)
    for i in range(2):
        alone = _run(pair, csd, seeds=(3 + i,), conditions=conditions[i : i + 1])
        assert_same64(alone.tokens[0], both.tokens[i], f"image {i} alone")
        assert (alone.trace.maker[0] == both.trace.maker[i]).all()
        assert (alone.trace.resample_tries[0] == both.trace.resample_tries[i]).all()
    redrawn = both.trace.resample_tries[np.isin(both.trace.maker, [Maker.RESAMPLED, Maker.CAPPED])]
    assert len(set(redrawn.tolist())) > 1  # rows kept at different tries: the resampler's draws are tested


@pytest.mark.kernels
def test_the_one_pass_resampler_draws_other_tokens_than_the_rounds_from_the_same_seeds(pair):
    one_pass = _run(pair, ONE_PASS["aligned"])
    rounds = _run(pair, ONE_PASS["aligned"].with_knobs(resampler="rounds"))
    assert_differ64(one_pass.tokens, rounds.tokens, "one pass against rounds")


def test_the_trace_holds_each_redrawn_tokens_tries_and_cap_as_the_rounds_record_them(pair):
    """A cap of 3 tries: resampled tokens took 1 to 3, capped ones 3 (then the fallback: the target's sample,
    or zero under criterion 'published', labelled ZEROED), accepted and pre-filled ones none."""
    published = ONE_PASS["published"].with_knobs(max_tries=3)  # its float32 products underflow: all zeroed
    for csd, cap in ((mixed(pair), Maker.CAPPED), (published, Maker.ZEROED)):
        trace = _run(pair, csd).trace
        tries, maker = trace.resample_tries, trace.maker
        assert set(np.unique(tries[maker == Maker.RESAMPLED]).tolist()) <= {1, 2, 3}
        assert (tries[maker == cap] == 3).all() and (maker == cap).any()
        assert (tries[np.isin(maker, [Maker.ACCEPTED, Maker.PREFILL])] == 0).all()
        assert (maker >= 0).all()  # every token made
        assert cap == Maker.ZEROED or (maker == Maker.RESAMPLED).any()


# --- the setting ------------------------------------------------------------------------------------------------


def test_the_resampler_is_a_knob_of_the_aligned_and_published_criteria_auto_by_default():
    """Its default "auto" is one pass on a CUDA device and rounds elsewhere; an explicit value wins on every device."""
    assert Aligned().resampler == Published().resampler == CSDConfig().knob_values()["resampler"] == "auto"
    assert not criterion_of(CSDConfig()).one_pass and criterion_of(CSDConfig(), device="cuda").one_pass
    assert not criterion_of(CSDConfig.from_knobs(resampler="rounds"), device="cuda").one_pass
    csd = CSDConfig.from_knobs(criterion="published", resampler="one_pass")
    assert csd.criterion == Published(resampler="one_pass") and criterion_of(csd).one_pass
    assert CSDConfig.from_knobs(**csd.knob_values()) == csd
    assert criterion_of(CSDConfig.from_knobs(resampler="one_pass", acceptance_unit="token"), 4).one_pass


def test_the_exact_criterion_refuses_the_one_pass_resampler_by_name():
    with pytest.raises(SettingError, match="resampler 'one_pass' needs criterion 'aligned' or 'published'") as e:
        CSDConfig.from_knobs(criterion="exact", resampler="one_pass")
    assert e.value.field == "resampler"
    exact = CSDConfig.from_knobs(criterion="exact")
    assert not criterion_of(exact, device="cuda").one_pass and exact.knob_values()["resampler"] == "rounds"


def test_a_run_records_the_resampler_it_ran():
    """On the CPU "auto" runs the rounds, and the trace's settings say so."""
    pair = random_pair64("mar")
    assert _run(pair, CSDConfig(gamma=4)).trace.settings["csd"]["resampler"] == "rounds"


def test_the_command_line_sets_the_resampler():
    import argparse

    parser = argparse.ArgumentParser()
    add_config_flags(parser, CSDConfig, CSDConfig())
    args = parser.parse_args(["--criterion", "published", "--resampler", "one_pass"])
    assert config_from_args(args, CSDConfig, CSDConfig()).criterion.resampler == "one_pass"
