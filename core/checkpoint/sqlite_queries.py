"""Rows of cubeloop's tables: loading, appending, extra, runs (the listing: :mod:`core.checkpoint.sqlite_listing`).

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``
and is one whole transaction, so each public call of
:class:`~core.checkpoint.sqlite.SQLiteCheckpointer` stays one hop. Decoding happens here
too, one row per validator call, so the event loop keeps getting the GIL during long loads.

Every read carries the owner predicate (:func:`~core.checkpoint.sqlite_owners.owned`) in
its own query and every write begins with :func:`~core.checkpoint.sqlite_owners.admit`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from core.checkpoint import codec
from core.checkpoint.base import (
    EXTRA_RECORD,
    CheckpointData,
    CorruptRow,
    PendingRequest,
    RunRecord,
    extra_not_object,
    parse_extra,
    revision_conflict,
    run_completed_append,
    run_never_claimed,
    run_taken,
)
from core.checkpoint.sqlite_answers import answer_stored
from core.checkpoint.sqlite_owners import admit, mine_of, this_thread
from core.checkpoint.sqlite_records import read_meta
from core.checkpoint.sqlite_schema import RECORDS, Layout, read_txn, write_txn
from core.checkpoint.sqlite_supervised import BeforeCommit, fence, read_journal
from core.messages import AnyMessage

_JD_UNIX_EPOCH = 2440587.5
_EXTRA_ROW = "thread_extra"  # how an unreadable extra names its row (its table, as cubeloop's file has it)


def julianday_to_unix(jd: float | None) -> float | None:
    """Convert a SQLite ``julianday()`` REAL (days) to unix seconds; ``None`` stays ``None``."""
    return None if jd is None else (jd - _JD_UNIX_EPOCH) * 86400.0


# --- the Checkpointer calls ------------------------------------------------------------------


def load(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, after_id: int | None = None
) -> CheckpointData | None:
    """Messages in row-id order (only ids above ``after_id`` when given), extra, runs, the
    tool journal and the thread's record, of ``owner``'s thread, from one read snapshot;
    another owner's thread reads as a missing one (every query carries the owner)."""
    args = {"thread": thread_id, "owner": owner, "after": -1 if after_id is None else after_id}
    mine = this_thread(layout)
    # The fetch too: its row tuples would otherwise start a young collection every 700.
    with codec.gc_paused():
        with read_txn(c):
            rows = (
                c.execute(
                    "SELECT id, CAST(message_json AS BLOB) FROM messages"
                    f" WHERE thread_id = {mine} AND id > :after ORDER BY id",
                    args,
                ).fetchall()
                if layout.has("messages")
                else []
            )
            data, found = thread_parts(c, layout, owner, thread_id)
        if after_id is None and not rows and not found:
            return None  # an unknown thread (an incremental read answers with empty data instead)
        data.messages, data.message_ids, problems = decode_rows(rows, thread_id)
    data.problems[:0] = problems
    return data


