"""Conformance: every registered model family (csd.models.registry.FAMILIES) and every family defined in the
tests (tests/families/) behaves as the samplers assume, checked on its untrained pair (the "random" PairSpec
of its row). A family added to the table without an untrained pair fails here by name."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from csd.chain import ChainNoise, Trajectory, cat_rows
from csd.config import CSDConfig, SamplingConfig
from csd.decoding import commit
from csd.experiments.pairs import random_spec, random_spec_pair
from csd.models.registry import FAMILIES, family_of, load_model, save_model
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.families import defined_families, registered

pytestmark = pytest.mark.usefixtures("one_thread")
TEST_FAMILIES = defined_families()


@pytest.fixture(scope="module", params=sorted(FAMILIES) + sorted(TEST_FAMILIES))
def family_pair(request):
    """A family's untrained pair, the family registered while its tests run (a test family only then)."""
    arch = request.param
    with registered(TEST_FAMILIES[arch]) if arch in TEST_FAMILIES else contextlib.nullcontext():
        kinds = [p.kind for p in FAMILIES[arch].pairs]
        assert "random" in kinds, f"family {arch!r} has no untrained pair (a PairSpec of kind 'random' in its row)"
        yield arch, random_spec_pair(random_spec(arch))


def conditions(pair, n: int) -> list:
    return list(pair.prompts[:1]) * n if pair.is_text else [i % pair.traits.num_classes for i in range(n)]


def sampling(pair, **kw) -> SamplingConfig:
    t = pair.traits
    steps = t.fixed_num_steps or 4
    return SamplingConfig(num_steps=steps, cfg_scale=2.0, cfg_schedule=t.cfg_schedule or "linear", head_steps=3, **kw)


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


def test_generation_is_seeded_and_batch_invariant(family_pair):
    _, pair = family_pair
    s, cond = sampling(pair), conditions(pair, 2)
    both = generate(pair.target, cond, [5, 6], s)
    again = generate(pair.target, cond, [5, 6], s)
    alone = generate(pair.target, cond[1:], [6], s)
    assert torch.equal(both.tokens, again.tokens)
    torch.testing.assert_close(both.tokens[1], alone.tokens[0], rtol=1e-4, atol=1e-4)
    assert both.tokens.shape == (2, pair.target.seq_len, pair.target.token_dim)
    assert not torch.equal(both.tokens[0], generate(pair.target, cond[:1], [7], s).tokens[0])  # seeds matter


@pytest.mark.parametrize("criterion", ["aligned", "exact"])
@pytest.mark.parametrize("gamma", [1, 2])
def test_a_target_drafting_for_itself_accepts_what_it_verifies_in_the_same_context(family_pair, criterion, gamma):
    """At gamma 1 the target verifies a step from the context it drafted it in: every row accepted. Longer
    blocks too where the family verifies in context (FamilyTraits.verifies_in_context); a family that verifies
    a block from the context before it accepts the block's first step for certain and not all of the rest."""
    _, pair = family_pair
    s, cond = sampling(pair), conditions(pair, 2)
    csd = CSDConfig(gamma=gamma, criterion=criterion)
    run = speculative_generate(pair.target, pair.target, cond, [1, 2], s, csd)
    if gamma == 1 or pair.traits.verifies_in_context:
        assert run.trace.acceptance_rate == 1.0
        assert run.trace.count(Maker.RESAMPLED) == run.trace.count(Maker.CAPPED) == 0
        torch.testing.assert_close(run.tokens, generate(pair.target, cond, [1, 2], s).tokens, rtol=1e-4, atol=1e-4)
        return
    t = run.trace
    in_block = t.block >= 0
    first = np.zeros_like(in_block)
    for i in range(t.batch):
        for b in np.unique(t.block[i][in_block[i]]):
            rows = t.block[i] == b
            first[i] |= rows & (t.ar_step[i] == t.ar_step[i][rows].min())
    assert first.any() and (in_block & ~first).any()
    np.testing.assert_allclose(t.accept_prob[first], 1.0, atol=1e-4)
    assert (t.accept_prob[in_block & ~first] < 1 - 1e-4).any()  # later steps were drafted in another context


