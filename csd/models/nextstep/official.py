"""Loading official NextStep-1 checkpoints (Hub: stepfun-ai/NextStep-1-Large, in its Hugging Face layout) into
:class:`csd.models.nextstep.NextStep`, never over the network.

A model directory holds what ``NextStep.from_pretrained`` and the pipeline's ``AutoTokenizer.from_pretrained``
read (both with ``local_files_only=True`` in the official code):

* ``config.json``: the official ``NextStepConfig`` (a ``LlamaConfig`` plus the image fields). The fields the
  network is built from are mapped to :class:`~csd.models.nextstep.NextStepConfig` as they are (:data:`ARCH`,
  LlamaConfig's and NextStepConfig's defaults where absent; ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``intermediate_size``, ``vocab_size``, ``boi``, ``eoi`` and ``image_placeholder_id``
  must be there); ``hidden_act`` must be ``"silu"`` and ``partial_rotary_factor`` 1 (what the project
  computes); every other key changes nothing the official inference computes (``rope_scaling`` included: the
  official rotary embedding forces the default type) and is ignored, named by :func:`config_from_official`;
* the weights: ``model.safetensors``, or shards ``model-0000x-of-0000y.safetensors`` listed by
  ``model.safetensors.index.json`` (read with safetensors: no pickle at all), or ``pytorch_model.bin`` (or its
  shards and ``pytorch_model.bin.index.json``), or a ``.bin`` / ``.pth`` / ``.pt`` file named by ``weights=``,
  read with ``torch.load(weights_only=True)``. Keys are the official module tree's (``embed_tokens.weight``,
  ``layers.{i}.*``, ``norm.weight``, ``lm_head.weight``, ``gen_pos_embed``, ``image_in_projector.*``,
  ``image_out_projector.*``, ``image_head.net.*``) and match strictly: a
  :class:`~csd.models.checkpoint.CheckpointError` names the file and every missing, unexpected and misshapen
  key (and the shard each is in). Two keys may be absent, as the official ``from_pretrained`` makes them: the
  persistent buffer ``gen_pos_embed`` (a fixed sin-cos table, made again) and, under ``tie_word_embeddings``,
  ``lm_head.weight`` (the embedding's). The model is built on the meta device and filled file by file in
  ``dtype`` (float32 unless asked: ``torch.bfloat16`` holds the 14B model in 28 GB);
* the tokenizer's files (``tokenizer_config.json``, ``tokenizer.json``, ...), read with transformers'
  ``AutoTokenizer`` from the directory alone (:class:`OfficialTokenizer`). Its ids for ``<|begin_of_image|>``,
  ``<|end_of_image|>`` and ``<|image_placeholder|>``, where it has them, must be the config's.

The image grid is an argument, as the pipeline's ``hw``: ``image_size`` pixels a side make ``image_size / (f p)``
tokens a side (f: the VAE's downsampling, 8 for the FLUX VAE, read from ``vae_dir``'s config.json where given; p:
``latent_patch_size``); without it, the config's ``latent_size / latent_patch_size``. The sampler's settings
default to the official text-to-image example's (:data:`OFFICIAL_SAMPLER`: cfg 7.5, 50 flow steps,
timesteps_shift 1, ``use_norm``, the ``<|image_area|>{h}*{w}`` prefix, the pipeline's empty negative prompt as
the null prompt) and take keyword overrides.

Prompts read as the official pipeline builds them (:meth:`csd.models.nextstep.NextStepFamily.prompt_ids`: the
caption with the tokenizer's special tokens, the image prefix with its leading BOS dropped, the begin-of-image
id; rows left-padded). Two cases where that would differ from the official ids are refused by name: a tokenizer
with a BOS token that does not start its encoding of the prefix (the official code drops the prefix's first id
whenever ``bos_token`` is set), and an empty null prompt with a tokenizer that encodes "" as some ids (the
official null row holds them, the project's none).

In a checkpoint directory (``python app.py --checkpoints DIR``; :data:`OFFICIAL_FILES`, :func:`from_checkpoints`)::

    DIR/nextstep/NextStep-1-Large/            every file of the Hub repository stepfun-ai/NextStep-1-Large:
        config.json  model.safetensors.index.json  model-0000x-of-0000y.safetensors
        tokenizer_config.json  tokenizer.json  (and the other tokenizer files it has)
    DIR/nextstep/NextStep-1-f8ch16-Tokenizer/ the Hub repository stepfun-ai/NextStep-1-f8ch16-Tokenizer:
        config.json  checkpoint.pt              (the FLUX VAE, csd.models.flux_vae)
    DIR/nextstep/NextStep-draft/              a draft you provide (none is published): config.json and weights in
                                              the same layout, e.g. a smaller model of NextStep-1's layout trained
                                              or distilled on its tokens; it must share the target's token layout
                                              (latent_channels, latent_patch_size) and tokenizer ids, and reads
                                              prompts with the target's tokenizer (its own tokenizer files, if
                                              any, are not read when it is loaded for a target)

The target samples 512 x 512 images (:data:`IMAGE_SIZE`: a 32 x 32 token grid), as the official example; a
draft loaded for a target takes the target's grid and sampler settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor

from csd.models.checkpoint import CheckpointError, safe_torch_load
from csd.models.flux_vae import CONFIG_FILE, FluxVAEConfig, flux_tokenizer, load_flux_vae, read_flux_config
from csd.models.harmon.prompt_batch import HubTokenizer
from csd.models.nextstep.network import NextStep, NextStepConfig, sincos_table

IMAGE_SIZE = 512  # the official example's hw: what from_checkpoints loads a target for
VAE_DIR = "NextStep-1-f8ch16-Tokenizer"
MODEL_DIRS = {"nextstep_1_large": "NextStep-1-Large", "nextstep_draft": "NextStep-draft"}
TOKENIZER_FILE = "tokenizer_config.json"
# Relative to a checkpoint directory: what must be there for from_checkpoints (the weights are found by name).
OFFICIAL_FILES = {
    "nextstep_1_large": (
        "nextstep/NextStep-1-Large/config.json",
        f"nextstep/NextStep-1-Large/{TOKENIZER_FILE}",
        f"nextstep/{VAE_DIR}/config.json",
        f"nextstep/{VAE_DIR}/checkpoint.pt",
    ),
    "nextstep_draft": ("nextstep/NextStep-draft/config.json",),
}

# NextStepConfig field -> its default where config.json lacks it (LlamaConfig's and the official NextStepConfig's);
# REQUIRED: no default taken (LlamaConfig's would describe another model).
REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "boi",
    "eoi",
    "image_placeholder_id",
)
ARCH: dict[str, object] = {
    **dict.fromkeys(REQUIRED),
    "num_key_value_heads": None,  # LlamaConfig: num_attention_heads
    "head_dim": None,  # LlamaConfig: hidden_size // num_attention_heads
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "o_attention_bias": None,  # NextStepConfig: attention_bias
    "mlp_bias": False,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "latent_size": 32,
    "latent_patch_size": 2,
    "latent_channels": 16,
    "fm_head_dim": 1536,
    "fm_head_layers": 12,
    "use_gen_pos_embed": False,
}
CHECKED = {"hidden_act": "silu", "partial_rotary_factor": 1.0}  # read by the official code: must be these
# The official text-to-image example (example.py): the sampler's settings, and the prefix the pipeline writes
# before the begin-of-image id (DEFAULT_IMAGE_AREA_TOKEN + hw2str(h, w) of the token grid).
OFFICIAL_SAMPLER = dict(
    num_sampling_steps=50,
    timesteps_shift=1.0,
    last_step_size=0.04,
    use_norm=True,
    cfg=7.5,
    image_prefix="<|image_area|>{h}*{w}",
    null_prompt="",
)
SAMPLER = (*OFFICIAL_SAMPLER, "label_drop_prob")  # the NextStepConfig fields a caller may set
SPECIAL_IDS = {"boi": "<|begin_of_image|>", "eoi": "<|end_of_image|>", "image_placeholder_id": "<|image_placeholder|>"}
FLUX_FACTOR = FluxVAEConfig().downsample_factor  # 8: the published VAE's, when no vae_dir says otherwise

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLES = ("model.safetensors", "pytorch_model.bin")


# --- config ----------------------------------------------------------------------------------------------


def config_from_official(
    data: Mapping,
    image_size: int | None = None,
    grid_side: int | None = None,
    vae_factor: int = FLUX_FACTOR,
    **settings,
) -> tuple[NextStepConfig, tuple[str, ...]]:
    """The project's config of an official ``config.json`` (a dict) and the keys it ignores. The token grid:
    ``grid_side``, or ``image_size / (vae_factor * latent_patch_size)``, or the config's ``latent_size /
    latent_patch_size``; ``settings``: the sampler's (:data:`SAMPLER`), over :data:`OFFICIAL_SAMPLER`."""
    absent = [k for k in REQUIRED if data.get(k) is None]
    if absent:
        raise CheckpointError(f"config lacks {', '.join(absent)}")
    for key, want in CHECKED.items():
        if data.get(key) not in (None, want):
            raise CheckpointError(f"config has {key}={data[key]!r}; the NextStep network computes {key}={want!r}")
    unknown = sorted(set(settings) - set(SAMPLER))
    if unknown:
        raise ValueError(f"unknown sampler settings {unknown}: choose from {list(SAMPLER)}")
    arch = {k: data[k] if data.get(k) is not None else default for k, default in ARCH.items()}
    if arch["num_key_value_heads"] is None:
        arch["num_key_value_heads"] = arch["num_attention_heads"]
    if image_size is not None and grid_side is not None:
        raise ValueError("give image_size or grid_side, not both")
    down = vae_factor * arch["latent_patch_size"]
    if grid_side is None and image_size is not None:
        if image_size % down:
            raise ValueError(f"image_size {image_size} is not a multiple of {down} (VAE {vae_factor} x patch)")
        grid_side = image_size // down
    if grid_side is None:
        grid_side = arch["latent_size"] // arch["latent_patch_size"]
    try:
        config = NextStepConfig(**arch, grid_side=grid_side, **{**OFFICIAL_SAMPLER, **settings})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"config does not describe a NextStep model: {exc}") from exc
    return config, tuple(sorted(set(data) - set(ARCH) - set(CHECKED)))


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir} has no config.json (the official NextStep layout, see {__name__})")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    return data


