"""A request: the controls' values checked (each error names its control and range) into the pair, the
conditions, the seeds and the two configs a run takes. The family's own rules (fixed AR steps, its CFG
ramp, AR steps within the tokens) are the family's to check (:meth:`csd.family.FamilyTraits.check_sampling`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gradio as gr

from csd.config import CSDConfig, SamplingConfig
from csd.experiments.pairs import ModelPair, PairStore
from csd.models.harmon import check_prompt
from demo.controls import Control


@contextmanager
def library_errors(prefix: str = "Invalid setting") -> Iterator[None]:
    """The library names the knob and its range in every ValueError; show it as the app's error."""
    try:
        yield
    except ValueError as err:
        raise gr.Error(f"{prefix}: {err}") from None


@dataclass(frozen=True)
class Request:
    pair: ModelPair
    labels: list  # one condition per image: class ids, or prompts for a text pair
    seeds: list[int]
    sampling: SamplingConfig
    csd: CSDConfig

    def condition(self) -> dict:
        """The first image's condition as the analyses take it: ``prompt`` for a text pair, else ``label``."""
        return {"prompt": self.labels[0]} if self.pair.is_text else {"label": self.labels[0]}


def build_request(store: PairStore, controls: dict[str, Control], precision: str, **values) -> Request:
    """Validate the controls and load the pair. ``values``: one per control, by name."""
    if set(values) != set(controls):
        missing, unknown = sorted(set(controls) - set(values)), sorted(set(values) - set(controls))
        raise gr.Error(f"Controls missing: {missing}; unknown: {unknown}")
    pair_name, class_name = values["pair_name"], values["class_name"]
    if pair_name not in store.names:
        raise gr.Error(f"Model pair must be one of {store.names}, got {pair_name!r}")
    source = store.source(pair_name)
    names = source.class_names
    if not source.is_text and class_name not in names:
        raise gr.Error(
            f"Class must be one of the {len(names)} classes of {pair_name} ({names[0]}, ...), got {class_name!r}"
        )
    if source.is_text:
        try:
            check_prompt(values["prompt"])
        except ValueError as err:
            raise gr.Error(str(err).capitalize()) from None
    if not isinstance(values["align"], bool):
        raise gr.Error(f"{controls['align'].label} must be true or false, got {values['align']!r}")
    fields = {"sampling": {"precision": precision}, "csd": {}}
    for name, control in controls.items():
        if control.field is not None:
            config, field = control.field.split(".")
            fields[config][field] = values[name]
    with library_errors():
        sampling, csd = SamplingConfig(**fields["sampling"]), CSDConfig(**fields["csd"])
    try:
        pair = store.get(pair_name)
    except (OSError, ValueError) as err:  # missing or mismatched checkpoint files
        raise gr.Error(f"Model pair {pair_name!r} could not be loaded: {err}") from None
    with library_errors(f"Invalid setting for {pair_name}"):
        pair.traits.check_sampling(sampling, pair.num_tokens)
    seed, batch = values["seed"], values["batch_size"]
    if pair.is_text:
        unknown = pair.target.tokenizer.unknown(values["prompt"])
        if unknown:
            words = ", ".join(pair.target.tokenizer.words)
            raise gr.Error(
                f"Prompt words {unknown} are not in the vocabulary of {pair_name}; it knows only these "
                f"{len(pair.target.tokenizer.words)} words (its captions): {words}"
            )
        conditions = [values["prompt"]] * batch
    else:
        conditions = [names.index(class_name)] * batch
    return Request(pair, conditions, [seed + i for i in range(batch)], sampling, csd)
