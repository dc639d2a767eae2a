"""The host-read counter sees every kind of read that makes a GPU stream wait for the host, and nothing else."""

from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager

import pytest
import torch

from csd.core.host_reads import HostReads, reads_per_step, reads_until


def test_each_kind_of_host_read_is_counted_once_and_device_side_ops_not_at_all():
    x = torch.arange(6.0)
    mask, idx = x > 2, torch.tensor([0, 2])
    with HostReads().watching() as reads:
        y = (x * 2 + 1).exp().sum(0)  # device-side: no read
        x.index_select(0, idx), x[idx], torch.where(mask, x, 0.0)  # integer indexing and selects: no read
        assert reads.total == 0
        float(y), bool(mask.any())  # two scalar reads
        x[mask], mask.nonzero()  # sized by the data
        x[mask] = 0.0  # index-assignment through a mask
        torch.bincount(idx), torch.repeat_interleave(idx)
        x.tolist(), x.numpy()
    assert reads.counts == {
        "__float__": 1,
        "__bool__": 1,
        "index": 1,
        "nonzero": 1,
        "index_put_": 1,
        "bincount": 1,
        "repeat_interleave": 1,
        "tolist": 1,
        "numpy": 1,
    }
    assert torch.Tensor.tolist is not None and "read" not in torch.Tensor.tolist.__qualname__  # methods restored


def _loop(reads_per_step: int, setup_reads: int):
    """A decoding-shaped run: set-up reads, then AR steps each reading ``reads_per_step`` times."""

    def run(on_step):
        x = torch.ones(3)
        for _ in range(setup_reads):
            x.sum().item()
        for s in range(12):
            for _ in range(reads_per_step):
                bool(x.any())
            on_step(s + 1, 12, "target")
        x.tolist()  # teardown, never reached by a counting stop

    return run


@pytest.mark.parametrize("per_step", [0, 1, 3])
def test_reads_per_step_cancels_set_up_and_stops_before_teardown(per_step):
    total, by_op = reads_per_step(_loop(per_step, setup_reads=5), 4, 10)
    assert total == per_step and sum(by_op.values()) == 6 * per_step
    assert reads_until(_loop(per_step, 5), 4) == (4, {"item": 5, "__bool__": 4 * per_step} if per_step else {"item": 5})


def test_scalar_reads_of_inference_tensors_are_counted():
    """Under inference mode, ``int(t)`` and ``t.item()`` do not reach a dispatch mode: the wrapped methods see
    them, each once."""
    with torch.inference_mode():
        t = torch.arange(4)
        with HostReads().watching() as reads:
            int(t.sum()), t.sum().item(), float(t[0]), bool(t.any()), [0, 1][t[1]]
    assert reads.counts == {"__int__": 1, "item": 1, "__float__": 1, "__bool__": 1, "__index__": 1}


def test_what_a_first_run_does_once_is_not_counted_as_the_loops():
    done = []

    def run(on_step):
        if not done:  # a cache filled by the first run only
            done.append(torch.ones(4).tolist())
        for s in range(12):
            on_step(s + 1, 12, "target")

    assert reads_per_step(run, 4, 8) == (0.0, {})


def test_drafted_steps_do_not_stop_the_count_and_a_short_run_is_named():
    def run(on_step):
        for s in range(8):
            on_step(s + 1, 8, "draft")  # drafted, not committed
            if s % 4 == 3:
                torch.ones(1).item()
                on_step(s + 1, 8, "verify")

    assert reads_until(run, 2) == (4, {"item": 1})
    with pytest.raises(ValueError, match="ended before committing 9"):
        reads_until(run, 9)


@contextmanager
def warned():
    """Counts the warnings raised inside, by message (as the device check counts CUDA's synchronisations)."""
    counts = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield counts
        finally:
            counts.update(str(w.message) for w in caught)


def test_another_counter_counts_per_step_between_the_same_stops():
    def run(on_step):
        warnings.warn("set-up", stacklevel=1)
        for s in range(12):
            warnings.warn("sync", stacklevel=1)
            warnings.warn("sync", stacklevel=1)
            on_step(s + 1, 12, "target")

    assert reads_per_step(run, 4, 10, warned) == (2.0, {"sync": 12})
    assert reads_until(run, 4, warned) == (4, {"set-up": 1, "sync": 8})
