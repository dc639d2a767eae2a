"""The package's layers, read from its folders: each folder of ``csd`` (and ``csd``'s own top-level
modules, ``visualize`` and ``demo``) is a layer, the folders import each other without a cycle, so their
order is the import graph's own, and no module imports another around a cycle. Imports are read from the
source (also those inside functions), so a lazy import that hides a cycle counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("csd", "visualize", "demo")

# The bottom layer and what a layer may not import: rules of the tree, not a list of its modules.
BOTTOM = "csd.core"
READ_WITHOUT_A_MODEL = ("csd.records", "visualize")  # records and figures: no model, no pair, no run
MODEL_WORLD = ("csd.models", "csd.shapes", "csd.training", "csd.serving", "csd.experiments")
TOP_LEVEL_MODULES = 12  # csd/*.py besides __init__.py: the public entry points, the rest in folders


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def folder_of(module: str) -> str:
    """A module's layer: its first folder under ``csd`` (csd.models.mar.adapter -> csd.models), ``csd`` for
    the package's own top-level modules, and ``visualize`` / ``demo`` as wholes."""
    parts = module.split(".")
    if parts[0] != "csd" or len(parts) == 1 or not (ROOT / "csd" / parts[1]).is_dir():
        return parts[0]
    return ".".join(parts[:2])


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


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def folder_graph() -> dict[str, set[str]]:
    """Which layer imports which, with the module import that makes each arrow."""
    folders: dict[str, set[str]] = {}
    for module, deps in graph().items():
        folders.setdefault(folder_of(module), set())
        for dep in deps:
            if folder_of(dep) != folder_of(module) and not module.startswith(dep + "."):
                folders[folder_of(module)].add(folder_of(dep))
    return folders


def cycles_of(g: dict[str, set[str]]) -> list[str]:
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
    return cycles


def layers() -> list[str]:
    """The layers lowest first: each after every layer it imports (ties by name)."""
    g, order = folder_graph(), []
    while len(order) < len(g):
        order += sorted(f for f in g if f not in order and g[f] <= set(order))[:1] or [min(set(g) - set(order))]
    return order


def arrows_into(folder: str, *, banned: tuple[str, ...]) -> list[str]:
    return [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if folder_of(m) == folder
        for d in deps
        if folder_of(d) in banned
    ]


def test_the_layers_import_each_other_without_a_cycle():
    """So the folders have an order (:func:`layers`) and no module imports one in a layer above its own."""
    assert not cycles_of(folder_graph()), "\n".join(cycles_of(folder_graph()))


def test_the_layer_order_is_the_one_the_docs_show():
    text = (ROOT / "docs" / "library.md").read_text()
    assert "Layers, lowest first: " + " < ".join(f"`{f}`" for f in layers()) + "." in text, layers()


def test_the_core_is_the_bottom_layer():
    assert folder_graph()[BOTTOM] == set(), folder_graph()[BOTTOM]
    assert layers()[0] == BOTTOM


def test_records_and_figures_need_no_model():
    """A figure builder draws records; loading one must not load a model family, the shapes world, the pair
    loader or any runner of csd.experiments."""
    found = [a for folder in READ_WITHOUT_A_MODEL for a in arrows_into(folder, banned=MODEL_WORLD)]
    assert not found, "\n".join(found)


def test_the_top_level_holds_the_entry_points_and_few_modules():
    top = sorted(p.stem for p in (ROOT / "csd").glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MODULES, top


def test_no_module_name_repeats_across_packages_unless_it_is_a_family_part():
    """The same name in two folders is the same concept: only the model families' parts (each family's
    adapter, network, official loader and paper settings) repeat."""
    by_name: dict[str, list[str]] = {}
    for module in project_modules():
        by_name.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    repeated = {
        name: mods
        for name, mods in by_name.items()
        if len(mods) > 1
        and name not in ("__main__",)
        and not all(m.startswith("csd.models.") and m.count(".") == 3 for m in mods)
        and not all(m == n or m.startswith(n + ".") or n.startswith(m + ".") for m in mods for n in mods)
    }
    assert not repeated, repeated


def test_the_import_graph_has_no_cycles():
    """Package ``__init__`` modules included: one that re-exports its submodules closes a cycle with any of
    them that imports the package itself (``from csd.models.mar import gtr`` in csd.models.mar.adapter did)."""
    assert not cycles_of(graph()), "\n".join(cycles_of(graph()))


def test_no_module_of_the_figures_the_app_or_the_experiments_names_a_family():
    """Their families' names, labels and docs blocks come from the families' rows (csd.models.registry), their
    catalog entries (csd.serving.catalog) and, for the figures, the records written from those."""
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


def test_the_tests_are_in_folders_like_the_layers():
    """tests/<layer>/ for each layer (``decoders`` for csd's own modules), tests/repository/ for the rules of
    the repository; support code (helpers, the test families, data) outside them."""
    folders = {p.parent.name for p in (ROOT / "tests").rglob("test_*.py") if p.parent != ROOT / "tests"}
    named = {"decoders" if f == "csd" else f.rsplit(".", 1)[-1] for f in layers()}
    assert folders == named | {"repository"}, folders ^ (named | {"repository"})
    assert not list((ROOT / "tests").glob("test_*.py")), "a test module outside the layers' folders"
