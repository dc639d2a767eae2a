"""Settings are declared once, beside their fields (csd.config.Knob): every field of the sampler configs has
a declaration, every declaration makes a flag of the tools (csd.cli) and, where the app declares one by the
field's name (demo.knobs), a control of the app; a bad value is an error that names its field, and the app
shows it on that field's control."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import gradio as gr
import pytest
import torch

from csd.cli import add_machine_flags, flag_groups, start_up
from csd.config import CSDConfig, Knob, SamplingConfig, knobs
from csd.core.checks import SettingError
from csd.experiments import defaults
from csd.experiments.evaluate import add_setting_args, settings_from_args
from csd.experiments.grid import points_of
from csd.family import FamilyTraits
from csd.run_setup import check_settings
from csd.settings import GtR, Published
from demo.controls import PAGE_FIELDS, control_name, knob_control, offered_knobs, preset_controls
from demo.knobs import KNOB_CONTROLS, AppControl, unknown_fields
from demo.requests import library_errors

CONFIGS = (SamplingConfig, CSDConfig)
ROOT = Path(__file__).resolve().parents[2]


def evaluate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_setting_args(parser)
    return parser


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_declares_a_knob_or_a_setting_value_whose_knobs_have_help(config):
    for f in dataclasses.fields(config):
        assert {"knob", "slot"} & set(f.metadata), f"{config.__name__}.{f.name} has no knob (csd.config.knob)"
    for key, k in knobs(config).items():
        assert k.help, f"{config.__name__}'s knob {key} has no help"


def test_field_names_are_unique_across_the_configs_so_one_flag_names_one_field():
    names = [set(knobs(c)) for c in CONFIGS]
    assert not names[0] & names[1]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_has_a_flag_on_the_command_line(config):
    flags = {s for a in evaluate_parser()._actions for s in a.option_strings}
    covered = {name for flag, names in flag_groups(config).items() if f"--{flag}" in flags for name in names}
    assert covered == set(knobs(config))


def test_the_flags_reach_the_settings_they_name():
    argv = "--num-steps 16 --precision bfloat16 --head-sampler ddim --ddim-eta 0.5 --gtr-stages 8 8 --gtr-head-steps 4"
    argv += " --gtr-detail 0.25 6 --cond-cache 2 5 --token-cache 0.5 3 4 --resample-widening 2 --max-tries 7"
    argv += " --acceptance-unit token --counterfactual --no-align --gamma-schedule 2 4 --draft-head-sampler ddim"
    argv += " --draft-ddim-eta 0.3 --head-steps none"
    sampling, csd = settings_from_args(evaluate_parser().parse_args(argv.split()))
    assert (sampling.cond_cache.start, csd.criterion.acceptance_unit, csd.draft_sampler.kind) == (2, "token", "ddim")
    sampling, csd = sampling.knob_values(), csd.knob_values()
    assert (sampling["num_steps"], sampling["precision"], sampling["head_sampler"], sampling["ddim_eta"]) == (
        16,
        "bfloat16",
        "ddim",
        0.5,
    )
    assert (sampling["gtr_stages"], sampling["gtr_head_steps"]) == ((8, 8), 4)
    assert (sampling["gtr_detail_fraction"], sampling["gtr_detail_steps"]) == (0.25, 6)
    assert (sampling["cond_cache_start"], sampling["cond_cache_every"]) == (2, 5)
    assert (sampling["token_cache_keep"], sampling["token_cache_start"], sampling["token_cache_every"]) == (0.5, 3, 4)
    assert (csd["resample_widening"], csd["max_tries"], csd["acceptance_unit"], csd["counterfactual"]) == (
        2.0,
        7,
        "token",
        True,
    )
    assert (csd["align"], csd["gamma_schedule"], csd["draft_head_sampler"], csd["draft_ddim_eta"]) == (
        False,
        (2, 4),
        "ddim",
        0.3,
    )
    assert sampling["head_steps"] is None and sampling["cfg_scale"] == defaults.SAMPLING.cfg_scale  # not given: kept


def test_a_preset_is_the_base_the_flags_change():
    parser = evaluate_parser()
    _, csd = settings_from_args(parser.parse_args(["--preset", "show rejections"]))
    assert (csd.criterion.tau_v, csd.align) == (1.0, False)
    _, csd = settings_from_args(parser.parse_args(["--preset", "show rejections", "--tau-v", "3"]))
    assert (csd.criterion.tau_v, csd.align) == (3.0, False)


def test_a_flag_of_the_wrong_kind_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        evaluate_parser().parse_args(["--max-tries", "2.5"])
    assert "--max-tries must be an integer, got '2.5'" in capsys.readouterr().err


def bad_value(k):
    """A value outside a knob's declared range or choices."""
    return {"int": (k.lo or 0) - 1, "number": (k.hi or 0) + 1, "choice": "nonsense", "ints": (0,), "bool": "yes"}[
        k.kind
    ]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_a_bad_value_of_every_knob_is_an_error_that_carries_its_field(config):
    for name, k in knobs(config).items():
        with pytest.raises(SettingError) as caught:
            config.from_knobs(**{name: bad_value(k)})
        assert caught.value.field == name and (k.name or name) in str(caught.value)


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_a_bool_knob_takes_only_true_or_false(value):
    with pytest.raises(SettingError, match="align must be True or False") as caught:
        CSDConfig(align=value)
    assert caught.value.field == "align"
    assert CSDConfig(align=False).align is False and CSDConfig(counterfactual=True).counterfactual is True


