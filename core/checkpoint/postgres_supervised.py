"""Rows of our supervision tables: tool journal, jobs, leases, live events, commands, tool
steps, thread records; the owner admission and the fence.

Each function takes an asyncpg connection inside the caller's transaction (the
one-statement writes - tool event, heartbeat, live events - one outside a transaction,
see ``PostgresStore._write_call``) and scopes every statement by thread (commands by
their ``seq``) and by owner: readers carry the store's
:class:`~core.checkpoint.postgres_schema.Scope` predicate in their own text, writers
call the owner admission (:func:`admit`, ``cubepi_tui_own`` on the server) first in
their transaction. Times are unix seconds from the client's clock (``time.time()``), as
the memory and SQLite stores stamp them, so a lease written by one backend's rules reads
the same in another's.

Readers are called only when our tables exist; a browse-only store answers ``None`` /
empty before it gets here (the step and record readers also need schema v3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from core.checkpoint import postgres_rows as rows
from core.checkpoint import postgres_schema as schema
from core.checkpoint.base import (
    EDITABLE_STATUS,
    FINGERPRINTS_RECORD,
    Command,
    FingerprintOverride,
    Fingerprints,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    StepRecord,
    ThreadMeta,
    check_command_edit,
    check_command_move,
    check_deletable,
    check_step_input,
    command_record_name,
    command_sources,
    decode_thread_meta,
    encode_fingerprints,
    encode_overrides,
    lease_held,
    live_event_data,
    no_such_command,
    revision_conflict,
    step_refusal,
    thread_unavailable,
)
from core.checkpoint.postgres_conn import pack_result, unpack_result
from core.checkpoint.postgres_schema import Scope
from core.owners import UNOWNED

Connection = Any

# --- the owner admission and the fence ---------------------------------------------------------


async def admit(conn: Connection, owner: str, thread_id: str, *, adopt: bool = True) -> None:
    """Inside a write transaction, before anything else of the thread is read or written: the
    server's owner admission (``cubepi_tui_own``, :mod:`core.checkpoint.postgres_schema`).
    A thread that does not exist gets a record owned by ``owner`` when ``adopt`` (a write
    that creates thread data; not for removals and renewals); another owner's thread, or an
    unowned one for a named owner, raises ``THREAD_UNAVAILABLE`` (made
    :func:`~core.checkpoint.base.thread_unavailable` by the store) and the transaction rolls back."""
    await conn.execute("SELECT cubepi_tui_own($1, $2, $3, $4)", thread_id, owner, time.time(), adopt)


_LEASE_COLUMNS = "thread_id, holder_id, pid, host, run_id, acquired_at, heartbeat_at, expires_at"
"""A lease row's columns as ``Lease`` takes them, but for its revision (see :func:`_lease_columns`)."""


def _lease_columns(scope: Scope, alias: str = "") -> str:
    return ", ".join(f"{alias}{c}" for c in _LEASE_COLUMNS.split(", ")) + ", " + scope.revision(alias)


async def fence(conn: Connection, thread_id: str, holder_id: str | None) -> None:
    """Inside a write transaction: refuse (``LEASE_REFUSED``, made ``LeaseLostError`` by the
    store) unless the write is unfenced or ``holder_id`` holds the thread's live lease. The
    rule is ``cubepi_tui_fence`` (:mod:`core.checkpoint.postgres_schema`), the one every
    write function calls; the lease row stays locked ``FOR UPDATE`` until commit, so no
    takeover can land between this check and the write."""
    if holder_id is None:
        return
    await conn.execute("SELECT cubepi_tui_fence($1, $2, $3)", thread_id, holder_id, time.time())


# --- tool journal ----------------------------------------------------------------------------

_JOURNAL_COLUMNS = "tool_call_id, tool_name, run_id, started_at, ended_at, job_key"


async def record_tool_event(
    conn: Connection,
    write_id: str,
    owner: str,
    thread_id: str,
    tool_call_id: str,
    phase: str,
    tool_name: str,
    run_id: str | None,
    job_key: str | None,
    at: float,
    holder_id: str | None,
) -> None:
    """One statement (``cubepi_tui_tool_event``): claim ``write_id``, the owner admission, the
    fence, then upsert the entry for one phase (a start clears an old end)."""
    await conn.execute(
        "SELECT cubepi_tui_tool_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        write_id,
        thread_id,
        time.time(),
        holder_id,
        owner,
        tool_call_id,
        phase,
        tool_name,
        run_id,
        job_key,
        at,
    )


