"""The app's boundary: every value a control does not accept is refused by name, before any model runs, with
at most a short quote of it; no bool passes as a number, no fraction is rounded, no NaN passes a range."""

from __future__ import annotations

import gradio as gr
import pytest
import torch

from csd.config import SamplingConfig
from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo.application import App
from demo.controls import Invalid, check_value, named
from demo.errors import QUOTE, short
from demo.limits import Limits
from demo.requests import validator
from demo.tabs.generate import check_generate

SEED = gr.Number(value=0, minimum=0, maximum=100, precision=0, label="Seed")
SCALE = gr.Slider(1.0, 10.0, value=3.0, step=0.1, label="CFG scale")
ROW = gr.Number(value=0, minimum=0, precision=0, label="Token row")
PROMPT = gr.Textbox(value="a", max_length=10, label="Prompt")
ALIGN = gr.Checkbox(value=True, label="Alignment")
SCHEDULE = gr.Radio(choices=["linear", "constant"], value="linear", label="CFG schedule")


@pytest.mark.parametrize(
    "component,value,message",
    [
        (SEED, True, r"Seed must be an integer in \[0, 100\], got True"),
        (SEED, 0.5, r"Seed must be an integer in \[0, 100\], got 0.5"),
        (SEED, 7.001, r"got 7.001"),
        (SEED, float("nan"), r"got nan"),
        (SEED, 101, r"got 101"),
        (SEED, "3", r"got '3'"),
        (SEED, None, r"got None"),
        (SCALE, float("inf"), r"CFG scale must be a number in \[1, 10\], got inf"),
        (SCALE, [1.0], r"got \[1.0\]"),
        (ROW, -1, r"Token row must be an integer >= 0, got -1"),
        (PROMPT, "x" * 11, r"Prompt must be text of at most 10 characters"),
        (PROMPT, 5, r"got 5"),
        (ALIGN, 1, r"Alignment must be true or false, got 1"),
        (SCHEDULE, "cosine", r"CFG schedule must be one of 'linear', 'constant', got 'cosine'"),
    ],
)
def test_a_value_the_control_does_not_take_is_refused_naming_the_control(component, value, message):
    with pytest.raises(gr.Error, match=message):
        check_value(component, value)


@pytest.mark.parametrize("component,value", [(SEED, 7), (SEED, 7.0), (SCALE, 2.5), (SCALE, 3), (ROW, 10**6)])
def test_a_value_the_control_takes_passes_unchanged(component, value):
    assert check_value(component, value) == value


def test_a_named_control_hands_the_handler_its_refusal_not_a_rounded_value():
    seed = named(gr.Number(value=0, minimum=0, maximum=100, precision=0, label="Seed"))
    assert seed.preprocess(5) == 5
    bad = seed.preprocess(0.5)  # Gradio alone would round it to 0
    assert isinstance(bad, Invalid) and "Seed must be an integer" in bad.message


def test_a_refused_value_is_quoted_by_a_short_prefix():
    assert len(short("A" * 1_000_000)) == QUOTE and short("A" * 1_000_000).endswith("...")
    with pytest.raises(gr.Error) as err:
        check_value(SEED, "9" * 1_000_000)
    assert len(err.value.message) < 200


def test_the_validator_names_the_control_and_runs_no_model():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_batch=2, max_steps=8))
    with gr.Blocks():
        components = {name: c.component() for name, c in application.controls.items()}
    check = validator(lambda **v: check_generate(application, components, False, **v), components)
    good = application.default_controls() | {"batch_size": 1, "ar_steps": 8}
    assert all(v["is_valid"] for v in check(**good))
    out = check(**good | {"seed": True})
    bad = {name: v["message"] for name, v in zip(components, out, strict=True) if not v["is_valid"]}
    assert list(bad) == ["seed"] and "Seed must be an integer" in bad["seed"]
    out = check(**good | {"gamma": 0.5})
    assert [name for name, v in zip(components, out, strict=True) if not v["is_valid"]] == ["gamma"]
    assert not application.history and application.store.loaded(RANDOM_SOURCE.name) is None  # nothing ran or loaded


