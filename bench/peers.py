"""Which peers are installed, and what each side's SQLite durability is.

The peers come with the ``bench`` extra (``pip install -e '.[bench]'``): cubeloop 0.15.3
(also in the test extra) and LangGraph with its SQLite checkpointer. A missing one is one
sentence saying how to install it (:func:`missing`), never a traceback.

Durability is read from each side's own connection (:func:`pragmas`): SQLite's
``journal_mode`` and ``synchronous``. Ours is WAL with ``synchronous=NORMAL`` by default
and FULL when opened ``durable``; cubeloop 0.15.3 leaves SQLite's defaults (rollback
journal ``delete``, ``synchronous=FULL``); LangGraph's saver sets WAL and leaves
``synchronous`` at SQLite's default (FULL). To compare at equal durability,
:func:`set_durability` sets both pragmas on a peer's connection (neither peer has an
option for it).
"""

from __future__ import annotations

import importlib
import sqlite3
from dataclasses import dataclass
from typing import Any

INSTALL = "install it with: .venv/bin/pip install -e '.[bench]'"
"""How to get every peer (the ``bench`` extra of pyproject.toml)."""

PEERS = {
    "cubeloop": ("cubeloop", "cubeloop 0.15.3"),
    "langgraph": ("langgraph.checkpoint.sqlite.aio", "LangGraph (langgraph + langgraph-checkpoint-sqlite)"),
}
"""Peer name -> (module that must import, the words for it)."""

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
"""SQLite's ``PRAGMA synchronous`` values (https://sqlite.org/pragma.html#pragma_synchronous)."""


def missing(peer: str) -> str | None:
    """One sentence when ``peer`` (a key of :data:`PEERS`) cannot be imported, else ``None``."""
    module, words = PEERS[peer]
    if peer in _known:
        return _known[peer]
    try:
        importlib.import_module(module)
    except ImportError:  # not installed, or a part of it missing (a broken install reads the same)
        _known[peer] = f"{words} is not installed; {INSTALL}"
    else:
        _known[peer] = None
    return _known[peer]


_known: dict[str, str | None] = {}  # peer -> missing()'s answer: a failed import is not retried


def absent(peer: str) -> str | None:
    """A figure's short words for a missing ``peer`` (the header prints :func:`missing`'s sentence)."""
    return f"{PEERS[peer][1]}: not installed (see above)" if missing(peer) else None


@dataclass(frozen=True, slots=True)
class Durability:
    """A SQLite connection's ``journal_mode`` (``"wal"``, ``"delete"``...) and ``synchronous``."""

    journal_mode: str
    synchronous: str

    def __str__(self) -> str:
        return f"journal_mode={self.journal_mode}, synchronous={self.synchronous}"


def read_durability(connection: sqlite3.Connection) -> Durability:
    """The durability pragmas of a plain ``sqlite3`` connection."""
    mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    sync = connection.execute("PRAGMA synchronous").fetchone()[0]
    return Durability(str(mode).lower(), SYNCHRONOUS.get(int(sync), str(sync)))


async def pragmas(connection: Any) -> Durability:
    """The durability pragmas of an ``aiosqlite`` connection (cubeloop's, LangGraph's)."""
    cursor = await connection.execute("PRAGMA journal_mode")
    mode = (await cursor.fetchone())[0]
    cursor = await connection.execute("PRAGMA synchronous")
    sync = (await cursor.fetchone())[0]
    return Durability(str(mode).lower(), SYNCHRONOUS.get(int(sync), str(sync)))


async def set_durability(connection: Any, *, wal: bool, synchronous: str) -> Durability:
    """Set ``journal_mode`` (WAL or the rollback journal ``delete``) and ``synchronous``
    (``"FULL"`` or ``"NORMAL"``) on an ``aiosqlite`` connection; return what it then reads.
    Raises ``ValueError`` for another ``synchronous`` word."""
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous is FULL or NORMAL here, not {synchronous!r}.")
    await connection.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}")
    await connection.execute(f"PRAGMA synchronous={synchronous}")
    return await pragmas(connection)


async def our_durability(store: Any) -> Durability:
    """The pragmas of our SQLite store's own connection (read through its connection thread)."""
    return await store._run(read_durability, "open")  # the store's one way onto its connection
