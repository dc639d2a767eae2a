"""xAR as the samplers see it (:class:`csd.family.ModelFamily`): whole cells are the tokens, one cell per
AR step in raster order of cells, CFG ramped over the cells; a step's chain is the flow sampler over
the next cell against a KV cache of the clean cells before it, and a drafted block is verified in one
pass per flow step (each drafted cell attends to the clean cells before it and to itself).

The KV cache is the generation's (:class:`XARState`) and grows as the official sampler's does: each clean
cell is encoded once, its keys and values appended. The state keeps the cells it encoded, and a call reuses
the longest run of them its context starts with, so a drafted cell that is later redrawn is encoded again
and no caller has to say which cells were committed.

The network (:class:`csd.models.xar.network.XAR`) mixes this in and provides ``config``, ``traits``,
``null_class`` and ``context_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from csd.config import PRECISIONS
from csd.family import ModelState, Plan
from csd.models.mar.adapter import check_labels
from csd.models.tokenizer import CellTokenizer
from csd.models.xar.chains import CellChain, CellCondition, CellFlow, JoinedCells


def cfg_ramp(cfg: float, cell: int, cells: int) -> float:
    """xAR's guidance per cell: 1 at the first cell, rising linearly to ``cfg`` at the last."""
    return cfg if cells == 1 else 1.0 + (cfg - 1.0) * cell / (cells - 1)


@dataclass
class XARState(ModelState):
    """An xAR model's state over one generation: beside its labels and settings, the clean cells it has
    encoded (``cells`` (B, m * cell_len, d)) and every block's keys and values of them (``kv``: (k, v) per
    block, (B', heads, m * cell_len, head_dim), B' = 2B when guided: the labels' half, then the null class's)."""

    cells: Tensor | None = None
    kv: list[tuple[Tensor, Tensor]] | None = None
    valid: int = 0  # cells held that equal the canvas's, as the decoding loop keeps it (see rewind)

    def rewind(self, known: int) -> None:
        """Cells from ``known`` on may have changed: encoded again at the next pass that reads them."""
        self.valid = min(self.valid, known)


def reused_tokens(cached: Tensor | None, clean: Tensor, cell_len: int) -> int:
    """How many tokens, in whole cells, ``clean`` (B, n, d) starts with that equal those of ``cached``
    (B, m, d) in every image (one read on the host)."""
    n = 0 if cached is None else min(cached.shape[1], clean.shape[1])
    if n == 0:
        return 0
    same = (cached[:, :n] == clean[:, :n]).all(-1).all(0).reshape(-1, cell_len).all(-1)  # (cells,)
    return int(same.cumprod(0).sum()) * cell_len


def _first_cell(pos: Tensor, k: int, known: int | None, message: str) -> int:
    """The first of the k consecutive cells every image makes at ``pos`` (B, k): ``known`` where the caller
    knows it (checked on the device: the host reads nothing), else read from ``pos`` and checked there."""
    if pos.shape[1] != k:
        raise ValueError(message)
    first = int(pos[0, 0]) if known is None else known
    same = (pos == torch.arange(first, first + k, device=pos.device)).all()
    if known is None:
        if not bool(same):
            raise ValueError(message)
    else:
        torch._assert_async(same, message)
    return first


