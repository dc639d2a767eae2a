"""Argument checks shared by every config: each error names the parameter and its valid range."""

from __future__ import annotations

import math


class SettingError(ValueError):
    """A bad setting: the message names it and its valid values, ``field`` is the config field it is about
    (so a caller can point at whatever sets that field)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def is_int(value) -> bool:
    """An int and not a bool (bool is an int subclass: ``gamma=True`` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _range(lo, hi) -> str:
    return f">= {lo}" if hi is None else f"in [{lo}, {hi}]"


def check_int(name: str, value, lo: int, hi: int | None = None, word: str = "an int") -> int:
    """``value`` if it is an int in [lo, hi] (``hi`` None: no upper bound), else a ValueError naming ``name``."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {word} {_range(lo, hi)}, got {value!r}")
    return value


def check_ints(name: str, values, lo: int, what: str = "a sequence") -> tuple[int, ...]:
    """A sequence of ints >= lo, as a tuple."""
    if not isinstance(values, tuple | list) or not all(is_int(v) and v >= lo for v in values):
        raise ValueError(f"{name} must be {what} of ints >= {lo}, got {values!r}")
    return tuple(values)


def check_number(name: str, value, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite real number in [lo, hi] (``lo_open`` / ``hi_open``: that end excluded)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return value


def check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
