"""The masked-AR adapter (MAR, and Harmon after it): the :class:`csd.family.ModelFamily` of a model that
predicts a random-order set of tokens per AR step from one backbone pass, through a separate
diffusion head.

A model mixes in :class:`MaskedARFamily` and provides ``seq_len``, ``token_dim``, ``traits``,
``head`` (``head.chain(steps)`` -> a :class:`~csd.core.chain.GaussianChain`) and
``conditions(tokens, mask, labels, guided)`` (and ``views``, to verify the exact block's views in one pass:
:meth:`MaskedARFamily.verify`). Class labels are its conditions; a text-conditioned
model overrides :meth:`MaskedARFamily.check_conditions` (prompts), :meth:`MaskedARFamily.start` (its
prompts' keys and values, kept for the generation) and ``conditions``.

A generation's state (:class:`MaskedState`) holds what LazyMAR's caches keep between the model's passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from csd.config import PRECISIONS
from csd.core.chain import HeadChain, HeadCondition
from csd.core.rng import ImageStreams
from csd.core.schedule import step_cfg_scales, step_sizes
from csd.family import ModelState, Plan
from csd.models.head import DiffusionHead
from csd.models.mar.gtr import DetailChains, detail_rows, frequency_score, grid_side, gtr_plan, stage_of
from csd.models.mar.token_cache import DecoderPass, TokenCache, decoder_pass


def check_labels(labels: Sequence[int] | Tensor, num_classes: int, batch: int, device: torch.device) -> Tensor:
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if labels.numel() != batch:
        raise ValueError(f"labels must hold one class id per seed ({batch}), got {labels.numel()}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"class labels must be in [0, {num_classes - 1}], got {labels.tolist()}")
    return labels.to(device)


def gather_rows(values: Tensor, pos: Tensor) -> Tensor:
    """values (B, N, D) at positions (B, k) -> (B*k, D), image-major."""
    return torch.gather(values, 1, pos.unsqueeze(-1).expand(-1, -1, values.shape[-1])).reshape(-1, values.shape[-1])


def masked_plan(seeds: Sequence[int], num_tokens: int, num_steps: int, cfg: float, schedule: str, device) -> Plan:
    """MAR's schedule: a random order per image (its "order" stream), the cosine mask schedule and the
    CFG ramp over the steps."""
    sizes = step_sizes(num_tokens, num_steps)
    orders = ImageStreams(seeds, "order", device).randperm(num_tokens)
    return Plan(orders, sizes, step_cfg_scales(cfg, schedule, sizes))


@dataclass
class GuidanceCache:
    """LazyMAR's condition cache of one model over one generation (in its :class:`MaskedState`): its
    backbone passes so far and the last full pass's z_uncond - z (B, N, dec)."""

    passes: int = 0
    difference: Tensor | None = None


@dataclass
class MaskedState(ModelState):
    """A masked model's state over one generation: beside its conditions and settings, LazyMAR's condition
    cache (``guidance``) and token cache (``decoder``), and a text model's prompt keys and values per
    guidance (``prompt_kv``: ``{guided: cache}``, filled at the first pass of each; None for class labels)."""

    guidance: GuidanceCache = field(default_factory=GuidanceCache)
    decoder: TokenCache = field(default_factory=TokenCache)
    prompt_kv: dict[bool, Any] | None = None


def block_views(tokens: Tensor, mask: Tensor, pos: Tensor, drafted: Tensor, sizes: Sequence[int]):
    """The exact block's views of the canvas: view k (of len(sizes)) holds the context plus the block's drafted
    AR steps before step k. ``pos`` (B, k): the block's positions, step by step; ``drafted`` (B*k, d) rows
    image-major. Returns tokens (V*B, N, d) and mask (V*B, N), view-major."""
    b, d, views = tokens.shape[0], tokens.shape[-1], len(sizes)
    view_tokens, view_mask = tokens.repeat(views, 1, 1), mask.repeat(views, 1)
    drafted = drafted.reshape(b, -1, d).to(tokens.dtype)
    start = 0
    for k, size in enumerate(sizes[:-1]):  # step k joins the context of every view after it
        at, values = pos[:, start : start + size], drafted[:, start : start + size]
        for view in range(k + 1, views):
            rows = slice(view * b, (view + 1) * b)
            view_tokens[rows] = view_tokens[rows].scatter(1, at.unsqueeze(-1).expand(-1, -1, d), values)
            view_mask[rows] = view_mask[rows].scatter(1, at, False)
        start += size
    return view_tokens, view_mask


