"""Who may use a store's SQLite connection now: its own thread (aiosqlite's, every call
queued there in order) or, for a short write while nothing is queued, the caller's thread.

Why a short write runs where it is called: a call through aiosqlite's thread costs two
thread wake-ups (the connection thread's, then the event loop's), and on this 2-core VM
waking an idle virtual CPU is slow. Measured (``bench`` "append 1 message after 10,000
rows", and the pieces alone, one process): on the idle machine the hop alone was ~76 µs
of a ~136 µs append (its SQL ~25 µs); with the other core busy the same hop took ~14 µs.
An append's whole transaction is shorter than either hop, so waiting for a hop costs the
caller more than doing the work.

The rules that keep this as safe as the queue:

* order: a call runs in place only when no call of this gate is queued or running
  (:attr:`Gate.pending` is 0), so a write never overtakes one called before it;
* one user at a time: a call runs (in place or on the connection thread) only while it
  holds :attr:`Gate.busy`, so a call queued from another thread meanwhile waits for it;
* never block the caller on another process: SQLite's busy timeout is 0 for a call in
  place, and the caller sends a call that found the file locked to the queue (which waits
  and retries);
* no fsync on the caller's thread: only for a file whose commits do none (WAL with
  ``synchronous=NORMAL``; the caller knows its settings), and with SQLite's automatic
  checkpoint off for the call, since a checkpoint syncs the database file (measured, 6,000
  appends in place with it on: 21 over 1 ms, up to 4.6 ms, against 1 over 1 ms with it
  off); the caller runs the checkpoint on the connection thread instead once
  :attr:`Gate.checkpoint_due` (every :data:`CHECKPOINT_EVERY` writes in place, or after
  each while a reader keeps one from copying every frame back).

The connection must be opened with ``check_same_thread=False`` (aiosqlite's thread made it).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

T = TypeVar("T")

CHECKPOINT_EVERY = 100
"""Writes in place between two checkpoints on the connection thread. SQLite checkpoints by
itself once the WAL holds 1,000 pages (``wal_autocheckpoint``'s default); a short write
adds a few pages, so this keeps the WAL near what SQLite would keep."""

AUTOCHECKPOINT_PAGES = 1000
"""SQLite's default ``wal_autocheckpoint`` (https://www.sqlite.org/pragma.html#pragma_wal_autocheckpoint),
restored after each write in place; this project never sets another."""

NOT_RUN: Any = object()
"""What :meth:`Gate.in_place` gives when the call was not run (something is queued or
running): queue it instead."""


class Gate:
    """The count of queued calls and the lock on the connection, for one store's connection."""

    def __init__(self, busy_timeout: float) -> None:
        """``busy_timeout``: the connection's own busy timeout (seconds), restored after a call in place."""
        self._state = threading.Lock()
        self.busy = threading.Lock()
        """Held by whichever thread is using the connection."""
        self.pending = 0
        """Calls queued on the connection thread and not yet finished."""
        self._restore = f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}"
        self.in_place_writes = 0
        """Writes run in place since the last :meth:`checkpointed`."""

    async def queued(self, db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:func:`call` of ``fn``, counted in :attr:`pending` until it has run, holding :attr:`busy` while it runs."""
        with self._state:
            self.pending += 1

        def run(c: sqlite3.Connection) -> T:
            try:
                with self.busy:
                    return fn(c)
            finally:
                with self._state:
                    self.pending -= 1

        return await call(db, run)

    def in_place(self, db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on this thread now, with SQLite's busy timeout at 0, if
        nothing is queued or running; else :data:`NOT_RUN`. Raises what ``fn`` raises: a
        file locked by another connection raises at once (SQLITE_BUSY); ``fn``'s own
        transaction (``write_txn``) has then left no trace, and the caller queues it."""
        with self._state:
            if self.pending or not self.busy.acquire(blocking=False):
                return NOT_RUN  # type: ignore[no-any-return]
        try:
            conn = db._conn
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            try:
                result = fn(conn)
            finally:
                conn.execute(self._restore)
                conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
            self.in_place_writes += 1
            return result
        finally:
            self.busy.release()

    @property
    def checkpoint_due(self) -> bool:
        """Whether the caller should queue a WAL checkpoint now (see the module docstring)."""
        return self.in_place_writes >= CHECKPOINT_EVERY

    def checkpointed(self, log_frames: int, backfilled: int) -> None:
        """A checkpoint ran (``PRAGMA wal_checkpoint(PASSIVE)``'s frame counts): count
        writes in place from 0 again, unless it could not copy every frame back (a reader
        of another connection held an older snapshot). Then the next write in place asks
        for another, as SQLite's own checkpoint is tried at every commit past its
        threshold. Measured (60,000 appends of ~200 bytes while another connection holds
        0.5 s read snapshots with 50 ms between them): the WAL peaked at ~802 MB with one
        checkpoint every 100 writes whatever became of it, ~45 MB with this rule, ~55 MB
        with every append queued and SQLite's own checkpoint."""
        self.in_place_writes = 0 if backfilled >= log_frames else CHECKPOINT_EVERY


async def call(db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(connection)`` on aiosqlite's connection thread in one hop.

    aiosqlite's public calls cost one thread hop each; a whole transaction in one queued
    function keeps an append to one hop. ``_execute`` and ``_conn`` are the queue and
    connection every public aiosqlite call goes through.

    The result crosses in a one-item list emptied here: aiosqlite's worker keeps the value
    its last function returned (a local) until its next function returns, so a result
    handed over as is stays alive after its caller dropped it and is freed on the
    connection thread, inside whichever call comes next. Measured (``load`` of a
    10,000-message thread 25 times, each result dropped before the next call; CPU ms,
    medians, three runs each on a busy 2-core machine): 85-95 handed over as is, 64-69
    through the list, and dropping a result then costs its caller 16-21.
    """
    box = await db._execute(lambda: [fn(db._conn)])
    return box.pop()
