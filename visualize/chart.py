"""A backend-neutral chart: what to draw, so one builder serves Plotly and Matplotlib alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
# Marker symbols both backends draw: Plotly's name -> Matplotlib's marker and whether it is hollow.
SYMBOLS = {"circle-open": ("o", True), "triangle-up": ("^", False), "triangle-down": ("v", False)}


@dataclass
class Series:
    """One named series. ``band`` = (lo, hi) shades a range around a line; ``width`` sets bar widths
    (histograms); ``text`` labels markers or bars, at ``text_position`` (Plotly's: "top center", "bottom
    right", ...; one for all or one per point); ``hover`` is text shown only on hover (Plotly); ``errors``
    draws +- error bars on y; ``symbol`` (one of SYMBOLS) and ``size`` shape the markers. None in y (or
    band) leaves a gap."""

    name: str
    x: list
    y: list
    kind: Literal["line", "markers", "bar", "area"] = "line"
    band: tuple[list, list] | None = None
    width: float | None = None
    text: list[str] | None = None
    color: str | None = None
    dash: bool = False
    hover: list[str] | None = None
    errors: list[float] | None = None
    symbol: str | None = None
    size: float | None = None
    text_position: str | list[str] = "top center"


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    barmode: Literal["group", "stack", "overlay"] = "group"
    note: str = ""  # one line under the title: the numbers a reader should take away
    hlines: list[tuple[float, str]] = field(default_factory=list)  # reference lines (y, label)
    y_range: tuple[float, float] | None = None
    y_log: bool = False  # a logarithmic y axis (values spanning decades)
    height: int = 360  # pixels (Plotly): a chart with many legend entries needs more, or a phone shows no plot

    def colors(self) -> list[str]:
        return [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(self.series)]
