"""The SQLite thread listing: summaries without decoding what they do not show, and thread versions.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``,
in one read transaction, each query driven from this owner's threads
(:func:`~core.checkpoint.sqlite_owners.threads_of`, or the named ones:
:func:`~core.checkpoint.sqlite_owners.threads_among`), so the work never grows with other
owners' threads.

What a summary costs (issue 10: the earlier listing decoded eight tail rows and the first
row of every thread, 810 ms of 1,240 at 10,000 threads):

* each thread's last assistant row is found by its stored role (``json_extract``) on a
  backward walk of the ``(thread_id, id)`` index, which stops at the first one: the JSON of
  the rows after it is read once more by SQLite, nothing older is read;
* only the rows from there on are decoded (the reply and what came after it: usually 1-3);
* the first prompt's text is read in SQL from the first row whose role is ``user``: the
  text blocks joined as ``UserMessage.text`` joins them, under the same rule
  :func:`core.checkpoint.listing.prompt_text` applies in Python, rendered from its tables;
  only a row that rule cannot vouch for is decoded.

Thread versions (:func:`thread_versions`) are read from what the writes leave, not kept
at write time, so they hold for every writer of the file (cubeloop's rows included) and
for a browse-only file: the newest message id (ids only grow: AUTOINCREMENT), the runs
claimed and completed, the extra row's presence and revisions, the lease row, the pending
request row.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Hashable
from typing import Any

from core.checkpoint import codec
from core.checkpoint.base import CorruptRow, RunRecord, ThreadSummary
from core.checkpoint.listing import (
    BLOCK_FIELDS,
    MESSAGE_FIELDS,
    REQUIRED_BLOCK_FIELDS,
    TEXT_JOINER,
    in_listing_order,
    prompt_line,
    tail_from,
)
from core.checkpoint.sqlite_owners import mine_of, owned, this_thread
from core.checkpoint.sqlite_queries import decode_rows, julianday_to_unix, pending_requests, runs_of
from core.checkpoint.sqlite_schema import LEASES, RECORDS, Layout, read_txn
from core.checkpoint.sqlite_supervised import all_leases
from core.messages import AnyMessage, UserMessage


def _role(row: str) -> str:
    """SQL for the stored role of message row alias ``row`` (``NULL`` for text that is not JSON)."""
    return f"CASE WHEN json_valid({row}.message_json) THEN json_extract({row}.message_json, '$.role') END"


def _types_ok(doc: str, fields: dict[str, tuple[str, ...]], required: tuple[str, ...] = ()) -> list[str]:
    """SQL terms, one per field: the field of JSON ``doc`` is absent (unless ``required``)
    or holds one of its JSON types."""
    terms = []
    for name, kinds in fields.items():
        listed = ", ".join(f"'{kind}'" for kind in kinds)
        terms.append(f"coalesce(json_type({doc}, '$.{name}') IN ({listed}), {0 if name in required else 1})")
    return terms


def _block_ok(block: str) -> str:
    """SQL true when content block ``block`` (a ``json_each`` row) passes the prompt rule's
    block tables (:data:`~core.checkpoint.listing.BLOCK_FIELDS`)."""
    cases = " ".join(
        f"WHEN '{kind}' THEN {' AND '.join(_types_ok(f'{block}.value', fields, REQUIRED_BLOCK_FIELDS.get(kind, ())))}"
        for kind, fields in BLOCK_FIELDS.items()
    )
    kind = f"json_extract({block}.value, '$.type')"
    # A CASE, not AND: only an object's value is JSON text the json functions can read.
    return (
        f"CASE WHEN {block}.type = 'object' THEN coalesce(json_type({block}.value, '$.type') = 'text', 0)"
        f" AND CASE {kind} {cases} ELSE 1 END ELSE 0 END"
    )


def _prompt_sql(doc: str) -> tuple[str, str]:
    """SQL of ``(ok, text)`` for the user message JSON ``doc`` (valid JSON): ``ok`` true when
    the prompt rule (:func:`core.checkpoint.listing.prompt_text`) vouches for it, ``text``
    its text then (a BLOB of UTF-8, whose lone surrogates SQLite writes as their 3 bytes)."""
    content = f"json_type({doc}, '$.content')"
    fields = " AND ".join(_types_ok(doc, MESSAGE_FIELDS))
    blocks_ok = f"NOT EXISTS (SELECT 1 FROM json_each({doc}, '$.content') AS b WHERE NOT ({_block_ok('b')}))"
    ok = (
        f"(json_extract({doc}, '$.role') = 'user' AND {fields}"
        f" AND CASE coalesce({content}, 'absent') WHEN 'absent' THEN 1 WHEN 'text' THEN 1"
        f" WHEN 'array' THEN {blocks_ok} ELSE 0 END)"
    )
    joined = (
        f"(SELECT group_concat(t, char({ord(TEXT_JOINER)})) FROM (SELECT coalesce(json_extract(b.value, '$.text'), '')"
        f" AS t FROM json_each({doc}, '$.content') AS b"
        " WHERE CASE WHEN b.type = 'object' THEN json_extract(b.value, '$.type') END = 'text' ORDER BY b.key))"
    )
    text = (
        f"CAST(CASE {content} WHEN 'text' THEN json_extract({doc}, '$.content')"
        f" WHEN 'array' THEN coalesce({joined}, '') ELSE '' END AS BLOB)"
    )
    return ok, text


_PROMPT_OK, _PROMPT_TEXT = _prompt_sql("u.message_json")


_Stats = tuple[int, float | None, int | None, int | None]
"""Per thread: message count, the newest row's time (unix seconds), the last assistant
row's id and the first user row's id (``None``: there is none)."""
_NO_MESSAGES: _Stats = (0, None, None, None)


def summaries(c: sqlite3.Connection, layout: Layout, owner: str, among: Collection[str] | None) -> list[ThreadSummary]:
    """``owner``'s threads with messages, runs or extra (only those named in ``among``, when
    given), most recently active first, from one snapshot; see the module docstring for
    what is read and decoded. Each summary carries its lease and pending request."""
    named = None if among is None else json.dumps(sorted(set(among)))
    args: dict[str, Any] = {"owner": owner, "among": named}
    mine = mine_of(layout, named)
    # One pause of the collector for the reads and the summaries made of them: with it on,
    # each batch of new objects would make it walk the tails decoded so far again (measured
    # at 10,000 threads on the loaded 2-core machine: 960 -> 715 ms of CPU for the listing).
    with codec.gc_paused():
        with read_txn(c):
            stats: dict[str, _Stats] = {}
            tails: dict[str, tuple[list[AnyMessage], list[CorruptRow]]] = {}
            firsts: dict[str, str] = {}
            if layout.has("messages"):
                indexed = thread_index(c)
                stats = _stats(c, mine, args, indexed)
                tails = _tails(c, layout, owner, stats, _tail_rows(layout, mine, indexed), args)
                firsts = _first_prompts(c, layout, owner, stats)
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
        out: list[ThreadSummary] = []
        for tid in {**dict.fromkeys(stats), **dict.fromkeys(runs), **dict.fromkeys(extra_ids)}:
            count, last_at, _, _ = stats.get(tid, _NO_MESSAGES)
            tail, problems = tails.get(tid, ((), ()))
            thread_runs = runs.get(tid, ())
            times = [
                t
                for t in (last_at, *(r.claimed_at for r in thread_runs), *(r.completed_at for r in thread_runs))
                if t is not None
            ]
            out.append(
                ThreadSummary(
                    thread_id=tid,
                    message_count=count,
                    last_activity=max(times) if times else None,
                    runs=tuple(thread_runs),
                    tail=tuple(tail),
                    problems=tuple(problems),
                    first_prompt=firsts.get(tid, ""),
                    lease=leases.get(tid),
                    pending_request=pending.get(tid),
                )
            )
        return in_listing_order(out)


def thread_index(c: sqlite3.Connection) -> bool:
    """Whether ``messages`` has an index led by ``thread_id`` (ours since v1; a cubeloop file,
    browsed, has none). Without one, a read of one thread's rows scans the table, so the
    listing reads every row once instead (:func:`_stats`)."""
    for _, name, *_ in c.execute("PRAGMA index_list(messages)"):
        first = c.execute(f"PRAGMA index_info({json.dumps(name)})").fetchone()
        if first is not None and first[2] == "thread_id":
            return True
    return False


def _stats(c: sqlite3.Connection, mine: str, args: dict[str, Any], indexed: bool) -> dict[str, _Stats]:
    """Per thread with messages: ``(count, newest row's time in unix seconds, id of the
    last assistant row or None, id of the first user row or None)``. With the thread index
    each subquery is an index seek (the two role walks stop at their first match); without
    it (a cubeloop file, browsed) one join reads every row once, its role included - the
    seeks would each scan the table, once per thread."""
    if indexed:
        sql = (
            "SELECT mine.thread_id,"
            " (SELECT count(*) FROM messages AS n WHERE n.thread_id = mine.thread_id),"
            " (SELECT l.created_at FROM messages AS l WHERE l.thread_id = mine.thread_id ORDER BY l.id DESC LIMIT 1),"
            f" (SELECT a.id FROM messages AS a WHERE a.thread_id = mine.thread_id AND {_role('a')} = 'assistant'"
            "   ORDER BY a.id DESC LIMIT 1),"
            f" (SELECT u.id FROM messages AS u WHERE u.thread_id = mine.thread_id AND {_role('u')} = 'user'"
            "   ORDER BY u.id LIMIT 1)"
            f" FROM ({mine}) AS mine"
        )
    else:
        sql = (
            "SELECT s.thread_id, s.n, (SELECT l.created_at FROM messages AS l WHERE l.id = s.last), s.reply, s.first"
            " FROM (SELECT mine.thread_id, count(*) AS n, max(x.id) AS last,"
            f" max(CASE WHEN {_role('x')} = 'assistant' THEN x.id END) AS reply,"
            f" min(CASE WHEN {_role('x')} = 'user' THEN x.id END) AS first"
            f" FROM ({mine}) AS mine CROSS JOIN messages AS x ON x.thread_id = mine.thread_id"
            " GROUP BY mine.thread_id) AS s"
        )
    found = {}
    for tid, count, last_at, reply, first_user in c.execute(sql, args):
        if count:
            found[tid] = (count, julianday_to_unix(last_at), reply, first_user)
    return found


def _tail_rows(layout: Layout, mine: str, indexed: bool) -> str:
    """SQL of the rows of the threads in ``mine`` from each one's last assistant row on
    (every row with none): ``(id, thread_id, message_json as BLOB)``. With the thread index,
    one range seek per thread from the start the stats found (``:starts``, a JSON object of
    thread id -> row id); without it, one pass that finds each start again (a window over
    the join, whose automatic index SQLite builds once) - a seek per thread would scan the
    table each time."""
    if indexed:
        return (
            "SELECT x.id, x.thread_id, CAST(x.message_json AS BLOB) FROM json_each(:starts) AS s"
            " CROSS JOIN messages AS x ON x.thread_id = s.key AND x.id >= s.value"
            f" WHERE {owned(layout, 's.key')}"
        )
    return (
        "SELECT w.id, w.thread_id, CAST(m.message_json AS BLOB) FROM (SELECT y.id, y.thread_id,"
        f" max(CASE WHEN {_role('y')} = 'assistant' THEN y.id END) OVER (PARTITION BY y.thread_id) AS reply"
        f" FROM ({mine}) AS mine CROSS JOIN messages AS y ON y.thread_id = mine.thread_id) AS w"
        " CROSS JOIN messages AS m ON m.id = w.id WHERE w.id >= coalesce(w.reply, 0)"
    )


def _tails(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    stats: dict[str, _Stats],
    sql: str,
    args: dict[str, Any],
) -> dict[str, tuple[list[AnyMessage], list[CorruptRow]]]:
    """Each thread's tail: the rows :func:`_tail_rows`'s ``sql`` reads decoded; a stored
    assistant row that does not decode is reported and the one before it is looked for
    (:func:`_tail_before`)."""
    starts = {tid: reply or 0 for tid, (_, _, reply, _) in stats.items()}
    rows: dict[str, list[tuple[int, bytes]]] = {}
    for row_id, tid, raw in c.execute(sql, {**args, "starts": json.dumps(starts)}):
        rows.setdefault(tid, []).append((row_id, raw))
    out = {}
    for tid, found in rows.items():
        found.sort()
        messages, ids, problems = decode_rows(found, tid)
        start = starts[tid]
        cut = tail_from(messages, ids, problems, start) if start else (messages, problems)
        out[tid] = cut if cut is not None else _tail_before(c, layout, owner, tid, start, messages, problems)
    return out


def _tail_before(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    thread_id: str,
    before: int,
    messages: list[AnyMessage],
    problems: list[CorruptRow],
) -> tuple[list[AnyMessage], list[CorruptRow]]:
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


def _first_prompts(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    stats: dict[str, _Stats],
) -> dict[str, str]:
    """Each thread's first prompt line (:func:`~core.checkpoint.listing.prompt_line`) from
    its first user row, read in SQL; a row the prompt rule cannot vouch for is decoded
    (a user message's text, or no prompt when it does not decode: as before)."""
    firsts = [first for _, _, _, first in stats.values() if first is not None]
    out: dict[str, str] = {}
    unsure: list[tuple[str, int]] = []
    for row_id, tid, ok, text in c.execute(
        f"SELECT u.id, u.thread_id, {_PROMPT_OK}, {_PROMPT_TEXT} FROM json_each(:firsts) AS f"
        f" CROSS JOIN messages AS u ON u.id = f.value WHERE {owned(layout, 'u.thread_id')}",
        {"firsts": json.dumps(firsts), "owner": owner},
    ):
        if ok:
            out[tid] = prompt_line(bytes(text).decode("utf-8", "surrogatepass"))
        else:
            unsure.append((tid, row_id))
    for tid, row_id in unsure:
        row = c.execute(
            f"SELECT id, CAST(message_json AS BLOB) FROM messages WHERE thread_id = {this_thread(layout)} AND id = :id",
            {"thread": tid, "owner": owner, "id": row_id},
        ).fetchone()
        decoded = decode_rows([row], tid)[0] if row else []
        if decoded and isinstance(decoded[0], UserMessage):
            out[tid] = prompt_line(decoded[0].text)
    return out


def thread_versions(c: sqlite3.Connection, layout: Layout, owner: str) -> dict[str, Hashable]:
    """Every thread :func:`summaries` lists, by id, with its version: a tuple of what each
    write that changes a summary leaves behind (see the module docstring). One query, a
    few index probes per thread; nothing decoded, no message's JSON read."""
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
    pending_columns = "request_json, created_at" + (", run_id" if has("thread_pending_request", "run_id") else "")
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
    with read_txn(c):
        for tid, last, runs, completed, extra, lease, pending, revisions in c.execute(sql, {"owner": owner}):
            if last is not None or runs or extra is not None:  # what summaries() lists
                out[tid] = (last, runs, completed, extra, lease, pending, revisions)
    return out
