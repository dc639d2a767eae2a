"""Specification of the procedural shapes dataset (csd.shapes.data)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from csd.shapes.data import (
    CLASS_NAMES,
    NUM_CLASSES,
    ShapesConfig,
    ShapesDataset,
    captions,
    class_id,
    contact_sheet,
    main,
    make_dataset,
    render_batch,
)

LUMA = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)


def luminance(images: torch.Tensor) -> torch.Tensor:
    """(N,H,W) luminance in [0, 1] of images in [-1, 1]."""
    return ((images + 1) / 2 * LUMA).sum(1)


def test_same_seed_gives_identical_images_and_captions():
    a, b = make_dataset(30, seed=3), make_dataset(30, seed=3)
    assert torch.equal(a.images, b.images)
    assert a.captions == b.captions


def test_image_depends_only_on_seed_and_index():
    small, large = make_dataset(25, seed=5), make_dataset(60, seed=5)
    assert torch.equal(small.images, large.images[:25])
    assert small.captions == large.captions[:25]


def test_render_batch_start_offset_matches_dataset_slice():
    # The slice straddles make_dataset's internal chunk boundary (1024 images at 32x32).
    dataset = make_dataset(1100, seed=2)
    images, captions = render_batch(dataset.labels[1000:], seed=2, start=1000)
    assert torch.equal(images, dataset.images[1000:])
    assert captions == dataset.captions[1000:]


@pytest.mark.parametrize("image_size", [32, 48])
def test_captions_alone_are_the_datasets_without_rendering(monkeypatch, image_size):
    """A slice of the dataset's captions, drawn from the images' parameters alone, is the dataset's slice;
    no image is rendered (a text model's timing prompts start at image 100 000)."""
    config = ShapesConfig(image_size=image_size)
    expected = make_dataset(37, seed=104, config=config).captions
    monkeypatch.setattr("csd.shapes.data._render", lambda *args: pytest.fail("an image was rendered"))
    assert captions(37, 104, config=config) == expected
    assert captions(12, 104, start=25, config=config) == expected[25:]
    assert captions(0, 104, start=5) == []
    with pytest.raises(ValueError, match="start must be"):
        captions(3, 104, start=-1)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        captions(3, -2)


def test_different_seeds_give_different_images():
    a, b = make_dataset(20, seed=0), make_dataset(20, seed=1)
    assert not torch.equal(a.images, b.images)


def test_images_are_float32_in_unit_range_with_requested_shape():
    dataset = make_dataset(12, seed=0, config=ShapesConfig(image_size=48))
    assert dataset.images.shape == (12, 3, 48, 48)
    assert dataset.images.dtype == torch.float32
    assert dataset.images.min() >= -1.0 and dataset.images.max() <= 1.0
    assert dataset.labels.dtype == torch.int64 and dataset.labels.shape == (12,)
    assert len(dataset) == 12 and len(dataset.captions) == 12


def test_default_labels_cycle_through_all_classes_balanced():
    dataset = make_dataset(50, seed=0)
    assert torch.bincount(dataset.labels, minlength=NUM_CLASSES).tolist() == [5] * NUM_CLASSES


def test_explicit_labels_are_kept():
    labels = [9, 9, 0, 4]
    dataset = make_dataset(4, seed=0, labels=labels)
    assert dataset.labels.tolist() == labels


def test_dataset_indexing_returns_image_and_label():
    """dataset[i] is image i and its label; image i is the one rendered alone from (seed, i) and its label
    (a reference computed without the dataset), and labels cycle 0, 1, 2, ..."""
    dataset = make_dataset(3, seed=0)
    image, label = dataset[2]
    assert isinstance(dataset, ShapesDataset)
    assert torch.equal(image, dataset.images[2]) and int(label) == 2 and label.dtype == torch.int64
    alone, captions = render_batch([2], seed=0, start=2)
    assert torch.equal(image, alone[0]) and captions[0] == dataset.captions[2]
    assert not torch.equal(image, render_batch([2], seed=0, start=1)[0][0])  # another index, another image


def test_captions_mention_the_class_name():
    dataset = make_dataset(40, seed=4)
    for label, caption in zip(dataset.labels.tolist(), dataset.captions, strict=True):
        assert CLASS_NAMES[label] in caption, caption
        assert caption.startswith("a ") and " on a" in caption


def test_shape_contrasts_with_background_by_the_luminance_gap():
    # Large circles cover the image centre and never reach the corner, for every background kind.
    config = ShapesConfig(size_range=(0.9, 0.9), min_luminance_gap=0.3)
    dataset = make_dataset(60, seed=8, config=config, labels=[class_id("circle")] * 60)
    y = luminance(dataset.images)
    centre, corner = y[:, 15:17, 15:17].mean((1, 2)), y[:, 0, 0]
    assert ((centre - corner).abs() >= 0.3 - 0.02).all()


def test_nearest_class_mean_classifier_beats_chance_on_held_out_seed():
    def features(dataset: ShapesDataset) -> torch.Tensor:
        # Colour-free shape mask (distance from the border luminance), centred and scaled by its moments.
        y = luminance(dataset.images)
        border = torch.cat([y[:, 0], y[:, -1], y[:, :, 0], y[:, :, -1]], 1).median(1).values
        mask = (y - border[:, None, None]).abs()
        weights = mask / mask.sum((1, 2), keepdim=True).clamp_min(1e-6)
        c = (torch.arange(y.shape[-1]) + 0.5) / y.shape[-1] * 2 - 1
        cx, cy = (weights * c).sum((1, 2)), (weights * c[:, None]).sum((1, 2))
        spread = (weights * ((c - cx[:, None, None]) ** 2 + (c[:, None] - cy[:, None, None]) ** 2)).sum((1, 2))
        theta = torch.zeros(len(y), 2, 3)
        theta[:, 0, 0] = theta[:, 1, 1] = 2 * spread.sqrt()
        theta[:, 0, 2], theta[:, 1, 2] = cx, cy
        grid = F.affine_grid(theta, [len(y), 1, 16, 16], align_corners=False)
        return F.grid_sample(mask[:, None], grid, align_corners=False).flatten(1)

    train, test = make_dataset(2000, seed=0), make_dataset(1000, seed=1)
    train_x, test_x = features(train), features(test)
    means = torch.stack([train_x[train.labels == c].mean(0) for c in range(NUM_CLASSES)])
    accuracy = (torch.cdist(test_x, means).argmin(1) == test.labels).float().mean().item()
    assert accuracy > 2.5 / NUM_CLASSES  # measured 0.409 under every kernel perturbation of tests/kernels.py


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image_size", 12),
        ("image_size", 30),
        ("image_size", 256),
        ("size_range", (0.8, 0.5)),
        ("max_rotation_deg", -1.0),
        ("max_overhang", 0.9),
        ("min_luminance_gap", 0.6),
        ("color_jitter", 0.5),
        ("texture_amplitude", 0.5),
        ("background_probs", (0.0, 0.0, 0.0)),
    ],
)
def test_config_validation_error_names_the_field(field: str, value: object):
    with pytest.raises(ValueError, match=field):
        ShapesConfig(**{field: value})


