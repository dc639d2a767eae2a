"""NextStep-1 (StepFun, 2025): a causal decoder in LLaMA form reads the prompt, then predicts the image one
token at a time in raster order; a flow-matching head samples each token from the decoder's last hidden state.

Per token (the official ``NextStepPipeline.decoding``): the decoder's last hidden state at the position before
the token (the begin-of-image token's for the first), plus the 2-D sin-cos ``gen_pos_embed`` row of the token's
index where the config says so, goes through ``image_out_projector`` and conditions the head
(:mod:`csd.models.nextstep.flow`); the sampled token, layer-normed first where ``use_norm`` says so, goes back in
through ``image_in_projector``, its keys and values appended to the cache.

The module tree is the official one (``embed_tokens``, ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.mlp.{gate,up,down}_proj``, ``layers.{i}.{input,post_attention}_layernorm``, ``norm``, ``lm_head``,
the buffer ``gen_pos_embed``, ``image_in_projector``, ``image_out_projector``, ``image_head.net.*``), so the
official weights load unchanged (:mod:`csd.models.nextstep.official`). Positions are the cache's
(``position_ids = cache_position``: a left-padded prompt's padding counts), as the official decoder's.
Every part computes in the weights' dtype (float64 models in float64 throughout; float32 ones as the official
code, whose RMSNorm, RoPE and softmax work in float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.family import FamilyTraits
from csd.models.head import MLPAdaLN, TimestepEmbedder
from csd.models.nextstep.adapter import NextStepFamily
from csd.models.nextstep.tokens import KVCache, token_norm
from csd.models.spec import SerialConfig

# --- config ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NextStepConfig(SerialConfig):
    """A NextStep model: the official ``NextStepConfig`` fields it runs on (a ``LlamaConfig``'s and the image
    ones), the image it samples (``grid_side`` tokens a side), the official sampler's settings as its defaults
    (``num_sampling_steps``, ``timesteps_shift``, ``last_step_size``, ``use_norm``, ``cfg``) and how prompts
    read (``image_prefix``: the text between the caption and the begin-of-image id, ``{h}``/``{w}`` the token
    grid's sides; ``null_prompt``: CFG's unconditional caption). ``label_drop_prob``: training's share of
    captions dropped to the null prompt."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    boi: int
    eoi: int
    image_placeholder_id: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    o_attention_bias: bool | None = None
    mlp_bias: bool = False
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    latent_size: int = 32
    latent_patch_size: int = 2
    latent_channels: int = 16
    fm_head_dim: int = 1536
    fm_head_layers: int = 12
    use_gen_pos_embed: bool = False
    gen_pos_grid: int = 32  # the official table's side (a 32 x 32 grid, indexed by the token's raster index)
    grid_side: int = 16
    num_sampling_steps: int = 50
    timesteps_shift: float = 1.0
    last_step_size: float = 0.04
    use_norm: bool = False
    cfg: float = 7.5
    image_prefix: str = ""
    null_prompt: str = ""
    label_drop_prob: float = 0.1

    def __post_init__(self) -> None:
        ints = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        for key in (*ints, "intermediate_size", "vocab_size", "latent_patch_size", "latent_channels", "grid_side"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"NextStepConfig.{key} must be an int >= 1, got {getattr(self, key)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("NextStepConfig.num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("NextStepConfig.hidden_size must be a multiple of num_attention_heads (or set head_dim)")
        for key in ("boi", "eoi", "image_placeholder_id"):
            if not 0 <= getattr(self, key) < self.vocab_size:
                raise ValueError(f"NextStepConfig.{key} must be an id in [0, {self.vocab_size - 1}]")
        if not (isinstance(self.num_sampling_steps, int) and self.num_sampling_steps >= 2):
            raise ValueError(f"NextStepConfig.num_sampling_steps must be an int >= 2, got {self.num_sampling_steps!r}")
        if not 0.0 < self.last_step_size < 1.0:
            raise ValueError(f"NextStepConfig.last_step_size must be in (0, 1), got {self.last_step_size!r}")
        if not self.timesteps_shift > 0.0:
            raise ValueError(f"NextStepConfig.timesteps_shift must be > 0, got {self.timesteps_shift!r}")
        if self.use_gen_pos_embed and self.seq_len > self.gen_pos_grid**2:
            raise ValueError(f"NextStepConfig: {self.seq_len} tokens exceed gen_pos_embed's {self.gen_pos_grid}^2")

    @property
    def seq_len(self) -> int:
        return self.grid_side**2

    @property
    def token_dim(self) -> int:
        return self.latent_channels * self.latent_patch_size**2

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def traits(self) -> FamilyTraits:
        return FamilyTraits(
            "NextStep",
            "prompts",
            fixed_num_steps=self.seq_len,
            verifies_in_context=True,
            verifies_next=True,
            min_head_steps=2,
            head_samplers=("euler-maruyama", "euler", "heun"),
            flow_grids=True,
        )


# --- the decoder -------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm, in float32 or the input's dtype where wider (the official one: float32)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin (q, head_dim) of LLaMA's rotary embedding at ``positions`` (q,), made in float32 (float64 for a
    float64 model) and cast to ``dtype``."""
    wide = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(wide) / head_dim))
    freqs = positions.to(wide)[:, None] * inv_freq.to(positions.device)[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with RoPE; ``q_proj``/``k_proj``/``v_proj`` biased per ``attention_bias``,
    ``o_proj`` per ``o_attention_bias`` (Qwen2.5 weights: biased q, k, v, an unbiased output)."""

    def __init__(self, c: NextStepConfig):
        super().__init__()
        hd, heads, kv = c.attention_head_dim, c.num_attention_heads, c.num_key_value_heads
        self.heads, self.kv_heads, self.head_dim = heads, kv, hd
        self.q_proj = nn.Linear(c.hidden_size, heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv * hd, bias=c.attention_bias)
        out_bias = c.attention_bias if c.o_attention_bias is None else c.o_attention_bias
        self.o_proj = nn.Linear(heads * hd, c.hidden_size, bias=out_bias)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None, start: int
    ) -> Tensor:
        """x (B', q, width) at positions start .. start + q - 1; ``mask`` (B', 1, q, start + q) True = attend;
        ``past``: this layer's cache, whose slots [start, start + q) take the new keys and values."""
        b, q, _ = x.shape
        split = lambda t, h: t.reshape(b, q, h, self.head_dim).transpose(1, 2)
        query, key = split(self.q_proj(x), self.heads), split(self.k_proj(x), self.kv_heads)
        value = split(self.v_proj(x), self.kv_heads)
        query, key = query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin
        if past is not None:
            keys, values = past
            keys[:, :, start : start + q] = key
            values[:, :, start : start + q] = value
            key, value = keys[:, :, : start + q], values[:, :, : start + q]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q, -1))


