"""The text side of the shapes data: the caption vocabulary, its tokenizer, and the embedded
text-conditioned (Harmon-layout) models' architectures.

Captions read "a small red star on a blue to white gradient" (:mod:`csd.shapes.data`); their words
are a closed set, listed here from the data's own tables, so the tokenizer knows every word a caption
can hold and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
from torch import Tensor

from csd.models.harmon import HarmonConfig, WordTokenizer, qwen2
from csd.models.mar import mar_config
from csd.models.nextstep import NextStepConfig
from csd.shapes.data import _CLASS_NOUNS, BACKGROUNDS, CLASS_NAMES, PALETTE

SIZES = ("small", "medium", "large")
CAPTION_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [
            "a",
            "an",
            *SIZES,
            *PALETTE,
            *(w for name in CLASS_NAMES for w in _CLASS_NOUNS.get(name, name).split()),
            "on",
            "to",
            *BACKGROUNDS,
            "background",
        ]
    )
)


def caption_tokenizer() -> WordTokenizer:
    return WordTokenizer(CAPTION_WORDS)


def prompt_class(prompt: str) -> int | None:
    """The shape class a prompt names (its first class noun), or None."""
    words = WordTokenizer.split(prompt)
    for w in words:
        if w in CLASS_NAMES:
            return CLASS_NAMES.index(w)
    return None


def prompt_colour(prompt: str) -> str | None:
    """The shape colour a prompt asks for: the palette word before the class noun, or None."""
    m = re.search(r"\b(" + "|".join(PALETTE) + r")\s+(?:" + "|".join(CLASS_NAMES) + r")\b", prompt.lower())
    return None if m is None else m.group(1)


_COLOURS = "|".join(PALETTE)
_BACKGROUND = re.compile(
    rf"\bon (?:an? )?(?:(?:plain|textured) )?({_COLOURS})(?: to ({_COLOURS}))? (?:background|gradient)\b"
)
# Border rule: the ring of pixels this wide at the image's edges is what the background score reads, and
# each colour of an "X to Y" gradient must name at least this share of it (tests/shapes/test_prompt_following.py: real
# images score 0.99 with their own captions, 0.25 with shuffled ones).
BORDER_WIDTH = 2
GRADIENT_SHARE = 0.05


def prompt_background(prompt: str) -> tuple[str, ...] | None:
    """The background colours a prompt asks for: ("white",) for "on a plain white background", "on a
    textured white background" or "on a white gradient", ("blue", "white") for "on a blue to white
    gradient"; None where it names no background."""
    m = _BACKGROUND.search(prompt.lower())
    if m is None:
        return None
    first, second = m.groups()
    return (first,) if second in (None, first) else (first, second)


def border_colours(image: Tensor) -> np.ndarray:
    """The share of the image's border ring (:data:`BORDER_WIDTH` px) each palette colour names, (12,)
    in PALETTE's order; image (3, H, W) in [-1, 1]. Each pixel is named by its nearest palette colour,
    as captions name colours."""
    rgb = ((image.float().permute(1, 2, 0) + 1.0) / 2.0).numpy().astype(np.float64)  # (H, W, 3) in [0, 1]
    ring = np.ones(rgb.shape[:2], dtype=bool)
    ring[BORDER_WIDTH:-BORDER_WIDTH, BORDER_WIDTH:-BORDER_WIDTH] = False
    palette = np.asarray(list(PALETTE.values()))
    nearest = ((rgb[ring][:, None, :] - palette[None]) ** 2).sum(-1).argmin(1)
    return np.bincount(nearest, minlength=len(PALETTE)) / len(nearest)


def background_matches(image: Tensor, wanted: tuple[str, ...]) -> bool:
    """Whether an image (3, H, W) in [-1, 1] shows the background colours a prompt asked for: one colour
    must be the border's most common name; each colour of a gradient must name at least
    :data:`GRADIENT_SHARE` of the border."""
    share = border_colours(image)
    names = list(PALETTE)
    if len(wanted) == 1:
        return names[int(share.argmax())] == wanted[0]
    return all(share[names.index(c)] >= GRADIENT_SHARE for c in wanted)


