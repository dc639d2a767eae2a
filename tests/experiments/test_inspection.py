"""Artifact inspection: replay frames add up to the final image, the token inspector reports the trace's
own numbers, hints rank by the distance to the target-only image, and the trace's details are honest.
The runs are in float64, the exact reference (tests/helpers.py): keeping details changes nothing and the
details agree with the trace up to float64 rounding on every CPU; in float32 the same holds up to rounding."""

import numpy as np
import pytest
import torch

from csd.config import CSDConfig
from csd.experiments.inspection import artifact_hints, inspect_token, token_index
from csd.records.replay_frames import DRAFTED, UNKNOWN, replay_frames
from csd.sampling import generate
from csd.serving.pairs import embedded_pair
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_same64, pair_name, sampling64
from visualize.images import display_grid, locate, token_map
from visualize.replay import chains_chart

pytestmark = pytest.mark.usefixtures("one_thread")
SAMPLING = sampling64(num_steps=8, cfg_scale=2.0)
LABELS, SEEDS = [1, 2, 3], [7, 8, 9]


@pytest.fixture(scope="module")
def embedded():
    """The embedded class pair (trained) in float64."""
    return embedded_pair(pair_name("mar", "embedded")).at_precision("float64")


@pytest.fixture(scope="module")
def target_only(embedded):
    """The pair's target-only run, made once for both criteria (not by the ``kernels`` test's reruns, which do
    not use it)."""
    return generate(embedded.target, LABELS, SEEDS, SAMPLING)


@pytest.fixture(scope="module", params=["aligned", "exact"])
def runs(request, embedded):
    """A CSD run with its details and the same run without: in float64, on the embedded
    class pair (trained), so that some drafted tokens are accepted and some are not: its draft under the
    aligned test; under the exact one, which accepts next to nothing of that draft, the target drafting for
    itself (a block's first step accepted for certain, later ones verified in another context)."""
    csd = CSDConfig.from_knobs(gamma=3, prefill=0.05, criterion=request.param)
    m = embedded
    draft = m.draft if request.param == "aligned" else m.target
    spec = speculative_generate(m.target, draft, LABELS, SEEDS, SAMPLING, csd, keep_details=True)
    plain = speculative_generate(m.target, draft, LABELS, SEEDS, SAMPLING, csd)
    return spec, plain


@pytest.mark.kernels
def test_keeping_details_changes_no_token_and_they_agree_with_the_trace(runs):
    spec, plain = runs
    assert_same64(spec.tokens, plain.tokens, "tokens with and without details")
    assert (spec.trace.maker == plain.trace.maker).all()
    assert plain.trace.details is None
    det, trace = spec.trace.details, spec.trace
    v = trace.verified
    assert det.draft_tokens.dtype == trace.distance_aligned.dtype == np.float64  # a float64 run's trace
    # The recorded draft-target distance is the distance between the kept proposal and target sample.
    distance = np.linalg.norm(det.draft_tokens - det.target_tokens, axis=-1)
    assert_same64(torch.from_numpy(distance[v]), torch.from_numpy(trace.distance_aligned[v]), "distances")
    # Accepted exactly where the draw fell under min(1, r) (u < r <=> log u < log r).
    accepted = trace.maker == Maker.ACCEPTED
    assert accepted.any() and (v & ~accepted).any()  # both kinds of decision, so the next lines test both
    assert (det.accept_draw[accepted] < trace.accept_prob[accepted]).all()
    assert (det.accept_draw[v & ~accepted] >= trace.accept_prob[v & ~accepted]).all()
    assert np.isnan(det.accept_draw[~v]).all() and np.isnan(det.draft_tokens[~v]).all()
    # Pre-filled tokens are the target's own samples; the chains' last mean is the token (noise-free step).
    pre = trace.maker == Maker.PREFILL
    assert_same64(torch.from_numpy(det.target_tokens[pre]), spec.tokens[torch.from_numpy(pre)], "pre-fill")
    assert_same64(torch.from_numpy(det.draft_mean[v][:, -1]), torch.from_numpy(det.draft_tokens[v]), "last means")


def test_frames_add_up_to_the_final_image(runs, target_only):
    """Frames are float32 canvases (for drawing): the run's float64 tokens, each rounded to float32."""
    (spec, _), target = runs, target_only
    trace, final = spec.trace, spec.tokens.numpy().astype(np.float32)
    frames = replay_frames(spec.tokens, trace, target.tokens, target.trace)
    prefill_steps = len(np.unique(trace.ar_step[trace.maker == Maker.PREFILL]))
    blocks = len(np.unique(trace.block[trace.block >= 0]))
    assert len(frames) == prefill_steps + 2 * blocks
    last = frames[-1]
    np.testing.assert_array_equal(last.tokens, final)
    np.testing.assert_array_equal(last.status, trace.maker)
    np.testing.assert_array_equal(last.target_tokens, target.tokens.numpy().astype(np.float32))
    proposals = trace.details.draft_tokens.astype(np.float32)
    for before, after in zip(frames, frames[1:], strict=False):
        assert after.ar_steps >= before.ar_steps
        assert ((before.status == UNKNOWN) | (after.status != UNKNOWN)).all()  # nothing is ever taken away
    for f in frames:
        committed, drafted = (f.status != UNKNOWN) & (f.status != DRAFTED), f.status == DRAFTED
        np.testing.assert_array_equal(f.tokens[committed], final[committed])  # committed tokens are final
        np.testing.assert_array_equal(f.tokens[drafted], proposals[drafted])  # the draft's proposal, unverified
        assert not f.tokens[f.status == UNKNOWN].any()
        np.testing.assert_array_equal(f.target_known, (target.trace.ar_step < f.ar_steps))
    drafted_frames = [f for f in frames if "drafted" in f.label]
    assert drafted_frames and all((f.status == DRAFTED).any() for f in drafted_frames)


