"""The PostgreSQL thread listing: summaries decoding only each thread's tail, and thread versions.

Each function takes an asyncpg connection inside the caller's read transaction (one
snapshot) and drives every query from this owner's threads (:meth:`Scope.threads
<core.checkpoint.postgres_schema.Scope.threads>`, or the named ones: :meth:`Scope.among
<core.checkpoint.postgres_schema.Scope.among>`) under
:data:`~core.checkpoint.postgres_schema.INDEX_PLANS`, so it never reads other owners' rows.

What a summary costs: the per-thread counts, newest row, last assistant row and first user
row come from our stats table (kept by a statement trigger on ``cubepi_messages``, whoever
appends; a browse-only database without our tables aggregates every message instead). The
tail rows - from the last assistant row on - are one range seek of the primary key per
thread and the only rows decoded; the first user row, one more seek, is unpacked (msgpack)
and its text read by :func:`core.checkpoint.listing.prompt_text`, decoded only when that
rule cannot vouch for it. (The earlier listing asked ``seq >= last assistant OR seq =
first user`` in one join, which the planner served from cubeloop's ``(thread_id, run_id)``
index, filtering every row of every thread: at 2,000 threads it touched 11,421 buffers at
10 messages a thread and 22,979 at 100; this one 17,985 and 18,022.)

Thread versions (:func:`thread_versions`) are read from what the writes leave: the stats
row (count, newest seq), the thread row's ``updated_at`` and pending request, the runs
claimed and completed, the lease row, our pending text, the record's revisions and whether
the pending request's answer is stored.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from core.checkpoint import codec
from core.checkpoint import postgres_rows as rows
from core.checkpoint import postgres_schema as schema
from core.checkpoint.base import CorruptRow, RunRecord, ThreadSummary
from core.checkpoint.listing import in_listing_order, prompt_line, prompt_text, tail_from
from core.checkpoint.postgres_answers import ANSWER_STORED
from core.checkpoint.postgres_queries import pending_join, pending_ours
from core.checkpoint.postgres_schema import Scope
from core.checkpoint.postgres_supervised import all_leases
from core.errors import CorruptRecordError
from core.messages import AnyMessage, UserMessage

Connection = Any

_EPOCH = "extract(epoch FROM {0})::float8"


def _stats(ours: bool) -> str:
    """The per-thread stats relation: our table, or (browsing) one aggregate over every message."""
    return schema.STATS if ours else f"({schema.STATS_OF_MESSAGES.format(rows='cubepi_messages')})"


async def summaries(conn: Connection, scope: Scope, ours: bool, among: list[str] | None) -> list[ThreadSummary]:
    """This owner's threads (only those in ``among``, when given), most recently active
    first, in four queries whatever their number; see the module docstring."""
    # One pause of the collector for the rows fetched and the summaries made of them (see
    # codec.gc_paused): with it on, each batch of new objects walks those made so far again.
    with codec.gc_paused():
        return await _summaries(conn, scope, ours, among)


async def _summaries(conn: Connection, scope: Scope, ours: bool, among: list[str] | None) -> list[ThreadSummary]:
    named = None if among is None else sorted(set(among))
    params: list[Any] = [scope.owner] if named is None else [scope.owner, named]
    mine = f"({scope.mine('$1', None if named is None else '$2')}) AS mine"
    stats = _stats(ours)
    await conn.execute(schema.INDEX_PLANS)
    threads = await conn.fetch(
        f"SELECT t.thread_id, {_EPOCH.format('t.updated_at')} AS updated_at, t.pending_request::text AS pending,"
        f" t.run_id, {pending_ours(ours)}, COALESCE(s.n, 0) AS n, {_EPOCH.format('s.last_at')} AS last_at,"
        " s.last_assistant_seq, s.first_user_seq"
        f" FROM {mine} JOIN cubepi_threads AS t ON t.thread_id = mine.thread_id"
        f" LEFT JOIN {stats} AS s ON s.thread_id = t.thread_id" + pending_join(ours),
        *params,
    )
    # Per thread, in one query: the tail, a range seek of the primary key from its last
    # assistant row (every row without one), and the first user row before it, one more
    # seek. Each is a subquery in seq order, so the order makes the planner take the
    # (thread_id, seq) key: as a plain join it took cubeloop's (thread_id, run_id) index
    # and filtered on seq, reading every row of every thread.
    columns = "x.thread_id, x.seq, x.role, x.metadata::text, x.payload"
    found = await conn.fetch(
        "SELECT m.* FROM " + mine + f" JOIN {stats} AS s ON s.thread_id = mine.thread_id CROSS JOIN LATERAL ("
        f"(SELECT {columns} FROM cubepi_messages AS x WHERE x.thread_id = mine.thread_id"
        " AND x.seq >= COALESCE(s.last_assistant_seq, 0) ORDER BY x.seq)"
        f" UNION ALL (SELECT {columns} FROM cubepi_messages AS x WHERE x.thread_id = mine.thread_id"
        " AND x.seq >= s.first_user_seq AND s.first_user_seq < COALESCE(s.last_assistant_seq, 0)"
        " ORDER BY x.seq LIMIT 1)) AS m",
        *params,
    )
    by_thread: dict[str, list[Any]] = {}
    firsts: dict[str, Any] = {}
    starts = {t["thread_id"]: (t["last_assistant_seq"] or 0, t["first_user_seq"]) for t in threads}
    for r in found:
        tid, seq = r[0], r[1]
        start, first = starts.get(tid, (0, None))
        if seq == first:
            firsts[tid] = r[1:]
        if seq >= start:
            by_thread.setdefault(tid, []).append(r[1:])
    for rows_of in by_thread.values():
        rows_of.sort(key=lambda row: row[0])
    runs: dict[str, list[RunRecord]] = {}
    for r in await conn.fetch(
        f"SELECT t.thread_id, run_id, {_EPOCH.format('claimed_at')}, {_EPOCH.format('completed_at')}, completion_seq"
        f" FROM {mine} JOIN cubepi_runs AS t ON t.thread_id = mine.thread_id ORDER BY t.thread_id, claimed_at, run_id",
        *params,
    ):
        runs.setdefault(r[0], []).append(rows.run_record(*r[1:]))
    leases = await all_leases(conn, scope, named) if ours else {}
    out = []
    for t in threads:
        tid = t["thread_id"]
        tail, problems = await _tail(conn, scope, t, by_thread.get(tid, []))
        first = _first_prompt(tid, firsts.get(tid))
        out.append(_summary(t, tail, problems, first, runs.get(tid, []), leases))
    return in_listing_order(out)


async def _tail(
    conn: Connection, scope: Scope, thread: Any, found: list[Any]
) -> tuple[list[AnyMessage], list[CorruptRow]]:
    """The thread's tail from its rows at and after the last assistant seq (``found``):
    decoded; when the stored assistant row does not decode, the assistant row before it is
    looked for, again and again (rare: a corrupt payload under cubeloop's ``assistant`` role)."""
    tid, start = thread["thread_id"], thread["last_assistant_seq"]
    messages, ids, problems = rows.decode_rows(found, tid)
    if not start or tail_from(messages, ids, problems, start) is not None:
        return messages, problems
    while True:
        earlier = await conn.fetchval(
            "SELECT max(seq) FROM cubepi_messages WHERE thread_id = $1 AND seq < $2 AND role = 'assistant'"
            f" AND {scope.visible('$1', '$3')}",
            tid,
            start,
            scope.owner,
        )
        more_rows = await conn.fetch(
            "SELECT seq, role, metadata::text, payload FROM cubepi_messages WHERE thread_id = $1"
            f" AND seq >= $2 AND seq < $3 AND {scope.visible('$1', '$4')} ORDER BY seq",
            tid,
            earlier or 0,
            start,
            scope.owner,
        )
        more, more_ids, more_problems = rows.decode_rows(more_rows, tid)
        messages, problems = more + messages, more_problems + problems
        if not earlier or tail_from(more, more_ids, more_problems, earlier) is not None:
            return messages, problems
        start = earlier


def _first_prompt(thread_id: str, first: Any) -> str:
    """The first prompt line from the thread's first user row (``None``: it has none): read
    from its unpacked value by :func:`~core.checkpoint.listing.prompt_text`, decoded only
    where that rule cannot vouch for it (a row that does not decode has no prompt)."""
    if first is None:
        return ""
    try:
        value = rows.row_value(thread_id, *first)
    except CorruptRecordError:
        return ""
    text = prompt_text(value)
    if text is None:
        try:
            message = codec.decode_value(value, thread_id=thread_id, row_id=first[0])
        except CorruptRecordError:
            return ""
        text = message.text if isinstance(message, UserMessage) else None
    return "" if text is None else prompt_line(text)


def _summary(
    thread: Any,
    tail: list[AnyMessage],
    problems: list[CorruptRow],
    first_prompt: str,
    runs: list[RunRecord],
    leases: dict[str, Any],
) -> ThreadSummary:
    tid = thread["thread_id"]
    times = [
        t
        for t in (
            thread["last_at"],
            thread["updated_at"],
            *(r.claimed_at for r in runs),
            *(r.completed_at for r in runs),
        )
        if t is not None
    ]
    return ThreadSummary(
        thread_id=tid,
        message_count=thread["n"],
        last_activity=max(times) if times else None,
        runs=tuple(runs),
        tail=tuple(tail),
        problems=tuple(problems),
        first_prompt=first_prompt,
        lease=leases.get(tid),
        pending_request=rows.pending_of(thread),
    )


async def thread_versions(conn: Connection, scope: Scope, ours: bool) -> dict[str, Hashable]:
    """Every thread :func:`summaries` lists, by id, with its version (see the module
    docstring): one query of index probes per thread; no payload read."""
    lease = (
        f"(SELECT row(l.holder_id, l.acquired_at, l.heartbeat_at, l.expires_at, l.run_id, {scope.revision('l.')})::text"
        f" FROM {schema.LEASES} AS l WHERE l.thread_id = mine.thread_id)"
        if ours
        else "NULL"
    )
    pending = f"(SELECT p.created_at FROM {schema.PENDING} AS p WHERE p.thread_id = mine.thread_id)" if ours else "NULL"
    record = (
        f"(SELECT row(r.extra_revision, r.revision)::text FROM {schema.RECORDS} AS r WHERE r.thread_id = mine.thread_id)"
        if scope.records
        else "NULL"
    )
    await conn.execute(schema.INDEX_PLANS)
    found = await conn.fetch(
        "SELECT mine.thread_id, s.n, s.last_seq, t.updated_at::text, md5(t.pending_request::text), t.run_id,"
        " (SELECT row(count(*), count(u.completed_at))::text FROM cubepi_runs AS u WHERE u.thread_id = mine.thread_id),"
        f" {lease}, {pending}, {record}, {ANSWER_STORED}"
        f" FROM ({scope.threads('$1')}) AS mine JOIN cubepi_threads AS t ON t.thread_id = mine.thread_id"
        f" LEFT JOIN {_stats(ours)} AS s ON s.thread_id = t.thread_id",
        scope.owner,
    )
    return {r[0]: tuple(r[1:]) for r in found}