def controls_of(*fields: str) -> dict:
    return {control_name(f): knob_control(f, 64) for f in fields}


@pytest.mark.parametrize(
    ("make", "control"),
    [
        (lambda: CSDConfig.from_knobs(max_tries=0), "max_tries"),
        (lambda: CSDConfig(prefill=1.0), "prefill"),
        (lambda: SamplingConfig(num_steps=0), "ar_steps"),
        (
            lambda: check_settings(FamilyTraits("xAR", num_classes=10, fixed_num_steps=16), 16, SamplingConfig(32)),
            "ar_steps",
        ),
        (  # no control sets acceptance_unit
            lambda: check_settings(
                FamilyTraits("MAR", num_classes=10),
                64,
                SamplingConfig(),
                CSDConfig.from_knobs(acceptance_unit="token", criterion="exact"),
            ),
            None,
        ),
    ],
)
def test_the_app_shows_a_library_error_on_the_control_of_its_field(make, control):
    with pytest.raises(gr.Error) as caught:
        with library_errors(controls=controls_of("num_steps", "prefill", "max_tries", "criterion")):
            make()
    assert caught.value.control == control


def test_the_app_offers_exactly_the_knobs_that_declare_a_control_in_page_order():
    assert sorted(PAGE_FIELDS) == sorted(offered_knobs())
    assert [control_name(f) for f in PAGE_FIELDS][:2] == ["ar_steps", "gamma"]  # the API's keywords


# Every knob the app offers, as it offers it: label, range, step, hint, advanced, the API's keyword.
OFFERED = {
    "num_steps": ("AR steps", 1, None, 1, "", False, "ar_steps"),
    "gamma": ("Draft length gamma", 1, 32, 1, "AR steps per target pass", False, ""),
    "prefill": ("Pre-fill ratio", 0.0, 0.5, 0.01, "fraction of tokens the target makes before drafting", False, ""),
    "cfg_scale": ("CFG scale", 1.0, 10.0, 0.1, "", False, ""),
    "cfg_schedule": ("CFG schedule", None, None, None, "", False, ""),
    "temperature": ("Temperature", 0.1, 2.0, 0.05, "", False, ""),
    "align": ("Trajectory alignment (shared noise)", None, None, None, "", False, ""),
    "criterion": (
        "Acceptance criterion",
        None,
        None,
        None,
        "aligned: the paper's approximation; exact: path-space reference; published: what the published code "
        "computes (products of densities in float32, a token never accepted left at zero)",
        False,
        "",
    ),
    "tau_v": ("Verification widening tau_v", 1.0, 100.0, 0.5, "", True, ""),
    "trajectory_term": (
        "Trajectory term",
        None,
        None,
        None,
        "derived sign, published sign, or none (final-step term only)",
        True,
        "",
    ),
    "resample_widening": (
        "Resample widening",
        1.0,
        100.0,
        0.5,
        "equal to tau_v makes test and resampling self-consistent",
        True,
        "",
    ),
    "max_tries": ("Resampler cap", 1, 1000, 1, "", True, ""),
    "block": (
        "Block",
        None,
        None,
        None,
        "published: every drafted step verified from the context before the block, the whole block kept; "
        "context: each step given the drafted steps before it; exact: so, and the block kept through its first "
        "step with a rejection (gamma 1's quality; the Method tab measures all three)",
        True,
        "",
    ),
}


