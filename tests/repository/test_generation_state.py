"""A generation's model state lives in the state a family starts it with (csd.family.ModelFamily.start), never
in module globals: no module of ``csd`` keeps a module-level dict keyed by ``id()`` of an object, and none
cleans one up through ``weakref.finalize``. Read from the source, so a lazy import or a local alias counts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The pattern this test keeps out: a cache of one model over one generation, known by the ids of the model and
# of the generation's conditions, dropped when the conditions object goes.
GLOBAL_CACHE = """
import weakref

_CACHES: dict[tuple[int, int], list] = {}


def cache_of(model, conditions) -> list:
    key = (id(model), id(conditions))
    if key not in _CACHES:
        _CACHES[key] = []
        weakref.finalize(conditions, _CACHES.pop, key, None)
    return _CACHES[key]
"""


def _calls_id(node: ast.AST, id_names: set[str]) -> bool:
    """Whether an expression calls ``id()`` or reads a local name bound to such an expression."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "id":
            return True
        if isinstance(sub, ast.Name) and sub.id in id_names:
            return True
    return False


def _module_dicts(tree: ast.Module) -> set[str]:
    """Names bound at module level to a dict (a literal, ``dict()``, ``defaultdict(...)``, or annotated dict)."""
    names = set()
    for node in tree.body:
        targets, value, annotation = [], None, None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value, annotation = [node.target], node.value, node.annotation
        is_dict = isinstance(value, ast.Dict | ast.DictComp) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")).endswith("dict")
        )
        is_dict |= annotation is not None and "dict" in ast.unparse(annotation).lower()
        names |= {t.id for t in targets if isinstance(t, ast.Name) and is_dict}
    return names


def global_caches(source: str) -> list[str]:
    """What in ``source`` keys a module-level dict by ``id()`` or calls ``weakref.finalize``, one line each."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        finalize = isinstance(node, ast.Attribute) and node.attr == "finalize" and ast.unparse(node.value) == "weakref"
        imported = isinstance(node, ast.ImportFrom) and node.module == "weakref"
        imported = imported and any(a.name == "finalize" for a in node.names)
        if finalize or imported:
            found.append(f"line {node.lineno}: weakref.finalize")
    dicts = _module_dicts(tree)
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)] + [tree]
    for scope in scopes:
        id_names = {
            t.id
            for n in ast.walk(scope)
            if isinstance(n, ast.Assign) and _calls_id(n.value, set())
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in ast.walk(scope):
            key = None
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in dicts:
                key = n.slice
            elif isinstance(n, ast.Compare) and any(getattr(c, "id", None) in dicts for c in n.comparators):
                key = n.left
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args:
                owner = n.func.value
                key = n.args[0] if isinstance(owner, ast.Name) and owner.id in dicts else None
            if key is not None and _calls_id(key, id_names):
                found.append(f"line {n.lineno}: a module-level dict keyed by id(): {ast.unparse(n)}")
    return sorted(set(found))


def test_no_module_of_csd_keeps_a_generation_cache_keyed_by_id():
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "csd").rglob("*.py"))
        if (hits := global_caches(path.read_text()))
    }
    assert not found, f"keep a generation's caches in its model state (csd.family.ModelFamily.start): {found}"


def test_the_check_finds_a_global_cache_keyed_by_id_and_its_finalizer():
    found = global_caches(GLOBAL_CACHE)
    assert any("weakref.finalize" in f for f in found)
    assert sum("keyed by id()" in f for f in found) == 3  # the test, the store, the read
    assert global_caches(GLOBAL_CACHE.replace("(id(model), id(conditions))", "(model.name, len(conditions))")) == [
        "line 11: weakref.finalize"
    ]
