"""Shared fixtures: the cubeloop crash-point database (written by the real cubeloop once per
run, always used as a copy), fresh database paths,
and the ``checkpointer`` fixture that runs the contract suite on every backend.

Adding a backend: give ``BACKENDS`` an async factory ``(tmp_path) -> (store, reopen)`` and,
for a server backend, a pytest mark (``postgres``/``redis``) in ``_MARKS``; a factory
calls ``pytest.skip`` when its server is unreachable, unless ``CUBEPI_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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


OWNER = "alice"
"""The owner the ``checkpointer`` fixture's store is opened for (passed explicitly, so no
test depends on the OS user name or ``CUBEPI_OWNER``)."""

Reopen = Callable[[str], Awaitable[Checkpointer]]
"""``await reopen(owner)``: another store object on the same data, opened for ``owner``."""


async def _memory(_tmp_path: Path) -> tuple[Checkpointer, Reopen]:
    store = MemoryCheckpointer(OWNER)

    async def reopen(owner: str) -> Checkpointer:
        return MemoryCheckpointer(owner, shared=store)

    return store, reopen


async def _sqlite(tmp_path: Path) -> tuple[Checkpointer, Reopen]:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    path = tmp_path / "contract.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True, owner=OWNER)

    async def reopen(owner: str) -> Checkpointer:
        return await SQLiteCheckpointer.open(path, create=False, owner=owner)

    return store, reopen


async def _postgres(_tmp_path: Path) -> tuple[Checkpointer, Reopen]:
    """A Postgres store on a database of its own, a copy of one made by ``open(create=True)``
    (skips when the server is down); closing it drops the database."""
    from core.checkpoint.postgres import PostgresCheckpointer
    from tests.helpers.pg import new_store

    store = await new_store("contract", owner=OWNER)

    async def reopen(owner: str) -> Checkpointer:
        return await PostgresCheckpointer.open(store.database_url, create=False, owner=owner)

    return store, reopen


async def _redis(_tmp_path: Path) -> tuple[Checkpointer, Reopen]:
    """A Redis store under a key prefix of its own (skips when the server is down); closing
    it also deletes every key under that prefix."""
    from core.checkpoint.redis import RedisCheckpointer
    from tests.helpers.services import redis_prefix

    prefix = redis_prefix("contract")
    url, name = await prefix.__aenter__()
    try:
        store = await RedisCheckpointer.open(url, prefix=name, owner=OWNER)
    except BaseException:
        await prefix.__aexit__(None, None, None)
        raise
    close = store.close

    async def close_and_clean() -> None:
        try:
            await close()
        finally:
            await prefix.__aexit__(None, None, None)

    store.close = close_and_clean  # type: ignore[method-assign]

    async def reopen(owner: str) -> Checkpointer:
        return await RedisCheckpointer.open(url, prefix=name, create=False, owner=owner)

    return store, reopen


BACKENDS: dict[str, Callable[[Path], Awaitable[tuple[Checkpointer, Reopen]]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "redis": _redis,
}
"""Every backend the contract suite runs on, by name: each makes a fresh, empty store opened
for :data:`OWNER` and the :data:`Reopen` of its data."""

_MARKS: dict[str, list[pytest.MarkDecorator]] = {"postgres": [pytest.mark.postgres], "redis": [pytest.mark.redis]}
"""Marks per backend, e.g. ``{"postgres": [pytest.mark.postgres]}``."""


@dataclass
class _Backend:
    store: Checkpointer
    reopen: Reopen


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, []), id=name) for name in BACKENDS])
async def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[_Backend]:
    """One backend's fresh store and its reopener; every store object either opened is
    closed after the test (the reopened ones first: closing the first drops the data)."""
    store, reopen = await BACKENDS[request.param](tmp_path)
    opened: list[Checkpointer] = []

    async def tracked(owner: str) -> Checkpointer:
        other = await reopen(owner)
        opened.append(other)
        return other

    try:
        yield _Backend(store, tracked)
    finally:
        try:
            for other in reversed(opened):
                await other.close()
        finally:
            await store.close()


@pytest.fixture
def checkpointer(_backend: _Backend) -> Checkpointer:
    """A fresh, empty store of each backend in turn, opened for owner :data:`OWNER`
    (``"alice"``); closed after the test."""
    return _backend.store


@pytest.fixture
def reopen(_backend: _Backend) -> Reopen:
    """``await reopen(owner)``: ANOTHER store object on the SAME data as ``checkpointer``,
    opened for ``owner`` (memory: ``MemoryCheckpointer(owner, shared=...)``; SQLite: the
    same file; Postgres: the same database URL; Redis: the same URL and key prefix). Each
    call opens a new one; all are closed after the test, before ``checkpointer``."""
    return _backend.reopen
