"""Panel data of an analysis: what :mod:`csd.experiments.analysis` computes from a pair's runs and the
figure builders in :mod:`visualize.panels` draw. Plain dataclasses of lists, dicts and floats (NaN
stored as None), so they round-trip through JSON (``assets/analysis_default.json``) and a figure needs
no model, no pair loader and no experiment code."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HIST_BINS = 30


def json_float(v) -> float | None:
    """A JSON-safe float: NaN and infinities become None."""
    v = float(v)
    return v if math.isfinite(v) else None


@dataclass
class Spread:
    """A quantity per x value: mean, median and interquartile band (over images or tokens)."""

    x: list[float]
    mean: list[float | None]
    median: list[float | None]
    q25: list[float | None]
    q75: list[float | None]

    @classmethod
    def of(cls, x: Sequence[float], groups: Sequence[np.ndarray]) -> Spread:
        stats = {k: [] for k in ("mean", "median", "q25", "q75")}
        for g in groups:
            g = np.asarray(g, dtype=np.float64)
            g = g[np.isfinite(g)]
            empty = g.size == 0
            stats["mean"].append(None if empty else json_float(g.mean()))
            for key, q in (("median", 50), ("q25", 25), ("q75", 75)):
                stats[key].append(None if empty else json_float(np.percentile(g, q)))
        return cls(x=[float(v) for v in x], **stats)


@dataclass
class Histogram:
    """Counts of several named series over shared bin edges."""

    edges: list[float]
    counts: dict[str, list[int]]

    @classmethod
    def of(cls, series: dict[str, np.ndarray], bins: int = HIST_BINS, clip: float = 1.0) -> Histogram:
        """Bins span the [clip, 100 - clip] percentiles of all series; outliers go to the end bins."""
        finite = {k: np.asarray(v, dtype=np.float64)[np.isfinite(v)] for k, v in series.items()}
        pooled = np.concatenate([v for v in finite.values()] + [np.zeros(0)])
        if pooled.size == 0:
            return cls(edges=[], counts={k: [] for k in series})
        lo, hi = np.percentile(pooled, [clip, 100 - clip])
        hi = hi if hi > lo else lo + 1.0
        edges = np.linspace(lo, hi, bins + 1)
        counts = {k: np.histogram(np.clip(v, lo, hi), edges)[0].tolist() for k, v in finite.items()}
        return cls(edges=edges.tolist(), counts=counts)


@dataclass
class Sweep:
    """Acceptance and resampler statistics of CSD runs that differ in one knob."""

    knob: str
    values: list[float]
    acceptance: list[float | None]
    mean_accept_prob: list[float | None]
    mean_tries: list[float | None]
    capped: list[int]
    seconds: list[float]


@dataclass
class DistancePanel:
    """||x^q - x^p|| with shared (aligned) and independent noise, and the acceptance of each choice."""

    per_step: dict[str, Spread]
    overall: Histogram
    mean: dict[str, float | None]
    acceptance: dict[str, float | None]


@dataclass
class PrefillPanel:
    """Acceptance per AR step (spread over images) for several pre-fill ratios."""

    per_step: dict[str, Spread]
    acceptance: dict[str, float | None]


@dataclass
class ResamplerPanel:
    """Tries of the acceptance-rejection resampler at the chosen setting."""

    tries: Histogram
    mean_tries: float | None
    capped: int
    resampled: int
    max_tries: int


@dataclass
class LogRatioPanel:
    """log r = trajectory term + final-step term, per verified token."""

    terms: Histogram
    mean: dict[str, float | None]
    std: dict[str, float | None]
    trajectory_dominates: float | None  # fraction of tokens where |trajectory| > |final|


@dataclass
class TimePanel:
    """Where the time goes, with the cost model of DESIGN.md section 6."""

    phases: dict[str, dict[str, float]]  # method -> phase -> seconds
    wall: dict[str, float]
    speedup: float | None
    cost_model: float | None  # predicted from measured per-pass costs
    bound: float | None  # C_p / (C_q + C_p / gamma): heads free
    costs: dict[str, float]  # seconds per AR step: C_p, H_p (target), C_q, H_q (draft)
    gamma: int


@dataclass
class Panels:
    pair: str
    weights: str  # ModelPair.weights: which weights the panels were computed with
    n_images: int
    settings: dict
    distance: DistancePanel
    prefill: PrefillPanel
    resampler: ResamplerPanel
    sweeps: dict[str, Sweep]
    log_ratio: LogRatioPanel
    time: TimePanel
    created: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict) -> Panels:
        spreads = lambda m: {k: Spread(**v) for k, v in m.items()}
        dist, pre, res, lr = d["distance"], d["prefill"], d["resampler"], d["log_ratio"]
        return cls(
            pair=d["pair"],
            weights=d["weights"],
            n_images=d["n_images"],
            settings=d["settings"],
            distance=DistancePanel(
                spreads(dist["per_step"]), Histogram(**dist["overall"]), dist["mean"], dist["acceptance"]
            ),
            prefill=PrefillPanel(spreads(pre["per_step"]), pre["acceptance"]),
            resampler=ResamplerPanel(**{**res, "tries": Histogram(**res["tries"])}),
            sweeps={k: Sweep(**v) for k, v in d["sweeps"].items()},
            log_ratio=LogRatioPanel(**{**lr, "terms": Histogram(**lr["terms"])}),
            time=TimePanel(**d["time"]),
            created=d.get("created", 0.0),
        )

    @classmethod
    def load(cls, path: str | Path) -> Panels:
        return cls.from_dict(json.loads(Path(path).read_text()))
