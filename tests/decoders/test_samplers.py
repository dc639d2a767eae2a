"""The target's few-step samplers as settings (issue 43): a DDIM head for the masked families, the
probability-flow ODE (Euler, Heun) on two time grids for xAR, DiSA's floor; each step equals one computed by
hand on a toy noise predictor or velocity, the defaults change nothing, and CSD runs where its test is
defined and refuses by name where it is not."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise, HeadCondition, run_chain
from csd.core.schedule import DISA_FLOOR, head_step_schedule
from csd.family import FamilyTraits
from csd.models import diffusion as gd
from csd.models.head import DiffusionChain
from csd.models.xar.chains import CellChain, CellCondition, CellFlow, flow_times
from csd.records.cost import ChainCost, PassCosts
from csd.run_setup import check_settings
from csd.sampling import generate
from csd.serving.pairs import random_pair
from csd.speculative import speculative_generate
from tests.helpers import assert_differ64, assert_same64, random_pair64, sampling64

MAR_TRAITS = FamilyTraits("MAR", num_classes=10, head_samplers=("ddpm", "ddim"))

# --- MAR's head: DDIM ---------------------------------------------------------------------------------


class _Timesteps(nn.Module):
    """The toy's time embedding: records the timesteps it is asked for and adds nothing."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, t):
        self.calls.append(t.tolist())
        return torch.zeros(t.shape[0], 2, dtype=torch.float64)


class ToyEps(nn.Module):
    """A noise predictor in the head network's shape: eps = 0.5 x + z, variance value 0.3."""

    token_dim = 2

    def __init__(self):
        super().__init__()
        self.time_embed, self.cond_embed = _Timesteps(), nn.Identity()

    @property
    def calls(self):
        return self.time_embed.calls

    def forward(self, x, t, z):
        return self.forward_embedded(x, self.time_embed(t) + self.cond_embed(z))

    def forward_embedded(self, x, y):
        return torch.cat([0.5 * x + y.to(x.dtype), torch.full_like(x, 0.3)], dim=-1)


