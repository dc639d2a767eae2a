"""Target/draft model pairs: where they are on disk, loading them once, and decoding their tokens.

Every pair is a :class:`~csd.serving.catalog.PairSpec` in its family's catalog entry
(:data:`csd.serving.catalog.CATALOG`):

* embedded pairs in ``assets/models`` (the class-conditional MAR pair on pixel patches, the text pair in
  the Harmon layout, the xAR pair on cells of pixel patches): offered where both files exist;
* official pairs (MAR-H or MAR-L drafted by MAR-B, xAR-H or xAR-L drafted by xAR-B, Harmon-1.5B drafted by
  Harmon-0.5B) when a checkpoint directory holds both models' files in the official layout (each family's
  ``official.py``) and the KL-16 tokenizer ``vae/kl16.ckpt``;
* small random (untrained) pairs of each family, for tests and when nothing else is installed.

Nothing here knows a family: the registry builds and loads models, the catalog lists the pairs, and each
model's ``traits`` and ``token_layout`` say what a pair needs. Loaded models are shared read-only between
requests: eval mode, no gradients, never mutated.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from csd.core.precision import at_precision
from csd.family import FamilyTraits
from csd.models import vae
from csd.models.checkpoint import file_digest
from csd.models.registry import FAMILIES, load_model, preset, read_traits
from csd.models.tokenizer import LatentTokenizer, pixel_tokenizer, to_uint8
from csd.run_setup import check_pair
from csd.sampling import generate
from csd.serving.catalog import PairSpec, pair_specs
from csd.shapes.data import CLASS_NAMES
from csd.shapes.text import TEXT_CONFIGS, caption_tokenizer

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "assets" / "models"
VAE_FILE = "vae/kl16.ckpt"  # MAR's KL-16 tokenizer, relative to a checkpoint directory: every official pair's
# A few prompts one click away in the app, each a colour on a background the embedded text models saw
# together in training. The data draws dark shapes on light backgrounds and light ones on dark (20 000
# training captions: a red, blue or purple shape never on black, an orange one on a gray gradient never,
# a green one on a textured yellow background 4 times), so a colour and a background picked freely can
# be a pairing the models never saw. Each below occurs 59-432 times in those 20 000, on the commonest
# kinds of background (plain or textured white or black, a black gradient, a two-colour gradient).
# Chosen by that rule before the models were scored on them.
EXAMPLE_PROMPTS = (
    "a large red star on a plain white background",
    "a small green circle on a plain black background",
    "a medium purple heart on a textured white background",
    "a large yellow square on a black gradient",
    "a medium blue diamond on a white to pink gradient",
)
IMAGENET_NAMES = tuple(f"imagenet {i}" for i in range(1000))  # ids; names are not shipped


def random_spec(family: str | None = None) -> PairSpec:
    """The untrained pair of a family (by its arch; None: the table's first family)."""
    arch = family or next(iter(FAMILIES))
    spec = next((p for p in pair_specs("random") if p.family == arch), None)
    if spec is None:
        raise ValueError(f"family {arch!r} has no untrained pair (a PairSpec of kind 'random' in its catalog entry)")
    return spec


def choices(spec: PairSpec, traits: FamilyTraits) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a visitor chooses among on a pair: (class names, example prompts). An official pair's classes
    are ImageNet's and its prompts its own; the others draw the shapes, so the shapes classes or captions."""
    if traits.conditions == "prompts":
        return (), spec.prompts or EXAMPLE_PROMPTS
    return (IMAGENET_NAMES if spec.kind == "official" else CLASS_NAMES), ()


@dataclass(frozen=True)
class ModelPair:
    """A target and a draft that share a tokenizer; ``tokenizer.decode`` maps tokens to images in [-1, 1]."""

    name: str
    target: nn.Module
    draft: nn.Module
    tokenizer: object
    class_names: tuple[str, ...]  # () for a text pair: its conditions are prompts
    weights: str  # which weights (a content hash for files we ship): results record it
    prompts: tuple[str, ...] = ()  # a text pair's example prompts

    @property
    def traits(self) -> FamilyTraits:
        return self.target.traits

    @property
    def is_text(self) -> bool:
        return self.traits.conditions == "prompts"

    @property
    def num_tokens(self) -> int:
        return int(self.target.seq_len)

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def images(self, tokens: Tensor) -> Tensor:
        """Tokens (B, N, d) -> (B, H, W, 3) uint8 on the CPU (a float64 run's decoded in float32, the
        tokenizer's precision)."""
        with torch.inference_mode():
            return to_uint8(self.tokenizer.decode(tokens.to(self.device, torch.float32)))

    def at_precision(self, precision: str) -> ModelPair:
        """The pair with both models as ``precision`` needs them (:func:`csd.core.precision.at_precision`: a float64
        copy for the exact reference, the pair itself otherwise); the tokenizer is shared."""
        return replace(self, target=at_precision(self.target, precision), draft=at_precision(self.draft, precision))


def _frozen(model: nn.Module, device: torch.device) -> nn.Module:
    return model.to(device).eval().requires_grad_(False)


def image_tokenizer(model):
    """The pixel tokenizer of a shapes model: RGB patches, in the family's token layout (xAR: cells)."""
    return model.token_layout(pixel_tokenizer(model.token_dim // model.traits.tokens_per_row))


def _pair(spec: PairSpec, target: nn.Module, draft: nn.Module, tokenizer, weights: str, device) -> ModelPair:
    check_pair(target, draft)
    target, draft = _frozen(target, device), _frozen(draft, device)
    class_names, prompts = choices(spec, target.traits)
    pair = ModelPair(spec.name, target, draft, tokenizer, class_names, weights, prompts)
    if torch.device(device).type == "cpu":  # one cheap run each: the first timed request pays no lazy initialisation
        for model in (target, draft):  # (on CUDA a run belongs in a GPU call: ZeroGPU's main process runs none)
            generate(model, list(prompts[:1] or [0]), [0], model.traits.cheapest())
    return pair


def _embedded_files(directory: Path, spec: PairSpec) -> tuple[Path, Path]:
    return directory / f"{spec.target}.safetensors", directory / f"{spec.draft}.safetensors"


def load_embedded(directory: Path, spec: PairSpec, device: torch.device) -> ModelPair:
    """An embedded pair (project files) with its pixel tokenizer."""
    files = _embedded_files(directory, spec)
    target, draft = load_model(files[0]), load_model(files[1])
    return _pair(spec, target, draft, image_tokenizer(target), file_digest(*files), device)


def embedded_pair(name: str, device: torch.device | str = "cpu", directory: Path = EMBEDDED_DIR) -> ModelPair:
    """The embedded pair called ``name`` (a pair of kind "embedded" in a family's row)."""
    specs = pair_specs("embedded")
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        raise ValueError(f"embedded pair must be one of {[s.name for s in specs]}, got {name!r}")
    return load_embedded(directory, spec, torch.device(device))


def load_official(checkpoints: Path, spec: PairSpec, device: torch.device) -> ModelPair:
    """An official pair from a checkpoint directory, over its family's image tokenizer (MAR's KL-16 latents
    unless the family has its own: :attr:`csd.models.spec.Family.official_tokenizer`)."""
    family = FAMILIES[spec.family]
    target = family.load_official(checkpoints, spec.target)
    draft = family.load_official(checkpoints, spec.draft, target)  # a family may match the draft to its target
    if family.official_tokenizer is not None:
        tokenizer = family.official_tokenizer(checkpoints, target.to(device))
    else:
        tokenizer = target.token_layout(LatentTokenizer(_frozen(vae.load_kl16(checkpoints / VAE_FILE), device)))
    return _pair(spec, target, draft, tokenizer, f"official:{spec.target}+{spec.draft}", device)


def _untrained_config(spec: PairSpec, name: str):
    """A random pair's model config: a preset of its family, or a text preset over the caption vocabulary."""
    presets = FAMILIES[spec.family].presets
    return presets[name] if name in presets else TEXT_CONFIGS[name]


def _random_model(spec: PairSpec, name: str) -> nn.Module:
    family, config = FAMILIES[spec.family], _untrained_config(spec, name)
    text = family.traits(config).conditions == "prompts"
    meta = {"tokenizer": caption_tokenizer().to_dict()} if text else {}  # text models read the captions
    return family.make(config, meta)


def random_spec_pair(spec: PairSpec, device: torch.device | str = "cpu", seed: int = 0) -> ModelPair:
    """Untrained models of a random pair's presets (target wider and deeper than the draft), perturbed so
    the two differ (initialisation zeroes some output layers)."""
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator: leave the caller's alone
        torch.manual_seed(seed)
        target, draft = _random_model(spec, spec.target), _random_model(spec, spec.draft)
        with torch.no_grad():
            for p in (*target.parameters(), *draft.parameters()):
                p.add_(0.05 * torch.randn_like(p))
    weights = f"{spec.tag}:{seed}"
    return _pair(spec, target, draft, image_tokenizer(target), weights, torch.device(device))


def random_pair(device: torch.device | str = "cpu", seed: int = 0, family: str | None = None) -> ModelPair:
    """The untrained pair of a family (None: the table's first)."""
    return random_spec_pair(random_spec(family), device, seed)


@dataclass(frozen=True)
class PairSource:
    """A pair that can be loaded: its name, classes (or example prompts) and traits are known before its
    weights are read."""

    name: str
    class_names: tuple[str, ...]
    weights: str  # as ModelPair.weights
    load: Callable[[torch.device], ModelPair]
    traits: FamilyTraits
    prompts: tuple[str, ...] = ()  # a text pair's example prompts

    @property
    def is_text(self) -> bool:
        return self.traits.conditions == "prompts"


def _source(spec: PairSpec, weights: str, load, traits: FamilyTraits) -> PairSource:
    class_names, prompts = choices(spec, traits)
    return PairSource(spec.name, class_names, weights, load, traits, prompts)


def random_source(spec: PairSpec) -> PairSource:
    traits = FAMILIES[spec.family].traits(_untrained_config(spec, spec.target))
    return _source(spec, f"{spec.tag}:0", partial(random_spec_pair, spec), traits)


RANDOM_SOURCE = random_source(random_spec())  # what a server with nothing installed serves


def discover(checkpoints: Path | None, embedded_dir: Path = EMBEDDED_DIR) -> list[PairSource]:
    """Every pair whose files exist (nothing is loaded here): embedded first, then official ones."""
    found = []
    for spec in pair_specs("embedded"):
        files = _embedded_files(embedded_dir, spec)
        if all(f.is_file() for f in files):
            load = partial(load_embedded, embedded_dir, spec)
            found.append(_source(spec, file_digest(*files), load, read_traits(files[0])))
    if checkpoints is not None:
        for spec in pair_specs("official"):
            family = FAMILIES[spec.family]
            tokenizer = family.official_tokenizer is not None or (checkpoints / VAE_FILE).is_file()
            if (
                tokenizer
                and family.has_official(checkpoints, spec.target)
                and family.has_official(checkpoints, spec.draft)
            ):
                load = partial(load_official, checkpoints, spec)
                traits = family.traits(family.presets[spec.target])
                found.append(_source(spec, f"official:{spec.target}+{spec.draft}", load, traits))
    return found


# What --hub-repo fetches: the tokenizer and the official MAR pairs (draft first), in the official layout.
HUB_PRESETS = ("mar_base", "mar_large", "mar_huge")
HUB_FILES = (VAE_FILE, *(f for name in HUB_PRESETS for f in preset(name)[0].official_files[name]))
DISK_MARGIN = 1 << 30  # free bytes left over after a fetch


def fetch_official(
    repo_id: str,
    checkpoints: Path,
    log: Callable[[str], None] = print,
    free_bytes: Callable[[Path], int] | None = None,
    endpoint: str | None = None,
) -> Path:
    """Fetch official checkpoints from a Hugging Face Hub repository that mirrors the official layout
    (:data:`HUB_FILES`) into ``checkpoints``. For the operator, at start only (never a visitor):
    the repository must exist and hold the MAR-B draft and the tokenizer, files already there with
    the right size are kept, and the disk must have room for the rest (plus 1 GiB) before anything
    is downloaded. ``endpoint``: another Hub server (default: huggingface_hub's, ``HF_ENDPOINT``).
    Raises ValueError (naming the repository) or OSError (the directory, the space, the network)."""
    from huggingface_hub import HfApi, snapshot_download  # a dependency of gradio; imported only when asked
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, files_metadata=True)
    except RepositoryNotFoundError:
        raise ValueError(f"Hub repository {repo_id!r} does not exist (or is private without a token)") from None
    except HfHubHTTPError as err:
        raise ValueError(f"Hub repository {repo_id!r} could not be read: {err}") from None
    sizes = {f.rfilename: f.size or 0 for f in info.siblings or [] if f.rfilename in HUB_FILES}
    for required in HUB_FILES[:2]:
        if required not in sizes:
            raise ValueError(f"Hub repository {repo_id!r} has no {required}: it is not in the official layout")
    todo = {name: size for name, size in sizes.items() if not _has_file(checkpoints / name, size)}
    need = sum(todo.values())
    checkpoints.mkdir(parents=True, exist_ok=True)
    free = (free_bytes or (lambda path: shutil.disk_usage(path).free))(checkpoints)
    if need + DISK_MARGIN > free:
        raise OSError(
            f"{checkpoints} has {_size(free)} free; fetching {len(todo)} files from {repo_id} needs {_size(need)} "
            f"plus {_size(DISK_MARGIN)} to spare"
        )
    log(
        f"Fetching {len(todo)} of {len(sizes)} official files ({_size(need)}) from Hub repository {repo_id} "
        f"into {checkpoints} ({_size(free)} free): {', '.join(sorted(todo)) or 'all present'}"
    )
    if todo:
        snapshot_download(repo_id=repo_id, allow_patterns=sorted(todo), local_dir=checkpoints, endpoint=endpoint)
    return checkpoints


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _has_file(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


class PairStore:
    """Loads each pair on first use, once, and hands the same read-only models to every request."""

    def __init__(self, sources: list[PairSource], device: torch.device):
        if not sources:
            raise ValueError("no model pair to serve")
        self._sources = {s.name: s for s in sources}
        self.device = device
        self._loaded: dict[str, ModelPair] = {}
        # One lock per pair, held while it loads: a loaded pair is handed out while another one loads.
        self._locks = {name: threading.Lock() for name in self._sources}

    @property
    def names(self) -> list[str]:
        return list(self._sources)

    def source(self, name: str) -> PairSource:
        if name not in self._sources:
            raise ValueError(f"model pair must be one of {self.names}, got {name!r}")
        return self._sources[name]

    def loaded(self, name: str) -> ModelPair | None:
        """The pair if it has been loaded already (nothing is loaded here, and nothing waits)."""
        return self._loaded.get(name)

    def get(self, name: str) -> ModelPair:
        """The pair, loaded once however many ask (those asking for it while it loads wait for it)."""
        source = self.source(name)
        if name in self._loaded:
            return self._loaded[name]
        with self._locks[name]:
            if name not in self._loaded:
                self._loaded[name] = source.load(self.device)
            return self._loaded[name]
