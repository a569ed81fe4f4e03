"""cubeloop's tables: load, append, extra, runs and pending requests (the listing: :mod:`core.checkpoint.postgres_listing`).

Each function takes an asyncpg connection inside a transaction the caller opened (see
:meth:`~core.checkpoint.postgres_store.PostgresStore._read` or ``_write``), or, for the
one-statement writes (``append``, ``save_extra``), a connection outside one
(``_write_call``), and scopes every statement by thread and, through the store's
:class:`~core.checkpoint.postgres_schema.Scope`, by owner in the statement's own text; every
write passes the owner admission (``cubepi_tui_own``) first. Writes follow cubeloop 0.15.3's ``PostgresCheckpointer``
statement for statement where it has one: the per-thread ``pg_advisory_xact_lock(hashtext(
thread_id))`` around seq allocation and run rules, the lazy thread row, the JSONB ``||``
merge of ``extra`` - so both programs can write one thread at the same time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from core.checkpoint import postgres_rows as rows
from core.checkpoint import postgres_schema as schema
from core.checkpoint.base import (
    CheckpointData,
    RunRecord,
    load_thread_meta,
    parse_extra,
    run_never_claimed,
    run_taken,
)
from core.checkpoint.postgres_answers import ANSWER_STORED
from core.checkpoint.postgres_schema import Scope
from core.checkpoint.postgres_supervised import admit, fence, read_journal
from core.owners import UNOWNED

Connection = Any

_EPOCH = "extract(epoch FROM {0})::float8"
_LOCK_THREAD = "SELECT pg_advisory_xact_lock(hashtext($1))"  # cubeloop's per-thread lock, same key
_ENSURE_THREAD = "INSERT INTO cubepi_threads (thread_id) VALUES ($1) ON CONFLICT DO NOTHING"

# --- reads -------------------------------------------------------------------------------------


async def load(
    conn: Connection, scope: Scope, thread_id: str, after_seq: int | None, ours: bool
) -> CheckpointData | None:
    """Messages in seq order (only ``seq > after_seq`` when given), extra, runs, pending request,
    the thread's record (its extra revision and meta) and (when ``ours``: our tables exist)
    the journal, in the caller's one snapshot; each query scoped by ``scope``'s owner, so
    another owner's thread reads as missing."""
    msg_rows = await conn.fetch(
        "SELECT seq, role, metadata::text, payload FROM cubepi_messages WHERE thread_id = $1 AND seq > $2"
        f" AND {scope.visible('$1', '$3')} ORDER BY seq",
        thread_id,
        -1 if after_seq is None else after_seq,
        scope.owner,
    )
    data, found = await thread_parts(conn, scope, thread_id, ours)
    if after_seq is None and not found and not msg_rows:
        return None
    data.messages, data.message_ids, problems = rows.decode_rows(msg_rows, thread_id)
    data.problems[:0] = problems
    return data


async def thread_parts(conn: Connection, scope: Scope, thread_id: str, ours: bool) -> tuple[CheckpointData, bool]:
    """In the caller's snapshot, everything :func:`load` reads of the thread but its
    messages (extra, runs, pending request, record, journal when ``ours``), with the
    problems of an unreadable record or extra; and whether cubeloop's thread row exists."""
    thread = await conn.fetchrow(
        f"SELECT t.extra::text AS extra, t.parent_thread_id, t.pending_request::text AS pending, t.run_id,"
        f" {_EPOCH.format('t.updated_at')} AS updated_at, {pending_ours(ours)}, {_record_columns(scope)}"
        " FROM cubepi_threads AS t" + pending_join(ours) + _record_join(scope) + " WHERE t.thread_id = $1"
        f" AND {scope.joined('$2')}",
        thread_id,
        scope.owner,
    )
    runs = await runs_of(conn, scope, thread_id)
    journal = await read_journal(conn, scope, thread_id) if ours else None
    data = CheckpointData(runs=runs, journal=journal)
    if thread is not None:
        data.parent_thread_id = thread["parent_thread_id"]
        data.extra_revision = thread["extra_revision"]
        if thread["has_record"]:
            data.meta, problem = load_thread_meta(thread_id, *(thread[c] for c in rows.RECORD_COLUMNS))
            if problem is not None:  # shown, kept; the thread still loads
                data.problems.append(problem)
        data.extra, problem = parse_extra(thread["extra"], thread_id)
        if problem is not None:
            data.problems.append(problem)
        data.pending_request = rows.pending_of(thread)
    return data, thread is not None


