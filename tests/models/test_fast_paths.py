"""The samplers' shortcuts make the numbers of the plain computation: the diffusion head's embeddings kept per
condition and per timestep, its schedule's coefficients cast once, a temperature of 1 that multiplies nothing;
xAR's positions read as views of its tables, its block mask made once per block shape.

The shortcuts run the same operations on the same inputs (bit-equal on the CPUs measured), but a network call
on another tensor (a kept embedding, a view) may round otherwise on a CPU whose BLAS picks its kernel by shape
or address. So the networks run in float64, the exact reference, and agree within float64 rounding
(tests/helpers.py: assert_same64); a shortcut that changed a number would miss by far more. The coefficient
functions (elementwise, no BLAS) are compared bit for bit."""

from __future__ import annotations

import pytest
import torch

from csd.core.chain import HeadCondition, evaluate_path, run_chain, standard_noise
from csd.models import diffusion as gd
from csd.models.head import DiffusionChain, DiffusionHead
from csd.models.xar.chains import CellCondition
from csd.models.xar.network import XAR, xar_config
from csd.sampling import generate
from csd.serving.pairs import random_pair
from csd.speculative import speculative_generate
from tests.helpers import assert_same64, sampling64


def _head(seed: int = 0) -> DiffusionHead:
    """A small head in float64 with every weight drawn (the zero-initialised modulations would hide the
    conditioning)."""
    head = DiffusionHead(token_dim=4, z_dim=6, width=16, depth=2, sampling_steps=10, clip_x0=1.0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(0.3 * torch.randn_like(p))
    return head.double()


def _randn(*shape, generator: torch.Generator) -> torch.Tensor:
    """Standard normal draws in float64 (drawn in float32, as a float64 run's noise is)."""
    return torch.randn(*shape, generator=generator).double()


def plain_transition(chain: DiffusionChain, y, step, cond: HeadCondition):
    """DDPM's transition as computed before the shortcuts: one network call on (x, t, z), every coefficient
    indexed and cast at the call."""
    d, s = chain.token_dim, chain.schedule
    t = chain.num_steps() - 1 - step
    tt = s.timestep_map[t].expand(y.shape[0]) if isinstance(t, int) else s.timestep_map[t]
    at = (lambda c: c[t].to(y.dtype)) if isinstance(t, int) else (lambda c: c[t].to(y.dtype).unsqueeze(-1))
    if cond.z_uncond is None:
        out = chain.net(y, tt, cond.z)
        eps, v = out[:, :d], out[:, d:]
    else:
        out_c, out_u = chain.net(torch.cat([y, y]), torch.cat([tt, tt]), torch.cat([cond.z, cond.z_uncond])).chunk(2)
        scale = cond.cfg.to(y.dtype).unsqueeze(-1)
        eps, v = out_u[:, :d] + scale * (out_c[:, :d] - out_u[:, :d]), out_c[:, d:]
    x0 = (at(s.sqrt_recip_alphas_cumprod) * y - at(s.sqrt_recipm1_alphas_cumprod) * eps).clamp(-1.0, 1.0)
    mean = at(s.posterior_mean_coef1) * x0 + at(s.posterior_mean_coef2) * y
    frac = (v + 1.0) / 2.0
    logvar = frac * at(s.betas.log()) + (1.0 - frac) * at(s.posterior_log_variance_clipped)
    return mean, (0.5 * logvar).exp()


def _condition(rows: int, guided: bool, g: torch.Generator) -> HeadCondition:
    z = _randn(rows, 6, generator=g)
    if not guided:
        return HeadCondition(z)
    return HeadCondition(z, _randn(rows, 6, generator=g), 1.0 + 3.0 * torch.rand(rows, generator=g).double())


@pytest.mark.kernels
@pytest.mark.parametrize("guided", [False, True])
def test_a_chain_with_kept_embeddings_makes_the_plain_numbers(guided):
    head, g = _head(), torch.Generator().manual_seed(1)
    chain = head.chain()
    for rows in (3, 5, 3):  # the third call finds the first one's embeddings kept
        cond, noise = _condition(rows, guided, g), standard_noise(rows, 4, 10, g, "cpu", torch.float64)
        with torch.inference_mode():
            traj = run_chain(chain, cond, noise)
        y = noise.xi
        for k in range(chain.num_steps()):
            mean, std = plain_transition(chain, y, k, cond)
            assert_same64(traj.mean[k], mean, f"means, {rows} rows, step {k}")
            # the fused sampler computes log std as one product (reassociated): its stds, which this random head
            # drives to 1e7 and beyond, agree to float64 rounding relative to their size
            torch.testing.assert_close(traj.std[k], std, rtol=1e-12, atol=1e-9, msg=f"stds, {rows} rows, step {k}")
            y = mean + std * noise.eps[k] if k < chain.num_steps() - 1 else mean
        assert_same64(traj.x, y, f"tokens, {rows} rows")


@pytest.mark.kernels
def test_a_path_evaluated_at_once_makes_the_plain_numbers():
    head, g = _head(), torch.Generator().manual_seed(2)
    chain, cond = head.chain(), _condition(4, True, g)
    states = _randn(chain.num_steps(), 4, 4, generator=g)
    mean, std = evaluate_path(chain, cond, states)
    steps = torch.arange(chain.num_steps()).repeat_interleave(4)
    plain_mean, plain_std = plain_transition(chain, states.reshape(-1, 4), steps, cond.repeat(chain.num_steps()))
    assert_same64(mean, plain_mean.reshape(mean.shape), "means")
    assert_same64(std, plain_std.reshape(std.shape), "stds")


@pytest.mark.kernels
def test_new_weights_are_embedded_again():
    head, g = _head(), torch.Generator().manual_seed(3)
    chain, cond = head.chain(), _condition(2, True, g)
    y = _randn(2, 4, generator=g)
    with torch.inference_mode():
        chain.transition(y, 0, cond)  # keeps the timestep's embedding
    with torch.no_grad():
        for p in head.net.time_embed.parameters():
            p.add_(0.5)  # as an optimizer step does, in place
    fresh = HeadCondition(cond.z, cond.z_uncond, cond.cfg)
    with torch.inference_mode():
        mean, std = chain.transition(y, 0, fresh)
    plain_mean, plain_std = plain_transition(chain, y, 0, fresh)
    assert_same64(mean, plain_mean, "means")  # the old weights' embedding would miss by 0.3
    assert_same64(std, plain_std, "stds")


def test_a_condition_keeps_what_a_head_made_of_it_per_key():
    cond, made = HeadCondition(torch.ones(2, 3)), []
    make = lambda c: made.append(1) or c.z * 2
    first = cond.derived("a", make)
    assert cond.derived("a", make) is first and len(made) == 1
    cond.derived("b", make)
    assert len(made) == 2
    assert cond.select(torch.tensor([0])).derived("a", make).shape == (1, 3) and len(made) == 3  # rows of its own


def test_coefficients_cast_once_are_the_coefficients_cast_at_each_step():
    s = gd.Schedule.cosine(1000, 25)
    for name in ("sqrt_recip_alphas_cumprod", "posterior_mean_coef1", "alphas_cumprod_prev", "log_betas"):
        kept = s.scalars(name, torch.float32, torch.device("cpu"))
        coef = getattr(s, name)
        assert len(kept) == 25 and all(torch.equal(kept[t], coef[t].to(torch.float32)) for t in range(25))
    assert torch.equal(s.log_betas, s.betas.log()) and s.timesteps == s.timestep_map.tolist()


@pytest.mark.parametrize("t", [0, 7, 24])
def test_an_int_step_reads_the_numbers_a_step_per_row_reads(t):
    """The cast-once scalars (an int t) against the coefficients indexed per row (a (n,) t), in every function
    of a transition: DDPM's mean and variance, DDIM's step with a clipped x0 (and its eps), the forward
    process."""
    s, g = gd.Schedule.cosine(1000, 25), torch.Generator().manual_seed(4)
    x, eps, v = (torch.randn(5, 4, generator=g) for _ in range(3))
    rows = torch.full((5,), t)
    for fn in (
        lambda t: gd.p_mean_logvar(s, x, t, eps, v, clip_x0=1.0),
        lambda t: gd.ddim_mean_std(s, x, t, eps, 0.5, clip_x0=1.0),
        lambda t: (gd.learned_log_variance(s, v, t), gd.predict_eps(s, x, t, eps)),
    ):
        for a, b in zip(fn(t), fn(rows), strict=True):
            assert torch.equal(a.expand_as(b), b)
    assert torch.equal(gd.q_sample(s, x, rows, eps), gd.q_sample(s, x, torch.tensor(t).expand(5), eps))


def _plain_head(model, monkeypatch, calls: list) -> None:
    """Make ``model``'s head chains compute every transition the plain way (:func:`plain_transition`), one
    transition at a time (no fused sampler)."""
    chain = model.head.chain

    def plain_chain(*args, **kwargs):
        c = chain(*args, **kwargs)
        c.sample = lambda *a, **k: None
        c.transition = lambda y, step, cond: calls.append(step) or plain_transition(c, y, step, cond)
        return c

    monkeypatch.setattr(model.head, "chain", plain_chain)


@pytest.mark.kernels
@pytest.mark.parametrize("family", ["mar", "harmon"])
def test_generation_makes_the_tokens_of_the_plain_head(family, random_models, monkeypatch):
    """In float64, on a fresh copy of the pair (its heads are patched)."""
    pair = (random_models if family == "mar" else random_pair(family=family)).at_precision("float64")
    conditions = list(pair.prompts[:1] or [3]) * 2
    sampling = sampling64(num_steps=6, cfg_scale=3.0)
    fast = generate(pair.target, conditions, [0, 1], sampling)
    csd = speculative_generate(pair.target, pair.draft, conditions, [0, 1], sampling)
    calls = []
    for model in (pair.target, pair.draft):
        _plain_head(model, monkeypatch, calls)
    assert_same64(generate(pair.target, conditions, [0, 1], sampling).tokens, fast.tokens, "target-only")
    plain = speculative_generate(pair.target, pair.draft, conditions, [0, 1], sampling)
    assert_same64(plain.tokens, csd.tokens, "CSD")
    assert (plain.trace.maker == csd.trace.maker).all()
    assert len(calls) > 6 * 10  # the plain transitions ran


@pytest.mark.kernels
def test_xar_positions_as_a_slice_read_what_indexing_reads():
    """xAR's network at a slice of the cell order (views of its tables) against the same positions indexed
    (a copy per call, as before): the cache of three context cells and a drafted one, and over it the block of
    cells 3 and 4 (each attending to the cells before it and to itself). In float64."""
    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = XAR(xar_config("xar_test", grid=8, cells=16, token_dim=3)).eval()  # cells of 4 tokens
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        clean, x, labels = torch.randn(2, 16, 3).double(), torch.randn(2, 8, 3).double(), torch.tensor([1, 2])
    model = model.double()
    t, mask = torch.full((2, 2), 0.5, dtype=torch.float64), model.mask[..., :16, :16]
    zeros = torch.zeros(2, 4, dtype=torch.float64)
    with torch.inference_mode():
        kept, indexed = [], []
        model._network(clean, labels, zeros, slice(0, 16), mask, None, kept)
        model._network(clean, labels, zeros, torch.arange(16), mask, None, indexed)
        for i, (ka, kb) in enumerate(zip(kept, indexed, strict=True)):
            for a, b in zip(ka, kb, strict=True):
                assert_same64(a, b, f"block {i}'s cached keys and values")
        cond = CellCondition(labels, 3, 2, kept)
        block = cond.attention_mask(4, "cpu", torch.float64)
        assert block is cond.attention_mask(4, "cpu", torch.float64)  # made once per block shape
        at = model._network(x, labels, t, cond.positions(4), block, kept)
        assert_same64(at, model._network(x, labels, t, torch.arange(12, 20), block, kept), "the block's velocities")


def _chain_inputs(head: DiffusionHead, n: int, guided: bool, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    z = _randn(n, 6, generator=g)
    cond = (
        HeadCondition(z, _randn(n, 6, generator=g), _randn(n, generator=g).abs() + 1.0) if guided else HeadCondition(z)
    )
    steps = head.sampling_steps
    return cond, standard_noise(n, 4, steps, g, "cpu", torch.float32)


def _as64(noise):
    from csd.core.chain import ChainNoise

    return ChainNoise(noise.xi.double(), noise.eps.double())


@pytest.mark.kernels
@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_the_fused_sampler_is_the_transition_loop(guided, temperature, clip, monkeypatch):
    """The fused DDPM sampler (modulations made per chain, the LayerNorm affine and DDPM's learned range folded
    into products, guidance as a lerp) against the transition-by-transition loop, in float64: every state, mean
    and std of the trajectory, and its token. Once with the modulations made all at once, once a step at a time
    (a head too wide for one chunk)."""
    from csd.core.chain import run_transitions
    from csd.models import head as head_module

    head = _head()
    head.clip_x0 = clip
    cond, noise = _chain_inputs(head, 5, guided)
    chain = head.chain()
    with torch.inference_mode():
        loop = run_transitions(chain, cond, _as64(noise), temperature)
        for elements in (head_module.MODULATION_ELEMENTS, 1):
            monkeypatch.setattr(head_module, "MODULATION_ELEMENTS", elements)
            fused = chain.sample(HeadCondition(cond.z, cond.z_uncond, cond.cfg), _as64(noise), temperature)
            for name in ("x", "states", "mean", "std"):
                torch.testing.assert_close(getattr(fused, name), getattr(loop, name), rtol=1e-12, atol=1e-12)
            assert len(head_module.FusedSampler(chain, cond).chunks()) == (1 if elements > 1 else chain.num_steps())


def test_the_fused_sampler_leaves_ddim_and_autograd_to_the_loop():
    """DDIM's transitions and a chain run where autograd records (the fused sampler writes into buffers) take
    the loop: ``sample`` declines and ``run_chain`` runs the transitions."""
    head = _head()
    cond, noise = _chain_inputs(head, 3, True)
    with torch.inference_mode():
        assert head.chain(sampler="ddim", eta=0.5).sample(cond, _as64(noise)) is None
        assert head.chain().sample(cond, _as64(noise)) is not None
    head = _head(seed=2)  # schedules cast under inference mode are inference tensors: a fresh head for autograd
    with torch.enable_grad():
        assert head.chain().sample(cond, _as64(noise)) is None
        assert run_chain(head.chain(), cond, _as64(noise)).x.shape == (3, 4)


@pytest.mark.kernels
def test_a_fused_float32_chain_is_the_float64_loop_within_float32_rounding():
    """In float32 the fused sampler reassociates (folded affine, folded variance range): its token stays within
    the measured float32 bound of the float64 loop's."""
    from csd.core.chain import run_transitions
    from tests.helpers import F32_ATOL

    head64 = _head()
    head32 = _head().float()
    cond, noise = _chain_inputs(head64, 6, True)
    cond32 = HeadCondition(cond.z.float(), cond.z_uncond.float(), cond.cfg.float())
    with torch.inference_mode():
        ref = run_transitions(head64.chain(), cond, _as64(noise))
        fused = head32.chain().sample(cond32, noise)
    assert float((fused.x.double() - ref.x).abs().max()) < F32_ATOL


@pytest.mark.kernels
def test_a_deferred_trace_writes_nothing_until_flushed_then_what_an_immediate_one_writes():
    """The trace of a CUDA run keeps its per-token writes (tensors where they are) until the run ends: the same
    arrays once flushed. Forced here on the CPU, through a whole target-only and CSD run."""
    from csd.trace import Maker, Trace

    pos = torch.tensor([[0, 2], [1, 3]])
    now, later = Trace.empty(2, 4, [2, 2]), Trace.empty(2, 4, [2, 2], defer=True)
    for t in (now, later):
        t.record_made(pos, 0, Maker.TARGET)
        t.record_distance(pos, torch.tensor([0.5, 1.5, 2.5, 3.5]), aligned=True)
    assert (later.maker == -1).all() and len(later.pending) == 3
    later.flush()
    assert later.pending is None
    for name in ("maker", "ar_step", "distance_aligned"):
        assert (getattr(now, name) == getattr(later, name)).all() or (
            name == "distance_aligned"
            and torch.equal(
                torch.tensor(now.distance_aligned).nan_to_num(-1), torch.tensor(later.distance_aligned).nan_to_num(-1)
            )
        )
    pair = random_pair().at_precision("float64")
    sampling = sampling64(num_steps=6, cfg_scale=2.0)
    runs = lambda: (
        generate(pair.target, [1, 2], [0, 1], sampling),
        speculative_generate(pair.target, pair.draft, [1, 2], [0, 1], sampling),
    )
    plain = runs()
    empty = Trace.empty
    deferred = lambda *a, **k: empty(*a, **(k | {"defer": True}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trace, "empty", deferred)
        forced = runs()
    for a, b in zip(plain, forced, strict=True):
        assert_same64(b.tokens, a.tokens)
        for name in ("maker", "ar_step", "block", "resample_tries"):
            assert (getattr(a.trace, name) == getattr(b.trace, name)).all(), name
        assert b.trace.pending is None
