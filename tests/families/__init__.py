"""Model families defined only in the tests. Each module of this package defines ``FAMILY``, a row of the
family table (:class:`csd.models.spec.Family`), and ``ENTRY``, its catalog entry (its pairs and paper
settings, :class:`csd.serving.catalog.Entry`); the conformance test (tests/decoders/test_families.py) checks
every one of them beside the registered families, registering it for its run (:func:`registered`). A
family added here is one new module and needs no edit anywhere else."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager

from csd.models.registry import register, unregister
from csd.models.spec import Family
from csd.serving import catalog
from csd.serving.catalog import Entry


def defined_families() -> dict[str, tuple[Family, Entry]]:
    """Every family defined in this package, by its arch: its row and its catalog entry."""
    modules = (importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__))
    return {m.FAMILY.arch: (m.FAMILY, m.ENTRY) for m in modules if hasattr(m, "FAMILY")}


@contextmanager
def registered(family: Family, entry: Entry) -> Iterator[Family]:
    """The family's row in the table and its catalog entry for a while (a test's), removed after."""
    register(family)
    try:
        catalog.add(family.arch, entry)
        try:
            yield family
        finally:
            catalog.remove(family.arch)
    finally:
        unregister(family.arch)