async def read_journal(conn: Connection, scope: Scope, thread_id: str) -> dict[str, JournalEntry]:
    """Tool call id -> entry, in first-journaled order."""
    found = await conn.fetch(
        f"SELECT {_JOURNAL_COLUMNS} FROM {schema.JOURNAL} WHERE thread_id = $1 AND {scope.visible('$1', '$2')}"
        " ORDER BY ord",
        thread_id,
        scope.owner,
    )
    return {r[0]: JournalEntry(*r) for r in found}


# --- jobs ------------------------------------------------------------------------------------

_JOB_COLUMNS = "key, status, result, tool_call_id, started_at, finished_at, attempts, revision"


async def job_begin(
    conn: Connection, owner: str, thread_id: str, key: str, tool_call_id: str | None, holder_id: str | None
) -> JobRecord:
    """Look up and start ``key`` with the row locked: a done job is returned unchanged; an
    absent one is inserted (``attempts`` 1, revision 1); a started or failed one starts
    again (both +1). The owner admission and the fence first."""
    await admit(conn, owner, thread_id)
    await fence(conn, thread_id, holder_id)
    now = time.time()
    # Insert or lock: of racing callers exactly one inserts, the others wait for its row.
    row = await conn.fetchrow(
        f"INSERT INTO {schema.JOBS} (thread_id, key, status, tool_call_id, started_at, attempts)"
        f" VALUES ($1, $2, 'started', $3, $4, 1) ON CONFLICT (thread_id, key) DO NOTHING RETURNING {_JOB_COLUMNS}",
        thread_id,
        key,
        tool_call_id,
        now,
    )
    if row is not None:
        return _job(row)
    old = await conn.fetchrow(
        f"SELECT {_JOB_COLUMNS} FROM {schema.JOBS} WHERE thread_id = $1 AND key = $2 FOR UPDATE", thread_id, key
    )
    if old["status"] == "done":
        return _job(old)
    row = await conn.fetchrow(
        f"UPDATE {schema.JOBS} SET status = 'started', result = NULL, finished_at = NULL, started_at = $3,"
        " attempts = attempts + 1, revision = revision + 1, tool_call_id = COALESCE($4, tool_call_id)"
        f" WHERE thread_id = $1 AND key = $2 RETURNING {_JOB_COLUMNS}",
        thread_id,
        key,
        now,
        tool_call_id,
    )
    return _job(row)


async def job_finish(
    conn: Connection, owner: str, thread_id: str, key: str, status: str, result_json: str, holder_id: str | None
) -> None:
    """Record the outcome (revision + 1); a done job stays as it is; ``KeyError`` if never
    begun. The owner admission (no adoption: a missing thread has no job) and the fence first."""
    await admit(conn, owner, thread_id, adopt=False)
    await fence(conn, thread_id, holder_id)
    current = await conn.fetchval(
        f"SELECT status FROM {schema.JOBS} WHERE thread_id = $1 AND key = $2 FOR UPDATE", thread_id, key
    )
    if current is None:
        raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
    if current == "done":
        return
    await conn.execute(
        f"UPDATE {schema.JOBS} SET status = $3, result = $4, finished_at = $5, revision = revision + 1"
        " WHERE thread_id = $1 AND key = $2",
        thread_id,
        key,
        status,
        result_json,
        time.time(),
    )


async def job_get(conn: Connection, scope: Scope, thread_id: str, key: str) -> JobRecord | None:
    """The job under ``key``, or ``None`` (also for another owner's thread)."""
    columns = _JOB_COLUMNS.replace("revision", scope.revision())
    row = await conn.fetchrow(
        f"SELECT {columns} FROM {schema.JOBS} WHERE thread_id = $1 AND key = $2 AND {scope.visible('$1', '$3')}",
        thread_id,
        key,
        scope.owner,
    )
    return None if row is None else _job(row)


def _job(row: Any) -> JobRecord:
    key, status, result, tool_call_id, started_at, finished_at, attempts, revision = row
    return JobRecord(
        key,
        status,
        None if result is None else json.loads(result),
        tool_call_id,
        started_at,
        finished_at,
        attempts,
        revision,
    )


# --- leases ----------------------------------------------------------------------------------


