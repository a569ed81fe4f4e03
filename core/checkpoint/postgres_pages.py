"""Postgres's paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`).

A page is one statement on ``cubepi_messages``'s primary key ``(thread_id, seq)``: the
newest rows below a seq, newest first with ``LIMIT``, with the count of the thread's rows
below that seq. A streamed read walks the same key with a server-side cursor in one
repeatable-read transaction, :data:`~core.checkpoint.pages.READ_CHUNK` rows a fetch, each
chunk decoded (:func:`~core.checkpoint.postgres_rows.decode_rows`) and handed to the sink
before the next is fetched. Should the connection break, the read starts again on a new one
after the last row handed over, so the sink never gets a row twice.

Every statement carries the owner predicate of every read (``Scope.visible``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from core.checkpoint import postgres_rows as rows
from core.checkpoint.base import CheckpointData
from core.checkpoint.capabilities import PagedReads
from core.checkpoint.pages import READ_CHUNK, Decoded, MessagePage, RowReader, RowSink, check_limit, read_rows
from core.checkpoint.postgres_queries import thread_parts
from core.checkpoint.postgres_schema import Scope

_TOP = 2**63 - 1  # above every seq (BIGINT)


class PostgresPages(PagedReads):
    """:class:`~core.checkpoint.capabilities.PagedReads` for
    :class:`~core.checkpoint.postgres.PostgresCheckpointer` (a base of it: it uses the
    store's ``_read``, ``_scope`` and ``_ours``). Raises what ``load`` raises."""

    _read: Callable[[Callable[[Any], Awaitable[Any]], str], Awaitable[Any]]
    _scope: Scope
    _ours: bool

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """See ``PagedReads.load_page``: one ``SELECT`` on the primary key."""
        check_limit(limit)
        scope = self._scope
        below = _TOP if before is None else int(before)
        return await self._read(lambda c: page(c, scope, thread_id, below, limit), "load")  # type: ignore[no-any-return]

    async def load_streamed(
        self, thread_id: str, sink: RowSink, *, upto: Any = None, reader: RowReader | None = None
    ) -> CheckpointData | None:
        """See ``PagedReads.load_streamed``: one repeatable-read transaction, a cursor over the rows."""
        scope, ours = self._scope, self._ours
        top = _TOP if upto is None else int(upto)
        handed = [-1]  # the last seq the sink was given, kept across reconnects

        async def read(conn: Any) -> CheckpointData | None:
            data, found = await thread_parts(conn, scope, thread_id, ours)
            seen = handed[0] >= 0
            chunk: list[Any] = []
            query = (
                "SELECT seq, role, metadata::text, payload FROM cubepi_messages"
                f" WHERE thread_id = $1 AND seq > $2 AND seq <= $3 AND {scope.visible('$1', '$4')} ORDER BY seq"
            )
            async for row in conn.cursor(query, thread_id, handed[0], top, scope.owner, prefetch=READ_CHUNK):
                chunk.append(row)
                if len(chunk) == READ_CHUNK:
                    _hand(chunk, thread_id, sink, handed, reader)
                    seen, chunk = True, []
            if chunk:
                _hand(chunk, thread_id, sink, handed, reader)
                seen = True
            return data if seen or found else None

        return await self._read(read, "load")  # type: ignore[no-any-return]


def _hand(chunk: list[Any], thread_id: str, sink: RowSink, handed: list[int], reader: RowReader | None) -> None:
    def decode(some: Sequence[tuple[int, Any]]) -> Decoded:
        return rows.decode_rows([record for _, record in some], thread_id)

    def read(record: Any) -> Any:
        assert reader is not None
        return reader.read_value(rows.row_value(thread_id, *record))

    sink(*read_rows([(record[0], tuple(record)) for record in chunk], reader, decode, read))
    handed[0] = chunk[-1][0]


async def page(conn: Any, scope: Scope, thread_id: str, below: int, limit: int) -> MessagePage:
    """The page of the thread below seq ``below``, in the caller's snapshot."""
    visible = scope.visible("$1", "$4")
    found = await conn.fetch(
        "SELECT seq, role, metadata::text, payload,"
        f" (SELECT count(*) FROM cubepi_messages WHERE thread_id = $1 AND seq < $2 AND {visible})"
        f" FROM cubepi_messages WHERE thread_id = $1 AND seq < $2 AND {visible} ORDER BY seq DESC LIMIT $3",
        thread_id,
        below,
        limit,
        scope.owner,
    )
    if not found:
        return MessagePage()
    found.reverse()
    messages, ids, problems = rows.decode_rows([tuple(r)[:4] for r in found], thread_id)
    return MessagePage(messages, ids, problems, found[0][4] - len(found))
