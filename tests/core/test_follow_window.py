"""A windowed follower (issue 10): it holds a thread's newest messages only, reads the rest
once into an outline, and from then on knows the whole thread as a follower that holds it all."""

from __future__ import annotations

import asyncio
from typing import Any

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.follow import ThreadChange, ThreadFollower
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolCall, ToolResultMessage, Usage, user_text
from core.outline import usage_of
from core.providers.faux import FauxProvider
from core.recovery import diagnose
from core.supervisor import Supervisor


def _turns(count: int) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(count):
        if i % 3 == 0:
            out.append(user_text(f"prompt {i}", run_id="r1"))
        elif i % 3 == 1:
            out.append(
                AssistantMessage(
                    content=[TextContent(text=f"call {i}"), ToolCall(id=f"c{i}", name="read")],
                    stop_reason="tool_use",
                    usage=Usage(input_tokens=i, output_tokens=1),
                    run_id="r1",
                )
            )
        else:
            out.append(ToolResultMessage(tool_call_id=f"c{i - 1}", content=[TextContent(text="ok")], run_id="r1"))
    return out


async def _next(changes: list[ThreadChange], n: int, what: str) -> ThreadChange:
    for _ in range(1000):
        if len(changes) >= n:
            return changes[n - 1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {what}")


async def test_it_returns_the_newest_page_then_reports_the_whole_thread_outlined() -> None:
    store = MemoryCheckpointer()
    messages = _turns(100)
    await store.claim_run("t", "r1")
    await store.append("t", messages)
    follower = ThreadFollower(store, "t", window=10, poll=0.01)
    changes: list[ThreadChange] = []
    follower.subscribe(changes.append)
    first = await follower.start(rest_later=True)
    try:
        assert first.reset and [m.text for m in first.added] == [m.text for m in messages[-10:]]  # type: ignore[union-attr]
        assert follower.model.earlier == 90 and not follower.model.ready
        await asyncio.sleep(0.1)
        assert changes == [], "nothing more is read before read_rest"
        follower.read_rest()
        outlined = await _next(changes, 1, "outlined change")
        assert outlined.outlined and not outlined.reset and outlined.added == ()
        model = follower.model
        assert model.ready and model.count == 100 and model.offset == 90 and len(model.messages) == 10
        data = await store.load("t")
        assert data is not None
        assert model.diagnosis() == diagnose(data.messages, data.runs, data.journal)
        assert model.outline is not None and model.outline.totals == usage_of(messages)
        later = [user_text("one more", run_id="r1"), AssistantMessage(content=[TextContent(text="a long reply " * 50)])]
        await store.append("t", later)
        grown = await _next(changes, 2, "change with the new messages")
        assert [m.role for m in grown.added] == ["user", "assistant"]
        assert model.count == 102 and len(model.messages) == 12
        last = model.outline.fold.last_assistant
        assert last is not None and last[0] == 101 and last[1].text == "x", "kept as a skeleton, not whole"
        data = await store.load("t")
        assert data is not None and model.diagnosis() == diagnose(data.messages, data.runs, data.journal)
    finally:
        await follower.stop()


async def test_rows_written_between_the_page_and_the_outline_are_reported_once() -> None:
    store = MemoryCheckpointer()
    await store.append("t", _turns(30))
    follower = ThreadFollower(store, "t", window=5, poll=0.01)
    changes: list[ThreadChange] = []
    follower.subscribe(changes.append)
    first = await follower.start(rest_later=True)
    try:
        await store.append("t", [user_text("meanwhile")])
        follower.read_rest()
        outlined = await _next(changes, 1, "outlined change")
        shown = [*first.added, *outlined.added]
        data = await store.load("t")
        assert data is not None
        assert [m.model_dump() for m in shown] == [m.model_dump() for m in data.messages[-6:]]
        assert follower.model.count == 31 and follower.model.offset == 25
    finally:
        await follower.stop()


async def test_a_forced_refresh_reads_the_page_and_the_outline_again() -> None:
    store = MemoryCheckpointer()
    await store.append("t", _turns(40))
    follower = ThreadFollower(store, "t", window=4, poll=0.01)
    await follower.start()
    try:
        change = await follower.refresh(force=True)
        assert change is not None and change.reset and change.outlined and len(change.added) == 4
        assert follower.model.count == 40 and follower.model.offset == 36
    finally:
        await follower.stop()


async def test_live_events_of_a_run_are_indexed_against_the_whole_thread() -> None:
    """A partial reply streamed by a run is shown once, never as a message already held:
    its index counts every message of the thread, not the ones the window holds."""
    store = MemoryCheckpointer()
    await store.append("t", _turns(60))
    provider = FauxProvider(["A long answer streamed slowly."], delay=0.01, chunk_size=2)
    agent = Agent(provider, store, "t")
    follower = ThreadFollower(store, "t", window=5, poll=0.01)
    changes: list[ThreadChange] = []
    follower.subscribe(changes.append)
    indices: list[int] = []  # the streaming reply's index, as each change saw it
    follower.subscribe(lambda c: indices.append(c.model.partial_index) if c.model.partial is not None else None)
    first = await follower.start()
    try:
        await _next(changes, 1, "outlined change")
        assert await Supervisor(agent).prompt("Go on.") == "completed"
        data = await store.load("t")
        assert data is not None
        for _ in range(500):
            if follower.model.count == len(data.messages) and not follower.model.lease_view.live:
                break
            await asyncio.sleep(0.01)
        shown: list[Any] = [*first.added, *(m for c in changes for m in c.added)]
        assert [m.model_dump() for m in shown] == [m.model_dump() for m in data.messages[-len(shown) :]]
        assert len(shown) == 5 + 2, "the page, then the prompt and the reply, each once"
        assert any(c.deltas or c.partial_reset for c in changes), "the reply streamed"
        assert indices and set(indices) == {61}, "the reply after the 60 stored messages and the prompt"
    finally:
        await follower.stop()
