"""The controls of a run, declared once (:func:`declare_controls`): label, component, default, the config
field each sets, and errors that name the control and its valid values."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from csd.config import CRITERIA, TRAJECTORY_TERMS
from csd.experiments import defaults
from csd.experiments.pairs import EXAMPLE_PROMPTS, PairStore
from csd.models.harmon import MAX_PROMPT_CHARS
from csd.schedule import CFG_SCHEDULES
from demo.limits import Limits

MAX_SEED = 2**31 - 1


def _valid_values(component: gr.components.Component) -> str:
    if isinstance(component, gr.Checkbox):
        return "true or false"
    if isinstance(component, gr.Slider | gr.Number):
        if component.precision == 0:
            return f"an integer in [{int(component.minimum)}, {int(component.maximum)}]"
        return f"a number in [{component.minimum:g}, {component.maximum:g}]"
    return "one of " + ", ".join(repr(v) for _, v in component.choices)


def named(component: gr.components.Component) -> gr.components.Component:
    """Gradio's own input checks (ranges, choices) raise errors that do not say which control failed, and
    API callers skip the browser's bounds: make this control's errors name it and its valid values.

    (Wrapping the instance, not subclassing: Gradio writes a .pyi file beside any module that defines a
    component class.)"""
    check = component.preprocess

    def preprocess(payload):
        if isinstance(component, gr.Checkbox) and not isinstance(payload, bool):
            raise gr.Error(f"{component.label} must be true or false, got {payload!r}")
        try:
            return check(payload)
        except (gr.Error, TypeError, ValueError):
            raise gr.Error(f"{component.label} must be {_valid_values(component)}, got {payload!r}") from None

    component.preprocess = preprocess
    return component


@dataclass(frozen=True)
class Control:
    """One setting of a run, declared once: the handlers take it by ``name`` (the API's keyword), the
    page shows ``kind(label=..., value=default, **options)``, and ``field`` says which config it sets
    ("sampling.num_steps", "csd.gamma"; None: the request reads it itself)."""

    label: str
    kind: type[gr.components.Component]
    default: object
    options: dict
    field: str | None = None
    advanced: bool = False

    def component(self) -> gr.components.Component:
        return named(self.kind(label=self.label, value=self.default, **self.options))


INTEGER = {"step": 1, "precision": 0}


def slider(label: str, default, lo, hi, step=1, field=None, info=None, advanced=False) -> Control:
    """A slider control; an int ``step`` makes it take integers only."""
    options = {"minimum": lo, "maximum": hi, **(INTEGER if isinstance(step, int) else {"step": step})}
    return Control(label, gr.Slider, default, options | ({"info": info} if info else {}), field, advanced)


def radio(label: str, default, choices, field: str, info=None, advanced=False) -> Control:
    return Control(
        label, gr.Radio, default, {"choices": list(choices)} | ({"info": info} if info else {}), field, advanced
    )


def declare_controls(store: PairStore, limits: Limits) -> dict[str, Control]:
    """Every control of the Generate tab (the Analysis tab reuses them but the batch size), in page order,
    with the default setting (:mod:`csd.experiments.defaults`) within the limits."""
    s, c, first = defaults.SAMPLING, defaults.CSD, store.source(store.names[0])
    class_pair = next((store.source(n) for n in store.names if not store.source(n).is_text), None)
    text_pair = next((store.source(n) for n in store.names if store.source(n).is_text), None)
    class_names = list(first.class_names or (class_pair.class_names if class_pair else ("-",)))
    classes = {"choices": class_names, "allow_custom_value": True, "visible": not first.is_text}  # request checks
    prompt = (text_pair.prompts if text_pair else EXAMPLE_PROMPTS)[0]
    prompt_box = {"visible": first.is_text, "max_lines": 2, "max_length": MAX_PROMPT_CHARS, "elem_id": "prompt"}
    return {
        "pair_name": Control("Model pair", gr.Dropdown, first.name, {"choices": store.names}),
        "class_name": Control("Class", gr.Dropdown, class_names[0], classes),
        "prompt": Control("Prompt", gr.Textbox, prompt, prompt_box | {"info": "for text-conditioned pairs"}),
        "seed": Control("Seed", gr.Number, 0, {"minimum": 0, "maximum": MAX_SEED, "precision": 0}),
        "batch_size": slider("Batch size", min(defaults.BATCH_SIZE, limits.max_batch), 1, limits.max_batch),
        "ar_steps": slider(
            "AR steps", min(s.num_steps, limits.max_steps), 1, limits.max_steps, 1, "sampling.num_steps"
        ),
        "gamma": slider("Draft length gamma", c.gamma, 1, 32, 1, "csd.gamma", "AR steps per target pass"),
        "prefill": slider(
            "Pre-fill ratio",
            c.prefill,
            0.0,
            0.5,
            0.01,
            "csd.prefill",
            "fraction of tokens the target makes before drafting",
        ),
        "cfg_scale": slider("CFG scale", s.cfg_scale, 1.0, 10.0, 0.1, "sampling.cfg_scale"),
        "cfg_schedule": radio("CFG schedule", s.cfg_schedule, CFG_SCHEDULES, "sampling.cfg_schedule"),
        "temperature": slider("Temperature", s.temperature, 0.1, 2.0, 0.05, "sampling.temperature"),
        "align": Control("Trajectory alignment (shared noise)", gr.Checkbox, c.align, {}, "csd.align"),
        "criterion": radio(
            "Acceptance criterion",
            c.criterion,
            CRITERIA,
            "csd.criterion",
            "aligned: the paper's approximation; exact: path-space reference",
        ),
        "tau_v": slider("Verification widening tau_v", c.tau_v, 1.0, 100.0, 0.5, "csd.tau_v", advanced=True),
        "trajectory_term": radio(
            "Trajectory term",
            c.trajectory_term,
            TRAJECTORY_TERMS,
            "csd.trajectory_term",
            "derived sign, published sign, or none (final-step term only)",
            advanced=True,
        ),
        "resample_widening": slider(
            "Resample widening",
            c.resample_widening,
            1.0,
            100.0,
            0.5,
            "csd.resample_widening",
            "equal to tau_v makes test and resampling self-consistent",
            advanced=True,
        ),
        "max_tries": slider("Resampler cap", c.max_tries, 1, 1000, 1, "csd.max_tries", advanced=True),
    }
