"""Rows of the supervision tables (schema v2, revisions from v3): journal, jobs, leases,
live events, commands.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``
and is one whole transaction, so each public call of
:class:`~core.checkpoint.sqlite.SQLiteCheckpointer` stays one hop. Times are unix seconds
computed by the caller, so every backend stamps them alike.

Owners (:mod:`core.checkpoint.sqlite_owners`): every writer takes the store's ``owner`` and
begins its ``BEGIN IMMEDIATE`` with :func:`~core.checkpoint.sqlite_owners.admit`; every
reader carries :func:`~core.checkpoint.sqlite_owners.owned` in its query. Readers take the
file's :class:`~core.checkpoint.sqlite_schema.Layout` and return ``None`` / empty when the
table is missing (a cubeloop file or our v1, browsed).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from core.checkpoint.base import (
    EDITABLE_STATUS,
    Command,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    check_command_edit,
    check_command_move,
    check_lease_holder,
    command_record_name,
    command_sources,
    lease_held,
    live_event_data,
    lock_wait_credit,
    no_such_command,
    revision_conflict,
)
from core.checkpoint.sqlite_owners import admit, mine_of, owned, this_thread
from core.checkpoint.sqlite_schema import COMMANDS, JOBS, JOURNAL, LEASES, LIVE_EVENTS, Layout, write_txn

BeforeCommit = Callable[[str, sqlite3.Connection], None]
"""A test seam (``SQLiteCheckpointer._before_commit``): called with the write's name and the
connection on the connection thread inside a compare-and-set transaction, after its UPDATE
and before its COMMIT (so it sees the update, which nobody else does yet)."""


class NothingWritten(Exception):
    """Raised inside a write transaction whose statement changed no row, so the transaction
    (with a thread record :func:`~core.checkpoint.sqlite_owners.admit` may have made) rolls
    back; the caller catches it and answers as for a write that found nothing to change."""


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
    owner: str,
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
        admit(c, thread_id, owner, at)
        fence(c, thread_id, holder_id, locked_since)
        c.execute(sql, (thread_id, tool_call_id, tool_name, run_id, *times, job_key))


def read_journal(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> dict[str, JournalEntry] | None:
    """Tool call id -> entry in rowid order, of ``owner``'s thread; ``None`` when the file has
    no journal table."""
    if not layout.has(JOURNAL):
        return None
    rows = c.execute(
        f"SELECT {_JOURNAL_COLUMNS} FROM {JOURNAL} WHERE thread_id = {this_thread(layout)} ORDER BY rowid",
        {"thread": thread_id, "owner": owner},
    )
    return {row[0]: JournalEntry(*row) for row in rows}


# --- jobs ------------------------------------------------------------------------------------

_JOB_COLUMNS = "key, status, result_json, tool_call_id, started_at, finished_at, attempts, revision"


def job_begin(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    key: str,
    tool_call_id: str | None,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> JobRecord:
    """Look up and start ``key`` inside one ``BEGIN IMMEDIATE`` (see ``SQLiteCheckpointer.job_begin``):
    a new record is revision 1, each begin again one more."""
    with write_txn(c):
        now = time.time()
        admit(c, thread_id, owner, now)
        fence(c, thread_id, holder_id, locked_since)
        old = _job(c, thread_id, key)
        if old is not None and old.status == "done":
            return old
        if old is None:
            c.execute(
                f"INSERT INTO {JOBS} (thread_id, key, status, tool_call_id, started_at, attempts, revision)"
                " VALUES (?, ?, 'started', ?, ?, 1, 1)",
                (thread_id, key, tool_call_id, now),
            )
        else:
            c.execute(
                f"UPDATE {JOBS} SET status = 'started', result_json = NULL, finished_at = NULL, started_at = ?,"
                " attempts = attempts + 1, tool_call_id = COALESCE(?, tool_call_id), revision = revision + 1"
                " WHERE thread_id = ? AND key = ?",
                (now, tool_call_id, thread_id, key),
            )
        record = _job(c, thread_id, key)
    assert record is not None
    return record


def job_finish(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    key: str,
    status: str,
    result_json: str,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Record the outcome (revision one more) in one transaction; a ``done`` job stays as it is.
    ``KeyError`` if never begun."""
    with write_txn(c):
        admit(c, thread_id, owner)
        fence(c, thread_id, holder_id, locked_since)
        row = c.execute(f"SELECT status FROM {JOBS} WHERE thread_id = ? AND key = ?", (thread_id, key)).fetchone()
        if row is None:
            raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
        if row[0] == "done":
            return
        c.execute(
            f"UPDATE {JOBS} SET status = ?, result_json = ?, finished_at = ?, revision = revision + 1"
            " WHERE thread_id = ? AND key = ?",
            (status, result_json, time.time(), thread_id, key),
        )


