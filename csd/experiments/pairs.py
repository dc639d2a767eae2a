"""Target/draft model pairs: where they are on disk, loading them once, and decoding their tokens.

Pairs the app and the analysis can run:

* the embedded pair, ``assets/models/shapes_{target,draft}.safetensors`` (pixel tokens);
* the embedded text pair, ``assets/models/shapes_text_{target,draft}.safetensors`` (the Harmon layout:
  prompts over the caption vocabulary);
* official MAR pairs (MAR-H or MAR-L target, MAR-B draft, KL-16 tokenizer) when a checkpoint
  directory with the official layout is given: ``<dir>/mar/mar_base/checkpoint-last.pth``,
  ``<dir>/vae/kl16.ckpt``;
* official Harmon pairs (Harmon-1.5B target, Harmon-0.5B draft) when ``<dir>/harmon/`` holds both
  checkpoints and both Qwen2.5 directories (:mod:`csd.models.harmon_official`) and ``<dir>/vae/kl16.ckpt``;
* the embedded xAR pair, ``assets/models/shapes_xar_{target,draft}.safetensors`` (cells of pixel patches);
* small random (untrained) pixel pairs, class- and text-conditioned and xAR, for tests and when nothing else is
  installed.

Loaded models are shared read-only between requests: eval mode, no gradients, never mutated.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from csd.family import fixed_num_steps
from csd.models.mar import MAR, MARConfig
from csd.models.tokenizer import CellTokenizer, LatentTokenizer, PixelTokenizer, to_uint8
from csd.models.xar import XAR_CONFIGS
from csd.sampling import SamplingConfig, generate
from csd.shapes.data import CLASS_NAMES

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "assets" / "models"
EMBEDDED_NAME = "shapes (embedded)"
TEXT_NAME = "shapes, text prompts (embedded, Harmon layout)"
XAR_NAME = "shapes, next-cell flow (embedded xAR)"
RANDOM_XAR_NAME = "random xAR (untrained)"
RANDOM_NAME = "random (untrained)"
RANDOM_TEXT_NAME = "random text (untrained)"
HARMON_NAME = "Harmon-1.5B / Harmon-0.5B (text)"
# A few prompts one click away in the app: captions the embedded text models were trained on.
EXAMPLE_PROMPTS = (
    "a large red star on a plain white background",
    "a small blue circle on a black to white gradient",
    "a medium green heart on a textured yellow background",
    "a large purple stripes pattern on a plain black background",
    "a large orange triangle on a gray gradient",
)
HARMON_PROMPTS = ("a red fox in the snow", "a lighthouse at dusk, oil painting", "a bowl of ramen, top view")
# Official targets paired with MAR-B as the draft, as in the paper.
OFFICIAL_TARGETS = {"MAR-H / MAR-B (ImageNet)": "mar_huge", "MAR-L / MAR-B (ImageNet)": "mar_large"}
# Official xAR targets (DIR/xar/xAR-{B,L,H}.pth, Hub OliverRen/xAR) with xAR-B as the draft.
XAR_FILES = {"xar_base": "xAR-B.pth", "xar_large": "xAR-L.pth", "xar_huge": "xAR-H.pth"}
OFFICIAL_XAR_TARGETS = {"xAR-H / xAR-B (ImageNet)": "xar_huge", "xAR-L / xAR-B (ImageNet)": "xar_large"}
IMAGENET_NAMES = tuple(f"imagenet {i}" for i in range(1000))  # ids; names are not shipped


@dataclass(frozen=True)
class ModelPair:
    """A target and a draft that share a tokenizer; ``tokenizer.decode`` maps tokens to images in [-1, 1]."""

    name: str
    target: nn.Module
    draft: nn.Module
    tokenizer: PixelTokenizer | LatentTokenizer
    class_names: tuple[str, ...]  # () for a text pair: its conditions are prompts
    weights: str  # which weights (a content hash for files we ship): results record it
    prompts: tuple[str, ...] = ()  # a text pair's example prompts

    @property
    def is_text(self) -> bool:
        return bool(self.prompts)

    @property
    def num_tokens(self) -> int:
        return int(self.target.seq_len)

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def images(self, tokens: Tensor) -> Tensor:
        """Tokens (B, N, d) -> (B, H, W, 3) uint8 on the CPU."""
        with torch.inference_mode():
            return to_uint8(self.tokenizer.decode(tokens.to(self.device)))


def _frozen(model: nn.Module, device: torch.device) -> nn.Module:
    return model.to(device).eval().requires_grad_(False)


def cheap_config(model) -> SamplingConfig:
    """The cheapest sampler setting a model takes (xAR makes every cell, in at least two flow steps)."""
    from csd.models.xar import XAR

    if isinstance(model, XAR):
        return SamplingConfig(num_steps=model.seq_len, head_steps=2, cfg_schedule="linear")
    return SamplingConfig(num_steps=1, head_steps=1)


def _warm_up(target: nn.Module, draft: nn.Module, conditions) -> None:
    """One cheap generation per model, so the first timed request does not pay for lazy initialisation."""
    for model in (target, draft):
        generate(model, list(conditions), [0], cheap_config(model))


def pixel_tokenizer(token_dim: int) -> PixelTokenizer:
    """Pixel tokens are 3 x p x p RGB patches."""
    patch = math.isqrt(token_dim // 3)
    if 3 * patch * patch != token_dim:
        raise ValueError(f"token width {token_dim} is not an RGB pixel patch (3 p^2)")
    return PixelTokenizer(patch_size=patch)


def file_digest(*paths: Path) -> str:
    """A short content hash of weight files."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()[:16]