class MaskedARFamily:
    """:class:`csd.family.ModelFamily` for masked AR models with a diffusion head (see the module doc)."""

    def check_conditions(self, conditions, batch: int, device: torch.device) -> Tensor:
        return check_labels(conditions, self.traits.num_classes, batch, device)

    def plan(self, seeds: Sequence[int], config, device: torch.device) -> Plan:
        """MAR's plan, or GtR's stages (``config.gtr``: :mod:`csd.models.mar.gtr`)."""
        if config.gtr is not None:
            return gtr_plan(seeds, self.seq_len, config, device)
        return masked_plan(seeds, self.seq_len, config.num_steps, config.cfg_scale, config.cfg_schedule, device)

    def head_steps(self, steps: int | None) -> int:
        return self.head.chain(steps).num_steps()

    def start(self, conditions, config) -> MaskedState:
        """A generation's state: its conditions and settings, LazyMAR's caches empty."""
        return MaskedState(conditions, config)

    def guided_conditions(
        self, state: MaskedState, tokens: Tensor, mask: Tensor, pos: Tensor | None = None, known: int | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """One backbone pass, under autocast when a reduced precision is asked; z comes back in float32.
        With the condition cache (``config.cond_cache``) a guided pass that is not a full one runs
        the conditional half only and takes z_uncond = z + the last full pass's difference. With the
        token cache (``config.token_cache``) the decoder recomputes part of its rows at most passes,
        always those at ``pos`` (B, k), the positions the pass is for. Both caches are the generation's
        (``state``). ``known``: the known tokens of every row, where the caller knows them (the backbone then
        reads nothing on the host: :meth:`csd.models.mar.MAR.forward_mae_encoder`)."""
        config = state.config
        decoder = decoder_pass(state.decoder, config, pos)
        if not (config.guided and config.cond_cache is not None):
            return self._conditions(state, tokens, mask, config.guided, decoder, known)
        cache = state.guidance
        full, cache.passes = config.full_guidance_pass(cache.passes), cache.passes + 1
        if not full and cache.difference is not None:
            z, _ = self._conditions(state, tokens, mask, False, decoder, known)
            return z, z + cache.difference
        z, z_uncond = self._conditions(state, tokens, mask, True, decoder, known)
        cache.difference = z_uncond - z
        return z, z_uncond

    def _conditions(
        self,
        state: MaskedState,
        tokens: Tensor,
        mask: Tensor,
        guided: bool,
        decoder: DecoderPass | None = None,
        known: int | None = None,
        views: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """The model's ``conditions`` of one pass, under autocast where the precision asks; ``views`` > 1: the
        pass holds that many canvases of the batch, view-major (the model's ``conditions`` takes ``views``)."""
        dtype = PRECISIONS[state.config.precision]
        extra = {} if decoder is None else {"decoder": decoder}
        if known is not None:
            extra["known"] = known
        if views > 1:
            extra["views"] = views
        if state.prompt_kv is not None:
            extra["prompt_kv"] = state.prompt_kv
        if dtype is None:
            return self.conditions(tokens, mask, state.conditions, guided, **extra)
        with torch.autocast(device_type=tokens.device.type, dtype=dtype):
            z, z_uncond = self.conditions(tokens, mask, state.conditions, guided, **extra)
        return z.float(), None if z_uncond is None else z_uncond.float()

    def predict(self, state: MaskedState, tokens, mask, pos, cfg, steps: int, known=None) -> HeadChain | DetailChains:
        """One backbone pass and the head's chains of the tokens at ``pos``, on ``config.sampler``. Under
        GtR's FTS a reconstruction step's chains are :class:`csd.models.mar.DetailChains`: ``steps`` for
        its detail tokens, GtR's head steps for the others."""
        config = state.config
        z, z_uncond = self.guided_conditions(state, tokens, mask, pos, known)
        if z_uncond is None:
            cond = HeadCondition(gather_rows(z, pos))
        else:
            cond = HeadCondition(gather_rows(z, pos), gather_rows(z_uncond, pos), cfg)
        chain = HeadChain(self._head_chain(steps, config), cond, config.temperature)
        gtr = config.gtr
        if gtr is None or gtr.detail_fraction == 0.0:
            return chain
        stages = len(gtr.stages)
        if int(stage_of(pos[0, 0], grid_side(self.seq_len), stages)) < stages - 1:
            return chain
        short = HeadChain(self._head_chain(gtr.head_steps, config), cond, config.temperature)
        return DetailChains(chain, short, detail_rows(frequency_score(cond.z), pos.shape[0], gtr.detail_fraction))

    def _head_chain(self, steps: int, config):
        """The head's chain at ``steps`` on the config's sampler (the head's own when None); a diffusion head's
        compiled products in the precision's autocast dtype (:mod:`csd.models.kernels`)."""
        sampler = () if config.sampler.kind is None else (config.sampler.kind, config.sampler.ddim_eta)
        if not isinstance(self.head, DiffusionHead):
            return self.head.chain(steps, *sampler)
        return self.head.chain(steps, *sampler, autocast=PRECISIONS[config.precision])

    def verify(
        self, state: MaskedState, tokens, mask, pos, cfg, steps: int, drafted=None, sizes=None, known=None
    ) -> HeadChain:
        """The published block (``sizes`` None): one pass over the context before the block gives every
        position's condition, so verifying a block is predicting all of its positions at once (the drafted
        tokens play no part). The exact block (``sizes``: the block's tokens per AR step): each step's
        conditions from the context plus the block's drafted steps before it (``drafted`` (B*k, d), rows
        image-major), every step's view a batch row of one backbone pass (:func:`block_views`): the views
        know more tokens step by step, so the pass is ragged (each view's kept rows padded to the last
        view's, the padding out of attention: each gets the numbers a pass of its own gives). ``known``
        (the tokens before the block) None: read from the mask on the host. LazyMAR's caches do not apply
        (:func:`csd.run_setup.check_speculative` refuses them under these blocks)."""
        if sizes is None or len(sizes) == 1:
            return self.predict(state, tokens, mask, pos, cfg, steps, known)
        b, config = tokens.shape[0], state.config
        view_tokens, view_mask = block_views(tokens, mask, pos, drafted, sizes)
        known = int((~mask[0]).sum()) if known is None else known
        most = known + sum(sizes[:-1])  # the last view knows the block's steps before its own
        z, z_uncond = self._conditions(state, view_tokens, view_mask, config.guided, known=most, views=len(sizes))
        conds, start, cfg = [], 0, cfg.reshape(b, -1)
        for k, size in enumerate(sizes):  # step k's rows from view k
            at, rows = pos[:, start : start + size], slice(k * b, (k + 1) * b)
            if z_uncond is None:
                conds.append(HeadCondition(gather_rows(z[rows], at)))
            else:
                step_cfg = cfg[:, start : start + size].reshape(-1)
                conds.append(HeadCondition(gather_rows(z[rows], at), gather_rows(z_uncond[rows], at), step_cfg))
            start += size
        return HeadChain(self._head_chain(steps, config), HeadCondition.join(conds, b), config.temperature)

    def check_draft(self, draft) -> None:
        """Nothing beyond the shared layout (:func:`csd.run_setup.check_pair`) for class labels."""

    def token_layout(self, raster_tokenizer):
        """The tokenizer of this model's tokens over a raster tokenizer of its grid: the same one."""
        return raster_tokenizer

    def join(self, chains: Sequence[HeadChain], batch: int) -> HeadChain:
        first = chains[0]
        return HeadChain(first.head, HeadCondition.join([c.cond for c in chains], batch), first.temperature)