def test_class_id_accepts_names_and_ids():
    assert class_id("ring") == 4
    assert class_id("Heart") == 7
    assert class_id(9) == 9
    assert class_id(np.int64(3)) == 3


@pytest.mark.parametrize("bad", ["hexagon", 10, -1, True])
def test_class_id_rejects_unknown_classes_listing_the_valid_ones(bad: object):
    with pytest.raises(ValueError, match=r"valid classes: 0=circle, 1=square.*9=checker"):
        class_id(bad)


@pytest.mark.parametrize("labels", [[0, 10], [-1], [[0, 1]], [0.5]])
def test_render_batch_rejects_invalid_labels(labels: list):
    with pytest.raises(ValueError, match="labels"):
        render_batch(labels, seed=0)


def test_render_batch_rejects_negative_seed():
    with pytest.raises(ValueError, match="seed"):
        render_batch([0], seed=-1)


def test_contact_sheet_writes_one_row_per_class(tmp_path):
    dataset = make_dataset(40, seed=0)
    path = contact_sheet(dataset, None, tmp_path / "sheet.png", per_class=4, scale=2)
    with Image.open(path) as sheet:
        width, height = sheet.size
    tile = 32 * 2
    assert height >= NUM_CLASSES * tile
    assert width >= 4 * tile


def test_contact_sheet_needs_labels_for_a_bare_tensor(tmp_path):
    with pytest.raises(ValueError, match="labels"):
        contact_sheet(torch.zeros(2, 3, 32, 32), None, tmp_path / "sheet.png")


def test_cli_writes_the_contact_sheet(tmp_path):
    out = tmp_path / "nested" / "sheet.png"
    main(["--out", str(out), "--seed", "0", "--per-class", "2"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
