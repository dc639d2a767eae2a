"""Specification of the quality metrics: the shipped classifier, features and the Frechet distance."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
from scipy import linalg

from csd.core.precision import at_precision
from csd.experiments.fid import inception_metrics, load_reference_stats
from csd.shapes.data import make_dataset
from csd.shapes.metrics import (
    DEFAULT_CLASSIFIER,
    REFERENCE_SEED,
    TRAIN_SEED,
    VALID_SEED,
    ClassifierConfig,
    TrainConfig,
    class_accuracy,
    confusion_matrix,
    features,
    frechet_distance,
    load_classifier,
    reference_features,
)
from tests.helpers import assert_same64


@pytest.mark.kernels
def test_shipped_classifier_recognises_held_out_real_images():
    real = make_dataset(300, REFERENCE_SEED)
    # Measured 1.0 (the smallest gap between an image's two largest logits 3.05) under every kernel perturbation
    # of tests/kernels.py: the bound leaves 9 images, and no near tie decides.
    assert class_accuracy(real.images, real.labels) >= 0.97  # the default: assets/classifier.safetensors
    record = json.loads(DEFAULT_CLASSIFIER.with_suffix(".json").read_text())["training"]
    assert record["valid_accuracy"] >= 0.97 and record["data_seeds"]["reference"] == REFERENCE_SEED


@pytest.mark.kernels
def test_confusion_matrix_counts_requested_against_predicted_class():
    real = make_dataset(60, REFERENCE_SEED)
    wrong = (real.labels + 1) % 10  # every image "requested" as the next class
    counts = confusion_matrix(real.images, wrong)
    assert counts.sum() == 60 and counts.shape == (10, 10)
    assert np.trace(counts) / 60 == class_accuracy(real.images, wrong)
    # The classifier is right on real images, so the counts sit one row below the diagonal.
    assert np.trace(np.roll(counts, -1, axis=0)) >= 58  # measured 60 under every kernel perturbation
    with pytest.raises(ValueError, match="class ids"):
        confusion_matrix(real.images, np.full(60, 10))


def test_reference_set_is_held_out_from_classifier_training():
    assert len({TRAIN_SEED, VALID_SEED, REFERENCE_SEED}) == 3


@pytest.mark.kernels
def test_features_are_the_penultimate_layer_and_batch_invariant():
    """features() is the classifier's penultimate layer (the same call: bit for bit); the network is batch
    invariant, compared in float64 (a float64 copy, csd.core.precision.at_precision): exact up to float64 rounding
    on every CPU, where in float32 a batch of 7 and one of 20 may round otherwise."""
    images = make_dataset(20, REFERENCE_SEED).images
    feats = features(images)
    assert feats.shape == (20, 64) and feats.dtype == np.float64
    classifier = load_classifier()  # the default features() reads (cached: the same module)
    with torch.inference_mode():
        assert np.array_equal(feats, classifier.features(images).double().numpy())
        net64 = at_precision(classifier, "float64")
        assert_same64(net64.features(images[:7].double()), net64.features(images.double())[:7], "7 images alone")
    with pytest.raises(ValueError, match="images must be"):
        features(images[:, :, :16])


def test_reference_features_are_deterministic():
    np.testing.assert_array_equal(reference_features(10), reference_features(10))


def test_frechet_distance_of_a_set_with_itself_is_zero_and_symmetric():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(200, 8)), rng.normal(1.0, 2.0, size=(150, 8))
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-9)


def test_frechet_distance_matches_scipy_sqrtm_formula():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(300, 16)) @ rng.normal(size=(16, 16))
    b = rng.normal(0.5, 1.0, size=(300, 16)) @ rng.normal(size=(16, 16))
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    expected = ((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * linalg.sqrtm(s_a @ s_b).real)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-8)


def test_frechet_distance_of_diagonal_gaussians_has_closed_form():
    # Exact statistics: both sets are the same standardised sample, scaled and shifted per dimension.
    rng = np.random.default_rng(2)
    z = rng.normal(size=(500, 3))
    z = (z - z.mean(0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T
    scale_a, scale_b, shift = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 1.0]), np.array([1.0, 0.0, -2.0])
    expected = (shift**2).sum() + ((scale_a - scale_b) ** 2).sum()
    assert frechet_distance(z * scale_a, z * scale_b + shift) == pytest.approx(expected, rel=1e-9)


def test_frechet_distance_is_stable_for_rank_deficient_covariances():
    # Fewer samples than dimensions (as with 100 images and 64 features): no NaN, no complex parts.
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(10, 64)), rng.normal(size=(10, 64))
    value = frechet_distance(a, b)
    assert isinstance(value, float) and math.isfinite(value)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)  # a set against itself
    assert frechet_distance(a + 3.0, b + 3.0) == pytest.approx(value, rel=1e-6)  # a common shift changes nothing
    assert frechet_distance(a, a + 3.0) == pytest.approx(64 * 9.0, rel=1e-6)  # a shift of one set adds |shift|^2
    assert frechet_distance(b, a) == pytest.approx(value, rel=1e-6)


def test_frechet_distance_rejects_mismatched_features():
    with pytest.raises(ValueError, match="same d"):
        frechet_distance(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="n >= 2"):
        frechet_distance(np.zeros((1, 3)), np.zeros((5, 3)))


@pytest.mark.parametrize(
    ("cls", "kwargs", "name"),
    [
        (ClassifierConfig, {"channels": ()}, "channels"),
        (ClassifierConfig, {"image_size": 30}, "image_size"),
        (ClassifierConfig, {"feature_dim": 0}, "feature_dim"),
        (TrainConfig, {"steps": 0}, "steps"),
        (TrainConfig, {"lr": 0.0}, "lr"),
        (TrainConfig, {"max_noise": 2.0}, "max_noise"),
    ],
)
def test_bad_settings_name_the_parameter(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)


# --- optional Inception metrics: only the clear-error paths are testable without the packages ---


@pytest.fixture
def no_fid_packages(monkeypatch):
    for module in ("torch_fidelity", "cleanfid"):
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError


def test_fid_names_the_missing_package(no_fid_packages, tmp_path):
    weights, stats = tmp_path / "pt_inception.pth", tmp_path / "stats.npz"
    weights.write_bytes(b"")
    np.savez(stats, mu=np.zeros(4), sigma=np.eye(4))
    images = torch.zeros(2, 3, 32, 32)
    with pytest.raises(ImportError, match="torch-fidelity.*clean-fid"):
        inception_metrics(images, weights, stats)
    with pytest.raises(ImportError, match="clean-fid"):
        inception_metrics(images, weights, stats, backend="clean-fid")


def test_fid_names_missing_files(no_fid_packages, tmp_path):
    images = torch.zeros(2, 3, 32, 32)
    stats = tmp_path / "stats.npz"
    np.savez(stats, mu=np.zeros(4), sigma=np.eye(4))
    with pytest.raises(FileNotFoundError, match="Inception weights.*missing.pth"):
        inception_metrics(images, tmp_path / "missing.pth", stats)
    with pytest.raises(FileNotFoundError, match="reference statistics.*nope.npz"):
        inception_metrics(images, tmp_path / "missing.pth", tmp_path / "nope.npz")
    np.savez(tmp_path / "bad.npz", mean=np.zeros(4))
    with pytest.raises(ValueError, match="lack"):
        load_reference_stats(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="backend"):
        inception_metrics(images, stats, stats, backend="home-made")
