"""Code says what is, not how it came to be: no issue numbers in the code, its comments or its docstrings
(the project's history is in git and docs/). Every .py file under csd/, visualize/ and demo/, and app.py,
is read line by line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("csd", "visualize", "demo")
FILES = ("app.py",)
ISSUE = re.compile(r"(?i)\bissues? ?#?\d+")

# Files that may still cite issues, each with its exact number of matching lines: files being rewritten
# elsewhere, to be fixed there. An entry whose count no longer matches (fewer hits, or none) fails too, so
# it is removed (or lowered) as soon as its file is fixed. Empty: no file is exempt.
ALLOWED: dict[str, int] = {}


def sources(root: Path) -> list[Path]:
    found = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    return found + [root / f for f in FILES if (root / f).is_file()]


def hits(root: Path) -> dict[str, list[str]]:
    """Per file (relative path), its lines that cite an issue, as "file:line: text"."""
    found: dict[str, list[str]] = {}
    for path in sources(root):
        name = path.relative_to(root).as_posix()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ISSUE.search(line):
                found.setdefault(name, []).append(f"{name}:{i}: {line.strip()}")
    return found


def problems(root: Path, allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: lines in files not allowed, and allow-list entries whose count is not the file's."""
    found = hits(root)
    out = [line for name, lines in found.items() if name not in allowed for line in lines]
    for name, count in allowed.items():
        have = len(found.get(name, []))
        if have != count:
            out.append(f"allow-list entry {name!r}: {count} allowed, {have} found (update or remove it)")
            out += found.get(name, [])
    return out


def test_no_issue_numbers_in_code():
    bad = problems(ROOT, ALLOWED)
    assert not bad, "issue numbers in code (history belongs in git and docs/):\n" + "\n".join(bad)


def test_the_scan_names_hits_and_stale_entries(tmp_path):
    (tmp_path / "csd").mkdir()
    (tmp_path / "csd" / "a.py").write_text('"""Fine."""\nx = 1  # see Issue #12\n')
    (tmp_path / "app.py").write_text("# the issues 3 and 4\n")
    (tmp_path / "csd" / "b.py").write_text("# tissue 5 is not an issue; nor is issue-free code\n")
    assert problems(tmp_path, {}) == ["csd/a.py:2: x = 1  # see Issue #12", "app.py:1: # the issues 3 and 4"]
    assert problems(tmp_path, {"csd/a.py": 1, "app.py": 1}) == []
    stale = problems(tmp_path, {"csd/a.py": 1, "app.py": 1, "csd/b.py": 1})
    assert stale == ["allow-list entry 'csd/b.py': 1 allowed, 0 found (update or remove it)"]
