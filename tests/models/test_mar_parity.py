"""The project's MAR, head and diffusion reproduce the official implementation's numbers.

tests/data/mar_reference.pt was made by tests/data/make_mar_reference.py from the official code, in float32 on
one CPU. The project's float64 run of the same weights is the exact value up to float64 rounding on any CPU, so
its distance from the reference is the reference's own float32 rounding, a fixed number: the bounds below are
that distance, measured, times a margin, and hold on every CPU. The float32 run is compared too, within what
float32 kernels of other CPUs move it (the tolerances it always had: measured here 0, the reference's own
kernels; it passes under two threads, oneDNN off and the AVX2 and default capabilities)."""

from pathlib import Path

import pytest
import torch

from csd.core.chain import ChainNoise, HeadCondition, run_chain
from csd.core.precision import at_precision
from csd.models import diffusion as gd
from csd.models.mar import MAR, mar_config

REF = torch.load(Path(__file__).parents[1] / "data" / "mar_reference.pt", weights_only=True)
PRECISIONS = ("float32", "float64")
pytestmark = pytest.mark.kernels  # rerun under other kernels (tests/repository/test_perturbations.py)


@pytest.fixture(scope="module")
def model32() -> MAR:
    m = MAR(mar_config("mar_test")).eval()
    m.load_state_dict(REF["state"], strict=True)
    return m


@pytest.fixture(scope="module")
def models(model32) -> dict[str, MAR]:
    return {"float32": model32, "float64": at_precision(model32, "float64")}


def ref(name: str, precision: str) -> torch.Tensor:
    """A reference input in the run's precision (indices stay as they are)."""
    t = REF[name]
    return t.double() if precision == "float64" and t.is_floating_point() else t


def assert_matches(got: torch.Tensor, expected: torch.Tensor, precision: str, f64: tuple, f32: tuple) -> None:
    """Within (rtol, atol): ``f64`` for the float64 run (the measured float32 rounding of the reference, with a
    margin), ``f32`` for the float32 run (what other CPUs' float32 kernels move it by)."""
    rtol, atol = f64 if precision == "float64" else f32
    torch.testing.assert_close(got, expected.to(got.dtype), rtol=rtol, atol=atol)


def test_official_state_dict_loads_strictly_into_the_test_config(model32):
    assert set(model32.state_dict()) == set(REF["state"])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_backbone_conditions_match_official_encoder_decoder(models, precision):
    model = models[precision]
    with torch.no_grad():
        z = model.backbone(ref("tokens", precision), REF["mask"], model.class_embedding(REF["labels"]))
    assert_matches(z, REF["z"], precision, (0.0, 3e-7), (1e-4, 1e-5))  # float64: measured 2.9e-8 (|z| <= 0.31)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_head_network_output_matches_official(models, precision):
    model = models[precision]
    with torch.no_grad():
        out = model.diffloss.net(ref("head_x", precision), REF["head_t"], ref("head_z", precision))
    assert_matches(out, REF["head_out"], precision, (0.0, 2e-6), (1e-4, 1e-5))  # float64: measured 1.8e-7


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_chain_matches_official_p_sample_loop(models, precision, cfg, temperature):
    model, z = models[precision], ref("head_z", precision)
    scale = torch.full((z.shape[0],), cfg, dtype=z.dtype)
    cond = HeadCondition(z) if cfg == 1.0 else HeadCondition(z, ref("chain_zu", precision), scale)
    noise = ChainNoise(ref("chain_xi", precision), ref("chain_eps", precision))
    with torch.no_grad():
        traj = run_chain(model.head.chain(10), cond, noise, temperature)
    expected = REF[f"chain_x_cfg{cfg:g}_temp{temperature:g}"]
    # the untrained head's tokens reach 6e4: float64 measured 2.8e-7 of the largest (the reference's rounding)
    scale = expected.abs().max().item()
    assert_matches(traj.x, expected, precision, (0.0, 2e-6 * scale), (1e-4, 1e-4 * scale))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_training_loss_matches_official_mse_plus_vlb(models, precision):
    model = models[precision]
    sched = model.diffloss.train_schedule
    x0, noise, t = ref("loss_x0", precision), ref("loss_noise", precision), REF["loss_t"]
    x_t = gd.q_sample(sched, x0, t, noise)
    with torch.no_grad():
        loss = gd.diffusion_loss(sched, model.diffloss.net(x_t, t, ref("head_z", precision)), x0, x_t, t, noise)
    assert_matches(loss, REF["loss"], precision, (5e-6, 0.0), (1e-4, 1e-6))  # float64: measured 7.5e-7 relative
