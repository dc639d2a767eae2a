"""The wheels a lent GPU machine needs to serve the app: what ``requirements.lock`` pins and the device lacks.

    python -m scripts.device_wheels [--out .whl] [--dry-run]     # the plan, downloaded into --out
    python -m scripts.device_wheels --part 1/2 --out .whl1         # one of N parts, where the whole does not fit

The device has no package registry. The plan is the closure of the app's runtime requirements (the lock's
``-r requirements.txt`` entries and the packages the app and ``scripts/gpu_check.py`` import without declaring
them, ``EXTRA_ROOTS``) over the lock's ``# via`` graph, keeping the packages the device lacks
(``DEVICE_PACKAGES``) and the ones it has at a version the app cannot use (``CARRY_ANYWAY``); a package the
device has is not followed further (its own requirements are the device's). Each is downloaded at the lock's
version with the device tool's flags (CPython 3.12, manylinux x86-64; more manylinux tags where pip finds
none), into a cache outside the repository, then copied into ``--out`` (its other wheels removed).
The wheels' own requirements are checked against what is carried and the device's known versions.

The device tool sends at most 64 MiB a call beside the tracked files (``TRACKED_NOTE``; ``--strict`` counts them
as the tool's notes do): the untracked files git does not ignore and the carried paths. The script prints each
wheel's size, the total and what is left, and fails where they do not fit; ``--part K/N`` then splits the plan
(largest first, each to the lightest part) into folders carried one per call on the same warm machine, each
installing into ``/tmp/site`` (docs/space.md, "The device check").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 << 20  # the device tool's limit on what travels in one call (tree and carried paths)

# /work/.library/device/KINDS.md, "Python packages already there": the image 'cuda' of nvidia-h100-x1 and
# nvidia-h200, as read on a machine running it on 2026-11-17.
DEVICE_PACKAGES_SOURCE = "the device tool's KINDS.md, 'Python packages already there' (image 'cuda', 2026-11-17)"
DEVICE_PACKAGES_TEXT = """
absl-py, accelerate, aiofiles, aiohappyeyeballs, aiohttp, aiosignal, annotated-doc, anyio, attrs, botorch, build,
certifi, charset-normalizer, chex, click, cloudpickle, cmake, colorama, contourpy, coverage, cuda-bindings,
cuda-core, cuda-pathfinder, cuda-toolkit, cupy-cuda13x, cycler, cython, diffrax, e3nn, einops, equinox, etils,
execnet, filelock, flatbuffers, flax, fonttools, formulaic, frozenlist, fsspec, gpytorch, grpcio, h11, h5py,
hf-xet, httpcore, httpx, huggingface-hub, humanize, hypothesis, idna, imageio, iniconfig, interface-meta, jax,
jax-cuda13-pjrt, jax-cuda13-plugin, jaxlib, jaxtyping, jinja2, joblib, kiwisolver, lazy-loader, lightning,
lightning-utilities, linear-operator, lineax, llvmlite, lxml, markdown, markdown-it-py, markupsafe, matplotlib,
mdurl, meson, ml-dtypes, mpi4py, mpmath, msgpack, multidict, multipledispatch, mypy-extensions, nanobind,
narwhals, networkx, ninja, numba, numba-cuda, numpy, numpyro, nvidia-cublas, nvidia-cuda-cupti,
nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cudnn-cu13, nvidia-cufft, nvidia-cufile, nvidia-curand,
nvidia-cusolver, nvidia-cusparse, nvidia-cusparselt-cu13, nvidia-ml-py, nvidia-nccl-cu13, nvidia-nvjitlink,
nvidia-nvshmem-cu13, nvidia-nvtx, onnx, onnx-ir, onnxruntime, onnxscript, opencv-python-headless, optax,
opt-einsum, opt-einsum-fx, optimistix, orbax-checkpoint, packaging, pandas, pathspec, patsy, peft, pillow, pip,
pluggy, portalocker, prometheus-client, propcache, protobuf, psutil, pyarrow, pybind11, py-cpuinfo, pygments,
pyparsing, pyproject-hooks, pyre-extensions, pytest, pytest-benchmark, pytest-cov, pytest-mock, pytest-timeout,
pytest-xdist, python-dateutil, pytorch-lightning, pyyaml, regex, requests, rich, sacrebleu, safetensors,
scikit-build-core, scikit-image, scikit-learn, scipy, seaborn, sentencepiece, sentence-transformers, setuptools,
shellingham, simplejson, six, sortedcontainers, statsmodels, sympy, tabulate, tensorboard,
tensorboard-data-server, tensorstore, threadpoolctl, tifffile, tiktoken, timm, tokenizers, toolz, torch,
torchaudio, torchdiffeq, torch-geometric, torchmetrics, torchvision, tqdm, transformers, treescope, triton,
typer, typing-extensions, typing-inspect, urllib3, uvloop, wadler-lindig, werkzeug, wheel, wrapt, xarray,
xxhash, yarl, zipp
"""

# The versions KINDS.md's "pip list" row gives (one session's pip list there, 2026-11; Python 3.12.3).
DEVICE_VERSIONS_TEXT = """
accelerate 1.15.0, huggingface_hub 1.33.0, jax 0.11.2, numpy 2.5.2, onnx 1.23.1, safetensors 0.8.0,
sentencepiece 0.2.2, tiktoken 0.14.0, tokenizers 0.23.2, torch 2.11.0, torchvision 0.26.0, transformers 5.17.0,
triton 3.6.0
"""

# Packages the device has that travel anyway, at the lock's version, and why.
CARRY_ANYWAY = {
    "transformers": "the device's 5.17.0 names a model output's cache past_key_values; Harmon's prompt cache "
    "reads .cache and passes cache= (csd/models/harmon/network.py), as the lock's 5.24.0 names it",
    "typing-extensions": "pydantic and pydantic-core need >=4.16.0 and the device's version is not recorded; "
    "the lock's 4.16.0 is 45 kB and keeps the older API",
}

# Imported by the app or scripts/gpu_check.py without being in requirements.txt (each in gradio's closure).
EXTRA_ROOTS = ("gradio-client", "starlette", "huggingface-hub", "httpx")

# Left out on purpose (requirements-dev.lock pins it, requirements.lock does not; named here for the reader).
LEFT_OUT = {
    "playwright": "optional: without it (or without /usr/bin/chromium, which the device image is not recorded "
    "to have) the screenshot step saves the images /generate returned",
}

# What the limit counts beside the carried paths. The device README counts the tracked files; calls that carried
# 36 MB of float16 weights beside 205 MiB of tracked files ran (2026-12-04: assets/models/TRAINING.md, "On a
# GPU"; bench/results/gpu/), so the default counts the untracked files alone.
TRACKED_NOTE = "the tracked files are left out: device calls carried 36 MB beside 205 MiB of them (2026-12-04)"

PY = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
PLATFORMS += ("manylinux1_x86_64",)
MORE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (24, 31, 34, 35, *range(5, 40)) if n not in (17, 27, 28))
DEVICE_ENV = {  # environment markers on the device (Python 3.12.3, x86-64 Linux)
    "python_version": PY,
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def normalise(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(text: str = DEVICE_PACKAGES_TEXT) -> frozenset[str]:
    return frozenset(normalise(n) for n in re.split(r"[,\s]+", text) if n)


def device_versions(text: str = DEVICE_VERSIONS_TEXT) -> dict[str, Version]:
    pairs = (item.split() for item in text.split(",") if item.strip())
    return {normalise(name): Version(version) for name, version in pairs}


def parse_lock(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """``name -> (version, via)`` of a pip-compile lock: each pinned line and the ``# via`` names under it
    (``-r FILE`` kept as written)."""
    out: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in text.splitlines():
        pin = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if pin:
            current = normalise(pin[1])
            out[current] = (pin[2], set())
            continue
        comment = re.match(r"^\s+#\s+(?:via\s+)?(\S.*?)\s*$", line)
        if current and comment and comment[1] != "via":  # "# via" alone opens a list, one name a line
            via = comment[1]
            out[current][1].add(via if via.startswith("-r ") else normalise(via))
        elif not line.startswith(" "):
            current = None
    return {name: (version, frozenset(via)) for name, (version, via) in out.items()}


def plan(
    lock_text: str,
    device: frozenset[str],
    carry_anyway=tuple(CARRY_ANYWAY),
    extra_roots=EXTRA_ROOTS,
) -> list[tuple[str, str]]:
    """``(name, version)`` of every package to carry, sorted by name: the closure of the lock's
    ``-r requirements.txt`` entries and ``extra_roots`` over its ``# via`` graph, without what ``device`` holds
    (names normalised) unless ``carry_anyway`` names it. The requirements of a package left to the device are not
    followed; those of a carried one are."""
    lock = parse_lock(lock_text)
    device = frozenset(normalise(n) for n in device)
    carry_anyway = frozenset(normalise(n) for n in carry_anyway)
    needs: dict[str, set[str]] = {name: set() for name in lock}
    for name, (_, via) in lock.items():
        for parent in via:
            needs.setdefault(parent, set()).add(name)
    roots = needs.get("-r requirements.txt", set()) | {normalise(n) for n in extra_roots}
    missing = sorted(roots - lock.keys())
    if missing:
        raise ValueError(f"not pinned in the lock: {', '.join(missing)}")

    def carried(name: str) -> bool:
        return name not in device or name in carry_anyway

    seen, todo = set(), sorted(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if carried(name):
            todo += sorted(needs[name] - seen)
    return sorted((name, lock[name][0]) for name in seen if carried(name))


def split(sizes: dict[str, int], parts: int) -> list[list[str]]:
    """``parts`` groups of names, largest first, each to the lightest group so far (ties: the first)."""
    groups: list[list[str]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        i = totals.index(min(totals))
        groups[i].append(name)
        totals[i] += sizes[name]
    return [sorted(g) for g in groups]


def wheel_requires(path: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` that apply on the device (markers evaluated there, extras left out)."""
    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        headers = Parser().parsestr(whl.read(meta).decode())
    reqs = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(DEVICE_ENV)]