def cosine_alpha_bar(t: int) -> float:
    """alpha_bar after original step t of the 1000-step cosine schedule: f(t + 1) / f(0) (the betas
    telescope; none is clipped below the last), f(s) = cos((s / 1000 + 0.008) / 1.008 pi / 2)^2."""
    f = lambda s: math.cos((s / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2
    return f(t + 1) / f(0)


@pytest.mark.parametrize("eta", [0.0, 0.6])
def test_a_ddim_step_equals_the_one_computed_by_hand(eta):
    net = ToyEps()
    chain = DiffusionChain(net, gd.Schedule.cosine(1000, 4), None, ddim_eta=eta)  # kept steps 0, 333, 666, 999
    y = torch.tensor([[0.4, -1.2]], dtype=torch.float64)
    z = torch.tensor([[0.1, 0.2]], dtype=torch.float64)
    mean, std = chain.transition(y, 1, HeadCondition(z))  # transition 1: diffusion index 2, step 666
    assert net.calls == [[666]]
    ab, ab_prev = cosine_alpha_bar(666), cosine_alpha_bar(333)
    eps = 0.5 * y + z
    x0 = (y - math.sqrt(1 - ab) * eps) / math.sqrt(ab)
    sigma = eta * math.sqrt((1 - ab_prev) / (1 - ab)) * math.sqrt(1 - ab / ab_prev)
    torch.testing.assert_close(mean, math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev - sigma**2) * eps)
    torch.testing.assert_close(std, torch.full_like(y, sigma))


def test_ddim_clips_x0_and_takes_the_eps_it_implies():
    chain = DiffusionChain(ToyEps(), gd.Schedule.cosine(1000, 5), 1.0, ddim_eta=0.0)  # steps 0, 250, 500, 749, 999
    y, z = torch.tensor([[3.0, -0.2]], dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    mean, _ = chain.transition(y, 1, HeadCondition(z))  # diffusion index 3, step 749
    ab, ab_prev = cosine_alpha_bar(749), cosine_alpha_bar(500)
    unclipped = (y - math.sqrt(1 - ab) * 0.5 * y) / math.sqrt(ab)
    assert unclipped[0, 0] > 1.0 > unclipped[0, 1].abs()  # the first is clipped, the second is not
    x0 = unclipped.clamp(-1.0, 1.0)
    eps = (y - math.sqrt(ab) * x0) / math.sqrt(1 - ab)
    torch.testing.assert_close(mean, math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev) * eps)


def test_ddims_last_step_is_ddpms_mean_x0_with_its_learned_width():
    ddpm = DiffusionChain(ToyEps(), gd.Schedule.cosine(1000, 4), None)
    ddim = DiffusionChain(ToyEps(), gd.Schedule.cosine(1000, 4), None, ddim_eta=0.5)
    y, cond = torch.tensor([[0.4, -1.2]]), HeadCondition(torch.tensor([[0.1, 0.2]]))
    for a, b in zip(ddpm.transition(y, 3, cond), ddim.transition(y, 3, cond), strict=True):
        torch.testing.assert_close(a, b)
    # per-row steps (the exact criterion evaluates a whole path in one call) give the same numbers
    rows = torch.tensor([1, 3])
    mean, std = ddim.transition(torch.cat([y, y]), rows, HeadCondition(torch.tensor([[0.1, 0.2]] * 2)))
    torch.testing.assert_close(std[0], ddim.transition(y, 1, cond)[1][0])
    torch.testing.assert_close(std[1], ddpm.transition(y, 3, cond)[1][0])


def test_ddim_with_eta_0_is_deterministic_and_eta_above_0_uses_the_noise():
    cond = HeadCondition(torch.tensor([[0.1, 0.2]]))
    g = torch.Generator().manual_seed(0)
    noise = [ChainNoise(torch.ones(1, 2), torch.randn(4, 1, 2, generator=g)) for _ in range(2)]
    for eta, same in ((0.0, True), (0.6, False)):
        chain = DiffusionChain(ToyEps(), gd.Schedule.cosine(1000, 5), None, ddim_eta=eta)
        a, b = (run_chain(chain, cond, n).x for n in noise)
        assert torch.equal(a, b) == same


# --- xAR: the probability-flow ODE --------------------------------------------------------------------


class ToyVelocity(nn.Module):
    """An xAR-shaped model of 2-token cells whose velocity is v(x, t) = -(1 + t) x + label / 10."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(cell_len=2, token_dim=3)
        self.token_dim, self.null_class = 6, 9
        self.z_proj = nn.Linear(3, 3)

    def cell_conditions(self, labels, times):
        """(B,) labels, (B, k) times -> each cell's (time, label / 10): (B, k, 2)."""
        return torch.stack([times, (labels[:, None] / 10).to(times.dtype).expand_as(times)], dim=-1)

    def _trunk(self, x, cond, positions, mask, cache):
        t, label = cond[..., :1], cond[..., 1:]  # (B, k * cell_len, 1) each
        return -(1.0 + t) * x + label


def toy_velocity(x: torch.Tensor, t: float) -> torch.Tensor:
    return -(1.0 + t) * x + 0.3


def test_the_grids_are_the_official_one_and_even_steps():
    torch.testing.assert_close(flow_times(4), torch.tensor([1.0, 0.68, 0.36, 0.04, 0.0], dtype=torch.float64))
    torch.testing.assert_close(flow_times(4, "uniform"), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64))
    torch.testing.assert_close(flow_times(25), flow_times(25, "uniform"))  # 0.96 / 24 = 1 / 25: one grid
    with pytest.raises(ValueError, match="flow_grid must be one of"):
        flow_times(4, "cosine")


@pytest.mark.parametrize("grid", ["official", "uniform"])
def test_euler_and_heun_steps_equal_the_ones_computed_by_hand(grid):
    cond = CellCondition(torch.tensor([3]), 0, 1, None)
    y = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5, -0.5]], dtype=torch.float64)
    t, t_next = flow_times(4, grid)[1].item(), flow_times(4, grid)[2].item()
    dt = t_next - t
    euler = CellFlow(ToyVelocity(), 4, sampler="euler", grid=grid)
    mean, std = euler.transition(y, 1, cond)
    torch.testing.assert_close(mean, y + dt * toy_velocity(y, t))
    assert torch.equal(std, torch.zeros_like(y))  # deterministic before the last step
    heun = CellFlow(ToyVelocity(), 4, sampler="heun", grid=grid)
    mean, _ = heun.transition(y, 1, cond)
    guess = y + dt * toy_velocity(y, t)
    torch.testing.assert_close(mean, y + dt / 2 * (toy_velocity(y, t) + toy_velocity(guess, t_next)))
    em = CellFlow(ToyVelocity(), 4, grid=grid)
    mean, std = em.transition(y, 1, cond)
    torch.testing.assert_close(mean, y + dt * ((2 - t) * toy_velocity(y, t) + y))
    torch.testing.assert_close(std, torch.full_like(y, math.sqrt(2 * t * abs(dt))))
    _, last = euler.transition(y, 3, cond)  # the final token's width, as Euler-Maruyama reports it
    t_last = flow_times(4, grid)[3].item()
    torch.testing.assert_close(last, torch.full_like(y, math.sqrt(2 * t_last * t_last)))


