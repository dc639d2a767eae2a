"""Harmon: text-to-image MAR conditioned on a causal language model (Wu et al., 2025).

Per AR step (the official ``Harmon.forward_mae_encoder``): the MAR encoder runs with ``fake_latent``
in its buffer (no class); ``proj_in`` maps its outputs (buffer + known tokens) to the LLM width; the
buffer rows move to the end; the LLM runs causally over the prompt then those rows (positions
continue from the prompt's valid length, padding masked); its last hidden states move back,
``proj_out`` maps them to the MAR width and they are *added* to the encoder output; the MAR decoder
and the DiffLoss head follow, unchanged. The module tree (``llm.model.*``, ``llm.lm_head``,
``mar.*``, ``proj_in.{0,2}``, ``proj_out.{0,2}``) is the official one, so ``harmon_0.5b.pth`` /
``harmon_1.5b.pth`` load strictly (:func:`csd.models.harmon.official.load_official_harmon`).

The LLM is ``transformers``' Qwen2. As the official sampler does, the prompt runs once into a KV
cache (kept in the model's state of a generation, :class:`~csd.models.mar.adapter.MaskedState`) and every
AR step runs the image rows on top of it, cropping the cache back after (tests/models/test_harmon.py: the same
numbers as running the prompt again in each pass, which training does).

Conditions are prompts: :meth:`Harmon.check_conditions` tokenises them (and the null prompt for
CFG) into a :class:`~csd.models.harmon.prompt_batch.Prompts` batch. Both models of a pair must share the tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn

from csd.family import FamilyTraits, check_prompt
from csd.models.harmon.prompt_batch import QWEN_NULL_PROMPT, QWEN_PREFIX, QWEN_TEMPLATE, Prompts, pad_ids
from csd.models.head import DiffusionHead
from csd.models.mar.adapter import MaskedARFamily, MaskedState
from csd.models.mar.network import MAR, MAR_CONFIGS, MARConfig, padding, training_mask
from csd.models.mar.token_cache import DecoderPass
from csd.models.spec import SerialConfig

if TYPE_CHECKING:
    from transformers import DynamicCache

# --- config ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarmonConfig(SerialConfig):
    """A Harmon model: its MAR generator, its Qwen2 LLM (``transformers.Qwen2Config`` fields), the
    prompt template and the null prompt, and the token grid it samples (``grid_side``, None: the MAR's
    own; the official models sample 512 px, a 32 x 32 grid of their 16 x 16 MAR)."""

    mar: MARConfig
    llm: dict = field(default_factory=dict)
    template: str = QWEN_TEMPLATE
    prefix: str = QWEN_PREFIX
    null_prompt: str = QWEN_NULL_PROMPT
    grid_side: int | None = None

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if not isinstance(self.llm.get(key), int) or self.llm[key] < 1:
                raise ValueError(f"HarmonConfig.llm.{key} must be an int >= 1, got {self.llm.get(key)!r}")
        if "{input}" not in self.template or "{prompt}" not in self.prefix:
            raise ValueError("HarmonConfig.template needs '{input}' and HarmonConfig.prefix needs '{prompt}'")
        if self.grid_side is not None and not (isinstance(self.grid_side, int) and self.grid_side >= 1):
            raise ValueError(f"HarmonConfig.grid_side must be an int >= 1 or None, got {self.grid_side!r}")

    @property
    def side(self) -> int:
        return self.grid_side or self.mar.seq_side

    nested: ClassVar[dict[str, type]] = {"mar": MARConfig}

    def traits(self) -> FamilyTraits:
        return FamilyTraits(
            "Harmon",
            "prompts",
            caches_guidance=True,
            caches_tokens=True,
            head_samplers=("ddpm", "ddim"),
            takes_gtr=True,
        )


def qwen2(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, **extra) -> dict:
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=extra.pop("max_position_embeddings", 32768),
        rope_theta=extra.pop("rope_theta", 1_000_000.0),
        rms_norm_eps=extra.pop("rms_norm_eps", 1e-6),
        tie_word_embeddings=extra.pop("tie_word_embeddings", True),
        **extra,
    )


# Official generators (Harmon's configs: mar_base / mar_huge, KL-16 latents, buffer 64, 100 head steps)
# and the Qwen2.5-Instruct LLMs' published configs.
HARMON_CONFIGS: dict[str, HarmonConfig] = {
    "harmon_0.5b": HarmonConfig(MAR_CONFIGS["mar_base"], qwen2(896, 24, 14, 2, 4864, 151936), grid_side=32),
    "harmon_1.5b": HarmonConfig(MAR_CONFIGS["mar_huge"], qwen2(1536, 28, 12, 2, 8960, 151936), grid_side=32),
}


def harmon_config(name: str, **overrides) -> HarmonConfig:
    if name not in HARMON_CONFIGS:
        raise ValueError(f"unknown Harmon config {name!r}; choose from {sorted(HARMON_CONFIGS)}")
    return replace(HARMON_CONFIGS[name], **overrides)


def mlp(dim_in: int, hidden: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.SiLU(), nn.Linear(hidden, dim_out))


def cache_rows(cache: DynamicCache, index: Tensor) -> DynamicCache:
    """A new cache of some rows of ``cache`` (``index`` (R,), repeats allowed): every layer's keys and values."""
    from transformers import DynamicCache

    return DynamicCache([(layer.keys[index], layer.values[index]) for layer in cache.layers])


