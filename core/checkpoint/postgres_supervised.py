"""Rows of our supervision tables: tool journal, jobs, leases, live events, commands; the fence.

Each function takes an asyncpg connection inside the caller's transaction (the
one-statement writes - tool event, heartbeat, live events - one outside a transaction,
see ``PostgresStore._write_call``) and scopes every statement by thread (commands by
their ``seq``). Times are unix seconds from the client's clock (``time.time()``), as the memory and SQLite stores stamp them, so a lease
written by one backend's rules reads the same in another's.

Readers are called only when our tables exist; a browse-only store answers ``None`` /
empty before it gets here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from core.checkpoint import postgres_schema as schema
from core.checkpoint.base import (
    Command,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    check_command_move,
    command_sources,
    live_event_data,
)
from core.checkpoint.postgres_conn import pack_result, unpack_result
from core.errors import RunAlreadyClaimedError

Connection = Any

# --- argument checks (before any round trip, so a bad call writes nothing) ------------------


# --- the fence -------------------------------------------------------------------------------

_LEASE_COLUMNS = "thread_id, holder_id, pid, host, run_id, acquired_at, heartbeat_at, expires_at"


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
    thread_id: str,
    tool_call_id: str,
    phase: str,
    tool_name: str,
    run_id: str | None,
    job_key: str | None,
    at: float,
    holder_id: str | None,
) -> None:
    """One statement (``cubepi_tui_tool_event``): claim ``write_id``, the fence, then upsert
    the entry for one phase (a start clears an old end)."""
    await conn.execute(
        "SELECT cubepi_tui_tool_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        write_id,
        thread_id,
        time.time(),
        holder_id,
        tool_call_id,
        phase,
        tool_name,
        run_id,
        job_key,
        at,
    )


async def read_journal(conn: Connection, thread_id: str) -> dict[str, JournalEntry]:
    """Tool call id -> entry, in first-journaled order."""
    found = await conn.fetch(
        f"SELECT {_JOURNAL_COLUMNS} FROM {schema.JOURNAL} WHERE thread_id = $1 ORDER BY ord", thread_id
    )
    return {r[0]: JournalEntry(*r) for r in found}


# --- jobs ------------------------------------------------------------------------------------

_JOB_COLUMNS = "key, status, result, tool_call_id, started_at, finished_at, attempts"


async def job_begin(
    conn: Connection, thread_id: str, key: str, tool_call_id: str | None, holder_id: str | None
) -> JobRecord:
    """Look up and start ``key`` with the row locked: a done job is returned unchanged; an
    absent one is inserted (``attempts`` 1); a started or failed one starts again (+1)."""
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
        " attempts = attempts + 1, tool_call_id = COALESCE($4, tool_call_id)"
        f" WHERE thread_id = $1 AND key = $2 RETURNING {_JOB_COLUMNS}",
        thread_id,
        key,
        now,
        tool_call_id,
    )
    return _job(row)


async def job_finish(
    conn: Connection, thread_id: str, key: str, status: str, result_json: str, holder_id: str | None
) -> None:
    """Record the outcome; a done job stays as it is; ``KeyError`` if never begun."""
    await fence(conn, thread_id, holder_id)
    current = await conn.fetchval(
        f"SELECT status FROM {schema.JOBS} WHERE thread_id = $1 AND key = $2 FOR UPDATE", thread_id, key
    )
    if current is None:
        raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
    if current == "done":
        return
    await conn.execute(
        f"UPDATE {schema.JOBS} SET status = $3, result = $4, finished_at = $5 WHERE thread_id = $1 AND key = $2",
        thread_id,
        key,
        status,
        result_json,
        time.time(),
    )


async def job_get(conn: Connection, thread_id: str, key: str) -> JobRecord | None:
    """The job under ``key``, or ``None``."""
    row = await conn.fetchrow(
        f"SELECT {_JOB_COLUMNS} FROM {schema.JOBS} WHERE thread_id = $1 AND key = $2", thread_id, key
    )
    return None if row is None else _job(row)


def _job(row: Any) -> JobRecord:
    key, status, result, tool_call_id, started_at, finished_at, attempts = row
    return JobRecord(
        key, status, None if result is None else json.loads(result), tool_call_id, started_at, finished_at, attempts
    )


# --- leases ----------------------------------------------------------------------------------


async def acquire_lease(conn: Connection, lease: Lease, is_stale: Callable[[Lease], bool]) -> Lease:
    """Read, decide and upsert under a per-thread advisory lock of ours, so of racing
    acquirers (any process) exactly one sees no live lease."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", schema.LOCK_CLASS, lease.thread_id)
    current = await get_lease(conn, lease.thread_id, lock=True)
    if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
        raise RunAlreadyClaimedError(lease_refusal(current), lease=current)
    await conn.execute(
        f"INSERT INTO {schema.LEASES} ({_LEASE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        " ON CONFLICT (thread_id) DO UPDATE SET holder_id = EXCLUDED.holder_id, pid = EXCLUDED.pid,"
        " host = EXCLUDED.host, run_id = EXCLUDED.run_id, acquired_at = EXCLUDED.acquired_at,"
        " heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at",
        lease.thread_id,
        lease.holder_id,
        lease.pid,
        lease.host,
        lease.run_id,
        lease.acquired_at,
        lease.heartbeat_at,
        lease.expires_at,
    )
    return lease