def check_requires(
    requires: dict[str, list[Requirement]],
    carried: dict[str, str],
    device: frozenset[str],
    known: dict[str, Version],
) -> tuple[list[str], list[str]]:
    """Each carried package's requirements against the carried versions and the device's known ones:
    ``(problems, unchecked)``; a requirement met by a device package of unknown version is unchecked."""
    problems, unchecked = [], set()
    for name, reqs in sorted(requires.items()):
        for req in reqs:
            dep = normalise(req.name)
            if dep in carried:
                have, where = Version(carried[dep]), "carried"
            elif dep in known:
                have, where = known[dep], "on the device"
            elif dep in device:
                unchecked.add(f"{dep} {req.specifier}".strip())
                continue
            else:
                problems.append(f"{name} needs {req}: neither carried nor on the device")
                continue
            if not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} needs {req}: {dep} {have} {where}")
    return problems, sorted(unchecked)


def tree_bytes(root: Path = ROOT) -> tuple[int, int]:
    """Bytes of what travels without ``carry``: ``(tracked, untracked)``, the untracked files those git does
    not ignore."""

    def listed(*flags: str) -> int:
        out = subprocess.run(["git", "ls-files", "-z", *flags], cwd=root, capture_output=True, check=True).stdout
        files = {root / os.fsdecode(f) for f in out.split(b"\0") if f}
        return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())

    return listed("--cached"), listed("--others", "--exclude-standard")


