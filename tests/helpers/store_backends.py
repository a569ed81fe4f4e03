"""Fresh store locations per backend for tests whose children open the store themselves.

``BACKEND_PARAMS`` parametrises a test over ``sqlite``, ``postgres`` and ``redis`` (the
last two marked ``postgres`` / ``redis``). :func:`new_location` makes one empty store of a
backend and yields its location string (see :mod:`tests.helpers.store_locations`): a
file under the test's directory, a database of its own (``postgres_database``), or a key
prefix of its own (``redis_prefix``), dropped after.

A server backend whose module is not importable is skipped with the reason - it may not
be written yet - except under ``CUBEPI_REQUIRE_SERVICES=1`` when the module exists (then
an import error is a failure, as an unreachable server is; see :mod:`tests.helpers.services`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.helpers.services import postgres_database, redis_prefix, services_required
from tests.helpers.store_locations import BACKEND_MODULES, backend_of, redis_location

BACKEND_PARAMS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
]
"""Every backend a multi-process test runs on, with its mark."""


def require_backend(backend: str) -> None:
    """Skip (or fail, see the module docstring) unless ``backend``'s module imports."""
    module = BACKEND_MODULES.get(backend)
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as error:
        reason = f"the {backend} backend ({module}) cannot be imported: {type(error).__name__}: {error}"
        if services_required() and importlib.util.find_spec(module) is not None:
            pytest.fail(reason + "; CUBEPI_REQUIRE_SERVICES=1 needs it")
        pytest.skip(reason)


@asynccontextmanager
async def new_location(backend: str, directory: Path, label: str) -> AsyncIterator[str]:
    """A location for a new, empty ``backend`` store named by ``label`` (letters, digits,
    ``_``); not opened yet (open it with ``create=True`` first). Removed after, for servers."""
    require_backend(backend)
    if backend == "sqlite":
        yield str(directory / f"{label}.sqlite")
    elif backend == "postgres":
        async with postgres_database(label) as url:
            yield url
    elif backend == "redis":
        async with redis_prefix(label) as (url, prefix):
            yield redis_location(url, prefix)
    else:
        raise ValueError(f"No store backend is called {backend!r}.")


SETTLE_WAIT = 60.0
"""Seconds :func:`settle` waits at most; a liveness bound, reached only by a failing test."""


async def settle(location: str) -> None:
    """Wait until no statement a killed process sent to the store at ``location`` is still running.

    A process SIGKILLed right after it sent a statement is gone, but a server goes on
    running that statement and commits it: a write made of one statement (our Postgres
    appends) lands after the kill, as a ``COMMIT`` sent just before it does. So, for a
    Postgres location: until no other client backend of its database is running a
    statement, seen twice in a row (a backend that had the statement still unread in its
    socket shows up as running on the next look). SQLite writes in the process itself,
    and Redis runs a command as soon as it reads it, so for them there is nothing to wait for.
    """
    if backend_of(location) != "postgres":
        return
    import asyncpg

    conn = await asyncpg.connect(location, timeout=10)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WAIT
        quiet = 0
        while quiet < 2:
            running = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state = 'active'"
            )
            quiet = quiet + 1 if running == 0 else 0
            if loop.time() > deadline:
                raise AssertionError(f"{running} statement(s) still running on {location} after {SETTLE_WAIT:.0f} s")
            await asyncio.sleep(0.005)
    finally:
        await conn.close()
