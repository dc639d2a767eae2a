"""KL-regularised convolutional autoencoder ("KL-16") used by MAR as its image tokenizer.

The architecture follows the LDM ``AutoencoderKL`` that MAR ships (checkpoint ``kl16.ckpt``):
a ResNet encoder that downsamples by ``2 ** (len(ch_mult) - 1)`` (16 for the official config),
a diagonal-Gaussian posterior with ``embed_dim`` channels, and a mirrored ResNet decoder.
Module and parameter names are chosen so that the official state dict loads with
``strict=True``: ``encoder.*``, ``decoder.*``, ``quant_conv.*``, ``post_quant_conv.*``.

MAR works on *scaled* latents ("tokens"): ``tokens = sample * 0.2325`` and
``image = decode(tokens / 0.2325)``; see :meth:`KLAutoencoder.image_to_tokens` and
:meth:`KLAutoencoder.tokens_to_image`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from csd.core.checks import check_int, is_int
from csd.models.checkpoint import CheckpointError, load_state_strict, safe_torch_load

__all__ = [
    "VAEConfig",
    "VAE_CONFIGS",
    "KLAutoencoder",
    "load_kl16",
]

# Bounds applied to the posterior log-variance, as in the official model: keeps exp() finite.
LOGVAR_MIN = -30.0
LOGVAR_MAX = 20.0
TRAINING_ONLY_PREFIX = "loss."


def _check_int(name: str, value: object, low: int) -> None:
    check_int(f"VAEConfig.{name}", value, low, word="an integer")


def _check_int_tuple(name: str, value: tuple, low: int, allow_empty: bool) -> None:
    if not allow_empty and len(value) == 0:
        raise ValueError(f"VAEConfig.{name} must be a non-empty tuple of integers >= {low}, got {value!r}")
    for v in value:
        if not is_int(v) or v < low:
            raise ValueError(f"VAEConfig.{name} must contain only integers >= {low}, got {value!r}")


@dataclass(frozen=True)
class VAEConfig:
    """Hyper-parameters of :class:`KLAutoencoder`. Defaults are the official MAR ``kl16`` model."""

    embed_dim: int = 16  # latent channels (z_channels == embed_dim in MAR)
    ch: int = 128  # base width; level i has ch * ch_mult[i] channels
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2  # per encoder level; the decoder uses num_res_blocks + 1
    in_channels: int = 3
    out_channels: int = 3
    resolution: int = 256  # nominal image size; only decides where attention blocks go
    encoder_attn_resolutions: tuple[int, ...] = (16,)
    decoder_attn_resolutions: tuple[int, ...] = ()
    num_groups: int = 32  # GroupNorm groups; must divide every width
    dropout: float = 0.0
    latent_scale: float = 0.2325  # MAR multiplies posterior samples by this

    def __post_init__(self) -> None:
        # Accept lists (e.g. from JSON) but store tuples so the config stays hashable.
        for name in ("ch_mult", "encoder_attn_resolutions", "decoder_attn_resolutions"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
            elif not isinstance(value, tuple):
                raise ValueError(f"VAEConfig.{name} must be a tuple of integers, got {value!r}")

        _check_int("embed_dim", self.embed_dim, 1)
        _check_int("ch", self.ch, 1)
        _check_int_tuple("ch_mult", self.ch_mult, 1, allow_empty=False)
        _check_int("num_res_blocks", self.num_res_blocks, 1)
        _check_int("in_channels", self.in_channels, 1)
        _check_int("out_channels", self.out_channels, 1)
        _check_int("resolution", self.resolution, 1)
        _check_int_tuple("encoder_attn_resolutions", self.encoder_attn_resolutions, 1, allow_empty=True)
        _check_int_tuple("decoder_attn_resolutions", self.decoder_attn_resolutions, 1, allow_empty=True)
        _check_int("num_groups", self.num_groups, 1)

        factor = self.downsample_factor
        if self.resolution % factor != 0:
            raise ValueError(
                f"VAEConfig.resolution must be a multiple of the downsample factor {factor} "
                f"(2 ** (len(ch_mult) - 1)), got {self.resolution}"
            )
        bad = sorted({self.ch * m for m in self.ch_mult if (self.ch * m) % self.num_groups != 0})
        if bad:
            raise ValueError(
                f"VAEConfig.num_groups must divide every width ch * ch_mult[i]; "
                f"num_groups={self.num_groups} does not divide {bad}"
            )
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"VAEConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.latent_scale, (int, float)) or not float(self.latent_scale) > 0.0:
            raise ValueError(f"VAEConfig.latent_scale must be > 0, got {self.latent_scale!r}")

    @property
    def downsample_factor(self) -> int:
        """Spatial stride between image and latent (16 for kl16)."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def latent_size(self) -> int:
        """Latent side length for an image of size ``resolution``."""
        return self.resolution // self.downsample_factor

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