def _embedded_files(directory: Path) -> tuple[Path, Path]:
    return directory / "shapes_target.safetensors", directory / "shapes_draft.safetensors"


def _pair(
    name: str, target: nn.Module, draft: nn.Module, tokenizer, class_names, weights: str, device, prompts=()
) -> ModelPair:
    pair = ModelPair(
        name, _frozen(target, device), _frozen(draft, device), tokenizer, tuple(class_names), weights, tuple(prompts)
    )
    _warm_up(pair.target, pair.draft, pair.prompts[:1] or [0])
    return pair


def load_embedded(directory: Path, device: torch.device) -> ModelPair:
    from csd.models.registry import load_model  # the project's safetensors + JSON format

    files = _embedded_files(directory)
    target, draft = load_model(files[0]), load_model(files[1])
    tokenizer = pixel_tokenizer(target.token_dim)
    return _pair(EMBEDDED_NAME, target, draft, tokenizer, CLASS_NAMES, file_digest(*files), device)


def _text_files(directory: Path) -> tuple[Path, Path]:
    return directory / "shapes_text_target.safetensors", directory / "shapes_text_draft.safetensors"


def check_text_pair(target, draft) -> None:
    """A text pair's models must read prompts alike: the same tokenizer, template and null prompt."""
    if target.tokenizer.to_dict() != draft.tokenizer.to_dict():
        raise ValueError("the text target and draft use different tokenizers")
    for key in ("template", "prefix", "null_prompt"):
        if getattr(target.config, key) != getattr(draft.config, key):
            raise ValueError(f"the text target and draft differ in their prompt {key}")


def load_text_embedded(directory: Path, device: torch.device) -> ModelPair:
    from csd.models.registry import load_model

    files = _text_files(directory)
    target, draft = load_model(files[0]), load_model(files[1])
    check_text_pair(target, draft)
    tokenizer = pixel_tokenizer(target.token_dim)
    return _pair(TEXT_NAME, target, draft, tokenizer, (), file_digest(*files), device, EXAMPLE_PROMPTS)