async def renew_lease(
    conn: Connection, write_id: str, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float
) -> bool:
    """One statement (``cubepi_tui_renew_lease``): claim ``write_id``, then one UPDATE guarded
    by the holder: ``False`` when another holder took it (or none exists). A retry of an
    attempt that committed gets that attempt's answer."""
    packed = await conn.fetchval(
        "SELECT cubepi_tui_renew_lease($1, $2, $3, $4, $5, $6, $7, $8)",
        write_id,
        thread_id,
        time.time(),
        holder_id,
        heartbeat_at,
        expires_at,
        pack_result(True),
        pack_result(False),
    )
    return bool(unpack_result(packed))


async def release_lease(conn: Connection, thread_id: str, holder_id: str) -> None:
    """Delete the lease only if ``holder_id`` holds it."""
    await conn.execute(f"DELETE FROM {schema.LEASES} WHERE thread_id = $1 AND holder_id = $2", thread_id, holder_id)


async def get_lease(conn: Connection, thread_id: str, *, lock: bool = False) -> Lease | None:
    """The thread's lease record, or ``None``."""
    row = await conn.fetchrow(
        f"SELECT {_LEASE_COLUMNS} FROM {schema.LEASES} WHERE thread_id = $1" + (" FOR UPDATE" if lock else ""),
        thread_id,
    )
    return None if row is None else Lease(*row)


async def all_leases(conn: Connection) -> dict[str, Lease]:
    """Every lease by thread id."""
    return {
        r[0]: Lease(*r) for r in await conn.fetch(f"SELECT {_LEASE_COLUMNS} FROM {schema.LEASES} ORDER BY thread_id")
    }


def lease_refusal(current: Lease, now: float | None = None) -> str:
    """The one sentence ``acquire_lease`` raises when ``current`` is live and someone else's."""
    ago = max(0.0, (time.time() if now is None else now) - current.heartbeat_at)
    return (
        f"Thread {current.thread_id} is already running "
        f"(holder pid {current.pid} on {current.host}, heartbeat {ago:.0f}s ago)."
    )


# --- live events -----------------------------------------------------------------------------


async def append_live_events(
    conn: Connection, write_id: str, thread_id: str, run_id: str | None, texts: Sequence[str], at: float, keep: int
) -> None:
    """One statement (``cubepi_tui_live_events``): claim ``write_id``, insert the batch (each
    event stamped ``at``), then delete all but the thread's newest ``keep``."""
    await conn.execute(
        "SELECT cubepi_tui_live_events($1, $2, $3, $4, $5::text[], $6)",
        write_id,
        thread_id,
        at,
        run_id,
        list(texts),
        keep,
    )


async def read_live_events(conn: Connection, thread_id: str, after_seq: int) -> list[LiveEvent]:
    """Events with ``seq > after_seq`` in order; a row that is not a JSON object is shown, not dropped."""
    found = await conn.fetch(
        f"SELECT seq, run_id, data, at FROM {schema.LIVE_EVENTS} WHERE thread_id = $1 AND seq > $2 ORDER BY seq",
        thread_id,
        after_seq,
    )
    return [LiveEvent(seq, thread_id, run_id, live_event_data(text), at) for seq, run_id, text, at in found]


async def prune_live_events(conn: Connection, thread_id: str) -> None:
    """Delete every live event of the thread."""
    await conn.execute(f"DELETE FROM {schema.LIVE_EVENTS} WHERE thread_id = $1", thread_id)


# --- commands --------------------------------------------------------------------------------

_COMMAND_COLUMNS = "seq, thread_id, kind, text, status, created_at, updated_at, note"


async def send_command(conn: Connection, thread_id: str, kind: str, text: str) -> Command:
    """Insert a ``pending`` command (``seq`` from the table's sequence)."""
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


async def update_command(conn: Connection, seq: int, status: str, note: str) -> Command:
    """A conditional UPDATE: only from a status that allows the move; ``KeyError`` if unknown,
    ``CommandTransitionError`` (the command unchanged) if its status does not allow it."""
    row = await conn.fetchrow(
        f"UPDATE {schema.COMMANDS} SET status = $2, note = $3, updated_at = $4"
        f" WHERE seq = $1 AND status = ANY($5::text[]) RETURNING {_COMMAND_COLUMNS}",
        seq,
        status,
        note,
        time.time(),
        list(command_sources(status)),
    )
    if row is not None:
        return Command(*row)
    current = await conn.fetchrow(f"SELECT {_COMMAND_COLUMNS} FROM {schema.COMMANDS} WHERE seq = $1", seq)
    if current is None:
        raise KeyError(f"There is no command {seq}.")
    command = Command(*current)
    check_command_move(command, status)
    return command  # unreachable: the UPDATE moved every allowed status


async def list_commands(conn: Connection, thread_id: str, statuses: Sequence[str] | None, after: int) -> list[Command]:
    """The thread's commands with ``seq > after`` in seq order, optionally only those in ``statuses``."""
    sql = f"SELECT {_COMMAND_COLUMNS} FROM {schema.COMMANDS} WHERE thread_id = $1 AND seq > $2"
    args: list[Any] = [thread_id, after]
    if statuses is not None:
        sql += " AND status = ANY($3::text[])"
        args.append(list(statuses))
    return [Command(*r) for r in await conn.fetch(sql + " ORDER BY seq", *args)]
