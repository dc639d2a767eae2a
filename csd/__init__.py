"""Continuous speculative decoding (CSD) for continuous autoregressive image models.

The two samplers and their settings; the model-family interface they run on is :mod:`csd.family`."""

from csd.family import ModelFamily, Plan, TokenChain
from csd.sampling import Generation, SamplingConfig, generate
from csd.speculative import CSDConfig, speculative_generate
from csd.trace import Maker, Trace

__version__ = "0.1.0"
__all__ = [
    "CSDConfig",
    "Generation",
    "Maker",
    "ModelFamily",
    "Plan",
    "SamplingConfig",
    "TokenChain",
    "Trace",
    "generate",
    "speculative_generate",
]