def test_verifying_a_one_step_block_equals_predicting_that_step(family_pair):
    """Block verification of a single AR step reads the same context as predicting it: the same chains."""
    _, pair = family_pair
    model, s = pair.target, sampling(pair)
    cond = model.check_conditions(conditions(pair, 2), 2, torch.device("cpu"))
    plan = model.plan([1, 2], s, torch.device("cpu"))
    tokens, mask = torch.zeros(2, model.seq_len, model.token_dim), torch.ones(2, model.seq_len, dtype=torch.bool)
    first = plan.positions(0)
    mask.scatter_(1, first, False)
    tokens.scatter_(1, first[..., None].expand(-1, -1, model.token_dim), torch.randn(*first.shape, model.token_dim))
    pos, steps = plan.positions(1), model.head_steps(s.head_steps)
    cfg = torch.full((pos.numel(),), plan.cfg[1])
    predicted = model.predict(tokens, mask, cond, pos, cfg, s, steps)
    drafted = torch.randn(pos.numel(), model.token_dim)
    verified = model.verify(tokens, mask, cond, pos, cfg, s, steps, drafted=drafted)
    g = torch.Generator().manual_seed(0)
    noise = ChainNoise(
        torch.randn(pos.numel(), model.token_dim, generator=g),
        torch.randn(steps - 1, pos.numel(), model.token_dim, generator=g),
    )
    a, b = predicted.run(noise), verified.run(noise)
    torch.testing.assert_close(a.x, b.x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.mean, b.mean, rtol=1e-5, atol=1e-5)
    assert predicted.rows == verified.rows == pos.numel()


def test_block_verification_reads_the_context_the_family_claims(family_pair):
    """Verifying a drafted two-step block in one pass gives every row the chain that predicting its step gives
    from the context the family claims (FamilyTraits.verifies_in_context): after the block's drafted steps
    before it, or from the context before the block."""
    _, pair = family_pair
    model, s = pair.target, sampling(pair)
    in_context = pair.traits.verifies_in_context
    cond = model.check_conditions(conditions(pair, 2), 2, torch.device("cpu"))
    plan = model.plan([1, 2], s, torch.device("cpu"))
    steps = model.head_steps(s.head_steps)
    tokens, mask = torch.zeros(2, model.seq_len, model.token_dim), torch.ones(2, model.seq_len, dtype=torch.bool)
    before = (tokens.clone(), mask.clone())
    g = torch.Generator().manual_seed(0)
    trajs, noises, positions = [], [], []
    for j in (0, 1):
        pos = plan.positions(j)
        k = pos.numel()
        noise = ChainNoise(
            torch.randn(k, model.token_dim, generator=g), torch.randn(steps - 1, k, model.token_dim, generator=g)
        )
        context = (tokens, mask) if in_context else (before[0].clone(), before[1].clone())
        traj = model.predict(*context, cond, pos, torch.full((k,), plan.cfg[j]), s, steps).run(noise)
        commit(tokens, mask, pos, traj.x)
        trajs, noises, positions = trajs + [traj], noises + [noise], positions + [pos]
    pos = torch.cat(positions, dim=1)
    cfg = cat_rows([torch.full((p.numel(),), plan.cfg[j]) for j, p in enumerate(positions)], 2)
    expected = Trajectory.join(trajs, 2)
    verified = model.verify(*before, cond, pos, cfg, s, steps, drafted=expected.x).run(ChainNoise.join(noises, 2))
    torch.testing.assert_close(verified.x, expected.x, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(verified.mean, expected.mean, rtol=1e-4, atol=1e-4)


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
    _, pair = family_pair
    path = save_model(pair.draft, tmp_path / "draft")
    loaded = load_model(path)
    assert type(loaded) is type(pair.draft) and loaded.config == pair.draft.config
    s, cond = sampling(pair), conditions(pair, 1)
    assert torch.equal(generate(loaded, cond, [3], s).tokens, generate(pair.draft, cond, [3], s).tokens)


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
