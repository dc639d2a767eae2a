"""The decoding loop reads nothing back from the device per AR step: counted on the CPU, under a
dispatch mode, as every op whose result the host must read (:mod:`csd.core.host_reads`), between two stops of
the same run, so that set-up and teardown cancel.

Target-only decoding reads nothing per AR step, for every family. At the CUDA default (the resampler "auto"
picked as on a CUDA device: one pass) neither does CSD, on every embedded pair, and the exact block reads one
``int`` per block (where the next block starts). CSD's resampler in rounds (the CPU's default) reads: it
selects the rejected rows of a block on the host (``nonzero``), once per block even when nothing is rejected,
and redraws them in a loop that reads; with the target drafting for itself at gamma 1 (every token accepted,
nothing redrawn) the selection is all it reads."""

from __future__ import annotations

import pytest

from csd.config import CSDConfig, SamplingConfig
from csd.core.host_reads import reads_per_step
from csd.dispatch import Method
from csd.models.registry import FAMILIES
from csd.serving.pairs import embedded_pair, pair_specs, random_spec, random_spec_pair

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    """A family's untrained pair, in float64 (where the target drafts for itself, every token is accepted)."""
    return random_spec_pair(random_spec(request.param)).at_precision("float64")


def runner(pair, method: Method, draft=None):
    t = pair.traits
    steps = t.fixed_num_steps or 8
    settings = SamplingConfig.from_knobs(num_steps=steps, cfg_scale=2.0, head_steps=2, precision="float64")
    conditions = list(pair.prompts[:1]) * 2 if pair.is_text else [0, 1]
    draft = pair.draft if draft is None else draft
    return lambda on_step: method.run(pair.target, draft, conditions, [0, 1], settings, on_step)


def test_target_only_decoding_reads_nothing_back_per_ar_step(pair):
    steps = pair.traits.fixed_num_steps or 8
    per_step, by_op = reads_per_step(runner(pair, Method.target()), steps // 2, steps)
    assert per_step == 0, by_op


def test_csd_reads_only_the_rejected_rows_once_per_block(pair):
    """Gamma 1 with the target drafting for itself: every token is accepted, and the loop's one read per
    block is the resampler's selection of the rejected rows (none)."""
    steps = pair.traits.fixed_num_steps or 8
    method = Method.speculative(CSDConfig(gamma=1, prefill=0.0))
    per_step, by_op = reads_per_step(runner(pair, method, draft=pair.target), steps // 2, steps)
    assert by_op == {"nonzero": steps - steps // 2}, by_op  # one per block of one AR step
    assert per_step == 1.0


# --- the CUDA default, on the embedded pairs --------------------------------------------------------------------

CUDA_DEFAULT = {"CSD": CSDConfig(gamma=4), "exact block": CSDConfig.from_knobs(gamma=4, block="exact")}


@pytest.fixture(scope="module", params=[spec.name for spec in pair_specs("embedded")])
def embedded(request):
    return embedded_pair(request.param)


def embedded_run(pair, method: Method):
    """Batch 2, 16 AR steps (xAR: its 16 cells), 2 head steps, guidance 3."""
    steps = pair.traits.fixed_num_steps or 16
    settings = SamplingConfig(
        num_steps=steps, head_steps=2, cfg_scale=3.0, cfg_schedule=pair.traits.cfg_schedule or "linear"
    )
    conditions = list(pair.prompts[:2]) if pair.is_text else [0, 1]
    return lambda on_step: method.run(pair.target, pair.draft, conditions, [0, 1], settings, on_step)


def test_the_default_resampler_is_one_pass_on_cuda_and_rounds_on_the_cpu():
    csd = CSDConfig()
    assert csd.knob_values()["resampler"] == "auto"
    assert csd.on_device("cuda").knob_values()["resampler"] == "one_pass"
    assert csd.on_device("cpu").knob_values()["resampler"] == "rounds"
    explicit = csd.with_knobs(resampler="rounds")
    assert explicit.on_device("cuda") == explicit  # an explicit value wins


@pytest.mark.parametrize("name", ["target-only", *CUDA_DEFAULT])
def test_the_cuda_default_reads_nothing_back_per_ar_step_but_the_exact_blocks_commit_point(embedded, name):
    """The embedded pairs (class MAR, xAR, text in the Harmon layout) at gamma 4, the CUDA default's settings
    run on the CPU: target-only and CSD read nothing per AR step; the exact block one ``int`` per block."""
    method = Method.target() if name == "target-only" else Method.speculative(CUDA_DEFAULT[name].on_device("cuda"))
    steps = embedded.traits.fixed_num_steps or 16
    per_step, by_op = reads_per_step(embedded_run(embedded, method), steps // 2, steps)
    if name == "exact block":
        assert set(by_op) == {"__int__"} and 0 < per_step <= 1, by_op  # at most one per block of one step or more
    else:
        assert per_step == 0, by_op
