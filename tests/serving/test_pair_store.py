"""Model pairs for the app: discovery on disk, loading once, read-only sharing, decoding."""

import threading

import pytest
import torch

from csd.models.mar import MAR, tiny_pixel_config
from csd.models.registry import save_model
from csd.models.tokenizer import pixel_tokenizer
from csd.serving.pairs import (
    RANDOM_SOURCE,
    PairSource,
    PairStore,
    discover,
    pair_specs,
    random_pair,
)
from csd.shapes.data import CLASS_NAMES
from tests.helpers import pair_name


def test_nothing_is_discovered_in_an_empty_directory(tmp_path):
    assert discover(tmp_path / "checkpoints", embedded_dir=tmp_path) == []


def test_embedded_pair_is_discovered_and_loads_as_pixel_models(tmp_path):
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        save_model(MAR(tiny_pixel_config(32, 1)), tmp_path / "shapes_target.safetensors")
        save_model(MAR(tiny_pixel_config(32, 1)), tmp_path / "shapes_draft.safetensors")
    (source,) = discover(None, embedded_dir=tmp_path)
    assert source.name == pair_name("mar", "embedded") and source.class_names == CLASS_NAMES
    pair = source.load(torch.device("cpu"))
    assert pair.weights == source.weights and pair.weights.startswith("sha256:")
    assert pair.num_tokens == 64 and pair.tokenizer.patch_size == 4
    images = pair.images(torch.zeros(2, 64, 48))
    assert images.shape == (2, 32, 32, 3) and images.dtype == torch.uint8


def test_official_pairs_need_the_draft_the_tokenizer_and_their_target(tmp_path):
    for rel in ("mar/mar_base/checkpoint-last.pth", "mar/mar_large/checkpoint-last.pth", "vae/kl16.ckpt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    names = [s.name for s in discover(tmp_path, embedded_dir=tmp_path / "none")]
    assert names == [s.name for s in pair_specs("official") if s.target == "mar_large"]
    (tmp_path / "vae/kl16.ckpt").unlink()
    assert discover(tmp_path, embedded_dir=tmp_path / "none") == []


def test_store_loads_each_pair_once_and_shares_frozen_models():
    calls = []

    def load(device):
        calls.append(device)
        return RANDOM_SOURCE.load(device)

    store = PairStore([PairSource("p", CLASS_NAMES, "random:0", load, RANDOM_SOURCE.traits)], torch.device("cpu"))
    first, second = store.get("p"), store.get("p")
    assert first is second and len(calls) == 1
    for model in (first.target, first.draft):
        assert not model.training and not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="model pair must be one of"):
        store.get("q")


def test_while_one_pair_loads_the_store_hands_out_the_others_and_loads_it_once():
    """A slow load (a large official pair) holds only its own pair: another pair is handed out and
    :meth:`PairStore.loaded` answers at once, and a second request for the pair loading waits for the one load."""
    started, release, calls = threading.Event(), threading.Event(), []

    def slow_load(device):
        calls.append(device)
        started.set()
        assert release.wait(60)
        return RANDOM_SOURCE.load(device)

    slow = PairSource("slow", CLASS_NAMES, "random:0", slow_load, RANDOM_SOURCE.traits)
    store = PairStore([RANDOM_SOURCE, slow], torch.device("cpu"))
    ready = store.get(RANDOM_SOURCE.name)
    got = []
    loading = [threading.Thread(target=lambda: got.append(store.get("slow")), daemon=True) for _ in range(2)]
    loading[0].start()
    assert started.wait(30)
    loading[1].start()
    answers = []
    asking = threading.Thread(target=lambda: answers.append((store.loaded("slow"), store.get(RANDOM_SOURCE.name))))
    asking.start()
    asking.join(1.0)
    release.set()
    for thread in loading:
        thread.join(60)
    assert answers == [(None, ready)]  # within the second, while "slow" was still loading
    assert len(calls) == 1 and len(got) == 2 and got[0] is got[1] is store.loaded("slow")


def test_pixel_tokenizer_needs_rgb_patches():
    assert pixel_tokenizer(48).patch_size == 4
    with pytest.raises(ValueError, match="not an RGB pixel patch"):
        pixel_tokenizer(47)


def test_the_untrained_pair_leaves_the_global_generator_alone():
    with torch.random.fork_rng(devices=[]):  # this test's own seeding stays in it too
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        random_pair()
        torch.testing.assert_close(torch.rand(3), expected)


def test_official_xar_pairs_are_discovered_and_load_with_the_targets_flow_steps(tmp_path, monkeypatch):
    """DIR/xar/xAR-{B,L}.pth and the KL-16 tokenizer make an xAR-L / xAR-B pair (tiny stand-ins of the
    official configs here): 4 cells, the draft on the target's time grid, images from latent cells."""
    from functools import partial

    from csd.config import CSDConfig, SamplingConfig
    from csd.models import vae, xar
    from csd.speculative import speculative_generate

    tiny = lambda steps: xar.XARConfig(
        embed_dim=32,
        encoder_depth=1,
        decoder_depth=1,
        encoder_num_heads=2,
        decoder_num_heads=2,
        token_dim=4,
        flow_steps=steps,
    )
    monkeypatch.setitem(xar.XAR_CONFIGS, "xar_base", tiny(40))
    monkeypatch.setitem(xar.XAR_CONFIGS, "xar_large", tiny(50))
    monkeypatch.setattr(vae, "load_kl16", partial(vae.load_kl16, config="tiny"))
    (tmp_path / "xar").mkdir()
    (tmp_path / "vae").mkdir()
    with torch.random.fork_rng(devices=[]):  # layer init reads the global generator
        torch.manual_seed(0)
        for config, name in (("xar_base", "xAR-B.pth"), ("xar_large", "xAR-L.pth")):
            torch.save(xar.XAR(xar.XAR_CONFIGS[config]).state_dict(), tmp_path / "xar" / name)
        assert discover(tmp_path, embedded_dir=tmp_path / "none") == []  # no tokenizer yet
        torch.save({"model": vae.KLAutoencoder("tiny").state_dict()}, tmp_path / "vae" / "kl16.ckpt")
    (source,) = discover(tmp_path, embedded_dir=tmp_path / "none")
    assert (
        source.name == "xAR-L / xAR-B (ImageNet)"
        and source.traits.fixed_num_steps == 4
        and len(source.class_names) == 1000
    )
    pair = source.load(torch.device("cpu"))
    assert pair.draft.config.flow_steps == pair.target.config.flow_steps == 50
    sampling = SamplingConfig(num_steps=4, cfg_schedule="linear", head_steps=3)
    out = speculative_generate(pair.target, pair.draft, [7], [0], sampling, CSDConfig(gamma=2))
    assert out.trace.target_passes == 1 + 2  # one pre-filled cell, blocks of 2 and 1
    assert pair.images(out.tokens).shape == (1, 32, 32, 3)
