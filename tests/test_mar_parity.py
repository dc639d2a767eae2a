"""The project's MAR, head and diffusion reproduce the official implementation's numbers.

tests/data/mar_reference.pt was made by tests/data/make_mar_reference.py from the official code."""

from pathlib import Path

import pytest
import torch

from csd.chain import ChainNoise, HeadCondition, run_chain
from csd.models import diffusion as gd
from csd.models.mar import MAR, mar_config

REF = torch.load(Path(__file__).parent / "data" / "mar_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def model() -> MAR:
    m = MAR(mar_config("mar_test")).eval()
    m.load_state_dict(REF["state"], strict=True)
    return m


def test_official_state_dict_loads_strictly_into_the_test_config(model):
    assert set(model.state_dict()) == set(REF["state"])


def test_backbone_conditions_match_official_encoder_decoder(model):
    with torch.no_grad():
        z = model.backbone(REF["tokens"], REF["mask"], model.class_embedding(REF["labels"]))
    torch.testing.assert_close(z, REF["z"], rtol=1e-4, atol=1e-5)


def test_head_network_output_matches_official(model):
    with torch.no_grad():
        out = model.diffloss.net(REF["head_x"], REF["head_t"], REF["head_z"])
    torch.testing.assert_close(out, REF["head_out"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_chain_matches_official_p_sample_loop(model, cfg, temperature):
    z = REF["head_z"]
    cond = HeadCondition(z) if cfg == 1.0 else HeadCondition(z, REF["chain_zu"], torch.full((z.shape[0],), cfg))
    with torch.no_grad():
        traj = run_chain(model.head.chain(10), cond, ChainNoise(REF["chain_xi"], REF["chain_eps"]), temperature)
    expected = REF[f"chain_x_cfg{cfg:g}_temp{temperature:g}"]
    torch.testing.assert_close(traj.x, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_training_loss_matches_official_mse_plus_vlb(model):
    sched = model.diffloss.train_schedule
    x0, noise, t = REF["loss_x0"], REF["loss_noise"], REF["loss_t"]
    x_t = gd.q_sample(sched, x0, t, noise)
    with torch.no_grad():
        loss = gd.diffusion_loss(sched, model.diffloss.net(x_t, t, REF["head_z"]), x0, x_t, t, noise)
    torch.testing.assert_close(loss, REF["loss"], rtol=1e-4, atol=1e-6)
