"""Regenerate (or re-check) tests/data/flux_vae_reference.pt: NextStep-1's FLUX VAE and its tokens, from the
official code (stepfun-ai/NextStep-1 at commit 6e49baeb00d288da296615514dfb343c1af2efb9, the checkout
tests/data/make_nextstep_reference.py uses).

Usage. In the venv of make_nextstep_reference.py (transformers 4.49.0 beside this project's torch), with the
packages the official VAE module imports, at the versions of its pyproject (diffusers) or the current ones:

    python -m venv --system-site-packages /tmp/ns-venv
    /tmp/ns-venv/bin/pip install transformers==4.49.0 diffusers==0.32.2 einops==0.8.2 omegaconf==2.4.0 tabulate
    /tmp/ns-venv/bin/python tests/data/make_flux_vae_reference.py /tmp/nextstep-official            # write
    /tmp/ns-venv/bin/python tests/data/make_flux_vae_reference.py /tmp/nextstep-official --verify   # re-check

The path is a checkout of the official repository, kept outside this repository; nothing in it is edited.
Stand-ins in ``sys.modules`` for what the official modules import but these runs never call:
``nextstep.utils.compile_utils`` (``smart_compile`` as the identity, so nothing is torch.compiled;
``compile_manager``), ``nextstep.utils.loguru`` (a silent logger), ``nextstep.utils.misc`` (``LargeInt`` as
int), ``nextstep.utils.optim_utils``, ``nextstep.utils.image_utils``, ``nextstep.utils.training_utils`` and torchvision (the pipeline's PIL transforms). diffusers'
``DiagonalGaussianDistribution`` (the posterior), einops, omegaconf and tabulate are the real packages.

The model is the official ``AutoencoderKL(AutoEncoderParams(...))`` of ``modeling_flux_vae.py`` at a tiny size:
resolution 32, ch 32 (the official GroupNorms have 32 groups: no narrower), ch_mult [1, 2, 1, 1] (f8 as the
published one, and a width change each way: ``nin_shortcut`` in the encoder and the decoder), one residual block
a level, z_channels 16, scaling 0.3611 and shift 0.1159 (the defaults, the published values). Every parameter is
redrawn from a seeded generator (conv weights 2 N(0, 1) / sqrt(fan_in), GroupNorm scales 1 + 0.1 N(0, 1),
every bias 0.1 N(0, 1)) and rounded to float16 values, so the file stores them as float16 and the float32 model
holds exactly those values; the float64 model is the float32 one cast. Three variants share the weights:
"plain" (the defaults), "norm" (``encoder_norm``) and "norm_psz2_deterministic" (``encoder_norm``, ``psz`` 2,
``deterministic``). Inputs are drawn in float32 (cast for float64): two 32 x 32 images uniform in [-1, 1], latents
(2, 16, 4, 4) N(0, 1) and head tokens (2, 4, 64) 1.5 N(0, 1).

Recorded per variant and dtype ("float32", "float64"; the official VAE has no float32 casts of its own, and the
pipeline casts images and latents to the VAE's dtype: the float64 run is float64 throughout):

* ``vae.encode(images).latent_dist``: ``mean``, ``logvar`` (clamped by diffusers), ``mode()``, and ``sample``
  (``sample(generator=torch.Generator().manual_seed(SAMPLE_SEED))``);
* ``vae.decode(latents).sample`` as ``decoded``;
* NextStepPipeline's tokens (``generate_image`` steps 3 and 7-8, the official ``NextStep.patchify`` /
  ``unpatchify`` called on a stand-in ``self`` holding only ``config.latent_patch_size`` 2):
  ``tokens_mean`` = patchify((mode - shift) * scale), ``tokens_sample`` = the same of the seeded sample;
  ``images_from_tokens`` = decode(unpatchify(tokens) / scale + shift) of the head tokens;
  ``images_from_normed_tokens`` = the same after the pipeline's ``layer_norm`` of each token (``use_norm``);
  ``round_trip`` = images -> ``tokens_mean`` -> images.

The decoder-only entries (``decoded``, ``images_from_tokens``, ``images_from_normed_tokens``) are the same in
every variant (asserted bit-identical) and stored under "plain" only. Also: the weights (float16) with the official key names, and the state dict's shapes and parameter count of the
published config (``AutoEncoderParams()`` built on the meta device). ``--verify`` re-runs everything from the
file's weights and inputs and checks each output is bit-identical.
"""
import contextlib
import sys
import types
from dataclasses import asdict

