"""The device's wheels (scripts/device_wheels.py): the plan is the app's runtime closure in the lock, without
what the lent machine's image holds, at the lock's versions; the split, the requirement check and the ignore
rule that keeps the wheels out of commits. No network: the plan is pure, the wheel is made here."""

from __future__ import annotations

import fnmatch
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from scripts.device_wheels import (
    CARRY_ANYWAY,
    check_requires,
    device_packages,
    device_versions,
    normalise,
    parse_lock,
    plan,
    split,
    wheel_requires,
)

ROOT = Path(__file__).resolve().parents[2]
LOCK = (ROOT / "requirements.lock").read_text()


def test_the_plan_carries_the_app_and_leaves_what_the_device_has():
    names = dict(plan(LOCK, device_packages()))
    for name in ("gradio", "gradio-client", "spaces", "fastapi", "starlette", "uvicorn", "plotly", "pydantic"):
        assert name in names, name
    for name in ("torch", "numpy", "pillow", "matplotlib", "huggingface-hub", "safetensors", "tokenizers"):
        assert name not in names, name
    # the requirements of huggingface-hub 2.x (the lock's) are not followed: the device keeps its own hub
    assert not {"httpx2", "httpcore2", "truststore"} & names.keys()


def test_transformers_travels_at_the_lock_s_pin_not_the_device_s():
    pinned = parse_lock(LOCK)["transformers"][0]
    assert dict(plan(LOCK, device_packages()))["transformers"] == pinned == "5.24.0"
    assert "transformers" in device_packages() and "transformers" in CARRY_ANYWAY
    assert device_versions()["transformers"] < Version(pinned)


def test_every_planned_version_is_the_lock_s_and_each_name_once():
    lock, planned = parse_lock(LOCK), plan(LOCK, device_packages())
    assert [n for n, _ in planned] == sorted({n for n, _ in planned})
    for name, version in planned:
        assert lock[name][0] == version, name
        assert name not in device_packages() or name in CARRY_ANYWAY, name


def test_the_lock_s_via_graph_is_read_whole():
    lock = parse_lock(LOCK)
    assert lock["gradio"][1] == {"-r requirements.txt", "spaces"}
    assert lock["typing-extensions"][1] >= {"pydantic", "starlette", "torch", "typing-inspection"}
    assert lock["pytz"] == ("2026.6", frozenset({"gradio"}))
    assert "setuptools" not in lock  # listed under 'unsafe', unpinned


SYNTHETIC = """\
#    bash .ci/lock
app-ui==2.0
    # via -r requirements.txt
Hub_Client==1.5
    # via
    #   app-ui
    #   model.lib
hub-extra==0.1
    # via hub-client
model.lib==3.0
    # via -r requirements.txt
small_dep==1.1
    # via app-ui
tool==9.0
    # via other-thing

# The following packages are considered to be unsafe in a requirements file:
# setuptools
"""


def test_names_are_normalised_and_a_package_the_device_has_is_left_with_its_requirements():
    assert normalise("Hub_Client") == normalise("hub.client") == "hub-client"
    assert plan(SYNTHETIC, frozenset(), (), ()) == [
        ("app-ui", "2.0"),
        ("hub-client", "1.5"),
        ("hub-extra", "0.1"),
        ("model-lib", "3.0"),
        ("small-dep", "1.1"),
    ]
    # the device's list spells it huggingface_hub-style: still the same package, left out with what it needs
    assert plan(SYNTHETIC, frozenset({"hub_client", "Model_Lib"}), (), ()) == [("app-ui", "2.0"), ("small-dep", "1.1")]
    # carried anyway: it travels, and what it needs is followed
    assert plan(SYNTHETIC, frozenset({"hub-client", "model-lib"}), ("Hub.Client",), ()) == [
        ("app-ui", "2.0"),
        ("hub-client", "1.5"),
        ("hub-extra", "0.1"),
        ("small-dep", "1.1"),
    ]
    assert ("tool", "9.0") in plan(SYNTHETIC, frozenset(), (), ("TOOL",))


def test_a_root_missing_from_the_lock_is_an_error():
    with pytest.raises(ValueError, match="not pinned in the lock: not-there"):
        plan(SYNTHETIC, frozenset(), (), ("Not_There",))


def test_the_split_puts_each_wheel_once_largest_first_to_the_lightest_part():
    sizes = {"a": 30, "b": 14, "c": 10, "d": 2, "e": 1}
    assert split(sizes, 1) == [["a", "b", "c", "d", "e"]]
    assert split(sizes, 2) == [["a"], ["b", "c", "d", "e"]]
    assert split(sizes, 3) == [["a"], ["b"], ["c", "d", "e"]]


def _wheel(path: Path, requires: list[str]) -> Path:
    meta = "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("pkg/__init__.py", "")
        whl.writestr("pkg-1.0.dist-info/METADATA", meta)
    return path


def test_a_wheel_s_requirements_are_those_that_apply_on_the_device(tmp_path):
    path = _wheel(
        tmp_path / "pkg-1.0-py3-none-any.whl",
        [
            "a>=1",
            "b; python_version >= '3.13'",
            "c; extra == 'dev'",
            "d<2; sys_platform == 'linux'",
            "e; os_name=='nt'",
        ],
    )
    assert [str(r) for r in wheel_requires(path)] == ["a>=1", 'd<2; sys_platform == "linux"']


def test_requirements_are_checked_against_the_carried_and_the_device_s_versions():
    requires = {"app": [Requirement(r) for r in ("lib>=2", "os-pkg", "gone", "cli>=1")]}
    carried, device = {"app": "1.0", "lib": "1.9"}, frozenset({"hub-client", "os-pkg", "cli"})
    problems, unchecked = check_requires(requires, carried, device, {"hub-client": Version("1.5")})
    assert problems == ["app needs lib>=2: lib 1.9 carried", "app needs gone: neither carried nor on the device"]
    assert unchecked == ["cli >=1", "os-pkg"]  # on the device, version unknown
    requires = {"app": [Requirement("hub_client<1.4")]}
    assert check_requires(requires, carried, device, {"hub-client": Version("1.5")})[0] == [
        "app needs hub_client<1.4: hub-client 1.5 on the device"
    ]


def test_the_wheel_folders_are_ignored_by_git():
    patterns = [line.strip("/") for line in (ROOT / ".gitignore").read_text().splitlines() if line.strip()]
    for folder in (".whl", ".whl1", ".whl2"):
        assert any(fnmatch.fnmatch(folder, p) for p in patterns), folder