class MLP(nn.Module):
    def __init__(self, c: NextStepConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: NextStepConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, past, start: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, past, start)
        return x + self.mlp(self.post_attention_layernorm(x))


def sincos_table(width: int, side: int) -> Tensor:
    """MAE's 2-D sin-cos position table (1, side * side, width), float32, rows in raster order: each row's first
    half encodes the column, its second half the row (``get_2d_sincos_pos_embed``, whose grid takes w first)."""
    half = width // 2
    omega = 1.0 / 10000 ** (np.arange(half // 2, dtype=np.float64) / (half / 2.0))
    grid_w, grid_h = np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32))

    def encode(pos: np.ndarray) -> np.ndarray:
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    table = np.concatenate([encode(grid_w), encode(grid_h)], axis=1)
    return torch.from_numpy(table).float().unsqueeze(0)


# --- the model ---------------------------------------------------------------------------------------


class WideTimestepEmbedder(TimestepEmbedder):
    """The official ``TimestepEmbedder`` (the same weights and numbers in float32) with its sinusoid made in
    float64 for float64 times, where the official code rounds t and its frequencies to float32: a float64
    model's velocity then rounds as float64 does, on every CPU (float32 cos/sin differ between CPUs' vector
    kernels by an ulp, 1e-9 of the velocity)."""

    def forward(self, t: Tensor) -> Tensor:
        wide, half = torch.promote_types(t.dtype, torch.float32), self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=wide, device=t.device) / half)
        args = t[:, None].to(wide) * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(emb.to(self.mlp[0].weight.dtype))


