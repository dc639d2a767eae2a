"""The settings of a quality-time frontier: every cheap alternative of one pair as a typed, named setting.

A :class:`Point` is a sampler setting (target-only, or CSD where ``csd`` is set) with a display name for the
tables and charts and a stable :meth:`~Point.key`: its changes over the grid's baseline, written as the
tools write settings (``csd,gamma=4,tau_v=5``), so selection never matches display text. The grid holds
target-only with fewer AR steps, fewer head steps or a head-step schedule, DiSA, LazyMAR's caches, the
target's few-step samplers and GtR where the family takes them, CSD at several draft lengths, tests and head
steps, and their combinations; :mod:`csd.experiments.frontier` times and scores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from csd.cli import changes
from csd.config import CSDConfig, SamplingConfig
from csd.core.schedule import DISA_FLOOR
from csd.dispatch import Method
from csd.settings import FLOW_GRIDS

SAMPLER_METHODS = {"ddim": "target, DDIM", "euler": "target, Euler ODE", "heun": "target, Heun ODE"}
FLOW_COUNTS = range(3, 13)  # the flow steps of xAR's ODE samplers and uniform grid on the frontier
DDIM_STEPS = (5, 8, 10, 12, 15)  # a DDIM head's steps on the frontier (below the target's)
DDIM_ETA = 0.5  # DDIM's stochastic variant on the frontier (eta 0 is the deterministic one)
GTR_RATIO = (24, 6, 2)  # GtR's MAR stages (K = 3): AR steps at its rates 2.67, 10.67, 64 of 256 tokens
FAST = {"gamma": 4, "tau_v": 5.0}  # CSD's short drafts under a strict test: the grid composes it with the rest
FAST_NAME = "CSD, gamma 4, tau_v 5"
EXACT_GAMMAS = {True: (4,), False: (4, 8)}  # the exact block's draft lengths: the quick grid's, the full grid's
FINAL_ONLY = {"align": False, "criterion": "aligned", "trajectory_term": "none"}  # a draft of other chains


@dataclass(frozen=True)
class Point:
    """One sampler setting; ``csd`` None is target-only."""

    name: str
    sampling: SamplingConfig
    csd: CSDConfig | None = None

    def key(self, base: SamplingConfig) -> str:
        """Its stable key: "target" or "csd", then the sampling knobs it changes over ``base`` (the grid's
        baseline) and the CSD knobs it changes over the defaults, as ``key=value``, comma-separated."""
        kind = ["target"] if self.csd is None else ["csd", *changes(self.csd, CSDConfig())]
        return ",".join([kind[0], *changes(self.sampling, base), *kind[1:]])

    @property
    def runner(self) -> Method:
        """What runs at this point: target-only, or CSD at ``csd``."""
        return Method.of(self.csd)

    @property
    def method(self) -> str:
        """Its method's name in the tables and charts ("CSD", "target, DiSA", ...)."""
        if self.csd is not None:
            return "CSD"
        s = self.sampling
        if s.gtr is not None:
            return "target, GtR"
        if s.sampler.kind in SAMPLER_METHODS:
            return SAMPLER_METHODS[s.sampler.kind]
        if s.sampler.flow_grid == "uniform":
            return "target, uniform grid"
        if s.head_anneal is not None and s.head_anneal.schedule.startswith("disa"):
            return "target, DiSA"
        if s.token_cache is not None:
            return "target, LazyMAR token cache"
        if s.cond_cache is not None:
            return "target, LazyMAR condition cache"
        cheap = s.head_steps is not None or s.head_anneal is not None
        return "target, cheaper head" if cheap else "target, fewer AR steps"


def fast_point(what: str, sampling: SamplingConfig, csd: CSDConfig) -> Point:
    """CSD at :data:`FAST` on ``sampling``, named for ``what`` it composes with."""
    return Point(f"{FAST_NAME}, {what}", sampling, csd.with_knobs(**FAST))


def points_of(result: dict) -> list[Point]:
    """The settings of a frontier's rows, as they were run."""
    return [
        Point(
            r["name"],
            SamplingConfig.from_knobs(**r["sampling"]),
            None if r["csd"] is None else CSDConfig.from_knobs(**r["csd"]),
        )
        for r in result["rows"]
    ]


def keyed(points: Sequence[Point]) -> dict[str, Point]:
    """The points by key (over the first point's sampling, the baseline), the first of any that repeat a
    setting."""
    out: dict[str, Point] = {}
    for p in points:
        out.setdefault(p.key(points[0].sampling), p)
    return out


