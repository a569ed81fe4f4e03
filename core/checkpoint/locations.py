"""Where a store is: the one place that knows store URL schemes and the default location.

A location is a SQLite file path or a server URL:

* ``postgresql://`` or ``postgres://`` (libpq's and asyncpg's forms, e.g.
  ``postgresql://user:secret@host:5432/db?sslmode=require``) - the Postgres backend;
* ``redis://``, ``rediss://`` (TLS) or ``unix://`` (a socket path,
  ``unix:///run/redis.sock?db=0``) - the Redis backend, in the three forms redis-py's
  ``Redis.from_url`` documents;
* anything else without a ``scheme://`` prefix - a SQLite file.

A string that starts with another ``scheme://`` (``mysql://``, ``http://``, ``file://``)
is refused with one sentence instead of becoming an oddly named SQLite file. Which
location is used when none is given is :func:`chosen_location`'s rule: the argument, else
the ``CUBEPI_DB`` environment variable, else :func:`default_sqlite_path`.

This module is not a backend: it imports each backend lazily, inside the function that
opens it, so choosing SQLite never loads a server driver and the backends stay independent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.checkpoint.base import Checkpointer
from core.checkpoint.reconnect import OnStatus, delays_within
from core.checkpoint.redact import KEYWORD_FORM, redacted
from core.errors import DatabaseOpenError
from core.owners import resolve_owner

ENV_VAR = "CUBEPI_DB"
"""The environment variable naming the store used when no location is given (a path or a URL)."""

Backend = Literal["sqlite", "postgres", "redis"]

SCHEMES: dict[str, Backend] = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
}
"""URL scheme (lower case) -> backend. ``unix://`` is redis-py's socket form; Postgres
reaches a socket through ``postgresql:///db?host=/run/postgresql`` instead."""

# RFC 3986's scheme syntax, at least two characters, so a Windows drive ("C://x") stays a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


@dataclass(frozen=True, slots=True)
class ChosenLocation:
    """Which store to open and whether it is the default one (its directory may be created)."""

    location: str | Path
    default: bool


def default_sqlite_path() -> Path:
    """``<user data dir>/cubepi-tui/threads.sqlite`` (platformdirs' ``user_data_dir``)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("cubepi-tui")) / "threads.sqlite"


def chosen_location(given: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> ChosenLocation:
    """The store to use: ``given`` when it is not ``None`` (an empty one too: opening it is
    refused, :func:`backend_of`), else ``CUBEPI_DB`` from ``environ`` (default
    ``os.environ``) when set and not empty, else the default SQLite file (``default``
    true). Never raises; the location is checked when opened."""
    if given is not None:
        return ChosenLocation(given if isinstance(given, str) else Path(given), False)
    from_env = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if from_env.strip():
        return ChosenLocation(from_env, False)
    return ChosenLocation(default_sqlite_path(), True)


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a ``scheme://...`` string (known scheme or not); a
    ``PathLike`` is always a path. Never raises."""
    return isinstance(location, str) and _URL.match(location) is not None


def backend_of(location: str | os.PathLike[str]) -> Backend:
    """Which backend opens ``location`` (see the module docstring). Raises
    ``DatabaseOpenError`` (one sentence, no password) for an empty location (``--db ''``
    names no store, and is not taken for the default one) or a URL of another scheme."""
    if not os.fspath(location).strip():
        raise DatabaseOpenError(
            "The store location is empty; give a SQLite file path or a store URL, or leave it out for the default store."
        )
    if not is_url(location):
        if isinstance(location, str) and KEYWORD_FORM.match(location):
            raise DatabaseOpenError(
                f"{redacted(location)} looks like a PostgreSQL keyword connection string; give it as a URL "
                "instead, such as postgresql://user@host:5432/dbname."
            )
        return "sqlite"
    assert isinstance(location, str)
    match = _URL.match(location)
    assert match is not None
    backend = SCHEMES.get(match.group(1).lower())
    if backend is None:
        known = ", ".join(f"{scheme}://" for scheme in SCHEMES)
        raise DatabaseOpenError(
            f"{describe_location(location)} is not a store cubepi-tui can open: give a SQLite file path "
            f"or a URL starting with {known}."
        )
    return backend


