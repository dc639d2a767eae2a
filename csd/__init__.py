"""Continuous speculative decoding (CSD) for continuous autoregressive image models."""

__version__ = "0.1.0"
