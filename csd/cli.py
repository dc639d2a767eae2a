"""Every tool's command line, derived from the configs' knob declarations (:class:`csd.config.Knob`): one
flag per knob (knobs that share a flag are set together: ``--cond-cache START EVERY``), the config a parsed
command line asks for over a base setting, a setting written as ``key=value`` pairs (``bench --compare``),
and the start-up every tool shares: torch's CPU threads and the device."""

from __future__ import annotations

import argparse

import torch

from csd.config import Knob, knobs
from csd.core.checks import check_int

WORDS = {"int": "an integer", "number": "a number", "ints": "integers separated by ':'", "bool": "true or false"}


def flag_groups(config) -> dict[str, list[str]]:
    """Each flag of a config class and the knobs it sets, in order."""
    groups: dict[str, list[str]] = {}
    for name, k in knobs(config).items():
        groups.setdefault(k.flag or name.replace("_", "-"), []).append(name)
    return groups


def parse_value(k: Knob, text: str, where: str):
    """A knob's value from its text on a command line (not yet checked against its range): "none" for an
    optional knob; ints of a sequence separated by ":" ("2:2:4"); a bool as true / false. A value of the wrong
    kind is a ValueError naming ``where``."""
    text = text.strip()
    try:
        if k.optional and text.lower() == "none":
            return None
        if k.kind == "int":
            return int(text)
        if k.kind == "number":
            return float(text)
        if k.kind == "ints":
            return tuple(int(v) for v in text.split(":") if v)
        if k.kind == "bool":
            return {"true": True, "false": False}[text.lower()]
    except (ValueError, KeyError):
        raise ValueError(f"{where} must be {WORDS[k.kind]}, got {text!r}") from None
    return text


def _typed(k: Knob, flag: str):
    """An argparse ``type`` for a one-knob flag (argparse names it in its error: "invalid int value")."""

    def parse(text: str):
        try:
            return parse_value(k, text, flag)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = k.kind
    return parse


def _shown(value) -> str:
    """A default as a flag's help shows it (a sequence as its items, an empty one as none)."""
    if isinstance(value, tuple):
        return " ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def add_config_flags(parser: argparse.ArgumentParser, config, base) -> None:
    """One flag per knob of a config class (its help, its valid values); a flag not given keeps ``base``'s
    value, which its help shows."""
    group = parser.add_argument_group(f"{config.__name__} settings")
    every, values = knobs(config), base.knob_values()
    for flag, names in flag_groups(config).items():
        ks = [every[n] for n in names]
        default = ", ".join(_shown(values[n]) for n in names)
        common = {
            "dest": flag.replace("-", "_"),
            "default": argparse.SUPPRESS,
            "help": f"{ks[0].help} (default {default})",
        }
        k = ks[0]
        if len(names) > 1:
            group.add_argument(f"--{flag}", nargs=len(names), metavar=tuple(k.metavar for k in ks), **common)
        elif k.kind == "bool":
            group.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, **common)
        elif k.kind == "ints":
            group.add_argument(f"--{flag}", type=int, nargs="*", metavar=k.metavar or "N", **common)
        elif k.kind == "choice":
            group.add_argument(f"--{flag}", choices=k.choices, **common)
        else:
            group.add_argument(f"--{flag}", type=_typed(k, f"--{flag}"), metavar=k.metavar or None, **common)


def config_from_args(args: argparse.Namespace, config, base):
    """``base`` with the knobs a parsed command line sets (:func:`add_config_flags`); the config checks them."""
    given, every, changes = vars(args), knobs(config), {}
    for flag, names in flag_groups(config).items():
        value = given.get(flag.replace("-", "_"))
        if value is None:
            continue
        if len(names) == 1:
            changes[names[0]] = tuple(value) if every[names[0]].kind == "ints" else value
            continue
        for name, text in zip(names, value, strict=True):
            changes[name] = parse_value(every[name], str(text), f"--{flag} {every[name].metavar}")
    return base.with_knobs(**changes)


def parse_setting(spec: str, base, what: str = "setting"):
    """``base`` with the changes ``key=value,key=value`` names ("gamma=4,tau_v=5,gamma_schedule=2:2:4");
    an unknown key or a value of the wrong kind is a ValueError naming it and the valid keys."""
    every, changes = knobs(base), {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in every or not value:
            raise ValueError(f"{what} {item!r}: expected key=value with a key in {sorted(every)}")
        changes[key] = parse_value(every[key], value, f"{what} {item!r}")
    return base.with_knobs(**changes)


def value_text(value) -> str:
    """A knob's value as :func:`parse_value` reads it back: ints of a sequence joined by ":", None as "none",
    a bool as true / false, a float in its shortest exact form."""
    if isinstance(value, tuple):
        return ":".join(map(str, value))
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def changes(config, base) -> list[str]:
    """The knobs of ``config`` that differ from ``base``'s, as ``key=value`` in field order (what
    :func:`parse_setting` takes)."""
    values, base_values = config.knob_values(), base.knob_values()
    return [f"{name}={value_text(value)}" for name, value in values.items() if value != base_values[name]]


# --- start-up: threads and device ---------------------------------------------------------------------


def add_machine_flags(
    parser: argparse.ArgumentParser, threads: int | None = None, device: bool = True, where: str = ""
) -> None:
    """--threads (torch's CPU threads; default ``threads``, None: torch's own; ``where``: what else sets it)
    and, unless ``device`` is False, --device."""
    default = "torch's" if threads is None else threads
    parser.add_argument("--threads", type=int, default=threads, help=f"torch CPU threads (default {default}{where})")
    if device:
        parser.add_argument("--device", default="auto", help="auto (CUDA where there is one), cpu or cuda[:N]")


def check_threads(threads: int | None) -> None:
    if threads is not None:
        check_int("--threads", threads, 1, 1024)


def resolve_device(name: str) -> torch.device:
    """--device: "auto" is CUDA where there is one, else the CPU; asking for CUDA without it is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available here (use --device cpu or auto)")
    return device


def start_up(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> torch.device | None:
    """What every tool does first: torch's CPU threads from --threads and the device from --device (None
    for a tool without it). A bad value stops with the parser's error naming the flag (without a parser:
    a ValueError)."""
    try:
        check_threads(args.threads)
        device = resolve_device(args.device) if hasattr(args, "device") else None
    except ValueError as err:
        if parser is None:
            raise
        parser.error(str(err))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return device
