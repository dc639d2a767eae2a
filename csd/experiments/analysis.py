"""Running a model pair over settings and turning the traces into panel data.

The app's analysis tab and ``assets/analysis_default.json`` come from here. The panel data are the
records of :mod:`csd.records.panel_data` (they round-trip through JSON); the figure builders in :mod:`visualize`
draw them without running a model.

    python -m csd.experiments.analysis --out assets/analysis_default.json --threads 1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from csd.cli import add_machine_flags, start_up
from csd.config import CSDConfig, SamplingConfig
from csd.core.checks import check_int
from csd.decoding import Generation, StepCallback, sync_cuda
from csd.dispatch import Method
from csd.experiments import defaults
from csd.records.cost import StepCosts, simple_bound, speedup_bound
from csd.records.panel_data import (
    DistancePanel,
    Histogram,
    LogRatioPanel,
    Panels,
    PrefillPanel,
    ResamplerPanel,
    Spread,
    Sweep,
    TimePanel,
    json_float,
)
from csd.serving.jobs import RunStart
from csd.serving.pairs import RANDOM_SOURCE, ModelPair, PairStore, discover
from csd.trace import Maker, Trace

MAX_TRIES_BINS = 50  # resampler tries above this share the last bin


# --- timed runs ------------------------------------------------------------------------------


@dataclass
class Run:
    """One generation and its wall time (seconds, without the optional counterfactual chains)."""

    generation: Generation
    seconds: float

    @property
    def trace(self) -> Trace:
        return self.generation.trace


def _timed_run(fn: Callable[[], Generation]) -> Run:
    sync_cuda()
    t0 = time.perf_counter()
    gen = fn()
    sync_cuda()
    wall = time.perf_counter() - t0
    # The counterfactual chains and kept details are measurements, not part of decoding: keep them out.
    return Run(gen, wall - sum(gen.trace.times.get(k, 0.0) for k in ("counterfactual", "inspection")))


def run_method(
    pair: ModelPair,
    labels: Sequence[int],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    method: Method,
    on_step: StepCallback | None = None,
    keep_details: bool = False,
) -> Run:
    """A generation of the pair with ``method`` (target-only, draft-only or CSD), timed."""
    return _timed_run(lambda: method.run(pair.target, pair.draft, labels, seeds, sampling, on_step, keep_details))


def run_single(
    pair: ModelPair,
    labels: Sequence[int],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    maker=Maker.TARGET,
    on_step: StepCallback | None = None,
):
    """Target-only (``Maker.TARGET``) or draft-only (``Maker.DRAFT``) generation, timed."""
    if maker not in (Maker.TARGET, Maker.DRAFT):
        raise ValueError(f"a single model's run is Maker.TARGET's or Maker.DRAFT's, got {maker!r}")
    method = Method.target() if maker == Maker.TARGET else Method.draft()
    return run_method(pair, labels, seeds, sampling, method, on_step)


def run_csd(
    pair: ModelPair,
    labels: Sequence[int],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    csd: CSDConfig,
    on_step: StepCallback | None = None,
    keep_details: bool = False,
):
    """CSD at ``csd``, timed."""
    return run_method(pair, labels, seeds, sampling, Method.speculative(csd), on_step, keep_details)


# --- the analysis ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AnalysisSettings:
    """A base setting and the sweeps around it. Image i uses seed + i and class (label + i) mod classes,
    or, for a text pair, ``prompt``."""

    n_images: int = 16
    seed: int = 0
    label: int = 0
    prompt: str | None = None
    sampling: SamplingConfig = defaults.SAMPLING
    csd: CSDConfig = defaults.CSD
    gammas: tuple[int, ...] = (1, 2, 4, 8, 16)
    prefills: tuple[float, ...] = (0.0, 0.05, 0.15)
    cfg_scales: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    temperatures: tuple[float, ...] = (0.8, 1.0, 1.2)
    step_fractions: tuple[float, ...] = (1.0, 0.5, 0.25)

    def __post_init__(self) -> None:
        check_int("number of images", self.n_images, 1)

    def to_dict(self) -> dict:
        """The settings as the panels record them, the two configs as their flat knobs."""
        return asdict(self) | {"sampling": self.sampling.knob_values(), "csd": self.csd.knob_values()}


def image_conditions(pair: ModelPair, n: int, label: int = 0, prompt: str | None = None) -> list:
    """The conditions of n analysis images: ``prompt`` for each (a text pair), else classes label, label + 1, ..."""
    if pair.is_text:
        if prompt is None:
            raise ValueError(f"{pair.name} is text-conditioned: give a prompt")
        return [prompt] * n
    return [(label + i) % len(pair.class_names) for i in range(n)]


def _key(sampling: SamplingConfig, csd: CSDConfig | None) -> tuple:
    # Counterfactual chains only add measurements (their own random stream), so they share a key.
    return (sampling, None if csd is None else replace(csd, counterfactual=False))


def _pct(p: float) -> str:
    return f"{100 * p:g}%"


class Analysis:
    """The runs an analysis needs (deduplicated), executed one at a time so callers can report
    progress and stop between runs; :meth:`panels` summarises them.

    The first run of a new tensor shape pays one-time costs (kernel selection, allocation) that can
    exceed the run itself on a CPU, so the runs whose wall time is plotted (the time panel)
    run a second time, after every shape has been seen, and keep that time."""

    def __init__(self, pair: ModelPair, settings: AnalysisSettings):
        self.pair, self.settings = pair, settings
        self.labels = image_conditions(pair, settings.n_images, settings.label, settings.prompt)
        self.seeds = [settings.seed + i for i in range(settings.n_images)]
        self._runs: dict[tuple, Run] = {}
        self._retimed: dict[tuple, Run] = {}
        self._plan: dict[tuple, tuple[str, SamplingConfig, CSDConfig | None]] = {}
        s, c = settings.sampling, settings.csd
        self._want("CSD (aligned, with counterfactual)", s, replace(c, align=True, counterfactual=True))
        self._want("CSD (independent noise, with counterfactual)", s, replace(c, align=False, counterfactual=True))
        for p in settings.prefills:
            self._want(f"CSD, pre-fill {_pct(p)}", s, replace(c, prefill=p))
        for g in self.gammas:
            self._want(f"CSD, gamma {g}", s, replace(c, gamma=g))
        for v in settings.cfg_scales:
            self._want(f"CSD, CFG {v:g}", replace(s, cfg_scale=v), c)
        for v in settings.temperatures:
            self._want(f"CSD, temperature {v:g}", replace(s, temperature=v), c)
        self._want("target-only", s, None)
        self._timed = [("target-only (timed again)", s, None), ("CSD (timed again)", s, c)]

    @property
    def gammas(self) -> list[int]:
        s = self.settings
        return sorted({g for g in (*s.gammas, s.csd.gamma) if g <= s.sampling.num_steps})

    def _want(self, label: str, sampling: SamplingConfig, csd: CSDConfig | None) -> None:
        self._plan.setdefault(_key(sampling, csd), (label, sampling, csd))

    def __len__(self) -> int:
        return len(self._plan) + len(self._timed)

    def planned(self) -> list[tuple[SamplingConfig, CSDConfig | None]]:
        """The setting of every run, in order (CSD None: target-only): what an estimate of the cost needs."""
        return [(sampling, csd) for _, sampling, csd in [*self._plan.values(), *self._timed]]

    def steps(self, on_step: Callable[[str], StepCallback | None] = lambda label: None) -> Iterator[RunStart]:
        """Run the planned generations; yields a :class:`~csd.serving.jobs.RunStart` before each.
        ``on_step(label)`` may give a per-AR-step callback for the run ``label``."""
        runs = [(*plan, self._runs) for plan in self._plan.values()] + [(*t, self._retimed) for t in self._timed]
        for i, (label, sampling, csd, store) in enumerate(runs):
            yield RunStart(i, len(runs), label)
            run = run_method(self.pair, self.labels, self.seeds, sampling, Method.of(csd), on_step(label))
            store[_key(sampling, csd)] = run

    def run(self, sampling: SamplingConfig, csd: CSDConfig | None) -> Run:
        return self._runs[_key(sampling, csd)]

    def timed(self, sampling: SamplingConfig, csd: CSDConfig | None) -> Run:
        """The second run of a setting whose wall time is plotted (same outputs, warm shapes)."""
        return self._retimed[_key(sampling, csd)]

    def panels(self) -> Panels:
        s, c = self.settings.sampling, self.settings.csd
        main = self.run(s, replace(c, align=True))
        return Panels(
            pair=self.pair.name,
            weights=self.pair.weights,
            n_images=self.settings.n_images,
            settings=self.settings.to_dict(),
            distance=self._distance(main, self.run(s, replace(c, align=False))),
            prefill=self._prefill(),
            resampler=_resampler(main.trace, c.criterion.max_tries),
            sweeps=self._sweeps(),
            log_ratio=_log_ratio(main.trace),
            time=_time(self.timed(s, None), self.timed(s, c), s, c, self.pair.target.traits.head_per_block),
        )

    def _distance(self, aligned: Run, independent: Run) -> DistancePanel:
        t = aligned.trace
        dists = {"aligned": t.distance_aligned, "independent": t.distance_independent}
        steps = range(len(t.step_sizes))
        return DistancePanel(
            per_step={k: Spread.of(steps, [v[t.ar_step == s] for s in steps]) for k, v in dists.items()},
            overall=Histogram.of({k: v[t.verified] for k, v in dists.items()}),
            mean={k: json_float(np.nanmean(v)) if np.isfinite(v).any() else None for k, v in dists.items()},
            acceptance={
                "aligned": json_float(t.acceptance_rate),
                "independent": json_float(independent.trace.acceptance_rate),
            },
        )

    def _prefill(self) -> PrefillPanel:
        s, c = self.settings.sampling, self.settings.csd
        per_step, acceptance = {}, {}
        for p in self.settings.prefills:
            t = self.run(s, replace(c, prefill=p)).trace
            acc = t.acceptance_per_step()  # (B, S)
            per_step[_pct(p)] = Spread.of(range(acc.shape[1]), list(acc.T))
            acceptance[_pct(p)] = json_float(t.acceptance_rate)
        return PrefillPanel(per_step, acceptance)

    def _sweeps(self) -> dict[str, Sweep]:
        s, c = self.settings.sampling, self.settings.csd
        knobs = {
            "gamma": (self.gammas, lambda v: (s, replace(c, gamma=v))),
            "cfg_scale": (self.settings.cfg_scales, lambda v: (replace(s, cfg_scale=v), c)),
            "temperature": (self.settings.temperatures, lambda v: (replace(s, temperature=v), c)),
        }
        return {
            knob: _sweep(knob, values, [self.run(*setting(v)) for v in values])
            for knob, (values, setting) in knobs.items()
        }


def _sweep(knob: str, values: Sequence[float], runs: list[Run]) -> Sweep:
    out = Sweep(knob, [float(v) for v in values], [], [], [], [], [])
    for r in runs:
        t = r.trace
        summary = t.summary()
        out.acceptance.append(json_float(t.acceptance_rate))
        out.mean_accept_prob.append(json_float(t.mean_accept_prob))
        out.mean_tries.append(json_float(summary["mean_resample_tries"]))
        out.capped.append(t.count(Maker.CAPPED) + t.count(Maker.ZEROED))
        out.seconds.append(r.seconds)
    return out


def _resampler(t: Trace, max_tries: int) -> ResamplerPanel:
    tries = t.resample_tries[t.resample_tries > 0]
    top = int(min(max(tries.max(initial=1), 1), MAX_TRIES_BINS))
    counts = np.bincount(np.minimum(tries, top), minlength=top + 1)[1:]
    return ResamplerPanel(
        tries=Histogram(edges=[k + 0.5 for k in range(top + 1)], counts={"tokens": counts.tolist()}),
        mean_tries=json_float(tries.mean()) if tries.size else None,
        capped=t.count(Maker.CAPPED) + t.count(Maker.ZEROED),
        resampled=t.count(Maker.RESAMPLED),
        max_tries=max_tries,
    )


def _log_ratio(t: Trace) -> LogRatioPanel:
    v = t.verified
    terms = {
        "trajectory": t.log_ratio_trajectory[v],
        "final": t.log_ratio_final[v],
        "log r": t.log_ratio_trajectory[v] + t.log_ratio_final[v],
    }
    finite = {k: x[np.isfinite(x)] for k, x in terms.items()}
    both = np.isfinite(terms["trajectory"]) & np.isfinite(terms["final"])
    return LogRatioPanel(
        terms=Histogram.of(terms),
        mean={k: json_float(x.mean()) if x.size else None for k, x in finite.items()},
        std={k: json_float(x.std()) if x.size else None for k, x in finite.items()},
        trajectory_dominates=json_float(np.mean(np.abs(terms["trajectory"][both]) > np.abs(terms["final"][both])))
        if both.any()
        else None,
    )


def step_costs(target: Trace, draft: Trace) -> StepCosts:
    """Seconds per AR step of each model's backbone pass and head chains, from a target-only run and any
    run with draft steps (draft-only or CSD)."""
    steps = len(target.step_sizes)
    return StepCosts(
        target_backbone=target.times.get("target_backbone", 0.0) / steps,
        target_head=target.times.get("target_head", 0.0) / steps,
        draft_backbone=draft.times.get("draft_backbone", 0.0) / max(draft.draft_passes, 1),
        draft_head=draft.times.get("draft_head", 0.0) / max(draft.draft_passes, 1),
    )


def cost_model(
    target: Trace, draft: Trace, sampling: SamplingConfig, csd: CSDConfig, per_block: bool = False
) -> tuple[float, float]:
    """(cost-model speedup with measured per-step costs, heads-free bound C_p / (C_q + C_p / gamma)), both
    over the blocks ``csd`` drafts (its ``gamma_schedule`` too); ``per_block``: the target's chain is charged
    per verified block (:attr:`csd.family.FamilyTraits.head_per_block`)."""
    costs, tokens = step_costs(target, draft), sum(target.step_sizes)
    return speedup_bound(costs, tokens, sampling, csd, per_block), simple_bound(costs, sampling, csd)


def _time(target: Run, csd: Run, sampling: SamplingConfig, config: CSDConfig, per_block: bool) -> TimePanel:
    model, bound = cost_model(target.trace, csd.trace, sampling, config, per_block)
    costs = step_costs(target.trace, csd.trace)
    return TimePanel(
        phases={
            "target-only": dict(target.trace.times),
            "CSD": {k: v for k, v in csd.trace.times.items() if k != "counterfactual"},
        },
        wall={"target-only": target.seconds, "CSD": csd.seconds},
        speedup=json_float(target.seconds / csd.seconds),
        cost_model=json_float(model),
        bound=json_float(bound),
        costs={
            "C_p": costs.target_backbone,
            "H_p": costs.target_head,
            "C_q": costs.draft_backbone,
            "H_q": costs.draft_head,
        },
        gamma=config.gamma,
    )


def analyze(pair: ModelPair, settings: AnalysisSettings) -> Panels:
    analysis = Analysis(pair, settings)
    for run in analysis.steps():
        print(f"[{run.done + 1}/{run.total}] {run.label}", flush=True)
    return analysis.panels()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Compute the analysis panels for the default setting.")
    ap.add_argument("--out", type=Path, default=Path("assets/analysis_default.json"))
    ap.add_argument("--images", type=int, default=AnalysisSettings.n_images)
    ap.add_argument("--random-models", action="store_true", help="use the untrained pair (for a quick check)")
    add_machine_flags(ap, device=False)
    args = ap.parse_args(argv)
    start_up(args, ap)
    sources = [RANDOM_SOURCE] if args.random_models else discover(None)
    if not sources:
        ap.error("no embedded models in assets/models; pass --random-models for a quick check")
    store = PairStore(sources[:1], torch.device("cpu"))
    panels = analyze(store.get(store.names[0]), AnalysisSettings(n_images=args.images))
    args.out.write_text(panels.to_json())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