def test_whole_ode_runs_follow_the_closed_forms_of_a_linear_velocity():
    """v = -(1 + t) x + 0.3 has Euler factor (1 - (1 + t) dt) per step; Heun's a second-order one."""
    cond = CellCondition(torch.tensor([3]), 0, 1, None)
    xi = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5, -0.5]])
    noise = ChainNoise(xi, torch.randn(5, 1, 6, generator=torch.Generator().manual_seed(1)))
    for sampler in ("euler", "heun"):
        x = xi.to(torch.float64)
        times = flow_times(6, "uniform").tolist()
        for t, t_next in zip(times[:-1], times[1:], strict=True):
            dt = t_next - t
            v = toy_velocity(x, t)
            x = x + dt * v if sampler == "euler" else x + dt / 2 * (v + toy_velocity(x + dt * v, t_next))
        run = CellChain(CellFlow(ToyVelocity(), 6, sampler=sampler, grid="uniform"), cond).run(noise)
        torch.testing.assert_close(run.x, x.float())


def test_a_heun_step_makes_two_velocity_calls_and_the_cost_model_counts_them():
    assert SamplingConfig.from_knobs(head_sampler="heun").head_calls(8) == 16
    assert SamplingConfig.from_knobs(head_sampler="euler").head_calls(8) == 8 == SamplingConfig().head_calls(8)
    pair = random_pair(family="xar")
    calls = {}
    for sampler in ("euler", "heun"):
        s = SamplingConfig.from_knobs(num_steps=16, cfg_scale=2.0, head_steps=3, head_sampler=sampler)
        calls[sampler] = generate(pair.target, [1], [2], s).trace.work["target_head"]["steps"]
    assert calls == {"euler": 16 * 3, "heun": 16 * 6}  # 16 cells of 3 flow steps: 48 velocity calls, Heun's 96
    per_call = PassCosts(0.0, 0.0, ChainCost(0.01), ChainCost(0.0))  # the cost model: 10 ms a velocity call
    assert per_call.predict({"target_head": {"steps": calls["heun"]}}) == pytest.approx(0.96)


# --- defaults, refusals, CSD --------------------------------------------------------------------------


@pytest.mark.kernels
def test_naming_each_familys_own_sampler_changes_no_token():
    for family, own in (("mar", "ddpm"), ("xar", "euler-maruyama")):
        pair = random_pair64(family)
        s = sampling64(num_steps=16 if family == "xar" else 6, cfg_scale=2.0, head_steps=4)
        plain = generate(pair.target, [1, 2], [3, 4], s).tokens
        named = s.with_knobs(**{"head_sampler": own, "flow_grid": "official"})
        assert_same64(generate(pair.target, [1, 2], [3, 4], named).tokens, plain, family)


@pytest.mark.kernels
def test_the_new_samplers_run_seeded_and_batch_invariant_and_change_the_tokens(one_thread):
    """In float64: in float32 a batch of two and an image alone round differently (another kernel), which
    DDIM at eta 1 (posterior std, few steps) grows to 3e-4 here and 1.5e-3 on another CPU."""
    mar, xar = random_pair64(), random_pair64("xar")
    settings = [
        (mar, sampling64(num_steps=6, cfg_scale=2.0, head_steps=5, head_sampler="ddim")),
        (mar, sampling64(num_steps=6, cfg_scale=2.0, head_steps=5, head_sampler="ddim", ddim_eta=1.0)),
        (xar, sampling64(num_steps=16, cfg_scale=2.0, head_steps=3, head_sampler="heun", flow_grid="uniform")),
        (xar, sampling64(num_steps=16, cfg_scale=2.0, head_steps=3, flow_grid="uniform")),
    ]
    for pair, s in settings:
        batch = generate(pair.target, [1, 2], [3, 4], s).tokens
        assert_same64(generate(pair.target, [2], [4], s).tokens, batch[1:], str(s.sampler.kind))
        own = s.with_knobs(**{"head_sampler": None, "ddim_eta": 0.0, "flow_grid": "official"})
        assert_differ64(batch, generate(pair.target, [1, 2], [3, 4], own).tokens, "another sampler", by=1e-2)