VAE_CONFIGS: dict[str, VAEConfig] = {
    # Official MAR tokenizer: 256px -> 16x16x16 latents, ~66M parameters.
    "kl16": VAEConfig(),
    # Test-sized model: 32px -> 16x16x4 latents; attention at 16px so the attention path is exercised.
    "tiny": VAEConfig(
        embed_dim=4,
        ch=32,
        ch_mult=(1, 2),
        num_res_blocks=1,
        resolution=32,
        encoder_attn_resolutions=(16,),
        decoder_attn_resolutions=(16,),
        num_groups=8,
    ),
}


# --------------------------------------------------------------------------------------------
# Building blocks. Attribute names (norm1, conv1, nin_shortcut, q/k/v/proj_out, ...) are part of
# the checkpoint format and must not be renamed.
# --------------------------------------------------------------------------------------------


def _group_norm(channels: int, groups: int) -> nn.GroupNorm:
    # eps=1e-6 matches the trained weights (the PyTorch default 1e-5 would shift activations).
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class _ResBlock(nn.Module):
    """Pre-activation residual block: (GN, SiLU, conv3x3) x 2, 1x1 projection when widths differ."""

    def __init__(self, in_ch: int, out_ch: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = _group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        self.norm2 = _group_norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size=3, padding=1)
        # Only present when widths differ, so its key appears exactly where the checkpoint has it.
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, kernel_size=1) if in_ch != out_ch else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in, H, W) -> (B, out, H, W)
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class _SpatialSelfAttention(nn.Module):
    """Single-head self-attention over all H*W positions, with 1x1-conv projections and a residual."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, C, H, W)
        b, c, height, width = x.shape
        h = self.norm(x)

        def tokens(t: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, 1, H*W, C)
            return t.reshape(b, c, height * width).transpose(1, 2).unsqueeze(1)

        # SDPA's default scale is 1/sqrt(C), the same scaling the model was trained with;
        # it also picks a fused kernel on accelerators.
        out = F.scaled_dot_product_attention(tokens(self.q(h)), tokens(self.k(h)), tokens(self.v(h)))
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, height, width)
        return x + self.proj_out(out)


class _Downsample(nn.Module):
    """Stride-2 3x3 conv with right/bottom zero padding (halves H and W exactly for even sizes)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, C, H/2, W/2)
        # Asymmetric padding (0 left/top, 1 right/bottom) is what the weights were trained with.
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class _Upsample(nn.Module):
    """Nearest-neighbour x2 upsampling followed by a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, C, 2H, 2W)
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: residual blocks, each optionally followed by attention, then resampling."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        n_blocks: int,
        use_attn: bool,
        resample: nn.Module | None,
        resample_name: str,
        groups: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            _ResBlock(in_ch if i == 0 else out_ch, out_ch, groups, dropout) for i in range(n_blocks)
        )
        # Empty list when unused: keeps key indices (attn.<i>) aligned with block indices.
        self.attn = nn.ModuleList(_SpatialSelfAttention(out_ch, groups) for _ in range(n_blocks if use_attn else 0))
        self._resample_name = resample_name
        if resample is not None:
            # Registered as "downsample" (encoder) or "upsample" (decoder), the checkpoint's names.
            self.add_module(resample_name, resample)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn) > 0:
                x = self.attn[i](x)
        resample = getattr(self, self._resample_name, None)
        return x if resample is None else resample(x)


class _Middle(nn.Module):
    """Bottleneck: ResBlock -> attention -> ResBlock at the lowest resolution."""

    def __init__(self, channels: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.block_1 = _ResBlock(channels, channels, groups, dropout)
        self.attn_1 = _SpatialSelfAttention(channels, groups)
        self.block_2 = _ResBlock(channels, channels, groups, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class _Encoder(nn.Module):
    """Image (B, in_channels, H, W) -> moments (B, 2*embed_dim, H/f, W/f), f = 2**(levels-1)."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        g, n_levels = cfg.num_groups, len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, kernel_size=3, padding=1)
        levels = []
        width = cfg.ch
        for i, mult in enumerate(cfg.ch_mult):
            out_w = cfg.ch * mult
            res = cfg.resolution // 2**i  # feature-map side length at this level
            last = i == n_levels - 1
            levels.append(
                _Level(
                    width,
                    out_w,
                    cfg.num_res_blocks,
                    use_attn=res in cfg.encoder_attn_resolutions,
                    resample=None if last else _Downsample(out_w),
                    resample_name="downsample",
                    groups=g,
                    dropout=cfg.dropout,
                )
            )
            width = out_w
        self.down = nn.ModuleList(levels)
        self.mid = _Middle(width, g, cfg.dropout)
        self.norm_out = _group_norm(width, g)
        # Mean and log-variance stacked along channels.
        self.conv_out = nn.Conv2d(width, 2 * cfg.embed_dim, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class _Decoder(nn.Module):
    """Latent (B, embed_dim, h, w) -> image (B, out_channels, h*f, w*f)."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        g, n_levels = cfg.num_groups, len(cfg.ch_mult)
        width = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.embed_dim, width, kernel_size=3, padding=1)
        self.mid = _Middle(width, g, cfg.dropout)
        # Built from the lowest resolution upwards, but stored so that up[i] is the level with
        # ch * ch_mult[i] channels (the checkpoint's indexing); forward walks it in reverse.
        levels: list[_Level] = [None] * n_levels  # type: ignore[list-item]
        for i in reversed(range(n_levels)):
            out_w = cfg.ch * cfg.ch_mult[i]
            res = cfg.resolution // 2**i
            levels[i] = _Level(
                width,
                out_w,
                cfg.num_res_blocks + 1,
                use_attn=res in cfg.decoder_attn_resolutions,
                resample=None if i == 0 else _Upsample(out_w),
                resample_name="upsample",
                groups=g,
                dropout=cfg.dropout,
            )
            width = out_w
        self.up = nn.ModuleList(levels)
        self.norm_out = _group_norm(width, g)
        self.conv_out = nn.Conv2d(width, cfg.out_channels, kernel_size=3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class KLAutoencoder(nn.Module):
    """KL-regularised autoencoder with a diagonal-Gaussian posterior (MAR's ``AutoencoderKL``).

    Images are in ``[-1, 1]``, shape ``(B, 3, H, W)`` with ``H, W`` multiples of the downsample
    factor; latents have shape ``(B, embed_dim, H / f, W / f)``.
    """

    def __init__(self, config: VAEConfig | str = "kl16") -> None:
        super().__init__()
        self.config = _resolve_config(config)
        cfg = self.config
        self.encoder = _Encoder(cfg)
        self.decoder = _Decoder(cfg)
        # 1x1 convs between the conv stacks and the latent space (names fixed by the checkpoint).
        self.quant_conv = nn.Conv2d(2 * cfg.embed_dim, 2 * cfg.embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.embed_dim, kernel_size=1)

    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim

    @property
    def latent_scale(self) -> float:
        return float(self.config.latent_scale)

    def encode(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior parameters for ``img`` (B, C, H, W) in [-1, 1].

        Returns ``(mean, logvar)``, each (B, embed_dim, H/f, W/f); ``logvar`` is clamped to
        ``[LOGVAR_MIN, LOGVAR_MAX]`` as in the official model.
        """
        f = self.config.downsample_factor
        if img.ndim != 4 or img.shape[1] != self.config.in_channels:
            raise ValueError(f"encode expects (B, {self.config.in_channels}, H, W), got {tuple(img.shape)}")
        if img.shape[2] % f or img.shape[3] % f:
            raise ValueError(f"encode: H and W must be multiples of {f}, got {tuple(img.shape[2:])}")
        moments = self.quant_conv(self.encoder(img))  # (B, 2*embed_dim, H/f, W/f)
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(LOGVAR_MIN, LOGVAR_MAX)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Unscaled latents (B, embed_dim, h, w) -> image (B, out_channels, h*f, w*f), roughly in [-1, 1]."""
        if z.ndim != 4 or z.shape[1] != self.config.embed_dim:
            raise ValueError(f"decode expects (B, {self.config.embed_dim}, h, w), got {tuple(z.shape)}")
        return self.decoder(self.post_quant_conv(z))

    @staticmethod
    def sample_latent(mean: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Reparameterised draw ``mean + exp(logvar / 2) * eps`` with ``eps`` from ``generator``.

        The generator must live on ``mean``'s device; the global RNG is never touched, so the
        draw is reproducible given the generator's seed.
        """
        if mean.shape != logvar.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and logvar {tuple(logvar.shape)} differ in shape")
        if generator.device.type != mean.device.type:
            raise ValueError(
                f"generator is on {generator.device} but the latents are on {mean.device}; "
                "create the generator with torch.Generator(device=mean.device)"
            )
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return mean + torch.exp(0.5 * logvar) * eps

    def image_to_tokens(self, img: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """MAR tokens ``latent * latent_scale``: a posterior sample, or the mean if no generator."""
        mean, logvar = self.encode(img)
        z = mean if generator is None else self.sample_latent(mean, logvar, generator)
        return z * self.latent_scale

    def tokens_to_image(self, tokens: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`image_to_tokens`'s scaling, then decode."""
        return self.decode(tokens / self.latent_scale)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """Deterministic reconstruction through the posterior mean."""
        mean, _ = self.encode(img)
        return self.decode(mean)


def _resolve_config(config: VAEConfig | str) -> VAEConfig:
    if isinstance(config, VAEConfig):
        return config
    if isinstance(config, str) and config in VAE_CONFIGS:
        return VAE_CONFIGS[config]
    raise ValueError(f"unknown VAE config {config!r}; expected a VAEConfig or one of {sorted(VAE_CONFIGS)}")


def _extract_state(obj: Mapping, source: str) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint: ``obj["model"]`` if present, else ``obj`` itself."""
    state = obj["model"] if "model" in obj else obj
    if not isinstance(state, Mapping):
        raise CheckpointError(f"checkpoint {source}: 'model' holds a {type(state).__name__}, expected a dict")
    not_tensors = [str(k) for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(
            f"checkpoint {source} is not a state dict: non-tensor entries for keys "
            f"{', '.join(not_tensors[:12])}{' ...' if len(not_tensors) > 12 else ''}"
        )
    # LDM training checkpoints may carry the perceptual/GAN loss ("loss.*"); the autoencoder ignores it.
    return {k: v for k, v in state.items() if not str(k).startswith(TRAINING_ONLY_PREFIX)}


def load_kl16(path: str | Path, config: VAEConfig | str = "kl16") -> KLAutoencoder:
    """Build a :class:`KLAutoencoder` and load ``path`` into it strictly; returns it on CPU in eval mode.

    ``path`` is a torch pickle holding either ``{"model": state_dict}`` (the official ``kl16.ckpt``)
    or a bare state dict. It is read with ``weights_only=True``. Raises :class:`CheckpointError`
    when the file is missing or unreadable, or when any key or shape does not match.
    """
    cfg = _resolve_config(config)
    obj = safe_torch_load(path)
    state = _extract_state(obj, str(path))
    model = KLAutoencoder(cfg)
    load_state_strict(model, state, str(path))
    return model.eval()
