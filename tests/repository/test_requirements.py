"""The locks agree with the ranges, and the tests run on what the lock pins.

requirements.txt (what a Hugging Face Space installs) and requirements-dev.txt hold ranges;
requirements.lock and requirements-dev.lock pin every package (``bash .ci/lock`` regenerates both).
A range changed without regenerating the locks, or a lock edited by hand, fails here."""

import os
import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def ranges(path: Path) -> dict[str, Requirement]:
    """Requirements of a pip requirements file, following ``-r`` includes."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out |= ranges(path.parent / line[3:].strip())
        else:
            req = Requirement(line)
            out[canonicalize_name(req.name)] = req
    return out


def pins(path: Path) -> dict[str, Version]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if m:
            out[canonicalize_name(m[1])] = Version(m[2])
    return out


LOCKS = [("requirements.txt", "requirements.lock"), ("requirements-dev.txt", "requirements-dev.lock")]


@pytest.mark.parametrize(("spec", "lock"), LOCKS)
def test_every_range_is_pinned_in_its_lock_within_the_range(spec, lock):
    wanted, pinned = ranges(ROOT / spec), pins(ROOT / lock)
    for name, req in wanted.items():
        assert name in pinned, f"{name} ({spec}) is not in {lock}: run bash .ci/lock"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock} pins {name}=={pinned[name]}, outside {spec}'s {req.specifier}: run bash .ci/lock"
        )


@pytest.mark.parametrize(("spec", "lock"), LOCKS)
def test_locks_name_their_command_and_pin_every_line(spec, lock):
    text = (ROOT / lock).read_text()
    assert "#    bash .ci/lock" in text.splitlines()[:6]
    packages = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert packages and all("==" in line for line in packages), [p for p in packages if "==" not in p]


def test_the_dev_lock_holds_the_runtime_lock_unchanged():
    runtime, dev = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-dev.lock")
    assert {name: dev.get(name) for name in runtime} == runtime


def test_torch_is_the_pinned_cpu_release_and_nothing_pulls_torchvision():
    for _, lock in LOCKS:
        locked = pins(ROOT / lock)
        assert locked["torch"].public == "2.13.0"
        assert not {"torchvision", "timm"} & set(locked)
        assert not any(name.startswith("nvidia-") for name in locked)  # a CUDA build of torch would add these


@pytest.mark.skipif(os.environ.get("CSD_NEWEST") == "1", reason=".ci/newest runs on the newest versions by design")
def test_the_installed_packages_are_the_locked_ones():
    """What the tests run on is what the lock pins (``.ci/run`` installs requirements-dev.lock)."""
    wrong = {}
    for name, version in pins(ROOT / "requirements-dev.lock").items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (str(version), None if installed is None else str(installed))
    assert not wrong, f"installed versions differ from requirements-dev.lock (locked, installed): {wrong}"
