"""A run's precision (:attr:`csd.config.SamplingConfig.precision`) and the models it runs on.

* "float32" (the default): weights, canvas, chains and every density in float32.
* "bfloat16" / "float16": the backbones under autocast; heads and densities stay in float32, but for a
  compiled head's products (the default on CUDA, csd/models/kernels.py), which take the autocast dtype.
* "float64": every part in float64, the models' weights too (:func:`at_precision` makes a float64 copy):
  the exact reference. The random numbers are the float32 runs' own (drawn in float32, then widened), so
  a float64 run is the float32 run without its rounding: what is a matter of logic (per-image streams,
  batch invariance, acceptance decisions, round trips) holds in float64 on every CPU, and the float32
  run's distance from it is its rounding alone (docs/specification_notes.md, "Numbers on other CPUs").
"""

from __future__ import annotations

import copy

import torch
from torch import nn

RUN_DTYPES = {"float64": torch.float64}  # every other precision runs its canvas, chains and densities in float32


def run_dtype(precision: str) -> torch.dtype:
    """The dtype of a run's canvas, noise, chains and densities at ``precision``."""
    return RUN_DTYPES.get(precision, torch.float32)


def weights_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of a model's floating-point weights (float32 for a model with none)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def at_precision(model: nn.Module, precision: str) -> nn.Module:
    """``model`` itself when its weights suit ``precision``, else a copy whose floating-point weights and
    buffers are cast to what it needs (float64 for "float64", float32 otherwise); the model passed is never
    changed, so a float32 model and its float64 copy can serve side by side."""
    want = run_dtype(precision)
    if weights_dtype(model) == want:
        return model
    return copy.deepcopy(model).to(want)
