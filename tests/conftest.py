"""Shared fixtures: the cubeloop crash-point database (written by the real cubeloop once per
run, always used as a copy), fresh database paths,
and the ``checkpointer`` fixture that runs the contract suite on every backend.

Adding a backend: give ``BACKENDS`` an async factory ``(tmp_path) -> Checkpointer`` and,
for a server backend, a pytest mark (``postgres``/``redis``) in ``_MARKS``; a factory
calls ``pytest.skip`` when its server is unreachable, unless ``CUBEPI_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.base import Checkpointer
from core.checkpoint.memory import MemoryCheckpointer
from tests.helpers.cubeloop_threads import make_crashpoint_db

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_store_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``CUBEPI_DB`` set where the tests run would point every default-location test at
    that store (maybe a real server); tests that need it set it themselves."""
    monkeypatch.delenv("CUBEPI_DB", raising=False)


@pytest.fixture(scope="session")
def cubeloop_crashpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The crash-point database, written once per test run by the real cubeloop (one child
    process per thread, SIGKILLed at a known moment or ended normally; see
    ``tests/helpers/cubeloop_threads.py``), and its description. Read-only: tests use copies."""
    db = tmp_path_factory.mktemp("cubeloop") / "cubeloop_crashpoints.sqlite"
    description = make_crashpoint_db(db)
    db.chmod(0o444)
    return db, description


@pytest.fixture
def fixture_db(tmp_path: Path, cubeloop_crashpoints: tuple[Path, dict[str, Any]]) -> Path:
    """Path of a fresh private copy of the cubeloop crash-point database."""
    target = tmp_path / "fixture" / "cubeloop_crashpoints.sqlite"
    target.parent.mkdir()
    shutil.copyfile(cubeloop_crashpoints[0], target)
    target.chmod(0o644)
    return target


@pytest.fixture(scope="session")
def fixture_json(cubeloop_crashpoints: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    """The crash-point database's description: per thread, roles, row ids, runs, dangling
    call ids, run completion and crash point (see ``make_crashpoint_db``)."""
    return cubeloop_crashpoints[1]


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """A path for a new database file (not created yet) in a private directory."""
    return tmp_path / "store" / "threads.sqlite"


async def _memory(_tmp_path: Path) -> Checkpointer:
    return MemoryCheckpointer()


async def _sqlite(tmp_path: Path) -> Checkpointer:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    return await SQLiteCheckpointer.open(tmp_path / "contract.sqlite", create=True)


async def _redis(_tmp_path: Path) -> Checkpointer:
    """A Redis store under a key prefix of its own (skips when the server is down); closing
    it also deletes every key under that prefix."""
    from core.checkpoint.redis import RedisCheckpointer
    from tests.helpers.services import redis_prefix

    prefix = redis_prefix("contract")
    url, name = await prefix.__aenter__()
    store = await RedisCheckpointer.open(url, prefix=name)
    close = store.close

    async def close_and_clean() -> None:
        try:
            await close()
        finally:
            await prefix.__aexit__(None, None, None)

    store.close = close_and_clean  # type: ignore[method-assign]
    return store


BACKENDS: dict[str, Callable[[Path], Awaitable[Checkpointer]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "redis": _redis,
}
"""Every backend the contract suite runs on, by name."""

_MARKS: dict[str, list[pytest.MarkDecorator]] = {"redis": [pytest.mark.redis]}
"""Marks per backend, e.g. ``{"postgres": [pytest.mark.postgres]}``."""


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, []), id=name) for name in BACKENDS])
async def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Checkpointer]:
    """A fresh, empty store of each backend in turn; closed after the test."""
    store = await BACKENDS[request.param](tmp_path)
    try:
        yield store
    finally:
        await store.close()
