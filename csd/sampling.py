"""Target-only (or draft-only) generation: the baseline of every comparison.

One AR step = one pass of the model over the current tokens (:meth:`csd.family.ModelFamily.predict`),
then the chains of the step's tokens, vectorised over the batch and the step's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from csd.config import SamplingConfig
from csd.decoding import (
    Generation,
    PhaseTimer,
    StepCallback,
    StepInput,
    commit,
    draw_chain_noise,
    finished,
    new_canvas,
    predict_step,
    trace_dtype,
)
from csd.family import ModelFamily
from csd.run_setup import set_up_run
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

    Image i depends only on (seeds[i], conditions[i], config): the same as when generated alone. The run
    is checked and set up by :func:`csd.run_setup.set_up_run`.
    ``on_step`` (see :data:`csd.decoding.StepCallback`) is called after each AR step."""
    run = set_up_run(model, conditions, seeds, config or SamplingConfig())
    config, plan, device = run.sampling, run.plan, run.device
    batch, n, d = run.batch, model.seq_len, model.token_dim
    timer = PhaseTimer(device)
    phase = "target" if maker == Maker.TARGET else "draft"
    settings = {"sampling": config.knob_values(), "maker": maker.name.lower()}
    trace = Trace.empty(batch, n, plan.sizes, settings, trace_dtype(config), defer=device.type == "cuda")

    tokens, mask = new_canvas(batch, n, d, config, device)
    state = model.start(run.conditions, config)
    for s, k in enumerate(plan.sizes):
        pos, steps = plan.positions(s), run.head_steps[s]
        noise = draw_chain_noise(run.streams["chain"], k, steps, d, config.dtype)
        step = StepInput(state, pos, plan.cfg[s], noise, config, steps, phase)
        traj, _ = predict_step(model, tokens, mask, step, timer)
        commit(tokens, mask, pos, traj.x)
        trace.record_made(pos, s, maker)
        trace.record_pass(phase)
        if on_step is not None:
            on_step(s + 1, plan.num_steps, phase)
    trace.record_times(timer.finish(), timer.work)
    trace.flush()
    return Generation(finished(tokens), trace)
