"""What a tab of the page is: a ``title`` and ``build(page)``, which lays the tab out (inside its ``gr.Tab``)
and wires its events; the :class:`Page` the tabs share; and the one way the page shows a refused run.

Tabs build in page order, so a tab reads what an earlier one put on the page (the Generate tab's controls,
its latest run and its event). A handler is a plain function or a generator of updates (a dict from
component to value), which Gradio streams to the page as they come.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import gradio as gr


@dataclass
class Page:
    """What the tabs of one page share. ``queue``: the queue settings of every model run (one slot group);
    the Generate tab sets the rest when it builds."""

    queue: dict
    controls: dict[str, gr.components.Component] = field(default_factory=dict)  # the Generate tab's controls
    inspected: gr.State | None = None  # the session's latest Generate run (the Inspect tab replays it)
    generated: Any = None  # the Generate event (what follows a run chains on it)


class Tab(Protocol):
    title: str

    def build(self, page: Page) -> None:
        """Lay the tab out and wire its events (called inside its ``gr.Tab``)."""


def shown_refusal(
    updates: Iterator[dict], status: gr.components.Component, what: str, after: str = "", message: bool = False
) -> Iterator[dict]:
    """A run's updates for the page: a refusal (``gr.Error``: a setting out of range, a request too big for
    this server) leaves what is shown as it was and says why in ``status`` ("**{what}:** why{after}"), until
    the next action; with ``message`` also in a message that stays until it is closed. The API's handlers
    raise instead, so a client gets the error."""
    try:
        yield from updates
    except gr.Error as err:
        if message:
            gr.Warning(err.message, duration=None)
        yield {status: f"**{what}:** {err.message}{after}"}