def job_get(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, key: str) -> JobRecord | None:
    """The job under ``key`` of ``owner``'s thread, or ``None`` (also when the file has no jobs table)."""
    if not layout.has(JOBS):
        return None
    revision = "revision" if layout.has(JOBS, "revision") else "1"
    row = c.execute(
        f"SELECT {_JOB_COLUMNS.replace('revision', revision)} FROM {JOBS}"
        f" WHERE thread_id = {this_thread(layout)} AND key = :key",
        {"thread": thread_id, "key": key, "owner": owner},
    ).fetchone()
    return None if row is None else _job_record(row)


def _job(c: sqlite3.Connection, thread_id: str, key: str) -> JobRecord | None:
    """Inside a write transaction, after :func:`~core.checkpoint.sqlite_owners.admit`."""
    row = c.execute(f"SELECT {_JOB_COLUMNS} FROM {JOBS} WHERE thread_id = ? AND key = ?", (thread_id, key)).fetchone()
    return None if row is None else _job_record(row)


def _job_record(row: tuple[Any, ...]) -> JobRecord:
    key, status, result_json, tool_call_id, started_at, finished_at, attempts, revision = row
    result = json.loads(result_json) if result_json is not None else None
    return JobRecord(key, status, result, tool_call_id, started_at, finished_at, attempts, revision)


# --- leases ----------------------------------------------------------------------------------

_LEASE_COLUMNS = "thread_id, holder_id, pid, host, run_id, acquired_at, heartbeat_at, expires_at, revision"


