"""LazyMAR's token cache for the MAR decoder (Yan et al., 2025; facts from feihongyan1/LazyMAR).

Between adjacent AR steps most tokens' decoder features barely change. At a *cached* pass the decoder
runs its first :data:`FIRST_CACHED_BLOCK` blocks over every row, compares each row's features there with
those it had when it was last computed (cosine similarity), and runs the later blocks over a fraction
``keep`` of the rows only: the buffer, the rows the step predicts, the tokens made since the last pass,
then the rows whose features changed most. The other rows' keys and values in those blocks, and their
outputs, are reused from the pass that last computed them. The first ``token_cache_start`` passes of a
generation and every ``token_cache_every``-th after are *full* passes over every row, which refresh
everything (LazyMAR: 5 of 64 and every 9th).

Written from the description and the reference's structure, not its code; differences: the features
compared are the hidden states entering the first cached block (LazyMAR compares that block's value
vectors), the fraction kept is one number rather than a per-step schedule, and the encoder is not cached.

With ``keep`` 1 every row is kept in order and a cached pass gives the numbers of a plain one
(tests/models/test_condition_cache.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

FIRST_CACHED_BLOCK = 3  # blocks before it always run over every row (LazyMAR selects at its layer 3)
FORCED = 10.0  # added to the change score of rows that must be recomputed (1 - cosine is at most 2)


@dataclass
class DecoderRows:
    """What one model's decoder last computed for each row, at one number of rows R (a guided pass
    doubles the batch): the features entering the first cached block, every cached block's keys and
    values, the last block's output, and the mask of that pass."""

    reference: Tensor  # (R, n, C), n = buffer + tokens
    keys: list[Tensor]  # per cached block (R, heads, n, hd)
    values: list[Tensor]
    output: Tensor  # (R, n, C)
    mask: Tensor  # (R, N) True = unknown


@dataclass
class TokenCache:
    """One model's token cache over one generation (kept in its state, :class:`csd.models.mar.adapter.MaskedState`):
    its backbone passes so far and its rows per R."""

    passes: int = 0
    rows: dict[int, DecoderRows] = field(default_factory=dict)


@dataclass(frozen=True)
class DecoderPass:
    """What one backbone pass asks of the decoder: a full or a cached pass, the fraction of rows a cached
    pass recomputes, and the positions (B, k) the step predicts."""

    cache: TokenCache
    full: bool
    keep: float
    pos: Tensor


def decoder_pass(cache: TokenCache, config, pos: Tensor | None) -> DecoderPass | None:
    """The decoder's part of the next backbone pass of a model under ``config``, with its generation's
    ``cache`` (None: no token cache)."""
    if config.token_cache is None or pos is None:
        return None
    full, cache.passes = config.full_token_pass(cache.passes), cache.passes + 1
    return DecoderPass(cache, full, config.token_cache.keep, pos)


def _gather(x: Tensor, index: Tensor) -> Tensor:
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def kept_rows(change: Tensor, forced: Tensor, keep: float) -> Tensor:
    """(R, m) positions a cached pass recomputes, ascending: every forced one, then the most changed,
    m = max(ceil(keep * n), the most forced in any row). change, forced: (R, n)."""
    n = change.shape[1]
    m = min(n, max(math.ceil(keep * n), int(forced.sum(1).max())))
    score = change + FORCED * forced.to(change.dtype)
    return score.topk(m, dim=1).indices.sort(dim=1).values


def run_decoder(blocks: nn.ModuleList, x: Tensor, mask: Tensor, buffer: int, step: DecoderPass) -> Tensor:
    """The decoder blocks over x (R, n, C) under the token cache; mask (R, N) True = unknown. Returns the
    last block's output (R, n, C)."""
    first = min(FIRST_CACHED_BLOCK, len(blocks) - 1)
    for block in blocks[:first]:
        x = block(x)
    r = x.shape[0]
    state = step.cache.rows.get(r)
    if step.full or state is None:
        reference, keys, values = x, [], []
        for block in blocks[first:]:
            x, k, v = block.forward_kv(x)
            keys.append(k)
            values.append(v)
        step.cache.rows[r] = DecoderRows(reference, keys, values, x, mask)
        return x
    forced = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    forced[:, :buffer] = True  # the condition rows
    forced[:, buffer:] |= mask != state.mask  # tokens made since the last pass
    pos = step.pos.repeat(r // step.pos.shape[0], 1)  # CFG's doubled batch: both halves
    forced.scatter_(1, pos + buffer, True)
    change = 1.0 - torch.nn.functional.cosine_similarity(x, state.reference, dim=-1)
    index = kept_rows(change, forced, step.keep)
    rows = _gather(x, index)
    at = index.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    reference = state.reference.scatter(1, at, rows)
    keys, values = [], []
    for block, k, v in zip(blocks[first:], state.keys, state.values, strict=True):
        rows, k, v = block.forward_rows(rows, index, k, v)
        keys.append(k)
        values.append(v)
    output = state.output.scatter(1, at, rows)
    step.cache.rows[r] = DecoderRows(reference, keys, values, output, mask)
    return output
