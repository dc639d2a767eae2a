"""Draw a :class:`~visualize.chart.Chart` with Plotly (interactive, the app) or Matplotlib (static PNG)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from visualize.chart import SYMBOLS, Chart, Series

MAX_MARKERS = 60  # lines with more points (densities) are drawn without point markers
MARGIN, LEFT = 60, 8  # pixels: the plot's left margin; the title and note from the figure's left edge
NOTE_WIDTH = 50  # characters per line of a chart's note under its title (50 fit a phone's width)


def _floats(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _plotly_traces(s: Series, color: str, overlay: bool) -> list[go.BaseTraceType]:
    traces = []
    if s.band is not None:
        lo, hi = s.band
        traces.append(go.Scatter(x=s.x, y=hi, mode="lines", line={"width": 0}, hoverinfo="skip", showlegend=False))
        traces.append(
            go.Scatter(
                x=s.x,
                y=lo,
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=_rgba(color, 0.2),
                hoverinfo="skip",
                showlegend=False,
            )
        )
    if s.kind == "bar":
        opacity = 0.55 if overlay else 1.0
        traces.append(
            go.Bar(x=s.x, y=s.y, name=s.name, marker_color=color, width=s.width, opacity=opacity, text=s.text)
        )
    elif s.kind == "area":
        traces.append(go.Scatter(x=s.x, y=s.y, name=s.name, mode="lines", fill="tozeroy", line={"color": color}))
    else:
        mode = ("lines+markers" if len(s.x) <= MAX_MARKERS else "lines") if s.kind == "line" else "markers"
        if s.text:
            mode += "+text"
        line = {"color": color, "dash": "dash" if s.dash else "solid"}
        extra = {}
        if s.hover is not None:
            extra |= {"hovertext": s.hover, "hoverinfo": "text"}
        if s.errors is not None:
            extra["error_y"] = {"type": "data", "array": s.errors, "visible": True, "thickness": 1}
        marker = {k: v for k, v in (("symbol", s.symbol), ("size", s.size)) if v is not None}
        if marker:
            extra["marker"] = marker
        traces.append(
            go.Scatter(
                x=s.x, y=s.y, name=s.name, mode=mode, line=line, text=s.text, textposition=s.text_position, **extra
            )
        )
    return traces


def to_plotly(chart: Chart) -> go.Figure:
    fig = go.Figure()
    for s, color in zip(chart.series, chart.colors(), strict=True):
        fig.add_traces(_plotly_traces(s, color, chart.barmode == "overlay"))
    for y, label in chart.hlines:
        fig.add_hline(y=y, line_dash="dot", annotation_text=label, annotation_position="top left")
    # The note in lines of NOTE_WIDTH characters (Plotly wraps no text), just above the plot; the title above it.
    note = textwrap.wrap(chart.note, NOTE_WIDTH)
    top = 12 + 14 * len(note)  # pixels the note takes above the plot
    fig.update_layout(
        title={"text": chart.title, "font": {"size": 15}, "x": 0, "xref": "container", "y": 1, "yref": "paper"},
        xaxis_title=chart.x_label,
        yaxis_title=chart.y_label,
        barmode=chart.barmode,
        template="plotly_white",
        height=chart.height,
        margin={"l": MARGIN, "r": 20, "t": top + 40, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    fig.update_layout(title={"xanchor": "left", "yanchor": "bottom", "pad": {"b": top, "l": LEFT}})
    if note:
        fig.add_annotation(
            text="<br>".join(note),
            **{"x": 0, "y": 1, "xref": "paper", "yref": "paper", "xanchor": "left", "yanchor": "bottom"},
            **{"showarrow": False, "align": "left", "font": {"size": 11}, "yshift": 4, "xshift": LEFT - MARGIN},
        )
    if chart.y_range is not None:
        fig.update_yaxes(range=list(chart.y_range))
    if chart.y_log:
        fig.update_yaxes(type="log")
    return fig


def _category_positions(series: list[Series]) -> dict:
    """Bar charts with text categories: one slot per category, in order of first appearance."""
    cats: dict = {}
    for s in series:
        for x in s.x:
            cats.setdefault(x, len(cats))
    return cats


def _matplotlib_points(ax, s: Series, x: np.ndarray, y: np.ndarray, color: str) -> None:
    """A line or markers series: its markers (symbol and size as in Plotly), error bars and text labels."""
    style = ("--" if s.dash else "-") if s.kind == "line" else "none"
    marker, hollow = SYMBOLS.get(s.symbol, ("o", False))
    marker = marker if len(x) <= MAX_MARKERS or s.kind == "markers" else None
    size = 3 if s.size is None else s.size / 2
    fill = {"fillstyle": "none"} if hollow else {}
    ax.plot(x, y, linestyle=style, marker=marker, markersize=size, color=color, label=s.name, **fill)
    if s.errors is not None:
        ax.errorbar(x, y, yerr=_floats(s.errors), linestyle="none", color=color, linewidth=0.8)
    positions = [s.text_position] * len(x) if isinstance(s.text_position, str) else s.text_position
    for xi, yi, t, where in zip(x, y, s.text or [], positions, strict=False):
        vertical, horizontal = where.split()  # as Plotly's textposition: "top center", "bottom right", ...
        dy, va = {"top": (5, "bottom"), "middle": (0, "center"), "bottom": (-5, "top")}[vertical]
        dx, ha = {"left": (-5, "right"), "center": (0, "center"), "right": (5, "left")}[horizontal]
        ax.annotate(t, (xi, yi), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, fontsize=7)


def to_matplotlib(chart: Chart):
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    bars = [s for s in chart.series if s.kind == "bar"]
    categorical = any(isinstance(x, str) for s in bars for x in s.x)
    slots = _category_positions(bars) if categorical else {}
    bottoms: dict = {}
    for s, color in zip(chart.series, chart.colors(), strict=True):
        y = _floats(s.y)
        if s.kind == "bar":
            x = np.array([slots[v] for v in s.x] if categorical else s.x, dtype=np.float64)
            width = s.width or 0.8
            if chart.barmode == "group" and len(bars) > 1:
                width = width / len(bars)
                x = x + (bars.index(s) - (len(bars) - 1) / 2) * width
            bottom = np.array([bottoms.get(v, 0.0) for v in x]) if chart.barmode == "stack" else None
            alpha = 0.55 if chart.barmode == "overlay" else 1.0
            ax.bar(x, np.nan_to_num(y), width=width, bottom=bottom, color=color, alpha=alpha, label=s.name)
            if chart.barmode == "stack":
                for xi, yi in zip(x, np.nan_to_num(y), strict=True):
                    bottoms[xi] = bottoms.get(xi, 0.0) + yi
            continue
        x = _floats(s.x)
        if s.band is not None:
            ax.fill_between(x, _floats(s.band[0]), _floats(s.band[1]), color=color, alpha=0.2, linewidth=0)
        if s.kind == "area":
            ax.fill_between(x, 0, y, color=color, alpha=0.35, label=s.name)
        else:
            _matplotlib_points(ax, s, x, y, color)
    if categorical:
        ax.set_xticks(list(slots.values()), [str(c) for c in slots])
    for y, label in chart.hlines:
        ax.axhline(y, linestyle=":", color="gray")
        ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    ax.set_title("\n".join([chart.title, *textwrap.wrap(chart.note, 80)]), fontsize=9)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    if chart.y_range is not None:
        ax.set_ylim(*chart.y_range)
    if chart.y_log:
        ax.set_yscale("log")
    if chart.series:  # stacked bars fill the axes: their legend goes beside them
        outside = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0)} if chart.barmode == "stack" else {}
        ax.legend(fontsize=7, **outside)
    fig.tight_layout()
    return fig


def save_png(chart: Chart, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = to_matplotlib(chart)
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