async def acquire_lease(conn: Connection, scope: Scope, lease: Lease, is_stale: Callable[[Lease], bool]) -> Lease:
    """Read, decide and upsert under a per-thread advisory lock of ours, so of racing
    acquirers (any process) exactly one sees no live lease. The owner admission first.
    Returns the lease as stored: revision 1 for a new row, the row's + 1 otherwise."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", schema.LOCK_CLASS, lease.thread_id)
    await admit(conn, scope.owner, lease.thread_id)
    current = await get_lease(conn, scope, lease.thread_id, lock=True)
    if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
        raise lease_held(current)
    revision = await conn.fetchval(
        f"INSERT INTO {schema.LEASES} ({_LEASE_COLUMNS}, revision) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1)"
        " ON CONFLICT (thread_id) DO UPDATE SET holder_id = EXCLUDED.holder_id, pid = EXCLUDED.pid,"
        " host = EXCLUDED.host, run_id = EXCLUDED.run_id, acquired_at = EXCLUDED.acquired_at,"
        f" heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at, revision = {schema.LEASES}.revision + 1"
        " RETURNING revision",
        lease.thread_id,
        lease.holder_id,
        lease.pid,
        lease.host,
        lease.run_id,
        lease.acquired_at,
        lease.heartbeat_at,
        lease.expires_at,
    )
    return replace(lease, revision=revision)


async def renew_lease(
    conn: Connection,
    write_id: str,
    owner: str,
    thread_id: str,
    holder_id: str,
    heartbeat_at: float,
    expires_at: float,
) -> bool:
    """One statement (``cubepi_tui_renew_lease``): claim ``write_id``, the owner admission
    (no adoption), then one UPDATE guarded by the holder (revision + 1): ``False`` when
    another holder took it (or none exists). A retry of an attempt that committed gets
    that attempt's answer."""
    packed = await conn.fetchval(
        "SELECT cubepi_tui_renew_lease($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        write_id,
        thread_id,
        time.time(),
        holder_id,
        owner,
        heartbeat_at,
        expires_at,
        pack_result(True),
        pack_result(False),
    )
    return bool(unpack_result(packed))


async def release_lease(conn: Connection, owner: str, thread_id: str, holder_id: str) -> None:
    """The owner admission (no adoption), then delete the lease only if ``holder_id`` holds it."""
    await admit(conn, owner, thread_id, adopt=False)
    await conn.execute(f"DELETE FROM {schema.LEASES} WHERE thread_id = $1 AND holder_id = $2", thread_id, holder_id)


async def get_lease(conn: Connection, scope: Scope, thread_id: str, *, lock: bool = False) -> Lease | None:
    """The thread's lease record, or ``None`` (also for another owner's thread)."""
    row = await conn.fetchrow(
        f"SELECT {_lease_columns(scope)} FROM {schema.LEASES} WHERE thread_id = $1 AND {scope.visible('$1', '$2')}"
        + (" FOR UPDATE" if lock else ""),
        thread_id,
        scope.owner,
    )
    return None if row is None else Lease(*row)


async def all_leases(conn: Connection, scope: Scope, among: list[str] | None = None) -> dict[str, Lease]:
    """Every lease of this owner's threads (or of those in ``among``) by thread id: one query
    driven from the owner's threads (:meth:`~core.checkpoint.postgres_schema.Scope.mine`, under
    :data:`~core.checkpoint.postgres_schema.INDEX_PLANS`), never reading other owners' leases."""
    await conn.execute(schema.INDEX_PLANS)
    found = await conn.fetch(
        f"SELECT {_lease_columns(scope, 'l.')} FROM ({scope.mine('$1', None if among is None else '$2')}) AS mine"
        f" JOIN {schema.LEASES} AS l ON l.thread_id = mine.thread_id ORDER BY l.thread_id",
        scope.owner,
        *([] if among is None else [among]),
    )
    return {r[0]: Lease(*r) for r in found}


# --- live events -----------------------------------------------------------------------------


async def append_live_events(
    conn: Connection,
    write_id: str,
    owner: str,
    thread_id: str,
    run_id: str | None,
    texts: Sequence[str],
    at: float,
    keep: int,
) -> None:
    """One statement (``cubepi_tui_live_events``): claim ``write_id``, the owner admission,
    insert the batch (each event stamped ``at``), then delete all but the thread's newest ``keep``."""
    await conn.execute(
        "SELECT cubepi_tui_live_events($1, $2, $3, $4, $5, $6::text[], $7)",
        write_id,
        thread_id,
        at,
        owner,
        run_id,
        list(texts),
        keep,
    )


