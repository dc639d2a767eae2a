"""The controls of a run (:func:`declare_controls`): label, component, default, the config field each sets,
and errors that name the control and its valid values. A control of a config field is made from the
field's declaration (:class:`csd.config.Knob`: its kind, choices and default) and how the app offers it
(:data:`demo.knobs.KNOB_CONTROLS`: label, range, hint, API name), which also says which fields the page
offers and in what order (:data:`PAGE_FIELDS`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from csd.config import CSDConfig, Knob, SamplingConfig, knobs
from csd.experiments import defaults
from csd.family import MAX_PROMPT_CHARS
from csd.serving.pairs import EXAMPLE_PROMPTS, PairStore
from demo.errors import refuse, short
from demo.knobs import KNOB_CONTROLS
from demo.limits import Limits

MAX_SEED = 2**31 - 1
# The page's default batch: sized for the slowest CPU a free Space runs on (a default comparison within about
# 12 s there: docs/app.md), two images per run side by side; the gallery keeps batch-8 comparisons, and a
# visitor may ask for up to the server's limit. (csd.experiments.defaults.BATCH_SIZE is the benchmarks'.)
BATCH_SIZE = 2


def valid_values(component: gr.components.Component) -> str:
    """What a control accepts, in words."""
    if isinstance(component, gr.Checkbox):
        return "true or false"
    if isinstance(component, gr.Slider | gr.Number):
        integer = is_integer(component)
        word, fmt = ("an integer", lambda v: f"{int(v)}") if integer else ("a number", lambda v: f"{v:g}")
        lo, hi = component.minimum, component.maximum
        if lo is not None and hi is not None:
            return f"{word} in [{fmt(lo)}, {fmt(hi)}]"
        return word + (f" >= {fmt(lo)}" if lo is not None else "") + (f" <= {fmt(hi)}" if hi is not None else "")
    if isinstance(component, gr.Textbox):
        return f"text of at most {component.max_length} characters" if component.max_length else "text"
    return "one of " + ", ".join(repr(v) for _, v in component.choices)


def check_value(component: gr.components.Component, payload):
    """``payload`` if the control accepts it as it is: no bool for a number, no silent rounding of a
    fraction, no NaN or infinity, the control's own range, choices and length. Else a refusal naming the
    control and its valid values, with a short quote of the value."""
    bad = lambda: refuse(f"{component.label} must be {valid_values(component)}, got {short(payload)}", component.label)
    if isinstance(component, gr.Checkbox):
        if not isinstance(payload, bool):
            raise bad()
    elif isinstance(component, gr.Slider | gr.Number):
        if isinstance(payload, bool) or not isinstance(payload, int | float) or not math.isfinite(payload):
            raise bad()
        if is_integer(component) and payload != int(payload):
            raise bad()
        lo, hi = component.minimum, component.maximum
        if (lo is not None and payload < lo) or (hi is not None and payload > hi):
            raise bad()
    elif isinstance(component, gr.Textbox):
        if not isinstance(payload, str) or (component.max_length and len(payload) > component.max_length):
            raise bad()
    elif isinstance(component, gr.Dropdown | gr.Radio):
        custom = getattr(component, "allow_custom_value", False)  # a free choice the request checks itself
        if not isinstance(payload, str) or (not custom and payload not in [v for _, v in component.choices]):
            raise bad()
    return payload


@dataclass(frozen=True)
class Invalid:
    """What a control hands a handler for a value it does not accept: the refusal's words. Validators
    show it beside the control (:func:`demo.requests.validator`); a handler refuses it by name."""

    message: str


def refuse_invalid(values: dict) -> None:
    """Refuse, naming the control, the first value a control marked :class:`Invalid`."""
    for name, value in values.items():
        if isinstance(value, Invalid):
            raise refuse(value.message, control=name)


def take(component: gr.components.Component, payload):
    """A raw value the control accepts (:func:`check_value`), as the handler takes it: an integer control's
    value as an int. For events that skip Gradio's own conversion (``preprocess=False``): Gradio rebuilds a
    component whose properties change during a session, so only the page's original components carry
    these checks."""
    check_value(component, payload)
    return int(payload) if is_integer(component) and isinstance(payload, int | float) else payload


def is_integer(component: gr.components.Component) -> bool:
    return getattr(component, "csd_integer", getattr(component, "precision", None) == 0)


def named(component: gr.components.Component) -> gr.components.Component:
    """Make this control mark every value it does not accept (:func:`check_value`) as :class:`Invalid`,
    before Gradio's own conversion (which rounds, and names nothing), for the page and API callers alike;
    the validator or the handler then refuses it by name, before any model runs.

    (Wrapping the instance, not subclassing: Gradio writes a .pyi file beside any module that defines a
    component class.)"""
    if isinstance(component, gr.Number) and component.precision == 0:
        # The browser would round a typed 1.5 before sending it: let it through, and refuse it here.
        component.csd_integer, component.precision = True, None
    convert = component.preprocess

    def preprocess(payload):
        try:
            check_value(component, payload)
            value = convert(payload)
            return int(value) if is_integer(component) and value is not None else value
        except gr.Error as err:
            return Invalid(str(err.message))
        except (TypeError, ValueError):
            return Invalid(f"{component.label} must be {valid_values(component)}, got {short(payload)}")

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


# The config fields the page offers, in page order (each with its control in demo.knobs).
PAGE_FIELDS = tuple(KNOB_CONTROLS)
CONFIGS = {"sampling": (SamplingConfig, defaults.SAMPLING), "csd": (CSDConfig, defaults.CSD)}


def offered_knobs() -> dict[str, tuple[str, Knob]]:
    """Every knob the app offers a control of (:data:`demo.knobs.KNOB_CONTROLS`): field -> (its config's
    name, the knob), in the configs' field order."""
    return {f: (config, k) for config, (cls, _) in CONFIGS.items() for f, k in knobs(cls).items() if f in KNOB_CONTROLS}


