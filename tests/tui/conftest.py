"""Fixtures for the Textual tests: databases, cubeloop fixture copies, runner children.

The helpers live in ``tests/helpers/tui.py``; tests import them from there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers.supervise import Runner
from tests.helpers.tui import Db


@pytest.fixture
def db(tmp_path: Path) -> Db:
    """A fresh SQLite database file (created by the app on first open)."""
    return Db(tmp_path / "threads.sqlite")


@pytest.fixture
def fixture_copy(tmp_path: Path, cubeloop_crashpoints: tuple[Path, dict[str, object]]) -> Path:
    """A private copy of the cubeloop crash-point database (see ``tests/conftest.py``)."""
    target = tmp_path / "cubeloop.sqlite"
    shutil.copyfile(cubeloop_crashpoints[0], target)
    return target


@pytest.fixture(autouse=True)
def _no_cursor_blink(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs do not blink, so screens are deterministic."""
    from textual.widgets import Input

    monkeypatch.setattr(Input, "cursor_blink", False)


@pytest.fixture
def children(tmp_path: Path):  # type: ignore[no-untyped-def]
    """``children(argv)`` starts a runner child; every child still alive at the end is killed."""
    started: list[Runner] = []
    gates = tmp_path / "gates"
    gates.mkdir()

    def start(*argv: str) -> Runner:
        child = Runner([sys.executable, *argv], gates, quiet=True)
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        if child.proc.stderr is not None:
            child.proc.stderr.close()


@pytest.fixture
async def shared_db(tmp_path: Path) -> Path:
    """A database file created before any process uses it (so none races to create it)."""
    from core.checkpoint.sqlite import SQLiteCheckpointer

    path = tmp_path / "shared.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    await store.close()
    return path