async def read_live_events(conn: Connection, scope: Scope, thread_id: str, after_seq: int) -> list[LiveEvent]:
    """Events with ``seq > after_seq`` in order; a row that is not a JSON object is shown, not dropped."""
    found = await conn.fetch(
        f"SELECT seq, run_id, data, at FROM {schema.LIVE_EVENTS} WHERE thread_id = $1 AND seq > $2"
        f" AND {scope.visible('$1', '$3')} ORDER BY seq",
        thread_id,
        after_seq,
        scope.owner,
    )
    return [LiveEvent(seq, thread_id, run_id, live_event_data(text), at) for seq, run_id, text, at in found]


async def prune_live_events(conn: Connection, owner: str, thread_id: str) -> None:
    """The owner admission (no adoption), then delete every live event of the thread."""
    await admit(conn, owner, thread_id, adopt=False)
    await conn.execute(f"DELETE FROM {schema.LIVE_EVENTS} WHERE thread_id = $1", thread_id)


# --- commands --------------------------------------------------------------------------------

_COMMAND_COLUMNS = "seq, thread_id, kind, text, status, created_at, updated_at, note, revision"


async def send_command(conn: Connection, owner: str, thread_id: str, kind: str, text: str) -> Command:
    """The owner admission, then insert a ``pending`` command (``seq`` from the table's
    sequence, revision 1)."""
    await admit(conn, owner, thread_id)
    now = time.time()
    row = await conn.fetchrow(
        f"INSERT INTO {schema.COMMANDS} (thread_id, kind, text, status, created_at, updated_at)"
        f" VALUES ($1, $2, $3, 'pending', $4, $4) RETURNING {_COMMAND_COLUMNS}",
        thread_id,
        kind,
        text,
        now,
    )
    return Command(*row)


async def update_command(
    conn: Connection, scope: Scope, seq: int, status: str, note: str, expected: int | None
) -> Command:
    """A conditional UPDATE by ``seq`` joined to the command's thread owner: only from a
    status that allows the move, only at revision ``expected`` when given; revision + 1.
    When it moved nothing, the command as this owner sees it says why: none (unknown, or
    another owner's) -> ``KeyError``; another revision -> ``ConflictError``; its status
    -> ``CommandTransitionError`` (the command unchanged)."""
    row = await conn.fetchrow(
        f"UPDATE {schema.COMMANDS} AS c SET status = $2, note = $3, updated_at = $4, revision = c.revision + 1"
        f" WHERE c.seq = $1 AND c.status = ANY($5::text[]) AND ($6::integer IS NULL OR c.revision = $6)"
        f" AND {scope.visible('c.thread_id', '$7')} RETURNING {_COMMAND_COLUMNS}",
        seq,
        status,
        note,
        time.time(),
        list(command_sources(status)),
        expected,
        scope.owner,
    )
    if row is not None:
        return Command(*row)
    command = await _seen_command(conn, scope, seq)
    if expected is not None and command.revision != expected:
        raise revision_conflict(command.thread_id, command_record_name(seq), expected, command.revision)
    check_command_move(command, status)
    return command  # unreachable: the UPDATE moved every allowed status


async def _seen_command(conn: Connection, scope: Scope, seq: int) -> Command:
    """Command ``seq`` as this owner sees it, read after a conditional UPDATE changed
    nothing, to say why; raises ``KeyError`` (``no_such_command``) when there is none."""
    current = await conn.fetchrow(
        f"SELECT {_COMMAND_COLUMNS} FROM {schema.COMMANDS} AS c WHERE c.seq = $1 AND {scope.visible('c.thread_id', '$2')}",
        seq,
        scope.owner,
    )
    if current is None:
        raise no_such_command(seq)
    return Command(*current)


async def edit_command(conn: Connection, scope: Scope, seq: int, text: str, expected: int) -> Command:
    """A conditional UPDATE of the text by ``seq``, joined to the command's thread owner: only
    while ``pending``, only at revision ``expected``; revision + 1. When it changed nothing,
    the command as this owner sees it says why: none -> ``KeyError``; another revision ->
    ``ConflictError``; no longer pending -> ``CommandTransitionError``."""
    row = await conn.fetchrow(
        f"UPDATE {schema.COMMANDS} AS c SET text = $2, updated_at = $3, revision = c.revision + 1"
        f" WHERE c.seq = $1 AND c.status = $4 AND c.revision = $5"
        f" AND {scope.visible('c.thread_id', '$6')} RETURNING {_COMMAND_COLUMNS}",
        seq,
        text,
        time.time(),
        EDITABLE_STATUS,
        expected,
        scope.owner,
    )
    if row is not None:
        return Command(*row)
    command = await _seen_command(conn, scope, seq)
    if command.revision != expected:
        raise revision_conflict(command.thread_id, command_record_name(seq), expected, command.revision)
    check_command_edit(command)
    return command  # unreachable: the UPDATE changed every pending command at that revision


