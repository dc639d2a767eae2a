"""One API schema per data model, shared by every instance of a component.

Gradio (6.31) answers a handler's update that leaves an output as it is (a dict that names some outputs: the
others are ``gr.skip()``) by building each skipped output anew and remaking its config, whose API schema
(``Component.api_info``: its data model's pydantic JSON schema) it caches per instance only, so it is made again
on every update. One /generate on the untrained pair remade about 90 of them; each status line a waiting
request gets remakes 7. In a burst of 40 visitors that was 5.2 s of the 11.9 s the server held the interpreter
in ``postprocess_data`` (py-spy ``--gil``; docs/space.md, "Where the line's time went").

The schema is a function of the data model alone (the base ``api_info`` reads nothing else), so
:func:`share_api_schemas` keeps one per data model class, as Gradio's own per-instance cache returns the same
dict to every caller. Components whose class defines its own ``api_info`` are left as they are.
"""

from __future__ import annotations

from typing import Any

from gradio.components.base import Component

_GRADIO_API_INFO = Component.api_info
_SCHEMAS: dict[type, dict[str, Any]] = {}  # data model class -> its schema, as Gradio's api_info makes it


def _shared_api_info(self: Component) -> dict[str, Any]:
    if self._api_info_cache is None and self.data_model is not None:
        schema = _SCHEMAS.get(self.data_model)
        if schema is None:
            schema = _SCHEMAS[self.data_model] = _GRADIO_API_INFO(self)
        self._api_info_cache = schema
    return _GRADIO_API_INFO(self)


def share_api_schemas() -> None:
    """Make ``Component.api_info`` (the base implementation) share one schema per data model; idempotent."""
    Component.api_info = _shared_api_info
