"""Owners in the SQLite store: the one predicate every read carries, the one admission every
write makes first, and the counts and checks built on them.

A store is opened for one owner (:mod:`core.owners`); a thread's owner is the ``owner``
column of its row in ``cubepi_thread_records``, and a thread without a row (written by
cubeloop, or by cubepi-tui before schema v3) or whose ``owner`` is ``NULL`` is unowned
(:data:`~core.owners.UNOWNED`, the empty string). So "thread X is this owner's" is one SQL
expression, :func:`owned`, compared with the ``:owner`` parameter inside each query itself
(a read of one thread's rows asks it once, through :func:`this_thread`):
another owner's rows are never read, and a foreign thread answers exactly like a missing one.

Queries that use it bind named parameters (``:thread``, ``:owner``, ...), so the predicate
can be added to any statement without counting positions. A file without the records table
(cubeloop's, or ours before v3, browsed) has only unowned threads: the predicate then reads
``'' = :owner``, still in the query.

Every function here runs on aiosqlite's connection thread with a ``sqlite3.Connection``.
"""

from __future__ import annotations

import sqlite3
import time

from core.checkpoint.base import thread_unavailable
from core.checkpoint.sqlite_schema import EVERY_THREAD_RECORDED, RECORDS, THREAD_TABLES, Layout
from core.owners import UNOWNED

LISTED_TABLES = ("messages", "thread_extra", "runs")
"""The tables whose threads ``list_threads`` lists (and :func:`unowned_count` counts)."""


def owner_of(layout: Layout, thread: str = ":thread") -> str:
    """SQL for the owner of the thread named by ``thread`` (a parameter or a column, e.g.
    ``runs.thread_id``): the recorded owner, ``''`` for none. One primary-key probe."""
    if not layout.has(RECORDS):
        return "''"
    return f"coalesce((SELECT owner_rec.owner FROM {RECORDS} AS owner_rec WHERE owner_rec.thread_id = {thread}), '')"


def owned(layout: Layout, thread: str = ":thread") -> str:
    """SQL that is true when the thread named by ``thread`` belongs to the owner bound as
    ``:owner`` (see :func:`owner_of`); the predicate every read of a thread's rows carries."""
    return f"{owner_of(layout, thread)} = :owner"


def this_thread(layout: Layout) -> str:
    """SQL for the thread id bound as ``:thread`` when that thread is ``:owner``'s (see
    :func:`owned`), else ``NULL``: the owner predicate of a read of one thread's rows, as
    ``WHERE thread_id = {this_thread(layout)}``. SQLite computes it once, before the index
    seek, and a seek for ``NULL`` ends at once, so another owner's thread costs what a missing
    one does whatever its size (the predicate beside ``thread_id = :thread`` would be tested
    on every row the seek walks)."""
    return f"CASE WHEN {owned(layout)} THEN :thread END"


def threads_of(layout: Layout) -> str:
    """SQL of a subquery whose column ``thread_id`` lists every thread of the owner bound as
    ``:owner``, for the reads of many threads (the listing, all leases): driven from it
    (``FROM ({threads_of}) AS mine CROSS JOIN t ON t.thread_id = mine.thread_id``, the
    ``CROSS JOIN`` keeping it the outer loop), they do work for this owner's threads alone,
    however many threads others have. From v4 every thread has a record, so this is one
    seek in the records' ``(owner, thread_id)`` index. A file from before v4 (browsed) may
    hold threads without a record: there the unowned scope also walks the listed tables for
    them (correct, slower, and only in that scope); a file without records has only those."""
    listed = " UNION ".join(f"SELECT thread_id FROM {t}" for t in LISTED_TABLES if layout.has(t))
    if not layout.has(RECORDS):
        return f"SELECT thread_id FROM ({listed or 'SELECT NULL AS thread_id WHERE 0'}) WHERE '' = :owner"
    recorded = f"SELECT thread_id FROM {RECORDS} WHERE owner IS nullif(:owner, '')"
    if (layout.version or 0) >= EVERY_THREAD_RECORDED or not listed:
        return recorded
    return (
        f"{recorded} UNION SELECT thread_id FROM ({listed}) AS listed WHERE :owner = ''"
        f" AND NOT EXISTS (SELECT 1 FROM {RECORDS} AS r WHERE r.thread_id = listed.thread_id)"
    )