@pytest.mark.parametrize(
    ("family", "change", "message"),
    [
        ("mar", {"head_sampler": "heun"}, r"head_sampler must be None or one of \('ddpm', 'ddim'\) for this MAR"),
        ("xar", {"head_sampler": "ddim"}, r"head_sampler must be None or one of \('euler-maruyama', 'euler', 'heun'\)"),
        ("mar", {"flow_grid": "uniform"}, "flow_grid must be 'official' for this MAR model"),
        ("xar", {"gtr_stages": (16,)}, "gtr_stages must be empty for this xAR model"),
    ],
)
def test_a_family_refuses_the_samplers_it_does_not_take_by_name(family, change, message):
    pair = random_pair(family=family)
    s = SamplingConfig(num_steps=16, cfg_scale=2.0).with_knobs(**change)
    with pytest.raises(ValueError, match=message):
        generate(pair.target, [1], [2], s)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SamplingConfig.from_knobs(head_sampler="dpm"), "head_sampler must be one of"),
        (
            lambda: check_settings(MAR_TRAITS, 64, SamplingConfig.from_knobs(ddim_eta=0.5)),
            "ddim_eta applies to head_sampler 'ddim' only",
        ),
        (lambda: SamplingConfig.from_knobs(head_sampler="ddim", ddim_eta=1.5), r"ddim_eta must be in \[0, 1\]"),
        (lambda: SamplingConfig.from_knobs(flow_grid="cosine"), "flow_grid must be one of"),
        (lambda: CSDConfig.from_knobs(draft_head_sampler="ode"), "draft_head_sampler must be one of"),
        (
            lambda: check_settings(MAR_TRAITS, 64, SamplingConfig(), CSDConfig.from_knobs(draft_ddim_eta=0.2)),
            "draft_ddim_eta applies to draft_head_sampler 'ddim' only",
        ),
    ],
)
def test_bad_sampler_settings_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_disas_floor_is_the_five_head_steps_of_its_last_ar_step():
    assert DISA_FLOOR == 5
    assert head_step_schedule(12, DISA_FLOOR, 8, "disa") == [12, 11, 10, 9, 8, 7, 6, 5]  # 5 + floor(7 (7 - s) / 7)


@pytest.mark.parametrize(
    ("family", "sampling", "message"),
    [
        ("xar", {"head_sampler": "euler"}, "head_sampler 'euler' is deterministic"),
        ("xar", {"head_sampler": "heun", "flow_grid": "uniform"}, "head_sampler 'heun' is deterministic"),
        ("mar", {"head_sampler": "ddim"}, "head_sampler 'ddim' with ddim_eta 0 is deterministic"),
    ],
)
def test_csd_refuses_a_deterministic_target_sampler_by_name(family, sampling, message):
    pair = random_pair(family=family)
    s = SamplingConfig(num_steps=16, cfg_scale=2.0, head_steps=4).with_knobs(**sampling)
    with pytest.raises(ValueError, match=message + r".*no density along its path"):
        speculative_generate(pair.target, pair.draft, [1], [2], s, CSDConfig(gamma=4))


@pytest.mark.kernels
def test_csd_composes_with_stochastic_samplers_and_a_deterministic_draft_under_the_final_step_test(one_thread):
    mar, xar = random_pair64(), random_pair64("xar")
    runs = [
        (mar, sampling64(num_steps=8, cfg_scale=2.0, head_steps=5, head_sampler="ddim", ddim_eta=1.0), {}),
        (xar, sampling64(num_steps=16, cfg_scale=2.0, head_steps=4, flow_grid="uniform"), {}),
        (
            mar,
            sampling64(num_steps=8, cfg_scale=2.0, head_steps=5),
            {"draft_head_sampler": "ddim", "draft_head_steps": 3, "align": False, "trajectory_term": "none"},
        ),
        (
            xar,
            sampling64(num_steps=16, cfg_scale=2.0, head_steps=4),
            {"draft_head_sampler": "euler", "trajectory_term": "none"},
        ),
    ]
    for pair, s, extra in runs:
        csd = CSDConfig.from_knobs(gamma=3, **extra)
        out = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, csd)
        assert torch.isfinite(out.tokens).all() and out.trace.verified.any()
        alone = speculative_generate(pair.target, pair.draft, [2], [4], s, csd)
        assert_same64(alone.tokens, out.tokens[1:], str(extra))
        assert (alone.trace.maker == out.trace.maker[1:]).all()
        if "draft_head_sampler" in extra:  # the draft ran on its own sampler: other drafts, other tests
            own = CSDConfig.from_knobs(gamma=3, **(extra | {"draft_head_sampler": None}))
            other = speculative_generate(pair.target, pair.draft, [1, 2], [3, 4], s, own).trace
            verified = out.trace.verified
            assert_differ64(other.log_ratio_final[verified], out.trace.log_ratio_final[verified], "log r", by=1e-2)
    with pytest.raises(ValueError, match="draft_head_sampler 'euler' is deterministic.*trajectory_term 'none'"):
        speculative_generate(
            xar.target, xar.draft, [1], [2], runs[3][1], CSDConfig.from_knobs(gamma=3, draft_head_sampler="euler")
        )
