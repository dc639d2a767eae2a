"""One value for what runs: the harnesses (the experiments, the app, the scripts, the records) choose
target-only, draft-only or CSD as a :class:`csd.Method` and run it; none of them calls ``generate`` or
``speculative_generate`` itself. Read from the source with ``ast`` (imports, calls and code held in strings,
such as a worker script's), so neither an alias, a ``functools.partial`` of the sampler nor a lazy import hides a
call. The one exception is the fallback of a worker that also measures older trees, which lack ``csd.dispatch``:
code under ``except ImportError``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLERS = {"generate", "speculative_generate"}
SAMPLER_MODULES = {"csd", "csd.sampling", "csd.speculative"}
# The harnesses that each chose between the samplers themselves, and two more that did too.
HARNESSES = (
    "csd/experiments/evaluate.py",
    "csd/experiments/prompts.py",
    "csd/experiments/bench.py",
    "csd/experiments/frontier.py",
    "csd/experiments/analysis.py",
    "csd/experiments/roofline_probe.py",
    "csd/experiments/paper_scale/quality.py",
    "demo/estimate.py",
    "scripts/profile_phases.py",
    "scripts/gpu_check.py",
    "csd/records/replay_frames.py",
    "csd/experiments/paper_scale/measure.py",
    "csd/experiments/small_frontier.py",
)
# Where harnesses live: every module under these is checked, so a new one is too.
HARNESS_FOLDERS = ("csd/experiments", "csd/records", "demo", "scripts", "visualize")
# Those that run a sampler themselves (the rest reach Method through these: prompts through evaluate's images,
# replay_frames only reads a CSD run's trace).
RUNNERS = tuple(h for h in HARNESSES if h not in ("csd/experiments/prompts.py", "csd/records/replay_frames.py"))
OLD_TREE = {"ImportError", "ModuleNotFoundError"}


def dotted(node: ast.expr) -> str:
    """``a.b.c`` of a Name / Attribute chain, else ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def catches_import_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(dotted(t) in OLD_TREE for t in types if t is not None)


def walk(node: ast.AST, old_tree: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node``, with whether it lies under an ``except ImportError`` handler; code held in a
    string constant (a worker script) is parsed and walked too."""
    yield node, old_tree
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
        try:
            inner = ast.parse(node.value)
        except SyntaxError:
            inner = None  # prose
        if inner is not None:
            yield from walk(inner, old_tree)
    for child in ast.iter_child_nodes(node):
        inside = old_tree or (isinstance(node, ast.ExceptHandler) and catches_import_error(node))
        yield from walk(child, inside)


def sampler_uses(source: str) -> list[str]:
    """Direct uses of the samplers in ``source``: importing ``generate`` / ``speculative_generate`` (or their
    modules) and calling them by any name, outside an older tree's fallback."""
    found = []
    for node, old_tree in walk(ast.parse(source)):
        if old_tree:
            continue
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in SAMPLER_MODULES:
            found += [f"line {line}: from {node.module} import {a.name}" for a in node.names if a.name in SAMPLERS]
        elif isinstance(node, ast.Import):
            found += [f"line {line}: import {a.name}" for a in node.names if a.name in SAMPLER_MODULES - {"csd"}]
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            module, _, attr = name.rpartition(".")
            if (name in SAMPLERS) or (attr in SAMPLERS and (module in SAMPLER_MODULES or attr != "generate")):
                found.append(f"line {line}: calls {name}(...)")
    return found


def uses_method(source: str) -> bool:
    """Whether ``source`` runs something through csd.Method (its import or a helper of csd.experiments that
    takes one)."""
    for node, _ in walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = {a.name for a in node.names}
            if (node.module == "csd.dispatch" and "Method" in names) or (node.module == "csd" and "Method" in names):
                return True
            if node.module == "csd.experiments.analysis" and "run_method" in names:
                return True
    return False


def harness_files() -> list[Path]:
    listed = [ROOT / h for h in HARNESSES]
    found = [p for folder in HARNESS_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    return list(dict.fromkeys([*listed, *found, ROOT / "app.py"]))


def test_the_listed_harnesses_exist():
    missing = [h for h in HARNESSES if not (ROOT / h).is_file()]
    assert not missing, missing


def test_no_harness_calls_a_sampler_directly():
    """The only callers of the samplers are csd.dispatch, the library's own modules and the tests."""
    found = {str(p.relative_to(ROOT)): sampler_uses(p.read_text()) for p in harness_files()}
    found = {path: uses for path, uses in found.items() if uses}
    assert not found, "run a csd.Method instead of calling the sampler:\n" + "\n".join(
        f"{path}: {use}" for path, uses in found.items() for use in uses
    )


def test_each_harness_that_runs_a_sampler_runs_a_method():
    missing = [h for h in RUNNERS if not uses_method((ROOT / h).read_text())]
    assert not missing, missing


def test_the_check_sees_every_way_of_calling_a_sampler():
    """Imports, calls by name, through a module, a partial, a lazy import, a worker script in a string; not a
    method that happens to be named ``generate``, nor an older tree's fallback."""
    seen = [
        "from csd.sampling import generate",
        "from csd import speculative_generate as spec",
        "import csd.speculative",
        "import csd\ncsd.generate(t, c, s)",
        "import csd\ncsd.speculative_generate(t, d, c, s)",
        "def f():\n    from csd.sampling import generate\n    return generate(t, c, s)",
        "run = generate(t, c, s)",
        "x = speculative_generate(t, d, c, s)",
        'WORKER = r"""\nfrom csd.sampling import generate\nprint(1)\n"""',
        "try:\n    pass\nexcept ValueError:\n    from csd.sampling import generate",
    ]
    for source in seen:
        assert sampler_uses(source), source
    unseen = [
        "self.generate(request)",
        "tab.generate(None, x)",
        "from demo.tabs.generate import compare",
        "from csd import Method\nMethod.target().run(t, d, c, s)",
        "try:\n    from csd.dispatch import Method\nexcept ImportError:\n    from csd.sampling import generate\n"
        "    run = generate(t, c, s)",
        '"""Generate N images with one sampler\nand score them."""',
    ]
    for source in unseen:
        assert not sampler_uses(source), source
    assert uses_method("from csd.dispatch import Method") and uses_method("from csd import Method, CSDConfig")
    assert not uses_method("from csd import CSDConfig")
