"""Rows of our schema-v3 tables: each thread's record (owner, fingerprints, the extra's
revision), the step records of long tools, and the deletion of a whole thread.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection`` and
is one whole transaction (readers: one snapshot), so each public call of
:class:`~core.checkpoint.sqlite.SQLiteCheckpointer` stays one hop. Writers begin with
:func:`~core.checkpoint.sqlite_owners.admit`; readers carry the owner predicate in their
query. A compare-and-set is one ``UPDATE ... WHERE revision = :expected`` whose row count
must be 1; when it is 0, the row is read again in the same transaction only to say why.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from core.checkpoint.base import (
    FINGERPRINTS_RECORD,
    CorruptRow,
    StepRecord,
    ThreadMeta,
    check_deletable,
    check_step_input,
    decode_thread_meta,
    load_thread_meta,
    revision_conflict,
    step_refusal,
    thread_unavailable,
)
from core.checkpoint.sqlite_owners import admit, exists, owned, this_thread
from core.checkpoint.sqlite_schema import (
    RECORDS,
    STEPS,
    THREAD_TABLES,
    Layout,
    read_txn,
    write_txn,
)
from core.checkpoint.sqlite_supervised import BeforeCommit, fence, lease_row
from core.owners import UNOWNED

# --- the thread's record ----------------------------------------------------------------------

_RECORD_COLUMNS = "owner, created_at, fingerprints_revision, fingerprints_json, overrides_json, extra_revision"


def _record_row(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> tuple[Any, ...] | None:
    """The record row of ``owner``'s thread (:data:`_RECORD_COLUMNS`: the five values
    :func:`~core.checkpoint.base.decode_thread_meta` takes after the thread id, then the
    extra's revision), inside the caller's snapshot; ``None`` without one (or another owner's)."""
    if not layout.has(RECORDS):
        return None
    return c.execute(
        f"SELECT {_RECORD_COLUMNS} FROM {RECORDS} WHERE thread_id = :thread AND coalesce(owner, '') = :owner",
        {"thread": thread_id, "owner": owner},
    ).fetchone()


def _meta(thread_id: str, row: tuple[Any, ...]) -> ThreadMeta:
    """A row of :data:`_RECORD_COLUMNS` as its record; ``CorruptRecordError`` when unreadable."""
    return decode_thread_meta(thread_id, *row[:5])


def read_meta(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str
) -> tuple[ThreadMeta | None, int, CorruptRow | None]:
    """For ``load``, inside its snapshot: the record of ``owner``'s thread (``None`` when it
    has none, or is another owner's), its extra's revision (0 then), and the problem to show
    when the fingerprints record cannot be read (the record is ``None`` then; see
    :func:`~core.checkpoint.base.load_thread_meta`)."""
    row = _record_row(c, layout, owner, thread_id)
    if row is None:
        return None, 0, None
    meta, problem = load_thread_meta(thread_id, *row[:5])
    return meta, int(row[5]), problem


def load_meta(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> ThreadMeta | None:
    """``owner``'s thread's record; a thread that exists without one (cubeloop's, ours before
    v3) reads as unowned with revision 0, to the unowned scope only; else ``None``.
    ``CorruptRecordError`` (one sentence) when its fingerprints record cannot be read."""
    with read_txn(c):
        row = _record_row(c, layout, owner, thread_id)
        if row is not None:
            return _meta(thread_id, row)
        found = c.execute(
            f"SELECT 1 WHERE {owned(layout)} AND {exists(layout)}", {"thread": thread_id, "owner": owner}
        ).fetchone()
    return ThreadMeta(thread_id, UNOWNED) if found else None


def save_fingerprints(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    fingerprints_json: str,
    expected_revision: int,
    override_json: str | None,
    before_commit: BeforeCommit | None = None,
) -> ThreadMeta:
    """Write the fingerprints (and append the override) with one compare-and-set UPDATE of the
    thread's record, in one transaction; ``ConflictError`` (both revisions) when its row count
    is not 1."""
    args = {"thread": thread_id, "fp": fingerprints_json, "expected": expected_revision, "override": override_json}
    with write_txn(c):
        admit(c, thread_id, owner)
        row = c.execute(
            f"UPDATE {RECORDS} SET fingerprints_json = :fp, fingerprints_revision = fingerprints_revision + 1,"
            " overrides_json = CASE WHEN :override IS NULL THEN overrides_json"
            " ELSE json_insert(overrides_json, '$[#]', json(:override)) END"
            f" WHERE thread_id = :thread AND fingerprints_revision = :expected RETURNING {_RECORD_COLUMNS}",
            args,
        ).fetchall()
        if len(row) != 1:
            actual = c.execute(
                f"SELECT fingerprints_revision FROM {RECORDS} WHERE thread_id = :thread", args
            ).fetchone()
            raise revision_conflict(thread_id, FINGERPRINTS_RECORD, expected_revision, actual[0] if actual else None)
        meta = _meta(thread_id, row[0])
        if before_commit is not None:
            before_commit("save_fingerprints", c)
    return meta


# --- tool steps -------------------------------------------------------------------------------

_STEP_COLUMNS = (
    "thread_id, key, input_fingerprint, workflow, next_step, total_steps, revision, data_json, tool_call_id, updated_at"
)


def _step(row: tuple[Any, ...]) -> StepRecord:
    thread_id, key, fingerprint, workflow, next_step, total, revision, data_json, call_id, updated_at = row
    return StepRecord(
        thread_id, key, fingerprint, workflow, next_step, total, revision, json.loads(data_json), call_id, updated_at
    )


def _stored_step(c: sqlite3.Connection, thread_id: str, key: str) -> StepRecord | None:
    """Inside a write transaction, after :func:`~core.checkpoint.sqlite_owners.admit`."""
    row = c.execute(f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE thread_id = ? AND key = ?", (thread_id, key)).fetchone()
    return None if row is None else _step(row)


def step_begin(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    key: str,
    input_fingerprint: str,
    workflow: str,
    total_steps: int | None,
    tool_call_id: str | None,
    holder_id: str | None = None,
    locked_since: float | None = None,
) -> StepRecord:
    """Create job ``key``'s step record at step 0, revision 0, or find it as it is, in one
    transaction; ``ConflictError`` (the lesson's "same run requires same input and
    workflow") when the stored one has another input fingerprint or workflow."""
    now = time.time()
    with write_txn(c):
        admit(c, thread_id, owner, now)
        fence(c, thread_id, holder_id, locked_since)
        c.execute(
            f"INSERT INTO {STEPS} (thread_id, key, input_fingerprint, workflow, total_steps, tool_call_id, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, key) DO NOTHING",
            (thread_id, key, input_fingerprint, workflow, total_steps, tool_call_id, now),
        )
        record = _stored_step(c, thread_id, key)
        assert record is not None  # inserted or already there, under the write lock
        check_step_input(record, input_fingerprint, workflow)
    return record


def step_commit(
    c: sqlite3.Connection,
    owner: str,
    thread_id: str,
    key: str,
    expected_revision: int,
    workflow: str,
    next_step: int,
    data_json: str,
    holder_id: str | None = None,
    locked_since: float | None = None,
    before_commit: BeforeCommit | None = None,
) -> StepRecord:
    """The lesson's step: in one ``BEGIN IMMEDIATE``, the owner's admission and the lease
    fence, then ``UPDATE ... SET next_step, data, revision = revision + 1 WHERE revision =
    :expected AND workflow = :workflow``, whose row count must be 1, then COMMIT. An
    exception (or a kill) before the COMMIT leaves the earlier record as it was. A row count
    of 0 is explained from the row: never begun (``KeyError``), another workflow
    (``input_conflict``), another revision (``revision_conflict``)."""
    args = {
        "thread": thread_id,
        "key": key,
        "expected": expected_revision,
        "workflow": workflow,
        "next": next_step,
        "data": data_json,
        "now": time.time(),
    }
    with write_txn(c):
        admit(c, thread_id, owner, args["now"])
        fence(c, thread_id, holder_id, locked_since)
        written = c.execute(
            f"UPDATE {STEPS} SET next_step = :next, data_json = :data, revision = revision + 1, updated_at = :now"
            " WHERE thread_id = :thread AND key = :key AND revision = :expected AND workflow = :workflow"
            f" RETURNING {_STEP_COLUMNS}",
            args,
        ).fetchall()
        if len(written) != 1:
            raise step_refusal(thread_id, key, _stored_step(c, thread_id, key), workflow, expected_revision)
        if before_commit is not None:
            before_commit("step_commit", c)
    return _step(written[0])


def step_get(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, key: str) -> StepRecord | None:
    """Job ``key``'s step record of ``owner``'s thread, or ``None`` (also without the table)."""
    if not layout.has(STEPS):
        return None
    row = c.execute(
        f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE thread_id = {this_thread(layout)} AND key = :key",
        {"thread": thread_id, "key": key, "owner": owner},
    ).fetchone()
    return None if row is None else _step(row)


def list_steps(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str) -> list[StepRecord]:
    """Every step record of ``owner``'s thread, by key (empty without the table)."""
    if not layout.has(STEPS):
        return []
    rows = c.execute(
        f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE thread_id = {this_thread(layout)} ORDER BY key",
        {"thread": thread_id, "owner": owner},
    )
    return [_step(row) for row in rows]


# --- deleting a thread ------------------------------------------------------------------------

_THREAD_ROWS = (*THREAD_TABLES, "thread_hitl_answers", RECORDS)
"""Every table holding rows of a thread (a writable file has them all)."""


def delete_thread(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, now: float) -> None:
    """Delete every row of ``owner``'s thread in one transaction. ``ThreadNotFoundError`` when
    it does not exist or is another owner's (one query with the owner in it);
    ``RunAlreadyClaimedError`` while a lease on it is live at ``now`` (unix seconds)."""
    args = {"thread": thread_id, "owner": owner}
    with write_txn(c):
        found = c.execute(
            f"SELECT 1 WHERE {owned(layout)}"
            f" AND (EXISTS (SELECT 1 FROM {RECORDS} WHERE thread_id = :thread) OR {exists(layout)})",
            args,
        ).fetchone()
        if found is None:
            raise thread_unavailable(thread_id, owner)
        check_deletable(lease_row(c, thread_id), now)
        for table in _THREAD_ROWS:
            c.execute(f"DELETE FROM {table} WHERE thread_id = :thread", args)