def harmon_files(checkpoints: Path) -> list[Path]:
    from csd.models.harmon_official import CHECKPOINTS, LLM_DIRS

    h = checkpoints / "harmon"
    return [h / CHECKPOINTS[c] for c in CHECKPOINTS] + [h / LLM_DIRS[c] / "config.json" for c in LLM_DIRS]


def load_harmon(checkpoints: Path, device: torch.device) -> ModelPair:
    from csd.models.harmon_official import CHECKPOINTS, LLM_DIRS, load_official_harmon
    from csd.models.vae import load_kl16

    h = checkpoints / "harmon"
    load = lambda c: load_official_harmon(h / CHECKPOINTS[c], h / LLM_DIRS[c], c)
    target, draft = load("harmon_1.5b"), load("harmon_0.5b")
    check_text_pair(target, draft)
    tokenizer = LatentTokenizer(_frozen(load_kl16(checkpoints / "vae" / "kl16.ckpt"), device))
    return _pair(HARMON_NAME, target, draft, tokenizer, (), "official:harmon_1.5b+harmon_0.5b", device, HARMON_PROMPTS)


def load_official_xar_pair(checkpoints: Path, target_config: str, name: str, device: torch.device) -> ModelPair:
    """An official xAR target with xAR-B as its draft over the KL-16 latents (a 16 x 16 grid in 4 cells).
    The draft samples with the target's flow steps: the aligned test needs one time grid."""
    from csd.models.vae import load_kl16
    from csd.models.xar import load_official_xar, xar_config

    target = load_official_xar(checkpoints / "xar" / XAR_FILES[target_config], target_config)
    draft_config = xar_config("xar_base", flow_steps=target.config.flow_steps)
    draft = load_official_xar(checkpoints / "xar" / XAR_FILES["xar_base"], draft_config)
    c = target.config
    tokenizer = CellTokenizer(
        LatentTokenizer(_frozen(load_kl16(checkpoints / "vae" / "kl16.ckpt"), device)), c.grid, c.cells
    )
    return _pair(name, target, draft, tokenizer, IMAGENET_NAMES, f"official:{target_config}+xar_base", device)


def _xar_files(directory: Path) -> tuple[Path, Path]:
    return directory / "shapes_xar_target.safetensors", directory / "shapes_xar_draft.safetensors"


def cell_pixel_tokenizer(model) -> CellTokenizer:
    c = model.config
    return CellTokenizer(pixel_tokenizer(c.token_dim), c.grid, c.cells)


def image_tokenizer(model) -> PixelTokenizer | CellTokenizer:
    """The pixel tokenizer of a shapes model: RGB patches, grouped into cells for xAR."""
    return cell_pixel_tokenizer(model) if fixed_num_steps(model) is not None else pixel_tokenizer(model.token_dim)


def load_xar_embedded(directory: Path, device: torch.device) -> ModelPair:
    from csd.models.registry import load_model

    files = _xar_files(directory)
    target, draft = load_model(files[0]), load_model(files[1])
    return _pair(XAR_NAME, target, draft, cell_pixel_tokenizer(target), CLASS_NAMES, file_digest(*files), device)


def random_xar_pair(device: torch.device | str = "cpu", seed: int = 0) -> ModelPair:
    """Untrained xAR models on the embedded layout (16 cells of 2 x 2 pixel patches), small."""
    from csd.models.xar import XAR, xar_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = XAR(xar_config("shapes_xar_draft", embed_dim=64, num_heads=2, encoder_depth=1, decoder_depth=1))
        draft = XAR(xar_config("shapes_xar_draft", embed_dim=32, num_heads=1, encoder_depth=1, decoder_depth=1))
        with torch.no_grad():
            for p in (*target.parameters(), *draft.parameters()):
                p.add_(0.05 * torch.randn_like(p))
    tokenizer = cell_pixel_tokenizer(target)
    return _pair(RANDOM_XAR_NAME, target, draft, tokenizer, CLASS_NAMES, f"random-xar:{seed}", torch.device(device))