def thread_parts(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> tuple[CheckpointData, bool]:
    """Inside the caller's read transaction, everything :func:`load` reads of ``owner``'s
    thread but its messages: extra, runs, journal, pending request and record, with the
    problems of an unreadable record or extra; and whether the thread has an extra or runs
    (with no message rows either, it does not exist)."""
    args = {"thread": thread_id, "owner": owner}
    mine = this_thread(layout)
    extra_row = None
    if layout.has("thread_extra"):
        parent = "parent_thread_id" if layout.has("thread_extra", "parent_thread_id") else "NULL"
        extra_row = c.execute(
            f"SELECT extra_json, {parent} FROM thread_extra WHERE thread_id = {mine}", args
        ).fetchone()
    runs = [run for _, run in runs_of(c, layout, owner, thread_id)]
    journal = read_journal(c, layout, owner, thread_id)
    pending = pending_requests(c, layout, owner, thread_id).get(thread_id)
    meta, extra_revision, unreadable = read_meta(c, layout, owner, thread_id)
    data = CheckpointData(runs=runs, journal=journal, pending_request=pending, extra_revision=extra_revision, meta=meta)
    if unreadable is not None:  # shown, kept; the thread still loads
        data.problems.append(unreadable)
    if extra_row is not None:
        data.parent_thread_id = extra_row[1]
        data.extra, problem = parse_extra(extra_row[0], thread_id, _EXTRA_ROW)
        if problem is not None:
            data.problems.append(problem)
    return data, extra_row is not None or bool(runs)


def append(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    rows: Sequence[tuple[str, str, str | None]],
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Insert ``(thread_id, json, run_id)`` rows in one transaction, unless the thread is not
    ``owner``'s, a run named is completed or ``holder_id`` (when given) no longer holds the
    thread's live lease."""
    run_ids = sorted({r[2] for r in rows if r[2] is not None})
    with write_txn(c):
        admit(c, thread_id, owner)
        fence(c, thread_id, holder_id, locked_since)
        if run_ids:
            marks = ",".join("?" * len(run_ids))
            done = c.execute(
                f"SELECT run_id FROM runs WHERE thread_id = ? AND run_id IN ({marks}) AND completed_at IS NOT NULL",
                (thread_id, *run_ids),
            ).fetchall()
            if done:
                raise run_completed_append(thread_id, done[0][0])
        c.executemany("INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)", rows)


def save_extra(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    patch: dict[str, Any],
    expected_revision: int | None = None,
    before_commit: BeforeCommit | None = None,
) -> int:
    """Read, merge and write the extra object and one more extra revision inside one
    ``BEGIN IMMEDIATE``; return the new revision. The revision is one compare-and-set UPDATE
    of the thread's record (``WHERE extra_revision = expected``, when given) whose row count
    must be 1, else ``ConflictError`` and nothing is written."""
    with write_txn(c):
        admit(c, thread_id, owner)
        args = {"thread": thread_id, "expected": expected_revision}
        bumped = c.execute(
            f"UPDATE {RECORDS} SET extra_revision = extra_revision + 1"
            " WHERE thread_id = :thread AND (:expected IS NULL OR extra_revision = :expected)"
            " RETURNING extra_revision",
            args,
        ).fetchall()
        if len(bumped) != 1:
            actual = c.execute(f"SELECT extra_revision FROM {RECORDS} WHERE thread_id = :thread", args).fetchone()
            raise revision_conflict(thread_id, EXTRA_RECORD, expected_revision, actual[0] if actual else None)
        row = c.execute("SELECT extra_json FROM thread_extra WHERE thread_id = ?", (thread_id,)).fetchone()
        if row is None:
            c.execute(
                "INSERT INTO thread_extra (thread_id, extra_json) VALUES (?, ?)",
                (thread_id, codec.encode_extra(patch)),
            )
        else:
            current, problem = parse_extra(row[0], thread_id, _EXTRA_ROW)
            if problem is not None:
                raise extra_not_object(thread_id, _EXTRA_ROW)
            current.update(patch)
            c.execute(
                "UPDATE thread_extra SET extra_json = ? WHERE thread_id = ?",
                (codec.encode_extra(current), thread_id),
            )
        if before_commit is not None:
            before_commit("save_extra", c)
    return int(bumped[0][0])


def pending_requests(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str | None, among: str | None = None
) -> dict[str, PendingRequest]:
    """cubeloop's ``thread_pending_request`` rows of ``owner``'s threads (of one thread, or
    with ``None`` of all, or of those ``among`` names: a JSON array of ids) by thread id,
    each with whether its answer is stored (in the same query); read only, the row is
    never changed here."""
    if not layout.has("thread_pending_request"):
        return {}
    run = "p.run_id" if layout.has("thread_pending_request", "run_id") else "NULL"
    sql = f"SELECT p.thread_id, p.request_json, {run}, p.created_at, {answer_stored(layout, 'p', run)} FROM "
    args = {"thread": thread_id, "owner": owner, "among": among}
    if thread_id is not None:
        sql += f"thread_pending_request AS p WHERE p.thread_id = {this_thread(layout)}"
    else:
        sql += (
            f"({mine_of(layout, among)}) AS mine CROSS JOIN thread_pending_request AS p ON p.thread_id = mine.thread_id"
        )
    return {
        tid: PendingRequest(
            str(raw), run_id, julianday_to_unix(created) if isinstance(created, (int, float)) else None, bool(answered)
        )
        for tid, raw, run_id, created, answered in c.execute(sql, args)
    }


def save_pending_request(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    request_json: str | None,
    run_id: str | None,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Set or clear the thread's pending request in one transaction, as cubeloop's
    ``save_pending_request`` does (``INSERT OR REPLACE`` / ``DELETE``: one request per
    thread, replaced by the next one asked), after the owner's admission and the lease fence."""
    with write_txn(c):
        admit(c, thread_id, owner)
        fence(c, thread_id, holder_id, locked_since)
        if request_json is None:
            c.execute("DELETE FROM thread_pending_request WHERE thread_id = ?", (thread_id,))
        else:
            c.execute(
                "INSERT OR REPLACE INTO thread_pending_request (thread_id, request_json, run_id) VALUES (?, ?, ?)",
                (thread_id, request_json, run_id),
            )


def _run_row(
    c: sqlite3.Connection, owner: str, thread_id: str, run_id: str, holder_id: str | None, locked_since: float | None
) -> tuple[Any, ...] | None:
    """Inside a write transaction, the first statements of a run's claim or completion: the
    owner's admission, the lease fence, then the run's ``(completed_at,)`` row (``None``
    when the thread has no such run)."""
    admit(c, thread_id, owner)
    fence(c, thread_id, holder_id, locked_since)
    return c.execute("SELECT completed_at FROM runs WHERE thread_id = ? AND run_id = ?", (thread_id, run_id)).fetchone()


def claim_run(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    run_id: str,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Insert the run (``claimed_at = julianday('now')``) unless it exists; fenced by ``holder_id``."""
    with write_txn(c):
        row = _run_row(c, owner, thread_id, run_id, holder_id, locked_since)
        if row is not None:
            raise run_taken(thread_id, run_id, completed=row[0] is not None)
        c.execute("INSERT INTO runs (thread_id, run_id) VALUES (?, ?)", (thread_id, run_id))


def mark_run_complete(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    run_id: str,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> None:
    """Complete the run with the thread's next ``completion_seq``; idempotent; fenced by ``holder_id``."""
    with write_txn(c):
        row = _run_row(c, owner, thread_id, run_id, holder_id, locked_since)
        if row is None:
            raise run_never_claimed(thread_id, run_id)
        if row[0] is not None:
            return
        c.execute(
            "UPDATE runs SET completed_at = julianday('now'), completion_seq ="
            " (SELECT COALESCE(MAX(completion_seq), 0) + 1 FROM runs WHERE thread_id = ?)"
            " WHERE thread_id = ? AND run_id = ?",
            (thread_id, thread_id, run_id),
        )


# --- decoding, runs ------------------------------------------------------------------


def decode_rows(
    rows: Sequence[tuple[int, bytes]], thread_id: str
) -> tuple[list[AnyMessage], list[int], list[CorruptRow]]:
    """Decode ``(id, raw)`` rows in order (:func:`~core.checkpoint.codec.decode_rows`); a row
    that fails becomes a ``CorruptRow`` showing its bytes as UTF-8 text."""
    return codec.decode_rows(rows, thread_id, _shown)


def _shown(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def runs_of(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str | None, among: str | None = None
) -> list[tuple[str, RunRecord]]:
    """``(thread_id, run)`` pairs in claim order (rowid), of one thread of ``owner``'s or,
    with ``None``, of all of them (or of those ``among`` names: a JSON array of ids).

    A run's revision is not stored: it is 1 while claimed and 2 once completed, the two
    writes a run row ever gets (each conditional: the claim on no such run, the completion
    on none yet), so cubeloop's rows read right too."""
    if not layout.has("runs"):
        return []
    sql = "SELECT runs.thread_id, run_id, claimed_at, completed_at, completion_seq FROM "
    args = {"thread": thread_id, "owner": owner, "among": among}
    if thread_id is not None:
        sql += f"runs WHERE runs.thread_id = {this_thread(layout)}"
    else:
        sql += f"({mine_of(layout, among)}) AS mine CROSS JOIN runs ON runs.thread_id = mine.thread_id"
    return [
        (
            tid,
            RunRecord(
                run_id,
                julianday_to_unix(claimed),
                julianday_to_unix(completed),
                seq,
                revision=1 if completed is None else 2,
            ),
        )
        for tid, run_id, claimed, completed, seq in c.execute(sql + " ORDER BY runs.rowid", args)
    ]
