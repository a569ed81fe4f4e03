"""The real PostgreSQL and Redis servers of this machine, one private database or key prefix per test.

``POSTGRES_URL`` / ``REDIS_URL`` (environment, defaults ``postgresql://postgres@127.0.0.1:5432/test``
and ``redis://127.0.0.1:6379/0``) name the servers. When one cannot be reached the test
is skipped with the reason, unless ``CUBEPI_REQUIRE_SERVICES=1`` (set by ``.ci/run``),
where it fails instead: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_URL = os.environ.get("CUBEPI_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CUBEPI_TEST_REDIS", "redis://127.0.0.1:6379/0")


def services_required() -> bool:
    """Whether an unreachable service must fail the test rather than skip it."""
    return os.environ.get("CUBEPI_REQUIRE_SERVICES") == "1"


def unavailable(what: str, error: BaseException) -> None:
    """Skip (or, under ``CUBEPI_REQUIRE_SERVICES=1``, fail) because ``what`` cannot be reached."""
    reason = f"{what} is not reachable ({type(error).__name__}: {error})"
    if services_required():
        pytest.fail(reason + "; CUBEPI_REQUIRE_SERVICES=1 needs it")
    pytest.skip(reason)


def postgres_url_for(database: str) -> str:
    """``POSTGRES_URL`` with its database replaced by ``database``."""
    parts = urlsplit(POSTGRES_URL)
    return urlunsplit(parts._replace(path="/" + database))


@asynccontextmanager
async def postgres_database(label: str = "t", *, template: str | None = None) -> AsyncIterator[str]:
    """A new, empty database on the server for one test (a copy of ``template`` when given);
    yields its URL and drops it after (terminating connections left open, so a failed test
    cannot leak it)."""
    import asyncpg

    name = f"cubepi_{label}_{uuid.uuid4().hex[:12]}".lower()
    try:
        admin = await asyncpg.connect(POSTGRES_URL, timeout=10)
    except (OSError, asyncpg.PostgresError) as error:
        unavailable("PostgreSQL at " + POSTGRES_URL, error)
        raise  # unreachable: skip/fail raise
    try:
        await admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    finally:
        await admin.close()
    try:
        yield postgres_url_for(name)
    finally:
        admin = await asyncpg.connect(POSTGRES_URL, timeout=10)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        finally:
            await admin.close()


@asynccontextmanager
async def redis_prefix(label: str = "t") -> AsyncIterator[tuple[str, str]]:
    """A fresh key prefix on the Redis server for one test; yields ``(url, prefix)`` and
    deletes every key under the prefix after."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    prefix = f"cubepi-test:{label}:{uuid.uuid4().hex[:12]}:"
    client = aioredis.from_url(REDIS_URL, socket_timeout=10)
    try:
        await client.ping()
    except (OSError, RedisConnectionError) as error:
        await client.aclose()
        unavailable("Redis at " + REDIS_URL, error)
        raise
    try:
        yield REDIS_URL, prefix
    finally:
        try:
            keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