# --- the tokenizer ----------------------------------------------------------------------------------------


class OfficialTokenizer(HubTokenizer):
    """The official pipeline's tokenizer: transformers' ``AutoTokenizer`` of a directory, local files only (no
    custom code), fast, padding on the left, no end-of-sequence id appended (the pipeline's ``add_eos_token =
    False``, applied where the tokenizer has it on); it pads with its padding id (its end-of-text id where it has
    none) and names its BOS id where it has a BOS token (:meth:`csd.models.nextstep.NextStepFamily.prompt_ids`
    drops it from the image prefix). Written to project files as a ``"hub"`` tokenizer of the same directory."""

    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer, PretrainedConfig

        self.directory = str(directory)
        # config: an empty one, so the model's config.json (its model_type unknown to transformers, perhaps an
        # auto_map of custom code) is not read; no custom code runs
        self.inner = AutoTokenizer.from_pretrained(
            self.directory,
            local_files_only=True,
            padding_side="left",
            use_fast=True,
            trust_remote_code=False,
            config=PretrainedConfig(),
        )
        if getattr(self.inner, "add_eos_token", False):
            self.inner.add_eos_token = False
        pad = self.inner.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.inner.eos_token_id or 0)
        self.bos_token_id = self.inner.bos_token_id if self.inner.bos_token is not None else None


