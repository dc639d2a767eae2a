"""Model families defined only in the tests. Each module of this package defines ``FAMILY``, a row of the
family table (:class:`csd.models.spec.Family`); the conformance test (tests/decoders/test_families.py) checks every
one of them beside the registered families, registering it for its run (:func:`registered`). A family
added here is one new module and needs no edit anywhere else."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager

from csd.models.registry import register, unregister
from csd.models.spec import Family


def defined_families() -> dict[str, Family]:
    """Every family defined in this package, by its arch."""
    modules = (importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__))
    return {m.FAMILY.arch: m.FAMILY for m in modules if hasattr(m, "FAMILY")}


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """The family's row in the table for a while (a test's), removed after."""
    register(family)
    try:
        yield family
    finally:
        unregister(family.arch)