def describe_location(location: str | os.PathLike[str]) -> str:
    """``location`` for a sentence or the status bar: a URL without its password
    (:func:`core.checkpoint.redact.redacted`), a path as given. Never raises."""
    return redacted(location)


async def open_store(
    location: str | os.PathLike[str],
    *,
    create: bool,
    make_parent: bool = False,
    on_busy: Callable[[int], None] | None = None,
    on_status: OnStatus | None = None,
    lock_wait: float | None = None,
    reconnect_wait: float | None = None,
    owner: str | None = None,
) -> Checkpointer:
    """Open the store at ``location`` with the backend its scheme names, for ``owner``.

    ``owner`` is who the store is opened for (:mod:`core.owners`): every read and write
    of the store returned is scoped to that owner's threads; ``None`` is the default
    owner (``CUBEPI_OWNER``, else the OS user), :data:`core.owners.UNOWNED` the threads
    that record none (cubeloop's, and ours from before owners). Every backend gets it.

    ``create``: a missing store (file, database schema, key space) is created with the
    full schema; an older schema opens browse-only either way (``needs_upgrade``).
    SQLite only: ``make_parent`` first creates the file's directory (for the default
    file), ``on_busy(attempt)`` is told each retry of a locked file and ``lock_wait``
    (seconds) bounds those retries (default ``core.checkpoint.sqlite_file.LOCK_WAIT``).
    Servers only: ``on_status`` is told each reconnect attempt and the recovery
    (:mod:`core.checkpoint.reconnect`), and ``reconnect_wait`` (seconds) shortens how long
    a call whose connection broke is retried before ``StoreConnectionError`` (default and
    most: the whole ``RECONNECT_DELAYS``, about 26 s; see ``delays_within``, whose
    ``ValueError`` a wait not above zero raises).

    Raises ``DatabaseOpenError`` (one sentence) for an unknown scheme or a store that
    cannot be opened, ``SchemaError`` for a schema newer than this version knows,
    ``StoreConnectionError`` for a server that stayed unreachable, ``ValueError`` (one
    sentence, :func:`core.owners.resolve_owner`) for an owner name that cannot be one.
    """
    backend = backend_of(location)
    # Checked before any connection, so a bad name is said as itself, not as a store error.
    owner = resolve_owner(owner)
    # Passed only when given, so a backend's own default stays the one rule.
    reconnect = {} if reconnect_wait is None else {"reconnect_delays": delays_within(reconnect_wait)}
    if backend == "postgres":
        from core.checkpoint.postgres import PostgresCheckpointer

        return await PostgresCheckpointer.open(
            _lower_scheme(location), create=create, on_status=on_status, owner=owner, **reconnect
        )
    if backend == "redis":
        from core.checkpoint.redis import RedisCheckpointer

        return await RedisCheckpointer.open(
            _lower_scheme(location), create=create, on_status=on_status, owner=owner, **reconnect
        )
    from core.checkpoint.sqlite import SQLiteCheckpointer

    path = Path(location)
    if make_parent:
        try:
            path.expanduser().parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DatabaseOpenError(f"Cannot create the directory {path.parent}: {error.strerror}.") from None
    waits = {} if lock_wait is None else {"lock_wait": lock_wait}
    return await SQLiteCheckpointer.open(path, create=create, on_busy=on_busy, owner=owner, **waits)


def _lower_scheme(location: str | os.PathLike[str]) -> str:
    """The URL with its scheme in lower case (schemes are case-insensitive, RFC 3986 3.1;
    the drivers compare them exactly)."""
    scheme, _, rest = os.fspath(location).partition("://")
    return f"{scheme.lower()}://{rest}"