def read_tokenizer(directory: Path) -> OfficialTokenizer:
    if not (directory / TOKENIZER_FILE).is_file():
        raise CheckpointError(
            f"{directory} has no {TOKENIZER_FILE}: the tokenizer's files of the Hub repository are needed there"
        )
    try:
        return OfficialTokenizer(directory)
    except Exception as exc:  # transformers' errors for missing or broken files
        raise CheckpointError(f"cannot read the tokenizer in {directory}: {type(exc).__name__}: {exc}") from exc


def check_tokenizer(tokenizer, config: NextStepConfig, source: str) -> None:
    """The tokenizer fits the config (its ids in the vocabulary, its special image ids the config's) and the
    project builds the official prompt ids with it (see the module doc)."""
    if len(tokenizer) > config.vocab_size:
        raise CheckpointError(f"{source}: the tokenizer has {len(tokenizer)} ids, over vocab_size {config.vocab_size}")
    inner = getattr(tokenizer, "inner", None)
    vocab = inner.get_vocab() if inner is not None else {}
    for key, token in SPECIAL_IDS.items():
        if token in vocab and vocab[token] != getattr(config, key):
            raise CheckpointError(
                f"{source}: the tokenizer's {token} is id {vocab[token]}, the config's {key} is {getattr(config, key)}"
            )
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and config.image_prefix:
        prefix = list(tokenizer.encode(config.image_prefix.format(h=config.grid_side, w=config.grid_side)))
        if prefix[:1] != [bos]:
            raise CheckpointError(
                f"{source}: the tokenizer has a BOS token (id {bos}) but does not start the image prefix with it; "
                "the official pipeline then drops the prefix's first id, which csd's prompt_ids keeps"
            )
    if not config.null_prompt and list(tokenizer.encode("")):
        raise CheckpointError(
            f'{source}: the tokenizer encodes "" as {list(tokenizer.encode(""))}, which the official null row holds '
            "and csd's prompt_ids leaves out for an empty null prompt: give a null_prompt"
        )


# --- the weights -----------------------------------------------------------------------------------------


