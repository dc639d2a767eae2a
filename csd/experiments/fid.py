"""Optional FID and Inception Score for official MAR on ImageNet.

Nothing here is needed by the embedded shapes models (they use :mod:`csd.shapes.metrics`). The Inception
network comes from an installed third-party package (``torch-fidelity`` or ``clean-fid``, imported
only when called; both pull in torchvision, so neither is a requirement of this project) with weights
the user supplies; the reference statistics are an ``.npz`` with ``mu`` and ``sigma`` (the format of
ADM's and MAR's ImageNet statistics). A missing package or file raises an error that names it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from csd.shapes.metrics import frechet_from_stats, gaussian_stats

# backend name (as installed with pip) -> import name
BACKENDS = {"torch-fidelity": "torch_fidelity", "clean-fid": "cleanfid"}


def _require_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (FID/IS needs it; nothing is downloaded)")
    return path


def _import_backend(backend: str) -> str:
    """The backend to use: ``auto`` picks the first installed one."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {tuple(BACKENDS)}, got {backend!r}")
    for name in BACKENDS if backend == "auto" else (backend,):
        try:
            importlib.import_module(BACKENDS[name])
            return name
        except ImportError:
            continue
    wanted = " or ".join(f"'{n}' (import {BACKENDS[n]})" for n in (BACKENDS if backend == "auto" else (backend,)))
    raise ImportError(f"FID/IS needs the optional package {wanted}, which is not installed; pip install it yourself")


def load_reference_stats(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of reference Inception features from an ``.npz`` with ``mu`` and ``sigma``."""
    path = _require_file(path, "reference statistics (.npz with mu and sigma)")
    with np.load(path) as data:
        missing = [k for k in ("mu", "sigma") if k not in data]
        if missing:
            raise ValueError(f"reference statistics {path} lack {missing}; found {sorted(data.keys())}")
        return data["mu"].astype(np.float64), data["sigma"].astype(np.float64)


def _to_uint8(images: Tensor) -> Tensor:
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W) in [-1, 1], got {tuple(images.shape)}")
    return ((images.clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)


@torch.inference_mode()
def inception_features(
    images: Tensor,
    inception_weights: str | Path,
    backend: str = "auto",
    batch_size: int = 50,
    device: str | torch.device = "cpu",
) -> tuple[np.ndarray, Tensor | None]:
    """Pool features (B, 2048) as float64 and, with torch-fidelity, unbiased logits (B, 1008).

    images: (B, 3, H, W) in [-1, 1], as the tokenizers decode them. inception_weights: for
    torch-fidelity the ``pt_inception-2015-12-05`` state dict; for clean-fid the TorchScript file,
    named ``inception-2015-12-05.pt`` as clean-fid expects."""
    weights = _require_file(inception_weights, "Inception weights")
    backend = _import_backend(backend)
    pixels = _to_uint8(images)
    batches = [pixels[i : i + batch_size].to(device) for i in range(0, len(pixels), batch_size)]
    if backend == "torch-fidelity":
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        net = FeatureExtractorInceptionV3(
            "inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path=str(weights)
        )
        outs = [net.to(device).eval()(b) for b in batches]  # uint8 in, resized inside
        return torch.cat([o[0] for o in outs]).double().cpu().numpy(), torch.cat([o[1] for o in outs]).cpu()

    from cleanfid.inception_torchscript import InceptionV3W

    if weights.name != "inception-2015-12-05.pt":
        raise ValueError(f"clean-fid loads its weights as <dir>/inception-2015-12-05.pt, got {weights}")
    net = InceptionV3W(str(weights.parent), download=False, resize_inside=True).to(device)
    return torch.cat([net(b.float()) for b in batches]).double().cpu().numpy(), None  # [0, 255] in


def inception_metrics(
    images: Tensor,
    inception_weights: str | Path,
    reference_stats: str | Path,
    backend: str = "auto",
    batch_size: int = 50,
    device: str | torch.device = "cpu",
) -> dict[str, float | None]:
    """FID against the reference statistics and (torch-fidelity only) the Inception Score."""
    mu_ref, sigma_ref = load_reference_stats(reference_stats)
    pool, logits = inception_features(images, inception_weights, backend, batch_size, device)
    out: dict[str, float | None] = {
        "fid": frechet_from_stats(*gaussian_stats(pool), mu_ref, sigma_ref),
        "inception_score": None,
        "inception_score_std": None,
    }
    if logits is not None:
        from torch_fidelity.metric_isc import isc_features_to_metric

        isc = isc_features_to_metric(logits)
        out["inception_score"], out["inception_score_std"] = isc["inception_score_mean"], isc["inception_score_std"]
    return out