def control_name(field: str) -> str:
    """The control (the API's keyword) of a config field."""
    return KNOB_CONTROLS[field].name or field


def knob_control(field: str, limit: float | None = None) -> Control:
    """The control of a config field, from its knob: a checkbox, radio buttons or a slider over the control's
    range (``limit``: the top of a range the knob leaves to the server), at the default setting's value."""
    config, k = offered_knobs()[field]
    c, default = KNOB_CONTROLS[field], CONFIGS[config][1].knob_values()[field]
    where, info = f"{config}.{field}", c.info or None
    if k.kind == "bool":
        return Control(c.label, gr.Checkbox, default, {}, where, c.advanced)
    if k.kind == "choice":
        return radio(c.label, default, k.choices, where, info, c.advanced)
    hi = limit if c.hi is None else c.hi
    return slider(c.label, min(default, hi), c.lo, hi, c.step, where, info, c.advanced)


def declare_controls(store: PairStore, limits: Limits) -> dict[str, Control]:
    """Every control of the Generate tab (the Analysis tab reuses them but the batch size), in page order,
    with the default setting (:mod:`csd.experiments.defaults`) within the limits."""
    first = store.source(store.names[0])
    class_pair = next((store.source(n) for n in store.names if not store.source(n).is_text), None)
    text_pair = next((store.source(n) for n in store.names if store.source(n).is_text), None)
    class_names = list(first.class_names or (class_pair.class_names if class_pair else ("-",)))
    classes = {"choices": class_names, "allow_custom_value": True, "visible": not first.is_text}  # request checks
    prompt = (text_pair.prompts if text_pair else EXAMPLE_PROMPTS)[0]
    prompt_box = {"visible": first.is_text, "max_lines": 2, "max_length": MAX_PROMPT_CHARS, "elem_id": "prompt"}
    limit = {"num_steps": limits.max_steps}
    return {
        "pair_name": Control("Model pair", gr.Dropdown, first.name, {"choices": store.names}),
        "class_name": Control("Class", gr.Dropdown, class_names[0], classes),
        "prompt": Control("Prompt", gr.Textbox, prompt, prompt_box | {"info": "for text-conditioned pairs"}),
        "seed": Control("Seed", gr.Number, 0, {"minimum": 0, "maximum": MAX_SEED, "precision": 0}),
        "batch_size": slider("Batch size", min(BATCH_SIZE, limits.max_batch), 1, limits.max_batch),
        **{control_name(f): knob_control(f, limit.get(f)) for f in PAGE_FIELDS},
    }


def preset_controls(name: str) -> dict:
    """The controls preset ``name`` (:data:`csd.experiments.defaults.PRESETS`) sets: each offered knob whose
    value differs from the default setting's, by control name."""
    chosen = {config: c.knob_values() for config, c in defaults.PRESETS[name]._asdict().items()}
    base = {config: c.knob_values() for config, (_, c) in CONFIGS.items()}
    return {
        control_name(f): chosen[config][f]
        for f, (config, _) in offered_knobs().items()
        if chosen[config][f] != base[config][f]
    }


def preset_values(name: str, values: dict, default_values: dict) -> dict:
    """The controls after choosing preset ``name``: the default setting's knobs, then the preset's changes;
    the visitor's pair, class, prompt, seed and batch stay."""
    keep = {k: values[k] for k in ("pair_name", "class_name", "prompt", "seed", "batch_size") if k in values}
    return default_values | preset_controls(name) | keep