class WeightFiles:
    """Where a model directory's weights are: ``files`` and each key's file, shapes read from headers
    (safetensors) or from the loaded tensors (torch pickles, kept until copied)."""

    def __init__(self, model_dir: Path, weights: str | Path | None = None):
        self.source, self.files = self._find(Path(model_dir), weights)
        self.where: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._loaded: dict[Path, dict[str, Tensor]] = {}
        for file in self.files:
            for key, shape in self._header(file).items():
                if key in self.where:
                    raise CheckpointError(f"{key} is in both {self.where[key]} and {file}")
                self.where[key], self.shapes[key] = file, shape
        if self.source.name.endswith(".index.json"):
            self._check_index()

    def _find(self, model_dir: Path, weights) -> tuple[Path, list[Path]]:
        if weights is not None:
            path = Path(weights) if Path(weights).is_absolute() else model_dir / weights
            if not path.is_file():
                raise CheckpointError(f"weights file not found: {path}")
            return path, (self._shards(path) if path.name.endswith(".index.json") else [path])
        for name in INDEXES:
            if (model_dir / name).is_file():
                return model_dir / name, self._shards(model_dir / name)
        for name in SINGLES:
            if (model_dir / name).is_file():
                return model_dir / name, [model_dir / name]
        raise CheckpointError(f"{model_dir} holds no weights: none of {', '.join(INDEXES + SINGLES)}")

    def _shards(self, index: Path) -> list[Path]:
        try:
            self.index = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read the weight map of {index}: {type(exc).__name__}: {exc}") from exc
        files = [index.parent / name for name in dict.fromkeys(self.index.values())]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are not there: {', '.join(missing)}")
        return files

    def _check_index(self) -> None:
        listed = {k: self.source.parent / v for k, v in self.index.items()}
        wrong = sorted(k for k in set(listed) | set(self.where) if listed.get(k) != self.where.get(k))
        if wrong:
            said = [f"{k}: index {listed.get(k, 'none')}, found in {self.where.get(k, 'no shard')}" for k in wrong]
            raise CheckpointError(f"{self.source} does not match its shards ({len(wrong)}): {'; '.join(said[:6])}")

    @staticmethod
    def _is_safetensors(file: Path) -> bool:
        return file.suffix == ".safetensors"

    def _header(self, file: Path) -> dict[str, tuple[int, ...]]:
        if self._is_safetensors(file):
            from safetensors import safe_open

            try:
                with safe_open(str(file), framework="pt") as f:
                    return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            except Exception as exc:
                raise CheckpointError(f"cannot read safetensors file {file}: {type(exc).__name__}: {exc}") from exc
        state = safe_torch_load(file)
        bad = sorted(str(k) for k, v in state.items() if not isinstance(v, Tensor))
        if bad:
            raise CheckpointError(f"checkpoint {file} is not a flat state dict: non-tensor entries {bad[:12]}")
        self._loaded[file] = state
        return {k: tuple(v.shape) for k, v in state.items()}

    def tensors(self, file: Path) -> dict[str, Tensor]:
        if file in self._loaded:
            return self._loaded.pop(file)
        from safetensors.torch import load_file

        try:
            return load_file(str(file))
        except Exception as exc:
            raise CheckpointError(f"cannot read safetensors file {file}: {type(exc).__name__}: {exc}") from exc


def _fills(config: NextStepConfig) -> dict[str, object]:
    """The keys a file may lack, as the official from_pretrained makes them: key -> the value or the key copied."""
    fills: dict[str, object] = {"gen_pos_embed": lambda: sincos_table(config.hidden_size, config.gen_pos_grid)}
    if config.tie_word_embeddings:
        fills["lm_head.weight"] = "embed_tokens.weight"
    return fills


