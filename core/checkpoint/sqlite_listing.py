"""The SQLite thread listing: summaries without decoding what they do not show, and thread versions.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``,
in one read transaction, each query driven from this owner's threads
(:func:`~core.checkpoint.sqlite_owners.threads_of`, or the named ones:
:func:`~core.checkpoint.sqlite_owners.threads_among`), so the work never grows with other
owners' threads.

What a summary costs (issue 10: the earlier listing decoded eight tail rows and the first
row of every thread, 810 ms of 1,240 at 10,000 threads):

* with the thread index, one query gives each thread its row count, its newest row (time,
  stored role and, when that role is ``assistant``, its JSON: the tail of a thread that
  ended on a reply) and its first row whose stored role is ``user`` (a forward walk of the
  ``(thread_id, id)`` index that stops there): a few index seeks per thread, whatever its
  length. Only a thread whose newest row is not a reply has its last assistant row looked
  for (a backward walk that stops at the first one) and the rows from there read;
* only the tail is decoded (the reply and what came after it: usually 1-3 rows);
* the first prompt's text is read from the first user row's JSON by
  :func:`core.checkpoint.listing.stored_prompt_text` (parsed, not validated); only a row
  that rule cannot vouch for is decoded;
* without the index (a cubeloop file, browsed) one pass over the rows finds the same rows.

Measured (10,000 threads of 10 rows ending on a reply, one of 10,000; CPU of one listing on
the loaded 2-core machine, py-spy): ~370 -> ~230 ms against the listing with three
per-thread queries and the prompt rule in SQL. Of what is left: the query ~34 % (index
and row seeks; ~15 % of the listing is the kernel's page reads, the connection's 2 MB page
cache holding few of the ~13,000 pages read), decoding the tails ~24 %, first prompts ~17 %
(parsing ~1.5 us a row, the rule ~1.5 us), building the summaries ~15 %.

Stored roles are read with SQLite's JSON functions (``NULL`` for text that is not JSON).

The picker's first listing reads both (:func:`listing_and_versions`): the versions' query,
then the listing's, in one read transaction and one hop to the connection thread
(measured, 10,000 threads, same process alternating, load ~2.5: CPU the same, ~300 ms,
wall ~510 -> ~430 ms median against two calls).

Thread versions (:func:`thread_versions`) are read from what the writes leave, not kept
at write time, so they hold for every writer of the file (cubeloop's rows included) and
for a browse-only file: the newest message id (ids only grow: AUTOINCREMENT), the runs
claimed and completed, the extra row's presence and revisions, the lease row, the pending
request row and whether its answer is stored.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from core.checkpoint import codec
from core.checkpoint.base import CorruptRow, RunRecord, ThreadSummary
from core.checkpoint.listing import (
    NOT_JSON,
    in_listing_order,
    prompt_line,
    prompt_text,
    stored_role,
    stored_value,
    tail_from,
)
from core.checkpoint.sqlite_answers import answer_stored
from core.checkpoint.sqlite_owners import mine_of, owned, this_thread
from core.checkpoint.sqlite_queries import decode_rows, julianday_to_unix, pending_requests, runs_of
from core.checkpoint.sqlite_schema import LEASES, RECORDS, Layout, read_txn
from core.checkpoint.sqlite_supervised import all_leases
from core.messages import AnyMessage, AssistantMessage, UserMessage


def _role(row: str) -> str:
    """SQL for the stored role of message row alias ``row`` (``NULL`` for text that is not JSON)."""
    return f"CASE WHEN json_valid({row}.message_json) THEN json_extract({row}.message_json, '$.role') END"


_Rows = list[tuple[int, bytes]]
"""``(row id, stored JSON as bytes)`` pairs of one thread, in id order."""
_Tail = tuple[Sequence[AnyMessage], Sequence[CorruptRow]]
_Thread = tuple[str, int, float | None, int, _Rows, str, _Tail | None]
"""What the message rows give one thread's summary: its id, row count, the newest row's
time (unix seconds), its tail's start row id (0: every row) and the rows from there, its
first prompt's line (``""``: none), and its tail when it was found while reading (``None``:
:func:`_tails` decodes it from those rows)."""
_Decoded = dict[int, AnyMessage]
"""Rows of tails already decoded while they were read, by row id (ids are the table's, unique)."""


def summaries(c: sqlite3.Connection, layout: Layout, owner: str, among: Collection[str] | None) -> list[ThreadSummary]:
    """``owner``'s threads with messages, runs or extra (only those named in ``among``, when
    given), most recently active first, from one snapshot; see the module docstring for
    what is read and decoded. Each summary carries its lease and pending request."""
    # One pause of the collector for the reads and the summaries made of them: with it on,
    # each batch of new objects would make it walk the tails decoded so far again (measured
    # at 10,000 threads on the loaded 2-core machine: 960 -> 715 ms of CPU for the listing).
    with codec.gc_paused(), read_txn(c):
        return _summaries(c, layout, owner, among)


def listing_and_versions(
    c: sqlite3.Connection, layout: Layout, owner: str
) -> tuple[list[ThreadSummary], dict[str, Hashable]]:
    """:func:`summaries` of every thread of ``owner``'s and :func:`thread_versions`, from
    one snapshot (one read transaction, one pause of the collector): the versions are
    exactly those of the summaries, so no write can fall between the two."""
    with codec.gc_paused(), read_txn(c):
        versions = _versions(c, layout, owner)
        return _summaries(c, layout, owner, None), versions


def _summaries(c: sqlite3.Connection, layout: Layout, owner: str, among: Collection[str] | None) -> list[ThreadSummary]:
    """:func:`summaries` inside the caller's read transaction and collector pause."""
    named = None if among is None else json.dumps(sorted(set(among)))
    args: dict[str, Any] = {"owner": owner, "among": named}
    mine = mine_of(layout, named)
    out: list[ThreadSummary] = []
    runs: dict[str, list[RunRecord]] = {}
    for tid, run in runs_of(c, layout, owner, None, named):
        runs.setdefault(tid, []).append(run)
    extra_ids = (
        [
            r[0]
            for r in c.execute(
                f"SELECT e.thread_id FROM ({mine}) AS mine CROSS JOIN thread_extra AS e"
                " ON e.thread_id = mine.thread_id",
                args,
            )
        ]
        if layout.has("thread_extra")
        else []
    )
    leases = all_leases(c, layout, owner, named)
    pending = pending_requests(c, layout, owner, None, named)
    if layout.has("messages"):
        threads, decoded = (
            _read_indexed(c, layout, mine, args) if thread_index(c) else _read_bare(c, layout, mine, args)
        )
        tails = _tails(c, layout, owner, [t for t in threads if t[6] is None], decoded)
        for tid, count, last_at, _, _, first_prompt, tail in threads:
            messages, problems = tail or tails[tid]
            thread_runs = runs.pop(tid, ())
            # Positional, in ThreadSummary's field order: its frozen __init__ with keywords cost
            # ~19,400 instructions a summary against ~15,200 (callgrind), ~14 % of the listing.
            out.append(
                ThreadSummary(
                    tid,
                    count,
                    _last_activity(last_at, thread_runs) if thread_runs else last_at,
                    tuple(thread_runs),
                    tuple(messages),
                    tuple(problems),
                    first_prompt,
                    leases.get(tid),
                    pending.get(tid),
                )
            )
    listed = {s.thread_id for s in out}
    for tid in {**dict.fromkeys(runs), **dict.fromkeys(extra_ids)}:  # threads without messages
        if tid not in listed:
            thread_runs = runs.get(tid, ())
            out.append(
                ThreadSummary(
                    thread_id=tid,
                    message_count=0,
                    last_activity=_last_activity(None, thread_runs),
                    runs=tuple(thread_runs),
                    lease=leases.get(tid),
                    pending_request=pending.get(tid),
                )
            )
    return in_listing_order(out)


def _last_activity(last_at: float | None, runs: Collection[RunRecord]) -> float | None:
    """The newest of a thread's newest row's time and its runs' claims and completions
    (unix seconds; ``None`` when none is known)."""
    times = [t for t in (last_at, *(r.claimed_at for r in runs), *(r.completed_at for r in runs)) if t is not None]
    return max(times) if times else None


def thread_index(c: sqlite3.Connection) -> bool:
    """Whether ``messages`` has an index led by ``thread_id`` (ours since v1; a cubeloop file,
    browsed, has none). Without one, a read of one thread's rows scans the table, so the
    listing reads every row once instead (:func:`_read_bare`)."""
    for _, name, *_ in c.execute("PRAGMA index_list(messages)"):
        first = c.execute(f"PRAGMA index_info({json.dumps(name)})").fetchone()
        if first is not None and first[2] == "thread_id":
            return True
    return False


def _read_indexed(
    c: sqlite3.Connection, layout: Layout, mine: str, args: dict[str, Any]
) -> tuple[list[_Thread], _Decoded]:
    """The rows a listing needs of each thread in ``mine`` (:data:`_Thread`), with the
    thread index, and the tail rows decoded on the way (:data:`_Decoded`).

    One query of index seeks per thread: ``count(*)``, the newest row and the first row
    (``max(id)`` / ``min(id)`` on the index alone, each row by its row id), no JSON read in
    SQL. The newest rows are decoded (they are in every tail): a thread whose newest row is
    a reply has its tail. The first row is parsed as the decoder parses it
    (:func:`~core.checkpoint.listing.stored_value`): when it is a user row, it gives the
    first prompt. Only the threads left (newest row not a reply; first row not a user row)
    are walked as before: the rows from the last one whose stored role is ``assistant`` (a
    backward walk that stops there, inside the bound of one range seek; those decoded
    already are not decoded again), the first row whose stored role is ``user`` (a forward
    walk).
    EXPLAIN QUERY PLAN: the records' owner index, then per thread ``SEARCH ... USING
    COVERING INDEX ix_messages_thread_id`` for the count, the newest and the first id, and
    ``INTEGER PRIMARY KEY`` for the two rows read.

    Measured (10,000 threads ending on a reply): SQLite's JSON functions on the newest and
    the first row were ~30 ms of the query's ~130 ms CPU, on rows Python parses or decodes anyway."""
    sql = (
        "SELECT mine.thread_id, (SELECT count(*) FROM messages AS n WHERE n.thread_id = mine.thread_id),"
        " l.id, l.created_at, CAST(l.message_json AS BLOB), u.id, CAST(u.message_json AS BLOB)"
        f" FROM ({mine}) AS mine"
        " CROSS JOIN messages AS l ON l.id = (SELECT max(x.id) FROM messages AS x WHERE x.thread_id = mine.thread_id)"
        " CROSS JOIN messages AS u ON u.id = (SELECT min(f.id) FROM messages AS f WHERE f.thread_id = mine.thread_id)"
    )
    found = c.execute(sql, args).fetchall()
    messages, ids, _ = decode_rows([(last_id, newest) for _, _, last_id, _, newest, _, _ in found], "")
    decoded: _Decoded = dict(zip(ids, messages, strict=True))
    threads: dict[str, list[Any]] = {}  # a _Thread each, as a list: the walks below fill in the rest
    rest: list[str] = []  # newest row not a reply
    unprompted: list[str] = []  # first row not a user row
    first_replies: set[str] = set()  # first row's stored role is assistant
    for tid, count, last_id, created_at, newest, first_id, first in found:
        value = stored_value(first)
        role = stored_role(value)
        if role == "user":
            prompt = _first_prompt(tid, first_id, first, value)
        else:
            prompt = ""
            unprompted.append(tid)
            if role == "assistant":
                first_replies.add(tid)
        reply = decoded.get(last_id)
        tail = ((reply,), ()) if isinstance(reply, AssistantMessage) else None
        threads[tid] = [tid, count, julianday_to_unix(created_at), last_id, [(last_id, newest)], prompt, tail, first_id]
        if tail is None:
            rest.append(tid)
    if unprompted:
        for tid, first_id, first in c.execute(
            "SELECT r.value, u.id, CAST(u.message_json AS BLOB) FROM json_each(:firsts) AS r"
            " CROSS JOIN messages AS u ON u.id = (SELECT f.id FROM messages AS f WHERE f.thread_id = r.value"
            f" AND {_role('f')} = 'user' ORDER BY f.id LIMIT 1) WHERE {owned(layout, 'r.value')}",
            {**args, "firsts": json.dumps(unprompted)},
        ):
            threads[tid][5] = _first_prompt(tid, first_id, first, stored_value(first))
    if rest:
        # One range seek per thread from its last stored assistant row (every row when it has
        # none), found inside the seek's own bound: measured at 10,000 threads, ~62 ms of CPU
        # against ~84 ms for that search as a query of its own and a seek from what it gave.
        tails = _by_thread(
            c.execute(
                "SELECT x.id, x.thread_id, CAST(x.message_json AS BLOB) FROM json_each(:rest) AS r"
                " CROSS JOIN messages AS x ON x.thread_id = r.value AND x.id >= coalesce((SELECT a.id"
                f" FROM messages AS a WHERE a.thread_id = r.value AND {_role('a')} = 'assistant'"
                f" ORDER BY a.id DESC LIMIT 1), 0) WHERE {owned(layout, 'r.value')}",
                {**args, "rest": json.dumps(rest)},
            )
        )
        for tid in rest:
            thread = threads[tid]
            rows = tails[tid]
            # The seek's first row is the start, except where the thread has no stored reply:
            # then it is the thread's first row, which is not one (0: every row).
            start = rows[0][0]
            if start == thread[7] and tid not in first_replies:
                start = 0
            thread[3:5] = start, rows
    return [tuple(t[:7]) for t in threads.values()], decoded  # type: ignore[misc]


def _read_bare(
    c: sqlite3.Connection, layout: Layout, mine: str, args: dict[str, Any]
) -> tuple[list[_Thread], _Decoded]:
    """:func:`_read_indexed`'s rows without the thread index (a cubeloop file, browsed): one
    join reads every row once, its role included, then one pass finds the tails and the
    first user rows are read by id - a seek per thread would scan the table, once per thread.
    Nothing is decoded here (the :data:`_Decoded` given is empty)."""
    stats = c.execute(
        "SELECT s.thread_id, s.n, (SELECT l.created_at FROM messages AS l WHERE l.id = s.last), s.reply, s.first"
        " FROM (SELECT mine.thread_id, count(*) AS n, max(x.id) AS last,"
        f" max(CASE WHEN {_role('x')} = 'assistant' THEN x.id END) AS reply,"
        f" min(CASE WHEN {_role('x')} = 'user' THEN x.id END) AS first"
        f" FROM ({mine}) AS mine CROSS JOIN messages AS x ON x.thread_id = mine.thread_id"
        " GROUP BY mine.thread_id) AS s",
        args,
    ).fetchall()
    found = _by_thread(c.execute(_tail_rows(mine), args))
    firsts: dict[str, bytes] = dict(
        c.execute(
            "SELECT u.thread_id, CAST(u.message_json AS BLOB) FROM json_each(:firsts) AS f"
            f" CROSS JOIN messages AS u ON u.id = f.value WHERE {owned(layout, 'u.thread_id')}",
            {**args, "firsts": json.dumps([first for *_, first in stats if first is not None])},
        )
    )
    threads: list[_Thread] = []
    for tid, count, created_at, reply, first_id in stats:
        first = firsts.get(tid)
        prompt = "" if first is None else _first_prompt(tid, first_id, first, stored_value(first))
        threads.append((tid, count, julianday_to_unix(created_at), reply or 0, found[tid], prompt, None))
    return threads, {}


def _by_thread(rows: sqlite3.Cursor) -> dict[str, _Rows]:
    """Tail rows (``(id, thread_id, JSON)``) by thread, each thread's in id order."""
    found: dict[str, _Rows] = {}
    for row_id, tid, raw in rows:
        found.setdefault(tid, []).append((row_id, raw))
    for thread_rows in found.values():
        thread_rows.sort()
    return found


def _tail_rows(mine: str) -> str:
    """SQL of the rows of every tail of the threads in ``mine`` without the thread index,
    each from its last assistant row on (every row with none): ``(id, thread_id,
    message_json as BLOB)``, in one pass that finds each start (a window over the join,
    whose automatic index SQLite builds once) - a seek per thread would scan the table each
    time."""
    return (
        "SELECT w.id, w.thread_id, CAST(m.message_json AS BLOB) FROM (SELECT y.id, y.thread_id,"
        f" max(CASE WHEN {_role('y')} = 'assistant' THEN y.id END) OVER (PARTITION BY y.thread_id) AS reply"
        f" FROM ({mine}) AS mine CROSS JOIN messages AS y ON y.thread_id = mine.thread_id) AS w"
        " CROSS JOIN messages AS m ON m.id = w.id WHERE w.id >= coalesce(w.reply, 0)"
    )


def _tails(
    c: sqlite3.Connection, layout: Layout, owner: str, threads: list[_Thread], known: _Decoded
) -> dict[str, _Tail]:
    """Each thread's tail, by thread id: its rows from its start (the last stored assistant
    row's id, 0 for every row) decoded; when the row at the start does not decode as a
    reply it is reported and the one before it is looked for (:func:`_tail_before`).

    Every thread's rows are decoded in one call: measured at 10,000 one-row tails, a call
    per thread cost ~15 ms more (the collector pause and the lists of each call). A row
    that fails is decoded again with its thread's rows, so its problem names its thread.
    Rows in ``known`` (decoded while read) are not decoded again."""
    every = [row for thread in threads for row in thread[4] if row[0] not in known]
    messages, ids, problems = decode_rows(every, "")
    decoded = {**known, **dict(zip(ids, messages, strict=True))}
    failed = {p.row_id for p in problems}
    out: dict[str, _Tail] = {}
    for tid, _, _, start, rows, _, _ in threads:
        if failed and not failed.isdisjoint(row_id for row_id, _ in rows):
            thread_messages, thread_ids, thread_problems = decode_rows(rows, tid)
        else:
            thread_ids = [row_id for row_id, _ in rows]
            thread_messages, thread_problems = [decoded[row_id] for row_id in thread_ids], []
        if not start:
            out[tid] = thread_messages, thread_problems
            continue
        cut = tail_from(thread_messages, thread_ids, thread_problems, start)
        out[tid] = (
            cut if cut is not None else _tail_before(c, layout, owner, tid, start, thread_messages, thread_problems)
        )
    return out


def _tail_before(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    thread_id: str,
    before: int,
    messages: list[AnyMessage],
    problems: list[CorruptRow],
) -> _Tail:
    """The tail of a thread whose stored assistant row at ``before`` did not decode
    (``messages`` and ``problems``: the rows from there on): the rows from the assistant
    row before it (every earlier row when there is none) prepended, until one decodes."""
    args: dict[str, Any] = {"thread": thread_id, "owner": owner, "before": before}
    mine = this_thread(layout)
    while True:
        found = c.execute(
            f"SELECT m.id FROM messages AS m WHERE m.thread_id = {mine} AND m.id < :before"
            f" AND {_role('m')} = 'assistant' ORDER BY m.id DESC LIMIT 1",
            args,
        ).fetchone()
        start = found[0] if found else 0
        rows = c.execute(
            "SELECT id, CAST(message_json AS BLOB) FROM messages"
            f" WHERE thread_id = {mine} AND id >= :start AND id < :before ORDER BY id",
            {**args, "start": start},
        ).fetchall()
        more, ids, more_problems = decode_rows(rows, thread_id)
        messages, problems = more + messages, more_problems + problems
        if not start or tail_from(more, ids, more_problems, start) is not None:
            return messages, problems
        args["before"] = start


def _first_prompt(thread_id: str, row_id: int, raw: bytes, value: Any) -> str:
    """A thread's first prompt line (:func:`~core.checkpoint.listing.prompt_line`) from its
    first user row (its id, JSON and the JSON parsed by
    :func:`~core.checkpoint.listing.stored_value`), read by
    :func:`~core.checkpoint.listing.prompt_text`; a row that rule cannot vouch for is
    decoded (a user message's text, or no prompt when it does not decode: as before)."""
    text = None if value is NOT_JSON else prompt_text(value)
    if text is None:
        decoded = decode_rows([(row_id, raw)], thread_id)[0]
        if not decoded or not isinstance(decoded[0], UserMessage):
            return ""
        text = decoded[0].text
    return prompt_line(text)


def thread_versions(c: sqlite3.Connection, layout: Layout, owner: str) -> dict[str, Hashable]:
    """Every thread :func:`summaries` lists, by id, with its version: a tuple of what each
    write that changes a summary leaves behind (see the module docstring). One query, a
    few index probes per thread; nothing decoded, no message's JSON read."""
    with read_txn(c):
        return _versions(c, layout, owner)


def _versions(c: sqlite3.Connection, layout: Layout, owner: str) -> dict[str, Hashable]:
    """:func:`thread_versions` inside the caller's read transaction."""
    has = layout.has
    # Without the thread index each thread's probe would scan the table: one aggregate instead.
    indexed = not has("messages") or thread_index(c)

    def probe(table: str, what: str, alias: str) -> str:
        return (
            f"(SELECT {what} FROM {table} AS {alias} WHERE {alias}.thread_id = mine.thread_id)"
            if has(table)
            else "NULL"
        )

    lease_columns = "holder_id, acquired_at, heartbeat_at, expires_at, run_id" + (
        ", revision" if has(LEASES, "revision") else ""
    )
    run = "p.run_id" if has("thread_pending_request", "run_id") else "NULL"
    pending_columns = f"p.request_json, p.created_at, {run}, {answer_stored(layout, 'p', run)}"
    record = (
        f"(SELECT json_array(r.extra_revision, r.fingerprints_revision) FROM {RECORDS} AS r"
        " WHERE r.thread_id = mine.thread_id)"
        if has(RECORDS)
        else "NULL"
    )
    sql = (
        "SELECT mine.thread_id,"
        f" {probe('messages', 'max(m.id)', 'm') if indexed else 'last.id'},"
        f" {probe('runs', 'count(*)', 'u')}, {probe('runs', 'count(v.completed_at)', 'v')},"
        f" {probe('thread_extra', '1', 'e')},"
        f" {probe(LEASES, f'json_array({lease_columns})', 'l')},"
        f" {probe('thread_pending_request', f'json_array({pending_columns})', 'p')},"
        f" {record}"
        f" FROM ({mine_of(layout, None)}) AS mine"
        + (
            ""
            if indexed
            else " LEFT JOIN (SELECT thread_id, max(id) AS id FROM messages GROUP BY thread_id) AS last"
            " ON last.thread_id = mine.thread_id"
        )
    )
    out: dict[str, Hashable] = {}
    for tid, last, runs, completed, extra, lease, pending, revisions in c.execute(sql, {"owner": owner}):
        if last is not None or runs or extra is not None:  # what summaries() lists
            out[tid] = (last, runs, completed, extra, lease, pending, revisions)
    return out