def load_official(checkpoints: Path, target_config: str, name: str, device: torch.device) -> ModelPair:
    from csd.models.official import load_official_mar
    from csd.models.vae import load_kl16

    target = load_official_mar(checkpoints / "mar" / target_config / "checkpoint-last.pth")
    draft = load_official_mar(checkpoints / "mar" / "mar_base" / "checkpoint-last.pth")
    tokenizer = LatentTokenizer(_frozen(load_kl16(checkpoints / "vae" / "kl16.ckpt"), device))
    return _pair(name, target, draft, tokenizer, IMAGENET_NAMES, _official_weights(target_config), device)


def random_pixel_config(width: int, depth: int) -> MARConfig:
    """A tiny pixel MAR in the embedded layout: 32x32 RGB, 4x4 patches (N = 64, d = 48), 10 classes."""
    return MARConfig(
        img_size=32,
        vae_stride=1,
        patch_size=4,
        token_channels=3,
        encoder_embed_dim=width,
        encoder_depth=depth,
        encoder_num_heads=2,
        decoder_embed_dim=width,
        decoder_depth=depth,
        decoder_num_heads=2,
        class_num=len(CLASS_NAMES),
        buffer_size=4,
        diffloss_d=1,
        diffloss_w=width,
        num_sampling_steps=10,
        clip_x0=1.0,
    )


def random_pair(device: torch.device | str = "cpu", seed: int = 0) -> ModelPair:
    """Untrained pixel models (target wider and deeper than the draft): fast, for tests and fallback."""
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator: leave the caller's alone
        torch.manual_seed(seed)
        target, draft = MAR(random_pixel_config(64, 2)), MAR(random_pixel_config(32, 1))
        with torch.no_grad():  # MAR zero-initialises the head's output layer: perturb so the two models differ
            for p in (*target.parameters(), *draft.parameters()):
                p.add_(0.05 * torch.randn_like(p))
    tokenizer = pixel_tokenizer(target.token_dim)
    return _pair(RANDOM_NAME, target, draft, tokenizer, CLASS_NAMES, f"random:{seed}", torch.device(device))


def random_text_pair(device: torch.device | str = "cpu", seed: int = 0) -> ModelPair:
    """Untrained text-conditioned pixel models in the Harmon layout, over the caption vocabulary."""
    from csd.models.harmon import Harmon, HarmonConfig, qwen2
    from csd.shapes.text import caption_tokenizer

    tok = caption_tokenizer()
    text = dict(template="{input}", prefix="{prompt}", null_prompt="")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = Harmon(HarmonConfig(random_pixel_config(64, 2), qwen2(32, 1, 2, 1, 64, len(tok)), **text), tok)
        draft = Harmon(HarmonConfig(random_pixel_config(32, 1), qwen2(32, 1, 2, 1, 64, len(tok)), **text), tok)
        with torch.no_grad():
            for p in (*target.parameters(), *draft.parameters()):
                p.add_(0.05 * torch.randn_like(p))
    tokenizer = pixel_tokenizer(target.token_dim)
    return _pair(
        RANDOM_TEXT_NAME, target, draft, tokenizer, (), f"random-text:{seed}", torch.device(device), EXAMPLE_PROMPTS
    )


@dataclass(frozen=True)
class PairSource:
    """A pair that can be loaded: its name, classes (or example prompts) are known before its weights are read."""

    name: str
    class_names: tuple[str, ...]
    weights: str  # as ModelPair.weights
    load: Callable[[torch.device], ModelPair]
    prompts: tuple[str, ...] = ()  # a text pair's example prompts
    cells: int | None = None  # an xAR pair: its AR steps are fixed, one per cell

    @property
    def is_text(self) -> bool:
        return bool(self.prompts)


