"""Official-format MAR checkpoints load safely; broken or mismatched ones fail with clear messages."""

import argparse
import pickle

import pytest
import torch

from csd.models.checkpoint import CheckpointError
from csd.models.mar import MAR, MAR_CONFIGS, mar_config
from csd.models.mar.official import config_from_args, load_official_mar


def _official_checkpoint(path, model: MAR, ema: MAR, args: argparse.Namespace | None = None):
    """The layout of MAR's misc.save_model: weights, EMA weights, optimizer state, epoch, scaler, args."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = {
        "model": model.state_dict(),
        "model_ema": ema.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "scaler": {"scale": 65536.0},
    }
    if args is not None:
        ckpt["args"] = args
    torch.save(ckpt, path)


def _args(**kw) -> argparse.Namespace:
    base = dict(
        model="mar_test",
        img_size=64,
        vae_stride=16,
        patch_size=1,
        vae_embed_dim=16,
        class_num=10,
        buffer_size=4,
        diffloss_d=1,
        diffloss_w=32,
        num_sampling_steps="10",
        label_drop_prob=0.1,
    )
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture()
def two_models():
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        return MAR(mar_config("mar_test")), MAR(mar_config("mar_test"))


def test_loads_ema_weights_by_default_and_raw_on_request(tmp_path, two_models):
    model, ema = two_models
    path = tmp_path / "checkpoint-last.pth"
    _official_checkpoint(path, model, ema, _args())
    loaded = load_official_mar(path)
    for k, v in ema.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    raw = load_official_mar(path, weights="model")
    assert torch.equal(raw.z_proj.weight, model.z_proj.weight)
    assert not loaded.training


def test_config_comes_from_args_with_string_sampling_steps(two_models):
    cfg = config_from_args(_args(num_sampling_steps="7"))
    assert cfg.num_sampling_steps == 7 and cfg.diffloss_w == 32


def test_named_official_configs_have_published_head_sizes():
    sizes = {k: (c.diffloss_d, c.diffloss_w, c.encoder_embed_dim, c.encoder_depth) for k, c in MAR_CONFIGS.items()}
    assert sizes["mar_base"] == (6, 1024, 768, 12)
    assert sizes["mar_large"] == (8, 1280, 1024, 16)
    assert sizes["mar_huge"] == (12, 1536, 1280, 20)


@pytest.mark.parametrize(
    "name,count", [("mar_base", 207_924_768), ("mar_large", 478_326_304), ("mar_huge", 942_403_104)]
)
def test_parameter_counts_match_official_models(name, count):
    # Counts of the official classes built with the same arguments (README: 208M, 479M, 943M).
    with torch.device("meta"):
        assert sum(p.numel() for p in MAR(mar_config(name)).parameters()) == count


def test_missing_config_without_args_is_a_clear_error(tmp_path, two_models):
    path = tmp_path / "ckpt.pth"
    _official_checkpoint(path, *two_models)
    with pytest.raises(CheckpointError, match="no 'args'"):
        load_official_mar(path)
    assert isinstance(load_official_mar(path, config="mar_test"), MAR)


def test_corrupted_file_fails_with_file_name(tmp_path):
    path = tmp_path / "broken.pth"
    path.write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError, match="broken.pth"):
        load_official_mar(path, config="mar_test")


def test_missing_file_fails_with_file_name(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nope.pth"):
        load_official_mar(tmp_path / "nope.pth", config="mar_test")


def test_mismatched_weights_list_missing_unexpected_and_shape_errors(tmp_path, two_models):
    model, ema = two_models
    state = ema.state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["fake_latent"]
    state["z_proj.weight"] = torch.zeros(3, 3)
    torch.save({"model_ema": state, "model": model.state_dict()}, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as err:
        load_official_mar(tmp_path / "bad.pth", config="mar_test")
    msg = str(err.value)
    assert "missing keys (1): fake_latent" in msg and "unexpected keys (1): extra.weight" in msg
    assert "z_proj.weight: checkpoint (3, 3)" in msg


def test_wrong_architecture_is_reported_as_shape_mismatch(tmp_path, two_models):
    model, ema = two_models
    _official_checkpoint(tmp_path / "c.pth", model, ema)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_official_mar(tmp_path / "c.pth", config=mar_config("mar_test", diffloss_w=48))


class _Evil:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_arbitrary_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model_ema": {}, "payload": _Evil()}, path, pickle_module=pickle)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_official_mar(path, config="mar_test")


def test_a_mar_whose_buffer_exceeds_its_tokens_runs_as_the_official_code_does():
    """The official default buffer (64) beside a 64 px image (16 tokens): the encoder keeps all 64 buffer rows
    and the known tokens, found on the device (``known`` given) or by the mask on the host, alike; generation
    and the training loss run."""
    from csd.config import SamplingConfig
    from csd.core.precision import at_precision
    from csd.models.mar.network import keep_rows, place_rows
    from csd.sampling import generate

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = at_precision(MAR(mar_config("mar_test", buffer_size=64)), "float64").eval()
    assert model.config.seq_len == 16
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[:, :5] = False
    x = torch.randn(3, 64 + 16, 8, dtype=torch.float64)
    kept = keep_rows(x, mask, 64, 5)
    assert kept.shape == (3, 69, 8) and torch.equal(kept, keep_rows(x, mask, 64, None))
    assert torch.equal(
        place_rows(torch.zeros_like(x), kept, mask, 64, 5), place_rows(torch.zeros_like(x), kept, mask, 64, None)
    )
    s = SamplingConfig(num_steps=4, cfg_scale=2.0, head_steps=3, precision="float64")
    both = generate(model, [1, 2], [0, 1], s).tokens
    torch.testing.assert_close(generate(model, [2], [1], s).tokens[0], both[1], rtol=0.0, atol=1e-9)
    loss = model.train()(torch.randn(2, 16, 16, dtype=torch.float64), torch.tensor([1, 2]))
    assert torch.isfinite(loss)
