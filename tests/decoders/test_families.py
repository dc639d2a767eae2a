"""Conformance: every registered model family (csd.models.registry.FAMILIES) and every family defined in the
tests (tests/families/) behaves as the samplers assume, checked on its untrained pair (the "random" PairSpec
of its catalog entry, csd.serving.catalog). A family added to the table without an untrained pair fails
here by name. What is a matter of
logic (batch invariance, verification, round trips) is compared in float64, the exact reference, on every CPU
(tests/helpers.py); float32 runs within the float32 rounding measured under other kernels."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise, Trajectory, cat_rows
from csd.core.precision import at_precision, weights_dtype
from csd.decoding import commit
from csd.models.registry import FAMILIES, family_of, load_model, save_model
from csd.sampling import generate
from csd.serving.catalog import entry_of
from csd.serving.pairs import random_spec, random_spec_pair
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.families import defined_families, registered
from tests.helpers import F32_ATOL, F64_ATOL, assert_differ64, assert_same64

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.kernels]
TEST_FAMILIES = defined_families()


@pytest.fixture(scope="module", params=sorted(FAMILIES) + sorted(TEST_FAMILIES))
def family_pair(request):
    """A family's untrained pair, the family registered while its tests run (a test family only then)."""
    arch = request.param
    with registered(*TEST_FAMILIES[arch]) if arch in TEST_FAMILIES else contextlib.nullcontext():
        kinds = [p.kind for p in entry_of(arch).pairs]
        assert "random" in kinds, f"family {arch!r} has no untrained pair (a PairSpec of kind 'random' in its entry)"
        yield arch, random_spec_pair(random_spec(arch))


@pytest.fixture(scope="module")
def pair64(family_pair):
    """The same pair in float64."""
    return family_pair[1].at_precision("float64")


def conditions(pair, n: int) -> list:
    return list(pair.prompts[:1]) * n if pair.is_text else [i % pair.traits.num_classes for i in range(n)]


def sampling(pair, **kw) -> SamplingConfig:
    """A short guided setting; in float64 for a float64 pair."""
    t = pair.traits
    steps = t.fixed_num_steps or 4
    precision = "float64" if weights_dtype(pair.target) == torch.float64 else "float32"
    knobs = dict(num_steps=steps, cfg_scale=2.0, cfg_schedule=t.cfg_schedule or "linear", head_steps=3)
    return SamplingConfig.from_knobs(**knobs, precision=precision, **kw)


def test_the_pair_is_of_its_family_and_its_traits_match_the_models(family_pair):
    arch, pair = family_pair
    for model in (pair.target, pair.draft):
        assert family_of(model) is FAMILIES[arch]
        assert model.traits == FAMILIES[arch].traits(model.config)
    assert pair.traits.conditions == ("prompts" if pair.is_text else "classes")


def test_plans_are_seeded_per_image(family_pair):
    _, pair = family_pair
    s = sampling(pair)
    both = pair.target.plan([3, 4], s, torch.device("cpu"))
    for i, seed in enumerate((3, 4)):
        alone = pair.target.plan([seed], s, torch.device("cpu"))
        assert torch.equal(both.orders[i], alone.orders[0])
    assert sum(both.sizes) == pair.target.seq_len and len(both.cfg) == both.num_steps == s.num_steps


def test_generation_is_seeded_and_batch_invariant(family_pair, pair64):
    """Exactly in float64; in float32 up to its rounding, which the float64 run bounds."""
    _, pair = family_pair
    s, cond = sampling(pair64), conditions(pair, 2)
    both = generate(pair64.target, cond, [5, 6], s)
    assert_same64(generate(pair64.target, cond, [5, 6], s).tokens, both.tokens, "the same seeds again")
    assert_same64(generate(pair64.target, cond[1:], [6], s).tokens[0], both.tokens[1], "image 1 alone")
    assert both.tokens.shape == (2, pair.target.seq_len, pair.target.token_dim)
    seven = generate(pair64.target, cond[:1], [7], s).tokens[0]
    assert_differ64(both.tokens[0], seven, "another seed", by=1e-2)
    f32 = generate(pair.target, cond, [5, 6], sampling(pair)).tokens
    alone32 = generate(pair.target, cond[1:], [6], sampling(pair)).tokens
    assert f32.dtype == torch.float32 and float((f32.double() - both.tokens).abs().max()) < F32_ATOL
    assert float((f32[1] - alone32[0]).abs().max()) < F32_ATOL


