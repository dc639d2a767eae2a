"""What a paper-scale run times: the paper's pairs and their published samplers (each from its family's catalog
entry), the grid of batches and draft lengths, and its cells."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import check_choice, check_int, check_number, is_int
from csd.core.schedule import step_sizes
from csd.family import FamilyTraits
from csd.models.registry import FAMILIES
from csd.records.cost import prefill_steps
from csd.serving.catalog import PairSpec, entry_of

HEAD_MODES = ("float32", "tf32", "bfloat16")


def paper_families() -> tuple[str, ...]:
    """The registered families that say how they run at the published sizes (their catalog entry's ``paper``)."""
    return tuple(arch for arch in FAMILIES if entry_of(arch).paper is not None)


def paper_pairs() -> list[PairSpec]:
    """Every paper pair: the official pairs of those families that name which of the paper's pairs they are."""
    return [p for a in paper_families() for p in entry_of(a).pairs if p.kind == "official" and p.key]


def pair_keys() -> tuple[str, ...]:
    """The paper's pairs ("H/B", "L/B"), in the table's order."""
    return tuple(dict.fromkeys(p.key for p in paper_pairs()))


def model_config(family: str, name: str, tiny: bool):
    """A preset as a run builds it: the official config (with the run's changes), or shrunk under --tiny."""
    return replace(FAMILIES[family].presets[name], **entry_of(family).paper.overrides(name, tiny))


def sampling_for(pair: PairSpec, tiny: bool, precision: str) -> SamplingConfig:
    """The family's published sampler with the target's CFG scale (under --tiny, fewer steps)."""
    row, paper = FAMILIES[pair.family], entry_of(pair.family).paper
    steps, head = paper.tiny_steps if tiny else (paper.num_steps, paper.head_steps)
    if steps is None:  # the family's fixed AR steps (xAR: one per cell)
        steps = row.traits(model_config(pair.family, pair.target, tiny)).fixed_num_steps
    return SamplingConfig(
        num_steps=steps,
        cfg_scale=paper.cfg[pair.target],
        cfg_schedule=paper.cfg_schedule,
        temperature=paper.temperature,
        head_steps=head,
        precision=precision,
    )


def _check_values(name: str, values, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(values, tuple | list) or not values or not all(is_int(v) and lo <= v <= hi for v in values):
        raise ValueError(f"{name} must be one or more ints in [{lo}, {hi}], got {values!r}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class GridConfig:
    """What to time. ``batches`` / ``gammas`` None: the paper's grid (1, 8, 64, 256 / 8, 16, 32), or with
    ``tiny`` (1, 2 / 2, 4)."""

    families: tuple[str, ...] = field(default_factory=paper_families)
    pairs: tuple[str, ...] = field(default_factory=pair_keys)
    batches: tuple[int, ...] | None = None
    gammas: tuple[int, ...] | None = None
    repeats: int = 3
    warmup: int = 1
    prefill: float = 0.05
    seed: int = 0
    tiny: bool = False
    heads: str = "float32"  # head matmuls: the library's float32, TF32, or bf16 autocast (the published code's)

    def __post_init__(self) -> None:
        checks = (("--families", self.families, paper_families()), ("--pairs", self.pairs, pair_keys()))
        for name, values, choices in checks:
            if not isinstance(values, tuple | list) or not values or any(v not in choices for v in values):
                raise ValueError(f"{name} must be one or more of {', '.join(choices)}, got {values!r}")
        if self.batches is not None:
            object.__setattr__(self, "batches", _check_values("--batches (batch sizes)", self.batches, 1, 4096))
        if self.gammas is not None:
            object.__setattr__(self, "gammas", _check_values("--gammas (draft lengths)", self.gammas, 1, 1024))
        check_int("--repeats", self.repeats, 1, 100)
        check_int("--warmup", self.warmup, 0, 10)
        check_number("--prefill (ratio)", self.prefill, 0.0, 1.0, hi_open=True)
        check_int("--seed", self.seed, 0, 2**31 - 1)
        check_choice("--heads", self.heads, HEAD_MODES)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.batches or ((1, 2) if self.tiny else (1, 8, 64, 256))

    @property
    def draft_lengths(self) -> tuple[int, ...]:
        return self.gammas or ((2, 4) if self.tiny else (8, 16, 32))

    def csd(self, gamma: int) -> CSDConfig:
        """The CSD setting the grid times at draft length ``gamma``."""
        return CSDConfig(gamma=gamma, prefill=self.prefill)

    def selected_pairs(self) -> list[PairSpec]:
        return [p for p in paper_pairs() if p.family in self.families and p.key in self.pairs]


@dataclass(frozen=True)
class Cell:
    """One timed unit: a pair at one batch size, every draft length interleaved."""

    pair: PairSpec
    batch: int
    gammas: tuple[int, ...]
    sampling: SamplingConfig
    num_tokens: int  # AR tokens of an image (xAR: cells)
    head_steps: int  # diffusion-head steps (xAR: flow steps)
    traits: FamilyTraits  # the target's (csd.family): what verifying a block costs, ...

    def prefill_steps(self, prefill: float) -> int:
        return prefill_steps(step_sizes(self.num_tokens, self.sampling.num_steps), prefill)


def plan_cells(grid: GridConfig, precision: str) -> list[Cell]:
    """Every cell of the grid. Draft lengths beyond the steps left after the pre-fill are that many
    (xAR: 3 cells), so each pair keeps each distinct effective gamma once."""
    cells = []
    for pair in grid.selected_pairs():
        sampling = sampling_for(pair, grid.tiny, precision)
        config = model_config(pair.family, pair.target, grid.tiny)
        tokens, head = entry_of(pair.family).paper.layout(config, sampling.head_steps)
        left = sampling.num_steps - prefill_steps(step_sizes(tokens, sampling.num_steps), grid.prefill)
        gammas = tuple(dict.fromkeys(min(g, max(left, 1)) for g in grid.draft_lengths))
        cells += [
            Cell(pair, b, gammas, sampling, tokens, head, FAMILIES[pair.family].traits(config))
            for b in grid.batch_sizes
        ]
    return cells
