"""Redis's paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`).

Row ids are positions in the thread's list from 1 (:mod:`core.checkpoint.redis_read`), so
the page below id ``k`` is ``LRANGE msgs k-1-limit k-2``, and the rows before it are its
start. Each read is a read-only script that checks the thread's owner first, as ``LOAD``
does (the same prologue, :mod:`core.checkpoint.redis_scripts`). A streamed read is one
``HEAD`` script (the thread's other parts, its length and its first chunk), then one
``CHUNK`` script per :data:`~core.checkpoint.pages.READ_CHUNK` entries up to that length:
the list is append-only, so those entries are the ones the head saw, and a lost
connection retries one chunk, never hands the sink an entry twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from core.checkpoint.base import CheckpointData
from core.checkpoint.capabilities import PagedReads
from core.checkpoint.pages import READ_CHUNK, Decoded, MessagePage, RowReader, RowSink, check_limit, read_rows
from core.checkpoint.redis_keys import Keys
from core.checkpoint.redis_read import decode_rows, thread_parts
from core.checkpoint.redis_scripts import _READ, _SCOPE, PENDING_OF

PAGE = (
    _READ
    + _SCOPE
    + """
-- The newest entries before list index ARGV[3] (-1: the end), at most ARGV[4] of them:
-- {first index, entries}, or 0 when the thread is not this owner's.
-- KEYS: scope (11)   ARGV: thread_id, owner, stop, limit
if scope() ~= 'ok' then return 0 end
local n = redis.call('LLEN', KEYS[2])
local stop = tonumber(ARGV[3])
if stop < 0 or stop > n then stop = n end
local start = math.max(0, stop - tonumber(ARGV[4]))
if stop == 0 then return {0, {}} end
return {start, redis.call('LRANGE', KEYS[2], start, stop - 1)}
"""
)

HEAD = (
    _READ
    + _SCOPE
    + PENDING_OF
    + """
-- A streamed read's first look: {length, entries 0..ARGV[3], then LOAD's other parts},
-- or 0 when the thread is not this owner's.
-- KEYS: scope (11), answers   ARGV: thread_id, owner, last index
if scope() ~= 'ok' then return 0 end
local pending = redis.call('HGET', KEYS[5], ARGV[1])
return {
  redis.call('LLEN', KEYS[2]), redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[3])), redis.call('GET', KEYS[3]),
  redis.call('HGETALL', KEYS[4]), pending, redis.call('HGETALL', KEYS[6]), redis.call('HGETALL', KEYS[1]),
  answer_stored(pending, KEYS[12]),
}
"""
)

CHUNK = (
    _READ
    + _SCOPE
    + """
-- Entries ARGV[3]..ARGV[4] of the thread's list, or 0 when the thread is not this owner's.
-- KEYS: scope (11)   ARGV: thread_id, owner, first index, last index
if scope() ~= 'ok' then return 0 end
return redis.call('LRANGE', KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
"""
)


class RedisPages(PagedReads):
    """:class:`~core.checkpoint.capabilities.PagedReads` for
    :class:`~core.checkpoint.redis.RedisCheckpointer` (a base of it: it uses the store's
    client, keys, owner, schema version and ``_call``). Raises what ``load`` raises."""

    _keys: Keys
    _owner: str
    _version: int | None
    _live_client: Callable[[], Redis]
    _call: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
    _page_scripts: dict[str, AsyncScript] | None = None

    def _paging(self, name: str) -> AsyncScript:
        if self._page_scripts is None:
            client = self._live_client()
            self._page_scripts = {
                n: client.register_script(t) for n, t in (("PAGE", PAGE), ("HEAD", HEAD), ("CHUNK", CHUNK))
            }
        return self._page_scripts[name]

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """See ``PagedReads.load_page``: one read-only script."""
        check_limit(limit)
        client, script, keys = self._live_client(), self._paging("PAGE"), self._keys.scope(thread_id)
        stop = -1 if before is None else max(int(before) - 1, 0)
        args = [thread_id, self._owner, stop, limit]
        reply = await self._call("load", lambda: script(keys=keys, args=args, client=client))
        if not reply or not reply[1]:
            return MessagePage()
        start, raws = int(reply[0]), reply[1]
        messages, ids, problems = decode_rows(raws, thread_id, start + 1)
        return MessagePage(messages, ids, problems, start)

    async def load_streamed(
        self, thread_id: str, sink: RowSink, *, upto: Any = None, reader: RowReader | None = None
    ) -> CheckpointData | None:
        """See ``PagedReads.load_streamed``: one script for the head, one per chunk after it."""
        client, keys, owner = self._live_client(), self._keys.scope(thread_id), self._owner
        head, chunk = self._paging("HEAD"), self._paging("CHUNK")
        args = [thread_id, owner, READ_CHUNK - 1]
        head_keys = [*keys, self._keys.answers(thread_id)]
        reply = await self._call("load", lambda: head(keys=head_keys, args=args, client=client))
        if not reply:
            return None
        length, raws, *parts = reply
        data, found = thread_parts(thread_id, self._version, *parts)
        end = int(length) if upto is None else min(int(length), max(int(upto), 0))
        if not end and not found:
            return None
        first = 0
        while first < end:
            raws = raws[: end - first]
            rows = list(zip(range(first + 1, first + 1 + len(raws)), raws, strict=True))
            sink(*read_rows(rows, reader, lambda some: _decode(some, thread_id)))
            first += len(raws)
            if first >= end:
                break
            span = [thread_id, owner, first, min(first + READ_CHUNK, end) - 1]
            raws = await self._call("load", lambda span=span: chunk(keys=keys, args=span, client=client))  # type: ignore[misc]
            if not raws:
                break  # deleted meanwhile: what was read is all there is
        return data


def _decode(rows: Sequence[tuple[int, bytes]], thread_id: str) -> Decoded:
    """``(row id, entry)`` rows of consecutive ids (a chunk, or one row) decoded as ``load``
    decodes them."""
    return decode_rows([raw for _, raw in rows], thread_id, rows[0][0]) if rows else ([], [], [])
