"""The picker's watch (:func:`core.follow.watch_threads`): listed whole once, then only the
threads whose version moved, merged and re-sorted, with ``ThreadsSnapshot.changed`` naming
them - on every backend - and, for a store without thread versions, listed whole and compared."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Hashable, Sequence
from typing import Any

from core.checkpoint.base import Checkpointer, ThreadSummary
from core.checkpoint.capabilities import ChangeNotification
from core.checkpoint.memory import MemoryCheckpointer
from core.follow import ThreadsSnapshot, watch_threads
from core.messages import AnyMessage, AssistantMessage, TextContent, user_text

WAIT = 30.0
"""Seconds a snapshot may take before the test fails: generous for a loaded 2-core machine."""


def reply(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)])


async def next_snapshot(stream: AsyncIterator[ThreadsSnapshot]) -> ThreadsSnapshot:
    return await asyncio.wait_for(anext(stream), WAIT)


async def test_after_the_first_listing_only_changed_threads_are_read(checkpointer: Checkpointer) -> None:
    for tid in ("a", "b", "c"):
        await checkpointer.append(tid, [user_text(f"hello {tid}"), reply("hi")])
        await asyncio.sleep(0.02)  # distinct times (SQLite's julianday has millisecond resolution)
    stream = watch_threads(checkpointer, min_interval=0.01)  # type: ignore[arg-type]
    try:
        first = await next_snapshot(stream)
        assert first.changed is None and [t.thread_id for t in first.threads] == ["c", "b", "a"]
        kept = {t.thread_id: t for t in first.threads}

        await checkpointer.append("a", [user_text("again")])
        second = await next_snapshot(stream)
        assert second.changed == {"a"}
        assert [t.thread_id for t in second.threads] == ["a", "c", "b"], "re-sorted: a is the newest now"
        by_id = {t.thread_id: t for t in second.threads}
        assert by_id["b"] is kept["b"] and by_id["c"] is kept["c"], "the others were not read again"
        assert by_id["a"].message_count == 3 and by_id["a"] == (await checkpointer.list_threads())[0]

        await checkpointer.delete_thread("b")  # type: ignore[attr-defined]
        third = await next_snapshot(stream)
        assert third.changed == {"b"} and [t.thread_id for t in third.threads] == ["a", "c"]

        await checkpointer.claim_run("d", "r1")
        fourth = await next_snapshot(stream)
        assert fourth.changed == {"d"} and {t.thread_id for t in fourth.threads} == {"a", "c", "d"}
        assert fourth.threads == await checkpointer.list_threads(), "the merged list is the listing"
    finally:
        await stream.aclose()


class CountingMemory(MemoryCheckpointer):
    """The memory store, counting whole listings and recording each ``summaries`` request."""

    def __init__(self) -> None:
        super().__init__("alice")
        self.listings = 0
        self.asked: list[set[str]] = []

    async def list_threads(self) -> list[ThreadSummary]:
        self.listings += 1
        return await super().list_threads()

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        self.asked.append(set(thread_ids))
        return await super().summaries(thread_ids)


async def test_a_change_no_summary_shows_yields_nothing_and_reads_no_thread() -> None:
    store = CountingMemory()
    for i in range(50):
        await store.append(f"t{i:02d}", [user_text("go")])
    stream = watch_threads(store, min_interval=0.01)
    try:
        await next_snapshot(stream)
        await store.append_live_events("t07", None, [{"type": "text_delta", "d": "x"}])  # no summary changes
        await asyncio.sleep(0.2)
        await store.append("t31", [reply("done")])
        snapshot = await next_snapshot(stream)
        assert snapshot.changed == {"t31"} and snapshot.threads[0].thread_id == "t31"
        assert store.listings == 1, "listed whole once, at the start"
        assert store.asked == [{"t31"}], "only the thread whose version moved was read"
    finally:
        await stream.aclose()


class Unversioned(Checkpointer, ChangeNotification):
    """A store without ``ThreadVersions``: the memory store's listing and change signals only."""

    def __init__(self) -> None:
        self.inner = MemoryCheckpointer("alice")

    async def load(self, thread_id: str) -> Any:
        return await self.inner.load(thread_id)

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        await self.inner.append(thread_id, messages, holder_id=holder_id)

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        await self.inner.save_extra(thread_id, extra)

    async def list_threads(self) -> list[ThreadSummary]:
        return await self.inner.list_threads()

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        await self.inner.claim_run(thread_id, run_id, holder_id=holder_id)

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        await self.inner.mark_run_complete(thread_id, run_id, holder_id=holder_id)

    async def close(self) -> None:
        await self.inner.close()

    async def change_token(self) -> Hashable:
        return await self.inner.change_token()

    def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        return self.inner.change_signals(stop, quiet_ms=quiet_ms)


async def test_a_store_without_versions_is_listed_whole_and_compared() -> None:
    store = Unversioned()
    await store.append("a", [user_text("one")])
    await store.append("b", [user_text("two")])
    stream = watch_threads(store, min_interval=0.01)
    try:
        first = await next_snapshot(stream)
        assert first.changed is None
        await store.append("a", [reply("yes")])
        second = await next_snapshot(stream)
        assert second.changed == {"a"} and [t.thread_id for t in second.threads] == ["a", "b"]
    finally:
        await stream.aclose()
