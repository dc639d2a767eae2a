"""The heads' kernels (csd/models/kernels.py): which run a device gets, the CUDA graphs' rows buckets as pure
functions, and the compiled steps (inductor on the CPU) against the eager ones: the MAR head's DDPM chain and
xAR's flow chain, in float64 within reassociation and in float32 within a bound derived from the eager float32
run's own rounding, each compiled in one graph (``fullgraph``: a graph break fails).

The compile tests run once: they compare a run with itself compiled, not kernels across CPUs, so they are not
in the perturbation reruns (no ``kernels`` mark); compiling takes tens of seconds on two cores (``slow``)."""

from __future__ import annotations

import pytest
import torch

from csd.core.chain import ChainNoise, HeadCondition, run_transitions, standard_noise
from csd.models import kernels
from csd.models.head import DIMS, DiffusionHead, FusedSampler, graph_inputs, graph_key
from csd.models.kernels import EAGER, HeadKernels, copy_padded, kernels_for, pad_rows, rows_bucket, take_rows

COMPILED = HeadKernels(compiled=True, graphs=False)


def _head(seed: int = 0) -> DiffusionHead:
    """A small head with every weight drawn (the zero-initialised modulations would hide the conditioning)."""
    head = DiffusionHead(token_dim=4, z_dim=6, width=16, depth=2, sampling_steps=10, clip_x0=1.0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return head


def _inputs(n: int, seed: int = 1, dtype=torch.float32) -> tuple[HeadCondition, ChainNoise]:
    gen = torch.Generator().manual_seed(seed)
    z, zu = torch.randn(n, 6, generator=gen), torch.randn(n, 6, generator=gen)
    cfg = torch.rand(n, generator=gen) + 1.0
    noise = standard_noise(n, 4, 10, gen, "cpu", torch.float32)
    cast = lambda t: t.to(dtype)
    return HeadCondition(cast(z), cast(zu), cast(cfg)), ChainNoise(cast(noise.xi), cast(noise.eps))


def _fresh(cond: HeadCondition) -> HeadCondition:
    return HeadCondition(cond.z, cond.z_uncond, cond.cfg)  # no embedding kept from another run


# --- which kernels a device gets ------------------------------------------------------------------------


def test_a_cpu_runs_eager_by_default_and_cuda_compiled_with_graphs():
    assert kernels_for("cpu") == EAGER
    assert kernels_for("cuda") == kernels.ON_CUDA and kernels.ON_CUDA.compiled and kernels.ON_CUDA.graphs


def test_a_heads_own_kernels_override_the_default_and_graphs_need_cuda():
    assert kernels_for("cpu", HeadKernels()) == HeadKernels(compiled=True, graphs=False)
    assert kernels_for("cuda", EAGER) == EAGER


def test_the_cuda_default_is_a_module_setting(monkeypatch):
    monkeypatch.setattr(kernels, "ON_CUDA", EAGER)
    assert kernels_for("cuda") == EAGER


def test_products_take_the_runs_autocast_dtype_only_when_compiled():
    assert kernels.product_dtype(torch.bfloat16, COMPILED) == torch.bfloat16
    assert kernels.product_dtype(torch.bfloat16, EAGER) is None
    assert kernels.product_dtype(None, COMPILED) is None


def test_head_kernels_reject_a_rows_floor_below_one():
    with pytest.raises(ValueError, match="least_rows"):
        HeadKernels(least_rows=0)


def test_compiling_raises_dynamos_recompile_limit_to_the_structures_a_server_meets():
    with torch._dynamo.config.patch(recompile_limit=8):
        kernels.compiled(lambda x: x + 1)
        assert torch._dynamo.config.recompile_limit == kernels.RECOMPILE_LIMIT > 8


# --- rows buckets, padding, keys --------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "least", "bucket"), [(1, 1, 1), (3, 1, 4), (8, 1, 8), (9, 1, 16), (3, 8, 8)])
def test_rows_go_to_the_least_power_of_two_at_or_above_them_and_the_floor(rows, least, bucket):
    assert rows_bucket(rows, least) == bucket


def test_a_bucket_needs_at_least_one_row():
    with pytest.raises(ValueError):
        rows_bucket(0)


def test_padding_appends_rows_that_taking_drops():
    x = torch.arange(6.0).reshape(2, 3)  # rows along dim 1
    padded = pad_rows(x, 5, dim=1, fill=-1.0)
    assert padded.shape == (2, 5) and (padded[:, 3:] == -1.0).all()
    assert torch.equal(take_rows(padded, 3, dim=1), x)
    assert pad_rows(x, 3, dim=1) is x
    with pytest.raises(ValueError):
        pad_rows(x, 2, dim=1)


def test_a_graph_input_takes_the_rows_and_zeros_what_an_earlier_larger_batch_left():
    static = torch.full((3, 8, 2), 7.0)  # (T-1, bucket, d): eps's rows along dim 1
    copy_padded(static, torch.ones(3, 5, 2), dim=1)
    assert (static[:, :5] == 1.0).all() and (static[:, 5:] == 0.0).all()


def test_graph_inputs_have_the_bucket_rows_along_each_values_rows_dim():
    cond, noise = _inputs(5)
    values = (cond.z, None, cond.cfg, noise.xi, noise.eps)
    shapes = [None if t is None else tuple(t.shape) for t in graph_inputs(values, 8)]
    assert shapes == [(8, 6), None, (8,), (8, 4), (9, 8, 4)]
    assert DIMS == (0, 0, 0, 0, 1)


def test_chains_of_one_bucket_share_a_graph_key_and_every_setting_that_is_captured_makes_its_own():
    head, graphs = _head(), HeadKernels()
    chain = head.chain()
    key = lambda n, temperature=1.0, guided=True, chain=chain, products=None: graph_key(
        chain, *_guided(n, guided), temperature, graphs, products
    )
    assert key(9) == key(16) and key(3) == key(8)  # least_rows 8
    others = [key(17), key(9, temperature=0.7), key(9, guided=False), key(9, chain=head.chain(5))]
    others.append(key(9, products=torch.bfloat16))
    assert len({key(9), *others}) == 1 + len(others)


def _guided(n: int, guided: bool) -> tuple[HeadCondition, ChainNoise]:
    cond, noise = _inputs(n)
    return (cond if guided else HeadCondition(cond.z)), noise


def test_a_padded_chains_real_rows_are_the_chain_run_alone():
    """What a graph replays: the chain at its bucket's rows, inputs padded with zeros, its real rows taken; the
    same numbers as the rows alone, in float64 (rows are independent; only the products' blocking differs)."""
    head = _head().double()
    chain = head.chain()
    cond, noise = _inputs(5, dtype=torch.float64)
    values = (cond.z, cond.z_uncond, cond.cfg, noise.xi, noise.eps)
    inputs = graph_inputs(values, rows_bucket(5, 8))
    for static, value, dim in zip(inputs, values, DIMS, strict=True):
        copy_padded(static, value, dim)
    z, zu, cfg, xi, eps = inputs
    with torch.inference_mode():
        alone = FusedSampler(chain, _fresh(cond)).run(noise)
        padded = FusedSampler(chain, HeadCondition(z, zu, cfg)).run(ChainNoise(xi, eps))
    torch.testing.assert_close(take_rows(padded.x, 5), alone.x, rtol=1e-12, atol=1e-12)
    for name in ("states", "mean", "std"):
        torch.testing.assert_close(take_rows(getattr(padded, name), 5, 1), getattr(alone, name), rtol=1e-12, atol=0)


class _Replay:
    """A CPU stand-in for a captured CUDA graph: a replay runs the chain again on the graph's input tensors and
    writes the trajectory into its output tensors, as a CUDA graph's replay does."""

    def __init__(self, run, out):
        self.run, self.out = run, out

    def replay(self) -> None:
        new = self.run()
        for name in ("x", "states", "mean", "std"):
            getattr(self.out, name).copy_(getattr(new, name))


def test_the_graph_cache_captures_once_per_bucket_and_gives_each_call_its_own_rows(monkeypatch):
    """ChainGraphs.run with the capture replaced by a CPU stand-in: chains of 5 and 7 rows share one capture
    (bucket 8), 9 rows make another (16); each call gets its rows' trajectory, the chain's own numbers
    (float64), in tensors of its own (the next replay leaves them as they are)."""
    from csd.models.head import ChainGraphs

    captures = []

    def capture(chain, inputs, temperature, compiled, products):
        z, zu, cfg, xi, eps = inputs
        run = lambda: FusedSampler(chain, HeadCondition(z, zu, cfg), compiled, products).run(
            ChainNoise(xi, eps), temperature
        )
        captures.append(xi.shape[0])
        out = run()
        return out, _Replay(run, out)

    monkeypatch.setattr(ChainGraphs, "capture", staticmethod(capture))
    head, graphs = _head().double(), ChainGraphs()
    chain, eager = head.chain(), HeadKernels(compiled=False)
    got, alone = {}, {}
    with torch.inference_mode():
        for n in (5, 7, 9, 5):
            cond, noise = _inputs(n, seed=n, dtype=torch.float64)
            got[n] = graphs.run(chain, cond, noise, 0.8, eager, None)
            alone[n] = FusedSampler(chain, _fresh(cond)).run(noise, 0.8)
        first = graphs.run(chain, *_inputs(7, seed=70, dtype=torch.float64), 0.8, eager, None)
        kept = first.x.clone()
        graphs.run(chain, *_inputs(7, seed=71, dtype=torch.float64), 0.8, eager, None)
    assert captures == [8, 16]
    for n, traj in got.items():
        for name in ("x", "states", "mean", "std"):
            torch.testing.assert_close(getattr(traj, name), getattr(alone[n], name), rtol=1e-12, atol=1e-12)
    assert torch.equal(first.x, kept)


def test_a_copied_head_starts_with_graphs_of_its_own():
    """A copy (a float64 model for a float64 run) has other weights: it shares no graph with its original."""
    import copy

    head = _head()
    head.graphs.graphs["a key"] = ("inputs", "out", "graph")
    other = copy.deepcopy(head)
    assert other.graphs is not head.graphs and other.graphs.graphs == {}


def test_on_the_cpu_a_head_samples_with_the_eager_fused_sampler():
    head = _head()
    cond, noise = _inputs(5)
    with torch.inference_mode():
        got = head.chain().sample(_fresh(cond), noise)
        eager = FusedSampler(head.chain(), _fresh(cond)).run(noise)
    for name in ("x", "states", "mean", "std"):
        assert torch.equal(getattr(got, name), getattr(eager, name))


# --- compiled steps against eager ones ---------------------------------------------------------------------


def _float32_bound(eager32: torch.Tensor, reference64: torch.Tensor) -> float:
    """A float32 run's distance from the float64 reference, allowed to a compiled float32 run of the same
    arithmetic reassociated: 4x the eager float32 run's own distance, and at least 4 float32 ulps of the
    largest value."""
    gap = float((eager32.double() - reference64).abs().max())
    return 4.0 * max(gap, torch.finfo(torch.float32).eps * float(reference64.abs().max()))


@pytest.fixture(autouse=True)
def _count_compiles():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _graphs_and_breaks() -> tuple[int, int]:
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.mark.slow
def test_the_compiled_ddpm_chain_is_the_eager_one_in_one_graph_for_every_step(one_thread):
    """A guided, clipped chain of 10 steps compiled: float64 within reassociation of the transition loop,
    float32 within the derived bound of the float64 loop; two graphs in all per dtype (the noised steps and
    the last), no graph break."""
    head64, head32 = _head().double(), _head()
    cond, noise = _inputs(5)
    cond64, noise64 = _inputs(5, dtype=torch.float64)
    with torch.inference_mode():
        reference = run_transitions(head64.chain(), cond64, noise64)
        eager32 = head32.chain().sample(_fresh(cond), noise)
        head64.use_kernels(COMPILED)
        head32.use_kernels(COMPILED)
        got64 = head64.chain().sample(_fresh(cond64), noise64)
        assert _graphs_and_breaks() == (2, 0)
        got32 = head32.chain().sample(_fresh(cond), noise)
    for name in ("x", "states", "mean", "std"):
        torch.testing.assert_close(getattr(got64, name), getattr(reference, name), rtol=1e-12, atol=1e-12)
    assert float((got32.x.double() - reference.x).abs().max()) <= _float32_bound(eager32.x, reference.x)
    assert _graphs_and_breaks() == (4, 0)


def _xar(dtype: torch.dtype):
    from csd.models.xar.network import XAR, xar_config

    with torch.random.fork_rng():
        torch.manual_seed(5)  # the initialisation's own draws
        model = XAR(xar_config("xar_test"))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval().to(dtype)


def _flow_run(model, kernels_: HeadKernels | None):
    """One guided cell (cell 1 of 4) of two images over the clean cell 0: xAR's flow chain, 6 steps."""
    from csd.models.xar.chains import CellChain, CellCondition, CellFlow

    model.use_kernels(kernels_)
    c, dtype = model.config, model.z_proj.weight.dtype
    gen = torch.Generator().manual_seed(0)
    labels, clean = torch.tensor([1, 2]), torch.randn(2, c.cell_len, c.token_dim, generator=gen)
    doubled = torch.cat([labels, torch.full_like(labels, model.null_class)])
    noise = standard_noise(2, model.token_dim, 6, gen, "cpu", torch.float64)
    with torch.inference_mode():
        cache = model.context_cache(torch.cat([clean, clean]).to(dtype), doubled)
        cond = CellCondition(labels, 1, 1, cache, torch.full((2,), 2.0))
        return CellChain(CellFlow(model, 6), cond).run(noise)


@pytest.mark.slow
def test_the_compiled_xar_flow_chain_is_the_eager_one_in_one_graph(one_thread):
    """xAR's velocity calls compiled (the encoder-decoder, its condition made outside): float64 within
    reassociation, float32 within the derived bound; one graph per dtype for all 6 steps, no graph break."""
    reference, eager32 = _flow_run(_xar(torch.float64), None), _flow_run(_xar(torch.float32), None)
    got64 = _flow_run(_xar(torch.float64), COMPILED)
    assert _graphs_and_breaks() == (1, 0)
    got32 = _flow_run(_xar(torch.float32), COMPILED)
    for name in ("x", "states", "mean", "std"):
        torch.testing.assert_close(getattr(got64, name), getattr(reference, name), rtol=1e-12, atol=1e-12)
    assert float((got32.x.double() - reference.x).abs().max()) <= _float32_bound(eager32.x, reference.x)
    assert _graphs_and_breaks() == (2, 0)
