"""Charts of the analysis panels (:class:`csd.records.panel_data.Panels`) and of one run's time split."""

from __future__ import annotations

from csd.records.panel_data import Histogram, Panels, Spread, Sweep
from visualize.chart import PALETTE, Chart, Series

# Fixed colours per phase, so the same phase looks the same in every time chart.
# The trace's phases in four groups, each a colour of its own (Okabe-Ito): what a reader compares.
PHASE_GROUPS = {
    "target backbone": (("prefill_backbone", "target_backbone", "next_backbone"), "#0072B2"),
    "target head": (("prefill_head", "target_head", "next_head"), "#56B4E9"),
    "draft (backbone and head)": (("draft_backbone", "draft_head"), "#E69F00"),
    "accept or resample": (("verify", "resample"), "#D55E00"),
}
PHASES = {phase for phases, _ in PHASE_GROUPS.values() for phase in phases}


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _spread_series(name: str, s: Spread, color: str, center: str = "median") -> Series:
    return Series(name, s.x, getattr(s, center), band=(s.q25, s.q75), color=color)


def _histogram_series(h: Histogram, names: dict[str, str] | None = None) -> list[Series]:
    if not h.edges:
        return []
    centers = [(a + b) / 2 for a, b in zip(h.edges[:-1], h.edges[1:], strict=True)]
    width = h.edges[1] - h.edges[0]
    return [Series((names or {}).get(k, k), centers, v, kind="bar", width=width) for k, v in h.counts.items()]


def distance_per_step(p: Panels) -> Chart:
    d = p.distance
    return Chart(
        "Draft-target token distance per AR step",
        "AR step",
        "||x_q - x_p|| (median, IQR band)",
        [
            _spread_series("aligned noise", d.per_step["aligned"], PALETTE[0]),
            _spread_series("independent noise", d.per_step["independent"], PALETTE[1]),
        ],
        note=f"mean {_fmt(d.mean['aligned'])} aligned vs {_fmt(d.mean['independent'])} independent",
    )


def distance_overall(p: Panels) -> Chart:
    d = p.distance
    names = {
        k: f"{k} noise (acceptance {_fmt(d.acceptance[k])})" for k in ("aligned", "independent") if k in d.acceptance
    }
    return Chart(
        "Draft-target distance over all drafted tokens",
        "||x_q - x_p||",
        "tokens",
        _histogram_series(d.overall, names),
        barmode="overlay",
        note=f"acceptance with alignment {_fmt(d.acceptance['aligned'])}, without {_fmt(d.acceptance['independent'])}",
    )


def acceptance_per_step(p: Panels) -> Chart:
    series = [
        _spread_series(f"pre-fill {k} (overall {_fmt(p.prefill.acceptance[k])})", s, PALETTE[i], center="mean")
        for i, (k, s) in enumerate(p.prefill.per_step.items())
    ]
    return Chart(
        "Acceptance per AR step under pre-fill ratios",
        "AR step",
        "accepted fraction (mean over images, IQR band)",
        series,
        y_range=(-0.02, 1.02),
        note="pre-filled steps have no drafted tokens",
    )


def resampler_tries(p: Panels) -> Chart:
    r = p.resampler
    series = _histogram_series(r.tries)
    for s in series:
        s.width = 0.8
    return Chart(
        "Resampler tries per rejected token",
        "tries (proposals drawn)",
        "tokens",
        series,
        note=f"mean {_fmt(r.mean_tries)}; {r.resampled} resampled, {r.capped} hit the cap of {r.max_tries}",
    )


def resampler_vs_gamma(p: Panels) -> Chart:
    g = p.sweeps["gamma"]
    return Chart(
        "Resampler tries vs draft length",
        "gamma (AR steps per block)",
        "mean tries per rejected token",
        [Series("mean tries", g.values, g.mean_tries, kind="line", text=[f"{c} capped" for c in g.capped])],
        note="labels: tokens that hit the resampler cap",
    )


_KNOB_LABELS = {
    "gamma": "gamma (AR steps per block)",
    "cfg_scale": "CFG scale",
    "temperature": "temperature",
}


def acceptance_sweep(sweep: Sweep) -> Chart:
    return Chart(
        f"Acceptance vs {_KNOB_LABELS[sweep.knob].split(' (')[0]}",
        _KNOB_LABELS[sweep.knob],
        "rate",
        [
            Series("accepted fraction", sweep.values, sweep.acceptance),
            Series("mean min(1, r)", sweep.values, sweep.mean_accept_prob, dash=True),
        ],
        y_range=(-0.02, 1.02),
    )


def log_ratio_split(p: Panels) -> Chart:
    lr = p.log_ratio
    share = "n/a" if lr.trajectory_dominates is None else f"{100 * lr.trajectory_dominates:.0f}%"
    return Chart(
        "log r split: trajectory term vs final-step term",
        "nats (clipped to the 1-99 percentile range)",
        "tokens",
        _histogram_series(lr.terms),
        barmode="overlay",
        note=f"std: trajectory {_fmt(lr.std['trajectory'], '.1f')}, final {_fmt(lr.std['final'], '.1f')}; "
        f"|trajectory| > |final| for {share} of tokens",
    )


def time_breakdown(
    phases: dict[str, dict[str, float]], title: str, note: str = "", wall: dict[str, float] | None = None
) -> Chart:
    """Stacked seconds per phase for each method (e.g. target-only, CSD); with ``wall`` times, the rest of
    each run (noise drawing, bookkeeping) is one more segment."""
    methods = list(phases)
    total = lambda m, keys: sum(phases[m].get(k, 0.0) for k in keys)
    series = [
        Series(name, methods, [total(m, keys) for m in methods], kind="bar", color=color)
        for name, (keys, color) in PHASE_GROUPS.items()
        if any(k in t for t in phases.values() for k in keys)
    ]
    if wall is not None:
        rest = [max(0.0, wall[m] - sum(phases[m].get(k, 0.0) for k in PHASES)) for m in methods]
        series.append(Series("other", methods, rest, kind="bar", color="#BBBBBB"))
    return Chart(title, "", "seconds", series, barmode="stack", note=note)


def time_panel(p: Panels) -> Chart:
    t = p.time
    note = (
        f"measured speedup {_fmt(t.speedup)}x; cost model {_fmt(t.cost_model)}x; "
        f"bound C_p/(C_q + C_p/gamma) = {_fmt(t.bound)}x at gamma = {t.gamma}"
    )
    return time_breakdown(t.phases, f"Where the time goes ({p.n_images} images)", note, t.wall)


def analysis_charts(p: Panels) -> dict[str, Chart]:
    """Every analysis chart by key, in display order."""
    return {
        "distance_per_step": distance_per_step(p),
        "distance_overall": distance_overall(p),
        "acceptance_per_step": acceptance_per_step(p),
        "resampler_tries": resampler_tries(p),
        "resampler_vs_gamma": resampler_vs_gamma(p),
        "acceptance_vs_gamma": acceptance_sweep(p.sweeps["gamma"]),
        "acceptance_vs_cfg": acceptance_sweep(p.sweeps["cfg_scale"]),
        "acceptance_vs_temperature": acceptance_sweep(p.sweeps["temperature"]),
        "log_ratio_split": log_ratio_split(p),
        "time": time_panel(p),
    }