@pytest.mark.parametrize("criterion", ["aligned", "exact"])
@pytest.mark.parametrize("gamma", [1, 2])
def test_a_target_drafting_for_itself_accepts_what_it_verifies_in_the_same_context(pair64, criterion, gamma):
    """At gamma 1 the target verifies a step from the context it drafted it in: every row accepted. Longer
    blocks too where the family verifies in context (FamilyTraits.verifies_in_context); a family that verifies
    a block from the context before it accepts the block's first step for certain and not all of the rest.
    In float64: log r is 0 up to float64 rounding, so no draw can reject."""
    pair = pair64
    s, cond = sampling(pair), conditions(pair, 2)
    csd = CSDConfig.from_knobs(gamma=gamma, criterion=criterion)
    run = speculative_generate(pair.target, pair.target, cond, [1, 2], s, csd)
    if gamma == 1 or pair.traits.verifies_in_context:
        assert run.trace.acceptance_rate == 1.0
        assert run.trace.count(Maker.RESAMPLED) == run.trace.count(Maker.CAPPED) == 0
        assert_same64(run.tokens, generate(pair.target, cond, [1, 2], s).tokens, "accepted drafts")
        return
    t = run.trace
    in_block = t.block >= 0
    first = np.zeros_like(in_block)
    for i in range(t.batch):
        for b in np.unique(t.block[i][in_block[i]]):
            rows = t.block[i] == b
            first[i] |= rows & (t.ar_step[i] == t.ar_step[i][rows].min())
    assert first.any() and (in_block & ~first).any()
    np.testing.assert_allclose(t.accept_prob[first], 1.0, rtol=0.0, atol=F64_ATOL)
    assert (t.accept_prob[in_block & ~first] < 1 - 1e-4).any()  # later steps were drafted in another context


