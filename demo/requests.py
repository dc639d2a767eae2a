"""A request: the controls' values checked (each error names its control and range) into the pair, the
conditions, the seeds and the two configs a run takes. The rules between settings and the family's own
(fixed AR steps, its CFG ramp, AR steps within the tokens) are the run set-up's (:func:`csd.run_setup.check_settings`).

The same checks run twice: in a validator, before a request joins the queue (Gradio shows each message
beside the control it names), and at the start of the handler (for any caller that skips the page).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gradio as gr

from csd import run_setup
from csd.config import CSDConfig, SamplingConfig
from csd.family import check_prompt
from csd.serving.pairs import ModelPair, PairStore
from demo.controls import Control, refuse_invalid, take
from demo.errors import refuse, short


@contextmanager
def library_errors(prefix: str = "Invalid setting", controls: dict[str, Control] | None = None) -> Iterator[None]:
    """The library names the knob and its range in every ValueError; show it as the app's error, on the
    control of the config field a :class:`~csd.core.checks.SettingError` carries (its ``field``)."""
    try:
        yield
    except ValueError as err:
        field = getattr(err, "field", None)
        at = (name for name, c in (controls or {}).items() if c.field and c.field.split(".")[1] == field)
        raise refuse(f"{prefix}: {err}", control=next(at, None)) from None


@dataclass(frozen=True)
class Request:
    """A checked request: made once per request (:func:`build_request`), handed to its GPU call as plain values
    (:meth:`plain`) and rebuilt there without checking again (:meth:`from_plain`)."""

    pair: ModelPair
    labels: list  # one condition per image: class ids, or prompts for a text pair
    seeds: list[int]
    sampling: SamplingConfig
    csd: CSDConfig

    def condition(self) -> dict:
        """The first image's condition as the analyses take it: ``prompt`` for a text pair, else ``label``."""
        return {"prompt": self.labels[0]} if self.pair.is_text else {"label": self.labels[0]}

    def plain(self) -> dict:
        """The request as a GPU call takes it (picklable values: the pair by name)."""
        plain = {"pair_name": self.pair.name, "labels": self.labels, "seeds": self.seeds}
        return plain | {"sampling": self.sampling, "csd": self.csd}

    @classmethod
    def from_plain(
        cls, store: PairStore, pair_name: str, labels: list, seeds: list[int], sampling: SamplingConfig, csd: CSDConfig
    ) -> Request:
        """The request :meth:`plain` gave, its pair from ``store``: it was checked when it was made."""
        return cls(store.get(pair_name), labels, seeds, sampling, csd)


def build_request(
    store: PairStore,
    controls: dict[str, Control],
    precision: str,
    components: dict | None = None,
    load: bool = True,
    **values,
) -> Request | None:
    """Validate the controls and load the pair. ``values``: one per control, by name; ``components``: the
    page's components of those controls, when their own checks (range, type) should run here too.
    ``load=False`` (a validator, which must answer at once): check only what needs no model load, and
    return None when the pair is not loaded yet (the handler checks the rest)."""
    values = _taken(controls, components, values)
    _check_condition(store, values)
    if not isinstance(values["align"], bool):
        label = controls["align"].label
        raise refuse(f"{label} must be true or false, got {short(values['align'])}", control="align")
    fields = {"sampling": {"precision": precision}, "csd": {}}
    for name, control in controls.items():
        if control.field is not None:
            config, field = control.field.split(".")
            fields[config][field] = values[name]
    with library_errors(controls=controls):
        sampling, csd = SamplingConfig.from_knobs(**fields["sampling"]), CSDConfig.from_knobs(**fields["csd"])
    pair_name = values["pair_name"]
    if not load and store.loaded(pair_name) is None:
        return None
    try:
        pair = store.get(pair_name)
    except (OSError, ValueError) as err:  # missing or mismatched checkpoint files
        raise refuse(f"Model pair {pair_name!r} could not be loaded: {err}", control="pair_name") from None
    with library_errors(f"Invalid setting for {pair_name}", controls):
        run_setup.check_settings(pair.traits, pair.num_tokens, sampling, csd)
    seed, batch = values["seed"], values["batch_size"]
    return Request(pair, _conditions(pair, values), [seed + i for i in range(batch)], sampling, csd)


def _taken(controls: dict[str, Control], components: dict | None, values: dict) -> dict:
    """One value per control, each as its component takes it (its range and type checked)."""
    if set(values) != set(controls):
        missing, unknown = sorted(set(controls) - set(values)), sorted(set(values) - set(controls))
        raise refuse(f"Controls missing: {missing}; unknown: {unknown}")
    refuse_invalid(values)
    for name, component in (components or {}).items():
        if name not in values:
            continue
        try:
            values[name] = take(component, values[name])
        except gr.Error as err:
            err.control = name
            raise
    return values


def _check_condition(store: PairStore, values: dict) -> None:
    """The pair is served, and the class is one of its classes (or the prompt one any text family takes)."""
    pair_name, class_name = values["pair_name"], values["class_name"]
    if pair_name not in store.names:
        raise refuse(f"Model pair must be one of {store.names}, got {short(pair_name)}", control="pair_name")
    source = store.source(pair_name)
    names = source.class_names
    if not source.is_text and class_name not in names:
        raise refuse(
            f"Class must be one of the {len(names)} classes of {pair_name} ({names[0]}, ...), got {short(class_name)}",
            control="class_name",
        )
    if source.is_text:
        try:
            check_prompt(values["prompt"])
        except ValueError as err:
            raise refuse(str(err).capitalize(), control="prompt") from None


def _conditions(pair: ModelPair, values: dict) -> list:
    """Each image's condition: the prompt the model's tokenizer can encode, or the class's id."""
    batch = values["batch_size"]
    if not pair.is_text:
        return [pair.class_names.index(values["class_name"])] * batch
    try:  # what the model's tokenizer can encode (a closed vocabulary names the words it knows)
        pair.target.check_conditions([values["prompt"]], 1, pair.device)
    except ValueError as err:
        message = str(err)
        raise refuse(message[:1].upper() + message[1:], control="prompt") from None
    return [values["prompt"]] * batch


def twin_events(
    button: gr.Button,
    page: Callable,
    api: Callable,
    api_name: str,
    inputs: dict,
    outputs: list,
    check: Callable[..., object],
    queue: dict,
):
    """A model run's two events: the page's (``button``; a refusal goes to the status line) and the API's
    (a hidden button, ``api_name``; refused by the validator before it joins the queue). Both take raw
    values (``preprocess=False``), checked against the page's components. Returns the page's event."""
    common = {"inputs_kwargs": inputs, "outputs": outputs, "preprocess": False, **queue}
    event = button.click(page, api_visibility="private", **common)
    gr.Button(visible=False).click(api, api_name=api_name, validator=validator(check, inputs), **common)
    return event


def validator(check: Callable[..., object], inputs: dict[str, gr.components.Component]) -> Callable[..., list]:
    """A Gradio validator for an event with these keyword ``inputs``: ``check(**values)`` raises a refusal
    (:func:`demo.errors.refuse`) for a request that would be refused; its message is shown on the control
    it names (or the first input), and the request never joins the queue."""
    names = list(inputs)

    def validate(**values) -> list:
        try:
            refuse_invalid(values)
            check(**values)
        except gr.Error as err:
            control = getattr(err, "control", None)
            where = control if control in names else names[0]
            return [gr.validate(name != where, str(err.message) if name == where else "") for name in names]
        return [gr.validate(True, "") for _ in names]

    validate.__name__ = f"validate_{getattr(check, '__name__', 'request')}"
    return validate
