"""Rows of the supervision tables (schema v2): journal, jobs, leases, live events, commands.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``
and is one whole transaction (or one statement, which SQLite makes its own transaction),
so each public call of :class:`~core.checkpoint.sqlite.SQLiteCheckpointer` stays one hop.
Times are unix seconds computed by the caller, so every backend stamps them alike.

Readers take the file's :class:`~core.checkpoint.sqlite_schema.Layout` and return
``None`` / empty when the table is missing (a cubeloop file or our v1, browsed).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from core.checkpoint.base import (
    Command,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    check_command_move,
    check_lease_holder,
    command_sources,
    live_event_data,
    lock_wait_credit,
)
from core.checkpoint.sqlite_schema import COMMANDS, JOBS, JOURNAL, LEASES, LIVE_EVENTS, Layout, write_txn
from core.errors import RunAlreadyClaimedError

# --- argument checks (before any hop, so a bad call writes nothing) --------------------------


# --- tool journal ----------------------------------------------------------------------------

_JOURNAL_COLUMNS = "tool_call_id, tool_name, run_id, started_at, ended_at, job_key"
# Given values win; an empty name / NULL keeps what the other phase wrote. A start (again,
# when a resume re-runs the call) clears an old end.
_JOURNAL_UPSERT = (
    f"INSERT INTO {JOURNAL} (thread_id, {_JOURNAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET"
    " tool_name = CASE WHEN excluded.tool_name <> '' THEN excluded.tool_name ELSE tool_name END,"
    " run_id = COALESCE(excluded.run_id, run_id), job_key = COALESCE(excluded.job_key, job_key),"
)


def record_tool_event(
    c: sqlite3.Connection,
    thread_id: str,
    tool_call_id: str,
    phase: str,
    tool_name: str,
    run_id: str | None,
    job_key: str | None,
    at: float,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Upsert the journal entry for one phase, fenced by ``holder_id``, in one transaction."""
    if phase == "start":
        sql = _JOURNAL_UPSERT + " started_at = excluded.started_at, ended_at = NULL"
        times = (at, None)
    else:
        sql = _JOURNAL_UPSERT + " ended_at = excluded.ended_at"
        times = (None, at)
    with write_txn(c):
        fence(c, thread_id, holder_id, locked_since)
        c.execute(sql, (thread_id, tool_call_id, tool_name, run_id, *times, job_key))


def read_journal(c: sqlite3.Connection, layout: Layout, thread_id: str) -> dict[str, JournalEntry] | None:
    """Tool call id -> entry in rowid order; ``None`` when the file has no journal table."""
    if not layout.has(JOURNAL):
        return None
    rows = c.execute(f"SELECT {_JOURNAL_COLUMNS} FROM {JOURNAL} WHERE thread_id = ? ORDER BY rowid", (thread_id,))
    return {row[0]: JournalEntry(*row) for row in rows}


# --- jobs ------------------------------------------------------------------------------------

_JOB_COLUMNS = "key, status, result_json, tool_call_id, started_at, finished_at, attempts"