async def list_commands(
    conn: Connection, scope: Scope, thread_id: str, statuses: Sequence[str] | None, after: int
) -> list[Command]:
    """The thread's commands with ``seq > after`` in seq order, optionally only those in ``statuses``."""
    columns = _COMMAND_COLUMNS.replace("revision", scope.revision())
    sql = f"SELECT {columns} FROM {schema.COMMANDS} WHERE thread_id = $1 AND seq > $2 AND {scope.visible('$1', '$3')}"
    args: list[Any] = [thread_id, after, scope.owner]
    if statuses is not None:
        sql += " AND status = ANY($4::text[])"
        args.append(list(statuses))
    return [Command(*r) for r in await conn.fetch(sql + " ORDER BY seq", *args)]


# --- tool steps (v3) -------------------------------------------------------------------------


async def step_begin(
    conn: Connection,
    owner: str,
    thread_id: str,
    key: str,
    fingerprint: str,
    workflow: str,
    total_steps: int | None,
    tool_call_id: str | None,
    holder_id: str | None,
) -> StepRecord:
    """The owner admission and the fence, then insert the step record at step 0, revision 0,
    or lock the existing one: returned unchanged when its input fingerprint and workflow
    match, else ``ConflictError`` (:func:`~core.checkpoint.base.input_conflict`)."""
    await admit(conn, owner, thread_id)
    await fence(conn, thread_id, holder_id)
    row = await conn.fetchrow(
        f"INSERT INTO {schema.STEPS} (thread_id, key, input_fingerprint, workflow, total_steps, tool_call_id,"
        " updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (thread_id, key) DO NOTHING"
        f" RETURNING {rows.STEP_COLUMNS}",
        thread_id,
        key,
        fingerprint,
        workflow,
        total_steps,
        tool_call_id,
        time.time(),
    )
    if row is None:
        row = await conn.fetchrow(
            f"SELECT {rows.STEP_COLUMNS} FROM {schema.STEPS} WHERE thread_id = $1 AND key = $2 FOR UPDATE",
            thread_id,
            key,
        )
    record = rows.step_record(row)
    check_step_input(record, fingerprint, workflow)
    return record


async def step_commit(
    conn: Connection,
    owner: str,
    thread_id: str,
    key: str,
    expected: int,
    workflow: str,
    next_step: int,
    data_json: str,
    holder_id: str | None,
) -> StepRecord:
    """The owner admission (no adoption) and the fence, then the lesson's one UPDATE
    ``... SET next_step, data, revision = revision + 1 WHERE ... AND revision = expected AND
    workflow = ...`` whose row count must be 1. Otherwise nothing was written and the row
    says why: none -> ``KeyError``; another workflow -> ``ConflictError`` (input_conflict,
    before a stale revision); another revision -> ``ConflictError`` (both revisions)."""
    await admit(conn, owner, thread_id, adopt=False)
    await fence(conn, thread_id, holder_id)
    row = await conn.fetchrow(
        f"UPDATE {schema.STEPS} SET next_step = $3, data = $4, revision = revision + 1, updated_at = $5"
        f" WHERE thread_id = $1 AND key = $2 AND revision = $6 AND workflow = $7 RETURNING {rows.STEP_COLUMNS}",
        thread_id,
        key,
        next_step,
        data_json,
        time.time(),
        expected,
        workflow,
    )
    if row is not None:
        return rows.step_record(row)
    current = await conn.fetchrow(
        f"SELECT {rows.STEP_COLUMNS} FROM {schema.STEPS} WHERE thread_id = $1 AND key = $2", thread_id, key
    )
    raise step_refusal(thread_id, key, None if current is None else rows.step_record(current), workflow, expected)


async def step_get(conn: Connection, scope: Scope, thread_id: str, key: str) -> StepRecord | None:
    """Job ``key``'s step record, ``None`` if never begun or the thread is another owner's."""
    row = await conn.fetchrow(
        f"SELECT {rows.STEP_COLUMNS} FROM {schema.STEPS} WHERE thread_id = $1 AND key = $2"
        f" AND {scope.visible('$1', '$3')}",
        thread_id,
        key,
        scope.owner,
    )
    return None if row is None else rows.step_record(row)


