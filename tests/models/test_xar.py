"""xAR's architecture: the official parameter counts, the official module tree and numbers, the layout
of cells and the block-causal attention.

tests/data/xar_reference.pt was made by tests/data/make_xar_reference.py from the official code, in float32:
our network and sampler are compared with it within bounds measured under other kernels (below). What is a
matter of logic (block causality, verification, batch invariance, round trips, acceptance) is compared in
float64, the exact reference, on every CPU (tests/helpers.py); in float32 it holds up to rounding."""

from pathlib import Path

import numpy as np
import pytest
import torch

from csd.core.precision import at_precision
from csd.models.xar import XAR, block_causal_mask, cell_order, xar_config
from tests.helpers import assert_differ64, assert_same64, sampling64

pytestmark = pytest.mark.usefixtures("one_thread")
REF = torch.load(Path(__file__).parents[1] / "data" / "xar_reference.pt", weights_only=True)

# Our network and sampler against the official float32 numbers (tests/data/xar_reference.pt). Measured
# (torch 2.13.0, AVX-512 CPU; also under two threads, oneDNN off, and the AVX2 and default capabilities):
# * the velocity of a whole sequence (|v| <= 2.2): our float32 network within 4.8e-7 of it (AVX2; 3.6e-7
#   oneDNN off and default, 0 on this CPU's own kernels), our float64 network within 5.8e-7 under every
#   setting (the reference's own float32 rounding). 5x the worst:
V_ATOL = 3e-6
# * the whole guided run (4 cells x 5 flow steps, |tokens| <= 3.6): our float32 sampler within 8.9e-7
#   (oneDNN off, AVX2), our float64 sampler within 6.4e-7 under every setting. 5x the worst:
RUN_ATOL = 5e-6


@pytest.mark.parametrize("name,millions", [("xar_base", 172.6), ("xar_large", 608.4), ("xar_huge", 1186.0)])
def test_parameter_counts_equal_the_official_ones(name, millions):
    with torch.device("meta"):  # no memory: only the shapes
        model = XAR(xar_config(name))
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions


TINY_BASE = dict(embed_dim=32, encoder_depth=1, decoder_depth=1, encoder_num_heads=2, decoder_num_heads=2)


@pytest.fixture(scope="module")
def model() -> XAR:
    m = XAR(xar_config("xar_base", **TINY_BASE)).eval()
    m.load_state_dict(REF["state"], strict=True)  # parameters and buffers (mask, RoPE tables)
    return m


@pytest.fixture(scope="module")
def model64(model) -> XAR:
    """The same network in float64."""
    return at_precision(model, "float64")


@pytest.mark.kernels
def test_the_official_state_dict_loads_strictly_buffers_included(model):
    assert set(model.state_dict()) == set(REF["state"])
    with torch.random.fork_rng(devices=[]):
        ours = XAR(xar_config("xar_base", **TINY_BASE)).state_dict()  # made by our code, not loaded
    for k in ("mask", "encoder_blocks.0.attn.rope.freqs_cos", "decoder_blocks.0.attn.rope.freqs_sin"):
        # elementwise tables (measured bit for bit equal under every kernel setting above)
        torch.testing.assert_close(ours[k], REF["state"][k])  # our tables equal theirs


@pytest.mark.kernels
def test_velocity_of_a_whole_sequence_matches_the_official_network(model, model64):
    """In float32 as the reference, and in float64 (the reference's own rounding): within V_ATOL."""
    with torch.no_grad():
        v = model.velocity(REF["x"], REF["labels"], REF["t"])
        v64 = model64.velocity(REF["x"].double(), REF["labels"], REF["t"].double())
    torch.testing.assert_close(v, REF["v"], rtol=0.0, atol=V_ATOL)
    torch.testing.assert_close(v64, REF["v"].double(), rtol=0.0, atol=V_ATOL)


