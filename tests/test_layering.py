"""The package's layers: no module imports one above it, and no two modules import each other (directly or
around a cycle). Imports are read from the source (also those inside functions), so a lazy import that
hides a cycle counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("csd", "visualize", "demo")

# Lowest first; a module may import its own layer and those below. The first prefix that matches names it.
LAYERS = (
    ("core math", ("csd.checks", "csd.rng", "csd.gaussian", "csd.schedule", "csd.precision")),
    ("chains and settings", ("csd.chain", "csd.config")),
    (
        "family interface and records",
        ("csd.family", "csd.trace", "csd.cost", "csd.resample", "csd.toy", "csd.panels", "csd.replay", "csd.verdict"),
    ),
    ("decoder pieces", ("csd.acceptance", "csd.decoding")),
    ("decoders", ("csd.sampling", "csd.speculative", "csd")),
    ("model families", ("csd.models",)),
    ("data and training", ("csd.shapes",)),
    ("experiments", ("csd.experiments",)),
    ("figures", ("visualize",)),
    ("app", ("demo",)),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Project modules a file imports: ``from a.b import c`` counts a.b (its ``__init__`` runs and is read)
    and a.b.c too when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in modules}


def layer_of(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{module} is in no layer"
    return best[0]


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def test_every_module_is_in_a_layer():
    for module in project_modules():
        layer_of(module)


def test_no_module_imports_one_above_it():
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in graph().items()
        for d in deps
        if layer_of(d) > layer_of(m) and not m.startswith(d + ".")  # a package's own __init__ is its parent
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycles():
    """Package ``__init__`` modules included: one that re-exports its submodules closes a cycle with any of
    them that imports the package itself (``from csd.models.mar import gtr`` in csd.models.mar.adapter did)."""
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(path[path.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_figures_import_nothing_from_the_experiments():
    """A figure builder draws records (the trace's layer: csd.panels, csd.replay, csd.verdict); loading one
    must not load the pair loader, the model registry or any runner of csd.experiments."""
    found = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if m == "visualize" or m.startswith("visualize.")
        for d in deps
        if d == "csd.experiments" or d.startswith("csd.experiments.")
    ]
    assert not found, "\n".join(found)


def test_the_figures_import_no_model_family():
    """What a figure needs of a family is a plain record (docs/families.json, written from
    csd.experiments.catalog) or what its caller passes: loading one must not load the model registry."""
    found = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if m == "visualize" or m.startswith("visualize.")
        for d in deps
        if d == "csd.models" or d.startswith("csd.models.")
    ]
    assert not found, "\n".join(found)


def test_no_module_of_the_figures_the_app_or_the_experiments_names_a_family():
    """Their families' names, labels and docs blocks come from the families' rows (csd.models.registry), their
    catalog entries (csd.experiments.catalog) and, for the figures, the records written from those."""
    from csd.models.registry import FAMILIES

    names = [f'"{family.shared_traits().family}"' for family in FAMILIES.values()]
    found = [
        f"{path.relative_to(ROOT)}:{i}"
        for folder in ("visualize", "demo", "csd/experiments")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(name in line for name in names)
    ]
    assert not found, "\n".join(found)