# --- the model -----------------------------------------------------------------------------------


class Harmon(MaskedARFamily, nn.Module):
    def __init__(self, config: HarmonConfig, tokenizer, attn_implementation: str = "sdpa"):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        super().__init__()
        self.config, self.tokenizer = config, tokenizer
        if len(tokenizer) > config.llm["vocab_size"]:
            raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the LLM's vocab_size")
        self.mar = MAR(config.mar)
        llm_config = Qwen2Config(**config.llm)
        llm_config._attn_implementation = attn_implementation
        self.llm = Qwen2ForCausalLM(llm_config)
        width, enc = config.llm["hidden_size"], config.mar.encoder_embed_dim
        self.proj_in = mlp(enc, width, width)
        self.proj_out = mlp(width, width, enc)
        self.seq_len, self.token_dim = config.side**2, config.mar.token_dim

    @property
    def head(self) -> DiffusionHead:
        return self.mar.diffloss

    @property
    def traits(self) -> FamilyTraits:
        return self.config.traits()

    # --- prompts ----------------------------------------------------------------------------------

    def prompt_text(self, prompt: str) -> str:
        return self.config.template.format(input=self.config.prefix.format(prompt=prompt))

    def null_text(self) -> str:
        return self.config.template.format(input=self.config.null_prompt)

    def check_conditions(self, conditions, batch: int, device: torch.device) -> Prompts:
        if isinstance(conditions, Prompts):
            if len(conditions) != batch:
                raise ValueError(f"prompts must hold one prompt per seed ({batch}), got {len(conditions)}")
            return conditions
        if isinstance(conditions, str) or not isinstance(conditions, Sequence):
            raise ValueError("prompts must be a list of strings, one per seed")
        if len(conditions) != batch:
            raise ValueError(f"prompts must hold one prompt per seed ({batch}), got {len(conditions)}")
        texts = [check_prompt(p, i) for i, p in enumerate(conditions)]
        ids, attn = pad_ids(
            [self.tokenizer.encode(self.prompt_text(t)) for t in texts], self.tokenizer.pad_token_id, device
        )
        null = self.tokenizer.encode(self.null_text())
        null_ids, null_attn = pad_ids([null] * batch, self.tokenizer.pad_token_id, device)
        return Prompts(texts, ids, attn, null_ids, null_attn)

    def start(self, conditions: Prompts, config) -> MaskedState:
        """A generation's state: its prompts and settings, LazyMAR's caches and the prompts' keys and values
        empty (each made at the first pass that needs it)."""
        return MaskedState(conditions, config, prompt_kv={})

    def check_draft(self, draft: Harmon) -> None:
        """A draft must read prompts as this model does: the same tokenizer, template and null prompt."""
        if self.tokenizer.to_dict() != draft.tokenizer.to_dict():
            raise ValueError("the text target and draft use different tokenizers")
        for key in ("template", "prefix", "null_prompt"):
            if getattr(self.config, key) != getattr(draft.config, key):
                raise ValueError(f"the text target and draft differ in their prompt {key}")

    # --- backbone -----------------------------------------------------------------------------------

    def backbone(
        self,
        tokens: Tensor,
        mask: Tensor,
        ids: Tensor,
        attn: Tensor,
        prompt_cache: DynamicCache | None = None,
        decoder: DecoderPass | None = None,
        known: int | None = None,
        ragged: bool = False,
    ) -> Tensor:
        """tokens (B, N, d), mask (B, N) True = unknown, prompt ids and attention mask (B, L) ->
        per-position conditions z (B, N, dec).

        ``prompt_cache``: the LLM's keys and values of these prompts (:meth:`prompt_cache`); the pass
        then runs the image rows only, on top of it, and crops the cache back to the prompt after (the
        official sampler's cache). Without it the prompt runs again in the same pass. ``known``: the known
        tokens of every row, where the caller knows them; ``ragged``: rows know different numbers, ``known``
        the most (:meth:`csd.models.mar.MAR.forward_mae_encoder`): the LLM's attention mask leaves out each
        row's padding as it does the prompts' (positions count the rows it keeps)."""
        b, buf = tokens.shape[0], self.config.mar.buffer_size
        x_enc = self.mar.forward_mae_encoder(
            tokens, mask, self.mar.fake_latent.expand(b, -1), known, ragged
        )  # (B, buf+known, enc)
        rows = self.proj_in(x_enc)
        rows = torch.cat([rows[:, buf:], rows[:, :buf]], dim=1)  # the buffer moves to the end
        seen = attn.new_ones(b, rows.shape[1])
        if ragged:
            seen = ~padding(mask, buf, known)
            seen = torch.cat([seen[:, buf:], seen[:, :buf]], dim=1).to(attn.dtype)
        full = torch.cat([attn, seen], dim=1)
        positions = (full.long().cumsum(1) - 1).clamp(min=0)  # image rows continue from the prompt's length
        dtype = self.llm.get_input_embeddings().weight.dtype
        if prompt_cache is None:
            embeds = torch.cat([self.llm.get_input_embeddings()(ids), rows.to(dtype)], dim=1)
            out = self.llm.model(inputs_embeds=embeds, attention_mask=full, position_ids=positions, use_cache=False)
        else:
            width = ids.shape[1]
            out = self.llm.model(
                inputs_embeds=rows.to(dtype),
                attention_mask=full,
                position_ids=positions[:, width:],
                cache=prompt_cache,
                use_cache=True,
            )
            prompt_cache.crop(-rows.shape[1])  # drop the rows just appended
        out = out.last_hidden_state[:, -rows.shape[1] :]
        out = torch.cat([out[:, -buf:], out[:, :-buf]], dim=1)  # and back to the start
        return self.mar.forward_mae_decoder(x_enc + self.proj_out(out).to(x_enc.dtype), mask, decoder, known, ragged)

    def prompt_cache(self, ids: Tensor, attn: Tensor) -> DynamicCache:
        """The LLM's keys and values of the prompts ids, attn (B, L): what every AR step's pass reads
        of them, computed once."""
        positions = (attn.long().cumsum(1) - 1).clamp(min=0)
        out = self.llm.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True)
        return out.cache

    def conditions(
        self,
        tokens: Tensor,
        mask: Tensor,
        prompts: Prompts,
        guided: bool,
        decoder: DecoderPass | None = None,
        prompt_kv: dict[bool, DynamicCache] | None = None,
        known: int | None = None,
        views: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """Conditional z and, when ``guided``, the null prompt's z from one doubled-batch pass.
        ``prompt_kv``: a generation's prompt keys and values per guidance (its state's): made at the first
        pass of each guidance and read by the later ones, which run the image rows only; without it the
        prompts run in the pass. ``known`` as :meth:`backbone`. ``views``: tokens and mask hold that many
        canvases of the batch of ``prompts``, view-major, which may know different numbers of tokens
        (``known``: the most; a ragged pass): each prompt's ids and keys and values serve its image's views."""
        b = tokens.shape[0]
        if guided:
            ids, attn, null_ids, null_attn = prompts.both(self.tokenizer.pad_token_id)
            ids, attn = torch.cat([ids, null_ids]), torch.cat([attn, null_attn])
            tokens, mask = torch.cat([tokens, tokens]), torch.cat([mask, mask])
        else:
            ids, attn = prompts.ids, prompts.attn
        cache = None
        if prompt_kv is not None:
            if guided not in prompt_kv:
                prompt_kv[guided] = self.prompt_cache(ids, attn)
            cache = prompt_kv[guided]
        if views > 1:  # each half's prompts once per view: rows (half, view, image)
            halves = 2 if guided else 1
            index = torch.arange(ids.shape[0], device=ids.device).reshape(halves, 1, -1).expand(-1, views, -1)
            index = index.reshape(-1)
            ids, attn = ids[index], attn[index]
            cache = None if cache is None else cache_rows(cache, index)
        z = self.backbone(tokens, mask, ids, attn, cache, decoder, known, views > 1)
        return (z[:b], z[b:]) if guided else (z, None)

    # --- training -----------------------------------------------------------------------------------

    def forward(
        self,
        tokens: Tensor,
        prompts: Prompts,
        generator: torch.Generator | None = None,
        prompt_only: float = 0.0,
        token_weight: Tensor | None = None,
        teacher: Harmon | None = None,
        distill_weight: float = 1.0,
    ) -> Tensor:
        """The training loss: MAR's random order and mask ratio, the null prompt for a
        ``label_drop_prob`` fraction of the rows (for CFG), the diffusion loss on the masked tokens.

        ``prompt_only``: the share of rows (the first round(B x share); the batch is random) with every
        token masked, where only the prompt can tell the shape's colour and the background; they run as a
        backbone pass of their own, since the encoder needs as many known tokens in every row of a pass.
        ``token_weight`` (B, N): each token's weight in the loss (:meth:`MAR.head_loss`).
        ``teacher``: a frozen text model with the same tokens, caption vocabulary and head schedule; it sees
        the same masks and dropped prompts, and the loss adds ``distill_weight`` times the gap to its head
        (:func:`csd.models.diffusion.distill_loss`)."""
        b, n, _ = tokens.shape
        mask = training_mask(self.config.mar, b, n, generator, tokens.device)
        whole = round(b * prompt_only)
        mask[:whole] = True
        drop = torch.rand((b, 1), generator=generator, device=tokens.device) < self.config.mar.label_drop_prob
        ids, attn, null_ids, null_attn = prompts.both(self.tokenizer.pad_token_id)
        ids, attn = torch.where(drop, null_ids, ids), torch.where(drop, null_attn, attn)
        parts = [slice(0, whole), slice(whole, b)] if 0 < whole < b else [slice(0, b)]
        z = torch.cat([self.backbone(tokens[r], mask[r], ids[r], attn[r]) for r in parts])
        reference = None
        if teacher is not None:
            with torch.no_grad():
                ref = torch.cat([teacher.backbone(tokens[r], mask[r], ids[r], attn[r]) for r in parts])
            reference = (teacher.head, ref)
        return self.mar.head_loss(tokens, z, mask, generator, reference, distill_weight, token_weight)
