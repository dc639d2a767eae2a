"""NextStep-1's official files: the FLUX VAE against the official module, and the checkpoint loader on a tiny
model written in the official Hugging Face layout.

The FLUX VAE (csd/models/flux_vae.py): tests/data/flux_vae_reference.pt was made by
tests/data/make_flux_vae_reference.py (its docstring has the command) from the official ``AutoencoderKL`` of
``nextstep/models/modeling_flux_vae.py`` at a tiny size (ch 32, ch_mult 1 2 1 1: f8, 16 latent channels, one
residual block a level, random weights), plain, with ``encoder_norm``, and with ``encoder_norm`` over 2 x 2
patches and a deterministic posterior. Each figure is max |project - official| / max |official|
(:func:`relative`); float32 against the official float32 run <= 1e-5, float64 against the official float64 run
(no float32 casts in either) <= 1e-10. Measured: float32 at most 2.5e-6 (the round trip, which runs both
networks; the rest at most 1.0e-6), and 5.5e-6, 3.7e-6, 4.6e-6 and 2.3e-6 under oneDNN off, the default and
AVX2 capabilities and two threads (tests/kernels.py); float64 at most 1.2e-14. Compared: the posterior's mean
and log-variance, a draw from a seeded generator, the decoder, the pipeline's tokens ((z - shift) * scale
patchified ``nchpwq->nhwcpq``, of the mean and of the draw), images from head tokens (z / scale + shift
decoded) and from the same tokens layer-normed (``use_norm``, as the pipeline's ``decoding``), and the round
trip image -> tokens -> image; the raster tokenizer and a NextStep model's ``token_layout`` over it decode those
images clamped to [-1, 1].

The loader (csd/models/nextstep/official.py): a tiny NextStep written by the test as the Hub repository has its
files (config.json with the official NextStepConfig's fields, weights in three safetensors shards with their
index, a tokenizer directory saved by transformers from a small word vocabulary), read back offline: strict
keys, the same tokens in float64, corrupted and mismatched files refused by name, the prompt ids of the official
pipeline, the checkpoint-directory layout of the family row.
"""

from __future__ import annotations

import json
import pickle
import socket
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from csd.config import CSDConfig
from csd.models.checkpoint import CheckpointError
from csd.models.flux_vae import FluxAutoencoder, FluxVAEConfig, flux_tokenizer, load_flux_vae
from csd.models.nextstep import (
    FAMILY,
    NextStep,
    NextStepConfig,
    NormedTokens,
    load_official_nextstep,
    token_norm,
)
from csd.models.nextstep.official import (
    OFFICIAL_SAMPLER,
    config_from_official,
    from_checkpoints,
    image_tokenizer,
    image_tokenizer_from_checkpoints,
)
from csd.models.tokenizer import LatentTokenizer, unpatchify
from csd.sampling import generate
from csd.speculative import speculative_generate
from tests.helpers import sampling64
from tests.models.test_nextstep_parity import REF as NEXTSTEP_REF
from tests.models.test_nextstep_parity import IdTokenizer, project_config

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = Path(__file__).parents[1] / "data"
VAE_REF = torch.load(DATA / "flux_vae_reference.pt", weights_only=True)
BOUNDS = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-10)}
DECODER_ONLY = ("decoded", "images_from_tokens", "images_from_normed_tokens")  # stored under "plain" only


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    assert got.shape == want.shape
    return ((got - want).abs().max() / want.abs().max()).item()


# --- the FLUX VAE against the official module --------------------------------------------------------------------


def reference_vae(variant: str, dtype: torch.dtype) -> FluxAutoencoder:
    """The project's VAE with the reference's weights (float16 values), loaded strictly, in ``dtype``."""
    vae = FluxAutoencoder(FluxVAEConfig(**VAE_REF["variants"][variant]["config"]))
    vae.load_state_dict({k: v.float() for k, v in VAE_REF["state_dict"].items()}, strict=True)
    return vae.to(dtype).eval()


