"""Harmon's prompts: tokenizers (a closed word vocabulary for the embedded models, the official Qwen2.5
tokenizer read from local files), the official template and null prompt, and a tokenised batch of
prompts with its null-prompt half for classifier-free guidance."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# The official template (xtuner's Qwen chat INSTRUCTION), prefix and null prompt.
QWEN_TEMPLATE = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
QWEN_PREFIX = "Generate an image: {prompt}"
QWEN_NULL_PROMPT = "Generate an image."


# --- tokenizers ----------------------------------------------------------------------------------


class WordTokenizer:
    """A word-level tokenizer over a closed vocabulary (the embedded models' captions).

    Lower-cases and splits on whitespace, dropping ``.,;:!?``; a word outside the vocabulary is an
    error that lists the vocabulary. Ids: 0 padding, 1 the start token, then the words."""

    PAD, BOS = "<pad>", "<bos>"

    def __init__(self, words: Sequence[str]):
        words = list(dict.fromkeys(words))
        if not words or any(not w or w != w.lower() or re.search(r"\s", w) for w in words):
            raise ValueError("vocabulary must be non-empty lower-case words without spaces")
        self.words = words
        self.vocab = {w: i for i, w in enumerate([self.PAD, self.BOS, *words])}
        self.pad_token_id, self.bos_token_id = 0, 1

    def __len__(self) -> int:
        return len(self.vocab)

    @staticmethod
    def split(text: str) -> list[str]:
        return re.sub(r"[.,;:!?]", " ", text.lower()).split()

    def unknown(self, text: str) -> list[str]:
        return sorted({w for w in self.split(text) if w not in self.vocab})

    def encode(self, text: str) -> list[int]:
        """The start token, then one id per word (``text`` may start with the start token itself)."""
        words = self.split(text.replace(self.BOS, " "))
        missing = sorted({w for w in words if w not in self.vocab})
        if missing:
            raise ValueError(
                f"prompt words {missing} are not in the vocabulary of this model; it knows only these "
                f"{len(self.words)} words: {', '.join(self.words)}"
            )
        return [self.bos_token_id, *(self.vocab[w] for w in words)]

    def to_dict(self) -> dict:
        return {"kind": "words", "words": self.words}


class HubTokenizer:
    """A ``transformers`` tokenizer read from local files only (the official models' Qwen2.5 one);
    it pads with its end-of-text id, as the official code does."""

    def __init__(self, directory: str):
        from transformers import AutoTokenizer

        self.directory = str(directory)
        self.inner = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        self.pad_token_id = self.inner.eos_token_id

    def __len__(self) -> int:
        return len(self.inner)

    def unknown(self, text: str) -> list[str]:
        return []  # byte-level BPE: every text has ids

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=True))

    def to_dict(self) -> dict:
        return {"kind": "hub", "directory": self.directory}


def tokenizer_from_dict(spec: dict):
    if spec.get("kind") == "words":
        return WordTokenizer(spec["words"])
    if spec.get("kind") == "hub":
        return HubTokenizer(spec["directory"])
    raise ValueError(f"unknown tokenizer spec {spec!r}")


# --- prompts -----------------------------------------------------------------------------------


@dataclass
class Prompts:
    """Tokenised prompts, right-padded: ids (B, L) and attention mask (B, L) True = a token; the same
    for the null prompt (CFG's unconditional half)."""

    text: list[str]
    ids: Tensor
    attn: Tensor
    null_ids: Tensor
    null_attn: Tensor

    def __len__(self) -> int:
        return len(self.text)

    def both(self, pad: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """ids, attn, null ids, null attn, all padded to one width."""
        width = max(self.ids.shape[1], self.null_ids.shape[1])
        fit = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)
        return fit(self.ids, pad), fit(self.attn, False), fit(self.null_ids, pad), fit(self.null_attn, False)


def pad_ids(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, : len(r)] = True
    return ids.to(device), attn.to(device)