def test_verifying_a_one_step_block_equals_predicting_that_step(pair64):
    """Block verification of a single AR step reads the same context as predicting it: the same chains."""
    pair = pair64
    model, s = pair.target, sampling(pair)
    cond = model.check_conditions(conditions(pair, 2), 2, torch.device("cpu"))
    plan = model.plan([1, 2], s, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(*shape, generator=g).double()
    tokens = torch.zeros(2, model.seq_len, model.token_dim, dtype=torch.float64)
    mask = torch.ones(2, model.seq_len, dtype=torch.bool)
    first = plan.positions(0)
    mask.scatter_(1, first, False)
    tokens.scatter_(1, first[..., None].expand(-1, -1, model.token_dim), draw(*first.shape, model.token_dim))
    pos, steps = plan.positions(1), model.head_steps(s.head_steps)
    cfg = torch.full((pos.numel(),), plan.cfg[1], dtype=torch.float64)
    predicted = model.predict(model.start(cond, s), tokens, mask, pos, cfg, steps)
    drafted = draw(pos.numel(), model.token_dim)
    verified = model.verify(model.start(cond, s), tokens, mask, pos, cfg, steps, drafted=drafted)
    noise = ChainNoise(draw(pos.numel(), model.token_dim), draw(steps - 1, pos.numel(), model.token_dim))
    a, b = predicted.run(noise), verified.run(noise)
    assert_same64(a.x, b.x, "tokens")
    assert_same64(a.mean, b.mean, "means")
    assert predicted.rows == verified.rows == pos.numel()


def test_block_verification_reads_the_context_the_family_claims(pair64):
    """Verifying a drafted two-step block in one pass gives every row the chain that predicting its step gives
    from the context the family claims (FamilyTraits.verifies_in_context): after the block's drafted steps
    before it, or from the context before the block."""
    pair = pair64
    model, s = pair.target, sampling(pair)
    in_context = pair.traits.verifies_in_context
    cond = model.check_conditions(conditions(pair, 2), 2, torch.device("cpu"))
    plan = model.plan([1, 2], s, torch.device("cpu"))
    steps = model.head_steps(s.head_steps)
    tokens = torch.zeros(2, model.seq_len, model.token_dim, dtype=torch.float64)
    mask = torch.ones(2, model.seq_len, dtype=torch.bool)
    before = (tokens.clone(), mask.clone())
    g = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(*shape, generator=g).double()
    trajs, noises, positions = [], [], []
    state = model.start(cond, s)  # the steps' predictions share one generation's state
    for j in (0, 1):
        pos = plan.positions(j)
        k = pos.numel()
        noise = ChainNoise(draw(k, model.token_dim), draw(steps - 1, k, model.token_dim))
        context = (tokens, mask) if in_context else (before[0].clone(), before[1].clone())
        cfg = torch.full((k,), plan.cfg[j], dtype=torch.float64)
        traj = model.predict(state, *context, pos, cfg, steps).run(noise)
        commit(tokens, mask, pos, traj.x)
        trajs, noises, positions = trajs + [traj], noises + [noise], positions + [pos]
    pos = torch.cat(positions, dim=1)
    cfg = cat_rows([torch.full((p.numel(),), plan.cfg[j], dtype=torch.float64) for j, p in enumerate(positions)], 2)
    expected = Trajectory.join(trajs, 2)
    chain = model.verify(model.start(cond, s), *before, pos, cfg, steps, drafted=expected.x)
    verified = chain.run(ChainNoise.join(noises, 2))
    assert_same64(verified.x, expected.x, "tokens")
    assert_same64(verified.mean, expected.mean, "means")


def test_bad_conditions_are_refused_by_name(family_pair):
    _, pair = family_pair
    model, s = pair.target, sampling(pair)
    with pytest.raises(ValueError, match="one .* per seed"):
        generate(model, conditions(pair, 1), [0, 1], s)
    bad, match = ([""], "must not be empty") if pair.is_text else ([pair.traits.num_classes], "class labels must be in")
    with pytest.raises(ValueError, match=match):
        generate(model, bad, [0], s)


def test_the_family_rules_on_sampler_settings_are_named_errors(family_pair):
    _, pair = family_pair
    t = pair.traits
    if t.fixed_num_steps is not None:
        with pytest.raises(ValueError, match=rf"num_steps \(AR steps\) must equal {t.fixed_num_steps}"):
            generate(pair.target, conditions(pair, 1), [0], SamplingConfig(num_steps=t.fixed_num_steps - 1))
    else:
        with pytest.raises(ValueError, match=r"num_steps \(AR steps\) must be in \[1, "):
            generate(pair.target, conditions(pair, 1), [0], SamplingConfig(num_steps=pair.target.seq_len + 1))
    generate(pair.target, conditions(pair, 1), [0], t.cheapest())  # the warm-up setting is always accepted


def test_a_project_file_round_trips_to_the_same_tokens(family_pair, tmp_path):
    """Every weight comes back bit for bit, so the tokens are the same: compared in float64, since in float32
    a kernel may round a loaded tensor (another address, another alignment) otherwise on some CPUs."""
    _, pair = family_pair
    path = save_model(pair.draft, tmp_path / "draft")
    loaded = load_model(path)
    assert type(loaded) is type(pair.draft) and loaded.config == pair.draft.config
    saved, back = pair.draft.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    loaded64, draft64 = at_precision(loaded, "float64"), at_precision(pair.draft, "float64")
    s, cond = sampling(pair).with_knobs(**{"precision": "float64"}), conditions(pair, 1)
    assert_same64(generate(loaded64, cond, [3], s).tokens, generate(draft64, cond, [3], s).tokens)


def test_the_token_layout_decodes_every_token_to_its_own_square_of_pixels(family_pair):
    """Hand-computed: a value v decodes to the pixel round((v + 1) * 127.5), so one token of +1 among tokens
    of -1 is a white square of 32 * 32 / N pixels in a black image: the first token at the top left, the
    last at the bottom right (raster patches, or xAR's raster of cells), and tokens of 0 are grey 128."""
    _, pair = family_pair
    n, d = pair.num_tokens, pair.target.token_dim
    tokens = torch.full((3, n, d), -1.0)
    tokens[0, 0], tokens[1, n - 1], tokens[2] = 1.0, 1.0, 0.0
    images = pair.images(tokens)
    assert images.shape == (3, 32, 32, 3) and images.dtype == torch.uint8
    side = int(np.sqrt(32 * 32 // n))
    assert side * side * n == 32 * 32
    for image, corner in ((images[0], np.s_[:side, :side]), (images[1], np.s_[-side:, -side:])):
        white = (image == 255).all(-1)
        assert white[corner].all() and int(white.sum()) == side * side
        assert ((image == 0) | (image == 255)).all()  # nothing in between: every other pixel black
    assert (images[2] == 128).all()
