"""The FLUX VAE, NextStep-1's image tokenizer, as the official NextStep code has it
(``nextstep/models/modeling_flux_vae.py`` in stepfun-ai/NextStep-1; its weights are the Hub repository
stepfun-ai/NextStep-1-f8ch16-Tokenizer).

The network is the LDM autoencoder of :mod:`csd.models.vae` without its 1 x 1 ``quant_conv`` /
``post_quant_conv`` and without attention outside the middle blocks: the official ``Encoder`` and ``Decoder``
are module for module those of :mod:`csd.models.vae` (``conv_in``, ``down.{i}.block.{j}`` with ``norm1``,
``conv1``, ``norm2``, ``conv2`` and ``nin_shortcut`` where the width changes, ``down.{i}.downsample.conv``,
``mid.block_1`` / ``attn_1`` / ``block_2``, ``norm_out``, ``conv_out``; the decoder's ``up.{i}`` with
``num_res_blocks + 1`` blocks and ``upsample.conv``; GroupNorm of 32 groups, eps 1e-6), so they are reused, and
the official state dict loads strictly. Its posterior is diffusers' ``DiagonalGaussianDistribution``: mean and
log-variance (clamped to [-30, 20]) from the encoder's output; ``encoder_norm`` layer-normalises the mean over its
channels (over each ``psz`` x ``psz`` patch's channels when ``psz`` is set), as the official ``encode`` does.

NextStep's tokens are the latents shifted and scaled as its pipeline does, ``(z - shift_factor) *
scaling_factor`` (0.1159 and 0.3611 in the published config), then patchified 2 x 2 in the official order
(``nchpwq->nhwcpq``: a token of 16 x 2 x 2 = 64 values); back, ``z / scaling_factor + shift_factor`` before the
decoder. :class:`FluxAutoencoder` offers the ``embed_dim`` / ``image_to_tokens`` / ``tokens_to_image`` that
:class:`csd.models.tokenizer.LatentTokenizer` reads, so ``LatentTokenizer(vae, 2)`` (:func:`flux_tokenizer`) is
NextStep's raster tokenizer; a NextStep model's ``token_layout`` wraps it (``use_norm``: each token layer-normed
before it is decoded, :class:`csd.models.nextstep.tokens.NormedTokens`).

Dtypes: the official module has no float32 casts of its own; its pipeline casts images and latents to the VAE's
dtype before ``encode`` / ``decode``, and so do :meth:`FluxAutoencoder.image_to_tokens` and
:meth:`FluxAutoencoder.tokens_to_image` (a float64 VAE computes in float64 throughout).

``load_flux_vae(directory)`` reads the official ``from_pretrained`` layout: ``config.json`` (the
``AutoEncoderParams`` fields; other keys are ignored, as the official loader does, and named in
``vae.ignored_config``) and ``checkpoint.pt`` (a flat state dict), with ``torch.load(weights_only=True)`` and a
strict load (the official one is lenient): a :class:`~csd.models.checkpoint.CheckpointError` names the file and
every missing, unexpected or misshapen key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.core.checks import check_int, check_ints
from csd.models.checkpoint import CheckpointError, load_state_strict, safe_torch_load
from csd.models.tokenizer import LatentTokenizer
from csd.models.vae import LOGVAR_MAX, LOGVAR_MIN, VAEConfig, _Decoder, _Encoder

CONFIG_FILE, WEIGHTS_FILE = "config.json", "checkpoint.pt"  # the official from_pretrained's files
GROUPS = 32  # the official GroupNorms' groups (fixed there)


@dataclass(frozen=True)
class FluxVAEConfig:
    """The official ``AutoEncoderParams`` (same names and defaults: the published NextStep-1 tokenizer is f8,
    16 channels). ``resolution`` does not change the network (no attention outside the middle blocks)."""

    resolution: int = 256
    in_channels: int = 3
    ch: int = 128
    out_ch: int = 3
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 16
    scaling_factor: float = 0.3611
    shift_factor: float = 0.1159
    deterministic: bool = False
    encoder_norm: bool = False
    psz: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", check_ints("FluxVAEConfig.ch_mult", self.ch_mult, 1, "a list"))
        if not self.ch_mult:
            raise ValueError("FluxVAEConfig.ch_mult must not be empty")
        for key in ("resolution", "in_channels", "ch", "out_ch", "num_res_blocks", "z_channels"):
            check_int(f"FluxVAEConfig.{key}", getattr(self, key), 1)
        bad = sorted({self.ch * m for m in (1, *self.ch_mult) if (self.ch * m) % GROUPS})
        if bad:
            raise ValueError(f"FluxVAEConfig: every width must be a multiple of {GROUPS} (GroupNorm), got {bad}")
        if self.psz is not None:
            check_int("FluxVAEConfig.psz", self.psz, 1)
        if not float(self.scaling_factor) > 0.0:
            raise ValueError(f"FluxVAEConfig.scaling_factor must be > 0, got {self.scaling_factor!r}")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def blocks(self) -> VAEConfig:
        """The :mod:`csd.models.vae` config whose encoder and decoder are the official ones."""
        return VAEConfig(
            embed_dim=self.z_channels,
            ch=self.ch,
            ch_mult=self.ch_mult,
            num_res_blocks=self.num_res_blocks,
            in_channels=self.in_channels,
            out_channels=self.out_ch,
            resolution=self.downsample_factor,  # decides attention placement only: there is none
            encoder_attn_resolutions=(),
            decoder_attn_resolutions=(),
            num_groups=GROUPS,
        )

    @classmethod
    def from_json(cls, data: dict, **overrides) -> tuple[FluxVAEConfig, tuple[str, ...]]:
        """The config of an official ``config.json`` (``overrides`` win, as ``from_pretrained``'s kwargs) and the
        keys it ignores (not ``AutoEncoderParams`` fields)."""
        merged = {**data, **overrides}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in merged.items() if k in names}), tuple(sorted(set(merged) - names))


def _layer_norm_channels(x: Tensor, eps: float = 1e-6) -> Tensor:
    """The official ``layer_norm_2d``: each position's channels layer-normed, no affine."""
    x = x.permute(0, 2, 3, 1)
    return F.layer_norm(x, x.shape[-1:], None, None, eps).permute(0, 3, 1, 2)


class FluxAutoencoder(nn.Module):
    """The official FLUX ``AutoencoderKL`` of NextStep-1 (see the module doc). Images (B, in_channels, H, W) in
    [-1, 1], H and W multiples of ``downsample_factor``; latents (B, z_channels, H / f, W / f)."""

    def __init__(self, config: FluxVAEConfig | None = None):
        super().__init__()
        self.config = config or FluxVAEConfig()
        blocks = self.config.blocks()
        self.encoder = _Encoder(blocks)
        self.decoder = _Decoder(blocks)
        self.ignored_config: tuple[str, ...] = ()

    @property
    def embed_dim(self) -> int:
        return self.config.z_channels

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.conv_in.weight.dtype

    def encode(self, img: Tensor) -> tuple[Tensor, Tensor]:
        """The posterior's mean and log-variance (clamped to [-30, 20]), each (B, z_channels, H / f, W / f)."""
        c, f = self.config, self.config.downsample_factor
        if img.ndim != 4 or img.shape[1] != c.in_channels:
            raise ValueError(f"encode expects (B, {c.in_channels}, H, W), got {tuple(img.shape)}")
        if img.shape[2] % f or img.shape[3] % f:
            raise ValueError(f"encode: H and W must be multiples of {f}, got {tuple(img.shape[2:])}")
        mean, logvar = self.encoder(img).chunk(2, dim=1)
        if c.encoder_norm:
            mean = self._unpatch(_layer_norm_channels(self._patch(mean))) if c.psz else _layer_norm_channels(mean)
        return mean, logvar.clamp(LOGVAR_MIN, LOGVAR_MAX)

    def _patch(self, x: Tensor) -> Tensor:
        """The official ``patchify`` (``nchpwq->ncpqhw``): (B, C, H, W) -> (B, C p p, H / p, W / p)."""
        b, ch, h, w, p = *x.shape, self.config.psz
        x = torch.einsum("nchpwq->ncpqhw", x.reshape(b, ch, h // p, p, w // p, p))
        return x.reshape(b, ch * p * p, h // p, w // p)

    def _unpatch(self, x: Tensor) -> Tensor:
        b, _, h, w = x.shape
        p, ch = self.config.psz, self.config.z_channels
        x = torch.einsum("ncpqhw->nchpwq", x.reshape(b, ch, p, p, h, w))
        return x.reshape(b, ch, h * p, w * p)

    def decode(self, z: Tensor) -> Tensor:
        """Latents (B, z_channels, h, w) -> images (B, out_ch, h f, w f), not clamped."""
        if z.ndim != 4 or z.shape[1] != self.config.z_channels:
            raise ValueError(f"decode expects (B, {self.config.z_channels}, h, w), got {tuple(z.shape)}")
        return self.decoder(z)

    def sample_latent(self, mean: Tensor, logvar: Tensor, generator: torch.Generator) -> Tensor:
        """A posterior draw ``mean + std * eps`` as diffusers draws it (eps from ``generator`` in the mean's
        dtype; std 0 under ``deterministic``, eps drawn all the same)."""
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        std = torch.zeros_like(mean) if self.config.deterministic else torch.exp(0.5 * logvar)
        return mean + std * eps

    def image_to_tokens(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The pipeline's latents ``(z - shift_factor) * scaling_factor`` (B, z_channels, H / f, W / f) of images
        cast to the VAE's dtype: z the posterior mean, or a draw when a generator is given."""
        mean, logvar = self.encode(img.to(self.dtype))
        z = mean if generator is None else self.sample_latent(mean, logvar, generator)
        return (z - self.config.shift_factor) * self.config.scaling_factor

    def tokens_to_image(self, latents: Tensor) -> Tensor:
        """The pipeline's decoding: ``latents / scaling_factor + shift_factor`` cast to the VAE's dtype, decoded
        (not clamped)."""
        z = latents / self.config.scaling_factor + self.config.shift_factor
        return self.decode(z.to(self.dtype))

    def forward(self, img: Tensor) -> Tensor:
        """Reconstruction through the posterior mean."""
        return self.decode(self.encode(img)[0])


def flux_tokenizer(vae: FluxAutoencoder, patch_size: int = 2) -> LatentTokenizer:
    """NextStep's raster tokenizer over ``vae``: tokens (B, (H / f p)(W / f p), z_channels p p) in the official
    patch order (``nchpwq->nhwcpq``); decoding clamps images to [-1, 1]."""
    return LatentTokenizer(vae, patch_size)


def load_flux_vae(directory: str | Path, **overrides) -> FluxAutoencoder:
    """The FLUX VAE in an official ``from_pretrained`` directory (``config.json``, ``checkpoint.pt``), loaded
    strictly with ``weights_only=True``; ``overrides``: ``AutoEncoderParams`` fields that win over the file's (as
    the official kwargs). Eval mode, CPU, float32."""
    directory = Path(directory)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"FLUX VAE directory {directory} lacks {', '.join(missing)} (the official layout: {CONFIG_FILE} and "
            f"{WEIGHTS_FILE}, as the Hub repository stepfun-ai/NextStep-1-f8ch16-Tokenizer has them)"
        )
    config, ignored = read_flux_config(directory / CONFIG_FILE, **overrides)
    state = safe_torch_load(directory / WEIGHTS_FILE)
    not_tensors = sorted(str(k) for k, v in state.items() if not isinstance(v, Tensor))
    if not_tensors:
        raise CheckpointError(f"checkpoint {directory / WEIGHTS_FILE} is not a flat state dict: {not_tensors[:12]}")
    vae = FluxAutoencoder(config)
    load_state_strict(vae, state, str(directory / WEIGHTS_FILE))
    vae.ignored_config = ignored
    return vae.eval()


def read_flux_config(path: Path, **overrides) -> tuple[FluxVAEConfig, tuple[str, ...]]:
    """The :class:`FluxVAEConfig` of an official ``config.json`` and the keys it ignores."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    try:
        return FluxVAEConfig.from_json(data, **overrides)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
