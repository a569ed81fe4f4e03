"""The memory store's paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`):
slices of a thread's list under the store's lock, copied out as every read is."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from core.checkpoint.base import CheckpointData
from core.checkpoint.capabilities import PagedReads
from core.checkpoint.codec import copy_message
from core.checkpoint.pages import READ_CHUNK, MessagePage, RowReader, RowSink, check_limit


class MemoryPages(PagedReads):
    """:class:`~core.checkpoint.capabilities.PagedReads` for
    :class:`~core.checkpoint.memory.MemoryCheckpointer` (a base of it: it reads the store's
    data, ``_visible`` and ``_data``). Row ids are the store's sequence numbers."""

    _d: Any
    _visible: Callable[[str], bool]
    _data: Callable[[str, Any, int], CheckpointData]

    def _thread(self, thread_id: str) -> Any:
        t = self._d.threads.get(thread_id)
        return t if t is not None and self._visible(thread_id) else None

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """See ``PagedReads.load_page``."""
        check_limit(limit)
        async with self._d.lock:
            t = self._thread(thread_id)
            if t is None:
                return MessagePage()
            end = len(t.ids) if before is None else bisect.bisect_left(t.ids, before)
            start = max(0, end - limit)
            return MessagePage([copy_message(m) for m in t.messages[start:end]], t.ids[start:end], [], start)

    async def load_streamed(
        self, thread_id: str, sink: RowSink, *, upto: Any = None, reader: RowReader | None = None
    ) -> CheckpointData | None:
        """See ``PagedReads.load_streamed``: the sink is called with the lock held; a reader
        gets each message (a copy) through ``read_message``, as no row here is text."""
        async with self._d.lock:
            t = self._thread(thread_id)
            if t is None:
                return None
            end = len(t.ids) if upto is None else bisect.bisect_right(t.ids, upto)
            for start in range(0, end, READ_CHUNK):
                stop = min(start + READ_CHUNK, end)
                copies = [copy_message(m) for m in t.messages[start:stop]]
                sink(copies if reader is None else [reader.read_message(m) for m in copies], t.ids[start:stop], [])
            return self._data(thread_id, t, len(t.messages))
