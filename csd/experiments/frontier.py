"""Where speculative decoding stands among the cheap alternatives: a quality-time frontier.

Every point is a sampler setting of one pair: target-only with fewer AR steps, fewer head steps or
a head-step schedule, CSD at several draft lengths, tests and head steps, and their combinations.
Each point's time is a ratio to target-only at the base setting, timed side by side in the same
process; its quality is scored over the same labels and seeds, with standard errors. The Pareto front
(less time, better quality) is marked per metric.

Two runners share the grid and the result format:

- :func:`run_frontier` (the benchmark): times at a fixed batch, interleaved after a warm-up, then
  class accuracy and Frechet distance over many images;
- :class:`SmallFrontier` (the app's recompute): one run per setting at a few images, run by run so a
  caller can report progress and stop; class accuracy where the shapes classifier applies, else the
  RMS token distance to the target-only run of the same seeds.

    python -m csd.experiments.bench --frontier --quick   # about 10 minutes on a 2-core CPU
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from csd.checks import check_int
from csd.config import CSDConfig, SamplingConfig
from csd.cost import BACKBONE_PHASES, CHAIN_PHASES, WORK_KEYS, PassCosts, fit_chain, fit_pass, phase_totals
from csd.decoding import Generation, StepCallback
from csd.experiments.analysis import image_conditions, run_csd, run_single
from csd.experiments.evaluate import eval_labels_seeds, generate_images, quality
from csd.experiments.pairs import ModelPair
from csd.experiments.timing import alternate
from csd.models.tokenizer import PixelTokenizer
from csd.sampling import generate
from csd.schedule import DISA_FLOOR
from csd.shapes.data import CLASS_NAMES
from csd.shapes.metrics import DEFAULT_CLASSIFIER, frechet_distance, load_classifier, predict
from csd.shapes.text import prompt_class
from csd.speculative import speculative_generate
from csd.trace import Maker
from csd.verdict import METRICS, result_metrics, verdict

BOOTSTRAP = 20  # resamples for the Frechet distance's standard error


@dataclass(frozen=True)
class Point:
    """One sampler setting; ``csd`` None is target-only."""

    name: str
    sampling: SamplingConfig
    csd: CSDConfig | None = None

    @property
    def method(self) -> str:
        if self.csd is None:
            if self.sampling.gtr_stages:
                return "target, GtR"
            sampler = SAMPLER_METHODS.get(self.sampling.head_sampler)
            if sampler is not None:
                return sampler
            if self.sampling.flow_grid == "uniform":
                return "target, uniform grid"
            if self.sampling.head_schedule.startswith("disa") and self.sampling.head_steps_min is not None:
                return "target, DiSA"
            if self.sampling.token_cache_keep is not None:
                return "target, LazyMAR token cache"
            if self.sampling.cond_cache_start is not None:
                return "target, LazyMAR condition cache"
            cheap = self.sampling.head_steps is not None or self.sampling.head_steps_min is not None
            return "target, cheaper head" if cheap else "target, fewer AR steps"
        return "CSD"


def disa_steps(head_steps: int, fixed_steps: bool) -> dict:
    """DiSA's published annealing, in proportion to the target's head steps: a DDPM head (MAR, Harmon)
    100 -> 50 at the first AR step to 5 at the last, an xAR flow chain 50 -> 15 (Qinyu-Allen-Zhao/DiSA
    READMEs), both along DiSA's linear schedule."""
    t = head_steps
    first, last = (t, max(2, round(0.3 * t))) if fixed_steps else (max(2, t // 2), max(1, round(t / 20)))
    return {"head_steps": first, "head_steps_min": min(first, last), "head_schedule": "disa"}


SAMPLER_METHODS = {"ddim": "target, DDIM", "euler": "target, Euler ODE", "heun": "target, Heun ODE"}
FLOW_COUNTS = range(3, 13)  # the flow steps of xAR's ODE samplers and uniform grid on the frontier
DDIM_STEPS = (5, 8, 10, 12, 15)  # a DDIM head's steps on the frontier (below the target's)
DDIM_ETA = 0.5  # DDIM's stochastic variant on the frontier (eta 0 is the deterministic one)
GTR_RATIO = (24, 6, 2)  # GtR's MAR stages (K = 3): AR steps at its rates 2.67, 10.67, 64 of 256 tokens


def disa_floor(head_steps: int) -> dict:
    """DiSA at its absolute floor: from half the target's head steps down to DiSA's 5 at the last AR step
    (csd.schedule.DISA_FLOOR), along DiSA's linear schedule."""
    return {"head_steps": max(DISA_FLOOR, head_steps // 2), "head_steps_min": DISA_FLOOR, "head_schedule": "disa"}


def gtr_setting(num_steps: int, head_steps: int, detail: bool = True) -> dict:
    """GtR's MAR setting (arXiv 2510.17171) in proportion: its three stages' AR steps in the ratio 24 : 6 : 2
    over ``num_steps``; its head steps (of 100) falling 50 -> 20 over the generation stages, 20 in the
    reconstruction and 50 for FTS's top 10%, as fractions of ``head_steps``."""
    stages = tuple(max(1, round(num_steps * w / sum(GTR_RATIO))) for w in GTR_RATIO)
    out = {"num_steps": sum(stages), "gtr_stages": stages}
    if detail:
        high, low = max(2, head_steps // 2), max(1, round(head_steps / 5))
        out |= {"head_steps": high, "head_steps_min": low, "gtr_head_steps": low}
        out |= {"gtr_detail_fraction": 0.1, "gtr_detail_steps": high} if high > low else {}
    return out


def gtr_name(setting: dict) -> str:
    stages = "/".join(str(k) for k in setting["gtr_stages"])
    if "gtr_head_steps" not in setting:
        return f"GtR {stages} AR steps"
    name = f"GtR {stages}, head {setting['head_steps']} -> {setting['head_steps_min']}, "
    name += f"reconstruction {setting['gtr_head_steps']}"
    if setting.get("gtr_detail_steps") is not None:
        name += f", FTS {100 * setting['gtr_detail_fraction']:g}% x {setting['gtr_detail_steps']}"
    return name


def sampler_points(s: SamplingConfig, c: CSDConfig, head_steps: int, head_samplers: Sequence[str], quick: bool):
    """The target's few-step samplers (issue 43) and CSD on them where its test is defined: DDIM at eta 0
    and DDIM_ETA (masked families), xAR's probability-flow ODE (Euler, Heun) on both time grids and its
    Euler-Maruyama sampler on the uniform grid; CSD with DDIM at eta > 0, on the uniform grid, and with a
    draft on a deterministic sampler under the final-step test."""
    t, points = head_steps, []
    csd4 = replace(c, gamma=4, tau_v=5.0)
    final_only = {"align": False, "criterion": "aligned", "trajectory_term": "none"}
    counts = [k for k in ((5, 10) if quick else DDIM_STEPS) if k < t]
    if "ddim" in head_samplers and counts:
        for eta in (0.0, DDIM_ETA):
            for k in counts:
                ddim = replace(s, head_steps=k, head_sampler="ddim", ddim_eta=eta)
                points.append(Point(f"target, DDIM eta {eta:g} head {k} steps", ddim))
        k = max(counts)
        stochastic = replace(s, head_steps=k, head_sampler="ddim", ddim_eta=DDIM_ETA)
        points.append(Point(f"CSD, gamma 4, tau_v 5, DDIM eta {DDIM_ETA:g} head {k}", stochastic, csd4))
        draft = replace(c, draft_head_sampler="ddim", draft_head_steps=min(counts), **final_only)
        points.append(Point(f"CSD, gamma {c.gamma}, draft DDIM eta 0 head {draft.draft_head_steps}", s, draft))
    counts = [k for k in ((4, 8) if quick else FLOW_COUNTS) if k < t]
    if "euler" in head_samplers and counts:
        for sampler in ("euler", "heun"):
            for grid_ in ("official", "uniform"):
                for k in counts:
                    ode = replace(s, head_steps=k, head_sampler=sampler, flow_grid=grid_)
                    points.append(Point(f"target, {sampler.title()} ODE flow {k} steps, {grid_} grid", ode))
        points += [
            Point(f"target, flow {k} steps, uniform grid", replace(s, head_steps=k, flow_grid="uniform"))
            for k in counts
        ]
        # at the target's own flow steps the grids can coincide (25: both step 0.04), so CSD on the uniform grid
        # is measured at fewer
        for k in sorted({8, max(counts)} & set(counts)):
            uniform = replace(s, head_steps=k, flow_grid="uniform")
            points.append(Point(f"CSD, gamma 4, tau_v 5, flow {k}, uniform grid", uniform, csd4))
        draft = replace(c, draft_head_sampler="euler", criterion="aligned", trajectory_term="none")
        points.append(Point(f"CSD, gamma {c.gamma}, draft Euler ODE (final-step test)", s, draft))
    return points


def gtr_points(s: SamplingConfig, c: CSDConfig, head_steps: int, quick: bool) -> list[Point]:
    """GtR (masked families): its stages alone at half the AR steps, the whole method (stage-aware heads and
    FTS) at a half and a quarter, and CSD following its stages (FTS does not compose)."""
    half, points = gtr_setting(s.num_steps // 2, head_steps, detail=False), []
    points.append(Point(f"target, {gtr_name(half)}", replace(s, **half)))
    for fraction in (2,) if quick else (2, 4):
        full = gtr_setting(max(3, s.num_steps // fraction), head_steps)
        points.append(Point(f"target, {gtr_name(full)}", replace(s, **full)))
    staged = {k: v for k, v in gtr_setting(s.num_steps // 2, head_steps).items() if not k.startswith("gtr_detail")}
    csd4 = replace(c, gamma=4, tau_v=5.0)
    points.append(Point(f"CSD, gamma 4, tau_v 5, {gtr_name(staged)}", replace(s, **staged), csd4))
    return points


def lazymar_cache(num_steps: int) -> dict:
    """LazyMAR's condition cache in proportion to the AR steps: full CFG passes for the first 5 of 64 and
    every 9th after (feihongyan1/LazyMAR, models/mar_cache.py)."""
    start, every = max(1, round(num_steps * 5 / 64)), max(2, round(num_steps * 9 / 64))
    return {"cond_cache_start": start, "cond_cache_every": every}


def lazymar_token_cache(num_steps: int) -> dict:
    """LazyMAR's token cache on the same refresh schedule as its condition cache (:func:`lazymar_cache`),
    recomputing a quarter of the decoder's rows at the other passes."""
    lazy = lazymar_cache(num_steps)
    return {
        "token_cache_keep": 0.25,
        "token_cache_start": lazy["cond_cache_start"],
        "token_cache_every": lazy["cond_cache_every"],
    }


def grid(
    sampling: SamplingConfig,
    csd: CSDConfig,
    head_steps: int,
    quick: bool,
    fixed_steps: bool = False,
    caches_guidance: bool = False,
    caches_tokens: bool = False,
    head_samplers: Sequence[str] = (),
    takes_gtr: bool = False,
) -> list[Point]:
    """The settings of the frontier, the baseline (target-only at ``sampling``) first.

    ``quick`` (the app's recompute): a few settings of each kind. Otherwise the dense grid of the
    committed frontiers: the target at every AR-step count from a quarter to three quarters of the
    base (every flow-step count from a quarter to two thirds where the AR steps are fixed), so every CSD
    setting has a target-only alternative within a step's time (1 / S of the base, or one flow step's)
    of its own; cheaper, annealed and DiSA heads alone and with fewer AR steps; CSD at three draft
    lengths and two tests, with cheaper heads, DiSA, a pre-fill, an independent-noise draft head and,
    where the family takes it, LazyMAR's condition cache alone and with CSD.

    ``fixed_steps``: the family's AR steps cannot change (xAR: one per cell), so no fewer-AR-step
    settings; its "head" is the flow chain. ``caches_guidance`` / ``caches_tokens``: the family takes
    LazyMAR's condition cache / token cache (FamilyTraits), alone and with CSD in the full grid.
    ``head_samplers`` (FamilyTraits.head_samplers): the target's few-step samplers it takes
    (:func:`sampler_points`) and, for a DDPM head, DiSA at its floor; ``takes_gtr``: GtR's points
    (:func:`gtr_points`). The app's recompute passes neither."""
    s, c, t = sampling, csd, head_steps
    head = "flow" if fixed_steps else "head"
    few = {"head_steps": max(2, t // 2)}
    points = [Point(f"target-only ({s.num_steps} AR steps, {head} {t})", s)]
    if fixed_steps:
        ar_steps = []
    elif quick:
        ar_steps = [k for k in (16, 8) if k < s.num_steps]
    else:
        ar_steps = list(range(max(2, s.num_steps // 4), (3 * s.num_steps) // 4 + 1))[::-1]
    points += [Point(f"target, {k} AR steps", replace(s, num_steps=k)) for k in ar_steps]
    if fixed_steps and not quick:
        fewer = list(range((2 * t) // 3, max(2, t // 4) - 1, -1))
    else:
        fewer = list(dict.fromkeys([few["head_steps"]] + ([max(2, t // 4)] if fixed_steps else [])))  # distinct
    points += [Point(f"target, {head} {k} steps", replace(s, head_steps=k)) for k in fewer]
    points.append(
        Point(f"target, {head} {t} -> {max(2, t // 5)} steps", replace(s, head_steps=t, head_steps_min=max(2, t // 5)))
    )
    disa = disa_steps(t, fixed_steps)
    disa_name = f"DiSA {head} {disa['head_steps']} -> {disa['head_steps_min']}"
    points.append(Point(f"target, {disa_name}", replace(s, **disa)))
    if ar_steps and quick:
        k = ar_steps[0]
        points.append(Point(f"target, {k} AR steps, head {few['head_steps']}", replace(s, num_steps=k, **few)))
    elif ar_steps:
        for k in sorted({round(s.num_steps * f) for f in (0.375, 0.5, 0.625)}, reverse=True):
            points.append(Point(f"target, {k} AR steps, head {few['head_steps']}", replace(s, num_steps=k, **few)))
        k = s.num_steps // 2
        points.append(Point(f"target, {k} AR steps, {disa_name}", replace(s, num_steps=k, **disa)))
    gammas = (4, 8) if quick else (4, 8, 16)
    for g in gammas:
        for tau in (c.tau_v, 5.0):
            points.append(Point(f"CSD, gamma {g}, tau_v {tau:g}", s, replace(c, gamma=g, tau_v=tau)))
    points += [
        Point(f"CSD, gamma 4, tau_v 5, {head} {few['head_steps']}", replace(s, **few), replace(c, gamma=4, tau_v=5.0)),
        Point(f"CSD, gamma {c.gamma}, pre-fill 25%", s, replace(c, prefill=0.25)),
        Point(
            f"CSD, gamma {c.gamma}, draft {head} {few['head_steps']} (independent noise)",
            s,
            replace(c, draft_head_steps=few["head_steps"], align=False, criterion="aligned", trajectory_term="none"),
        ),
    ]
    if not quick:
        points.append(Point(f"CSD, gamma 8, {head} {few['head_steps']}", replace(s, **few), replace(c, gamma=8)))
        points.append(Point(f"CSD, gamma 4, tau_v 5, {disa_name}", replace(s, **disa), replace(c, gamma=4, tau_v=5.0)))
        if caches_guidance and s.guided:
            lazy = lazymar_cache(s.num_steps)
            lazy_name = f"condition cache {lazy['cond_cache_start']}/{lazy['cond_cache_every']} (LazyMAR)"
            points.append(Point(f"target, {lazy_name}", replace(s, **lazy)))
            csd4 = replace(c, gamma=4, tau_v=5.0)
            points.append(Point(f"CSD, gamma 4, tau_v 5, {lazy_name}", replace(s, **lazy), csd4))
        if caches_tokens:
            tokens = lazymar_token_cache(s.num_steps)
            name = f"token cache {100 * tokens['token_cache_keep']:g}% {tokens['token_cache_start']}/"
            name += f"{tokens['token_cache_every']} (LazyMAR)"
            points.append(Point(f"target, {name}", replace(s, **tokens)))
            if s.guided:
                both = lazymar_cache(s.num_steps) | tokens
                points.append(Point("target, token and condition caches (LazyMAR)", replace(s, **both)))
            points.append(Point(f"CSD, gamma 4, tau_v 5, {name}", replace(s, **tokens), replace(c, gamma=4, tau_v=5.0)))
    points += sampler_points(s, c, t, head_samplers, quick)
    if "ddim" in head_samplers and t // 2 > DISA_FLOOR:
        floor = disa_floor(t)
        floor_name = f"DiSA floor, head {floor['head_steps']} -> {floor['head_steps_min']}"
        points.append(Point(f"target, {floor_name}", replace(s, **floor)))
        points.append(
            Point(f"CSD, gamma 4, tau_v 5, {floor_name}", replace(s, **floor), replace(c, gamma=4, tau_v=5.0))
        )
    if takes_gtr:
        points += gtr_points(s, c, t, quick)
    return points


def deciding_points(
    sampling: SamplingConfig, head_steps: int, head_samplers: Sequence[str] = (), takes_gtr: bool = False
) -> list[Point]:
    """The alternatives that decided the verdicts on 200 paired images (docs/results.md, "Enough images to
    decide"), taken from the full grid for the app's quick frontier: GtR's stages alone at half the AR
    steps (masked families), the probability-flow ODE with Euler at 6 and Heun at 4 flow steps on the
    uniform grid (xAR), each where the family takes it."""
    points = gtr_points(sampling, CSDConfig(), head_steps, quick=True)[:1] if takes_gtr else []
    wanted = {f"target, {name} ODE flow {k} steps, uniform grid" for name, k in (("Euler", 6), ("Heun", 4))}
    every = sampler_points(sampling, CSDConfig(), head_steps, head_samplers, quick=False)
    return points + [p for p in every if p.name in wanted]


def pair_grid(target, sampling: SamplingConfig, csd: CSDConfig, quick: bool = False) -> list[Point]:
    """:func:`grid` for a loaded target: its head steps at ``sampling`` and its family's traits (fixed AR
    steps, the LazyMAR caches, few-step samplers and GtR it takes)."""
    traits = target.traits
    return grid(
        sampling,
        csd,
        target.head_steps(sampling.head_steps),
        quick,
        traits.fixed_num_steps is not None,  # xAR: no fewer-AR-step settings
        caches_guidance=traits.caches_guidance,
        caches_tokens=traits.caches_tokens,
        head_samplers=traits.head_samplers,
        takes_gtr=traits.takes_gtr,
    )


def select(points: list[Point], only: Sequence[str] | None) -> list[Point]:
    """The baseline and the points whose name holds one of ``only`` (all of them when None)."""
    if not only:
        return points
    return [points[0]] + [p for p in points[1:] if any(part in p.name for part in only)]


def part(points: list[Point], k: int, n: int) -> list[Point]:
    """Part ``k`` (1..``n``) of a grid, for ``n`` processes run at once (one per core): every part holds
    the baseline and the target's fewest-AR-step point (the cost model's fit), the rest is dealt in turn,
    so each part gets its share of the costly settings. :func:`merge_parts` puts the results together."""
    if not (isinstance(n, int) and n >= 1 and isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"frontier part: k must be in 1..n and n >= 1, got {k}/{n}")
    target_steps = [p.sampling.num_steps for p in points if p.csd is None]
    fewest = replace(points[0].sampling, num_steps=min(target_steps))
    shared = [0] + [i for i, p in enumerate(points) if p.csd is None and p.sampling == fewest and i > 0][:1]
    rest = [i for i in range(len(points)) if i not in shared]
    return [points[i] for i in sorted(shared + rest[k - 1 :: n])]


def merge_parts(results: list[dict], order: Sequence[str]) -> dict:
    """One frontier from the parts (:func:`part`) of a grid timed at the same batch: the rows in the
    grid's ``order`` (a point in several parts kept from the first), the fronts and verdict recomputed.
    Each row's time is a ratio to its own part's baseline, timed side by side in that part; the pass
    costs are the first part's, each part's kept under ``parts``."""
    if not results or len({r["batch"] for r in results}) != 1 or len({r["n"] for r in results}) != 1:
        raise ValueError("merge_parts: results of one batch and one n, at least one")
    rows: dict[str, dict] = {}
    for result in results:
        for row in result["rows"]:
            rows.setdefault(row["name"], dict(row))
    missing = [name for name in order if name not in rows]
    extra = [name for name in rows if name not in order]
    if missing or extra:
        raise ValueError(f"merge_parts: rows missing {missing[:3]}, rows not in the grid {extra[:3]}")
    merged = dict(results[0])
    merged["rows"] = [rows[name] for name in order]
    mark_fronts(merged["rows"], merged["metrics"])
    merged["verdict"] = verdict(merged["rows"])
    merged["parts"] = [
        {
            "rows": [r["name"] for r in result["rows"]],
            "pass_costs": result["pass_costs"],
            "minutes": result.get("minutes"),
        }
        for result in results
    ]
    return merged


def kept_rows(earlier: dict, parts: list[dict], rtol: float = 1e-3) -> dict:
    """The rows of an ``earlier`` frontier (same weights and batch) as one more part for :func:`merge_parts`,
    for a grid that grew: only the new settings are run (``--frontier-only``), the rest is kept. A row's
    quality does not depend on when it was measured, so the settings measured in both must agree on FD
    and accuracy (relative ``rtol``); otherwise the images changed since (code, seeds) and the whole grid
    must run again. Times from different runs do not mix: retime the merged frontier alone."""
    fresh = {r["name"]: r for result in parts for r in result["rows"]}
    shared = [r for r in earlier["rows"] if r["name"] in fresh]
    if not shared:
        raise ValueError("kept rows: no setting measured in both the earlier frontier and the parts to check it by")
    for row in shared:
        now = fresh[row["name"]]
        for metric in ("fd", "accuracy"):
            if abs(row[metric] - now[metric]) > rtol * max(1.0, abs(now[metric])):
                raise ValueError(
                    f"kept rows: {row['name']!r} {metric} {row[metric]:.4f} earlier, {now[metric]:.4f} now: "
                    "the images changed since; run the whole grid"
                )
    return earlier | {"rows": [r for r in earlier["rows"] if r["name"] not in fresh]}


def pareto(times: list[float], quality: list[float], higher_is_better: bool) -> list[bool]:
    """True for the points no other point beats on both: at most the time and at least the quality,
    better in one of them."""
    q = [v if higher_is_better else -v for v in quality]
    front = []
    for i in range(len(times)):
        dominated = any(
            times[j] <= times[i] and q[j] >= q[i] and (times[j] < times[i] or q[j] > q[i]) for j in range(len(times))
        )
        front.append(not dominated)
    return front


def fd_standard_error(feats: np.ndarray, ref: np.ndarray, seed: int = 0) -> float:
    """Bootstrap standard error of the Frechet distance over the generated images."""
    rng = np.random.default_rng(seed)
    values = [frechet_distance(feats[rng.integers(0, len(feats), len(feats))], ref) for _ in range(BOOTSTRAP)]
    return float(np.std(values, ddof=1))


TIMED_IMAGES = 8  # images per timed unit at batches up to 8 ...
LATENCY_IMAGES = 3  # ... but at batch 1, where one image at a time is slow: 3 (distinct seeds)


def timed_units(batch: int) -> int:
    """Generations of ``batch`` images in one timed unit."""
    return max(1, math.ceil((LATENCY_IMAGES if batch == 1 else TIMED_IMAGES) / batch))


@dataclass
class Timed:
    """One setting's timings at one batch: median seconds of a unit (:func:`timed_units`) and the
    phase times and work of its last unit (summed over the unit's generations)."""

    seconds: float
    times: dict
    work: dict


def _unit_trace(outputs: list[Generation]) -> tuple[dict, dict]:
    times: dict[str, float] = {}
    work: dict[str, dict[str, int]] = {}
    for g in outputs:
        for phase, sec in g.trace.times.items():
            times[phase] = times.get(phase, 0.0) + sec
        for phase, w in g.trace.work.items():
            acc = work.setdefault(phase, dict.fromkeys(WORK_KEYS, 0))
            for k in WORK_KEYS:
                acc[k] += w.get(k, 0)
    return times, work


def time_points(target, draft, points: list[Point], batch: int, repeats: int, extra: dict | None = None) -> dict:
    """Every point (and ``extra``: name -> callable(labels, seeds)) timed side by side at ``batch``:
    a unit is :func:`timed_units` generations of distinct seeds; units are interleaved over ``repeats``
    rounds after one warm-up round (none at batch 1, where a first run costs what a second does on a
    CPU). -> name -> :class:`Timed`."""
    units = timed_units(batch)
    labels, seeds = eval_labels_seeds(batch * units, 100_000, target.traits)
    chunks = [(labels[i * batch : (i + 1) * batch], seeds[i * batch : (i + 1) * batch]) for i in range(units)]

    def runner(p: Point):
        if p.csd is None:
            return lambda lab, sd: generate(target, lab, sd, p.sampling)
        return lambda lab, sd: speculative_generate(target, draft, lab, sd, p.sampling, p.csd)

    makers = {p.name: runner(p) for p in points} | dict(extra or {})
    runs = {name: (lambda f=f: [f(lab, sd) for lab, sd in chunks]) for name, f in makers.items()}
    samples = alternate(runs, repeats, warmup=0 if batch == 1 else 1)
    out = {}
    for name, smp in samples.items():
        times, work = _unit_trace(smp.outputs[-1])
        out[name] = Timed(smp.median, times, work)
    return out


def draft_runs(target, draft, sampling: SamplingConfig, fewest: int | None) -> dict:
    """Draft-only runs for the cost model's draft terms: at the base AR steps and, where the family's
    steps can change, at ``fewest`` (a second token count per transition); the draft's head takes the
    target's head steps, as in CSD."""
    base = replace(sampling, head_steps=target.head_steps(sampling.head_steps))
    settings = {"draft-only": base}
    if fewest is not None:
        settings[f"draft-only, {fewest} AR steps"] = replace(base, num_steps=fewest)
    return {name: (lambda lab, sd, s=s: generate(draft, lab, sd, s, Maker.DRAFT)) for name, s in settings.items()}


def pass_costs(timed: dict[str, Timed], target_runs: Sequence[str], draft_runs_: Sequence[str]) -> PassCosts:
    """The cost model's per-pass costs from the target-only and draft-only runs at one batch."""

    def fitted(names, model):
        backbone = [phase_totals(timed[n].times, timed[n].work, BACKBONE_PHASES[model])[:2] for n in names]
        chain = [phase_totals(timed[n].times, timed[n].work, CHAIN_PHASES[model]) for n in names]
        return fit_pass(backbone), fit_chain([(sec, steps, tok) for sec, _, steps, tok in chain])

    c_p, h_p = fitted(target_runs, "target")
    c_q, h_q = fitted(draft_runs_, "draft")
    return PassCosts(c_p, c_q, h_p, h_q)


def run_frontier(
    target, draft, points: list[Point], classifier, ref_feats, n: int, batches: Sequence[int], repeats: int
) -> dict[int, dict]:
    """Time every point side by side at each of ``batches``, score ``n`` images of each once (a
    setting's images do not depend on the batch it is timed at) -> batch -> result.

    Each result's rows carry the measured time (a ratio to the baseline at that batch) and the cost
    model's prediction (``predicted``: :class:`csd.cost.PassCosts` from the target-only and draft-only
    runs at that batch applied to the row's own work, over the baseline's measured time)."""
    fewest = min((p.sampling.num_steps for p in points if p.csd is None), default=None)
    base_steps = points[0].sampling.num_steps
    fewest_point = next(
        (p.name for p in points if p.csd is None and p.sampling == replace(points[0].sampling, num_steps=fewest)), None
    )
    if fewest == base_steps:
        fewest, fewest_point = None, None
    extra = draft_runs(target, draft, points[0].sampling, fewest)
    timings = {b: time_points(target, draft, points, b, repeats, extra) for b in batches}
    eval_labels, eval_seeds = eval_labels_seeds(n, 0, target.traits)
    scored = []
    for p in points:
        mode = "target" if p.csd is None else "csd"
        images, _ = generate_images(mode, target, draft, eval_labels, eval_seeds, p.sampling, p.csd or CSDConfig(), 8)
        scores, feats = quality(images, eval_labels, ref_feats, classifier)
        acc = scores["accuracy"]
        scored.append(
            {
                "accuracy": acc,
                "accuracy_se": math.sqrt(acc * (1 - acc) / n),
                "fd": scores["fd"],
                "fd_se": fd_standard_error(feats, ref_feats),
            }
        )
    results = {}
    for b, timed in timings.items():
        base = timed[points[0].name].seconds
        costs = pass_costs(timed, [points[0].name] + ([fewest_point] if fewest_point else []), list(extra))
        rows = []
        for p, quality_ in zip(points, scored, strict=True):
            t = timed[p.name]
            rows.append(
                {
                    "name": p.name,
                    "method": p.method,
                    "time": t.seconds / base,
                    "predicted": costs.predict(t.work) / base,
                    **quality_,
                    "phases": {k: v / base for k, v in sorted(t.times.items())},
                    "sampling": asdict(p.sampling),
                    "csd": None if p.csd is None else asdict(p.csd),
                }
            )
        metrics = ["fd", "accuracy"]
        mark_fronts(rows, metrics)
        units = timed_units(b)
        made = f"{units * b} images" + (f" as {units} generations of {b}" if units > 1 else f" at batch {b}")
        results[b] = {
            "rows": rows,
            "metrics": metrics,
            "n": n,
            "batch": b,
            "repeats": repeats,
            "timing": f"median wall time of {made} over {repeats} interleaved repeats",
            "pass_costs": {
                "seconds_target_only": base,
                **{k: v / base for k, v in asdict(costs).items() if not isinstance(v, dict)},
                "target_chain": {k: v / base for k, v in asdict(costs.target_chain).items()},
                "draft_chain": {k: v / base for k, v in asdict(costs.draft_chain).items()},
                "draft_only": {name: timed[name].seconds / base for name in extra},
            },
            "verdict": verdict(rows),
        }
    return results


def points_of(result: dict) -> list[Point]:
    """The settings of a frontier's rows, as they were run."""
    return [
        Point(r["name"], SamplingConfig(**r["sampling"]), None if r["csd"] is None else CSDConfig(**r["csd"]))
        for r in result["rows"]
    ]


def retime(target, draft, result: dict, repeats: int) -> dict:
    """A frontier timed again at its batch (a quieter machine, say), its quality kept: a setting's images
    do not depend on when it is timed. Times, predictions, phases, fronts and verdict are this run's."""
    points = points_of(result)
    base_sampling = points[0].sampling
    fewest = min((p.sampling.num_steps for p in points if p.csd is None), default=base_sampling.num_steps)
    fewest_point = next(
        (p.name for p in points if p.csd is None and p.sampling == replace(base_sampling, num_steps=fewest)), None
    )
    if fewest == base_sampling.num_steps:
        fewest, fewest_point = None, None
    extra = draft_runs(target, draft, base_sampling, fewest)
    b = int(result["batch"])
    timed = time_points(target, draft, points, b, repeats, extra)
    base = timed[points[0].name].seconds
    costs = pass_costs(timed, [points[0].name] + ([fewest_point] if fewest_point else []), list(extra))
    rows = []
    for p, row in zip(points, result["rows"], strict=True):
        t = timed[p.name]
        rows.append(
            row
            | {
                "time": t.seconds / base,
                "predicted": costs.predict(t.work) / base,
                "phases": {k: v / base for k, v in sorted(t.times.items())},
            }
        )
    mark_fronts(rows, result_metrics(result))
    units = timed_units(b)
    made = f"{units * b} images" + (f" as {units} generations of {b}" if units > 1 else f" at batch {b}")
    out = dict(result) | {"rows": rows, "repeats": repeats, "verdict": verdict(rows)}
    out["timing"] = (
        f"median wall time of {made} over {repeats} interleaved repeats (timed again alone; quality from the first run)"
    )
    out["pass_costs"] = {
        "seconds_target_only": base,
        **{k: v / base for k, v in asdict(costs).items() if not isinstance(v, dict)},
        "target_chain": {k: v / base for k, v in asdict(costs.target_chain).items()},
        "draft_chain": {k: v / base for k, v in asdict(costs.draft_chain).items()},
        "draft_only": {name: timed[name].seconds / base for name in extra},
    }
    return out


def mark_fronts(rows: list[dict], metrics: Sequence[str]) -> None:
    """Set ``front_<metric>`` on every row: on the Pareto front of time against that metric."""
    times = [r["time"] for r in rows]
    for key in metrics:
        for r, on in zip(rows, pareto(times, [r[key] for r in rows], METRICS[key][1]), strict=True):
            r[f"front_{key}"] = on


# --- the app's recompute: a few images, run by run ----------------------------------------------


def image_scores(pair: ModelPair, labels: Sequence[int], reference: Generation) -> tuple[str, Callable]:
    """(metric key, per-image scores of a generation).

    Class accuracy (1 where the shapes classifier names the conditioning class, or the class a prompt
    names) where the classifier applies: pixel pairs over the shapes classes. Otherwise the RMS token
    distance to ``reference``, a target-only run with the same seeds: a measure of closeness to the full
    run, not of quality."""
    shapes = pair.class_names == CLASS_NAMES or pair.is_text
    wanted = [prompt_class(c) if isinstance(c, str) else c for c in labels]
    pixels = (
        isinstance(getattr(pair.tokenizer, "inner", pair.tokenizer), PixelTokenizer) and DEFAULT_CLASSIFIER.is_file()
    )
    if pixels and shapes and None not in wanted:
        classifier = load_classifier()
        wanted = np.asarray(wanted)
        return "accuracy", lambda g: (predict(pair.tokenizer.decode(g.tokens), classifier) == wanted).astype(float)
    return "rms", lambda g: (g.tokens - reference.tokens).pow(2).mean(dim=(1, 2)).sqrt().numpy()


class SmallFrontier:
    """The frontier of one pair at a few images (image i: seed + i, class (label + i) mod classes), one
    run per setting; the baseline runs first and again last, and the two runs' difference is reported
    as the timing drift. On a CPU a setting's first run costs about what a second run does (measured
    within the run-to-run noise), so no warm-up pass is spent."""

    def __init__(self, pair: ModelPair, points: list[Point], n_images: int, seed: int = 0, label: int = 0, prompt=None):
        check_int("number of images", n_images, 1)
        if not points or points[0].csd is not None:
            raise ValueError("points must start with the target-only baseline")
        self.pair, self.points = pair, points
        self.labels = image_conditions(pair, n_images, label, prompt)
        self.seeds = [seed + i for i in range(n_images)]
        self._runs: list = []

    def __len__(self) -> int:
        return len(self.points) + 1

    def _order(self) -> list[Point]:
        return [*self.points, self.points[0]]  # each setting, then the baseline again

    def planned(self) -> list[tuple[SamplingConfig, CSDConfig | None]]:
        """The setting of every run, in order (CSD None: target-only): what an estimate of the cost needs."""
        return [(p.sampling, p.csd) for p in self._order()]

    def steps(
        self, on_step: Callable[[str], StepCallback | None] = lambda label: None
    ) -> Iterator[tuple[int, int, str]]:
        """Run every setting; yields (done, total, label of the next run) before each."""
        order = self._order()
        self._runs = []
        for i, p in enumerate(order):
            label = p.name if i < len(self.points) else f"{p.name}, timed again"
            yield i, len(order), label
            callback = on_step(label)
            if p.csd is None:
                run = run_single(self.pair, self.labels, self.seeds, p.sampling, on_step=callback)
            else:
                run = run_csd(self.pair, self.labels, self.seeds, p.sampling, p.csd, on_step=callback)
            self._runs.append(run)

    def result(self) -> dict:
        if len(self._runs) != len(self):
            raise RuntimeError("run every step of the frontier before asking for its result")
        first, last = self._runs[0].seconds, self._runs[-1].seconds
        base = (first + last) / 2
        key, score = image_scores(self.pair, self.labels, self._runs[0].generation)
        n, rows = len(self.labels), []
        for i, (p, run) in enumerate(zip(self.points, self._runs, strict=False)):
            values = score(run.generation)
            rows.append(
                {
                    "name": p.name,
                    "method": p.method,
                    "time": 1.0 if i == 0 else run.seconds / base,  # the baseline: the mean of its two runs
                    key: float(values.mean()),
                    f"{key}_se": float(values.std() / math.sqrt(n)),
                    "target_passes": run.trace.target_passes,
                    "sampling": asdict(p.sampling),
                    "csd": None if p.csd is None else asdict(p.csd),
                }
            )
        mark_fronts(rows, [key])
        drift = abs(last - first) / base
        return {
            "pair": self.pair.name,
            "weights": self.pair.weights,
            "rows": rows,
            "metrics": [key],
            "n": n,
            "batch": n,
            "repeats": 1,
            "timing": f"one run per setting at batch {n} (the baseline's two runs differ by {100 * drift:.0f}%)",
            "drift": drift,
            "seed": self.seeds[0],
            "label": self.labels[0],
        }
