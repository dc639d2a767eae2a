"""The text side of the shapes data: the caption vocabulary, its tokenizer, and the embedded
text-conditioned (Harmon-layout) models' architectures.

Captions read "a small red star on a blue to white gradient" (:mod:`csd.shapes.data`); their words
are a closed set, listed here from the data's own tables, so the tokenizer knows every word a caption
can hold and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import replace

from csd.models.harmon import HarmonConfig, WordTokenizer, qwen2
from csd.models.mar import mar_config
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
    shapes classifier) and the shape's colour (the colour classifier), over the prompts that name one."""
    import numpy as np

    from csd.shapes.metrics import DEFAULT_COLOUR_CLASSIFIER, load_classifier, predict

    classes = [prompt_class(p) for p in prompts]
    colours = [prompt_colour(p) for p in prompts]
    out: dict[str, float | None] = {"class_accuracy": None, "colour_accuracy": None}
    named = [i for i, c in enumerate(classes) if c is not None]
    if named:
        got = predict(images[named])
        out["class_accuracy"] = float(np.mean(got == np.asarray([classes[i] for i in named])))
    named = [i for i, c in enumerate(colours) if c is not None]
    if named:
        got = predict(images[named], load_classifier(DEFAULT_COLOUR_CLASSIFIER))
        wanted = np.asarray([list(PALETTE).index(colours[i]) for i in named])
        out["colour_accuracy"] = float(np.mean(got == wanted))
    return out
