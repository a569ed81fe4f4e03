"""Paged and streamed reads (``PagedReads``), one suite for every backend.

Each test takes the parametrized ``checkpointer`` fixture (``tests/conftest.py``): pages read
back from the newest row give every row once, in order, with the right count before each;
a streamed read hands over exactly what ``load`` returns, a chunk at a time; another
owner's thread reads as a missing one; undecodable rows are kept in both.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from core.checkpoint.base import Checkpointer, CorruptRow
from core.checkpoint.capabilities import PagedReads, supports
from core.checkpoint.pages import READ_CHUNK, MessagePage
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text


def _thread(n: int) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(n):
        if i % 3 == 0:
            out.append(user_text(f"ask {i}", run_id="r1"))
        elif i % 3 == 1:
            out.append(
                AssistantMessage(
                    content=[TextContent(text=f"call {i}"), ToolCall(id=f"c{i}", name="read", arguments={"i": i})],
                    stop_reason="tool_use",
                    run_id="r1",
                )
            )
        else:
            out.append(ToolResultMessage(tool_call_id=f"c{i - 1}", content=[TextContent(text=f"out {i}")], run_id="r1"))
    return out


def _dumps(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json") for m in messages]


class _Collect:
    """A sink that keeps what it was handed, and the size of each chunk."""

    def __init__(self) -> None:
        self.messages: list[AnyMessage] = []
        self.ids: list[Any] = []
        self.problems: list[CorruptRow] = []
        self.chunks: list[int] = []

    def __call__(self, messages: Any, ids: Any, problems: Any) -> None:
        self.messages += messages
        self.ids += ids
        self.problems += problems
        self.chunks.append(len(messages) + len(problems))


async def _all_pages(store: PagedReads, thread_id: str, limit: int) -> list[MessagePage]:
    pages = [await store.load_page(thread_id, limit=limit)]
    while pages[-1].earlier:
        pages.append(await store.load_page(thread_id, before=pages[-1].first_id, limit=limit))
    return pages


async def test_every_backend_pages(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)


async def test_pages_back_from_the_newest_row_hold_every_row_once_in_order(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    messages = _thread(25)
    await checkpointer.append("t", messages[:10])
    await checkpointer.append("t", messages[10:])
    data = await checkpointer.load("t")
    assert data is not None
    pages = await _all_pages(checkpointer, "t", 10)
    assert [(p.rows, p.earlier) for p in pages] == [(10, 15), (10, 5), (5, 0)]
    ids = [i for p in reversed(pages) for i in p.message_ids]
    assert ids == data.message_ids, "every row once, in row order"
    assert _dumps([m for p in reversed(pages) for m in p.messages]) == _dumps(data.messages)
    assert await checkpointer.load_page("t", before=pages[-1].first_id, limit=10) == MessagePage()


async def test_a_page_larger_than_the_thread_holds_it_all(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(4))
    page = await checkpointer.load_page("t", limit=100)
    assert page.rows == 4 and page.earlier == 0
    assert page.first_id == page.message_ids[0] and page.last_id == page.message_ids[-1]


async def test_a_page_sees_rows_appended_since_the_last_one(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(3))
    first = await checkpointer.load_page("t", limit=2)
    await checkpointer.append("t", [user_text("later")])
    newest = await checkpointer.load_page("t", limit=2)
    assert [m.text for m in newest.messages][-1] == "later" and newest.earlier == 2  # type: ignore[union-attr]
    older = await checkpointer.load_page("t", before=first.first_id, limit=2)
    assert older.rows == 1 and older.earlier == 0


async def test_unknown_and_other_owners_threads_page_as_missing(checkpointer: Checkpointer, reopen: Any) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(3))
    other = await reopen("bob")
    assert supports(other, PagedReads)
    assert await checkpointer.load_page("nobody", limit=5) == MessagePage()
    assert await other.load_page("t", limit=5) == MessagePage()
    sink = _Collect()
    assert await checkpointer.load_streamed("nobody", sink) is None
    assert await other.load_streamed("t", sink) is None
    assert sink.chunks == [], "nothing of another owner's thread reaches the sink"


async def test_a_page_of_no_rows_is_refused(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    with pytest.raises(ValueError, match="at least one row"):
        await checkpointer.load_page("t", limit=0)


async def test_a_streamed_read_hands_over_what_load_returns_a_chunk_at_a_time(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    messages = _thread(2 * READ_CHUNK + 7)
    await checkpointer.claim_run("t", "r1")
    await checkpointer.append("t", messages)
    await checkpointer.save_extra("t", {"title": "x"})
    data = await checkpointer.load("t")
    sink = _Collect()
    streamed = await checkpointer.load_streamed("t", sink)
    assert data is not None and streamed is not None
    assert sink.ids == data.message_ids and _dumps(sink.messages) == _dumps(data.messages)
    assert sink.chunks == [READ_CHUNK, READ_CHUNK, 7], "never more than one chunk at a time"
    assert streamed.messages == [] and streamed.message_ids == [] and streamed.problems == []
    assert (streamed.runs, streamed.extra, streamed.journal, streamed.pending_request, streamed.meta) == (
        data.runs,
        data.extra,
        data.journal,
        data.pending_request,
        data.meta,
    )


async def test_a_streamed_read_stops_at_upto(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(9))
    data = await checkpointer.load("t")
    assert data is not None
    sink = _Collect()
    assert await checkpointer.load_streamed("t", sink, upto=data.message_ids[4]) is not None
    assert sink.ids == data.message_ids[:5]


async def test_a_sink_that_raises_ends_the_read(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(READ_CHUNK + 1))
    calls: list[int] = []

    def failing(messages: Any, ids: Any, problems: Any) -> None:
        calls.append(len(messages))
        raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        await checkpointer.load_streamed("t", failing)
    assert calls == [READ_CHUNK]


async def _add_undecodable(store: Checkpointer, thread_id: str) -> bool:
    """Store one row no decoder can read after the thread's rows, as another program might
    (``False`` for the memory store, which keeps objects, not rows)."""
    kind = type(store).__name__
    if kind == "SQLiteCheckpointer":
        with sqlite3.connect(store._path) as db:  # type: ignore[attr-defined]
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES (?, 'not json at all')", (thread_id,))
        db.close()
        return True
    if kind.startswith("PostgresCheckpointer") or kind == "DroppingStore":
        import asyncpg

        conn = await asyncpg.connect(store._url, timeout=10)  # type: ignore[attr-defined]
        try:
            await conn.execute(
                "INSERT INTO cubepi_messages (thread_id, seq, role, payload)"
                " SELECT $1, max(seq) + 1, 'user', '\\xc1'::bytea FROM cubepi_messages WHERE thread_id = $1",
                thread_id,
            )
        finally:
            await conn.close()
        return True
    if kind == "RedisCheckpointer":
        await store._client.rpush(store._keys.msgs(thread_id), b"{not json")  # type: ignore[attr-defined]
        return True
    return False


async def test_undecodable_rows_are_paged_and_streamed_in_their_place(checkpointer: Checkpointer) -> None:
    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(3))
    if not await _add_undecodable(checkpointer, "t"):
        pytest.skip("the memory store keeps messages, not rows: none can be undecodable")
    await checkpointer.append("t", [user_text("after")])
    data = await checkpointer.load("t")
    assert data is not None and len(data.problems) == 1
    bad = data.problems[0].row_id
    newest = await checkpointer.load_page("t", limit=2)
    assert [p.row_id for p in newest.problems] == [bad] and newest.first_id == bad and newest.earlier == 3
    assert [m.text for m in newest.messages] == ["after"]  # type: ignore[union-attr]
    older = await checkpointer.load_page("t", before=newest.first_id, limit=5)
    assert older.message_ids == data.message_ids[:3] and older.problems == []
    sink = _Collect()
    streamed = await checkpointer.load_streamed("t", sink)
    assert streamed is not None and streamed.problems == []
    assert sink.problems == data.problems and sink.ids == data.message_ids
    assert json.dumps(_dumps(sink.messages)) == json.dumps(_dumps(data.messages))


async def test_a_reader_gets_each_row_and_the_store_decodes_only_what_it_refuses(checkpointer: Checkpointer) -> None:
    from core.recovery_skeleton import SkeletonReader, skeleton

    assert supports(checkpointer, PagedReads)
    await checkpointer.append("t", _thread(READ_CHUNK + 3))
    undecodable = await _add_undecodable(checkpointer, "t")
    await checkpointer.append("t", [user_text("after")])
    data = await checkpointer.load("t")
    assert data is not None
    sink = _Collect()
    assert await checkpointer.load_streamed("t", sink, reader=SkeletonReader()) is not None
    assert sink.ids == data.message_ids and sink.problems == data.problems
    assert len(sink.problems) == (1 if undecodable else 0)
    assert sink.messages == [skeleton(m) for m in data.messages], "what a skeleton of each decoded message is"