import torch
import diffusers.models.autoencoders.vae  # noqa: F401  (these two before the stand-ins: they probe installed
import transformers  # noqa: F401          packages, torchvision among them)
from torch import nn


def _stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _SilentLogger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


_stub("nextstep.utils.loguru", logger=_SilentLogger())
_stub("nextstep.utils.compile_utils", smart_compile=lambda *args, **kwargs: (lambda f: f),
      compile_manager=types.SimpleNamespace(compile_disabled=contextlib.nullcontext))
_stub("nextstep.utils.misc", LargeInt=int)
_stub("nextstep.utils.optim_utils", ALL_LAYERNORM_LAYERS=[nn.LayerNorm])
_stub("nextstep.utils.image_utils", ImageType=object, center_crop_arr=None, load_image=None, to_pil=None)
_stub("nextstep.utils.training_utils", set_seed=None)
_stub("torchvision", transforms=_stub("torchvision.transforms"))

CHECKOUT = sys.argv[1]
VERIFY = "--verify" in sys.argv[2:]
sys.path.insert(0, CHECKOUT)

from nextstep.models.modeling_flux_vae import AutoEncoderParams, AutoencoderKL  # noqa: E402
from nextstep.models.modeling_nextstep import NextStep  # noqa: E402
from nextstep.models.pipeline_nextstep import layer_norm  # noqa: E402

OUT = __file__.replace("make_flux_vae_reference.py", "flux_vae_reference.pt")
OFFICIAL_COMMIT = "6e49baeb00d288da296615514dfb343c1af2efb9"
SEED, SAMPLE_SEED = 8150, 77
TINY = dict(resolution=32, in_channels=3, ch=32, out_ch=3, ch_mult=[1, 2, 1, 1], num_res_blocks=1, z_channels=16)
VARIANTS = {
    "plain": {},
    "norm": dict(encoder_norm=True),
    "norm_psz2_deterministic": dict(encoder_norm=True, psz=2, deterministic=True),
}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DECODER_ONLY = ("decoded", "images_from_tokens", "images_from_normed_tokens")  # the same in every variant
PATCH = 2  # NextStep's latent_patch_size
NS = types.SimpleNamespace(config=types.SimpleNamespace(latent_patch_size=PATCH, latent_channels=16))


def build(variant: str) -> AutoencoderKL:
    return AutoencoderKL(AutoEncoderParams(**TINY, **VARIANTS[variant]))


def draw_weights(model: nn.Module) -> dict:
    """Every parameter redrawn (see the docstring), as float16 values."""
    g = torch.Generator().manual_seed(SEED)
    state = {}
    for name, p in model.state_dict().items():
        noise = torch.randn(p.shape, generator=g)
        if name.endswith("bias"):
            value = 0.1 * noise
        elif p.dim() == 1:  # GroupNorm scales
            value = 1.0 + 0.1 * noise
        else:
            value = 2.0 * noise / p[0].numel() ** 0.5
        state[name] = value.half()
    return state


def draw_inputs() -> dict:
    g = torch.Generator().manual_seed(SEED + 1)
    return {"images": torch.rand((2, 3, 32, 32), generator=g) * 2 - 1,
            "latents": torch.randn((2, 16, 4, 4), generator=g),
            "tokens": 1.5 * torch.randn((2, 4, 64), generator=g)}