class XARFamily:
    """:class:`csd.family.ModelFamily` for xAR models (see the module doc)."""

    def check_conditions(self, conditions, batch: int, device: torch.device) -> Tensor:
        return check_labels(conditions, self.traits.num_classes, batch, device)

    def plan(self, seeds, config, device: torch.device) -> Plan:
        cells = self.config.cells
        orders = torch.arange(cells - 1, -1, -1, device=device).expand(len(seeds), -1)  # cell 0 first
        return Plan(orders, [1] * cells, [cfg_ramp(config.cfg_scale, s, cells) for s in range(cells)])

    def head_steps(self, steps: int | None) -> int:
        return steps or self.config.flow_steps

    def start(self, conditions, config) -> XARState:
        """A generation's state: its labels and settings, the KV cache empty."""
        return XARState(conditions, config)

    def predict(self, state: XARState, tokens, mask, pos, cfg, steps, known=None) -> CellChain:
        """The chain of the next cell of every image: its context is every earlier cell, clean. ``known``:
        the cells made so far (the next one's index), where the caller knows it; None reads it from ``pos``."""
        cell = _first_cell(pos, 1, known, "xAR predicts one cell per AR step, the same for every image")
        return self._chain(state, tokens[:, :cell], cell, 1, cfg, steps, known is not None)

    def verify(self, state: XARState, tokens, mask, pos, cfg, steps, drafted=None, sizes=None, known=None) -> CellChain:
        """The chains of a drafted block of consecutive cells in one pass per flow step: each drafted
        cell conditioned on the clean cells before it, the context's and the drafted ones (what the exact
        block asks for, ``sizes`` given or not)."""
        k = pos.shape[1]
        first = _first_cell(pos, k, known, "xAR verifies consecutive cells, the same for every image")
        if drafted is None:
            raise ValueError("xAR verifies each drafted cell given the cells drafted before it: pass drafted")
        b = tokens.shape[0]
        clean = torch.cat([tokens[:, :first], drafted.reshape(b, k, -1)[:, : k - 1].to(tokens.dtype)], dim=1)
        return self._chain(state, clean, first, k, cfg, steps, known is not None)

    def _chain(
        self, state: XARState, clean_cells: Tensor, first: int, k: int, cfg, steps, loop: bool = False
    ) -> CellChain:
        """Chains of cells first .. first + k - 1 over the clean cells (B, C, cell width) before the last.
        ``loop``: called by the decoding loop (which rewinds the state after every block), see :meth:`_context`."""
        b, c, config = clean_cells.shape[0], self.config, state.config
        cache = self._context(state, clean_cells.reshape(b, -1, c.token_dim), loop)
        cond = CellCondition(state.conditions, first, k, cache, cfg if config.guided else None)
        sampler = config.sampler.kind or "euler-maruyama"
        flow = CellFlow(self, self.head_steps(steps), PRECISIONS[config.precision], sampler, config.sampler.flow_grid)
        return CellChain(flow, cond, config.temperature)

    def _context(self, state: XARState, clean: Tensor, loop: bool = False) -> list[tuple[Tensor, Tensor]] | None:
        """Every block's keys and values of the clean cells (B, n, d) (None for none), from the state's cache:
        the cells it already holds are read, the others encoded (once) and appended. Which cells it holds are
        still the canvas's: under the decoding loop, its ``valid`` ones (the loop rewinds the state after every
        block: :meth:`XARState.rewind`); for any other caller, those equal to ``clean`` (compared: a read on
        the host)."""
        n, cell = clean.shape[1], self.config.cell_len
        held = 0 if state.cells is None else min(state.cells.shape[1], n)
        kept = min(state.valid * cell, held) if loop else reused_tokens(state.cells, clean, cell)
        if kept < n:
            labels, guided = state.conditions, state.config.guided
            new = clean[:, kept:]
            both = torch.cat([labels, torch.full_like(labels, self.null_class)]) if guided else labels
            past = None if kept == 0 else _first_tokens(state.kv, kept)
            precision = PRECISIONS[state.config.precision]
            with torch.autocast(clean.device.type, dtype=precision or torch.float32, enabled=precision is not None):
                state.kv = self.context_cache(torch.cat([new, new]) if guided else new, both, past)
            state.cells = torch.cat([state.cells[:, :kept], new], dim=1) if kept else new.clone()
        state.valid = n // cell
        return None if n == 0 else _first_tokens(state.kv, n)

    def join(self, chains, batch: int) -> JoinedCells:
        return JoinedCells(tuple(chains))

    def check_draft(self, draft) -> None:
        """Nothing beyond the shared layout (:func:`csd.run_setup.check_pair`): CSD runs the draft on the
        target's flow steps."""

    def token_layout(self, raster_tokenizer) -> CellTokenizer:
        """The tokenizer of this model's tokens (cells) over a raster tokenizer of its grid."""
        return CellTokenizer(raster_tokenizer, self.config.grid, self.config.cells)


def _first_tokens(kv: list[tuple[Tensor, Tensor]], n: int) -> list[tuple[Tensor, Tensor]]:
    """The keys and values of the first n tokens of every block (views)."""
    return [(k[:, :, :n], v[:, :, :n]) for k, v in kv]
