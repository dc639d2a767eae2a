"""Specification of depth growth (csd.training.grow): a deeper model that computes the same function, ready to train.
The grown and the source model are compared in float64 (float64 copies of both, csd.core.precision.at_precision), the
exact reference (tests/helpers.py): equal up to float64 rounding on every CPU."""

from __future__ import annotations

import json

import pytest
import torch

from csd.core.precision import at_precision
from csd.models.checkpoint import CheckpointError
from csd.models.registry import load_model
from csd.models.tokenizer import PixelTokenizer
from csd.shapes.data import make_dataset
from csd.training.grow import block_positions, grow_depth, main
from csd.training.trainer import Trainer, train
from tests.helpers import assert_same64
from tests.training.test_train import TINY, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch(n: int = 8):
    """Tokens in float64 and labels."""
    data = make_dataset(n, 3)
    return PixelTokenizer(patch_size=4).encode(data.images).double(), data.labels


def _trained(tmp_path):
    """A tiny model trained for a few steps (non-trivial weights) and its files."""
    train(tiny_config(tmp_path / "src", steps=4))
    return load_model(tmp_path / "src.safetensors")


def test_old_blocks_are_spread_evenly_in_order():
    assert block_positions(6, 8) == [0, 1, 2, 4, 5, 6]
    assert block_positions(2, 4) == [0, 2]
    assert block_positions(3, 3) == [0, 1, 2]
    for old, new in ((1, 5), (6, 9), (4, 7)):
        pos = block_positions(old, new)
        assert pos[0] == 0 and pos == sorted(set(pos)) and pos[-1] < new
    with pytest.raises(ValueError, match="depth must be >= the source model's 6, got 5"):
        block_positions(6, 5)


@pytest.mark.kernels
def test_grown_model_computes_the_same_loss_and_backbone_output(tmp_path):
    model = _trained(tmp_path)
    grown = grow_depth(model, encoder_depth=3, decoder_depth=2)
    assert (grown.config.encoder_depth, grown.config.decoder_depth) == (3, 2)
    assert len(grown.encoder_blocks) == 3 and len(grown.decoder_blocks) == 2
    tokens, labels = _batch()
    model64 = at_precision(model, "float64")
    with torch.no_grad():
        for seed in range(3):
            a = model64(tokens, labels, torch.Generator().manual_seed(seed))
            grown_s = at_precision(grow_depth(model, 3, 2, torch.Generator().manual_seed(seed)), "float64")
            b = grown_s(tokens, labels, torch.Generator().manual_seed(seed))
            assert_same64(b, a, f"the loss, new blocks from seed {seed}")
    # The new blocks are not copies of the old ones: their inner layers are freshly initialised.
    new = grown.encoder_blocks[1]  # block_positions(1, 3) == [0]
    assert torch.count_nonzero(new.attn.proj.weight) == 0 and torch.count_nonzero(new.mlp.fc2.weight) == 0
    assert not torch.equal(new.attn.qkv.weight, model.encoder_blocks[0].attn.qkv.weight)