def test_cells_are_row_major_blocks_and_attention_is_block_causal():
    order = cell_order(4, 4)  # a 4 x 4 grid in 4 cells of 2 x 2
    assert order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    mask = block_causal_mask(3, 2)[0, 0]
    assert (mask == 0).int().tolist() == [[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2 + [[1] * 6] * 2


@pytest.mark.kernels
def test_a_cell_never_sees_later_cells(model64):
    """In float64: the earlier cells' velocities are the same numbers up to float64 rounding."""
    x, labels, t = REF["x"].double(), REF["labels"], REF["t"].double()
    with torch.no_grad():
        v = model64.velocity(x, labels, t)
        changed = x.clone()
        changed[:, 128:] += 1.0  # change cells 2 and 3
        w = model64.velocity(changed, labels, t)
        prefix = model64.velocity(x[:, :128], labels, t[:, :2])  # cells 0 and 1 alone
    assert_same64(w[:, :128], v[:, :128], "cells 0 and 1 beside changed later cells")
    assert_same64(prefix, v[:, :128], "cells 0 and 1 alone")
    assert_differ64(w[:, 128:], v[:, 128:], "the changed cells", by=1e-2)


@pytest.mark.kernels
def test_training_loss_is_flow_matching_and_seeded():
    m = XAR(xar_config("xar_test"))
    m64 = at_precision(m, "float64")
    tokens, labels = torch.randn(3, 16, 16, dtype=torch.float64), torch.tensor([1, 2, 3])
    a = m64(tokens, labels, torch.Generator().manual_seed(0))
    b = m64(tokens, labels, torch.Generator().manual_seed(0))
    assert_same64(a, b, "the same seed again")
    assert a.item() > 0
    loss = m(tokens.float(), labels, torch.Generator().manual_seed(0))  # the float32 model trains
    loss.backward()
    assert m.pred.weight.grad.abs().sum() > 0


def test_bad_configs_are_refused_by_name():
    with pytest.raises(ValueError, match=r"cells \(3\) must be a square"):
        xar_config("xar_test", cells=3)
    with pytest.raises(ValueError, match=r"embed_dim \(36\) / encoder_num_heads \(6\) must be a multiple of 4"):
        xar_config("xar_test", embed_dim=36, encoder_num_heads=6, decoder_num_heads=3)
    with pytest.raises(ValueError, match=r"decoder_num_heads \(5\) must be a multiple of 4"):
        xar_config("xar_test", decoder_num_heads=5)


def test_encoder_and_decoder_take_their_own_head_counts():
    """As the official constructor's encoder_num_heads and decoder_num_heads."""
    m = XAR(xar_config("xar_test", encoder_num_heads=2, decoder_num_heads=4))
    assert [b.attn.num_heads for b in m.encoder_blocks] == [2] and [b.attn.num_heads for b in m.decoder_blocks] == [4]
    x = torch.randn(1, 16, 16)
    assert m.velocity(x, torch.tensor([0]), torch.zeros(1, 4)).shape == (1, 16, 16)


@pytest.mark.kernels
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_a_whole_guided_run_replays_the_official_sampler(model, model64, precision):
    """The official sample_tokens (one cell at a time, KV cache, Euler-Maruyama, CFG ramped per cell),
    its draws recorded, replayed through the family interface: the same tokens, within RUN_ATOL (the
    reference's float32 rounding and ours)."""
    from csd.config import SamplingConfig
    from csd.core.chain import ChainNoise

    net = model64 if precision == "float64" else model
    dtype = torch.float64 if precision == "float64" else torch.float32
    run = REF["run"]
    labels, steps, b = run["labels"], run["num_steps"], 2
    config = SamplingConfig(num_steps=4, cfg_scale=run["cfg"], cfg_schedule="linear", precision=precision)
    plan = net.plan([0, 1], config, torch.device("cpu"))
    tokens = torch.zeros(b, net.seq_len, net.token_dim, dtype=dtype)
    mask = torch.ones(b, net.seq_len, dtype=torch.bool)
    draws = iter(run["draws"])
    state = net.start(labels, config)  # one generation: its KV cache grows by a cell per step, as the official's
    for s in range(4):
        pos = plan.positions(s)
        assert pos.tolist() == [[s], [s]]  # raster order of cells
        xi = next(draws).reshape(b, -1).double()
        eps = torch.stack([next(draws).reshape(b, -1) for _ in range(steps - 1)])
        with torch.no_grad():
            chain = net.predict(state, tokens, mask, pos, torch.full((b,), plan.cfg[s], dtype=dtype), steps)
            x = chain.run(ChainNoise(xi, eps)).x
        assert x.dtype == dtype
        tokens[:, s], mask[:, s] = x, False
    raster = torch.empty(b, 256, 16, dtype=dtype)
    raster[:, cell_order(16, 4)] = tokens.reshape(b, 256, 16)  # cells back onto the grid
    expected = run["tokens"].reshape(b, 16, 256).transpose(1, 2).to(dtype)
    torch.testing.assert_close(raster, expected, rtol=0.0, atol=RUN_ATOL)


def _noisy(model: XAR) -> XAR:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _seeded_test_model(seed: int = 0) -> XAR:
    """The xar_test model with seeded noisy weights (layer init and noise read the global generator)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _noisy(XAR(xar_config("xar_test")))


@pytest.mark.kernels
def test_generation_through_the_family_is_seeded_and_batch_invariant():
    """Exactly in float64; in float32 up to rounding."""
    from csd.sampling import generate

    m = at_precision(_seeded_test_model(), "float64")
    s = sampling64(num_steps=4, cfg_scale=2.0, cfg_schedule="linear")
    both = generate(m, [1, 2], [5, 6], s)
    assert_same64(generate(m, [2], [6], s).tokens[0], both.tokens[1], "image 1 alone")
    assert_same64(generate(m, [1, 2], [5, 6], s).tokens, both.tokens, "the same seeds again")
    assert both.trace.target_passes == 4
    with pytest.raises(ValueError, match=r"num_steps \(AR steps\) must equal 4 for this xAR model"):
        generate(m, [1], [0], sampling64(num_steps=3))


@pytest.fixture(scope="module")
def xar_pair():
    """A float64 xAR pair (the float32 pair's weights, widened): runs are compared exactly in float64."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = xar_config("xar_test", grid=8, cells=16, token_dim=3)  # 16 cells of 2 x 2 tokens
        target = _noisy(XAR(replace_config(config, embed_dim=48)))
        draft = _noisy(XAR(config))
    return at_precision(target, "float64"), at_precision(draft, "float64")


def replace_config(config, **changes):
    from dataclasses import replace

    return replace(config, **changes)


@pytest.mark.kernels
def test_one_pass_block_verification_equals_verifying_the_cells_one_by_one(xar_pair):
    """In float64: the same chains up to float64 rounding."""
    from csd.core.chain import ChainNoise

    target, _ = xar_pair
    b, k, first = 2, 3, 5
    config = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear")
    g = torch.Generator().manual_seed(3)
    draw = lambda *shape: torch.randn(*shape, generator=g).double()
    tokens = draw(b, target.seq_len, target.token_dim)
    mask = torch.ones(b, target.seq_len, dtype=torch.bool)
    mask[:, :first] = False
    drafted = draw(b * k, target.token_dim)  # cells 5, 6, 7 of each image
    labels, steps = torch.tensor([1, 4]), 6
    cfg = torch.tensor([1.5, 1.6, 1.7] * b, dtype=torch.float64)
    noise = ChainNoise(draw(b * k, target.token_dim), draw(steps - 1, b * k, target.token_dim))
    pos = torch.arange(first, first + k).expand(b, -1)
    with torch.no_grad():
        joint = target.verify(target.start(labels, config), tokens, mask, pos, cfg, steps, drafted=drafted).run(noise)
        rows = lambda a, j: a.reshape(*a.shape[:-2], b, k, -1)[..., j, :]
        state = target.start(labels, config)  # one state for the cells one by one: each call reuses the last's
        for j in range(k):
            context = tokens.clone()
            context[:, first : first + j] = drafted.reshape(b, k, -1)[:, :j]
            one = target.predict(state, context, mask, pos[:, j : j + 1], rows(cfg[:, None], j)[:, 0], steps)
            single = one.run(ChainNoise(rows(noise.xi, j), rows(noise.eps, j)))
            assert_same64(single.x, rows(joint.x, j), f"cell {first + j}'s tokens")
            assert_same64(single.mean, rows(joint.mean, j), f"cell {first + j}'s means")


@pytest.mark.kernels
def test_csd_on_an_xar_pair_verifies_blocks_of_cells(xar_pair):
    """In float64: pre-filled cells and image 1 alone are the same numbers up to float64 rounding, and the
    target drafting for itself has log r = 0 up to rounding, so no draw can reject."""
    from csd.config import CSDConfig
    from csd.sampling import generate
    from csd.speculative import speculative_generate
    from csd.trace import Maker

    target, draft = xar_pair
    s = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear", head_steps=4)
    c = CSDConfig(gamma=5, prefill=0.1)
    spec = speculative_generate(target, draft, [1, 2], [5, 6], s, c)
    base = generate(target, [1, 2], [5, 6], s)
    t = spec.trace
    assert base.trace.target_passes == 16 and t.target_passes == 2 + 3  # 2 pre-filled cells, blocks of 5, 5, 4
    assert set(np.unique(t.maker).tolist()) <= {Maker.PREFILL, Maker.ACCEPTED, Maker.RESAMPLED, Maker.CAPPED}
    assert_same64(spec.tokens[:, :2], base.tokens[:, :2], "pre-filled cells")  # same noise, same cells
    alone = speculative_generate(target, draft, [2], [6], s, c)
    assert_same64(alone.tokens[0], spec.tokens[1], "image 1 alone")
    assert (alone.trace.maker[0] == t.maker[1]).all()
    same = speculative_generate(target, target, [1, 2], [5, 6], s, c)  # the target drafting for itself
    assert same.trace.acceptance_rate == 1.0


def _encoded_cells(model: XAR, monkeypatch) -> list[int]:
    """The number of clean cells each context_cache call of ``model`` encodes, recorded from now on."""
    calls, inner = [], model.context_cache

    def recording(clean, labels, past=None):
        calls.append(clean.shape[1] // model.config.cell_len)
        return inner(clean, labels, past)

    monkeypatch.setattr(model, "context_cache", recording)
    return calls


@pytest.mark.kernels
def test_a_generation_encodes_each_clean_cell_once(xar_pair, monkeypatch):
    """The KV cache of a generation grows by one cell per AR step, as the official sampler's: 15 cells encoded
    for 16 (re-encoding the context at every step would be 120). Under CSD the loop rewinds both states to
    each block's start once it is decided (a redrawn cell is not compared on the host), so each model encodes
    a block's cells once more in the next block: with the target drafting for itself (gamma 5, cells 0-1
    pre-filled, blocks 2-6, 7-11, 12-15, every cell accepted) the draft encodes 6 + 9 + 8 and the target
    1 + 5 + 9 + 8: 23 each."""
    from csd.config import CSDConfig
    from csd.sampling import generate
    from csd.speculative import speculative_generate

    target, _ = xar_pair
    s = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear", head_steps=4)
    calls = _encoded_cells(target, monkeypatch)
    generate(target, [1, 2], [5, 6], s)
    assert calls == [1] * 15
    calls.clear()
    same = speculative_generate(target, target, [1, 2], [5, 6], s, CSDConfig(gamma=5, prefill=0.1))
    assert same.trace.acceptance_rate == 1.0 and sum(calls) == 2 * 23


@pytest.mark.kernels
def test_a_redrawn_cell_is_encoded_again_from_where_the_context_changed(xar_pair, monkeypatch):
    """A state reused after a cell of its context changed (a drafted cell rejected and redrawn) encodes that
    cell and the ones after it again: the same chains as a fresh state's, up to float64 rounding; a chain made
    before keeps its own context."""
    from csd.core.chain import ChainNoise

    target, _ = xar_pair
    b, steps, config = 2, 4, sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear")
    g = torch.Generator().manual_seed(5)
    draw = lambda *shape: torch.randn(*shape, generator=g).double()
    tokens, labels = draw(b, target.seq_len, target.token_dim), torch.tensor([2, 8])
    mask = torch.ones(b, target.seq_len, dtype=torch.bool)
    noise = ChainNoise(draw(b, target.token_dim), draw(steps - 1, b, target.token_dim))
    at = lambda cell: torch.full((b, 1), cell)
    cfg = torch.full((b,), 1.5, dtype=torch.float64)
    state, calls = target.start(labels, config), _encoded_cells(target, monkeypatch)
    with torch.no_grad():
        first = target.predict(state, tokens, mask, at(6), cfg, steps)
        before = first.run(noise)
        redrawn = tokens.clone()
        redrawn[1, 3] = draw(target.token_dim)  # image 1's cell 3
        again = target.predict(state, redrawn, mask, at(8), cfg, steps).run(noise)
        assert calls == [6, 5]  # cells 0-5, then 3-7
        fresh = target.predict(target.start(labels, config), redrawn, mask, at(8), cfg, steps).run(noise)
        assert_same64(again.x, fresh.x, "tokens")
        assert_same64(again.mean, fresh.mean, "means")
        assert torch.equal(first.run(noise).x, before.x)


def test_cells_of_pixel_patches_round_trip_and_decode_to_the_image():
    from csd.models.tokenizer import CellTokenizer, PixelTokenizer

    tok = CellTokenizer(PixelTokenizer(4), 8, 16)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    cells = tok.encode(images)
    assert cells.shape == (2, 16, 192) and tok.token_dim == 192
    assert torch.equal(tok.decode(cells), images)
    # The first cell is the top-left 2 x 2 patches: the image's top-left 8 x 8 pixels.
    assert torch.equal(
        tok.decode(torch.where(torch.arange(16)[None, :, None] == 0, cells, 0.0))[:, :, :8, :8], images[:, :, :8, :8]
    )


@pytest.mark.kernels
def test_the_xar_trainer_trains_saves_and_the_model_samples(tmp_path, restore_threads):
    """One step, checked by hand: the logged loss is the flow-matching objective of the seeded initial model
    on the first batch; AdamW's first update moves every weight by at most the learning rate (m / sqrt(v) =
    g / |g|), most by exactly it; the saved weights are the EMA 0.1 init + 0.9 trained (decay (1 + 0) / 10
    at step 0); and the loaded model is the trainer's EMA model bit for bit, so it samples the same tokens
    (compared in float64). The trainer trains in float32 only: the logged loss is compared with the same
    float32 computation made again in this process (measured equal bit for bit under two threads, oneDNN off
    and the AVX2 and default capabilities; rel 1e-6, ~8 float32 ulps, leaves room for other kernels)."""
    import json

    from csd.core.rng import stream_seed
    from csd.models.registry import load_model
    from csd.sampling import generate
    from csd.training.trainer import ema_decay_at, lr_at, run
    from csd.training.xar_models import XARTrainer, parse_args

    out = tmp_path / "x"
    args = ["--config", "shapes_xar_draft", "--out", str(out), "--steps", "1", "--batch-size", "4", "--data-size", "8"]
    with torch.random.fork_rng(devices=[]):  # the trainer seeds the global generator for its layer init
        cfg = parse_args(args)
        trainer = run(cfg, XARTrainer)
        torch.manual_seed(stream_seed(cfg.seed, "train/init"))  # the trainer's seeded init, made again
        init = XAR(xar_config("shapes_xar_draft"))
        fresh = XARTrainer(cfg)  # the same generators: the first batch and its noise again
        with torch.no_grad():
            first_loss = fresh.objective(*fresh.batch()).item()
    (record,) = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["loss"] == pytest.approx(first_loss, rel=1e-6)
    lr, d0 = lr_at(0, cfg), ema_decay_at(0, cfg.ema_decay)
    assert (lr, d0) == (pytest.approx(cfg.lr / cfg.warmup_steps), pytest.approx(0.1))
    w0, w1 = dict(init.named_parameters()), dict(trainer.model.named_parameters())
    with torch.no_grad():
        step = torch.cat([(w1[k].double() - w0[k].double() * (1 - lr * cfg.weight_decay)).reshape(-1) for k in w0])
        ulp = torch.cat([w0[k].abs().reshape(-1) for k in w0]).double() * torch.finfo(torch.float32).eps
    assert (step.abs() <= lr + 2 * ulp).all()  # |g / (|g| + eps)| <= 1, up to float32 rounding of the weight
    assert step.abs().median() == pytest.approx(lr, rel=0.02)  # where g is not ~0: exactly the learning rate
    model = load_model(f"{out}.safetensors")
    assert isinstance(model, XAR) and model.config == xar_config("shapes_xar_draft")
    for k, v in model.named_parameters():
        torch.testing.assert_close(v, d0 * w0[k] + (1 - d0) * w1[k], atol=1e-7, rtol=1e-6)
    saved, loaded = trainer.ema.state_dict(), model.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    s = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear", head_steps=3)
    g = generate(at_precision(model, "float64"), [3], [0], s)
    assert g.tokens.shape == (1, 16, 192)
    assert_same64(g.tokens, generate(at_precision(trainer.ema, "float64"), [3], [0], s).tokens, "the loaded model")


@pytest.mark.kernels
def test_official_checkpoints_load_strictly_and_name_what_does_not_fit(tmp_path):
    from csd.models.checkpoint import CheckpointError
    from csd.models.xar import load_official_xar

    config = xar_config("xar_base", **TINY_BASE)
    torch.save(REF["state"], tmp_path / "xAR-tiny.pth")
    model = load_official_xar(tmp_path / "xAR-tiny.pth", config)
    with torch.no_grad():
        v = model.velocity(REF["x"], REF["labels"], REF["t"])
    torch.testing.assert_close(v, REF["v"], rtol=0.0, atol=V_ATOL)  # the bound measured above
    state = dict(REF["state"])
    state["pred.weight"] = state["pred.weight"][:8]
    state["extra.weight"] = state.pop("decoder_norm.weight")
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(
        CheckpointError, match=r"(?s)missing keys \(1\): decoder_norm.weight.*unexpected keys \(1\): extra.*pred.weight"
    ):
        load_official_xar(tmp_path / "bad.pth", config)


@pytest.mark.kernels
def test_per_token_acceptance_is_a_measured_option(xar_pair):
    """In float64 (pre-fill compared up to float64 rounding; the target drafting for itself cannot reject)."""
    from csd.config import CSDConfig
    from csd.speculative import speculative_generate

    target, draft = xar_pair
    s = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear", head_steps=4)
    cell = speculative_generate(target, draft, [1, 2], [5, 6], s, CSDConfig(gamma=5, prefill=0.1))
    token = speculative_generate(
        target, draft, [1, 2], [5, 6], s, CSDConfig.from_knobs(gamma=5, prefill=0.1, acceptance_unit="token")
    )
    t = token.trace
    verified = t.verified
    assert t.unit_accepted is not None and ((t.unit_accepted[verified] >= 0) & (t.unit_accepted[verified] <= 1)).all()
    assert t.acceptance_rate <= t.unit_acceptance_rate  # a cell is accepted only when all its tokens are
    assert cell.trace.unit_accepted is None and np.isnan(cell.trace.summary()["unit_acceptance_rate"])
    assert_same64(token.tokens[:, :2], cell.tokens[:, :2], "pre-fill")  # pre-fill is the same
    same = speculative_generate(target, target, [1], [5], s, CSDConfig.from_knobs(gamma=5, acceptance_unit="token"))
    assert same.trace.unit_acceptance_rate == 1.0
    with pytest.raises(ValueError, match="acceptance_unit 'token' needs criterion 'aligned'"):
        speculative_generate(
            target, draft, [1], [5], s, CSDConfig.from_knobs(gamma=5, acceptance_unit="token", criterion="exact")
        )


def test_per_token_acceptance_needs_rows_of_several_tokens(random_models):
    from csd.config import CSDConfig, SamplingConfig
    from csd.speculative import speculative_generate

    with pytest.raises(ValueError, match="rows hold several tokens"):
        speculative_generate(
            random_models.target,
            random_models.draft,
            [1],
            [0],
            SamplingConfig(num_steps=4),
            CSDConfig.from_knobs(acceptance_unit="token"),
        )


@pytest.mark.kernels
def test_selected_rows_of_a_block_equal_those_rows_run_alone(xar_pair):
    """The exact criterion's resampler runs some rows of a block: the same numbers as the full block's
    rows (the target's verification chain and the draft's joined chains), whatever the other rows hold. In
    float64: up to float64 rounding."""
    from csd.core.chain import ChainNoise

    target, draft = xar_pair
    b, k, first, steps = 2, 3, 4, 5
    config = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear")
    g = torch.Generator().manual_seed(11)
    draw = lambda *shape: torch.randn(*shape, generator=g).double()
    tokens = draw(b, target.seq_len, target.token_dim)
    mask = torch.ones(b, target.seq_len, dtype=torch.bool)
    mask[:, :first] = False
    drafted = draw(b * k, target.token_dim)
    labels, cfg = torch.tensor([3, 7]), torch.tensor([1.2, 1.4, 1.6] * b, dtype=torch.float64)
    pos = torch.arange(first, first + k).expand(b, -1)
    noise = ChainNoise(draw(b * k, target.token_dim), draw(steps - 1, b * k, target.token_dim))
    rows = torch.tensor([4, 1])
    with torch.no_grad():
        chain_p = target.verify(target.start(labels, config), tokens, mask, pos, cfg, steps, drafted=drafted)
        full = chain_p.run(noise)
        part = chain_p.select(rows).run(noise.select(rows))
        assert_same64(part.x, full.x[rows], "selected rows' tokens")
        assert_same64(part.states, full.states[:, rows], "selected rows' states")
        nested = chain_p.select(torch.tensor([5, 4, 1])).select(torch.tensor([1, 2]))
        assert_same64(nested.run(noise.select(rows)).x, full.x[rows], "a selection of a selection")
        mean, std = chain_p.select(rows).evaluate(full.states[:, rows])
        assert_same64(mean, full.mean[:, rows], "means")
        assert_same64(std, full.std[:, rows], "standard deviations")

        # The draft's block: one chain per cell, joined image-major.
        per_cell, state = [], draft.start(labels, config)
        for j in range(k):
            context = tokens.clone()
            context[:, first : first + j] = drafted.reshape(b, k, -1)[:, :j]
            per_cell.append(draft.predict(state, context, mask, pos[:, j : j + 1], cfg.reshape(b, k)[:, j], steps))
        joined = draft.join(per_cell, b)
        whole = joined.run(noise)
        assert joined.rows == b * k and joined.num_steps() == steps
        for j in range(k):
            alone = per_cell[j].run(noise.select(torch.arange(b) * k + j))
            assert_same64(alone.x, whole.x[torch.arange(b) * k + j], f"cell {first + j} alone")
        mean_q, _ = joined.select(rows).evaluate(full.states[:, rows])
        assert_same64(mean_q, joined.evaluate(full.states)[0][:, rows], "the draft's selected means")


@pytest.mark.kernels
def test_the_exact_criterion_runs_on_xar_and_is_batch_invariant(xar_pair):
    """In float64: image 1 alone is the same numbers and the same decisions up to float64 rounding."""
    from csd.config import CSDConfig
    from csd.speculative import speculative_generate
    from csd.trace import Maker

    target, draft = xar_pair
    s = sampling64(num_steps=16, cfg_scale=2.0, cfg_schedule="linear", head_steps=4)
    c = CSDConfig.from_knobs(gamma=4, prefill=0.1, criterion="exact", max_tries=3)
    spec = speculative_generate(target, draft, [1, 2], [5, 6], s, c)
    t = spec.trace
    assert (t.maker == Maker.RESAMPLED).any() or (t.maker == Maker.CAPPED).any()  # the resampler ran
    alone = speculative_generate(target, draft, [2], [6], s, c)
    assert_same64(alone.tokens[0], spec.tokens[1], "image 1 alone")
    assert (alone.trace.maker[0] == t.maker[1]).all()
    assert (alone.trace.resample_tries[0] == t.resample_tries[1]).all()
    same = speculative_generate(target, target, [1], [5], s, c)
    assert same.trace.acceptance_rate == 1.0


@pytest.mark.kernels
def test_a_lower_backbone_precision_runs_the_network_under_autocast():
    """SamplingConfig.precision applies to xAR's network too (its chain states stay float64): bfloat16
    tokens differ from float32 ones, a little. Measured on the seeded model (this CPU, two threads, oneDNN
    off, AVX2, default): bfloat16 moves the tokens by 1.7e-2 to 1.9e-2 at most, 3.4e-3 to 3.7e-3 of their
    mean size on average; float32 rounding alone moves them by at most 1.7e-6 (against float64)."""
    from dataclasses import replace

    from csd.config import SamplingConfig
    from csd.sampling import generate

    m = _seeded_test_model()
    base = SamplingConfig(num_steps=4, cfg_scale=2.0, cfg_schedule="linear")
    a = generate(m, [1], [0], base).tokens
    b = generate(m, [1], [0], replace(base, precision="bfloat16")).tokens
    assert b.dtype == torch.float32
    assert (a - b).abs().max() > 1e-3  # bfloat16 rounding shows, far above float32's
    assert (a - b).abs().mean() < 0.05 * a.abs().mean()  # over 10x the measured 3.7e-3