def normed_layout(tokenizer):
    """A NextStep model's token layout under ``use_norm`` (what its canvas's tokens decode through)."""
    config = replace(FAMILY.presets["random_nextstep_target"], use_norm=True)
    return NextStep(config, IdTokenizer()).token_layout(tokenizer)


def vae_errors(variant: str, precision: str) -> dict[str, float]:
    dtype = BOUNDS[precision][0]
    vae = reference_vae(variant, dtype)
    want = {
        **{k: VAE_REF["variants"]["plain"][precision][k] for k in DECODER_ONLY},
        **VAE_REF["variants"][variant][precision],
    }
    images, latents, tokens = (VAE_REF["inputs"][k].to(dtype) for k in ("images", "latents", "tokens"))
    seeded = lambda: torch.Generator().manual_seed(VAE_REF["sample_seed"])
    tokenizer = flux_tokenizer(vae, VAE_REF["patch_size"])
    to_image = lambda t: vae.tokens_to_image(unpatchify(t, 2, 16))
    with torch.no_grad():
        mean, logvar = vae.encode(images)
        ours = tokenizer.encode(images)
        normed = normed_layout(tokenizer)
        assert isinstance(normed, NormedTokens)
        errors = {
            "mean": relative(mean, want["mean"]),
            "logvar": relative(logvar, want["logvar"]),
            "sample": relative(vae.sample_latent(mean, logvar, seeded()), want["sample"]),
            "decoded": relative(vae.decode(latents), want["decoded"]),
            "tokens_mean": relative(ours, want["tokens_mean"]),
            "tokens_sample": relative(tokenizer.encode(images, seeded()), want["tokens_sample"]),
            "images_from_tokens": relative(to_image(tokens), want["images_from_tokens"]),
            "images_from_normed_tokens": relative(to_image(token_norm(tokens)), want["images_from_normed_tokens"]),
            "round_trip": relative(to_image(ours), want["round_trip"]),
        }
        # the tokenizers decode these images clamped to [-1, 1]; a model's canvas through its layout, normed first
        assert torch.equal(tokenizer.decode(tokens), to_image(tokens).clamp(-1.0, 1.0))
        assert torch.equal(normed.decode(tokens), to_image(token_norm(tokens)).clamp(-1.0, 1.0))
    assert ours.shape == (2, 4, 64) and mean.shape == (2, 16, 4, 4)
    return errors


@pytest.mark.kernels
@pytest.mark.parametrize("precision", list(BOUNDS))
@pytest.mark.parametrize("variant", list(VAE_REF["variants"]))
def test_the_flux_vae_and_its_tokens_match_the_official_code(variant, precision):
    errors = vae_errors(variant, precision)
    bound = BOUNDS[precision][1]
    assert max(errors.values()) <= bound, f"relative errors over {bound:.0e}: {errors}"


def test_the_published_flux_vae_has_the_official_keys_shapes_and_size():
    """FluxVAEConfig's defaults are AutoEncoderParams' (the published f8, 16-channel tokenizer): the same state
    dict keys and shapes as the official module's (83.8M parameters; built on the meta device)."""
    published = VAE_REF["published"]
    assert asdict(FluxVAEConfig()) == {**published["config"], "ch_mult": tuple(published["config"]["ch_mult"])}
    with torch.device("meta"):
        vae = FluxAutoencoder()
    assert {k: list(v.shape) for k, v in vae.state_dict().items()} == published["shapes"]
    assert sum(p.numel() for p in vae.parameters()) == published["num_params"] == 83_819_683
    assert vae.config.downsample_factor == 8 and vae.encoder.conv_out.out_channels == 2 * 16


