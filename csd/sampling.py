"""Target-only (or draft-only) generation: the baseline of every comparison.

One AR step = one pass of the model over the current tokens (:meth:`csd.family.ModelFamily.predict`),
then the chains of the step's tokens, vectorised over the batch and the step's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch
from torch import Tensor

from csd.config import SamplingConfig
from csd.core.precision import check_model_precision
from csd.core.rng import ImageStreams, check_seeds
from csd.decoding import (
    Generation,
    PhaseTimer,
    StepCallback,
    commit,
    draw_chain_noise,
    finished,
    model_device,
    new_canvas,
    predict_step,
    trace_dtype,
)
from csd.family import ModelFamily
from csd.trace import Maker, Trace


@torch.inference_mode()
def generate(
    model: ModelFamily,
    conditions: Sequence | Tensor,
    seeds: Sequence[int],
    config: SamplingConfig | None = None,
    maker: Maker = Maker.TARGET,
    on_step: StepCallback | None = None,
) -> Generation:
    """Generate ``len(seeds)`` images with one model alone. ``conditions``: one per seed (class ids for a
    class-conditional family, prompts for a text one).

    Image i depends only on (seeds[i], conditions[i], config): the same as when generated alone.
    ``on_step`` (see :data:`csd.decoding.StepCallback`) is called after each AR step."""
    config = config or SamplingConfig()
    seeds = check_seeds(seeds)
    check_model_precision(model, config.precision)
    device = model_device(model)
    batch, n, d = len(seeds), model.seq_len, model.token_dim
    conditions = model.check_conditions(conditions, batch, device)
    plan = model.plan(seeds, config, device)
    schedule = config.head_steps_per_step(model.head_steps(config.head_steps))
    noise_streams = ImageStreams(seeds, "chain", device)
    timer = PhaseTimer(device)
    phase = "target" if maker == Maker.TARGET else "draft"
    settings = {"sampling": asdict(config), "maker": maker.name.lower()}
    trace = Trace.empty(batch, n, plan.sizes, settings, trace_dtype(config), defer=device.type == "cuda")

    tokens, mask = new_canvas(batch, n, d, config, device)
    for s, k in enumerate(plan.sizes):
        pos = plan.positions(s)
        noise = draw_chain_noise(noise_streams, k, schedule[s], d, config.dtype)
        args = (conditions, pos, plan.cfg[s], noise, config, schedule[s], timer, phase)
        traj, _ = predict_step(model, tokens, mask, *args)
        commit(tokens, mask, pos, traj.x)
        trace.record_made(pos, s, maker)
        trace.record_pass(phase)
        if on_step is not None:
            on_step(s + 1, plan.num_steps, phase)
    trace.record_times(timer.finish(), timer.work)
    trace.flush()
    return Generation(finished(tokens), trace)