# The embedded text pair: the shipped class-conditional generators (shapes_target / shapes_draft) in the
# Harmon layout, each with its own small Qwen2 over the caption vocabulary. A bare template (the
# start token, then the caption) and the empty null prompt: the models never see chat markup.
_TEXT = dict(template="{input}", prefix="{prompt}", null_prompt="")
_VOCAB = len(CAPTION_WORDS) + 2  # + padding and start ids
TEXT_CONFIGS: dict[str, HarmonConfig] = {
    "shapes_text_target": HarmonConfig(
        mar_config("shapes_target"), qwen2(128, 2, 4, 2, 256, _VOCAB, max_position_embeddings=128), **_TEXT
    ),
    "shapes_text_draft": HarmonConfig(
        mar_config("shapes_draft"), qwen2(64, 1, 2, 1, 128, _VOCAB, max_position_embeddings=128), **_TEXT
    ),
    # Untrained text pairs over the caption vocabulary (random weights), for tests and a server with no weights.
    "random_text_target": HarmonConfig(mar_config("random_target"), qwen2(32, 1, 2, 1, 64, _VOCAB), **_TEXT),
    "random_text_draft": HarmonConfig(mar_config("random_draft"), qwen2(32, 1, 2, 1, 64, _VOCAB), **_TEXT),
}


def text_config(name: str, **mar_overrides) -> HarmonConfig:
    if name not in TEXT_CONFIGS:
        raise ValueError(f"unknown text model config {name!r}; choose from {sorted(TEXT_CONFIGS)}")
    c = TEXT_CONFIGS[name]
    return replace(c, mar=replace(c.mar, **mar_overrides)) if mar_overrides else c


def prompt_scores(images, prompts) -> dict[str, float | None]:
    """What fraction of images (B, 3, H, W) in [-1, 1] show what their prompts asked for: the class (the
    shapes classifier), the shape's colour (the colour classifier) and the background's colours (the
    border rule, :func:`background_matches`), each over the prompts that name one."""
    from csd.shapes.metrics import DEFAULT_COLOUR_CLASSIFIER, load_classifier, predict

    classes = [prompt_class(p) for p in prompts]
    colours = [prompt_colour(p) for p in prompts]
    backgrounds = [prompt_background(p) for p in prompts]
    out: dict[str, float | None] = {"class_accuracy": None, "colour_accuracy": None, "background_accuracy": None}
    named = [i for i, c in enumerate(classes) if c is not None]
    if named:
        got = predict(images[named])
        out["class_accuracy"] = float(np.mean(got == np.asarray([classes[i] for i in named])))
    named = [i for i, c in enumerate(colours) if c is not None]
    if named:
        got = predict(images[named], load_classifier(DEFAULT_COLOUR_CLASSIFIER))
        wanted = np.asarray([list(PALETTE).index(colours[i]) for i in named])
        out["colour_accuracy"] = float(np.mean(got == wanted))
    named = [i for i, c in enumerate(backgrounds) if c is not None]
    if named:
        out["background_accuracy"] = float(np.mean([background_matches(images[i], backgrounds[i]) for i in named]))
    return out


# The embedded causal pair (the NextStep-1 layout): a small LLaMA-style decoder over the caption vocabulary and
# the 8 x 8 grid of 4 x 4 RGB patches (tokens of 48 values in [-1, 1], the pixel "latents" of stride 1), a
# flow-matching head, and a 2-D sin-cos position row added to each token's hidden state (an 8 x 8 table). The
# caption's ids (the start token, the words), then the begin-of-image id; the null prompt is empty: the begin-of-image
# id alone (as an official null prompt "" under a tokenizer that adds no start token).
_CAUSAL_IDS = dict(vocab_size=_VOCAB + 3, boi=_VOCAB, eoi=_VOCAB + 1, image_placeholder_id=_VOCAB + 2)
_PIXELS = dict(
    latent_channels=3,
    latent_patch_size=4,
    latent_size=32,
    grid_side=8,
    use_gen_pos_embed=True,
    gen_pos_grid=8,
    num_sampling_steps=25,
    cfg=3.0,
    rope_theta=10000.0,
)
CAUSAL_CONFIGS: dict[str, NextStepConfig] = {
    "shapes_causal_target": NextStepConfig(
        hidden_size=192,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=512,
        fm_head_dim=160,
        fm_head_layers=3,
        **_CAUSAL_IDS,
        **_PIXELS,
    ),
    "shapes_causal_draft": NextStepConfig(
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        intermediate_size=256,
        fm_head_dim=96,
        fm_head_layers=2,
        **_CAUSAL_IDS,
        **_PIXELS,
    ),
}
