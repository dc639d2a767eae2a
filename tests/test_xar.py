"""xAR's architecture: the official parameter counts, the official module tree and numbers, the layout
of cells and the block-causal attention.

tests/data/xar_reference.pt was made by tests/data/make_xar_reference.py from the official code."""

from pathlib import Path

import pytest
import torch

from csd.models.xar import XAR, block_causal_mask, cell_order, xar_config

REF = torch.load(Path(__file__).parent / "data" / "xar_reference.pt", weights_only=True)


@pytest.mark.parametrize("name,millions", [("xar_base", 172.6), ("xar_large", 608.4), ("xar_huge", 1186.0)])
def test_parameter_counts_equal_the_official_ones(name, millions):
    with torch.device("meta"):  # no memory: only the shapes
        model = XAR(xar_config(name))
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions


@pytest.fixture(scope="module")
def model() -> XAR:
    m = XAR(xar_config("xar_base", embed_dim=32, encoder_depth=1, decoder_depth=1, num_heads=2)).eval()
    m.load_state_dict(REF["state"], strict=True)  # parameters and buffers (mask, RoPE tables)
    return m


def test_the_official_state_dict_loads_strictly_buffers_included(model):
    assert set(model.state_dict()) == set(REF["state"])
    for k in ("mask", "encoder_blocks.0.attn.rope.freqs_cos", "decoder_blocks.0.attn.rope.freqs_sin"):
        torch.testing.assert_close(model.state_dict()[k], REF["state"][k])  # our tables equal theirs


def test_velocity_of_a_whole_sequence_matches_the_official_network(model):
    with torch.no_grad():
        v = model.velocity(REF["x"], REF["labels"], REF["t"])
    torch.testing.assert_close(v, REF["v"], rtol=1e-4, atol=1e-5)


def test_cells_are_row_major_blocks_and_attention_is_block_causal():
    order = cell_order(4, 4)  # a 4 x 4 grid in 4 cells of 2 x 2
    assert order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    mask = block_causal_mask(3, 2)[0, 0]
    assert (mask == 0).int().tolist() == [[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2 + [[1] * 6] * 2


def test_a_cell_never_sees_later_cells(model):
    x, labels, t = REF["x"].clone(), REF["labels"], REF["t"]
    with torch.no_grad():
        v = model.velocity(x, labels, t)
        x[:, 128:] += 1.0  # change cells 2 and 3
        w = model.velocity(x, labels, t)
        prefix = model.velocity(REF["x"][:, :128], labels, t[:, :2])  # cells 0 and 1 alone
    torch.testing.assert_close(w[:, :128], v[:, :128], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(prefix, v[:, :128], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(w[:, 128:], v[:, 128:])


def test_training_loss_is_flow_matching_and_seeded():
    m = XAR(xar_config("xar_test"))
    tokens, labels = torch.randn(3, 16, 16), torch.tensor([1, 2, 3])
    a = m(tokens, labels, torch.Generator().manual_seed(0))
    b = m(tokens, labels, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.item() > 0
    a.backward()
    assert m.pred.weight.grad.abs().sum() > 0


def test_bad_configs_are_refused_by_name():
    with pytest.raises(ValueError, match=r"cells \(3\) must be a square"):
        xar_config("xar_test", cells=3)
    with pytest.raises(ValueError, match="multiple of 4"):
        xar_config("xar_test", embed_dim=36, num_heads=6)
