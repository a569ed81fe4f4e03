"""SQLite's paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`).

A page is one statement on the ``messages(thread_id, id)`` index: the newest rows below a
row id, newest first with ``LIMIT``, and the count of the thread's rows below that id (so
the rows before the page are its count less the page's). A streamed read walks the same
index in one read transaction, decoding :data:`~core.checkpoint.pages.READ_CHUNK` rows at
a time on the connection thread and handing each chunk to the sink there, so a
100,000-message thread is never held whole, and the event loop never decodes.

Both carry the owner predicate of every read (:func:`~core.checkpoint.sqlite_owners.this_thread`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from core.checkpoint.base import CheckpointData
from core.checkpoint.capabilities import PagedReads
from core.checkpoint.pages import READ_CHUNK, MessagePage, RowReader, RowSink, check_limit, read_rows
from core.checkpoint.sqlite_owners import this_thread
from core.checkpoint.sqlite_queries import decode_rows, thread_parts
from core.checkpoint.sqlite_schema import Layout, read_txn

_TOP = 2**63 - 1  # above every row id (SQLite's largest integer)


class SQLitePages(PagedReads):
    """:class:`~core.checkpoint.capabilities.PagedReads` for
    :class:`~core.checkpoint.sqlite.SQLiteCheckpointer` (a base of it: it uses the store's
    ``_run``, ``_layout`` and ``_owner``). Raises what ``load`` raises."""

    _layout: Layout
    _owner: str
    _run: Callable[[Callable[[sqlite3.Connection], Any], str], Awaitable[Any]]

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """See ``PagedReads.load_page``: one ``SELECT`` on the row id index."""
        check_limit(limit)
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: page(c, layout, owner, thread_id, before, limit), "load")

    async def load_streamed(
        self, thread_id: str, sink: RowSink, *, upto: Any = None, reader: RowReader | None = None
    ) -> CheckpointData | None:
        """See ``PagedReads.load_streamed``: one read transaction; the reader and the sink
        run on the connection thread."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: streamed(c, layout, owner, thread_id, sink, upto, reader), "load")


def page(c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, before: Any, limit: int) -> MessagePage:
    """The page of ``owner``'s thread below row id ``before`` (``None``: the newest rows)."""
    if not layout.has("messages"):
        return MessagePage()
    below = _TOP if before is None else int(before)
    args = {"thread": thread_id, "owner": owner, "below": below, "limit": limit}
    mine = this_thread(layout)
    rows = c.execute(
        "SELECT id, CAST(message_json AS BLOB),"
        f" (SELECT COUNT(*) FROM messages WHERE thread_id = {mine} AND id < :below)"
        f" FROM messages WHERE thread_id = {mine} AND id < :below ORDER BY id DESC LIMIT :limit",
        args,
    ).fetchall()
    if not rows:
        return MessagePage()
    rows.reverse()
    messages, ids, problems = decode_rows([(row_id, raw) for row_id, raw, _ in rows], thread_id)
    return MessagePage(messages, ids, problems, rows[0][2] - len(rows))


def streamed(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    thread_id: str,
    sink: RowSink,
    upto: Any,
    reader: RowReader | None = None,
) -> CheckpointData | None:
    """``owner``'s thread as ``load`` reads it, its message rows (up to row id ``upto``)
    handed to ``sink`` a chunk at a time; ``None`` when it has no extra, no runs and no
    rows up to ``upto``. The thread's other parts are read first: a busy
    database fails a read transaction at its first statement (WAL readers are never
    blocked; a rollback journal's shared lock, once taken, holds to the end), so a retry by
    the store's ``_run`` never hands the sink a row twice."""
    args = {"thread": thread_id, "owner": owner, "upto": _TOP if upto is None else int(upto)}
    mine = this_thread(layout)
    seen = False
    with read_txn(c):
        data, found = thread_parts(c, layout, owner, thread_id)
        if layout.has("messages"):
            cursor = c.execute(
                "SELECT id, CAST(message_json AS BLOB) FROM messages"
                f" WHERE thread_id = {mine} AND id <= :upto ORDER BY id",
                args,
            )
            while chunk := cursor.fetchmany(READ_CHUNK):
                seen = True
                sink(*read_rows(chunk, reader, lambda rows: decode_rows(rows, thread_id)))
    if not seen and not found:
        return None
    return data