def write_vae_dir(directory: Path, state: dict | None = None, **extra) -> Path:
    """A FLUX VAE directory in the official from_pretrained layout: config.json and checkpoint.pt."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**VAE_REF["variants"]["plain"]["config"], **extra}
    (directory / "config.json").write_text(json.dumps(config))
    torch.save(state or {k: v.float() for k, v in VAE_REF["state_dict"].items()}, directory / "checkpoint.pt")
    return directory


def test_load_flux_vae_reads_the_official_layout_strictly(tmp_path):
    vae = load_flux_vae(write_vae_dir(tmp_path / "vae", _class_name="AutoencoderKL", block_out_channels=[32]))
    assert vae.ignored_config == ("_class_name", "block_out_channels") and not vae.training
    for key, value in VAE_REF["state_dict"].items():
        assert torch.equal(vae.state_dict()[key], value.float())
    assert load_flux_vae(tmp_path / "vae", encoder_norm=True).config.encoder_norm  # overrides, as from_pretrained
    state = {k: v.float() for k, v in VAE_REF["state_dict"].items()}
    bad = {**state, "encoder.conv_in.weight": state["encoder.conv_in.weight"][:16], "loss.logvar": torch.zeros(1)}
    del bad["decoder.conv_out.bias"]
    with pytest.raises(CheckpointError) as err:
        load_flux_vae(write_vae_dir(tmp_path / "bad", bad))
    message = str(err.value)
    assert str(tmp_path / "bad" / "checkpoint.pt") in message
    for part in (
        "missing keys (1): decoder.conv_out.bias",
        "unexpected keys (1): loss.logvar",
        "encoder.conv_in.weight",
    ):
        assert part in message
    (tmp_path / "bad" / "checkpoint.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*checkpoint.pt"):
        load_flux_vae(tmp_path / "bad")
    (tmp_path / "bad" / "checkpoint.pt").unlink()
    with pytest.raises(CheckpointError, match="lacks checkpoint.pt"):
        load_flux_vae(tmp_path / "bad")


# --- a tiny NextStep in the official Hugging Face layout ---------------------------------------------------------

WORDS = ["a", "red", "blue", "green", "circle", "square", "star", "on", "white", "black", "*"] + list("0123456789")
SPECIAL = ["[PAD]", "[UNK]", "<|image_area|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image_placeholder|>"]
PROMPTS, SEEDS = ["a red circle", "a blue square on white"], [5, 6]


def write_tokenizer(directory: Path, bos: str = "") -> Path:
    """A tokenizer directory saved by transformers (offline): a word vocabulary, digits one by one (as Qwen's
    tokenizer splits "32*32"), NextStep's special tokens. ``bos``: "added" (a BOS before every encoding, as LLaMA's
    tokenizer), "unused" (a BOS token the tokenizer never adds), or "" (none, as Qwen2.5's)."""
    special = SPECIAL + (["[BOS]"] if bos else [])
    vocab = {t: i for i, t in enumerate(special + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Punctuation()]
    )
    if bos == "added":
        tok.post_processor = processors.TemplateProcessing(
            single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])]
        )
    extra = {"bos_token": "[BOS]"} if bos else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", additional_special_tokens=SPECIAL[2:], **extra
    )
    fast.save_pretrained(directory)
    return directory


def tiny_config(**changes) -> NextStepConfig:
    """2 layers of width 32 (4 heads over 2 KV heads of 8, Qwen's biases), FLUX's 16 latent channels in 2 x 2
    patches (64-wide tokens) on a 3 x 3 grid, gen_pos_embed, the official sampler."""
    arch = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=32,
        boi=3,
        eoi=4,
        image_placeholder_id=5,
        attention_bias=True,
        o_attention_bias=False,
        rope_theta=10000.0,
        max_position_embeddings=256,
        latent_size=6,
        fm_head_dim=32,
        fm_head_layers=2,
        use_gen_pos_embed=True,
    )
    return NextStepConfig(**{**arch, "grid_side": 3, **OFFICIAL_SAMPLER, **changes})