async def list_steps(conn: Connection, scope: Scope, thread_id: str) -> list[StepRecord]:
    """Every step record of the thread, by key."""
    found = await conn.fetch(
        f"SELECT {rows.STEP_COLUMNS} FROM {schema.STEPS} WHERE thread_id = $1 AND {scope.visible('$1', '$2')}"
        " ORDER BY key",
        thread_id,
        scope.owner,
    )
    return [rows.step_record(r) for r in found]


# --- thread records (v3) ---------------------------------------------------------------------

_RECORD_COLUMNS = ", ".join(rows.RECORD_COLUMNS)


async def load_meta(conn: Connection, scope: Scope, thread_id: str) -> ThreadMeta | None:
    """The thread's record as this owner sees it: its row; for a thread that has none but
    exists (cubeloop's thread row, or rows in our tables: ``Scope.exists``) an unowned record
    at revision 0, seen by the unowned scope only; ``None`` otherwise. One query."""
    if not scope.records:
        exists = await conn.fetchval(f"SELECT {scope.exists('$1')} AND '' = $2", thread_id, scope.owner)
        return ThreadMeta(thread_id, UNOWNED) if exists else None
    row = await conn.fetchrow(
        f"SELECT r.thread_id IS NOT NULL AS has_record, {', '.join('r.' + c for c in rows.RECORD_COLUMNS)}"
        f" FROM (SELECT $1::text AS thread_id) AS k LEFT JOIN {schema.RECORDS} AS r ON r.thread_id = k.thread_id"
        " WHERE coalesce(r.owner, '') = $2"
        f" AND (r.thread_id IS NOT NULL OR {scope.exists('$1')})",
        thread_id,
        scope.owner,
    )
    if row is None:
        return None
    if not row["has_record"]:
        return ThreadMeta(thread_id, UNOWNED)
    return decode_thread_meta(thread_id, *(row[c] for c in rows.RECORD_COLUMNS))


async def save_fingerprints(
    conn: Connection,
    owner: str,
    thread_id: str,
    fingerprints: Fingerprints,
    expected: int,
    override: FingerprintOverride | None,
) -> ThreadMeta:
    """The owner admission (which gives the thread its record), then one UPDATE of the record
    at revision ``expected`` (revision + 1; the override appended to the list) whose row count
    must be 1; else ``ConflictError`` with both revisions."""
    await admit(conn, owner, thread_id)
    added = encode_overrides([] if override is None else [override], spaced=True)
    row = await conn.fetchrow(
        f"UPDATE {schema.RECORDS} SET fingerprints = $3, overrides = (overrides::jsonb || $4::jsonb)::text,"
        f" revision = revision + 1 WHERE thread_id = $1 AND revision = $2 RETURNING {_RECORD_COLUMNS}",
        thread_id,
        expected,
        encode_fingerprints(fingerprints, spaced=True),
        added,
    )
    if row is None:
        actual = await conn.fetchval(f"SELECT revision FROM {schema.RECORDS} WHERE thread_id = $1", thread_id)
        raise revision_conflict(thread_id, FINGERPRINTS_RECORD, expected, actual)
    return decode_thread_meta(thread_id, *row)


# --- deleting a thread (v3) ------------------------------------------------------------------


async def delete_thread(conn: Connection, owner: str, thread_id: str) -> None:
    """Under cubeloop's per-thread lock (no append or claim lands meanwhile): the owner
    admission (no adoption), then ``ThreadNotFoundError`` unless the thread exists, then
    ``RunAlreadyClaimedError`` while a live lease holds it, then every row of the thread in
    our tables and cubeloop's (its thread row, whose deletion cascades to its messages,
    runs and answers)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", thread_id)
    await admit(conn, owner, thread_id, adopt=False)
    exists = await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM {schema.RECORDS} WHERE thread_id = $1) OR {schema.thread_exists('$1')}",
        thread_id,
    )
    if not exists:
        raise thread_unavailable(thread_id, owner)
    lease = await conn.fetchrow(
        f"SELECT {_LEASE_COLUMNS}, revision FROM {schema.LEASES} WHERE thread_id = $1 FOR UPDATE", thread_id
    )
    check_deletable(None if lease is None else Lease(*lease), time.time())
    for table in (*schema.OUR_DATA_TABLES, schema.STEPS, schema.STATS, schema.RECORDS, "cubepi_threads"):
        await conn.execute(f"DELETE FROM {table} WHERE thread_id = $1", thread_id)
