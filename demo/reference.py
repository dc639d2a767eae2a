"""Each shipped pair's rates as timed on a reference machine, committed with the app (``assets/rates.json``),
and the probe that scales them to the machine serving them: a CPU server has every shipped pair's estimates
from its start, without timing anything beside its visitors (:mod:`demo.timings`).

A pair's reference rates hold where its weights and the setting they were timed at (the page's default on it)
are the server's. Each pair's probe (:func:`demo.estimate.probe`: its target's run over one image at that
setting) is timed on both machines, and its rates here are the reference's times the ratio: one ratio per pair,
since machines differ by pair (without SIMD kernels the class pair's probe took 2.8x the reference's, the text
pair's requests 1.3x). Written, on a quiet machine, by ``python -m demo.precompute --rates``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from demo.estimate import Rates

REFERENCE_FILE = Path(__file__).resolve().parents[1] / "assets" / "rates.json"


@dataclass(frozen=True)
class Reference:
    """Each pair's rates on the reference machine, and its probe's seconds there."""

    rates: dict[str, Rates]
    probes: dict[str, float]


def _rates(values: dict) -> Rates:
    passes = values.get("passes")
    return Rates(**(values | {"passes": None if passes is None else tuple(passes)}))


def read(path: Path, pairs: dict[str, tuple[str, str]]) -> Reference | None:
    """The reference in ``path`` for ``pairs`` (name -> (weights, setting), the server's): the pairs timed at the
    same weights and setting. None without the file or without such a pair."""
    if not path.is_file():
        return None
    entries = json.loads(path.read_text())["pairs"]
    held = {name: e for name, e in entries.items() if pairs.get(name) == (e["weights"], e["setting"])}
    if not held:
        return None
    return Reference({n: _rates(e["rates"]) for n, e in held.items()}, {n: e["probe_s"] for n, e in held.items()})