class FlowMatchingHead(nn.Module):
    """The official flow-matching head's module: its network (``net``, an MLP with AdaLN: (x_t, t, c) -> the
    velocity; its time embedding :class:`WideTimestepEmbedder`); its sampler is
    :class:`csd.models.nextstep.flow.FlowChain`."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int):
        super().__init__()
        self.token_dim = token_dim
        self.net = MLPAdaLN(
            token_dim, cond_dim, width, depth, out_channels=token_dim, time_embedder=WideTimestepEmbedder
        )


class NextStep(NextStepFamily, nn.Module):
    """The network (official module tree) and, mixed in, its :class:`csd.family.ModelFamily` methods."""

    def __init__(self, config: NextStepConfig, tokenizer):
        super().__init__()
        c = self.config = config
        self.tokenizer = tokenizer
        if len(tokenizer) > c.vocab_size:
            raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the model's vocab_size")
        self.seq_len, self.token_dim = c.seq_len, c.token_dim
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.register_buffer("gen_pos_embed", sincos_table(c.hidden_size, c.gen_pos_grid))
        self.image_in_projector = nn.Linear(c.token_dim, c.hidden_size)
        self.image_out_projector = nn.Linear(c.hidden_size, c.hidden_size)
        self.image_head = FlowMatchingHead(c.token_dim, c.hidden_size, c.fm_head_dim, c.fm_head_layers)
        self._init_weights()

    def _init_weights(self) -> None:
        """The official initialisation: normal(0.02) linear and embedding weights, zero biases, then the head's own
        (xavier, its modulations and output zeroed)."""
        for module in self.modules():
            if module is self.image_head:
                break
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for proj in (self.image_in_projector, self.image_out_projector):
            nn.init.normal_(proj.weight, std=0.02)
            nn.init.zeros_(proj.bias)
        self.image_head.net._init_weights()

    @property
    def traits(self) -> FamilyTraits:
        return self.config.traits()

    @property
    def dtype(self) -> torch.dtype:
        return self.image_in_projector.weight.dtype

    # --- the decoder's passes ---------------------------------------------------------------------------

    def decode(self, embeds: Tensor, start: int, cache: KVCache | None = None, valid: Tensor | None = None) -> Tensor:
        """The decoder's final hidden states (B', q, width) of ``embeds`` (B', q, width) at positions start ..
        start + q - 1, each reading the positions before it and itself: those in ``cache`` (whose slots of these
        positions take their keys and values) and ``valid`` (B', start + q) of them (None: all)."""
        b, q, _ = embeds.shape
        positions = torch.arange(start, start + q, device=embeds.device)
        cos, sin = rope(positions, self.config.attention_head_dim, self.config.rope_theta, embeds.dtype)
        keys = torch.arange(start + q, device=embeds.device)
        causal = positions[:, None] >= keys[None]  # (q, start + q)
        if valid is None:
            valid = cache.valid[:, : start + q] if cache is not None else torch.ones_like(causal[:1])
        # a padding query reads itself (no row of the softmax is empty); no other query reads padding
        mask = ((causal[None] & valid[:, None]) | (positions[:, None] == keys[None])).unsqueeze(1)
        x = embeds
        for i, layer in enumerate(self.layers):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x = layer(x, cos, sin, mask, past, start)
        return self.norm(x)

    def image_embeds(self, tokens: Tensor) -> Tensor:
        """Tokens (B, k, d) as the decoder's inputs (B, k, width). Under ``use_norm`` the canvas holds the head's
        tokens and the model reads them layer-normed (:func:`token_norm`), which is what the official sampler
        feeds back and returns."""
        tokens = token_norm(tokens) if self.config.use_norm else tokens
        return self.image_in_projector(tokens.to(self.dtype))

    def head_conditions(self, hidden: Tensor, first: int) -> Tensor:
        """The head's conditions of tokens first, first + 1, ... from the hidden states before them (B', k,
        width): ``image_out_projector`` of them, after the ``gen_pos_embed`` rows of those tokens where set."""
        if self.config.use_gen_pos_embed:
            hidden = hidden + self.gen_pos_embed[:, first : first + hidden.shape[1]].to(hidden.dtype)
        return self.image_out_projector(hidden)

    # --- training ---------------------------------------------------------------------------------------

    def forward(
        self,
        tokens: Tensor,
        prompts,
        generator: torch.Generator | None = None,
        teacher: NextStep | None = None,
        distill_weight: float = 1.0,
        token_weight: Tensor | None = None,
    ) -> Tensor:
        """The training loss: the caption dropped to the null prompt for a ``label_drop_prob`` share of the
        rows (for CFG), the prompt then every image token but the last in one causal pass, and the head's flow
        matching on every token given the hidden state before it (the official loss: t logit-normal, x_t = t x
        + (1 - t) noise, velocity x - noise). ``teacher``: a frozen model of the same layout; the loss adds
        ``distill_weight`` times the mean squared gap to its velocity at the same (x_t, t). ``token_weight``
        (B, N): each token's weight in the loss (None: alike)."""
        b, n, d = tokens.shape
        drop = torch.rand((b,), generator=generator, device=tokens.device) < self.config.label_drop_prob
        ids, valid = prompts.training_rows(drop)
        z = self._training_conditions(tokens, ids, valid)
        x0 = tokens.reshape(b * n, d)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        u = torch.randn((b * n,), generator=generator, device=x0.device, dtype=x0.dtype)
        t = torch.sigmoid(u)
        x_t = t[:, None] * x0 + (1 - t[:, None]) * noise
        v = self.image_head.net(x_t, t, z)
        per_token = (v.float() - (x0 - noise).float()).pow(2).mean(-1)  # (B * N,)
        if teacher is not None:
            with torch.no_grad():
                ref = teacher.image_head.net(x_t, t, teacher._training_conditions(tokens, ids, valid))
            per_token = per_token + distill_weight * (v.float() - ref.float()).pow(2).mean(-1)
        if token_weight is None:
            return per_token.mean()
        w = token_weight.reshape(-1).float()
        return (per_token * w).sum() / w.sum()

    def _training_conditions(self, tokens: Tensor, ids: Tensor, valid: Tensor) -> Tensor:
        """The head's conditions (B * N, width) of every token from one causal pass over the prompt rows
        (B, W) (the begin-of-image id last) and the tokens but the last."""
        b, n, _ = tokens.shape
        embeds = torch.cat([self.embed_tokens(ids), self.image_embeds(tokens[:, :-1])], dim=1)
        valid = torch.cat([valid, valid.new_ones(b, n - 1)], dim=1)
        hidden = self.decode(embeds, 0, valid=valid)[:, ids.shape[1] - 1 :]  # (B, N, width)
        return self.head_conditions(hidden, 0).reshape(b * n, -1)


# --- named configs -------------------------------------------------------------------------------------

# NextStep-1-Large: Qwen2.5-14B's decoder shape (the published NextStep config.json: hidden 5120, 48 layers, 40
# heads of 128, 8 KV heads, intermediate 13824, biased q/k/v and an unbiased output, RMSNorm eps 1e-5, special
# ids 151667-151669), the 157M flow head (12 blocks of 1536), FLUX VAE latents (16 channels, 2 x 2 patches) at
# 512 px (a 32 x 32 token grid), and the sampler of the official example (cfg 7.5 constant, 50 steps, shift 1,
# use_norm). vocab_size and rope_theta are Qwen2.5's; a checkpoint's config.json wins over all of these.
_LARGE = dict(
    hidden_size=5120,
    num_hidden_layers=48,
    num_attention_heads=40,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=13824,
    vocab_size=152064,
    boi=151667,
    eoi=151668,
    image_placeholder_id=151669,
    rms_norm_eps=1e-5,
    rope_theta=1_000_000.0,
    attention_bias=True,
    o_attention_bias=False,
    max_position_embeddings=131072,
    latent_size=64,
    grid_side=32,
    use_norm=True,
    cfg=7.5,
    image_prefix="<|image_area|>{h}*{w}",
)
# Untrained test sizes over a small vocabulary (the shapes captions' 36 ids fit): 32 x 32 RGB images in 4 x 4
# tokens of 8 x 8 pixels (16 AR steps, as the tests' own causal family).
_RANDOM = dict(
    vocab_size=64,
    boi=61,
    eoi=62,
    image_placeholder_id=63,
    latent_channels=3,
    latent_patch_size=8,
    latent_size=32,
    grid_side=4,
    num_sampling_steps=4,
    cfg=3.0,
)
NEXTSTEP_CONFIGS: dict[str, NextStepConfig] = {
    "nextstep_1_large": NextStepConfig(**_LARGE),
    "random_nextstep_target": NextStepConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        fm_head_dim=32,
        fm_head_layers=2,
        **_RANDOM,
    ),
    "random_nextstep_draft": NextStepConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        fm_head_dim=16,
        fm_head_layers=1,
        **_RANDOM,
    ),
}