RANDOM_SOURCE = PairSource(RANDOM_NAME, CLASS_NAMES, "random:0", random_pair)
RANDOM_TEXT_SOURCE = PairSource(RANDOM_TEXT_NAME, (), "random-text:0", random_text_pair, EXAMPLE_PROMPTS)
RANDOM_XAR_SOURCE = PairSource(RANDOM_XAR_NAME, CLASS_NAMES, "random-xar:0", random_xar_pair, cells=16)


def _official_weights(target_config: str) -> str:
    return f"official:{target_config}+mar_base"  # named, not hashed: the files are gigabytes


def discover(checkpoints: Path | None, embedded_dir: Path = EMBEDDED_DIR) -> list[PairSource]:
    """Every pair whose files exist (nothing is loaded here): embedded first, then official ones."""
    found = []
    files = _embedded_files(embedded_dir)
    if all(f.is_file() for f in files):
        found.append(PairSource(EMBEDDED_NAME, CLASS_NAMES, file_digest(*files), partial(load_embedded, embedded_dir)))
    files = _xar_files(embedded_dir)
    if all(f.is_file() for f in files):
        load = partial(load_xar_embedded, embedded_dir)
        found.append(PairSource(XAR_NAME, CLASS_NAMES, file_digest(*files), load, cells=16))
    files = _text_files(embedded_dir)
    if all(f.is_file() for f in files):
        load = partial(load_text_embedded, embedded_dir)
        found.append(PairSource(TEXT_NAME, (), file_digest(*files), load, EXAMPLE_PROMPTS))
    if checkpoints is not None:
        have = lambda config: (checkpoints / "mar" / config / "checkpoint-last.pth").is_file()
        if have("mar_base") and (checkpoints / "vae" / "kl16.ckpt").is_file():
            for name, config in OFFICIAL_TARGETS.items():
                if have(config):
                    load = partial(load_official, checkpoints, config, name)
                    found.append(PairSource(name, IMAGENET_NAMES, _official_weights(config), load))
        have_xar = lambda config: (checkpoints / "xar" / XAR_FILES[config]).is_file()
        if have_xar("xar_base") and (checkpoints / "vae" / "kl16.ckpt").is_file():
            for name, config in OFFICIAL_XAR_TARGETS.items():
                if have_xar(config):
                    load = partial(load_official_xar_pair, checkpoints, config, name)
                    cells = XAR_CONFIGS[config].cells
                    found.append(PairSource(name, IMAGENET_NAMES, f"official:{config}+xar_base", load, cells=cells))
        if all(f.is_file() for f in harmon_files(checkpoints)) and (checkpoints / "vae" / "kl16.ckpt").is_file():
            load = partial(load_harmon, checkpoints)
            found.append(PairSource(HARMON_NAME, (), "official:harmon_1.5b+harmon_0.5b", load, HARMON_PROMPTS))
    return found


OFFICIAL_FILES = ("vae/kl16.ckpt", *(f"mar/{c}/checkpoint-last.pth" for c in ("mar_base", *OFFICIAL_TARGETS.values())))
DISK_MARGIN = 1 << 30  # free bytes left over after a fetch


def fetch_official(
    repo_id: str,
    checkpoints: Path,
    log: Callable[[str], None] = print,
    free_bytes: Callable[[Path], int] | None = None,
    endpoint: str | None = None,
) -> Path:
    """Fetch official checkpoints from a Hugging Face Hub repository that mirrors the official layout
    (:data:`OFFICIAL_FILES`) into ``checkpoints``. For the operator, at start only (never a visitor):
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
    sizes = {f.rfilename: f.size or 0 for f in info.siblings or [] if f.rfilename in OFFICIAL_FILES}
    for required in OFFICIAL_FILES[:2]:
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
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self._sources)

    def source(self, name: str) -> PairSource:
        if name not in self._sources:
            raise ValueError(f"model pair must be one of {self.names}, got {name!r}")
        return self._sources[name]

    def get(self, name: str) -> ModelPair:
        source = self.source(name)
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = source.load(self.device)
            return self._loaded[name]