def official_config_json(config: NextStepConfig, **changes) -> dict:
    """config.json as the official NextStepConfig writes it (save_pretrained: every LlamaConfig field), with an
    ``auto_map`` of custom code (which the loader never runs)."""
    keys = (
        "hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim intermediate_size vocab_size "
        "boi eoi image_placeholder_id rms_norm_eps rope_theta attention_bias o_attention_bias mlp_bias "
        "max_position_embeddings tie_word_embeddings latent_size latent_patch_size latent_channels fm_head_dim "
        "fm_head_layers use_gen_pos_embed"
    ).split()
    data = {k: getattr(config, k) for k in keys}
    data |= dict(
        architectures=["NextStep"],
        model_type="nextstep",
        hidden_act="silu",
        initializer_range=0.02,
        attention_dropout=0.0,
        pretraining_tp=1,
        rope_scaling=None,
        use_cache=True,
        torch_dtype="float64",
        transformers_version="4.49.0",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        pad_token_id_added=None,
        vae_name_or_path="stepfun-ai/NextStep-1-f8ch16-Tokenizer",
        lm_loss_weight=0.01,
        im_loss_weight=1.0,
        fm_head_batch_mul=4,
        auto_map={"AutoConfig": "configuration_nextstep.NextStepConfig", "AutoModel": "modeling_nextstep.NextStep"},
    )
    return {**data, **changes}


