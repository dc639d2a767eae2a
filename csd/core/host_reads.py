"""Counting the ops whose result the host must read: what makes a CUDA stream wait for the Python loop.

On a GPU, an op whose *result decides what the host does next* (a scalar read, a boolean test, an output whose
size depends on the data) blocks the host until the device has caught up, so the next kernels are not queued
in time. :class:`HostReads` counts those ops on any device, the CPU included, under a dispatch mode:

* scalar reads: ``aten._local_scalar_dense`` (``.item()``, ``int(t)``, ``bool(t)``, ``if t.any():``),
  ``aten.equal``, ``aten.is_nonzero``;
* outputs sized by the data: ``nonzero``, ``masked_select``, ``bincount``, ``unique``, ``repeat_interleave``
  with a tensor of repeats, and indexing or index-assignment with a boolean mask;
* reads through the tensor's Python methods, which the dispatcher does not always see (``int(t)`` and
  ``t.item()`` of an inference tensor skip it): ``tolist``, ``numpy``, ``__array__``, ``item``, ``__int__``,
  ``__float__``, ``__index__`` and ``__bool__``, wrapped while the mode is on and counted once each (the ops
  they dispatch are not counted again).

:func:`reads_per_step` counts a decoding run's reads per AR step inside its loop: the run is stopped (through its
``on_step`` callback) after two different numbers of AR steps, so the reads of set-up cancel in the difference
and teardown is never reached. It counts with :func:`host_reads` by default, or with any counter of the same
shape (the device check counts CUDA's synchronisations so: scripts/gpu_check.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

SCALAR_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
SIZED_BY_DATA = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten.bincount.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
HOST_METHODS = ("tolist", "numpy", "__array__", "item", "__int__", "__float__", "__index__", "__bool__")


def _boolean_index(args: tuple) -> bool:
    """Whether an indexing op's indices hold a boolean mask (its selected count is read from the data)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def is_host_read(func, args: tuple) -> bool:
    """Whether a dispatched op makes the host read its result (or its size) from the device."""
    if func in SCALAR_READS or func in SIZED_BY_DATA:
        return True
    return func in INDEXING and _boolean_index(args)


class HostReads(TorchDispatchMode):
    """Counts the host reads of the ops dispatched while it is on, by name (``counts``) and in all (``total``).

    Use it with :meth:`watching` (which also wraps the tensor methods that read a whole tensor to the host)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self._in_method = False  # inside a wrapped method: counted there, not again by what it dispatches

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_method and is_host_read(func, args):
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @contextmanager
    def watching(self) -> Iterator[HostReads]:
        originals = {name: getattr(torch.Tensor, name) for name in HOST_METHODS}

        def counted(name: str, method: Callable) -> Callable:
            def read(tensor, *args, **kwargs):
                if self._in_method:
                    return method(tensor, *args, **kwargs)
                self.counts[name] += 1
                self._in_method = True
                try:
                    return method(tensor, *args, **kwargs)
                finally:
                    self._in_method = False

            return read

        try:
            for name, method in originals.items():
                setattr(torch.Tensor, name, counted(name, method))
            with self:
                yield self
        finally:
            for name, method in originals.items():
                setattr(torch.Tensor, name, method)


@contextmanager
def host_reads() -> Iterator[Counter]:
    """The host reads of what runs inside, by op (:class:`HostReads` watching)."""
    with HostReads().watching() as counter:
        yield counter.counts


Watch = Callable[[], AbstractContextManager[Counter]]  # counts what runs inside it, by kind


class _Stop(Exception):
    """Raised by the counting callback once a run has made the AR steps asked for."""


COMMITTING = ("target", "pre-fill", "verify")  # the phases whose report ends committed AR steps


def reads_until(run: Callable[[Callable], object], steps: int, watch: Watch = host_reads) -> tuple[int, Counter]:
    """The host reads (what ``watch`` counts) of ``run(on_step)`` until ``on_step`` first reports
    ``done >= steps`` after committing (a phase in :data:`COMMITTING`: not a CSD run's drafted steps); the run is
    stopped there. Returns the AR steps committed then (a block may end past ``steps``) and the reads by op."""
    stopped_at = [0]

    def on_step(done: int, total: int, phase: str) -> None:
        if done >= steps and phase in COMMITTING:
            stopped_at[0] = done
            raise _Stop

    try:
        with watch() as counts:
            run(on_step)
    except _Stop:
        pass
    if not stopped_at[0]:
        raise ValueError(f"the run ended before committing {steps} AR steps")
    return stopped_at[0], counts


def reads_per_step(
    run: Callable[[Callable], object], first: int, second: int, watch: Watch = host_reads
) -> tuple[float, Counter]:
    """Host reads (what ``watch`` counts) per AR step inside a run's loop, in all and by op: the reads until
    ``second`` AR steps less those until ``first``, over the steps committed between the two stops.
    ``run(on_step)`` makes one generation reporting through ``on_step``; it runs three times (the first
    uncounted)."""
    if not 0 < first < second:
        raise ValueError(f"need 0 < first < second AR steps, got {first} and {second}")
    reads_until(run, first, watch)  # uncounted: what a first run does once (a cache filled) is not the loop's
    (low_at, low), (high_at, high) = reads_until(run, first, watch), reads_until(run, second, watch)
    if high_at <= low_at:
        raise ValueError(f"the two stops committed the same AR steps ({low_at}): ask for steps further apart")
    diff = Counter({k: high[k] - low[k] for k in set(high) | set(low) if high[k] != low[k]})
    return sum(diff.values()) / (high_at - low_at), diff