def check_weights(model: NextStep, files: WeightFiles) -> None:
    """Every key of the model in the files (or one they may lack) with its shape, and no other key."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    fills = _fills(model.config)
    missing = sorted(set(own) - set(files.shapes) - set(fills))
    unexpected = sorted(set(files.shapes) - set(own))
    shapes = [
        f"{k} in {files.where[k].name}: checkpoint {files.shapes[k]} vs model {own[k]}"
        for k in sorted(set(own) & set(files.shapes))
        if files.shapes[k] != own[k]
    ]
    if missing or unexpected or shapes:
        show = lambda names: ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
        parts = [f"checkpoint {files.source} does not match NextStep:"]
        if missing:
            parts.append(f"missing keys ({len(missing)}): {show(missing)}")
        if unexpected:
            named = [f"{k} in {files.where[k].name}" for k in unexpected]
            parts.append(f"unexpected keys ({len(unexpected)}): {show(named)}")
        if shapes:
            parts.append(f"shape mismatches ({len(shapes)}): {show(shapes)}")
        raise CheckpointError("\n  ".join(parts))


# --- loading ---------------------------------------------------------------------------------------------


def load_official_nextstep(
    model_dir: str | Path,
    vae_dir: str | Path | None = None,
    *,
    image_size: int | None = None,
    grid_side: int | None = None,
    tokenizer=None,
    weights: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    **settings,
) -> NextStep:
    """The official NextStep in ``model_dir`` (see the module doc), loaded strictly; eval mode, CPU, ``dtype``.

    vae_dir: the FLUX VAE's directory, whose ``config.json`` gives the grid's downsampling and must have the
    model's latent channels (its weights are read by :func:`image_tokenizer`). image_size / grid_side: the
    token grid. tokenizer: a directory, or a tokenizer object (a draft reads prompts with its target's); None:
    ``model_dir``'s files. weights: a file (or an index) relative to ``model_dir`` or absolute, instead of the
    names searched. settings: the sampler's (:data:`SAMPLER`)."""
    model_dir = Path(model_dir)
    source = str(model_dir / "config.json")
    factor = FLUX_FACTOR
    if vae_dir is not None:
        vae_config, _ = read_flux_config(Path(vae_dir) / CONFIG_FILE)
        factor = vae_config.downsample_factor
    try:
        config, _ = config_from_official(read_config(model_dir), image_size, grid_side, factor, **settings)
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc
    if vae_dir is not None and vae_config.z_channels != config.latent_channels:
        raise CheckpointError(
            f"{source}: latent_channels {config.latent_channels} is not the VAE's z_channels {vae_config.z_channels}"
        )
    if tokenizer is None or isinstance(tokenizer, str | Path):
        tokenizer = read_tokenizer(Path(tokenizer) if tokenizer is not None else model_dir)
    check_tokenizer(tokenizer, config, source)
    files = WeightFiles(model_dir, weights)
    with torch.device("meta"):
        model = NextStep(config, tokenizer)
    check_weights(model, files)
    model = model.to(dtype).to_empty(device="cpu")
    own = model.state_dict()  # views of the model's tensors
    written: set[str] = set()
    with torch.no_grad():
        for file in files.files:
            for key, value in files.tensors(file).items():
                own[key].copy_(value)
                written.add(key)
        for key, fill in _fills(config).items():
            if key not in written:
                own[key].copy_(own[fill] if isinstance(fill, str) else fill())
                written.add(key)
    assert written == set(own), sorted(set(own) - written)
    return model.eval()


def image_tokenizer(model: NextStep, vae_dir: str | Path):
    """The tokenizer of ``model``'s canvas over the FLUX VAE in ``vae_dir``: its raster tokens (the VAE's latents
    shifted, scaled and patchified, :func:`csd.models.flux_vae.flux_tokenizer`) in the model's layout
    (``use_norm``: each token layer-normed before decoding)."""
    vae = load_flux_vae(vae_dir)
    if vae.config.z_channels != model.config.latent_channels:
        raise CheckpointError(
            f"{vae_dir}: z_channels {vae.config.z_channels} is not the model's latent_channels "
            f"{model.config.latent_channels}"
        )
    return model.token_layout(flux_tokenizer(vae, model.config.latent_patch_size))


def from_checkpoints(checkpoints: Path, name: str, target: NextStep | None = None) -> NextStep:
    """The model ``name`` (a key of :data:`OFFICIAL_FILES`) from a checkpoint directory: a target at
    :data:`IMAGE_SIZE` with the official sampler; a draft loaded for ``target`` on its grid, with its sampler
    settings and its tokenizer (:meth:`NextStep.check_draft` needs them equal)."""
    base = Path(checkpoints) / "nextstep"
    model_dir, vae_dir = base / MODEL_DIRS[name], base / VAE_DIR
    vae = vae_dir if (vae_dir / CONFIG_FILE).is_file() else None
    if target is None:
        return load_official_nextstep(model_dir, vae, image_size=IMAGE_SIZE)
    c = target.config
    settings = {f.name: getattr(c, f.name) for f in fields(c) if f.name in SAMPLER}
    return load_official_nextstep(model_dir, vae, grid_side=c.grid_side, tokenizer=target.tokenizer, **settings)


def image_tokenizer_from_checkpoints(checkpoints: Path, target: NextStep):
    """The tokenizer of an official pair's images: :func:`image_tokenizer` over ``DIR/nextstep/`` :data:`VAE_DIR`."""
    return image_tokenizer(target, Path(checkpoints) / "nextstep" / VAE_DIR)
