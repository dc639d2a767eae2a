"""Continuous speculative decoding (CSD) for continuous autoregressive image models.

The two samplers, their settings and the choice between them (:class:`Method`); the model-family interface
they run on is :mod:`csd.family`."""

from csd.config import CSDConfig, SamplingConfig
from csd.decoding import Generation
from csd.dispatch import Method
from csd.family import ModelFamily, Plan, TokenChain
from csd.sampling import generate
from csd.speculative import speculative_generate
from csd.trace import Maker, Trace

__version__ = "0.1.0"
__all__ = [
    "CSDConfig",
    "Generation",
    "Maker",
    "Method",
    "ModelFamily",
    "Plan",
    "SamplingConfig",
    "TokenChain",
    "Trace",
    "generate",
    "speculative_generate",
]
