"""How the app offers the samplers' settings: one :class:`AppControl` per offered knob, keyed by the knob's
field name (:class:`csd.config.Knob`), in page order. The knob declares what the setting is and its valid
values; this table only says how the page shows it. :mod:`demo.controls` makes each control from the two
together, so a knob reaches its command-line flag (:mod:`csd.cli`) and its control from one declaration each."""

from __future__ import annotations

from dataclasses import dataclass

from csd.config import CSDConfig, SamplingConfig, knobs


@dataclass(frozen=True)
class AppControl:
    """How the app offers a knob: its label, the control's range and step where narrower than the knob's
    (``hi`` None on an int knob: the server's limit; an int ``step``: integers only), a hint under it,
    whether it sits under "advanced", and the keyword the app's API takes (default: the field's name)."""

    label: str
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    info: str = ""
    advanced: bool = False
    name: str = ""


# The knobs the page offers, by field name, in page order.
KNOB_CONTROLS: dict[str, AppControl] = {
    "num_steps": AppControl("AR steps", 1, step=1, name="ar_steps"),
    "gamma": AppControl("Draft length gamma", 1, 32, 1, info="AR steps per target pass"),
    "prefill": AppControl("Pre-fill ratio", 0.0, 0.5, 0.01, info="fraction of tokens the target makes before drafting"),
    "cfg_scale": AppControl("CFG scale", 1.0, 10.0, 0.1),
    "cfg_schedule": AppControl("CFG schedule"),
    "temperature": AppControl("Temperature", 0.1, 2.0, 0.05),
    "align": AppControl("Trajectory alignment (shared noise)"),
    "criterion": AppControl(
        "Acceptance criterion",
        info="aligned: the paper's approximation; exact: path-space reference; published: what the published "
        "code computes (products of densities in float32, a token never accepted left at zero)",
    ),
    "tau_v": AppControl("Verification widening tau_v", 1.0, 100.0, 0.5, advanced=True),
    "trajectory_term": AppControl(
        "Trajectory term", info="derived sign, published sign, or none (final-step term only)", advanced=True
    ),
    "resample_widening": AppControl(
        "Resample widening",
        1.0,
        100.0,
        0.5,
        info="equal to tau_v makes test and resampling self-consistent",
        advanced=True,
    ),
    "max_tries": AppControl("Resampler cap", 1, 1000, 1, advanced=True),
    "block": AppControl(
        "Block",
        info="published: every drafted step verified from the context before the block, the whole block kept; "
        "context: each step given the drafted steps before it; exact: so, and the block kept through its first "
        "step with a rejection (gamma 1's quality; the Method tab measures all three)",
        advanced=True,
    ),
}


def unknown_fields(controls: dict[str, AppControl]) -> list[str]:
    """The keys of ``controls`` that name no knob of the samplers' configs."""
    fields = set(knobs(SamplingConfig)) | set(knobs(CSDConfig))
    return [name for name in controls if name not in fields]


if unknown_fields(KNOB_CONTROLS):
    raise ValueError(f"app controls of no knob: {unknown_fields(KNOB_CONTROLS)}")
