"""The API schemas shared per data model (demo/schemas.py): every component of the page gets the schema
Gradio's own ``api_info`` makes, and a status line to a request in the line (an update of /generate's status
that skips its other outputs) makes none; with Gradio's per-instance cache alone it made one per skipped
output."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pydantic
import pytest
import torch
from gradio.components.base import Component
from gradio.state_holder import SessionState

from csd.serving.pairs import RANDOM_SOURCE, PairStore
from demo import schemas, server
from demo.application import App
from demo.limits import Limits


@pytest.fixture(scope="module")
def page():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    demo = server.build(application)  # shares the schemas
    yield demo, next(fn for fn in demo.fns.values() if fn.api_name == "generate")
    Component.api_info = schemas._GRADIO_API_INFO  # as Gradio has it, for the other modules of this worker


@pytest.fixture
def schemas_made(monkeypatch):
    """Counts the pydantic JSON schemas made while a test runs."""
    made = []
    original = pydantic.BaseModel.model_json_schema.__func__

    def counted(cls, *args, **kwargs):
        made.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(pydantic.BaseModel, "model_json_schema", classmethod(counted))
    return made


def status_line(demo, generate, state: SessionState):
    """What Gradio does with one status line of a waiting /generate request."""
    stats = next(b for b in generate.outputs if getattr(b, "elem_id", None) == "gen-status")
    update = demo.postprocess_data(generate, {stats: "Place 3 of 9 in line: about 12 s to wait ..."}, state)
    with ThreadPoolExecutor(1) as thread:  # a loop of its own: a browser test before may run one in this thread
        return thread.submit(asyncio.run, update).result()


def test_every_component_gets_the_schema_gradio_makes(page):
    demo, _ = page
    blocks = [b for b in demo.blocks.values() if isinstance(b, Component) and b.data_model is not None]
    assert len({type(b) for b in blocks}) >= 4  # images, plots, sliders, files...
    for block in blocks:
        fresh = type(block).__new__(type(block))  # Gradio's own api_info, on an instance with no cache
        fresh.__dict__.update(block.__dict__, _api_info_cache=None)
        assert block.api_info() == schemas._GRADIO_API_INFO(fresh), type(block).__name__


def test_a_status_line_makes_no_schema(page, schemas_made, monkeypatch):
    demo, generate = page
    state = SessionState(demo)
    status_line(demo, generate, state)  # the first: any data model not seen yet
    schemas_made.clear()
    out = status_line(demo, generate, state)
    assert out[[b.elem_id for b in generate.outputs].index("gen-status")].startswith("Place 3 of 9")
    assert schemas_made == []
    monkeypatch.setattr(Component, "api_info", schemas._GRADIO_API_INFO)  # Gradio's per-instance cache alone
    status_line(demo, generate, state)
    skipped = [b for b in generate.outputs if b.data_model is not None and b.elem_id != "gen-status"]
    assert len(schemas_made) == len(skipped) >= 5  # one per skipped output that has a data model