@torch.no_grad()
def run(vae: AutoencoderKL, inputs: dict, dtype: torch.dtype) -> dict:
    shift = getattr(vae.config, "shift_factor", 0.0)  # as NextStepPipeline.__init__ reads them
    scale = getattr(vae.config, "scaling_factor", 1.0)
    images, latents, tokens = (inputs[k].to(dtype) for k in ("images", "latents", "tokens"))
    posterior = vae.encode(images.to(vae.dtype)).latent_dist
    mode = posterior.mode()
    sample = posterior.sample(generator=torch.Generator().manual_seed(SAMPLE_SEED))

    def to_image(t):
        z = NextStep.unpatchify(NS, t)
        z = (z / scale) + shift
        return vae.decode(z.to(vae.dtype)).sample

    normed = layer_norm(tokens, normalized_shape=tokens.size()[2:])  # each token, as decoding's token_sampled
    tokens_mean = NextStep.patchify(NS, (mode - shift) * scale)
    return {"mean": posterior.mean, "logvar": posterior.logvar, "mode": mode, "sample": sample,
            "decoded": vae.decode(latents.to(vae.dtype)).sample,
            "tokens_mean": tokens_mean, "tokens_sample": NextStep.patchify(NS, (sample - shift) * scale),
            "images_from_tokens": to_image(tokens), "images_from_normed_tokens": to_image(normed),
            "round_trip": to_image(tokens_mean)}


def loaded(variant: str, state: dict, dtype: torch.dtype) -> AutoencoderKL:
    vae = build(variant)
    missing, unexpected = vae.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    assert not missing and not unexpected
    return vae.to(dtype).eval()


def published() -> dict:
    with torch.device("meta"):
        vae = AutoencoderKL(AutoEncoderParams())
    return {"config": asdict(AutoEncoderParams()),
            "shapes": {k: list(v.shape) for k, v in vae.state_dict().items()},
            "num_params": sum(p.numel() for p in vae.parameters())}


def generate():
    state = draw_weights(build("plain"))
    inputs = draw_inputs()
    out = {"official_commit": OFFICIAL_COMMIT, "torch": str(torch.__version__), "seed": SEED, "sample_seed": SAMPLE_SEED,
           "patch_size": PATCH, "state_dict": state, "inputs": inputs, "published": published(), "variants": {}}
    for variant in VARIANTS:
        config = asdict(AutoEncoderParams(**TINY, **VARIANTS[variant]))
        out["variants"][variant] = {"config": config, **{name: run(loaded(variant, state, dtype), inputs, dtype)
                                                         for name, dtype in DTYPES.items()}}
        if variant != "plain":  # stored once, under "plain"
            for name in DTYPES:
                for k in DECODER_ONLY:
                    assert torch.equal(out["variants"][variant][name].pop(k), out["variants"]["plain"][name][k])
    torch.save(out, OUT)
    print("wrote", OUT)


def verify():
    ref = torch.load(OUT, weights_only=True)
    assert ref["published"] == published()
    for variant, rec in ref["variants"].items():
        assert rec["config"] == asdict(AutoEncoderParams(**TINY, **VARIANTS[variant]))
        for name, dtype in DTYPES.items():
            again = run(loaded(variant, ref["state_dict"], dtype), ref["inputs"], dtype)
            want = {**{k: ref["variants"]["plain"][name][k] for k in DECODER_ONLY}, **rec[name]}
            bad = [k for k in again if not torch.equal(again[k], want[k])]
            print(variant, name, "re-run bit-identical:", not bad, bad)
        for k in rec["float32"]:
            a, b = rec["float32"][k].double(), rec["float64"][k]
            print(f"  float32 vs float64 {k}: {((a - b).abs().max() / b.abs().max()).item():.2e}")


if __name__ == "__main__":
    verify() if VERIFY else generate()
