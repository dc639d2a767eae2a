"""xAR as the samplers see it (:class:`csd.family.ModelFamily`): whole cells are the tokens, one cell per
AR step in raster order of cells, CFG ramped over the cells; a step's chain is the flow sampler over
the next cell against a KV cache of the clean cells before it, and a drafted block is verified in one
pass per flow step (each drafted cell attends to the clean cells before it and to itself).

The network (:class:`csd.models.xar.network.XAR`) mixes this in and provides ``config``, ``traits``,
``null_class`` and ``context_cache``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from csd.config import PRECISIONS
from csd.family import Plan
from csd.models.mar.adapter import check_labels
from csd.models.tokenizer import CellTokenizer
from csd.models.xar.chains import CellChain, CellCondition, CellFlow, JoinedCells


def cfg_ramp(cfg: float, cell: int, cells: int) -> float:
    """xAR's guidance per cell: 1 at the first cell, rising linearly to ``cfg`` at the last."""
    return cfg if cells == 1 else 1.0 + (cfg - 1.0) * cell / (cells - 1)


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

    def predict(self, tokens, mask, conditions, pos, cfg, config, steps) -> CellChain:
        """The chain of the next cell of every image: its context is every earlier cell, clean."""
        cell = int(pos[0, 0])
        if pos.shape[1] != 1 or bool((pos != cell).any()):
            raise ValueError("xAR predicts one cell per AR step, the same for every image")
        return self._chain(tokens[:, :cell], conditions, cell, 1, cfg, config, steps)

    def verify(self, tokens, mask, conditions, pos, cfg, config, steps, drafted=None, sizes=None) -> CellChain:
        """The chains of a drafted block of consecutive cells in one pass per flow step: each drafted
        cell conditioned on the clean cells before it, the context's and the drafted ones (what the exact
        block asks for, ``sizes`` given or not)."""
        first, k = int(pos[0, 0]), pos.shape[1]
        expected = torch.arange(first, first + k, device=pos.device)
        if bool((pos != expected).any()):
            raise ValueError("xAR verifies consecutive cells, the same for every image")
        if drafted is None:
            raise ValueError("xAR verifies each drafted cell given the cells drafted before it: pass drafted")
        b = tokens.shape[0]
        clean = torch.cat([tokens[:, :first], drafted.reshape(b, k, -1)[:, : k - 1].to(tokens.dtype)], dim=1)
        return self._chain(clean, conditions, first, k, cfg, config, steps)

    def _chain(self, clean_cells: Tensor, labels: Tensor, first: int, k: int, cfg, config, steps) -> CellChain:
        """Chains of cells first .. first + k - 1 over the clean cells (B, C, cell width) before the last."""
        b, c = clean_cells.shape[0], self.config
        clean = clean_cells.reshape(b, -1, c.token_dim)
        guided = config.guided
        both = torch.cat([labels, torch.full_like(labels, self.null_class)]) if guided else labels
        precision = PRECISIONS[config.precision]
        with torch.autocast(clean.device.type, dtype=precision or torch.float32, enabled=precision is not None):
            cache = self.context_cache(torch.cat([clean, clean]) if guided else clean, both)
        cond = CellCondition(labels, first, k, cache, cfg if guided else None)
        sampler = config.sampler.kind or "euler-maruyama"
        flow = CellFlow(self, self.head_steps(steps), precision, sampler, config.sampler.flow_grid)
        return CellChain(flow, cond, config.temperature)

    def join(self, chains, batch: int) -> JoinedCells:
        return JoinedCells(tuple(chains))

    def check_draft(self, draft) -> None:
        """Nothing beyond the shared layout (:func:`csd.run_setup.check_pair`): CSD runs the draft on the
        target's flow steps."""

    def token_layout(self, raster_tokenizer) -> CellTokenizer:
        """The tokenizer of this model's tokens (cells) over a raster tokenizer of its grid."""
        return CellTokenizer(raster_tokenizer, self.config.grid, self.config.cells)