def threads_among(layout: Layout) -> str:
    """SQL of a subquery like :func:`threads_of`'s, of the thread ids bound as ``:among``
    (a JSON array of strings) that are the owner's bound as ``:owner``, each once: the
    reads of a few named threads (the incremental listing), each id's owner asked in the
    query as :func:`owned` asks it."""
    return (
        f"SELECT DISTINCT among.value AS thread_id FROM json_each(:among) AS among WHERE {owned(layout, 'among.value')}"
    )


def mine_of(layout: Layout, among: str | None) -> str:
    """:func:`threads_of` when ``among`` is ``None``, else :func:`threads_among` (whose
    ``:among`` is ``among``, a JSON array of thread ids)."""
    return threads_of(layout) if among is None else threads_among(layout)


def exists(layout: Layout | None, thread: str = ":thread", tables: tuple[str, ...] = THREAD_TABLES) -> str:
    """SQL that is true when any of ``tables`` holds a row of the thread named by ``thread``;
    with a ``layout``, only the tables the file has (``layout=None``: a writable file, which
    has them all)."""
    probes = [
        f"EXISTS (SELECT 1 FROM {t} WHERE thread_id = {thread})" for t in tables if layout is None or layout.has(t)
    ]
    return "(" + " OR ".join(probes) + ")" if probes else "0"


_THERE = exists(None)
# A thread nobody wrote gets this owner's record (created now); a thread that exists but has
# no record (cubeloop's, or ours before v3) gets one only in the unowned scope, with no owner
# and an unknown creation time, so its revisions have a row to live in.
_ADMIT = (
    f"INSERT INTO {RECORDS} (thread_id, owner, created_at)"
    f" SELECT :thread, nullif(:owner, ''), CASE WHEN {_THERE} THEN NULL ELSE :now END"
    f" WHERE NOT EXISTS (SELECT 1 FROM {RECORDS} WHERE thread_id = :thread) AND (:owner = '' OR NOT {_THERE})"
)
_ADMITTED = f"SELECT 1 FROM {RECORDS} WHERE thread_id = :thread AND coalesce(owner, '') = :owner"


def admit(c: sqlite3.Connection, thread_id: str, owner: str, now: float | None = None) -> None:
    """The first statements of every write transaction on a thread (a writable file, so every
    table exists): unless the thread's record already says it is ``owner``'s, create the
    record when the thread does not exist at all, owned by ``owner`` (the unowned scope
    records no owner), then raise
    :func:`~core.checkpoint.base.thread_unavailable` unless the record says the thread is
    ``owner``'s. So a write to another owner's thread, or from a named owner to an unowned
    one, writes nothing (the caller's transaction rolls back) and learns nothing first: the
    lease fence and every other check come after this. ``now`` (unix seconds) is a new
    record's ``created_at``."""
    args = {"thread": thread_id, "owner": owner, "now": time.time() if now is None else now}
    # Most writes go to a thread that has this owner's record: one primary-key probe.
    if c.execute(_ADMITTED, args).fetchone() is not None:
        return
    c.execute(_ADMIT, args)
    if c.execute(_ADMITTED, args).fetchone() is None:
        raise thread_unavailable(thread_id, owner)


def unowned_count(c: sqlite3.Connection, layout: Layout) -> int:
    """How many listed threads (messages, extra or runs) record no owner; one query, over
    the unowned threads alone (:func:`threads_of` for the unowned scope)."""
    listed = [f"EXISTS (SELECT 1 FROM {t} WHERE thread_id = unowned.thread_id)" for t in LISTED_TABLES if layout.has(t)]
    if not listed:
        return 0
    row = c.execute(
        f"SELECT count(*) FROM ({threads_of(layout)}) AS unowned WHERE {' OR '.join(listed)}", {"owner": UNOWNED}
    ).fetchone()
    return int(row[0])
