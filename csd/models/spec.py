"""What a model family registers (:data:`csd.models.registry.FAMILIES`, one row each), and the config
(de)serialisation every family's config shares.

A row names the family's network class, its config class and named presets, how its project files are
built and written, and where its official checkpoints live and how they load. Adding a family is one
folder under ``csd/models/`` (network, adapter, official loader) and one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from csd.family import FamilyTraits


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

    def make(self, config, meta: Mapping | None = None) -> nn.Module:
        """A freshly initialised model of ``config`` (``meta``: the project file's JSON, if any)."""
        return self.model(config) if self.build is None else self.build(config, meta or {})

    def has_official(self, checkpoints: Path, name: str) -> bool:
        files = self.official_files.get(name)
        return bool(files) and all((checkpoints / f).is_file() for f in files)