def acquire_lease(
    c: sqlite3.Connection, owner: str, lease: Lease, is_stale: Callable[[Lease], bool], called_at: float
) -> Lease:
    """Read the current lease, decide and upsert inside one ``BEGIN IMMEDIATE``.

    The write lock is held from the read to the commit, so of two processes racing for a
    thread exactly one sees no live lease; the other then sees the winner's. Returns the
    lease as stored: as given, or with its times moved on by the time since ``called_at``
    (unix seconds) when the call waited for the lock (see :func:`lock_wait_shift`), and its
    revision: 1 for a new row, one more than the row it replaces (a takeover, or the same
    holder again).
    """
    with write_txn(c):
        admit(c, lease.thread_id, owner, called_at)
        shift = lock_wait_shift(called_at)
        if shift:
            lease = replace(
                lease,
                acquired_at=lease.acquired_at + shift,
                heartbeat_at=lease.heartbeat_at + shift,
                expires_at=lease.expires_at + shift,
            )
        current = lease_row(c, lease.thread_id)
        if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
            raise lease_held(current)
        lease = replace(lease, revision=1 if current is None else current.revision + 1)
        c.execute(
            f"INSERT OR REPLACE INTO {LEASES} ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _lease_values(lease),
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
    lease = lease_row(c, thread_id)
    now = time.time()
    check_lease_holder(lease, thread_id, holder_id, now, locked_since=locked_since)
    assert lease is not None  # check_lease_holder refuses a missing lease
    credit = lock_wait_credit(lease, now, locked_since)
    if credit:
        c.execute(
            f"UPDATE {LEASES} SET heartbeat_at = heartbeat_at + ?, expires_at = expires_at + ?,"
            " revision = revision + 1 WHERE thread_id = ? AND holder_id = ?",
            (credit, credit, thread_id, holder_id),
        )


def renew_lease(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    holder_id: str,
    heartbeat_at: float,
    expires_at: float,
    called_at: float,
) -> bool:
    """One UPDATE guarded by the holder (revision one more), after the owner's admission:
    ``False`` when another holder took the lease (or none exists; nothing is written then).
    The times move on by the call's wait for the lock (:func:`lock_wait_shift`)."""
    try:
        with write_txn(c):
            admit(c, thread_id, owner, called_at)
            shift = lock_wait_shift(called_at)
            cur = c.execute(
                f"UPDATE {LEASES} SET heartbeat_at = ?, expires_at = ?, revision = revision + 1"
                " WHERE thread_id = ? AND holder_id = ?",
                (heartbeat_at + shift, expires_at + shift, thread_id, holder_id),
            )
            if cur.rowcount != 1:
                raise NothingWritten
    except NothingWritten:
        return False
    return True


def release_lease(c: sqlite3.Connection, owner: str, thread_id: str, holder_id: str) -> None:
    """Delete the lease only if ``holder_id`` holds it (after the owner's admission)."""
    try:
        with write_txn(c):
            admit(c, thread_id, owner)
            cur = c.execute(f"DELETE FROM {LEASES} WHERE thread_id = ? AND holder_id = ?", (thread_id, holder_id))
            if cur.rowcount == 0:
                raise NothingWritten
    except NothingWritten:
        pass


def _lease_columns(layout: Layout) -> str:
    """The lease columns a file has (a v2 file, browsed, keeps no revision: it reads 1)."""
    return _LEASE_COLUMNS if layout.has(LEASES, "revision") else _LEASE_COLUMNS.replace("revision", "1")


def get_lease(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> Lease | None:
    """The lease record of ``owner``'s thread, or ``None``."""
    if not layout.has(LEASES):
        return None
    row = c.execute(
        f"SELECT {_lease_columns(layout)} FROM {LEASES} WHERE thread_id = {this_thread(layout)}",
        {"thread": thread_id, "owner": owner},
    ).fetchone()
    return None if row is None else Lease(*row)


def all_leases(c: sqlite3.Connection, layout: Layout, owner: str, among: str | None = None) -> dict[str, Lease]:
    """Every lease of ``owner``'s threads (or of those ``among`` names: a JSON array of ids)
    by thread id (empty without the table)."""
    if not layout.has(LEASES):
        return {}
    rows = c.execute(
        f"SELECT {_lease_columns(layout)} FROM ({mine_of(layout, among)}) AS mine"
        f" CROSS JOIN {LEASES} USING (thread_id) ORDER BY thread_id",
        {"owner": owner, "among": among},
    )
    return {row[0]: Lease(*row) for row in rows}


def lease_row(c: sqlite3.Connection, thread_id: str) -> Lease | None:
    """The thread's lease, read inside a write transaction after
    :func:`~core.checkpoint.sqlite_owners.admit` (or another owner check)."""
    row = c.execute(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} WHERE thread_id = ?", (thread_id,)).fetchone()
    return None if row is None else Lease(*row)


def _lease_values(lease: Lease) -> tuple[Any, ...]:
    return (
        lease.thread_id,
        lease.holder_id,
        lease.pid,
        lease.host,
        lease.run_id,
        lease.acquired_at,
        lease.heartbeat_at,
        lease.expires_at,
        lease.revision,
    )


# --- live events -----------------------------------------------------------------------------


def append_live_events(
    c: sqlite3.Connection, owner: str, thread_id: str, run_id: str | None, texts: Sequence[str], at: float, keep: int
) -> None:
    """Insert the batch, then delete all but the thread's newest ``keep``, in one transaction.

    The prune is one index probe on ``(thread_id, seq)`` (the ``keep``-th newest seq) and
    a range delete below it, so its cost does not grow with the log.
    """
    with write_txn(c):
        admit(c, thread_id, owner, at)
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


def read_live_events(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, after_seq: int
) -> list[LiveEvent]:
    """Events of ``owner``'s thread with ``seq > after_seq`` in order; a row that is not a
    JSON object is shown, not dropped."""
    if not layout.has(LIVE_EVENTS):
        return []
    rows = c.execute(
        f"SELECT seq, run_id, data_json, at FROM {LIVE_EVENTS}"
        f" WHERE thread_id = {this_thread(layout)} AND seq > :after ORDER BY seq",
        {"thread": thread_id, "after": after_seq, "owner": owner},
    )
    return [LiveEvent(seq, thread_id, run_id, live_event_data(text), at) for seq, run_id, text, at in rows]


def prune_live_events(c: sqlite3.Connection, owner: str, thread_id: str) -> None:
    """Delete every live event of the thread (after the owner's admission); nothing is
    written when it has none."""
    try:
        with write_txn(c):
            admit(c, thread_id, owner)
            if c.execute(f"DELETE FROM {LIVE_EVENTS} WHERE thread_id = ?", (thread_id,)).rowcount == 0:
                raise NothingWritten
    except NothingWritten:
        pass


# --- commands --------------------------------------------------------------------------------

_COMMAND_COLUMNS = "seq, thread_id, kind, text, status, created_at, updated_at, note, revision"


def send_command(c: sqlite3.Connection, owner: str, thread_id: str, kind: str, text: str) -> Command:
    """Insert a ``pending`` command (revision 1) after the owner's admission, in one
    transaction; ``seq`` from the table's AUTOINCREMENT."""
    now = time.time()
    with write_txn(c):
        admit(c, thread_id, owner, now)
        cur = c.execute(
            f"INSERT INTO {COMMANDS} (thread_id, kind, text, status, created_at, updated_at, revision)"
            " VALUES (?, ?, ?, 'pending', ?, ?, 1)",
            (thread_id, kind, text, now, now),
        )
    assert cur.lastrowid is not None
    return Command(cur.lastrowid, thread_id, kind, text, "pending", now, now)  # type: ignore[arg-type]


def update_command(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    seq: int,
    status: str,
    note: str,
    expected_revision: int | None,
    before_commit: BeforeCommit | None = None,
) -> Command:
    """Set status, note and ``updated_at`` and one more revision and return the row, in one
    transaction: one UPDATE whose own condition holds the allowed source statuses, the
    expected revision (when given) and the owner (joined through the command's thread), so
    it changes one row or none. Then, for none: ``KeyError`` when no command ``seq`` is this
    owner's (:func:`~core.checkpoint.base.no_such_command`), ``ConflictError`` for another
    revision, ``CommandTransitionError`` when its status does not allow the move."""
    sources = command_sources(status)
    args = {"seq": seq, "status": status, "note": note, "now": time.time(), "owner": owner}
    args.update({"expected": expected_revision}, **{f"from{i}": s for i, s in enumerate(sources)})
    thread = owned(layout, f"{COMMANDS}.thread_id")
    with write_txn(c):
        moved = c.execute(
            f"UPDATE {COMMANDS} SET status = :status, note = :note, updated_at = :now, revision = revision + 1"
            f" WHERE seq = :seq AND status IN ({','.join(f':from{i}' for i in range(len(sources))) or 'NULL'})"
            f" AND (:expected IS NULL OR revision = :expected) AND {thread}",
            args,
        ).rowcount
        row = c.execute(f"SELECT {_COMMAND_COLUMNS} FROM {COMMANDS} WHERE seq = :seq AND {thread}", args).fetchone()
        if row is None:
            raise no_such_command(seq)
        command = Command(*row)
        if moved and before_commit is not None:
            before_commit("update_command", c)
    if not moved:
        if expected_revision is not None and command.revision != expected_revision:
            raise revision_conflict(command.thread_id, command_record_name(seq), expected_revision, command.revision)
        check_command_move(command, status)
    return command


def edit_command(
    c: sqlite3.Connection, layout: Layout, owner: str, seq: int, text: str, expected_revision: int
) -> Command:
    """Set the text, ``updated_at`` and one more revision of a ``pending`` command at
    ``expected_revision`` and return the row, in one transaction: one UPDATE whose own
    condition holds the status, the revision and the owner, so it changes one row or none.
    Then, for none: ``KeyError`` (no such command of this owner), ``ConflictError`` (another
    revision), ``CommandTransitionError`` (no longer pending)."""
    args = {"seq": seq, "text": text, "now": time.time(), "owner": owner}
    args.update(expected=expected_revision, editable=EDITABLE_STATUS)
    thread = owned(layout, f"{COMMANDS}.thread_id")
    with write_txn(c):
        moved = c.execute(
            f"UPDATE {COMMANDS} SET text = :text, updated_at = :now, revision = revision + 1"
            f" WHERE seq = :seq AND status = :editable AND revision = :expected AND {thread}",
            args,
        ).rowcount
        row = c.execute(f"SELECT {_COMMAND_COLUMNS} FROM {COMMANDS} WHERE seq = :seq AND {thread}", args).fetchone()
        if row is None:
            raise no_such_command(seq)
        command = Command(*row)
    if not moved:
        if command.revision != expected_revision:
            raise revision_conflict(command.thread_id, command_record_name(seq), expected_revision, command.revision)
        check_command_edit(command)
    return command


def list_commands(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, statuses: Sequence[str] | None, after: int = 0
) -> list[Command]:
    """The commands of ``owner``'s thread with ``seq > after`` in seq order, optionally only
    those in ``statuses`` (index on thread, status)."""
    if not layout.has(COMMANDS):
        return []
    columns = _COMMAND_COLUMNS if layout.has(COMMANDS, "revision") else _COMMAND_COLUMNS.replace("revision", "1")
    sql = f"SELECT {columns} FROM {COMMANDS} WHERE thread_id = {this_thread(layout)} AND seq > :after"
    args: dict[str, Any] = {"thread": thread_id, "after": after, "owner": owner}
    if statuses is not None:
        sql += f" AND status IN ({','.join(f':s{i}' for i in range(len(statuses)))})" if statuses else " AND 0"
        args.update({f"s{i}": s for i, s in enumerate(statuses)})
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