def test_replay_needs_the_details(runs, target_only):
    (_, plain), target = runs, target_only
    with pytest.raises(ValueError, match="keep_details=True"):
        replay_frames(plain.tokens, plain.trace, target.tokens, target.trace)


def test_the_inspector_reports_the_traces_numbers(runs, target_only):
    (spec, _), target = runs, target_only
    trace, det = spec.trace, spec.trace.details
    accepted = np.argwhere(trace.maker == Maker.ACCEPTED)[0]  # an accepted token, wherever it is
    for image, index in [
        (0, int(np.flatnonzero(trace.verified[0] & (trace.maker[0] != Maker.ACCEPTED))[0])),
        (2, int(np.flatnonzero(~trace.verified[2])[0])),
        (int(accepted[0]), int(accepted[1])),
    ]:
        info = inspect_token(spec.tokens, trace, target.tokens, image, index)
        assert info["maker"] == Maker(int(trace.maker[image, index])).name.lower()
        assert (info["row"], info["column"]) == divmod(index, 8) and info["ar_step"] == trace.ar_step[image, index]
        assert info["block"] == trace.block[image, index]
        assert info["resample_tries"] == trace.resample_tries[image, index]
        for key in ("accept_prob", "log_ratio_trajectory", "log_ratio_final"):
            value = getattr(trace, key)[image, index]
            assert (info[key] is None and np.isnan(value)) or info[key] == pytest.approx(float(value))
        np.testing.assert_allclose(info["final"], spec.tokens[image, index].numpy(), rtol=1e-6)
        np.testing.assert_allclose(info["target_only"], target.tokens[image, index].numpy(), rtol=1e-6)
        np.testing.assert_allclose(np.array(info["chains"]["target"]["std"]), det.target_std[image, index], rtol=1e-6)
        assert np.array(info["chains"]["draft"]["mean"]).shape == det.draft_mean[image, index].shape
        chart = chains_chart(info)
        assert chart.series and chart.title.startswith(f"Token ({info['row']}, {info['column']})")


def test_hints_rank_tokens_by_their_distance_to_the_target_only_image(runs, target_only):
    (spec, _), target = runs, target_only
    hints = artifact_hints(spec.tokens, spec.trace, target.tokens, top=5)
    distance = np.linalg.norm(spec.tokens.numpy() - target.tokens.numpy(), axis=-1)
    assert [h["distance"] for h in hints] == pytest.approx(sorted(distance.reshape(-1), reverse=True)[:5])
    for h in hints:
        assert h["distance"] == pytest.approx(float(distance[h["image"], h["index"]]))
        assert h["maker"] == Maker(int(spec.trace.maker[h["image"], h["index"]])).name.lower()


def test_bad_token_positions_are_refused_by_name(runs, target_only):
    (spec, _), target = runs, target_only
    with pytest.raises(ValueError, match=r"token row must be an int in \[0, 7\]"):
        token_index(64, 8, 0)
    with pytest.raises(ValueError, match=r"token column must be an int in \[0, 7\]"):
        token_index(64, 0, -1)
    with pytest.raises(ValueError, match=r"image must be an int in \[0, 2\]"):
        inspect_token(spec.tokens, spec.trace, target.tokens, 3, 0)


def test_a_click_on_a_grid_finds_the_token_under_it():
    images = np.zeros((5, 32, 32, 3), dtype=np.uint8)
    grid = display_grid(images)
    assert token_map(images, np.zeros((5, 64), dtype=np.int8)).shape == grid.shape
    side = grid.shape[1] // 3 - 2  # 3 columns, 4 px padding
    for image, row, col in [(0, 0, 0), (1, 3, 7), (4, 7, 2)]:
        r, c = divmod(image, 3)
        cell = side // 8
        x, y = c * (side + 4) + col * cell + cell // 2, r * (side + 4) + row * cell + cell // 2
        assert locate(x, y, 5, 64, 32) == (image, row, col)
    with pytest.raises(ValueError, match="not on an image"):
        locate(side + 1, 0, 5, 64, 32)  # the padding between two images
    with pytest.raises(ValueError, match="not on an image"):
        locate(2 * (side + 4) + 1, side + 5, 5, 64, 32)  # past the last image
