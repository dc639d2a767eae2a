"""No class is over 200 lines: a class that long holds more than one concept, and reads as two. A class's
lines run from its ``class`` line to the end of its body (decorators not counted), in every module of the
package, the figures, the app, the scripts and ``app.py``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("csd", "demo", "visualize", "scripts")
MAX_LINES = 200


def source_files() -> list[Path]:
    """Every .py file of the folders above, and app.py."""
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")) + [ROOT / "app.py"]


def class_lengths(source: str) -> dict[str, int]:
    """Each class of ``source`` (nested ones as ``Outer.Inner``) -> its lines, ``class`` line to body's end."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_class_lengths_count_from_the_class_line_to_the_end_of_its_body():
    source = "@decorated\nclass A:\n    x = 1\n\n    class B:\n        y = 2\n\n    z = 3\n\n\nclass C:\n    pass\n"
    assert class_lengths(source) == {"A": 7, "A.B": 2, "C": 2}


def test_the_walk_finds_every_folder_and_app_py():
    files = source_files()
    assert ROOT / "app.py" in files
    for folder in FOLDERS:
        assert any(p.is_relative_to(ROOT / folder) for p in files), folder


def test_no_class_is_over_200_lines():
    over = [
        f"{path.relative_to(ROOT)}: {name} has {n} lines"
        for path in source_files()
        for name, n in class_lengths(path.read_text()).items()
        if n > MAX_LINES
    ]
    assert not over, f"classes over {MAX_LINES} lines (split each into parts of one concept):\n" + "\n".join(over)
