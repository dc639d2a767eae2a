"""What a NextStep generation keeps and reads besides its weights: the decoder's cache of keys and values, and
the official ``use_norm`` (each token layer-normed, in what the model reads and in the image it makes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class KVCache:
    """Every layer's keys and values (B', kv heads, capacity, head dim) of the positions run so far, and which
    positions a query may read (``valid`` (B', capacity): a left-padded prompt's padding is not)."""

    keys: list[Tensor]
    values: list[Tensor]
    valid: Tensor

    @staticmethod
    def empty(config, rows: int, capacity: int, device, dtype) -> KVCache:
        shape = (rows, config.num_key_value_heads, capacity, config.attention_head_dim)
        make = lambda: [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        return KVCache(make(), make(), torch.ones(rows, capacity, dtype=torch.bool, device=device))


def token_norm(tokens: Tensor) -> Tensor:
    """The official pipeline's ``use_norm``: each token layer-normed over its values, no affine, eps 1e-6."""
    return F.layer_norm(tokens, tokens.shape[-1:], eps=1e-6)


@dataclass(frozen=True)
class NormedTokens:
    """A tokenizer whose images are made of the tokens layer-normed (the official ``use_norm``)."""

    inner: object

    @property
    def token_dim(self) -> int:
        return self.inner.token_dim

    def encode(self, images: Tensor, *args) -> Tensor:
        return self.inner.encode(images, *args)

    def decode(self, tokens: Tensor) -> Tensor:
        return self.inner.decode(token_norm(tokens))
