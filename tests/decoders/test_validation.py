"""Every knob rejects bad values with a ValueError that names it; nothing is silently clamped."""

import pytest
import torch

from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import SettingError
from csd.core.rng import check_seeds
from csd.core.schedule import step_sizes
from csd.models.mar import MAR, mar_config
from csd.models.tokenizer import PixelTokenizer
from csd.sampling import generate
from csd.speculative import speculative_generate
from tests.helpers import assert_same64


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"gamma": 0}, "gamma"),
        ({"gamma": 2.5}, "gamma"),
        ({"prefill": 1.0}, r"prefill ratio must be in \[0, 1\)"),
        ({"prefill": -0.1}, "prefill"),
        ({"criterion": "magic"}, "criterion"),
        ({"trajectory_term": "both"}, "trajectory_term"),
        ({"tau_v": 0.5}, r"tau_v must be in \[1, 10000\]"),
        ({"resample_widening": float("inf")}, "resample_widening"),
        ({"max_tries": 0}, "max_tries"),
    ],
)
def test_csd_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CSDConfig.from_knobs(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_steps": 0}, "num_steps"),
        ({"temperature": 0.0}, r"temperature must be in \(0, 10\]"),
        ({"temperature": -1.0}, "temperature"),
        ({"cfg_scale": -1.0}, "cfg_scale"),
        ({"cfg_scale": float("nan")}, "cfg_scale"),
        ({"cfg_schedule": "cosine"}, "cfg_schedule"),
        ({"head_steps": 0}, "head_steps"),
    ],
)
def test_sampling_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig.from_knobs(**kwargs)


@pytest.fixture(scope="module")
def model(mar_test) -> MAR:
    return mar_test


def test_more_ar_steps_than_tokens_is_rejected(model):
    with pytest.raises(ValueError, match=r"num_steps \(AR steps\) must be in \[1, 16\]"):
        generate(model, [0], [0], SamplingConfig(num_steps=17))


def test_unknown_class_is_rejected(model):
    with pytest.raises(ValueError, match=r"class labels must be in \[0, 9\]"):
        generate(model, [10], [0], SamplingConfig(num_steps=4))


def test_labels_must_match_seeds(model):
    with pytest.raises(ValueError, match="one class id per seed"):
        generate(model, [1, 2], [0], SamplingConfig(num_steps=4))


@pytest.mark.parametrize("seeds", [[-1], [1.5], [], [True]])
def test_bad_seeds_are_rejected(seeds):
    with pytest.raises(ValueError, match="seed"):
        check_seeds(seeds)


def test_head_steps_beyond_training_steps_are_rejected(model):
    with pytest.raises(ValueError, match="head_steps"):
        model.head.chain(5000)


def test_mismatched_draft_token_layout_is_rejected(model):
    other = MAR(mar_config("mar_test", token_channels=8)).eval()
    with pytest.raises(ValueError, match=r"draft model does not match.*token width \(token_dim\) is 8 .* 16"):
        speculative_generate(model, other, [0], [0], SamplingConfig(num_steps=4))


def test_mismatched_draft_grid_is_rejected(model):
    other = MAR(mar_config("mar_test", img_size=32)).eval()
    with pytest.raises(ValueError, match="number of tokens"):
        speculative_generate(model, other, [0], [0], SamplingConfig(num_steps=4))


def test_ar_steps_must_fit_token_count():
    with pytest.raises(ValueError, match="AR steps"):
        step_sizes(16, 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"encoder_embed_dim": 31}, "divisible"),
        ({"img_size": 50}, "multiple"),
        ({"clip_x0": -1.0}, "clip_x0"),
        ({"diffloss_d": 0}, "diffloss_d"),
        ({"label_drop_prob": 1.0}, "label_drop_prob"),
    ],
)
def test_mar_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mar_config("mar_test", **kwargs)


def test_unknown_config_name_lists_choices():
    with pytest.raises(ValueError, match="mar_base"):
        mar_config("mar_giant")


def test_pixel_tokenizer_rejects_out_of_range_images():
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        PixelTokenizer().encode(torch.full((1, 3, 8, 8), 2.0))


def test_pixel_tokenizer_round_trip():
    tok = PixelTokenizer(patch_size=4)
    img = torch.rand(2, 3, 32, 32) * 2 - 1
    tokens = tok.encode(img)
    assert tokens.shape == (2, 64, 48)
    torch.testing.assert_close(tok.decode(tokens), img)


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="precision"):
        SamplingConfig(precision="int8")


@pytest.mark.kernels
def test_latent_tokenizer_round_trips_through_a_tiny_vae():
    """In float64 (the VAE's float64 copy), the exact reference (tests/helpers.py): the tokenizer's calls and
    the VAE's own run on tensors laid out otherwise, which a CPU's kernels may round otherwise in float32."""
    from csd.models.tokenizer import LatentTokenizer
    from csd.models.vae import KLAutoencoder

    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        vae = KLAutoencoder("tiny").eval().double()
    images = (torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1).double()
    with torch.no_grad():
        latents = vae.image_to_tokens(images)  # (2, C, 16, 16), scaled
        c = latents.shape[1]
        for patch in (1, 2):
            tok = LatentTokenizer(vae, patch_size=patch)
            tokens = tok.encode(images)
            assert tokens.shape == (2, (16 // patch) ** 2, c * patch * patch) and tok.token_dim == c * patch * patch
            # Token (row, column) is that cell's (C, p, p) block of the scaled posterior mean, row-major cells.
            side = 16 // patch
            cell = latents[1, :, 3 * patch : 4 * patch, 5 * patch : 6 * patch].reshape(-1)
            assert_same64(tokens[1, 3 * side + 5], cell, f"patch {patch}: a token")
            # Decoding undoes the layout and the scale: the VAE's own reconstruction, clamped.
            reconstruction = vae.decode(latents / vae.latent_scale).clamp(-1, 1)
            assert_same64(tok.decode(tokens), reconstruction, f"patch {patch}: decoded")


def test_a_setting_value_checks_its_own_rules_and_the_run_set_up_the_rules_between_fields():
    """A config checks each of its knobs alone and each setting value the rules between its own knobs
    (:mod:`csd.settings`: Knob.check, the criterion's, sampler's and GtR's rules); config.py refuses only an
    unknown knob; every rule between a config's fields, between the configs or between a setting and a model
    raises in csd.run_setup."""
    import ast
    from pathlib import Path

    import csd

    root = Path(csd.__file__).parent
    raised = [
        path.relative_to(root).as_posix()
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and getattr(node.exc.func, "id", None) == "SettingError"
    ]
    assert set(raised) == {"config.py", "settings.py", "run_setup.py"} and raised.count("config.py") == 1
    SamplingConfig.from_knobs(num_steps=8, gtr_stages=(4, 8))  # made: stages against AR steps is the set-up's
    with pytest.raises(SettingError, match="ddim_eta applies to head_sampler 'ddim' only") as caught:
        SamplingConfig.from_knobs(ddim_eta=0.5)
    assert caught.value.field == "ddim_eta"
    with pytest.raises(SettingError, match="acceptance_unit 'token' needs criterion 'aligned'") as caught:
        CSDConfig.from_knobs(acceptance_unit="token", criterion="exact")
    assert caught.value.field == "acceptance_unit"