def test_an_estimate_is_linear_in_the_batch_through_the_two_timed_batches():
    from demo.estimate import Rates

    rates = Rates({"target": 1.0, "draft": 0.5, "csd": 0.8}, {"target": 2.5, "draft": 0.5, "csd": 2.0}, batch=4)
    assert rates.step("target", 1) == 1.0 and rates.step("target", 4) == pytest.approx(2.5)
    assert rates.step("target", 8) == pytest.approx(4.5)  # beyond the timed batch: the same slope
    assert rates.step("draft", 8) == 0.5  # a kind whose cost does not grow with the batch
    ten = SamplingConfig(num_steps=10)
    assert rates.seconds(ten, 4, {"target": 1, "csd": 2}) == pytest.approx(10 * (2.5 + 2 * 2.0))


def test_a_csd_estimate_follows_its_target_and_draft_passes():
    """A CSD run's step is the timed one with the passes per AR step of the request's draft length and pre-fill:
    the faithful preset's extra verifications cost target steps, its fewer drafted steps save draft steps."""
    from csd.config import CSDConfig
    from csd.records.cost import csd_passes
    from demo.estimate import Rates

    s = SamplingConfig(num_steps=32)
    timed = csd_passes(64, s, CSDConfig())  # the default setting's (target, draft) passes
    per_step = {"target": 1.0, "draft": 0.1, "csd": 0.5}
    rates = Rates(per_step, per_step, batch=4, passes=(timed[0] / 32, timed[1] / 32), tokens=64)
    assert rates.seconds(s, 1, {"csd": 1}, CSDConfig()) == pytest.approx(32 * 0.5)
    faithful = CSDConfig(gamma=2, prefill=0.1)
    target, draft = csd_passes(64, s, faithful)
    assert target > timed[0] and draft < timed[1]
    expected = 32 * 0.5 + (target - timed[0]) * 1.0 + (draft - timed[1]) * 0.1
    assert rates.seconds(s, 1, {"csd": 1}, faithful) == pytest.approx(expected)
    assert rates.seconds(s, 1, {"csd": 1}, faithful) > rates.seconds(s, 1, {"csd": 1})
    assert rates.seconds(s, 1, {"csd": 1}, CSDConfig(gamma=32, prefill=0.0)) >= 32 * 0.1  # never below drafting


def test_a_pair_is_timed_at_the_pages_default_setting(monkeypatch):
    """Rates come from runs of the page's default setting on the pair (its AR steps within the limit, its draft
    length and pre-fill), at one image and at the calibration batch, after a warm-up at the cheapest setting;
    each kind's share of time in its head chains comes from the runs' phase times."""
    from types import SimpleNamespace

    import csd.dispatch as dispatch

    timed, made = [], SimpleNamespace(trace=SimpleNamespace(times={"target_backbone": 3.0, "target_head": 1.0}))

    def single(model, conditions, seeds, sampling, *rest, **kwargs):
        timed.append(("single", len(seeds), sampling, None))
        return made

    def csd(target, draft, conditions, seeds, sampling, config, **kwargs):
        timed.append(("csd", len(seeds), sampling, config))
        return made

    monkeypatch.setattr(dispatch, "generate", single)  # the samplers as the calibration's Method values call them
    monkeypatch.setattr(dispatch, "speculative_generate", csd)
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_steps=12))
    rates = application.rates(application.store.get(RANDOM_SOURCE.name))
    warm, one, many = timed[:3], timed[3:6], timed[6:]
    assert {(n, s.num_steps) for _, n, s, _ in warm} == {(1, 1)}  # the cheapest setting: one AR step
    assert {(n, s.num_steps) for _, n, s, _ in one} == {(1, 12)}
    assert {(n, s.num_steps) for _, n, s, _ in many} == {(4, 12)}
    assert [c.gamma for kind, _, _, c in one if kind == "csd"] == [application.controls["gamma"].default]
    assert rates.tokens == 64 and rates.passes is not None
    assert rates.head_share == dict.fromkeys(("target", "draft", "csd"), 0.25)


def test_a_chain_of_fewer_head_calls_costs_its_share_less():
    from demo.estimate import Rates

    per_step = {"target": 1.0, "csd": 1.0}
    rates = Rates(per_step, per_step, head_share={"target": 0.5, "csd": 0.2}, head_calls=25.0)
    s = SamplingConfig(num_steps=10)
    assert rates.seconds(s, 1, {"target": 1}, head_calls=12.5) == pytest.approx(10 * (0.5 + 0.5 * 0.5))
    assert rates.seconds(s, 1, {"csd": 1}, head_calls=50.0) == pytest.approx(10 * (0.8 + 0.2 * 2))
    assert rates.seconds(s, 1, {"target": 1}) == rates.seconds(s, 1, {"target": 1}, head_calls=25.0) == 10.0