def random_model(config: NextStepConfig, tokenizer, seed: int) -> NextStep:
    """A float64 model, every weight moved off its initialisation (biases and zeroed layers included)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = NextStep(config, tokenizer).double().eval()
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def write_official(directory: Path, model: NextStep, shards: int = 3, tokenizer_from: Path | None = None, **cfg):
    """``model`` as the Hub repository holds it: config.json, ``shards`` safetensors shards and their index, and
    (``tokenizer_from``) the tokenizer's files. Returns the shard paths."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(official_config_json(model.config, **cfg)))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    keys = list(state)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {k: names[i * shards // len(keys)] for i, k in enumerate(keys)}
    for name in names:
        save_file({k: state[k] for k in keys if weight_map[k] == name}, str(directory / name), {"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    if tokenizer_from is not None:
        for file in tokenizer_from.iterdir():
            (directory / file.name).write_bytes(file.read_bytes())
    return [directory / n for n in names]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A tiny official NextStep directory, the float64 model it was written from and its tokenizer's directory."""
    root = tmp_path_factory.mktemp("nextstep")
    from csd.models.nextstep.official import OfficialTokenizer

    tok_dir = write_tokenizer(root / "tokenizer")
    model = random_model(tiny_config(), OfficialTokenizer(tok_dir), seed=11)
    shards = write_official(root / "NextStep-1-Large", model, tokenizer_from=tok_dir)
    return root / "NextStep-1-Large", model, shards


def load64(directory: Path, vae_dir: Path | None = None, **kw) -> NextStep:
    return load_official_nextstep(directory, vae_dir, dtype=torch.float64, **kw)


def test_the_official_layout_loads_strictly_offline_and_makes_the_same_tokens(hub, monkeypatch):
    """Sharded safetensors, the index, config.json and the tokenizer, read with every socket refused; the
    weights equal, the config the writer's, and generation in float64 gives the writer's tokens exactly."""
    directory, model, _ = hub

    def refuse(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    loaded = load64(directory, image_size=48)  # 48 px / (8 * 2) = 3 tokens a side
    monkeypatch.undo()
    assert not loaded.training and loaded.dtype == torch.float64 and loaded.config == model.config
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert loaded.tokenizer.to_dict() == {"kind": "hub", "directory": str(directory)}
    s = sampling64(num_steps=9, cfg_scale=3.0, cfg_schedule="constant", head_steps=4)
    want = generate(model, PROMPTS, SEEDS, s).tokens
    assert torch.equal(generate(loaded, PROMPTS, SEEDS, s).tokens, want)
    assert load_official_nextstep(directory).dtype == torch.float32  # the default dtype; the config's 3 x 3 grid


def test_other_weight_files_load_the_same(hub, tmp_path):
    """model.safetensors, pytorch_model.bin (torch.load with weights_only) and a file named by ``weights=``."""
    directory, model, _ = hub
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        for sub in ("single", "bin"):
            (tmp_path / sub).mkdir(exist_ok=True)
            (tmp_path / sub / name).write_bytes((directory / name).read_bytes())
    save_file(state, str(tmp_path / "single" / "model.safetensors"))
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    torch.save(state, tmp_path / "bin" / "ema.pth")
    for loaded in (load64(tmp_path / "single"), load64(tmp_path / "bin"), load64(tmp_path / "bin", weights="ema.pth")):
        assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


def test_gen_pos_embed_and_a_tied_lm_head_may_be_absent(hub, tmp_path):
    """As the official from_pretrained makes them: the sin-cos table, and the embedding as the output head."""
    _, model, _ = hub
    state = {k: v.clone() for k, v in model.state_dict().items() if k not in ("gen_pos_embed", "lm_head.weight")}
    (tmp_path / "config.json").write_text(json.dumps(official_config_json(model.config, tie_word_embeddings=True)))
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load64(tmp_path, tokenizer=model.tokenizer)
    assert torch.equal(loaded.gen_pos_embed, model.gen_pos_embed)
    assert torch.equal(loaded.lm_head.weight, model.embed_tokens.weight)


def corrupt(directory: Path, shards: list[Path], how: str) -> str:
    """Damage a copy of the files one way; returns what the error must name."""
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    second = shards[1].name
    keys = [k for k, v in index["weight_map"].items() if v == second]
    from safetensors.torch import load_file

    tensors = load_file(str(directory / second))
    if how == "garbage":
        (directory / second).write_bytes(b"\x00" * 64)
        return str(directory / second)
    if how == "shape":
        tensors[keys[0]] = torch.zeros(3, 3, dtype=torch.float64)
        want = f"{keys[0]} in {second}: checkpoint (3, 3)"
    elif how == "missing":
        del tensors[keys[0]], index["weight_map"][keys[0]]
        want = f"missing keys (1): {keys[0]}"
    elif how == "unexpected":
        tensors["layers.9.mlp.up_proj.weight"] = torch.zeros(2)
        index["weight_map"]["layers.9.mlp.up_proj.weight"] = second
        want = f"unexpected keys (1): layers.9.mlp.up_proj.weight in {second}"
    elif how == "index":  # the index says a key is in the first shard
        index["weight_map"][keys[0]] = shards[0].name
        want = f"{keys[0]}: index {directory / shards[0].name}, found in {directory / second}"
    elif how == "absent shard":
        (directory / second).unlink()
        return str(directory / second)
    save_file(tensors, str(directory / second))
    index_path.write_text(json.dumps(index))
    return want


@pytest.mark.parametrize("how", ["garbage", "shape", "missing", "unexpected", "index", "absent shard"])
def test_a_damaged_or_mismatched_file_is_refused_by_name(hub, tmp_path, how):
    directory, model, shards = hub
    for file in directory.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    want = corrupt(tmp_path, shards, how)
    with pytest.raises(CheckpointError) as err:
        load64(tmp_path, image_size=48)
    assert want in str(err.value)


class Smuggled:
    """A class no allow-list admits."""


def test_a_pickle_with_other_objects_is_refused_without_running_it(hub, tmp_path):
    directory, model, _ = hub
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    torch.save({**model.state_dict(), "extra": Smuggled()}, tmp_path / "pytorch_model.bin", pickle_module=pickle)
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*pytorch_model.bin"):
        load64(tmp_path, tokenizer=model.tokenizer)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match="holds no weights: none of model.safetensors.index.json"):
        load64(tmp_path, tokenizer=model.tokenizer)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (dict(boi=None), "config lacks boi"),
        (dict(boi=7), "the tokenizer's <|begin_of_image|> is id 3, the config's boi is 7"),
        (dict(vocab_size=20), "the tokenizer has 27 ids, over vocab_size 20"),
    ],
)
def test_a_config_the_network_or_tokenizer_cannot_follow_is_refused(hub, tmp_path, change, message):
    directory, model, _ = hub
    for file in directory.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(official_config_json(model.config, **change)))
    with pytest.raises(CheckpointError) as err:
        load64(tmp_path)
    assert message in str(err.value) and str(tmp_path / "config.json") in str(err.value)