def test_every_app_control_names_a_knob_and_every_offered_knob_keeps_its_control():
    """The app declares its controls by field name (demo.knobs): each names a knob of the configs, and the
    page offers each of these knobs, in this order, exactly so (an int step stays an int: integers only)."""
    assert unknown_fields(KNOB_CONTROLS) == []
    assert unknown_fields({"num_steps": AppControl("AR steps"), "nonesuch": AppControl("?")}) == ["nonesuch"]
    every = {f: k for c in CONFIGS for f, k in knobs(c).items()}
    assert all(field in every for field in KNOB_CONTROLS)
    assert list(KNOB_CONTROLS) == list(PAGE_FIELDS) == list(OFFERED)
    for field, c in KNOB_CONTROLS.items():
        assert (c.label, c.lo, c.hi, c.step, c.info, c.advanced, c.name) == OFFERED[field], field
        assert type(c.step) is type(OFFERED[field][3]), field
        assert control_name(field) == (c.name or field)


def test_each_control_is_made_from_its_knob_and_its_app_declaration():
    made = {f: knob_control(f, 64) for f in PAGE_FIELDS}
    assert made["num_steps"].kind is gr.Slider and made["num_steps"].options == {"minimum": 1, "maximum": 64} | {
        "step": 1,
        "precision": 0,
    }
    assert made["prefill"].options["step"] == 0.01 and made["prefill"].field == "csd.prefill"
    assert made["align"].kind is gr.Checkbox
    assert made["criterion"].options["choices"] == list(knobs(CSDConfig)["criterion"].choices)
    advanced = ["tau_v", "trajectory_term", "resample_widening", "max_tries", "block"]
    assert [f for f, c in made.items() if c.advanced] == advanced


def test_the_library_declares_no_app_control():
    """The knobs say what a setting is; how the app shows it is the app's (demo.knobs)."""
    root = Path(__file__).resolve().parents[1] / "csd"
    assert "control" not in {f.name for f in dataclasses.fields(Knob)}
    assert not [str(p) for p in sorted(root.rglob("*.py")) if "AppControl" in p.read_text()]


def test_the_presets_are_one_table_of_named_settings_and_the_defaults_repeat_no_dataclass_default():
    assert defaults.CSD == CSDConfig()
    changed = {f.name for f in dataclasses.fields(SamplingConfig) if getattr(defaults.SAMPLING, f.name) != f.default}
    assert changed == {"num_steps", "cfg_scale"}  # where the embedded pair differs, nothing else
    assert defaults.PRESETS["default"] == (defaults.SAMPLING, defaults.CSD)
    for name, (sampling, csd) in defaults.PRESETS.items():
        assert isinstance(sampling, SamplingConfig) and isinstance(csd, CSDConfig)
        assert defaults.preset(name) == (sampling, csd)
    with pytest.raises(ValueError, match="preset must be one of"):
        defaults.preset("slow")


def test_the_apps_presets_set_the_controls_of_the_knobs_each_changes():
    assert [name for name in defaults.PRESETS if preset_controls(name)] == ["fast", "faithful", "show rejections"]
    assert preset_controls("faithful") == {"gamma": 2, "prefill": 0.1}
    assert preset_controls("show rejections") == {"align": False, "tau_v": 1.0}


def test_start_up_sets_the_threads_and_resolves_the_device(restore_threads, capsys):
    parser = argparse.ArgumentParser()
    add_machine_flags(parser)
    device = start_up(parser.parse_args(["--threads", "1", "--device", "cpu"]), parser)
    assert device == torch.device("cpu") and torch.get_num_threads() == 1
    assert start_up(parser.parse_args([]), parser).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(SystemExit):
        start_up(parser.parse_args(["--threads", "0"]), parser)
    assert "--threads must be an int in [1, 1024], got 0" in capsys.readouterr().err


# A result's settings as they were saved before the settings were typed: asdict of the flat configs.
OLD_SAMPLING = {
    "num_steps": 16,
    "cfg_scale": 3.0,
    "cfg_schedule": "linear",
    "temperature": 1.0,
    "head_steps": 12,
    "head_steps_min": 4,
    "precision": "float32",
    "head_schedule": "disa",
    "cond_cache_start": 2,
    "cond_cache_every": 4,
    "token_cache_keep": None,
    "token_cache_start": 5,
    "token_cache_every": 9,
    "head_sampler": "ddim",
    "ddim_eta": 0.5,
    "flow_grid": "official",
    "gtr_stages": [12, 4],
    "gtr_head_steps": 3,
    "gtr_detail_fraction": 0.0,
    "gtr_detail_steps": None,
}
OLD_CSD = {
    "gamma": 4,
    "gamma_schedule": [2, 2],
    "prefill": 0.05,
    "align": True,
    "criterion": "published",
    "trajectory_term": "derived",
    "tau_v": 5.0,
    "resample_widening": 1.0,
    "max_tries": 7,
    "product_precision": "float64",
    "published_scale": "variance",
    "fallback": None,
    "counterfactual": False,
    "draft_head_steps": None,
    "acceptance_unit": "row",
    "draft_head_sampler": None,
    "draft_ddim_eta": 0.0,
    "block": "published",
}


