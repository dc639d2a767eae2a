"""The model families, registered in one table, and the project's own model files.

:data:`FAMILIES` has one row per family (:class:`csd.models.spec.Family`): its network, config and
presets, its traits, how its files are built and its official checkpoints (its pairs, paper settings and
docs pages are its entry in :data:`csd.serving.catalog.CATALOG`). Nothing outside ``csd/models/``
needs to know which family a model belongs to: it reads the model's ``traits`` and its family's row.
:func:`register` adds a row (a family defined elsewhere, e.g. in the tests), :func:`unregister` removes it.

A project file is ``name.safetensors`` (weights) + ``name.json``: ``{"arch": "mar", "config":
MARConfig.to_dict(), ...}`` (a text family adds its tokenizer); anything else in it (how the model
was trained) is informational. Loading is strict: a file whose weights do not match its config is an
error naming the file, never a silently half-loaded model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from csd.family import FamilyTraits
from csd.models import harmon, mar, nextstep, xar
from csd.models.checkpoint import CheckpointError, load_state_strict, read_safetensors, save_safetensors
from csd.models.spec import Family

FAMILIES: dict[str, Family] = {}
SUFFIX = ".safetensors"


def register(family: Family) -> Family:
    """Add a family's row to the table (an arch already there is an error naming it)."""
    if family.arch in FAMILIES:
        raise ValueError(f"family {family.arch!r} is registered already")
    FAMILIES[family.arch] = family
    return family


def unregister(arch: str) -> None:
    """Remove a family's row (a family registered for a while, e.g. by a test)."""
    if arch not in FAMILIES:
        raise ValueError(f"family {arch!r} is not registered; registered: {archs()}")
    del FAMILIES[arch]


def archs() -> tuple[str, ...]:
    return tuple(FAMILIES)


for _family in (mar.FAMILY, xar.FAMILY, harmon.FAMILY, nextstep.FAMILY):
    register(_family)


def family_of(model: nn.Module) -> Family:
    """The row of a model's family (by its network class)."""
    for family in FAMILIES.values():
        if type(model) is family.model:
            return family
    raise ValueError(f"{type(model).__name__} is not a registered model family ({', '.join(archs())})")


def preset(name: str):
    """A named config of any family ("mar_huge", "xar_base", "shapes_target", ...) and its family."""
    for family in FAMILIES.values():
        if name in family.presets:
            return family, family.presets[name]
    names = sorted(n for f in FAMILIES.values() for n in f.presets)
    raise ValueError(f"unknown model config {name!r}; choose from {names}")


def family_named(name: str | None) -> Family | None:
    """The row of a family named as results record it (its traits' name, "xAR", or its arch); None for an
    unknown name or none."""
    return next((f for f in FAMILIES.values() if name in (f.arch, f.shared_traits().family)), None)


def build_model(name: str, meta: Mapping | None = None, **overrides) -> nn.Module:
    """A freshly initialised model of a named config, with ``overrides`` (official sizes with random
    weights, for timing). A text family's presets need a tokenizer: ``meta`` holds it, as a project file's
    JSON does."""
    family, config = preset(name)
    if family.build is not None and not meta:
        raise ValueError(f"{name!r} is a {family.arch} config: build it with its tokenizer (meta)")
    return family.make(replace(config, **overrides) if overrides else config, meta)


def weights_path(path: str | Path) -> Path:
    """``path`` with the ``.safetensors`` suffix (a bare prefix such as ``assets/models/x`` is accepted)."""
    path = Path(path)
    return path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)


def save_model(model, path: str | Path, extra: Mapping | None = None) -> Path:
    """Write the weights and the JSON side by side; ``extra`` adds top-level JSON entries (e.g. ``train``).

    Both files are written under temporary names and then renamed, so a run killed mid-save leaves
    the previous pair intact. Returns the ``.safetensors`` path."""
    path = weights_path(path)
    extra = dict(extra or {})
    family = family_of(model)
    reserved = {"config": model.config.to_dict(), **family.entries(model)}
    clash = ({"arch"} | set(reserved)) & set(extra)
    if clash:
        raise ValueError(f"extra must not override the reserved JSON keys {sorted(clash)}")
    tmp = path.with_name(f".{path.stem}.tmp{SUFFIX}")
    save_safetensors(model, tmp, {"arch": family.arch, **reserved, **extra})
    os.replace(tmp.with_suffix(".json"), path.with_suffix(".json"))
    os.replace(tmp, path)
    return path


def _family_and_config(meta, json_path: Path):
    arch = meta.get("arch") if isinstance(meta, dict) else type(meta).__name__
    if arch not in FAMILIES:
        raise CheckpointError(f'{json_path}: expected "arch" to be one of {archs()}, got {arch!r}')
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f'{json_path}: missing the "config" object')
    family = FAMILIES[arch]
    try:
        return family, family.config.from_dict(meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: invalid {arch} config: {exc}") from exc


def read_traits(path: str | Path) -> FamilyTraits:
    """The traits of the model a project file holds, from its JSON alone (no weights are read)."""
    json_path = weights_path(path).with_suffix(".json")
    try:
        meta = json.loads(json_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {json_path}: {exc}") from exc
    family, config = _family_and_config(meta, json_path)
    return family.traits(config)


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """A model of any family in eval mode from a project file; :class:`CheckpointError` names the file on
    any mismatch."""
    path = weights_path(path)
    state, meta = read_safetensors(path)
    json_path = path.with_suffix(".json")
    family, config = _family_and_config(meta, json_path)
    try:
        model = family.make(config, meta)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{json_path}: invalid {family.arch} config: {exc}") from exc
    load_state_strict(model, state, str(path))
    return model.to(device).eval()