def test_the_recorded_official_config_maps_to_the_parity_tests_config_and_its_weights_load(tmp_path):
    """The config the reference recorded from the official NextStepConfig (tests/data/nextstep_reference.pt) maps
    to the config tests/models/test_nextstep_parity.py builds; the official state dict, written in the Hub layout,
    loads strictly (its gen_pos_embed included)."""
    recorded = NEXTSTEP_REF["float64"]["config"]
    parity = project_config(recorded)
    defaults = {k: getattr(NextStepConfig, k) for k in OFFICIAL_SAMPLER}  # the parity test's: the dataclass's
    config, ignored = config_from_official(recorded, **{**defaults, "null_prompt": parity.null_prompt})
    assert config == parity
    assert set(ignored) == {
        "attn_implementation",
        "attention_dropout",
        "fm_head_batch_mul",
        "initializer_range",
        "pad_token_id",
        "rope_scaling_is_none",
        "token_dim",
    }
    state = NEXTSTEP_REF["float64"]["state_dict"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    loaded = load64(tmp_path, tokenizer=IdTokenizer(), **{**defaults, "null_prompt": parity.null_prompt})
    assert loaded.config == parity
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


# --- prompts as the official pipeline builds them ---------------------------------------------------------------


def official_rows(directory: Path, captions: list[str], null: str, side: int, boi: int):
    """NextStepPipeline.generate_image steps 2 and 4 with cfg > 1 (tokenizer loaded as its __init__ does): the
    captions then the negative prompt per caption, padded on the left, then ``_add_prefix_ids``'s prefix
    (``<|image_area|>`` + "h*w", its first id dropped when the tokenizer has a bos_token) and the boi id."""
    tok = AutoTokenizer.from_pretrained(
        str(directory), local_files_only=True, model_max_length=512, padding_side="left", use_fast=True
    )
    if getattr(tok, "add_eos_token", False):  # the pipeline sets it False (where the tokenizer has it on)
        tok.add_eos_token = False
    out = tok(
        captions + [null] * len(captions),
        padding="longest",
        truncation=False,
        add_special_tokens=True,
        return_tensors="pt",
    )
    prefix = tok(f"<|image_area|>{side}*{side}", truncation=False, add_special_tokens=True, return_tensors="pt")
    ids, mask = prefix.input_ids, prefix.attention_mask
    if tok.bos_token is not None:
        ids, mask = ids[:, 1:], mask[:, 1:]
    ids, mask = torch.cat([ids, torch.tensor([[boi]])], 1), torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
    n = out.input_ids.shape[0]
    return torch.cat([out.input_ids, ids.expand(n, -1)], 1), torch.cat([out.attention_mask, mask.expand(n, -1)], 1)


@pytest.mark.parametrize("bos, null", [("", ""), ("", "black"), ("added", "a green star")])
def test_the_prompt_ids_are_the_official_pipelines(tmp_path, bos, null):
    directory = write_tokenizer(tmp_path / "tok", bos)
    from csd.models.nextstep.official import OfficialTokenizer, check_tokenizer

    tokenizer = OfficialTokenizer(directory)
    config = tiny_config(null_prompt=null, vocab_size=40)
    check_tokenizer(tokenizer, config, "test")
    model = NextStep(config, tokenizer)
    ids, valid = model.check_conditions(PROMPTS, 2, torch.device("cpu")).batch(guided=True)
    want_ids, want_mask = official_rows(directory, PROMPTS, null, 3, config.boi)
    assert torch.equal(valid, want_mask.bool())
    assert torch.equal(ids[valid], want_ids[want_mask.bool()])
    if bos == "added":  # each row's caption starts with the BOS; the prefix's was dropped
        assert (want_ids == tokenizer.bos_token_id).sum() == 4


@pytest.mark.parametrize(
    "bos, null, message",
    [("unused", "black", "does not start the image prefix with it"), ("added", "", r'encodes "" as \[6\]')],
)
def test_a_tokenizer_whose_official_ids_the_project_would_not_make_is_refused(hub, tmp_path, bos, null, message):
    directory, model, _ = hub
    tok_dir = write_tokenizer(tmp_path / "tok", bos)
    for file in directory.iterdir():
        if file.suffix != ".json" or file.name in ("config.json", "model.safetensors.index.json"):
            (tmp_path / file.name).write_bytes(file.read_bytes())
    with pytest.raises(CheckpointError, match=message):
        load64(tmp_path, tokenizer=tok_dir, null_prompt=null, image_size=48)


# --- the checkpoint directory -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(hub, tmp_path_factory):
    """DIR/nextstep/ as OFFICIAL_FILES lays it out: the tiny model as NextStep-1-Large, a smaller one of the same
    layout (no tokenizer files) as the draft, and the reference's tiny FLUX VAE as the tokenizer."""
    root = tmp_path_factory.mktemp("checkpoints")
    directory, model, _ = hub
    target_dir = root / "nextstep" / "NextStep-1-Large"
    target_dir.mkdir(parents=True)
    for file in directory.iterdir():
        (target_dir / file.name).write_bytes(file.read_bytes())
    small = tiny_config(hidden_size=16, num_hidden_layers=1, head_dim=4, fm_head_dim=16, fm_head_layers=1)
    write_official(root / "nextstep" / "NextStep-draft", random_model(small, model.tokenizer, seed=12), shards=1)
    write_vae_dir(root / "nextstep" / "NextStep-1-f8ch16-Tokenizer")
    return root


def test_the_family_row_finds_and_loads_a_target_and_a_users_draft(checkpoints, tmp_path):
    assert FAMILY.official_files is not None and FAMILY.load_official is from_checkpoints
    assert FAMILY.has_official(checkpoints, "nextstep_1_large") and FAMILY.has_official(checkpoints, "nextstep_draft")
    assert not FAMILY.has_official(tmp_path, "nextstep_1_large")
    target = FAMILY.load_official(checkpoints, "nextstep_1_large")
    draft = FAMILY.load_official(checkpoints, "nextstep_draft", target)
    assert target.config.grid_side == draft.config.grid_side == 32  # 512 px: the official example's
    assert draft.tokenizer is target.tokenizer and draft.config.num_hidden_layers == 1
    target.check_draft(draft)
    layout = image_tokenizer_from_checkpoints(checkpoints, target)
    assert isinstance(layout, NormedTokens) and isinstance(layout.inner, LatentTokenizer)
    assert layout.token_dim == target.token_dim == 64


def test_a_loaded_pair_runs_csd_and_its_tokens_decode_to_images(checkpoints):
    """On the 3 x 3 grid: the user's draft drafts, the target verifies (exact block), the FLUX VAE decodes."""
    base = checkpoints / "nextstep"
    target = load64(base / "NextStep-1-Large", base / "NextStep-1-f8ch16-Tokenizer", image_size=48)
    draft = from_checkpoints(checkpoints, "nextstep_draft", target).double()
    s = sampling64(num_steps=9, cfg_scale=3.0, cfg_schedule="constant", head_steps=4)
    run = speculative_generate(target, draft, PROMPTS, SEEDS, s, CSDConfig.from_knobs(gamma=2, block="exact"))
    assert run.tokens.shape == (2, 9, 64) and run.trace.block_steps
    images = image_tokenizer(target, base / "NextStep-1-f8ch16-Tokenizer").decode(run.tokens.float())
    assert images.shape == (2, 3, 48, 48) and images.abs().max() <= 1.0


def test_the_server_finds_the_official_pair_and_decodes_it_with_the_flux_vae_not_kl16(checkpoints):
    """``python app.py --checkpoints DIR``'s discovery: the NextStep pair needs no ``vae/kl16.ckpt`` (its images
    are the FLUX VAE's, among its target's official files), and its loaded pair decodes through that VAE."""
    from csd.serving.pairs import VAE_FILE, discover

    assert not (checkpoints / VAE_FILE).exists()
    sources = [s for s in discover(checkpoints) if s.name.startswith("NextStep-1-Large")]
    assert len(sources) == 1 and sources[0].is_text and sources[0].traits.family == "NextStep"
    pair = sources[0].load(torch.device("cpu"))
    assert isinstance(pair.tokenizer, NormedTokens) and isinstance(pair.tokenizer.inner, LatentTokenizer)
    assert pair.tokenizer.token_dim == pair.target.token_dim == 64
