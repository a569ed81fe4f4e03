"""The tests stand alone: a fresh clone passes with nothing beside it, and test modules share
helpers through ``tests/helpers``, never by importing one another or a conftest."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

OUTSIDE = ("/work/" + "shared", "../" + "shared", '"shared" / "fixtures"', "parent / " + '"shared"')
"""Ways a test could reach files beside the repository (spelled in pieces so this file does not match)."""


def _sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p != Path(__file__).resolve())


def test_no_test_reads_files_beside_the_repository() -> None:
    found = [f"{p.relative_to(TESTS)}: {needle!r}" for p in _sources() for needle in OUTSIDE if needle in p.read_text()]
    assert not found, found


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    found: list[str] = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else [f"{'.' * node.level}{node.module or ''}"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if last == "conftest" or last.startswith("test_"):
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno} imports {name}")
    assert not found, found