def select(points: list[Point], only: Sequence[str] | None) -> list[Point]:
    """The baseline and the points ``only`` names (all of them when None). An item names every point whose key
    holds each of its comma-separated parts (``csd``: every CSD point; ``gamma=4,tau_v=5``; a bare knob such as
    ``cond_cache_start``: that knob changed); ``=`` and a whole key names that point alone (``=csd``: CSD at
    the grid's own setting)."""
    if not only:
        return points
    whole = {text[1:] for text in only if text.startswith("=")}
    parts = [set(text.split(",")) for text in only if not text.startswith("=")]
    held = lambda key: set(key.split(",")) | {item.partition("=")[0] for item in key.split(",")}
    chosen = [p for key, p in list(keyed(points).items())[1:] if key in whole or any(q <= held(key) for q in parts)]
    return [points[0], *chosen]


# --- the published methods' settings, in proportion to the pair's ---------------------------------------


def disa_steps(head_steps: int, fixed_steps: bool) -> dict:
    """DiSA's published annealing, in proportion to the target's head steps: a DDPM head (MAR, Harmon)
    100 -> 50 at the first AR step to 5 at the last, an xAR flow chain 50 -> 15 (Qinyu-Allen-Zhao/DiSA
    READMEs), both along DiSA's linear schedule."""
    t = head_steps
    first, last = (t, max(2, round(0.3 * t))) if fixed_steps else (max(2, t // 2), max(1, round(t / 20)))
    return {"head_steps": first, "head_steps_min": min(first, last), "head_schedule": "disa"}


def disa_floor(head_steps: int) -> dict:
    """DiSA at its absolute floor: from half the target's head steps down to DiSA's 5 at the last AR step
    (csd.core.schedule.DISA_FLOOR), along DiSA's linear schedule."""
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


# --- the grid's parts ---------------------------------------------------------------------------------


def ode_point(s: SamplingConfig, sampler: str, grid_: str, k: int) -> Point:
    """Target-only on xAR's probability-flow ODE (``sampler`` "euler" or "heun") at ``k`` flow steps."""
    ode = s.with_knobs(head_steps=k, head_sampler=sampler, flow_grid=grid_)
    return Point(f"target, {sampler.title()} ODE flow {k} steps, {grid_} grid", ode)


def sampler_points(s: SamplingConfig, c: CSDConfig, head_steps: int, head_samplers: Sequence[str], quick: bool):
    """The target's few-step samplers and CSD on them where its test is defined: DDIM at eta 0
    and DDIM_ETA (masked families), xAR's probability-flow ODE (Euler, Heun) on both time grids and its
    Euler-Maruyama sampler on the uniform grid; CSD with DDIM at eta > 0, on the uniform grid, and with a
    draft on a deterministic sampler under the final-step test."""
    t, points = head_steps, []
    counts = [k for k in ((5, 10) if quick else DDIM_STEPS) if k < t]
    if "ddim" in head_samplers and counts:
        for eta in (0.0, DDIM_ETA):
            for k in counts:
                ddim = s.with_knobs(head_steps=k, head_sampler="ddim", ddim_eta=eta)
                points.append(Point(f"target, DDIM eta {eta:g} head {k} steps", ddim))
        k = max(counts)
        stochastic = s.with_knobs(head_steps=k, head_sampler="ddim", ddim_eta=DDIM_ETA)
        points.append(fast_point(f"DDIM eta {DDIM_ETA:g} head {k}", stochastic, c))
        draft = c.with_knobs(draft_head_sampler="ddim", draft_head_steps=min(counts), **FINAL_ONLY)
        points.append(Point(f"CSD, gamma {c.gamma}, draft DDIM eta 0 head {draft.draft_head_steps}", s, draft))
    counts = [k for k in ((4, 8) if quick else FLOW_COUNTS) if k < t]
    if "euler" in head_samplers and counts:
        points += [ode_point(s, sampler, g, k) for sampler in ("euler", "heun") for g in FLOW_GRIDS for k in counts]
        points += [
            Point(f"target, flow {k} steps, uniform grid", s.with_knobs(head_steps=k, flow_grid="uniform"))
            for k in counts
        ]
        # at the target's own flow steps the grids can coincide (25: both step 0.04), so CSD on the uniform grid
        # is measured at fewer
        for k in sorted({8, max(counts)} & set(counts)):
            points.append(fast_point(f"flow {k}, uniform grid", s.with_knobs(head_steps=k, flow_grid="uniform"), c))
        draft = c.with_knobs(draft_head_sampler="euler", criterion="aligned", trajectory_term="none")
        points.append(Point(f"CSD, gamma {c.gamma}, draft Euler ODE (final-step test)", s, draft))
    return points


def gtr_stages_point(s: SamplingConfig, head_steps: int) -> Point:
    """GtR's stages alone at half the AR steps (its head steps the target's)."""
    half = gtr_setting(s.num_steps // 2, head_steps, detail=False)
    return Point(f"target, {gtr_name(half)}", s.with_knobs(**half))


def gtr_points(s: SamplingConfig, c: CSDConfig, head_steps: int, quick: bool) -> list[Point]:
    """GtR (masked families): its stages alone at half the AR steps, the whole method (stage-aware heads and
    FTS) at a half and a quarter, and CSD following its stages (FTS does not compose)."""
    points = [gtr_stages_point(s, head_steps)]
    for fraction in (2,) if quick else (2, 4):
        full = gtr_setting(max(3, s.num_steps // fraction), head_steps)
        points.append(Point(f"target, {gtr_name(full)}", s.with_knobs(**full)))
    staged = {k: v for k, v in gtr_setting(s.num_steps // 2, head_steps).items() if not k.startswith("gtr_detail")}
    points.append(fast_point(gtr_name(staged), s.with_knobs(**staged), c))
    return points


def cache_points(s: SamplingConfig, c: CSDConfig, caches_guidance: bool, caches_tokens: bool) -> list[Point]:
    """LazyMAR's condition cache (guided runs) and token cache, alone, together and with CSD."""
    points = []
    if caches_guidance and s.guided:
        lazy = lazymar_cache(s.num_steps)
        lazy_name = f"condition cache {lazy['cond_cache_start']}/{lazy['cond_cache_every']} (LazyMAR)"
        points.append(Point(f"target, {lazy_name}", s.with_knobs(**lazy)))
        points.append(fast_point(lazy_name, s.with_knobs(**lazy), c))
    if caches_tokens:
        tokens = lazymar_token_cache(s.num_steps)
        name = f"token cache {100 * tokens['token_cache_keep']:g}% {tokens['token_cache_start']}/"
        name += f"{tokens['token_cache_every']} (LazyMAR)"
        points.append(Point(f"target, {name}", s.with_knobs(**tokens)))
        if s.guided:
            both = lazymar_cache(s.num_steps) | tokens
            points.append(Point("target, token and condition caches (LazyMAR)", s.with_knobs(**both)))
        points.append(fast_point(name, s.with_knobs(**tokens), c))
    return points


@dataclass(frozen=True)
class Cheaper:
    """The target's cheaper settings that CSD composes with: its head name ("head", or "flow" for xAR's
    chain), a halved head, and DiSA's annealing."""

    head: str
    few: dict
    disa: dict

    @property
    def disa_name(self) -> str:
        return f"DiSA {self.head} {self.disa['head_steps']} -> {self.disa['head_steps_min']}"

    @classmethod
    def of(cls, head_steps: int, fixed_steps: bool) -> Cheaper:
        t = head_steps
        return cls("flow" if fixed_steps else "head", {"head_steps": max(2, t // 2)}, disa_steps(t, fixed_steps))


def ar_step_counts(s: SamplingConfig, quick: bool, fixed_steps: bool) -> list[int]:
    """Target-only's fewer AR steps: a few (quick), else every count from a quarter to three quarters of the
    base, most first, so every CSD setting has an alternative within a step's time; none where they are
    fixed."""
    if fixed_steps:
        return []
    if quick:
        return [k for k in (16, 8) if k < s.num_steps]
    return list(range(max(2, s.num_steps // 4), (3 * s.num_steps) // 4 + 1))[::-1]


def target_points(s: SamplingConfig, t: int, cheaper: Cheaper, quick: bool, fixed_steps: bool) -> list[Point]:
    """Target-only at the baseline, with fewer AR steps, fewer head steps, a head-step schedule, DiSA, and
    fewer AR steps with a cheaper head."""
    head, few, disa = cheaper.head, cheaper.few, cheaper.disa
    points = [Point(f"target-only ({s.num_steps} AR steps, {head} {t})", s)]
    ar_steps = ar_step_counts(s, quick, fixed_steps)
    points += [Point(f"target, {k} AR steps", s.with_knobs(num_steps=k)) for k in ar_steps]
    if fixed_steps and not quick:  # every flow-step count from two thirds to a quarter
        fewer = list(range((2 * t) // 3, max(2, t // 4) - 1, -1))
    else:
        fewer = list(dict.fromkeys([few["head_steps"]] + ([max(2, t // 4)] if fixed_steps else [])))  # distinct
    points += [Point(f"target, {head} {k} steps", s.with_knobs(head_steps=k)) for k in fewer]
    annealed = s.with_knobs(head_steps=t, head_steps_min=max(2, t // 5))
    points.append(Point(f"target, {head} {t} -> {max(2, t // 5)} steps", annealed))
    points.append(Point(f"target, {cheaper.disa_name}", s.with_knobs(**disa)))
    if ar_steps:
        combined = ar_steps[:1] if quick else sorted({round(s.num_steps * f) for f in (0.375, 0.5, 0.625)})[::-1]
        for k in combined:
            points.append(Point(f"target, {k} AR steps, head {few['head_steps']}", s.with_knobs(num_steps=k, **few)))
    if ar_steps and not quick:
        k = s.num_steps // 2
        points.append(Point(f"target, {k} AR steps, {cheaper.disa_name}", s.with_knobs(num_steps=k, **disa)))
    return points


def csd_points(s: SamplingConfig, c: CSDConfig, cheaper: Cheaper, quick: bool) -> list[Point]:
    """CSD at three draft lengths (two quick) and two tests, with a halved head, a pre-fill, an
    independent-noise draft head, the exact block (at gamma 4; and 8 in the full grid), and (the full grid) a
    halved head at gamma 8 and DiSA."""
    head, few = cheaper.head, cheaper.few
    points = [
        Point(f"CSD, gamma {g}, tau_v {tau:g}", s, c.with_knobs(gamma=g, tau_v=tau))
        for g in ((4, 8) if quick else (4, 8, 16))
        for tau in (c.knob_values()["tau_v"], 5.0)
    ]
    points += [
        fast_point(f"{head} {few['head_steps']}", s.with_knobs(**few), c),
        Point(f"CSD, gamma {c.gamma}, pre-fill 25%", s, c.with_knobs(prefill=0.25)),
        Point(
            f"CSD, gamma {c.gamma}, draft {head} {few['head_steps']} (independent noise)",
            s,
            c.with_knobs(draft_head_steps=few["head_steps"], **FINAL_ONLY),
        ),
    ]
    # The exact block (each drafted step verified given those before it, committed through the first rejection)
    exact = lambda g: Point(f"CSD, gamma {g}, exact block", s, c.with_knobs(gamma=g, block="exact"))
    points += [exact(g) for g in EXACT_GAMMAS[quick]]
    if not quick:
        points.append(Point(f"CSD, gamma 8, {head} {few['head_steps']}", s.with_knobs(**few), c.with_knobs(gamma=8)))
        points.append(fast_point(cheaper.disa_name, s.with_knobs(**cheaper.disa), c))
    return points


def disa_floor_points(s: SamplingConfig, c: CSDConfig, t: int) -> list[Point]:
    """DiSA at its floor, alone and with CSD (a DDPM head, above the floor)."""
    if t // 2 <= DISA_FLOOR:
        return []
    floor = disa_floor(t)
    floor_name = f"DiSA floor, head {floor['head_steps']} -> {floor['head_steps_min']}"
    return [Point(f"target, {floor_name}", s.with_knobs(**floor)), fast_point(floor_name, s.with_knobs(**floor), c)]


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
    (:func:`gtr_points`). The app's recompute passes neither. Each setting is in it once."""
    s, c, t = sampling, csd, head_steps
    cheaper = Cheaper.of(t, fixed_steps)
    points = target_points(s, t, cheaper, quick, fixed_steps) + csd_points(s, c, cheaper, quick)
    if not quick:
        points += cache_points(s, c, caches_guidance, caches_tokens)
    points += sampler_points(s, c, t, head_samplers, quick)
    if "ddim" in head_samplers:
        points += disa_floor_points(s, c, t)
    if takes_gtr:
        points += gtr_points(s, c, t, quick)
    return list(keyed(points).values())  # a setting two ways (small head steps can make them coincide) runs once


def deciding_points(
    sampling: SamplingConfig, head_steps: int, head_samplers: Sequence[str] = (), takes_gtr: bool = False
) -> list[Point]:
    """The alternatives that decided the verdicts on 200 paired images (docs/results.md, "Enough images to
    decide"), as the full grid makes them, for the app's quick frontier: GtR's stages alone at half the AR
    steps (masked families), the probability-flow ODE with Euler at 6 and Heun at 4 flow steps on the
    uniform grid (xAR), each where the family takes it."""
    points = [gtr_stages_point(sampling, head_steps)] if takes_gtr else []
    if "euler" in head_samplers:
        ode = (("euler", 6), ("heun", 4))
        points += [ode_point(sampling, sampler, "uniform", k) for sampler, k in ode if k < head_steps]
    return points


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
