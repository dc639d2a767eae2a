"""Tests for the KL-16 autoencoder (csd.models.vae). Two computations of the same numbers (our modules and the
LDM definition written out, a loaded copy, the token scaling) are compared in float64, the exact reference
(tests/helpers.py): equal up to float64 rounding on every CPU; in float32 up to rounding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from csd.core.precision import at_precision
from csd.models.checkpoint import CheckpointError
from csd.models.vae import VAE_CONFIGS, KLAutoencoder, VAEConfig, load_kl16
from tests.helpers import assert_same64

pytestmark = pytest.mark.usefixtures("one_thread")

# Total parameters of MAR's kl16 AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4)).
KL16_NUM_PARAMS = 66_456_019
KL16_NUM_TENSORS = 312

# Representative official key names and shapes (derived from the reference architecture).
KL16_SHAPES = {
    "encoder.conv_in.weight": (128, 3, 3, 3),
    "encoder.conv_in.bias": (128,),
    "encoder.down.0.block.0.norm1.weight": (128,),
    "encoder.down.0.block.1.conv2.weight": (128, 128, 3, 3),
    "encoder.down.0.downsample.conv.weight": (128, 128, 3, 3),
    "encoder.down.2.block.0.conv1.weight": (256, 128, 3, 3),
    "encoder.down.2.block.0.nin_shortcut.weight": (256, 128, 1, 1),
    "encoder.down.3.downsample.conv.weight": (256, 256, 3, 3),
    "encoder.down.4.block.0.nin_shortcut.weight": (512, 256, 1, 1),
    "encoder.down.4.attn.0.q.weight": (512, 512, 1, 1),
    "encoder.down.4.attn.1.proj_out.bias": (512,),
    "encoder.mid.block_1.conv1.weight": (512, 512, 3, 3),
    "encoder.mid.attn_1.norm.weight": (512,),
    "encoder.mid.attn_1.k.weight": (512, 512, 1, 1),
    "encoder.mid.block_2.norm2.bias": (512,),
    "encoder.norm_out.weight": (512,),
    "encoder.conv_out.weight": (32, 512, 3, 3),
    "quant_conv.weight": (32, 32, 1, 1),
    "quant_conv.bias": (32,),
    "post_quant_conv.weight": (16, 16, 1, 1),
    "decoder.conv_in.weight": (512, 16, 3, 3),
    "decoder.mid.attn_1.v.weight": (512, 512, 1, 1),
    "decoder.up.4.block.2.conv2.weight": (512, 512, 3, 3),
    "decoder.up.4.upsample.conv.weight": (512, 512, 3, 3),
    "decoder.up.3.block.0.nin_shortcut.weight": (256, 512, 1, 1),
    "decoder.up.1.block.0.nin_shortcut.weight": (128, 256, 1, 1),
    "decoder.up.1.upsample.conv.weight": (128, 128, 3, 3),
    "decoder.up.0.block.2.conv1.weight": (128, 128, 3, 3),
    "decoder.norm_out.bias": (128,),
    "decoder.conv_out.weight": (3, 128, 3, 3),
    "decoder.conv_out.bias": (3,),
}

# Keys the official model does not have (no timestep embedding, no decoder attention, no
# resampling after the last encoder / first decoder level).
KL16_ABSENT = [
    "encoder.down.4.downsample.conv.weight",
    "decoder.up.0.upsample.conv.weight",
    "decoder.up.4.attn.0.q.weight",
    "encoder.down.3.attn.0.q.weight",
    "encoder.down.0.block.0.nin_shortcut.weight",
    "encoder.down.0.block.0.temb_proj.weight",
]


def _expected_num_params(cfg: VAEConfig) -> int:
    """Parameter count derived from the architecture description, independently of the module code."""

    def conv(i: int, o: int, k: int) -> int:
        return i * o * k * k + o

    def gn(c: int) -> int:
        return 2 * c

    def res(i: int, o: int) -> int:
        return gn(i) + conv(i, o, 3) + gn(o) + conv(o, o, 3) + (conv(i, o, 1) if i != o else 0)

    def attn(c: int) -> int:
        return gn(c) + 4 * conv(c, c, 1)

    widths = [cfg.ch * m for m in cfg.ch_mult]
    n = len(widths)
    top = widths[-1]
    mid = 2 * res(top, top) + attn(top)

    enc = conv(cfg.in_channels, cfg.ch, 3)
    prev = cfg.ch
    for i, w in enumerate(widths):
        with_attn = cfg.resolution // 2**i in cfg.encoder_attn_resolutions
        for b in range(cfg.num_res_blocks):
            enc += res(prev if b == 0 else w, w) + (attn(w) if with_attn else 0)
        enc += conv(w, w, 3) if i < n - 1 else 0
        prev = w
    enc += mid + gn(top) + conv(top, 2 * cfg.embed_dim, 3)

    dec = conv(cfg.embed_dim, top, 3) + mid
    prev = top
    for i in reversed(range(n)):
        w = widths[i]
        with_attn = cfg.resolution // 2**i in cfg.decoder_attn_resolutions
        for b in range(cfg.num_res_blocks + 1):
            dec += res(prev if b == 0 else w, w) + (attn(w) if with_attn else 0)
        dec += conv(w, w, 3) if i > 0 else 0
        prev = w
    dec += gn(widths[0]) + conv(widths[0], cfg.out_channels, 3)

    return enc + dec + conv(2 * cfg.embed_dim, 2 * cfg.embed_dim, 1) + conv(cfg.embed_dim, cfg.embed_dim, 1)


@pytest.fixture(scope="module")
def kl16_meta() -> KLAutoencoder:
    # Meta tensors: shapes only, no memory or init cost.
    with torch.device("meta"):
        return KLAutoencoder("kl16")


def _tiny(seed: int = 0) -> KLAutoencoder:
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(seed)
        return KLAutoencoder("tiny").eval()


def _image(batch: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, size, size, generator=g) * 2 - 1


def _tiny64(seed: int = 0) -> KLAutoencoder:
    """The seeded tiny model in float64."""
    return at_precision(_tiny(seed), "float64")


# ------------------------------------------------------------------------------------ config


def test_kl16_config_matches_mar_defaults() -> None:
    cfg = VAE_CONFIGS["kl16"]
    assert cfg.embed_dim == 16
    assert cfg.ch == 128
    assert cfg.ch_mult == (1, 1, 2, 2, 4)
    assert cfg.num_res_blocks == 2
    assert cfg.encoder_attn_resolutions == (16,)
    assert cfg.decoder_attn_resolutions == ()
    assert cfg.downsample_factor == 16
    assert cfg.latent_size == 16
    assert cfg.latent_scale == pytest.approx(0.2325)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"embed_dim": 0}, "embed_dim"),
        ({"ch": -1}, "ch"),
        ({"ch_mult": ()}, "ch_mult"),
        ({"ch_mult": (1, 0)}, "ch_mult"),
        ({"num_res_blocks": 0}, "num_res_blocks"),
        ({"resolution": 250}, "resolution"),
        ({"num_groups": 24}, "num_groups"),
        ({"dropout": 1.0}, "dropout"),
        ({"latent_scale": 0.0}, "latent_scale"),
        ({"encoder_attn_resolutions": (0,)}, "encoder_attn_resolutions"),
        ({"ch": 1.5}, "ch"),
    ],
)
def test_config_validation_names_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"VAEConfig\.{field}\b"):
        dataclasses.replace(VAE_CONFIGS["kl16"], **changes)


def test_config_lists_become_tuples_and_is_frozen() -> None:
    cfg = VAEConfig(ch=32, ch_mult=[1, 2], resolution=32, encoder_attn_resolutions=[16])
    assert cfg.ch_mult == (1, 2)
    assert cfg.encoder_attn_resolutions == (16,)
    hash(cfg)  # usable as a dict key / cache key
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ch = 64  # type: ignore[misc]
    assert VAEConfig(**cfg.to_dict()) == cfg


def test_unknown_config_name() -> None:
    with pytest.raises(ValueError, match="unknown VAE config"):
        KLAutoencoder("kl32")


# -------------------------------------------------------------------------- kl16 structure


def test_kl16_official_key_names_and_shapes(kl16_meta: KLAutoencoder) -> None:
    shapes = {k: tuple(v.shape) for k, v in kl16_meta.state_dict().items()}
    for key, shape in KL16_SHAPES.items():
        assert key in shapes, f"missing official key {key}"
        assert shapes[key] == shape, f"{key}: {shapes[key]} != {shape}"
    for key in KL16_ABSENT:
        assert key not in shapes, f"unexpected key {key}"
    prefixes = {k.split(".")[0] for k in shapes}
    assert prefixes == {"encoder", "decoder", "quant_conv", "post_quant_conv"}


def test_kl16_parameter_count(kl16_meta: KLAutoencoder) -> None:
    state = kl16_meta.state_dict()
    assert len(state) == KL16_NUM_TENSORS
    n_params = sum(p.numel() for p in kl16_meta.parameters())
    assert n_params == KL16_NUM_PARAMS
    assert n_params == _expected_num_params(VAE_CONFIGS["kl16"])
    # No buffers: every state-dict entry is a trainable parameter.
    assert sum(v.numel() for v in state.values()) == n_params


def test_tiny_parameter_count_matches_formula() -> None:
    model = KLAutoencoder("tiny")
    assert sum(p.numel() for p in model.parameters()) == _expected_num_params(VAE_CONFIGS["tiny"])


# ------------------------------------------------------------------------------- forward


class _ReferenceKL:
    """MAR's AutoencoderKL (the LDM ``Encoder`` / ``Decoder`` / ``AttnBlock`` / ``ResnetBlock``) written out
    from its published definition with torch.nn.functional, on a state dict by the official key names: an
    oracle that shares no module code with csd.models.vae."""

    def __init__(self, state: dict, cfg: VAEConfig):
        self.s, self.cfg = state, cfg

    def norm(self, x, key):
        return torch.nn.functional.group_norm(
            x, self.cfg.num_groups, self.s[key + ".weight"], self.s[key + ".bias"], 1e-6
        )

    def conv(self, x, key, padding=0, stride=1):
        return torch.nn.functional.conv2d(x, self.s[key + ".weight"], self.s[key + ".bias"], stride, padding)

    def resnet(self, x, key):
        silu = torch.nn.functional.silu
        h = self.conv(silu(self.norm(x, key + ".norm1")), key + ".conv1", 1)
        h = self.conv(silu(self.norm(h, key + ".norm2")), key + ".conv2", 1)
        return (self.conv(x, key + ".nin_shortcut") if key + ".nin_shortcut.weight" in self.s else x) + h

    def attn(self, x, key):
        h = self.norm(x, key + ".norm")
        q, k, v = (self.conv(h, f"{key}.{n}") for n in "qkv")
        b, c, hh, ww = q.shape
        w = torch.bmm(q.reshape(b, c, hh * ww).permute(0, 2, 1), k.reshape(b, c, hh * ww)) * c**-0.5
        h = torch.bmm(v.reshape(b, c, hh * ww), torch.softmax(w, dim=2).permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + self.conv(h, key + ".proj_out")

    def middle(self, h, key):
        return self.resnet(self.attn(self.resnet(h, key + ".block_1"), key + ".attn_1"), key + ".block_2")

    def encode(self, x):
        cfg, levels = self.cfg, len(self.cfg.ch_mult)
        h = self.conv(x, "encoder.conv_in", 1)
        for i in range(levels):
            for j in range(cfg.num_res_blocks):
                h = self.resnet(h, f"encoder.down.{i}.block.{j}")
                if cfg.resolution // 2**i in cfg.encoder_attn_resolutions:
                    h = self.attn(h, f"encoder.down.{i}.attn.{j}")
            if i != levels - 1:  # LDM's Downsample: pad right and bottom by one, 3x3 conv of stride 2
                h = self.conv(torch.nn.functional.pad(h, (0, 1, 0, 1)), f"encoder.down.{i}.downsample.conv", 0, 2)
        h = self.middle(h, "encoder.mid")
        h = self.conv(torch.nn.functional.silu(self.norm(h, "encoder.norm_out")), "encoder.conv_out", 1)
        mean, logvar = self.conv(h, "quant_conv").chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z):
        cfg, levels = self.cfg, len(self.cfg.ch_mult)
        h = self.middle(self.conv(self.conv(z, "post_quant_conv"), "decoder.conv_in", 1), "decoder.mid")
        for i in reversed(range(levels)):
            for j in range(cfg.num_res_blocks + 1):
                h = self.resnet(h, f"decoder.up.{i}.block.{j}")
                if cfg.resolution // 2**i in cfg.decoder_attn_resolutions:
                    h = self.attn(h, f"decoder.up.{i}.attn.{j}")
            if i != 0:  # LDM's Upsample: nearest x2, 3x3 conv
                h = self.conv(
                    torch.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest"),
                    f"decoder.up.{i}.upsample.conv",
                    1,
                )
        return self.conv(torch.nn.functional.silu(self.norm(h, "decoder.norm_out")), "decoder.conv_out", 1)


@pytest.mark.kernels
def test_tiny_encode_decode_equal_the_reference_autoencoder() -> None:
    """Posterior mean, clamped log-variance and reconstruction of a seeded tiny model equal the LDM definition
    computed independently (_ReferenceKL), also on a non-square image; shapes follow the downsample factor.
    In float64: the same numbers up to float64 rounding."""
    model = _tiny64()
    ref = _ReferenceKL(model.state_dict(), model.config)
    f = model.config.downsample_factor
    img = _image(batch=2, size=32).double()
    with torch.no_grad():
        mean, logvar = model.encode(img)
        ref_mean, ref_logvar = ref.encode(img)
        assert mean.shape == (2, model.config.embed_dim, 32 // f, 32 // f)
        assert_same64(mean, ref_mean, "posterior mean")
        assert_same64(logvar, ref_logvar, "log-variance")
        out = model.decode(mean)
        assert out.shape == img.shape
        assert_same64(out, ref.decode(ref_mean), "reconstruction")
        assert_same64(model(img), out, "forward")  # forward: the reconstruction through the mean
        # Non-square inputs work too (the attention path is size-agnostic).
        wide = _image(batch=1, size=32)[..., :16].double()
        assert_same64(model.encode(wide)[0], ref.encode(wide)[0], "a non-square image")
        assert model.encode(wide)[0].shape == (1, model.config.embed_dim, 32 // f, 16 // f)
        # The clamp is the official one: a huge log-variance bias reads 20, never exp() overflow.
        model.quant_conv.bias.data[model.config.embed_dim :] = 1e4
        assert torch.equal(model.encode(img)[1], torch.full_like(logvar, 20.0))


def test_encode_rejects_bad_shapes() -> None:
    model = _tiny()
    with pytest.raises(ValueError, match="multiples"):
        model.encode(torch.zeros(1, 3, 31, 32))
    with pytest.raises(ValueError, match="encode expects"):
        model.encode(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match="decode expects"):
        model.decode(torch.zeros(1, 3, 16, 16))


def test_sample_latent_reproducible_and_uses_no_global_rng() -> None:
    model = _tiny()
    with torch.no_grad():
        mean, logvar = model.encode(_image())
    global_state = torch.get_rng_state()
    a = model.sample_latent(mean, logvar, torch.Generator().manual_seed(123))
    b = model.sample_latent(mean, logvar, torch.Generator().manual_seed(123))
    c = model.sample_latent(mean, logvar, torch.Generator().manual_seed(124))
    assert torch.equal(global_state, torch.get_rng_state())
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == mean.shape
    # Zero variance collapses the sample onto the mean.
    tiny_var = torch.full_like(logvar, -30.0)
    d = model.sample_latent(mean, tiny_var, torch.Generator().manual_seed(0))
    torch.testing.assert_close(d, mean, atol=1e-5, rtol=0)  # std = exp(-15) ~ 3e-7


def test_sample_latent_statistics() -> None:
    mean = torch.full((4, 2, 32, 32), 1.5)
    logvar = torch.full_like(mean, 2 * torch.log(torch.tensor(0.5)).item())  # std 0.5
    z = KLAutoencoder.sample_latent(mean, logvar, torch.Generator().manual_seed(7))
    assert abs(z.mean().item() - 1.5) < 0.02
    assert abs(z.std().item() - 0.5) < 0.02


@pytest.mark.kernels
def test_tokens_scaling_round_trip() -> None:
    """In float64: up to float64 rounding."""
    model = _tiny64()
    img = _image().double()
    with torch.no_grad():
        mean, _ = model.encode(img)
        tokens = model.image_to_tokens(img)
        assert_same64(tokens, mean * 0.2325, "tokens")
        assert_same64(model.tokens_to_image(tokens), model.decode(mean), "decoded tokens")
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        assert_same64(model.image_to_tokens(img, g1), model.image_to_tokens(img, g2), "the same seed again")


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.kernels
@pytest.mark.parametrize("wrapped", [True, False], ids=["model-key", "bare"])
def test_load_round_trip(tmp_path, wrapped: bool) -> None:
    model = _tiny(seed=5)
    state = model.state_dict()
    path = tmp_path / "vae.ckpt"
    torch.save({"model": state} if wrapped else state, path)

    loaded = load_kl16(path, config="tiny")
    assert not loaded.training
    for k, v in state.items():
        assert torch.equal(loaded.state_dict()[k], v), k  # every weight bit for bit
    # so the same numbers: compared in float64 (in float32 a kernel may round a loaded tensor otherwise)
    model64, loaded64 = at_precision(model, "float64"), at_precision(loaded, "float64")
    img = _image().double()
    with torch.no_grad():
        assert_same64(model64.encode(img)[0], loaded64.encode(img)[0], "encoded")
        z = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0)).double()
        assert_same64(model64.decode(z), loaded64.decode(z), "decoded")


def test_load_accepts_config_object(tmp_path) -> None:
    model = _tiny()
    path = tmp_path / "vae.ckpt"
    torch.save({"model": model.state_dict()}, path)
    assert load_kl16(path, config=VAE_CONFIGS["tiny"]).config == VAE_CONFIGS["tiny"]


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_kl16(tmp_path / "nope.ckpt", config="tiny")


def test_load_corrupted_file(tmp_path) -> None:
    path = tmp_path / "bad.ckpt"
    path.write_bytes(b"this is not a torch checkpoint" * 10)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_kl16(path, config="tiny")


def test_load_truncated_file(tmp_path) -> None:
    path = tmp_path / "trunc.ckpt"
    torch.save({"model": _tiny().state_dict()}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        load_kl16(path, config="tiny")


def test_load_renamed_key_names_it(tmp_path) -> None:
    state = _tiny().state_dict()
    state["encoder.conv_in.weigth"] = state.pop("encoder.conv_in.weight")
    path = tmp_path / "renamed.ckpt"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError) as info:
        load_kl16(path, config="tiny")
    msg = str(info.value)
    assert "encoder.conv_in.weight" in msg  # missing
    assert "encoder.conv_in.weigth" in msg  # unexpected


def test_load_wrong_shape_names_key(tmp_path) -> None:
    state = _tiny().state_dict()
    state["quant_conv.weight"] = torch.zeros(4, 8, 1, 1)
    path = tmp_path / "shape.ckpt"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError, match=r"quant_conv\.weight"):
        load_kl16(path, config="tiny")


def test_load_non_tensor_entry(tmp_path) -> None:
    state = dict(_tiny().state_dict())
    state["epoch"] = 3
    path = tmp_path / "odd.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="epoch"):
        load_kl16(path, config="tiny")
