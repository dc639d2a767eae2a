"""One value for what runs: :class:`csd.Method` is target-only, draft-only or CSD with its settings;
its ``run`` is the direct sampler call it names (the same tokens and trace), its label the tools' name, and it
is a frozen, hashable value."""

import dataclasses

import numpy as np
import pytest
import torch

import csd
import csd.dispatch as dispatch
from csd import CSDConfig, Maker, Method, generate, speculative_generate
from csd.experiments.grid import Point
from tests.helpers import assert_same64, random_pair64, sampling64

SAMPLING = sampling64(num_steps=4, cfg_scale=2.0)
CSD = CSDConfig(gamma=2, prefill=0.25)
LABELS, SEEDS = [1, 2], [5, 6]


def direct(kind: str, pair, on_step=None, keep_details=False):
    """The call each harness made before Method: the samplers with their own arguments."""
    if kind == "target":
        return generate(pair.target, LABELS, SEEDS, SAMPLING, on_step=on_step)
    if kind == "draft":
        return generate(pair.draft, LABELS, SEEDS, SAMPLING, Maker.DRAFT, on_step=on_step)
    return speculative_generate(pair.target, pair.draft, LABELS, SEEDS, SAMPLING, CSD, on_step, keep_details)


METHODS = {"target": Method.target(), "draft": Method.draft(), "csd": Method.speculative(CSD)}


@pytest.mark.kernels
@pytest.mark.parametrize("kind", list(METHODS))
def test_a_method_runs_what_the_direct_call_runs(kind, one_thread):
    """The same tokens (float64), the same decisions (who made each token) and the same step callbacks."""
    pair = random_pair64()
    steps_direct, steps_method = [], []
    expected = direct(kind, pair, on_step=lambda *a: steps_direct.append(a))
    got = METHODS[kind].run(pair.target, pair.draft, LABELS, SEEDS, SAMPLING, on_step=lambda *a: steps_method.append(a))
    assert_same64(got.tokens, expected.tokens, kind)
    assert np.array_equal(got.trace.maker, expected.trace.maker)
    assert got.trace.settings == expected.trace.settings
    assert steps_method == steps_direct and steps_direct


@pytest.mark.kernels
def test_csd_keeps_its_details_as_the_direct_call_does(one_thread):
    pair = random_pair64()
    expected = direct("csd", pair, keep_details=True)
    got = Method.speculative(CSD).run(pair.target, pair.draft, LABELS, SEEDS, SAMPLING, keep_details=True)
    proposed, reference = (torch.as_tensor(g.trace.details.draft_tokens) for g in (got, expected))
    assert torch.equal(proposed.isnan(), reference.isnan())  # NaN where nothing was drafted (the pre-fill)
    assert_same64(proposed.nan_to_num(), reference.nan_to_num(), "draft proposals")


def recorders(monkeypatch) -> list:
    """The samplers csd.dispatch calls, replaced by recorders of their calls."""
    calls = []
    monkeypatch.setattr(dispatch, "generate", lambda *a, **k: calls.append(("generate", a, k)) or "made")
    monkeypatch.setattr(dispatch, "speculative_generate", lambda *a, **k: calls.append(("speculative", a, k)) or "made")
    return calls


def test_each_kind_calls_its_sampler_with_its_model(monkeypatch):
    """Target-only: ``generate`` with the target (Maker.TARGET); draft-only: with the draft (Maker.DRAFT); CSD:
    ``speculative_generate`` with both and its settings. The step callback and kept details pass through."""
    calls = recorders(monkeypatch)
    target, draft, step = object(), object(), object()
    for m in (Method.target(), Method.draft()):
        assert m.run(target, draft, LABELS, SEEDS, SAMPLING, on_step=step) == "made"
    assert Method.speculative(CSD).run(target, draft, LABELS, SEEDS, SAMPLING, step, keep_details=True) == "made"
    on = {"on_step": step}
    assert calls == [
        ("generate", (target, LABELS, SEEDS, SAMPLING), {"maker": Maker.TARGET} | on),
        ("generate", (draft, LABELS, SEEDS, SAMPLING), {"maker": Maker.DRAFT} | on),
        ("speculative", (target, draft, LABELS, SEEDS, SAMPLING, CSD), on | {"keep_details": True}),
    ]


def test_a_run_that_does_not_use_a_model_takes_none_for_it(monkeypatch):
    calls = recorders(monkeypatch)
    target, draft = object(), object()
    Method.target().run(target, None, LABELS, SEEDS)
    Method.draft().run(None, draft, LABELS, SEEDS)
    assert [c[1][0] for c in calls] == [target, draft]


def test_only_csd_keeps_token_details(monkeypatch):
    recorders(monkeypatch)
    for m in (Method.target(), Method.draft()):
        with pytest.raises(ValueError, match="only CSD keeps token details"):
            m.run(object(), object(), LABELS, SEEDS, SAMPLING, keep_details=True)


def test_labels_are_the_tools_names():
    """The names the app's charts and the tools' tables give the three runs."""
    assert [m.label for m in METHODS.values()] == ["target-only", "draft-only", "CSD"]
    assert [m.kind for m in METHODS.values()] == ["target", "draft", "csd"]
    assert [m.is_csd for m in METHODS.values()] == [False, False, True]


def test_constructors_and_settings():
    assert Method.target() == Method("target") and Method.draft() == Method("draft")
    assert Method.speculative(CSD).csd is CSD
    assert Method.speculative() == Method.speculative(CSDConfig())  # the defaults, as speculative_generate takes
    assert Method.of(None) == Method.target() and Method.of(CSD) == Method.speculative(CSD)
    assert csd.Method is Method and "Method" in csd.__all__


@pytest.mark.parametrize(
    "kind, settings", [("csd", None), ("target", CSD), ("draft", CSDConfig()), ("both", None), ("CSD", CSD)]
)
def test_a_method_is_one_of_the_three_and_only_csd_has_settings(kind, settings):
    with pytest.raises(ValueError):
        Method(kind, settings)


def test_a_method_is_a_frozen_hashable_value():
    """Equal methods hash alike (a dict key, a set member); a method cannot be changed after it is made."""
    same = Method.speculative(CSDConfig(gamma=2, prefill=0.25))
    assert same == METHODS["csd"] and hash(same) == hash(METHODS["csd"])
    assert len({*METHODS.values(), same, Method.target(), Method.speculative(CSDConfig(gamma=8))}) == 4
    assert {Method.draft(): "draft-only"}[Method("draft")] == "draft-only"
    with pytest.raises(dataclasses.FrozenInstanceError):
        same.kind = "target"
    with pytest.raises(dataclasses.FrozenInstanceError):
        same.csd = None


def test_a_frontier_point_names_its_method():
    """grid.Point: ``runner`` is what runs (target-only, or CSD at its settings); ``method`` stays the display
    name of the tables and charts."""
    s = sampling64(num_steps=8)
    target, spec = Point("target, 4 AR steps", s), Point("CSD, gamma 2", s, CSD)
    assert target.runner == Method.target() and spec.runner == Method.speculative(CSD)
    assert (target.method, spec.method) == ("target, fewer AR steps", "CSD")