def _record_columns(scope: Scope) -> str:
    """The thread record's columns a load or listing reads (``r``: :func:`_record_join`)."""
    if not scope.records:
        return (
            "0 AS extra_revision, false AS has_record, NULL AS owner, NULL::float8 AS created_at, 0 AS revision,"
            " NULL AS fingerprints, NULL AS overrides"
        )
    return (
        "coalesce(r.extra_revision, 0) AS extra_revision, r.thread_id IS NOT NULL AS has_record, r.owner,"
        " r.created_at, r.revision, r.fingerprints, r.overrides"
    )


def _record_join(scope: Scope, of: str = "t") -> str:
    """The thread record of table alias ``of``'s thread, joined as ``r`` (nothing to join without records)."""
    return f" LEFT JOIN {schema.RECORDS} AS r ON r.thread_id = {of}.thread_id" if scope.records else ""


def pending_ours(ours: bool) -> str:
    """The select-list fragment of our pending-request text and time (``NULL`` without our
    tables) and whether the request's answer is stored (``answered``: cubeloop's table, so
    with or without ours)."""
    texts = "p.request_text AS our_text, p.created_at AS our_at" if ours else "NULL AS our_text, NULL AS our_at"
    return f"{texts}, {ANSWER_STORED}"


def pending_join(ours: bool) -> str:
    """The join of our pending-request row onto ``t`` (cubeloop's threads), or ``""`` without our tables."""
    # Our exact text counts only while the row still holds that value (cubeloop may have replaced it).
    return (
        f" LEFT JOIN {schema.PENDING} AS p ON p.thread_id = t.thread_id AND p.request_text::jsonb = t.pending_request"
        if ours
        else ""
    )


async def runs_of(conn: Connection, scope: Scope, thread_id: str) -> list[RunRecord]:
    """The thread's runs in claim order (claim time, then run id: cubeloop keeps no row order)."""
    found = await conn.fetch(
        f"SELECT run_id, {_EPOCH.format('claimed_at')}, {_EPOCH.format('completed_at')}, completion_seq"
        f" FROM cubepi_runs WHERE thread_id = $1 AND {scope.visible('$1', '$2')} ORDER BY claimed_at, run_id",
        thread_id,
        scope.owner,
    )
    return [rows.run_record(*r) for r in found]


# --- writes ------------------------------------------------------------------------------------


async def append(
    conn: Connection,
    write_id: str,
    owner: str,
    thread_id: str,
    encoded: Sequence[tuple[str, str, bytes, str | None]],
    holder_id: str | None,
) -> None:
    """One statement (``cubepi_tui_append``, in its own implicit transaction): claim
    ``write_id``, then under cubeloop's per-thread lock the owner admission, the fence, the
    lazy thread row, the completed-run check and the rows after the thread's last seq.
    Refused (nothing written) with ``THREAD_UNAVAILABLE`` / ``RUN_COMPLETED`` /
    ``LEASE_REFUSED``, made sentences by the store."""
    await conn.execute(
        "SELECT cubepi_tui_append($1, $2, $3, $4, $5, $6::text[], $7::text[], $8::bytea[], $9::text[])",
        write_id,
        thread_id,
        time.time(),
        holder_id,
        owner,
        [r[0] for r in encoded],
        [r[1] for r in encoded],
        [r[2] for r in encoded],
        [r[3] for r in encoded],
    )


async def save_extra(
    conn: Connection, write_id: str, owner: str, thread_id: str, patch_json: str, expected: int | None
) -> int:
    """One statement (``cubepi_tui_save_extra``): claim ``write_id``, the owner admission, the
    compare-and-set of the extra's revision (when ``expected`` is given), then cubeloop's
    upsert with a server-side ``||`` merge; returns the new revision. Refused (nothing
    changed) with ``REVISION_CONFLICT``, or ``EXTRA_NOT_OBJECT`` when the stored extra is not
    an object, which ``||`` would turn into an array."""
    return await conn.fetchval(
        "SELECT cubepi_tui_save_extra($1, $2, $3, $4, $5, $6)",
        write_id,
        thread_id,
        time.time(),
        owner,
        patch_json,
        expected,
    )