def job_begin(
    c: sqlite3.Connection,
    thread_id: str,
    key: str,
    tool_call_id: str | None,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> JobRecord:
    """Look up and start ``key`` inside one ``BEGIN IMMEDIATE`` (see ``SQLiteCheckpointer.job_begin``)."""
    with write_txn(c):
        fence(c, thread_id, holder_id, locked_since)
        old = _job(c, thread_id, key)
        if old is not None and old.status == "done":
            return old
        now = time.time()
        if old is None:
            c.execute(
                f"INSERT INTO {JOBS} (thread_id, key, status, tool_call_id, started_at, attempts)"
                " VALUES (?, ?, 'started', ?, ?, 1)",
                (thread_id, key, tool_call_id, now),
            )
        else:
            c.execute(
                f"UPDATE {JOBS} SET status = 'started', result_json = NULL, finished_at = NULL, started_at = ?,"
                " attempts = attempts + 1, tool_call_id = COALESCE(?, tool_call_id) WHERE thread_id = ? AND key = ?",
                (now, tool_call_id, thread_id, key),
            )
        record = _job(c, thread_id, key)
    assert record is not None
    return record


def job_finish(
    c: sqlite3.Connection,
    thread_id: str,
    key: str,
    status: str,
    result_json: str,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Record the outcome in one transaction; a ``done`` job stays as it is. ``KeyError`` if never begun."""
    with write_txn(c):
        fence(c, thread_id, holder_id, locked_since)
        row = c.execute(f"SELECT status FROM {JOBS} WHERE thread_id = ? AND key = ?", (thread_id, key)).fetchone()
        if row is None:
            raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
        if row[0] == "done":
            return
        c.execute(
            f"UPDATE {JOBS} SET status = ?, result_json = ?, finished_at = ? WHERE thread_id = ? AND key = ?",
            (status, result_json, time.time(), thread_id, key),
        )


def job_get(c: sqlite3.Connection, layout: Layout, thread_id: str, key: str) -> JobRecord | None:
    """The job under ``key``, or ``None`` (also when the file has no jobs table)."""
    return _job(c, thread_id, key) if layout.has(JOBS) else None


def _job(c: sqlite3.Connection, thread_id: str, key: str) -> JobRecord | None:
    row = c.execute(f"SELECT {_JOB_COLUMNS} FROM {JOBS} WHERE thread_id = ? AND key = ?", (thread_id, key)).fetchone()
    if row is None:
        return None
    key, status, result_json, tool_call_id, started_at, finished_at, attempts = row
    result = json.loads(result_json) if result_json is not None else None
    return JobRecord(key, status, result, tool_call_id, started_at, finished_at, attempts)


# --- leases ----------------------------------------------------------------------------------

_LEASE_COLUMNS = "thread_id, holder_id, pid, host, run_id, acquired_at, heartbeat_at, expires_at"


def acquire_lease(c: sqlite3.Connection, lease: Lease, is_stale: Callable[[Lease], bool], called_at: float) -> Lease:
    """Read the current lease, decide and upsert inside one ``BEGIN IMMEDIATE``.

    The write lock is held from the read to the commit, so of two processes racing for a
    thread exactly one sees no live lease; the other then sees the winner's. Returns the
    lease as stored: as given, or with its times moved on by the time since ``called_at``
    (unix seconds) when the call waited for the lock (see :func:`lock_wait_shift`).
    """
    with write_txn(c):
        shift = lock_wait_shift(called_at)
        if shift:
            lease = replace(
                lease,
                acquired_at=lease.acquired_at + shift,
                heartbeat_at=lease.heartbeat_at + shift,
                expires_at=lease.expires_at + shift,
            )
        current = _lease(c, lease.thread_id)
        if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
            raise RunAlreadyClaimedError(lease_refusal(current), lease=current)
        c.execute(
            f"INSERT OR REPLACE INTO {LEASES} ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _lease_row(lease)
        )
    return lease


LEASE_SHIFT_MIN = 1.0
"""Seconds of waiting for a lock from which a lease's times are moved on (a shorter wait
is nothing next to a 15 s time to live and a 2 s heartbeat)."""


def lock_wait_shift(called_at: float) -> float:
    """Seconds a lease write waited since ``called_at`` (unix seconds, taken when the store
    method was called), inside its transaction; 0 below ``LEASE_SHIFT_MIN``.

    The caller stamps a lease's times just before the call, which may then wait up to
    ``LOCK_WAIT`` for another program's write lock; written as given, a lease taken or
    renewed after a 14 s wait would have about 1 s left and expire before the next
    heartbeat. Moved on by the wait, its time to live counts from the write."""
    waited = time.time() - called_at
    return waited if waited >= LEASE_SHIFT_MIN else 0.0


def fence(c: sqlite3.Connection, thread_id: str, holder_id: str | None, locked_since: float | None = None) -> None:
    """Inside a write transaction: raise ``LeaseLostError`` unless the write is unfenced
    (``holder_id`` is ``None``) or ``holder_id`` holds the thread's live lease.

    ``locked_since`` (unix seconds): when the store began finding the file locked by
    another program, if it still was until this write. A lease of ``holder_id`` that
    expired during that wait is still its own (:func:`~core.checkpoint.base.lock_wait_credit`);
    its heartbeat and expiry are moved on by the wait here, compare-and-set on the holder.
    """
    if holder_id is None:
        return
    lease = _lease(c, thread_id)
    now = time.time()
    check_lease_holder(lease, thread_id, holder_id, now, locked_since=locked_since)
    assert lease is not None  # check_lease_holder refuses a missing lease
    credit = lock_wait_credit(lease, now, locked_since)
    if credit:
        c.execute(
            f"UPDATE {LEASES} SET heartbeat_at = heartbeat_at + ?, expires_at = expires_at + ?"
            " WHERE thread_id = ? AND holder_id = ?",
            (credit, credit, thread_id, holder_id),
        )


def renew_lease(
    c: sqlite3.Connection, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float, called_at: float
) -> bool:
    """One UPDATE guarded by the holder: ``False`` when another holder took the lease (or none
    exists). The times move on by the call's wait for the lock (:func:`lock_wait_shift`)."""
    shift = lock_wait_shift(called_at)
    cur = c.execute(
        f"UPDATE {LEASES} SET heartbeat_at = ?, expires_at = ? WHERE thread_id = ? AND holder_id = ?",
        (heartbeat_at + shift, expires_at + shift, thread_id, holder_id),
    )
    return cur.rowcount == 1


def release_lease(c: sqlite3.Connection, thread_id: str, holder_id: str) -> None:
    """Delete the lease only if ``holder_id`` holds it."""
    c.execute(f"DELETE FROM {LEASES} WHERE thread_id = ? AND holder_id = ?", (thread_id, holder_id))


def get_lease(c: sqlite3.Connection, layout: Layout, thread_id: str) -> Lease | None:
    """The thread's lease record, or ``None``."""
    return _lease(c, thread_id) if layout.has(LEASES) else None


def all_leases(c: sqlite3.Connection, layout: Layout) -> dict[str, Lease]:
    """Every lease by thread id (empty without the table)."""
    if not layout.has(LEASES):
        return {}
    return {row[0]: Lease(*row) for row in c.execute(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} ORDER BY thread_id")}


def lease_refusal(current: Lease, now: float | None = None) -> str:
    """The one sentence ``acquire_lease`` raises when ``current`` is live and someone else's."""
    ago = max(0.0, (time.time() if now is None else now) - current.heartbeat_at)
    return (
        f"Thread {current.thread_id} is already running "
        f"(holder pid {current.pid} on {current.host}, heartbeat {ago:.0f}s ago)."
    )


def _lease(c: sqlite3.Connection, thread_id: str) -> Lease | None:
    row = c.execute(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} WHERE thread_id = ?", (thread_id,)).fetchone()
    return None if row is None else Lease(*row)


def _lease_row(lease: Lease) -> tuple[Any, ...]:
    return (
        lease.thread_id,
        lease.holder_id,
        lease.pid,
        lease.host,
        lease.run_id,
        lease.acquired_at,
        lease.heartbeat_at,
        lease.expires_at,
    )


# --- live events -----------------------------------------------------------------------------


def append_live_events(
    c: sqlite3.Connection, thread_id: str, run_id: str | None, texts: Sequence[str], at: float, keep: int
) -> None:
    """Insert the batch, then delete all but the thread's newest ``keep``, in one transaction.

    The prune is one index probe on ``(thread_id, seq)`` (the ``keep``-th newest seq) and
    a range delete below it, so its cost does not grow with the log.
    """
    with write_txn(c):
        c.executemany(
            f"INSERT INTO {LIVE_EVENTS} (thread_id, run_id, data_json, at) VALUES (?, ?, ?, ?)",
            [(thread_id, run_id, text, at) for text in texts],
        )
        if keep <= 0:
            c.execute(f"DELETE FROM {LIVE_EVENTS} WHERE thread_id = ?", (thread_id,))
            return
        c.execute(
            f"DELETE FROM {LIVE_EVENTS} WHERE thread_id = ? AND seq <= (SELECT seq FROM {LIVE_EVENTS}"
            " WHERE thread_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (thread_id, thread_id, keep),
        )


def read_live_events(c: sqlite3.Connection, layout: Layout, thread_id: str, after_seq: int) -> list[LiveEvent]:
    """Events with ``seq > after_seq`` in order; a row that is not a JSON object is shown, not dropped."""
    if not layout.has(LIVE_EVENTS):
        return []
    rows = c.execute(
        f"SELECT seq, run_id, data_json, at FROM {LIVE_EVENTS} WHERE thread_id = ? AND seq > ? ORDER BY seq",
        (thread_id, after_seq),
    )
    return [LiveEvent(seq, thread_id, run_id, live_event_data(text), at) for seq, run_id, text, at in rows]


def prune_live_events(c: sqlite3.Connection, thread_id: str) -> None:
    """Delete every live event of the thread."""
    c.execute(f"DELETE FROM {LIVE_EVENTS} WHERE thread_id = ?", (thread_id,))


# --- commands --------------------------------------------------------------------------------

_COMMAND_COLUMNS = "seq, thread_id, kind, text, status, created_at, updated_at, note"


def send_command(c: sqlite3.Connection, thread_id: str, kind: str, text: str) -> Command:
    """Insert a ``pending`` command; one statement, ``seq`` from the table's AUTOINCREMENT."""
    now = time.time()
    cur = c.execute(
        f"INSERT INTO {COMMANDS} (thread_id, kind, text, status, created_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?)",
        (thread_id, kind, text, now, now),
    )
    assert cur.lastrowid is not None
    return Command(cur.lastrowid, thread_id, kind, text, "pending", now, now)  # type: ignore[arg-type]


def update_command(c: sqlite3.Connection, seq: int, status: str, note: str) -> Command:
    """Set status, note and ``updated_at`` and return the row, in one transaction, only from
    a status that allows it (the UPDATE's own condition); ``KeyError`` if unknown,
    ``CommandTransitionError`` if its status does not allow the move."""
    sources = command_sources(status)
    with write_txn(c):
        moved = c.execute(
            f"UPDATE {COMMANDS} SET status = ?, note = ?, updated_at = ? WHERE seq = ?"
            f" AND status IN ({','.join('?' * len(sources))})",
            (status, note, time.time(), seq, *sources),
        ).rowcount
        row = c.execute(f"SELECT {_COMMAND_COLUMNS} FROM {COMMANDS} WHERE seq = ?", (seq,)).fetchone()
        if row is None:
            raise KeyError(f"There is no command {seq}.")
    command = Command(*row)
    if not moved:
        check_command_move(command, status)
    return command


def list_commands(
    c: sqlite3.Connection, layout: Layout, thread_id: str, statuses: Sequence[str] | None, after: int = 0
) -> list[Command]:
    """The thread's commands with ``seq > after`` in seq order, optionally only those in
    ``statuses`` (index on thread, status)."""
    if not layout.has(COMMANDS):
        return []
    sql, args = f"SELECT {_COMMAND_COLUMNS} FROM {COMMANDS} WHERE thread_id = ? AND seq > ?", [thread_id, after]
    if statuses is not None:
        sql += f" AND status IN ({','.join('?' * len(statuses))})" if statuses else " AND 0"
        args += list(statuses)
    return [Command(*row) for row in c.execute(sql + " ORDER BY seq", args)]


# --- change token ----------------------------------------------------------------------------


def change_token(c: sqlite3.Connection) -> tuple[int, int]:
    """``(PRAGMA data_version, total_changes)`` of this connection.

    ``data_version`` changes when *another* connection (any process) commits, but never
    for this connection's own writes; ``total_changes`` counts the rows this connection
    inserted, updated or deleted. Together they change on every commit by anyone, cost
    no table read, and never change for a read.
    """
    return c.execute("PRAGMA data_version").fetchone()[0], c.total_changes
