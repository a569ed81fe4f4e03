"""Reads of the store the thread view asks the session for, whatever the store can do:
a page of a thread's messages (cut from a whole load where the store has no paged reads)
and how far a crashed run's stepped tool calls got.

Plain functions of the store: the session (:class:`tui.session.Session`) checks that it
is open and may be read this way, then calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.checkpoint.base import CheckpointData, Checkpointer, CorruptRow
from core.checkpoint.capabilities import PagedReads, ToolSteps, supports
from core.checkpoint.pages import MessagePage
from core.messages import AnyMessage
from core.recovery import DanglingCall, step_words
from core.tool_execution import call_job_key


async def load_page(store: Checkpointer, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
    """The thread's newest ``limit`` rows below row id ``before`` (``None``: its newest),
    decoded, with how many rows come before them (:class:`~core.checkpoint.pages.MessagePage`;
    empty for a missing thread). A store without paged reads is loaded whole and cut.
    Raises the store's errors."""
    if supports(store, PagedReads):
        return await store.load_page(thread_id, before=before, limit=limit)
    data = await store.load(thread_id)
    if data is None:
        return MessagePage()
    rows = _stored_rows(data)
    if before is not None:
        rows = [r for r in rows if r[0] < before]
    kept = rows[-limit:]
    return MessagePage(
        [m for _, m in kept if not isinstance(m, CorruptRow)],
        [i for i, m in kept if not isinstance(m, CorruptRow)],
        [m for _, m in kept if isinstance(m, CorruptRow)],
        len(rows) - len(kept),
    )


async def stepped_calls(
    store: Checkpointer, tools: Sequence[Any], thread_id: str, dangling: Sequence[DanglingCall]
) -> dict[str, str]:
    """Tool call id -> how far each of the ``dangling`` calls of a stepped tool got
    ("step 2 of 8 committed at 17:00:43", :func:`core.recovery.step_words`), for the calls
    that committed a step. A call's step record is found as the resume plan finds it
    (``Agent.plan_resume``): under the call's job key for the tool of that name among
    ``tools``, so a tool missing there (or that is not idempotent) shows none, as in the
    plan. Empty for a store that keeps no steps. Raises the store's errors."""
    if not dangling or not supports(store, ToolSteps):
        return {}
    by_name = {t.name: t for t in tools}
    found: dict[str, str] = {}
    for call in dangling:
        tool = by_name.get(call.call.name)
        key = call_job_key(tool, call.call) if tool is not None else None
        record = await store.step_get(thread_id, key) if key is not None else None
        words = step_words(record) if record is not None else ""
        if words:
            found[call.call.id] = words
    return found


def _stored_rows(data: CheckpointData) -> list[tuple[Any, AnyMessage | CorruptRow]]:
    """``(row id, message or undecodable row)`` of a whole load, in row order (a problem that
    is not a row, such as an unreadable extra, is left out)."""
    rows: list[tuple[Any, AnyMessage | CorruptRow]] = list(zip(data.message_ids, data.messages, strict=False))
    rows += [(p.row_id, p) for p in data.problems if isinstance(p.row_id, int)]
    rows.sort(key=lambda r: r[0])
    return rows