async def save_pending_request(
    conn: Connection,
    owner: str,
    thread_id: str,
    request_json: str | None,
    run_id: str | None,
    now: float,
    holder_id: str | None = None,
) -> None:
    """The owner admission and the lease fence, cubeloop's two statements (lazy thread row,
    one UPDATE of pending and run id), plus our exact text beside it."""
    await admit(conn, owner, thread_id)
    await fence(conn, thread_id, holder_id)
    await conn.execute(_ENSURE_THREAD, thread_id)
    if request_json is None:
        await conn.execute(
            "UPDATE cubepi_threads SET pending_request = NULL, run_id = NULL, updated_at = now() WHERE thread_id = $1",
            thread_id,
        )
        await conn.execute(f"DELETE FROM {schema.PENDING} WHERE thread_id = $1", thread_id)
        return
    await conn.execute(
        "UPDATE cubepi_threads SET pending_request = $2::jsonb, run_id = $3, updated_at = now() WHERE thread_id = $1",
        thread_id,
        request_json,
        run_id,
    )
    await conn.execute(
        f"INSERT INTO {schema.PENDING} (thread_id, request_text, created_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (thread_id) DO UPDATE SET request_text = EXCLUDED.request_text, created_at = EXCLUDED.created_at",
        thread_id,
        request_json,
        now,
    )


async def claim_run(conn: Connection, owner: str, thread_id: str, run_id: str, holder_id: str | None) -> None:
    """cubeloop's claim: under the per-thread lock the owner admission and the fence, then
    refuse a run that exists, else insert it (revision 1)."""
    await conn.execute(_LOCK_THREAD, thread_id)
    await admit(conn, owner, thread_id)
    await fence(conn, thread_id, holder_id)
    await conn.execute(_ENSURE_THREAD, thread_id)
    completed = await conn.fetchrow(
        "SELECT completed_at FROM cubepi_runs WHERE thread_id = $1 AND run_id = $2", thread_id, run_id
    )
    if completed is not None:
        raise run_taken(thread_id, run_id, completed=completed["completed_at"] is not None)
    await conn.execute("INSERT INTO cubepi_runs (thread_id, run_id) VALUES ($1, $2)", thread_id, run_id)


async def mark_run_complete(conn: Connection, owner: str, thread_id: str, run_id: str, holder_id: str | None) -> None:
    """cubeloop's completion: the thread's next ``completion_seq`` (revision 2); idempotent.
    The owner admission first, without adoption (a missing thread has no run to complete)."""
    await conn.execute(_LOCK_THREAD, thread_id)
    await admit(conn, owner, thread_id, adopt=False)
    await fence(conn, thread_id, holder_id)
    row = await conn.fetchrow(
        "SELECT completed_at FROM cubepi_runs WHERE thread_id = $1 AND run_id = $2", thread_id, run_id
    )
    if row is None:
        raise run_never_claimed(thread_id, run_id)
    if row["completed_at"] is not None:
        return
    await conn.execute(
        "UPDATE cubepi_runs SET completed_at = now(), completion_seq = (SELECT COALESCE(MAX(completion_seq), 0) + 1"
        " FROM cubepi_runs WHERE thread_id = $1 AND completion_seq IS NOT NULL) WHERE thread_id = $1 AND run_id = $2",
        thread_id,
        run_id,
    )


async def unowned_count(conn: Connection, scope: Scope) -> int:
    """How many threads (cubeloop's thread rows) have no owner: no record, or a record without
    one; read from the unowned threads alone (:meth:`~Scope.threads` of the unowned scope)."""
    unowned = replace(scope, owner=UNOWNED)
    await conn.execute(schema.INDEX_PLANS)
    return await conn.fetchval(
        f"SELECT count(*) FROM ({unowned.threads('$1')}) AS mine JOIN cubepi_threads AS t ON t.thread_id = mine.thread_id",
        UNOWNED,
    )
