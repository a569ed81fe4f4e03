"""Shared fixtures: the cubeloop fixture database (always a copy), fresh database paths,
and the ``checkpointer`` fixture that runs the contract suite on every backend.

Adding a backend: give ``BACKENDS`` an async factory ``(tmp_path) -> Checkpointer`` and,
for a server backend, a pytest mark (``postgres``/``redis``) in ``_MARKS``; a factory
calls ``pytest.skip`` when its server is unreachable, unless ``CUBEPI_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from core.checkpoint.base import Checkpointer
from core.checkpoint.memory import MemoryCheckpointer

ROOT = Path(__file__).resolve().parent.parent


def _fixtures_dir() -> Path:
    # shared/ lies beside the repository (locally /work/shared, in CI beside the clone).
    for candidate in (ROOT.parent / "shared" / "fixtures", Path("/work/shared/fixtures")):
        if (candidate / "cubeloop_crashpoints.sqlite").exists():
            return candidate
    raise RuntimeError("The cubeloop fixture database is missing: shared/fixtures must lie beside the repository.")


FIXTURES = _fixtures_dir()
FIXTURE_DB = FIXTURES / "cubeloop_crashpoints.sqlite"
"""Written by the real cubeloop; read-only for tests: copy it before anything opens it."""
FIXTURE_JSON = FIXTURES / "cubeloop_crashpoints.json"


@pytest.fixture
def fixture_db(tmp_path: Path) -> Path:
    """Path of a fresh private copy of the cubeloop fixture database."""
    target = tmp_path / "fixture" / "cubeloop_crashpoints.sqlite"
    target.parent.mkdir()
    shutil.copyfile(FIXTURE_DB, target)
    return target


@pytest.fixture(scope="session")
def fixture_json() -> dict[str, Any]:
    """The fixture's description: per thread, roles, dangling call ids, run completion, crash point."""
    return json.loads(FIXTURE_JSON.read_text())


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """A path for a new database file (not created yet) in a private directory."""
    return tmp_path / "store" / "threads.sqlite"


async def _memory(_tmp_path: Path) -> Checkpointer:
    return MemoryCheckpointer()


async def _sqlite(tmp_path: Path) -> Checkpointer:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    return await SQLiteCheckpointer.open(tmp_path / "contract.sqlite", create=True)


BACKENDS: dict[str, Callable[[Path], Awaitable[Checkpointer]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}
"""Every backend the contract suite runs on, by name."""

_MARKS: dict[str, list[pytest.MarkDecorator]] = {}
"""Marks per backend, e.g. ``{"postgres": [pytest.mark.postgres]}``."""


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, []), id=name) for name in BACKENDS])
async def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Checkpointer]:
    """A fresh, empty store of each backend in turn; closed after the test."""
    store = await BACKENDS[request.param](tmp_path)
    try:
        yield store
    finally:
        await store.close()
