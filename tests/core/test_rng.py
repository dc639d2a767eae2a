"""Per-image streams: each image's numbers are its own CPU generator's, seeded from (seed, stream), whatever
the batch and whatever device the draws are placed on."""

from __future__ import annotations

import torch

from csd.core.rng import ImageStreams, stream_seed


def test_each_images_draws_are_its_cpu_generators_whatever_the_batch():
    streams = ImageStreams([5, 9], "chain")
    normal, uniform, perm = streams.randn(3, 4), streams.rand(2), streams.randperm(6)
    for i, seed in enumerate((5, 9)):
        g = torch.Generator().manual_seed(stream_seed(seed, "chain"))
        assert torch.equal(normal[i], torch.randn((3, 4), generator=g))
        assert torch.equal(uniform[i], torch.rand((2,), generator=g))
        assert torch.equal(perm[i], torch.randperm(6, generator=g))
    alone = ImageStreams([9], "chain")
    assert torch.equal(alone.randn(3, 4)[0], normal[1])


def test_rows_are_drawn_image_by_image_and_an_image_with_none_draws_nothing():
    streams = ImageStreams([1, 2, 3], "resample")
    rows = streams.randn_rows(torch.tensor([2, 0, 1]), 4)
    assert rows.shape == (3, 4)
    first, second, third = (torch.Generator().manual_seed(stream_seed(s, "resample")) for s in (1, 2, 3))
    assert torch.equal(rows[:2], torch.randn((2, 4), generator=first))
    assert torch.equal(rows[2], torch.randn((1, 4), generator=third)[0])
    after = streams.randn(1)  # the second image's stream was not advanced by its zero rows
    assert torch.equal(after[1], torch.randn((1,), generator=second))


def test_draws_are_made_on_the_host_and_placed_on_the_streams_device():
    streams = ImageStreams([4], "accept", device="meta")  # a device with no data: only where the draw lands
    assert all(g.device.type == "cpu" for g in streams.generators)
    drawn = streams.rand(5)
    assert drawn.device.type == "meta" and drawn.shape == (1, 5)
    assert streams.randn_rows(torch.tensor([2]), 3).device.type == "meta"