def _wheel_in(folder: Path, name: str, version: str) -> Path | None:
    for path in folder.glob("*.whl"):
        wname, wversion = path.name.split("-")[:2]
        if normalise(wname) == name and Version(wversion) == Version(version):
            return path
    return None


def download(name: str, version: str, cache: Path) -> Path:
    """The wheel of ``name==version`` for the device, from ``cache`` or pip."""
    found = _wheel_in(cache, name, version)
    if found:
        return found
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", PY]
    base += ["--implementation", "cp", "-d", str(cache), f"{name}=={version}"]
    errors = []
    for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
        run = subprocess.run(base + [a for p in platforms for a in ("--platform", p)], capture_output=True, text=True)
        found = _wheel_in(cache, name, version)
        if run.returncode == 0 and found:
            return found
        errors.append(run.stderr.strip().splitlines()[-1:] or ["(no output)"])
    raise RuntimeError(f"no wheel of {name}=={version} for the device: {errors[-1][0]}")


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".whl", help="the folder to carry (default .whl)")
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements.lock")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "csd-device-wheels")
    parser.add_argument("--part", default="1/1", help="K/N: the K-th of N parts (default the whole plan)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; download nothing")
    parser.add_argument("--strict", action="store_true", help="count the tracked files against the limit too")
    args = parser.parse_args(argv)
    k, n = (int(x) for x in args.part.split("/"))
    if not 1 <= k <= n:
        parser.error(f"--part {args.part}: K must be within 1..N")

    device = device_packages()
    wanted = plan(args.lock.read_text(), device)
    print(f"device packages: {DEVICE_PACKAGES_SOURCE}; carried anyway: {', '.join(CARRY_ANYWAY)}")
    print(f"left out: {'; '.join(f'{name} ({why})' for name, why in LEFT_OUT.items())}")
    if args.dry_run:
        print(f"{len(wanted)} packages from {args.lock.name}:")
        for name, version in wanted:
            print(f"  {name}=={version}")
        return 0

    args.cache.mkdir(parents=True, exist_ok=True)
    wheels = {name: download(name, version, args.cache) for name, version in wanted}
    sizes = {name: path.stat().st_size for name, path in wheels.items()}
    problems, unchecked = check_requires(
        {name: wheel_requires(path) for name, path in wheels.items()}, dict(wanted), device, device_versions()
    )
    part = split(sizes, n)[k - 1]
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    for name in part:
        shutil.copy2(wheels[name], args.out / wheels[name].name)

    print(f"{len(part)} of {len(wanted)} wheels (part {k}/{n}) in {args.out}:")
    for name in sorted(part, key=lambda m: -sizes[m]):
        print(f"  {sizes[name]:>10,d} B  {wheels[name].name}")
    total, whole = sum(sizes[m] for m in part), sum(sizes.values())
    print(f"total: {total:,d} B ({mib(total)}); the whole plan {whole:,d} B ({mib(whole)})")
    print(f"unchecked (on the device, version not recorded): {', '.join(unchecked) or 'none'}")
    for problem in problems:
        print(f"requirement not met: {problem}", file=sys.stderr)

    tracked, untracked = tree_bytes()
    beside = untracked + (tracked if args.strict else 0)
    print(f"tracked files {mib(tracked)}, untracked ones that travel {mib(untracked)}; a call's limit {mib(LIMIT)}")
    if not args.strict:
        print(f"counted beside the wheels: the untracked files ({TRACKED_NOTE}; --strict counts them)")
    if beside >= LIMIT:
        print(f"no room: {mib(beside)} travel without the wheels, over {mib(LIMIT)}", file=sys.stderr)
        return 1
    budget = LIMIT - beside
    if total > budget:
        need = -(-whole // budget)
        print(
            f"does not fit: {mib(total)} of wheels over the {mib(budget)} left; split the plan in {need}: "
            f"--part 1/{need} --out .whl1 ... --part {need}/{need} --out .whl{need}, one call each (docs/space.md)",
            file=sys.stderr,
        )
        return 1
    print(f"fits: {mib(total)} of the {mib(budget)} left")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