def test_the_new_layers_come_from_the_generator_and_the_global_one_is_left_alone(tmp_path):
    """grow_depth draws the new blocks' init from the generator it is given (the numbers torch.manual_seed(s)
    would give, so committed grown weights stay reproducible) and never reseeds the caller's generator."""
    from csd.models.mar import MAR

    model = _trained(tmp_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        expected = MAR(grow_depth(model, 3, 2).config).encoder_blocks[1].attn.qkv.weight  # the old seeded init
        torch.manual_seed(99)
        before = torch.rand(3)
        torch.manual_seed(99)
        gen = torch.Generator().manual_seed(5)
        grown = grow_depth(model, 3, 2, gen)
        assert torch.equal(torch.rand(3), before)  # the caller's stream goes on as if nothing happened
    assert torch.equal(grown.encoder_blocks[1].attn.qkv.weight, expected)
    assert not torch.equal(gen.get_state(), torch.Generator().manual_seed(5).get_state())  # it drew from gen
    again = grow_depth(model, 3, 2, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(grown.state_dict().values(), again.state_dict().values(), strict=True))


@pytest.mark.kernels
def test_grown_head_computes_the_same_function_and_learns(tmp_path):
    model = _trained(tmp_path)
    grown = grow_depth(model, encoder_depth=1, decoder_depth=1, head_depth=3)
    assert grown.config.diffloss_d == 3 and len(grown.diffloss.net.res_blocks) == 3
    tokens, labels = _batch()
    gen = torch.Generator().manual_seed(1)
    x, z = (
        torch.randn(16, tokens.shape[-1], generator=gen).double(),
        torch.randn(16, model.config.decoder_embed_dim, generator=gen).double(),
    )
    t = torch.randint(0, 1000, (16,), generator=gen)
    model64, grown64 = at_precision(model, "float64"), at_precision(grown, "float64")
    with torch.no_grad():
        assert_same64(grown64.diffloss.net(x, t, z), model64.diffloss.net(x, t, z), "the head's output")
        a = model64(tokens, labels, torch.Generator().manual_seed(0))
        b = grown64(tokens, labels, torch.Generator().manual_seed(0))
    assert_same64(b, a, "the loss")
    kept, new = grown.diffloss.net.res_blocks[0], grown.diffloss.net.res_blocks[1]  # block_positions(1, 3) == [0]
    assert torch.equal(kept.mlp[0].weight, model.diffloss.net.res_blocks[0].mlp[0].weight)
    assert torch.count_nonzero(new.adaLN_modulation[-1].weight) == 0  # gate 0: the identity
    # One optimiser step moves the new block's modulation off zero (its gradient is the MLP's output).
    grown.train()
    opt = torch.optim.SGD(grown.parameters(), lr=0.1)
    grown(tokens.float(), labels, torch.Generator().manual_seed(0)).backward()
    opt.step()
    assert torch.count_nonzero(new.adaLN_modulation[-1].weight) > 0
    with pytest.raises(ValueError, match="head_depth must be >= the source model's 1, got 0"):
        grow_depth(model, encoder_depth=1, decoder_depth=1, head_depth=0)
    # The command line passes --head-depth through and records it.
    main([str(tmp_path / "src.safetensors"), "--encoder-depth", "1", "--decoder-depth", "1", "--head-depth", "2",
          "--out", str(tmp_path / "h")])  # fmt: skip
    state = torch.load(tmp_path / "h.train_state.pt", weights_only=True)
    assert state["args"]["head_depth"] == [1, 2]
    assert "diffloss.net.res_blocks.1.mlp.0.weight" in state["model"]


def test_grown_train_state_trains_under_init_from(tmp_path):
    _trained(tmp_path)
    main(
        [
            str(tmp_path / "src.safetensors"),
            "--encoder-depth",
            "2",
            "--decoder-depth",
            "2",
            "--out",
            str(tmp_path / "g"),
        ]
    )
    state_path = tmp_path / "g.train_state.pt"
    cfg = tiny_config(
        tmp_path / "child",
        steps=3,
        init_from=str(state_path),
        model_overrides={**TINY, "encoder_depth": 2, "decoder_depth": 2},
    )
    child = Trainer(cfg)
    child.init_from(cfg.init_from)
    assert not child.optimizer.state_dict()["state"]  # fresh AdamW moments
    before = child.model.encoder_blocks[1].mlp.fc2.weight.clone()
    done = train(cfg)
    assert not torch.equal(done.model.encoder_blocks[1].mlp.fc2.weight, before)  # the new block learns
    record = json.loads((tmp_path / "child.json").read_text())["train"]
    assert record["parent"]["args"]["encoder_depth"] == [1, 2]
    assert record["parent"]["args"]["head_depth"] == [1, 1]  # the head is kept unless --head-depth is given
    assert record["parent"]["parent"]["steps_done"] == 4  # the source's own training record is kept
    assert load_model(tmp_path / "child.safetensors").config.encoder_depth == 2


def test_bad_input_names_the_parameter_or_file(tmp_path):
    model = _trained(tmp_path)
    with pytest.raises(ValueError, match="encoder_depth must be >= the source model's 1, got 0"):
        grow_depth(model, encoder_depth=0, decoder_depth=1)  # shrinking is not growth
    missing = tmp_path / "absent.safetensors"
    with pytest.raises(CheckpointError, match="absent.safetensors"):
        main([str(missing), "--encoder-depth", "2", "--decoder-depth", "2", "--out", str(tmp_path / "g")])
