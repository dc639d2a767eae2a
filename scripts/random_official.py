"""Official-format MAR checkpoints with random weights: what a Space serving the official pairs reads, made
without the published files (several GB) for the tests and the device check.

:func:`write_official` writes the official layout (``mar/<name>/checkpoint-last.pth`` with ``model``,
``model_ema`` and the training ``args``; ``vae/kl16.ckpt`` with ``model``) for any MAR configs and KL-16
config, seeded. :data:`TINY` and :data:`TINY_KL16` are test-sized stand-ins of the official configs that keep
their token layout: 256 px images, a 16 x 16 grid of 16-dim KL-16 latents, 1000 classes. The loaders read a
config by name (``mar_base``, ...; ``kl16``): a test puts the tiny ones under those names for the test's
duration (:func:`tiny_configs`).

    python -m scripts.random_official DIR [--tiny]   # the official files, official sizes unless --tiny
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from csd.core.rng import drawing_from
from csd.models import vae
from csd.models.mar import MAR
from csd.models.mar.network import MAR_CONFIGS, MARConfig
from csd.models.mar.official import OFFICIAL_FILES

NAMES = ("mar_base", "mar_large", "mar_huge")
# Narrow and shallow, the official token layout kept (MARConfig's defaults: 256 px, KL-16's stride and channels).
TINY = {
    name: replace(
        MAR_CONFIGS[name],
        encoder_embed_dim=width,
        encoder_depth=depth,
        encoder_num_heads=2,
        decoder_embed_dim=width,
        decoder_depth=depth,
        decoder_num_heads=2,
        diffloss_d=1,
        diffloss_w=width,
        num_sampling_steps=10,
        buffer_size=8,
    )
    for name, width, depth in (("mar_base", 32, 1), ("mar_large", 48, 1), ("mar_huge", 64, 2))
}
# 256 px -> 16 x 16 x 16 latents as KL-16's, at a width of 8 (KL-16: 128).
TINY_KL16 = replace(vae.VAE_CONFIGS["kl16"], ch=8, num_res_blocks=1, num_groups=4, decoder_attn_resolutions=())


def official_args(name: str, config: MARConfig) -> argparse.Namespace:
    """The ``args`` an official training run saves (what :func:`csd.models.mar.official.config_from_args` reads)."""
    return argparse.Namespace(
        model=name,
        img_size=config.img_size,
        vae_stride=config.vae_stride,
        patch_size=config.patch_size,
        vae_embed_dim=config.token_channels,
        class_num=config.class_num,
        buffer_size=config.buffer_size,
        diffloss_d=config.diffloss_d,
        diffloss_w=config.diffloss_w,
        num_sampling_steps=str(config.num_sampling_steps),  # MAR passes it as a string
        diffusion_batch_mul=config.diffusion_batch_mul,
    )


def _seeded(make, seed: int):
    with drawing_from(torch.Generator().manual_seed(seed)):  # layer init reads the global generator
        return make()


def write_official(
    directory: Path, configs: dict[str, MARConfig], kl16: vae.VAEConfig | None = None, seed: int = 0
) -> list[Path]:
    """Write each MAR of ``configs`` (name -> config) and the tokenizer (``kl16``; None: the config named
    "kl16" now) in the official layout; returns the files. The weights are random (seeded), the published
    initialisation perturbed so outputs vary."""
    kl16 = kl16 or vae.VAE_CONFIGS["kl16"]
    written = []
    for i, (name, config) in enumerate(configs.items()):
        model = _seeded(lambda c=config: MAR(c), seed + i)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 100 + i)
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        path = directory / OFFICIAL_FILES[name][0]
        path.parent.mkdir(parents=True, exist_ok=True)
        state = model.state_dict()
        torch.save({"model": state, "model_ema": state, "args": official_args(name, config)}, path)
        written.append(path)
    path = directory / "vae" / "kl16.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": _seeded(lambda: vae.KLAutoencoder(kl16), seed + 50).state_dict()}, path)
    return [*written, path]


@contextmanager
def tiny_configs() -> Iterator[None]:
    """The tiny configs under the official names while inside (the loaders read configs by name)."""
    saved_mar = {name: MAR_CONFIGS[name] for name in NAMES}
    saved_vae = vae.VAE_CONFIGS["kl16"]
    MAR_CONFIGS.update(TINY)
    vae.VAE_CONFIGS["kl16"] = TINY_KL16
    try:
        yield
    finally:
        MAR_CONFIGS.update(saved_mar)
        vae.VAE_CONFIGS["kl16"] = saved_vae


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.random_official", description=__doc__.split("\n")[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--tiny", action="store_true", help="the test-sized configs (official sizes otherwise)")
    p.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    args = p.parse_args(argv)
    configs = {name: (TINY if args.tiny else MAR_CONFIGS)[name] for name in args.names}
    for path in write_official(args.directory, configs, TINY_KL16 if args.tiny else vae.VAE_CONFIGS["kl16"]):
        print(path, f"{path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