def test_an_old_format_settings_dict_loads_as_typed_settings_and_reads_back_the_same():
    sampling, csd = SamplingConfig.from_knobs(**OLD_SAMPLING), CSDConfig.from_knobs(**OLD_CSD)
    assert (sampling.head_anneal.last, sampling.head_anneal.schedule) == (4, "disa")
    assert (sampling.cond_cache.start, sampling.cond_cache.every, sampling.token_cache) == (2, 4, None)
    assert (sampling.sampler.kind, sampling.sampler.ddim_eta, sampling.gtr.stages, sampling.gtr.head_steps) == (
        "ddim",
        0.5,
        (12, 4),
        3,
    )
    assert csd.criterion == Published(tau_v=5.0, max_tries=7, product_precision="float64", published_scale="variance")
    assert csd.cap_fallback == "zero" and csd.draft_sampler is None and csd.gamma_schedule == (2, 2)
    as_saved = lambda d: {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    assert sampling.knob_values() == as_saved(OLD_SAMPLING)
    assert csd.knob_values() == as_saved(OLD_CSD) | {"resampler": "auto", "views": "one_pass"}  # knobs made since


def test_a_frontier_saved_before_the_settings_were_typed_loads_its_points_as_they_ran():
    result = json.loads((ROOT / "bench" / "results" / "lazymar" / "frontier_subset_b1.json").read_text())
    points = points_of(result)
    assert [p.name for p in points] == [r["name"] for r in result["rows"]]
    for point, row in zip(points, result["rows"], strict=True):
        assert point.sampling.knob_values().items() >= {k: _saved(v) for k, v in row["sampling"].items()}.items()
    assert any(p.sampling.cond_cache is not None for p in points) and any(p.sampling.token_cache for p in points)


def _saved(value):
    return tuple(value) if isinstance(value, list) else value


def test_every_committed_results_settings_load_and_read_back_the_knobs_they_hold():
    loaded = 0
    for path in sorted((ROOT / "bench" / "results").rglob("*.json")):
        for found in _settings_in(json.loads(path.read_text())):
            for cls, key in ((SamplingConfig, "sampling"), (CSDConfig, "csd")):
                if found.get(key):
                    back = cls.from_knobs(**found[key]).knob_values()
                    assert {k: back[k] for k in found[key]} == {k: _saved(v) for k, v in found[key].items()}, path
                    loaded += 1
    assert loaded > 100


def _settings_in(record):
    """Every dict of a result that holds a sampler setting (under "sampling", with "csd" beside it or not)."""
    if isinstance(record, dict):
        if isinstance(record.get("sampling"), dict) and "num_steps" in record["sampling"]:
            yield record
        for value in record.values():
            yield from _settings_in(value)
    elif isinstance(record, list):
        for value in record:
            yield from _settings_in(value)


def test_the_two_configs_hold_at_most_20_fields_the_rest_in_tagged_setting_values():
    assert len(dataclasses.fields(SamplingConfig)) + len(dataclasses.fields(CSDConfig)) <= 20
    assert {type(CSDConfig.from_knobs(criterion=k).criterion).kind for k in ("aligned", "exact", "published")} == {
        "aligned",
        "exact",
        "published",
    }
    with pytest.raises(SettingError, match="gtr_detail_steps must exceed gtr_head_steps") as caught:
        GtR(stages=(8, 8), head_steps=4, detail_fraction=0.25, detail_steps=3)
    assert caught.value.field == "gtr_detail_steps"
    with pytest.raises(SettingError, match="criterion must be Aligned or Exact or Published") as caught:
        CSDConfig(criterion="exact")
    assert caught.value.field == "criterion"
    with pytest.raises(SettingError, match="CSDConfig has no knob 'tau'") as caught:
        CSDConfig.from_knobs(tau=5.0)
    assert caught.value.field == "tau"
