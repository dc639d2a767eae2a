"""NextStep-1 as the samplers see it (:class:`csd.family.ModelFamily`): one token per AR step in raster order,
its chain the flow head (:class:`csd.models.nextstep.flow.FlowChain`) conditioned on the decoder's hidden state
before it, and a drafted block verified in one cached pass.

The decoder's keys and values live in the generation's state (:class:`NextStepState`, as gpt-fast's
``setup_caches``): the prompt runs once, then each pass appends the tokens the state has not read yet. The
state keeps every hidden state a pass made (the condition source of the token after it), so:

* ``predict`` at token s appends the tokens the canvas holds beyond what the cache read (one per AR step);
* ``verify`` of a block at s0 .. s0 + k - 1 appends the committed tokens not read yet and all k drafted tokens in
  one pass: each drafted token's chain given the drafted ones before it, and the hidden state after the last,
  the condition of the token after the block (``FamilyTraits.verifies_next``: the decoder keeps it as LLM
  speculative decoding keeps its bonus token);
* ``rewind(known)`` forgets the cache's tokens from ``known`` on (their slots are written again), nothing else:
  a rejected token's keys and values are replaced by the next pass, and a wholly accepted block's stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.config import PRECISIONS
from csd.core.chain import HeadChain, HeadCondition
from csd.family import ModelState, Plan, check_prompt
from csd.models.nextstep.flow import FlowChain
from csd.models.nextstep.tokens import KVCache, NormedTokens


def cfg_scales(cfg: float, schedule: str, tokens: int) -> list[float]:
    """The official guidance per token: "constant", or "linear" (Muse's, as the official pipeline has it) from
    cfg at the first token down towards 1: 1 + (cfg - 1) (N - s) / N at token s."""
    if schedule == "constant":
        return [cfg] * tokens
    return [1.0 + (cfg - 1.0) * (tokens - s) / tokens for s in range(tokens)]


def left_pad(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[Tensor, Tensor]:
    """Rows of ids left-padded to one width, as the official tokenizer pads: ids (R, W) and valid (R, W)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            valid[i, width - len(r) :] = True
    return ids.to(device), valid.to(device)


@dataclass
class CausalPrompts:
    """A batch's prompts as the decoder reads them: each caption's ids and the null prompt's, each followed by
    the image prefix and the begin-of-image id (``rows``, ``null``); ``pad``: the padding id."""

    text: list[str]
    rows: list[list[int]]
    null: list[int]
    pad: int
    device: torch.device

    def __len__(self) -> int:
        return len(self.text)

    def batch(self, guided: bool) -> tuple[Tensor, Tensor]:
        """ids, valid (B', W): the captions' rows, then (``guided``) the null prompt's, left-padded to one width."""
        return left_pad(self.rows + ([self.null] * len(self.rows) if guided else []), self.pad, self.device)

    def training_rows(self, drop: Tensor) -> tuple[Tensor, Tensor]:
        """ids, valid (B, W) with the rows where ``drop`` (B,) holds replaced by the null prompt."""
        keep = drop.tolist()
        return left_pad([self.null if d else r for r, d in zip(self.rows, keep, strict=True)], self.pad, self.device)


@dataclass
class NextStepState(ModelState):
    """A NextStep model's state over one generation: beside its prompts and settings, the decoder's cache over
    the prompt rows and the image tokens read so far (``length`` of them), every hidden state a pass made
    (``hidden`` (B', N + 1, width): row i is the one before token i, its condition's source; valid up to
    ``length``) and the tokens read (``seen`` (B, length, d)), for a caller that does not say what it knows.
    B' = 2B when guided: the captions' rows, then the null prompt's."""

    cache: object = None
    prompt_width: int = 0
    length: int = 0
    hidden: Tensor | None = None
    seen: Tensor | None = None

    def rewind(self, known: int) -> None:
        """Tokens from ``known`` on may change: the cache reads them again at the next pass that needs them."""
        self.length = min(self.length, known)


class NextStepFamily:
    """:class:`csd.family.ModelFamily` for NextStep models (see the module doc); the network
    (:class:`csd.models.nextstep.network.NextStep`) provides ``config``, ``tokenizer``, ``decode``,
    ``embed_tokens``, ``image_embeds``, ``head_conditions`` and ``image_head``."""

    # --- prompts -----------------------------------------------------------------------------------

    def prompt_ids(self, text: str) -> list[int]:
        """A caption's ids as the official pipeline builds them: the caption, the image prefix (its own ids:
        the official code tokenizes it apart, dropping a start token) and the begin-of-image id."""
        c, side = self.config, self.config.grid_side
        ids = list(self.tokenizer.encode(text)) if text else []
        if c.image_prefix:
            prefix = list(self.tokenizer.encode(c.image_prefix.format(h=side, w=side)))
            bos = getattr(self.tokenizer, "bos_token_id", None)
            ids += prefix[1:] if bos is not None and prefix[:1] == [bos] else prefix
        return [*ids, c.boi]

    def check_conditions(self, conditions, batch: int, device: torch.device) -> CausalPrompts:
        if isinstance(conditions, CausalPrompts):
            if len(conditions) != batch:
                raise ValueError(f"prompts must hold one prompt per seed ({batch}), got {len(conditions)}")
            return conditions
        if isinstance(conditions, str) or not isinstance(conditions, Sequence):
            raise ValueError("prompts must be a list of strings, one per seed")
        if len(conditions) != batch:
            raise ValueError(f"prompts must hold one prompt per seed ({batch}), got {len(conditions)}")
        texts = [check_prompt(p, i) for i, p in enumerate(conditions)]
        pad = getattr(self.tokenizer, "pad_token_id", 0)
        return CausalPrompts(
            texts,
            [self.prompt_ids(t) for t in texts],
            self.prompt_ids(self.config.null_prompt),
            pad,
            torch.device(device),
        )

    # --- the samplers' view -------------------------------------------------------------------------

    def plan(self, seeds, config, device: torch.device) -> Plan:
        """Raster order, one token per AR step, whatever the seed; the official guidance per token."""
        n = self.seq_len
        orders = torch.arange(n - 1, -1, -1, device=device).expand(len(seeds), -1)  # step s makes token s
        return Plan(orders, [1] * n, cfg_scales(config.cfg_scale, config.cfg_schedule, n))

    def head_steps(self, steps: int | None) -> int:
        return steps or self.config.num_sampling_steps

    def start(self, conditions: CausalPrompts, config) -> NextStepState:
        """A generation's state: its prompts and settings; the cache is made at its first pass."""
        return NextStepState(conditions, config)

    def predict(self, state: NextStepState, tokens, mask, pos, cfg, steps, known=None) -> HeadChain:
        """The chain of token ``known`` (or the one ``pos`` names) given the canvas's tokens before it."""
        s = _first_token(pos, 1, known)
        self._read(state, tokens[:, :s], None, s, known is None)
        return self._chain(state, s, 1, cfg, steps)

    def verify(self, state: NextStepState, tokens, mask, pos, cfg, steps, drafted=None, sizes=None, known=None):
        """The chains of a drafted block of consecutive tokens from one cached pass over its drafted tokens:
        each given the drafted ones before it (what the exact block asks for, ``sizes`` given or not)."""
        k = pos.shape[1]
        s = _first_token(pos, k, known)
        if drafted is None:
            raise ValueError("a causal model verifies each drafted token given those before it: pass drafted")
        b = tokens.shape[0]
        self._read(state, tokens[:, :s], drafted.reshape(b, k, -1).to(tokens.dtype), s, known is None)
        return self._chain(state, s, k, cfg, steps)

    def join(self, chains, batch: int) -> HeadChain:
        first = chains[0]
        return HeadChain(first.head, HeadCondition.join([c.cond for c in chains], batch), first.temperature)

    def check_draft(self, draft) -> None:
        """A draft must read prompts as this model does: the same tokenizer, prefix and null prompt, and run
        the same flow grid (its chains share the target's noise and sigmas)."""
        if self.tokenizer.to_dict() != draft.tokenizer.to_dict():
            raise ValueError("the text target and draft use different tokenizers")
        for key in ("image_prefix", "null_prompt", "timesteps_shift", "last_step_size", "use_norm"):
            if getattr(self.config, key) != getattr(draft.config, key):
                raise ValueError(f"the NextStep target and draft differ in {key}")

    def token_layout(self, raster_tokenizer):
        """Tokens are the raster grid's (the official patch order); under ``use_norm`` an image is made of the
        tokens layer-normed, as the official pipeline returns them."""
        return NormedTokens(raster_tokenizer) if self.config.use_norm else raster_tokenizer

    # --- the cache ------------------------------------------------------------------------------------

    def _read(self, state: NextStepState, context: Tensor, drafted: Tensor | None, s: int, compare: bool) -> None:
        """Make the cache hold ``context`` (B, s, d) and, after it, ``drafted`` (B, k, d) where given: the prompt
        at the first pass, then in one pass every token it has not read. ``compare``: the caller did not say what
        it knows, so the tokens read before are checked against the context (a read on the host)."""
        if state.cache is None:
            self._prompt(state, context)
        state.length = min(state.length, s)
        if compare:
            state.length = min(state.length, _same_prefix(state.seen, context))
        new = context[:, state.length :]
        if drafted is not None:
            new = torch.cat([new, drafted], dim=1)
        if new.shape[1] == 0:
            return
        at, guided = state.length, state.config.guided
        embeds = self.image_embeds(new)
        embeds = torch.cat([embeds, embeds]) if guided else embeds
        precision = PRECISIONS[state.config.precision]
        with torch.autocast(new.device.type, dtype=precision or torch.float32, enabled=precision is not None):
            hidden = self.decode(embeds.to(self._width_dtype(state)), state.prompt_width + at, state.cache)
        m = new.shape[1]
        state.hidden[:, at + 1 : at + m + 1] = hidden.to(state.hidden.dtype)
        state.seen[:, at : at + m] = new.to(state.seen.dtype)
        state.length = at + m

    def _prompt(self, state: NextStepState, context: Tensor) -> None:
        """The prompt rows' pass: the cache over them (room for every image token after) and the hidden state
        before the first token."""
        config, b = state.config, context.shape[0]
        ids, valid = state.conditions.batch(config.guided)
        rows, width = ids.shape
        capacity = width + self.seq_len
        dtype = self._width_dtype(state)
        state.cache = KVCache.empty(self.config, rows, capacity, ids.device, dtype)
        state.cache.valid[:, :width] = valid
        state.prompt_width = width
        state.hidden = torch.zeros(rows, self.seq_len + 1, self.config.hidden_size, device=ids.device, dtype=dtype)
        state.seen = torch.zeros(b, self.seq_len, self.token_dim, device=ids.device, dtype=config.dtype)
        precision = PRECISIONS[config.precision]
        with torch.autocast(ids.device.type, dtype=precision or torch.float32, enabled=precision is not None):
            hidden = self.decode(self.embed_tokens(ids).to(dtype), 0, state.cache)
        state.hidden[:, 0] = hidden[:, -1].to(dtype)
        state.length = 0

    def _width_dtype(self, state: NextStepState) -> torch.dtype:
        """The decoder's activations' dtype: the weights' (float64 in a float64 run)."""
        return self.dtype

    def _chain(self, state: NextStepState, s: int, k: int, cfg, steps) -> HeadChain:
        """The chains of tokens s .. s + k - 1 of every image (rows image-major) from the state's hidden states."""
        config, b = state.config, state.seen.shape[0]
        z = self.head_conditions(state.hidden[:, s : s + k], s).to(config.dtype)  # (B', k, width)
        if config.guided:
            cond = HeadCondition(z[:b].reshape(b * k, -1), z[b:].reshape(b * k, -1), cfg)
        else:
            cond = HeadCondition(z.reshape(b * k, -1))
        c, sampler = self.config, config.sampler
        flow = FlowChain(
            self.image_head.net,
            self.head_steps(steps),
            c.timesteps_shift,
            c.last_step_size,
            sampler.kind or "euler-maruyama",
            sampler.flow_grid,
        )
        return HeadChain(flow, cond, config.temperature)


def _first_token(pos: Tensor, k: int, known: int | None) -> int:
    """The first of the k consecutive tokens every image makes at ``pos`` (B, k): ``known`` where the caller
    knows it (checked on the device), else read from ``pos`` and checked there."""
    message = "a causal model makes consecutive tokens in raster order, the same for every image"
    if pos.shape[1] != k:
        raise ValueError(message)
    first = int(pos[0, 0]) if known is None else known
    same = (pos == torch.arange(first, first + k, device=pos.device)).all()
    if known is None:
        if not bool(same):
            raise ValueError(message)
    else:
        torch._assert_async(same, message)
    return first


def _same_prefix(seen: Tensor, context: Tensor) -> int:
    """How many leading tokens ``context`` (B, s, d) shares with ``seen`` (B, >= s, d) in every image."""
    n = context.shape[1]
    if n == 0:
        return 0
    same = (seen[:, :n] == context.to(seen.dtype)).all(-1).all(0)  # (n,)
    return int(same.to(torch.int64).cumprod(0).sum())
