"""MAR: masked autoregressive image model with a diffusion token head (Li et al., 2024), the network.

Same module tree and parameter names as the official implementation, so official
``checkpoint-last.pth`` files load unchanged (:mod:`csd.models.mar.official`). The model only
computes; the samplers see it through :class:`csd.models.mar.adapter.MaskedARFamily`, and the
generation loops live in :mod:`csd.sampling` and :mod:`csd.speculative`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.family import FamilyTraits
from csd.models.head import DiffusionHead
from csd.models.mar.adapter import MaskedARFamily
from csd.models.mar.token_cache import DecoderPass, run_decoder
from csd.models.spec import SerialConfig
from csd.models.transformer import Block


@dataclass(frozen=True)
class MARConfig(SerialConfig):
    """Architecture of a MAR model. ``token_channels`` is the tokenizer's channels per cell
    (16 for KL-16 latents, 3 for pixels); a token is ``token_channels * patch_size**2`` wide."""

    img_size: int = 256
    vae_stride: int = 16
    patch_size: int = 1
    token_channels: int = 16
    encoder_embed_dim: int = 1024
    encoder_depth: int = 16
    encoder_num_heads: int = 16
    decoder_embed_dim: int = 1024
    decoder_depth: int = 16
    decoder_num_heads: int = 16
    mlp_ratio: float = 4.0
    class_num: int = 1000
    buffer_size: int = 64
    label_drop_prob: float = 0.1
    attn_dropout: float = 0.1
    proj_dropout: float = 0.1
    mask_ratio_min: float = 0.7
    # Training mask ratios: N(1, mask_ratio_std^2) truncated to [mask_ratio_min, 1]. MAR's 0.25 (with min 0.7)
    # never shows the model more than 30% of the tokens, yet sampling ends with almost all of them known.
    mask_ratio_std: float = 0.25
    diffloss_d: int = 3
    diffloss_w: int = 1024
    num_sampling_steps: int = 100
    diffusion_batch_mul: int = 4
    clip_x0: float | None = None  # clip predicted x0 to [-c, c]: for bounded (pixel) tokens only

    def __post_init__(self) -> None:
        positive = (
            "img_size",
            "vae_stride",
            "patch_size",
            "token_channels",
            "encoder_embed_dim",
            "encoder_depth",
            "encoder_num_heads",
            "decoder_embed_dim",
            "decoder_depth",
            "decoder_num_heads",
            "class_num",
            "diffloss_d",
            "diffloss_w",
            "num_sampling_steps",
            "diffusion_batch_mul",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MARConfig.{name} must be an int >= 1, got {value!r}")
        if self.img_size % (self.vae_stride * self.patch_size):
            raise ValueError(
                f"MARConfig.img_size ({self.img_size}) must be a multiple of vae_stride * patch_size "
                f"({self.vae_stride * self.patch_size})"
            )
        for name in ("encoder", "decoder"):
            dim, heads = getattr(self, f"{name}_embed_dim"), getattr(self, f"{name}_num_heads")
            if dim % heads:
                raise ValueError(f"MARConfig.{name}_embed_dim ({dim}) must be divisible by {name}_num_heads ({heads})")
        if self.buffer_size < 1:
            raise ValueError(f"MARConfig.buffer_size must be >= 1 (it carries the class), got {self.buffer_size}")
        for name in ("label_drop_prob", "attn_dropout", "proj_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"MARConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.mask_ratio_min <= 1.0:
            raise ValueError(f"MARConfig.mask_ratio_min must be in (0, 1], got {self.mask_ratio_min}")
        if not (math.isfinite(self.mask_ratio_std) and 0.0 < self.mask_ratio_std <= 10.0):
            raise ValueError(f"MARConfig.mask_ratio_std must be in (0, 10], got {self.mask_ratio_std}")
        if not 1 <= self.num_sampling_steps <= 1000:
            raise ValueError(f"MARConfig.num_sampling_steps must be in [1, 1000], got {self.num_sampling_steps}")
        if self.clip_x0 is not None and self.clip_x0 <= 0:
            raise ValueError(f"MARConfig.clip_x0 must be > 0 or None, got {self.clip_x0}")

    @property
    def seq_side(self) -> int:
        return self.img_size // self.vae_stride // self.patch_size

    @property
    def seq_len(self) -> int:
        return self.seq_side**2

    @property
    def token_dim(self) -> int:
        return self.token_channels * self.patch_size**2

    def traits(self) -> FamilyTraits:
        return FamilyTraits(
            "MAR",
            "classes",
            num_classes=self.class_num,
            caches_guidance=True,
            caches_tokens=True,
            head_samplers=("ddpm", "ddim"),
            takes_gtr=True,
        )


def _vit(dim: int, depth: int, heads: int) -> dict:
    return dict(
        encoder_embed_dim=dim,
        encoder_depth=depth,
        encoder_num_heads=heads,
        decoder_embed_dim=dim,
        decoder_depth=depth,
        decoder_num_heads=heads,
    )


# What the embedded pair shares: 32x32 RGB images as 4x4 pixel patches, 10 shape classes.
_PIXEL_SHAPES = dict(
    img_size=32,
    vae_stride=1,
    patch_size=4,
    token_channels=3,
    class_num=10,
    buffer_size=4,
    attn_dropout=0.0,
    proj_dropout=0.0,
    num_sampling_steps=25,
    diffusion_batch_mul=2,
    clip_x0=1.0,
    # Near-uniform mask ratios in [0.05, 1] instead of MAR's [0.7, 1]: with 64 tokens, MAR's range never
    # shows more than 19 known tokens, and the models stopped using context beyond that (csd.shapes.probe).
    mask_ratio_min=0.05,
    mask_ratio_std=1.0,
)


def tiny_pixel_config(width: int, depth: int) -> MARConfig:
    """A tiny pixel MAR in the embedded layout (32x32 RGB, 4x4 patches: N = 64, d = 48, 10 classes): the
    untrained pairs of tests and of a server with no weights."""
    pixels = dict(img_size=32, vae_stride=1, patch_size=4, token_channels=3, class_num=10, buffer_size=4, clip_x0=1.0)
    return MARConfig(**pixels, **_vit(width, depth, 2), diffloss_d=1, diffloss_w=width, num_sampling_steps=10)


# Official sizes (ImageNet 256, KL-16 latents); head depth x width as in the MAR README.
MAR_CONFIGS: dict[str, MARConfig] = {
    "mar_base": MARConfig(**_vit(768, 12, 12), diffloss_d=6, diffloss_w=1024),
    "mar_large": MARConfig(**_vit(1024, 16, 16), diffloss_d=8, diffloss_w=1280),
    "mar_huge": MARConfig(**_vit(1280, 20, 16), diffloss_d=12, diffloss_w=1536),
    # A few-thousand-parameter model for unit tests (KL-16-like 16-channel tokens, 4x4 grid).
    "mar_test": MARConfig(
        img_size=64,
        **_vit(32, 1, 2),
        class_num=10,
        buffer_size=4,
        diffloss_d=1,
        diffloss_w=32,
        num_sampling_steps=10,
    ),
    # The embedded pair: 4x4 RGB pixel patches of 32x32 shapes images (N = 64 tokens, d = 48), trained
    # on a CPU (assets/models/TRAINING.md). Pixel tokens are bounded, so x0 is clipped to [-1, 1]; no
    # dropout in this data-rich regime; 25 head steps keep CPU sampling quick. The presets are the
    # shipped models' architectures (the target grew from 6 + 6 to 10 + 10 blocks in training); the
    # target's head is narrower than its backbone because in CSD it still runs on every token.
    "shapes_target": MARConfig(**_vit(192, 10, 6), **_PIXEL_SHAPES, diffloss_d=3, diffloss_w=160),
    "shapes_draft": MARConfig(**_vit(128, 2, 4), **_PIXEL_SHAPES, diffloss_d=2, diffloss_w=128),
    # Untrained pixel pairs (random weights): target wider and deeper than the draft.
    "random_target": tiny_pixel_config(64, 2),
    "random_draft": tiny_pixel_config(32, 1),
}


def mar_config(name: str, **overrides) -> MARConfig:
    if name not in MAR_CONFIGS:
        raise ValueError(f"unknown MAR config {name!r}; choose from {sorted(MAR_CONFIGS)}")
    return replace(MAR_CONFIGS[name], **overrides)


def truncated_normal_ratio(
    mask_ratio_min: float, generator: torch.Generator | None, device, std: float = 0.25
) -> float:
    """MAR's training mask ratio: N(1, std^2) truncated to [mask_ratio_min, 1] (inverse CDF); MAR's std is 0.25."""
    lo = (mask_ratio_min - 1.0) / std
    cdf = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
    u = torch.rand((), generator=generator, device=device).item()
    p = cdf(lo) + u * (cdf(0.0) - cdf(lo))
    x = math.sqrt(2.0) * torch.erfinv(torch.tensor(2.0 * p - 1.0, dtype=torch.float64)).item()
    return min(1.0, max(mask_ratio_min, 1.0 + std * x))


def training_mask(config: MARConfig, batch: int, n: int, generator: torch.Generator | None, device) -> Tensor:
    """MAR's training mask (B, N), True = masked: a random order per image, and one truncated-normal mask
    ratio for the batch (:func:`truncated_normal_ratio`)."""
    orders = torch.argsort(torch.rand((batch, n), generator=generator, device=device), dim=1)
    ratio = truncated_normal_ratio(config.mask_ratio_min, generator, device, config.mask_ratio_std)
    mask = torch.zeros(batch, n, dtype=torch.bool, device=device)
    mask.scatter_(1, orders[:, : math.ceil(n * ratio)], True)
    return mask


def kept_index(mask: Tensor, buffer: int, known: int) -> Tensor:
    """The positions the encoder keeps, in order: the ``buffer`` rows, then every known token (``~mask``
    (B, N), ``known`` of them in each row; a row that knows fewer, in a ragged pass, then unknown positions:
    its padding, :func:`padding`): (B, buffer + known), found on the device (a stable sort puts the kept
    positions first, each in its place), so the host reads nothing."""
    keep = torch.cat([mask.new_ones(mask.shape[0], buffer), ~mask], dim=1).to(torch.uint8)
    return keep.sort(dim=1, descending=True, stable=True).indices[:, : buffer + known]


def padding(mask: Tensor, buffer: int, known: int) -> Tensor:
    """(B, buffer + known) True at the kept rows past a row's own buffer and known tokens: the padding of a
    ragged pass, whose rows (``~mask`` (B, N)) know ``known`` tokens at most (found on the device)."""
    own = buffer + (~mask).sum(1, keepdim=True)
    return torch.arange(buffer + known, device=mask.device) >= own


def keep_rows(x: Tensor, mask: Tensor, buffer: int, known: int | None) -> Tensor:
    """The rows of x (B, buffer + N, D) the encoder keeps: the buffer and the known tokens, (B, buffer + known,
    D), padded where a row knows fewer (:func:`kept_index`); found by the mask on the host where ``known`` is
    None (boolean indexing, as the official code: every row must know as many)."""
    if known is None:
        keep = torch.cat([mask.new_ones(mask.shape[0], buffer), ~mask], dim=1)
        return x[keep].reshape(x.shape[0], -1, x.shape[-1])
    return x.gather(1, kept_index(mask, buffer, known)[..., None].expand(-1, -1, x.shape[-1]))


def place_rows(full: Tensor, x: Tensor, mask: Tensor, buffer: int, known: int | None, ragged: bool = False) -> Tensor:
    """``full`` (B, buffer + N, D) with the kept rows x (B, buffer + known, D) put back in their places (the
    inverse of :func:`keep_rows`; a new tensor). ``ragged``: rows may know fewer than ``known`` tokens; their
    padding rows leave ``full`` as it was."""
    if known is None:
        keep = torch.cat([mask.new_ones(mask.shape[0], buffer), ~mask], dim=1)
        full = full.clone()
        full[keep] = x.reshape(-1, x.shape[-1])
        return full
    index = kept_index(mask, buffer, known)[..., None].expand(-1, -1, x.shape[-1])
    if ragged:
        x = torch.where(padding(mask, buffer, known)[..., None], full.gather(1, index), x)
    return full.scatter(1, index, x)


def resize_grid(pos: Tensor, side: int, buffer: int) -> Tensor:
    """Position embeddings (1, buffer + s*s, D) for a side x side token grid: the buffer rows kept, the
    image rows resized bilinearly (as Harmon does for 512 px, a 32 x 32 grid of a 16 x 16 MAR)."""
    grid = pos[:, buffer:]
    s = math.isqrt(grid.shape[1])
    if s == side:
        return pos
    image = grid.reshape(1, s, s, -1).permute(0, 3, 1, 2)
    image = F.interpolate(image, size=(side, side), mode="bilinear").permute(0, 2, 3, 1).reshape(1, side * side, -1)
    return torch.cat([pos[:, :buffer], image], dim=1)


class MAR(MaskedARFamily, nn.Module):
    def __init__(self, config: MARConfig):
        super().__init__()
        c = self.config = config
        self.seq_len, self.token_dim = c.seq_len, c.token_dim
        enc, dec = c.encoder_embed_dim, c.decoder_embed_dim

        self.class_emb = nn.Embedding(c.class_num, enc)
        self.fake_latent = nn.Parameter(torch.zeros(1, enc))  # the "no class" embedding for CFG

        self.z_proj = nn.Linear(c.token_dim, enc)
        self.z_proj_ln = nn.LayerNorm(enc, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len + c.buffer_size, enc))
        self.encoder_blocks = nn.ModuleList(
            Block(enc, c.encoder_num_heads, c.mlp_ratio, c.attn_dropout, c.proj_dropout) for _ in range(c.encoder_depth)
        )
        self.encoder_norm = nn.LayerNorm(enc, eps=1e-6)

        self.decoder_embed = nn.Linear(enc, dec)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len + c.buffer_size, dec))
        self.decoder_blocks = nn.ModuleList(
            Block(dec, c.decoder_num_heads, c.mlp_ratio, c.attn_dropout, c.proj_dropout) for _ in range(c.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(dec, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, dec))
        self._init_weights()

        self.diffloss = DiffusionHead(
            c.token_dim, dec, c.diffloss_w, c.diffloss_d, sampling_steps=c.num_sampling_steps, clip_x0=c.clip_x0
        )

    def _init_weights(self) -> None:
        for p in (
            self.class_emb.weight,
            self.fake_latent,
            self.mask_token,
            self.encoder_pos_embed_learned,
            self.decoder_pos_embed_learned,
            self.diffusion_pos_embed_learned,
        ):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def head(self) -> DiffusionHead:
        return self.diffloss

    @property
    def traits(self) -> FamilyTraits:
        return self.config.traits()

    # --- backbone ------------------------------------------------------------------------------

    def class_embedding(self, labels: Tensor | None, batch: int | None = None) -> Tensor:
        """(B, enc) embeddings of class ids; ``labels=None`` gives the unconditional embedding."""
        if labels is None:
            return self.fake_latent.expand(batch, -1)
        # checked on the device (reading the labels back would make the host wait for it): a RuntimeError
        # naming the range where one is out of it (a run's labels are checked before it starts, by the family)
        in_range = ((labels >= 0) & (labels < self.config.class_num)).all()
        torch._assert_async(in_range, f"class labels must be in [0, {self.config.class_num - 1}]")
        return self.class_emb(labels)

    def _side(self, tokens: Tensor) -> int:
        side = math.isqrt(tokens.shape[1])
        if side * side != tokens.shape[1]:
            raise ValueError(f"tokens must form a square grid, got {tokens.shape[1]} per image")
        return side

    def forward_mae_encoder(
        self, tokens: Tensor, mask: Tensor, class_emb: Tensor, known: int | None = None, ragged: bool = False
    ) -> Tensor:
        """tokens (B, N, d), mask (B, N) True = unknown, class_emb (B, enc) -> (B, buffer + known, enc).

        Every row must have the same number of known tokens (true for MAR's schedules); ``known``, that
        number where the caller knows it (a decoding loop does), gathers them without reading the mask on the
        host (:func:`kept_index`); None reads it (boolean indexing, as the official code does). ``ragged``:
        rows know different numbers of tokens, ``known`` the most; each row's kept rows are padded to it and
        attention does not read the padding (:func:`padding`), so every row gets the numbers it would alone.
        A grid other than the model's own (N != seq_len) takes resized position embeddings (:func:`resize_grid`)."""
        b = tokens.shape[0]
        x = self.z_proj(tokens)
        buf = self.config.buffer_size
        x = torch.cat([class_emb.unsqueeze(1).expand(b, buf, -1).to(x.dtype), x], dim=1)
        x = self.z_proj_ln(x + resize_grid(self.encoder_pos_embed_learned, self._side(tokens), buf))
        x = keep_rows(x, mask, buf, known)
        seen = ~padding(mask, buf, known) if ragged else None
        for block in self.encoder_blocks:
            x = block(x, seen)
        return self.encoder_norm(x)

    def forward_mae_decoder(
        self, x: Tensor, mask: Tensor, decoder: DecoderPass | None = None, known: int | None = None, ragged=False
    ) -> Tensor:
        """Encoder output and mask -> per-position conditions z (B, N, dec). ``decoder``: this pass under
        LazyMAR's token cache (:mod:`csd.models.mar.token_cache`); ``known`` and ``ragged`` as
        :meth:`forward_mae_encoder` (the padding is not placed)."""
        b = x.shape[0]
        x = self.decoder_embed(x)
        buf = self.config.buffer_size
        empty = self.mask_token.to(x.dtype).expand(b, buf + mask.shape[1], -1)
        full = place_rows(empty, x, mask, buf, known, ragged)
        side = self._side(mask.unsqueeze(-1))
        x = full + resize_grid(self.decoder_pos_embed_learned, side, buf)
        if decoder is not None:
            x = run_decoder(self.decoder_blocks, x, mask, buf, decoder)
        else:
            for block in self.decoder_blocks:
                x = block(x)
        return self.decoder_norm(x)[:, buf:] + resize_grid(self.diffusion_pos_embed_learned, side, 0)

    def backbone(
        self,
        tokens: Tensor,
        mask: Tensor,
        class_emb: Tensor,
        decoder: DecoderPass | None = None,
        known=None,
        ragged=False,
    ) -> Tensor:
        """One backbone pass (encoder then decoder): per-position conditions z (B, N, dec); ``known`` and
        ``ragged`` as :meth:`forward_mae_encoder`."""
        x = self.forward_mae_encoder(tokens, mask, class_emb, known, ragged)
        return self.forward_mae_decoder(x, mask, decoder, known, ragged)

    def conditions(
        self, tokens: Tensor, mask: Tensor, labels: Tensor, guided: bool, decoder=None, known=None, views: int = 1
    ) -> tuple[Tensor, Tensor | None]:
        """Conditional z and, when ``guided``, unconditional z from one doubled-batch pass; ``known`` as
        :meth:`forward_mae_encoder`. ``views``: tokens and mask hold that many canvases of the batch of
        ``labels``, view-major, which may know different numbers of tokens (``known``: the most; a ragged
        pass)."""
        b = tokens.shape[0]
        cond = self.class_embedding(labels) if views == 1 else self.class_embedding(labels).repeat(views, 1)
        if not guided:
            return self.backbone(tokens, mask, cond, decoder, known, views > 1), None
        twice = lambda t: torch.cat([t, t])
        cond = torch.cat([cond, self.class_embedding(None, b)])
        z = self.backbone(twice(tokens), twice(mask), cond, decoder, known, views > 1)
        return z[:b], z[b:]

    # --- training ------------------------------------------------------------------------------

    def forward(
        self,
        tokens: Tensor,
        labels: Tensor,
        generator: torch.Generator | None = None,
        teacher: MAR | None = None,
        distill_weight: float = 1.0,
    ) -> Tensor:
        """MAR training loss for clean tokens (B, N, d) and labels (B,): random order and mask ratio,
        label dropout for CFG, diffusion loss on the masked tokens.

        teacher: a frozen model with the same tokens and head schedule. It sees the same masks and label
        dropout, and the loss adds ``distill_weight`` times the gap to its head (csd.models.diffusion.distill_loss)."""
        b, n, _ = tokens.shape
        dev = tokens.device
        mask = training_mask(self.config, b, n, generator, dev)
        class_emb = self.class_embedding(labels)
        drop = torch.rand((b, 1), generator=generator, device=dev) < self.config.label_drop_prob
        class_emb = torch.where(drop, self.fake_latent.expand(b, -1), class_emb)

        z = self.backbone(tokens, mask, class_emb)
        reference = None
        if teacher is not None:
            with torch.no_grad():
                t_emb = torch.where(drop, teacher.fake_latent.expand(b, -1), teacher.class_embedding(labels))
                reference = (teacher.diffloss, teacher.backbone(tokens, mask, t_emb))
        return self.head_loss(tokens, z, mask, generator, reference, distill_weight)

    def head_loss(
        self,
        tokens: Tensor,
        z: Tensor,
        mask: Tensor,
        generator: torch.Generator | None,
        reference: tuple[DiffusionHead, Tensor] | None = None,
        distill_weight: float = 1.0,
        token_weight: Tensor | None = None,
    ) -> Tensor:
        """The diffusion loss of the masked tokens (B, N, d) given their conditions z (B, N, D), each row
        repeated ``diffusion_batch_mul`` times; ``reference``: a teacher's head and its z, to match too;
        ``token_weight`` (B, N): each token's weight in the mean (None: all alike)."""
        b, n, _ = tokens.shape
        mul = self.config.diffusion_batch_mul
        rows = lambda a: a.reshape(b * n, -1).repeat(mul, 1)
        weight = mask if token_weight is None else mask * token_weight
        weight = weight.reshape(b * n).repeat(mul).to(tokens.dtype)
        if reference is not None:
            reference = (reference[0], rows(reference[1]))
        loss = self.diffloss.loss(rows(tokens), rows(z), generator, reference, distill_weight)
        return (loss * weight).sum() / weight.sum()
