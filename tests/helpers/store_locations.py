"""One string names a store, so a test can hand it to a child process: open it here.

A *location* is what crosses a pipe or a command line to a child (crash children, resume
workers): a SQLite file path, a ``postgresql://`` URL, or a ``redis://`` URL whose key
prefix rides in a ``prefix`` query parameter (``redis://127.0.0.1:6379/0?prefix=cubepi-test%3Aa%3A``;
see :func:`redis_location`). :func:`open_location` is the one place that turns it into a
store; the server backends are imported only when a location names them, so a process
that only uses SQLite never needs them.

It opens through the app's own :func:`core.checkpoint.locations.open_store` and checks the
store can be supervised.
"""

from __future__ import annotations

import contextlib
import importlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.checkpoint.base import Checkpointer
from core.checkpoint.capabilities import SupervisedStore, supports

BACKEND_MODULES: dict[str, str] = {
    "postgres": "core.checkpoint.postgres",
    "redis": "core.checkpoint.redis",
}
"""Server backend name -> the module holding its checkpointer class."""

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_REDIS_SCHEMES = ("redis://", "rediss://")


def redis_location(url: str, prefix: str) -> str:
    """The location of the Redis store at ``url`` under key ``prefix`` (``url`` plus a ``prefix`` query parameter)."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), ("prefix", prefix)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def split_redis_location(location: str) -> tuple[str, str | None]:
    """``(url, prefix)`` of a Redis location: the URL without its ``prefix`` parameter, and
    that parameter (``None`` when absent: the backend's default prefix)."""
    parts = urlsplit(location)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((value for key, value in query if key == "prefix"), None)
    rest = urlencode([(key, value) for key, value in query if key != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


def backend_of(location: str) -> str:
    """``"postgres"``, ``"redis"`` or ``"sqlite"`` (anything else is a file path)."""
    if location.startswith(_POSTGRES_SCHEMES):
        return "postgres"
    if location.startswith(_REDIS_SCHEMES):
        return "redis"
    return "sqlite"


async def open_location(location: str, create: bool) -> Checkpointer:
    """Open the store at ``location`` (see the module docstring); ``create`` makes a missing
    file or schema, as each backend's ``open(..., create=...)`` does.

    The store returned declares :class:`SupervisedStore` (checked). Raises what the
    backend's ``open`` raises (``DatabaseOpenError``, ``StoreConnectionError``), and
    ``ImportError`` when a server backend's module is not installed.
    """
    from core.checkpoint.locations import open_store

    store = await open_store(location, create=create)
    if not supports(store, SupervisedStore):
        await store.close()
        raise TypeError(f"The {backend_of(location)} store at {location} does not declare SupervisedStore.")
    return store


def preload_backends() -> None:
    """Import every backend (and its driver) that is installed, so forked children start warm;
    a backend module not written yet is skipped."""
    importlib.import_module("core.checkpoint.sqlite")
    for driver in ("asyncpg", "redis.asyncio"):
        importlib.import_module(driver)
    for module in BACKEND_MODULES.values():
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
