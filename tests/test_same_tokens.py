"""The same seeds give the same tokens as before the package was reorganised: short target-only and
CSD runs (aligned and exact criteria) on the untrained and the embedded pair, against tokens saved
then (tests/data/make_golden_tokens.py)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.data.make_golden_tokens import runs

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_tokens.safetensors"


@pytest.fixture(scope="module")
def fresh():
    threads = torch.get_num_threads()
    try:
        yield runs()  # one thread, as when the tokens were saved
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("key", sorted(load_file(GOLDEN)))
def test_tokens_equal_those_saved_before_the_move(fresh, key):
    torch.testing.assert_close(fresh[key], load_file(GOLDEN)[key], rtol=1e-5, atol=1e-5)
