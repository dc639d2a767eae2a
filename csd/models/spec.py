"""What a model family registers (:data:`csd.models.registry.FAMILIES`, one row each), and the config
(de)serialisation every family's config shares.

A row holds what a model needs to load and run: the family's network class, its config class and named
presets, how its project files are built and written, where its official checkpoints live and how they
load. How a family runs at the published sizes (:class:`PaperScale`, with its :class:`CostShape`) is
described here and built in the family's ``paper.py``; which pairs it offers, which paper settings and which
docs pages go with it is experiment metadata, its entry in :data:`csd.serving.catalog.CATALOG`. Adding a
family is one folder under ``csd/models/`` (network, adapter, official loader), one row and one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from csd.family import FamilyTraits

# --tiny paper-scale configs: widths by size name (depth 1, a 4 x 4 token grid), shared by every family.
TINY_WIDTHS = {"huge": 64, "large": 48, "base": 32}


class SerialConfig:
    """``to_dict`` / ``from_dict`` of a frozen config dataclass. ``nested`` names the fields that hold
    another such config (Harmon's MAR generator); unknown keys are an error naming them."""

    nested: ClassVar[dict[str, type]] = {}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Any:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
        inner = {k: kind.from_dict(data[k]) for k, kind in cls.nested.items() if k in data}
        return cls(**{**data, **inner})


@dataclass(frozen=True)
class Stack:
    """Transformer layers applied to every token: their parameters, count, width and kernels per layer."""

    params: int
    layers: int
    width: int
    layer_kernels: int

    def flops(self, queries: int, keys: int) -> float:
        """2 FLOPs per parameter per token, plus attention's two L_q x L_k x width products."""
        return 2.0 * self.params * queries + 4.0 * self.layers * queries * keys * self.width


def stack(modules, width: int, layer_kernels: int) -> Stack:
    """The :class:`Stack` of some layers (parameters counted, on any device, the meta one included)."""
    return Stack(sum(p.numel() for m in modules for p in m.parameters()), len(modules), width, layer_kernels)


@dataclass(frozen=True)
class CostShape:
    """What a pass of one model reads and computes, for the paper-scale run-time estimate: ``encoder`` runs
    over the buffer and the context, ``decoder`` over the buffer and every position, ``llm`` over the prompt
    and the context; the head has ``head_params`` in ``head_blocks`` blocks. ``flow``: the chain's steps are
    backbone passes over a block's cells (xAR: ``encoder`` holds every block, ``cell_len`` tokens a cell)."""

    params: int  # all of the model's
    encoder: Stack
    decoder: Stack | None = None
    llm: Stack | None = None
    head_params: int = 0
    head_blocks: int = 0
    tokens: int = 0  # tokens of an image
    buffer: int = 0
    prompt: int = 0
    flow: bool = False
    cell_len: int = 0

    @property
    def stacks(self) -> list[Stack]:
        return [s for s in (self.encoder, self.decoder, self.llm) if s is not None]


@dataclass(frozen=True)
class PaperScale:
    """How a family runs at the published sizes (:mod:`csd.experiments.paper_scale`): the published sampler,
    the configs it builds (official sizes with random weights, or shrunk by ``--tiny``) and the cost shape of
    the run-time estimate.

    cfg: the published CFG scale per config name (a pair runs with its target's). num_steps: the published
    AR steps (None: the family's fixed ones). head_steps: the published head steps (None: the model's own).
    tiny_steps: (AR steps, head steps) under --tiny, None as above. overrides(name, tiny): a preset's changes
    for the run (under --tiny, its shrunk form). meta(tiny): the project-file JSON its models build with (a
    text family's stand-in tokenizer). match_draft(target): the draft's config changes to run beside that
    target (xAR: its flow steps). layout(config, head_steps): (AR tokens of an image, head steps) of a config.
    cost(model, prompt_tokens): its :class:`CostShape` (built on the meta device). head_name: what a chain's
    step is called in the report; note: a sentence the report adds about the family. A text family also
    gives prompt_tokens ((prompt, null prompt) tokens of the official template; tiny_prompt_tokens under
    --tiny), stand_in_prompts(generator, batch, words) for random weights, prompt (what an official model is
    prompted with) and prompt_length(model, prompt) (tokens as the model encodes it).
    """

    cfg: Mapping[str, float]
    cfg_schedule: str
    num_steps: int | None
    head_steps: int | None
    tiny_steps: tuple[int | None, int | None]
    overrides: Callable[[str, bool], dict]
    layout: Callable[[Any, int | None], tuple[int, int]]
    cost: Callable[[nn.Module, int], CostShape]
    temperature: float = 1.0
    meta: Callable[[bool], Mapping] = field(default=lambda tiny: {})
    match_draft: Callable[[nn.Module], dict] = field(default=lambda target: {})
    head_name: str = "head"
    note: str = ""
    prompt_tokens: tuple[int, int] = (0, 0)
    tiny_prompt_tokens: tuple[int, int] = (0, 0)
    stand_in_prompts: Callable[[Any, int, int], list[str]] | None = None
    prompt: str = ""
    prompt_length: Callable[[nn.Module, str], int] | None = None

    def prompt_shape(self, tiny: bool) -> tuple[int, int]:
        """(prompt, null prompt) tokens of a text family's random-weight runs."""
        return self.tiny_prompt_tokens if tiny else self.prompt_tokens


@dataclass(frozen=True)
class Family:
    """One row of the family table.

    arch: the name in a project file's JSON (``"arch"``). model: the network class, which implements
    :class:`csd.family.ModelFamily`; config: its config class (a :class:`SerialConfig`); presets: named
    configs (official sizes, the embedded models, test sizes). traits: the :class:`~csd.family.FamilyTraits`
    of a config, known before any weights are read. build: a model from a config and the file's JSON (a
    text family reads its tokenizer there); entries: the JSON entries a model adds beside its config.
    official_files: a config name -> its official checkpoint files, relative to a checkpoint directory;
    load_official: ``(checkpoint_dir, config_name, target=None) -> model`` from those files (``target``:
    the model a draft is loaded for, when the family matches a draft's sampler to its target's).
    official_tokenizer: ``(checkpoint_dir, target) -> tokenizer`` of an official pair's images where the family
    has its own (NextStep: the FLUX VAE, among its target's official files); None: MAR's KL-16 at
    ``vae/kl16.ckpt``.

    What the experiments know of a family beside (its pairs, how it runs at the published sizes, where its
    results stand in the docs) is its entry in :data:`csd.serving.catalog.CATALOG`.
    """

    arch: str
    model: type[nn.Module]
    config: type
    presets: Mapping[str, Any]
    traits: Callable[[Any], FamilyTraits]
    build: Callable[[Any, Mapping], nn.Module] | None = None
    entries: Callable[[nn.Module], dict] = field(default=lambda model: {})
    official_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    load_official: Callable[..., nn.Module] | None = None
    official_tokenizer: Callable[[Path, nn.Module], Any] | None = None

    def shared_traits(self) -> FamilyTraits:
        """The traits of the family's first preset: what every model of the family shares (its name, its
        conditions, whether its AR steps are fixed, ...), for a result that records only the family's name."""
        return self.traits(next(iter(self.presets.values())))

    def make(self, config, meta: Mapping | None = None) -> nn.Module:
        """A freshly initialised model of ``config`` (``meta``: the project file's JSON, if any)."""
        return self.model(config) if self.build is None else self.build(config, meta or {})

    def has_official(self, checkpoints: Path, name: str) -> bool:
        files = self.official_files.get(name)
        return bool(files) and all((checkpoints / f).is_file() for f in files)
