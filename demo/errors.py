"""Refusals: what a visitor is told when a request cannot be served, and what the operator's log keeps.

An expected refusal (a bad value, a request over a limit, Stop) is one log line and an error that stays on
screen until the visitor closes it; only real faults print tracebacks. A value is quoted by a short
prefix, so a megabyte sent as a seed comes back as a few dozen characters."""

from __future__ import annotations

import logging

import gradio as gr

log = logging.getLogger("csd.demo")
QUOTE = 40  # characters of a refused value quoted back


def short(value: object) -> str:
    """``repr(value)``, cut to :data:`QUOTE` characters."""
    text = repr(value)
    return text if len(text) <= QUOTE else text[: QUOTE - 3] + "..."


def refuse(message: str, where: str = "request", control: str | None = None) -> gr.Error:
    """The error to raise for an expected refusal, logged as one line (``where``: the endpoint or control;
    ``control``: the name of the control it is about, where a validator shows it)."""
    log.info("refused %s: %s", control or where, message[:300].replace("\n", " "))
    error = gr.Error(message, duration=None, print_exception=False)
    error.control = control
    return error
