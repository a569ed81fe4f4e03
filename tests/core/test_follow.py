"""Following a thread on the memory store: the live fold, the follower, the thread list."""

from __future__ import annotations

import asyncio
import time

from core.agent import Agent
from core.checkpoint.base import Lease, LiveEvent
from core.checkpoint.memory import MemoryCheckpointer
from core.commands import send
from core.follow import ThreadChange, ThreadFollower, watch_threads
from core.lease_status import LeaseState
from core.live import LiveFold
from core.messages import AssistantMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_thinking, faux_tool_call
from core.supervisor import Supervisor
from core.tools import ToolContext, tool


def ev(seq: int, **data) -> LiveEvent:  # type: ignore[no-untyped-def]
    return LiveEvent(seq, "t", "r1", data, 1000.0 + seq)


# --- the fold ------------------------------------------------------------------------------------


def test_the_fold_rebuilds_the_partial_and_drops_what_is_persisted() -> None:
    fold = LiveFold()
    out = fold.apply(
        [
            ev(1, type="agent_start", run_id="r1"),
            ev(2, type="message_end", i=0, role="user"),
            ev(3, type="message_start", i=1, role="assistant"),
            ev(4, type="thinking_delta", i=1, b=0, d="Hmm. "),
            ev(5, type="text_delta", i=1, b=1, d="Hello "),
            ev(6, type="text_delta", i=1, b=1, d="world"),
            ev(7, type="tool_call_start", i=1, b=2, id="c1", name="ls"),
        ],
        persisted=0,
        answered=set(),
    )
    assert out.reload and out.started == "r1" and out.partial_reset
    assert fold.partial_index == 1 and fold.partial is not None
    assert fold.partial.text == "Hello world" and fold.partial.content[0].thinking == "Hmm. "
    assert fold.partial.tool_calls[0].name == "ls"
    assert [d.text for d in out.deltas] == ["Hmm. ", "Hello ", "world"]

    # The reply is persisted: once the reader loaded index 1, the partial goes.
    out = fold.apply([ev(8, type="message_end", i=1, role="assistant")], persisted=1, answered=set())
    assert out.reload and out.partial_reset and fold.partial is None
    # Late deltas of a message already loaded are ignored, never shown twice.
    out = fold.apply([ev(9, type="text_delta", i=1, b=1, d="late")], persisted=2, answered=set())
    assert fold.partial is None and not out.deltas


def test_the_fold_tracks_tools_and_survives_a_pruned_start() -> None:
    fold = LiveFold()
    fold.apply([ev(1, type="tool_execution_update", id="c1", name="fetch", progress=0.4, text="shard 2")], 2, set())
    assert fold.tools["c1"].name == "fetch" and fold.tools["c1"].progress == 0.4 and fold.tools["c1"].text == "shard 2"
    fold.apply([ev(2, type="tool_execution_start", id="c2", name="train", args={"epochs": 5})], 2, set())
    assert fold.tools["c2"].args == {"epochs": 5} and fold.tools["c2"].started_at == 1002.0
    out = fold.settle(3, {"c1"})  # c1's result is persisted
    assert out.tools and list(fold.tools) == ["c2"]
    fold.apply([ev(3, type="tool_execution_end", id="c2", name="train", is_error=False)], 3, set())
    assert fold.tools == {}
    # A tool whose result is already loaded never comes back from an old start.
    fold.apply([ev(4, type="tool_execution_start", id="c1", name="fetch", args={})], 3, {"c1"})
    assert fold.tools == {}


def test_a_snapshot_replaces_the_partial_when_its_start_was_pruned() -> None:
    fold = LiveFold()
    fold.apply([ev(10, type="text_delta", i=3, b=0, d="tail of a")], 3, set())  # start pruned
    fold.apply(
        [
            ev(11, type="message_snapshot", i=3, content=[{"type": "text", "text": "whole text so far"}]),
            ev(12, type="text_delta", i=3, b=0, d="!"),
        ],
        3,
        set(),
    )
    assert fold.partial is not None and fold.partial.text == "whole text so far!"


# --- the follower --------------------------------------------------------------------------------


async def test_follower_shows_a_run_in_this_process_once_each() -> None:
    store = MemoryCheckpointer()
    gate = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Wait for the gate."""
        while not gate.is_set():
            ctx.report(progress=0.3, text="working")
            await asyncio.sleep(0.01)
        return "slow done"

    provider = FauxProvider(
        [
            faux_reply(
                faux_thinking("Plan."),
                faux_text("Let me work on that for a while."),
                faux_tool_call("slow", {}, id="s1"),
            ),
            "All finished now.",
        ],
        delay=0.005,
        chunk_size=3,
    )
    agent = Agent(provider, store, "t", tools=[slow])
    await store.append("t", [user_text("Earlier."), AssistantMessage(content=[faux_text("Earlier answer.")])])
    follower = ThreadFollower(store, "t", poll=0.01)
    changes: list[ThreadChange] = []
    first = await follower.start()
    assert first.reset and len(first.added) == 2
    follower.subscribe(changes.append)
    run = asyncio.create_task(Supervisor(agent).prompt("Do it."))
    while not follower.model.running_tools:
        await asyncio.sleep(0.01)
    assert follower.model.lease_view.state is LeaseState.RUNNING_HERE
    assert follower.model.running_tools["s1"].text == "working"
    gate.set()
    assert await run == "completed"
    while follower.model.lease_view.live or len(follower.model.messages) < 6:
        await asyncio.sleep(0.01)
    await follower.stop()

    shown = list(first.added) + [m for c in changes for m in c.added]
    assert [m.role for m in shown] == ["user", "assistant", "user", "assistant", "tool_result", "assistant"]
    assert [m.role for m in shown] == [m.role for m in (await store.load("t")).messages]
    assert not any(c.reset for c in changes)
    assert any(c.deltas for c in changes) and any(c.tools for c in changes)
    assert follower.model.partial is None and follower.model.running_tools == {}


async def test_changes_begins_with_the_history() -> None:
    store = MemoryCheckpointer()
    await store.append("t", [user_text("One.")])
    async with ThreadFollower(store, "t", poll=0.01) as follower:
        stream = follower.changes()
        first = await anext(stream)
        assert first.reset and [m.text for m in first.added] == ["One."]
        await store.append("t", [user_text("Two.")])  # a writer without live events (e.g. cubeloop)
        second = await asyncio.wait_for(anext(stream), 10)
        assert not second.reset and [m.text for m in second.added] == ["Two."]
        await stream.aclose()


async def test_command_status_changes_are_reported_once_settled() -> None:
    store = MemoryCheckpointer()
    now = time.time()
    await store.acquire_lease(Lease("t", "h", 1, "other-host", "r1", now, now, now + 30), is_stale=lambda _l: True)
    async with ThreadFollower(store, "t", poll=0.01) as follower:
        command = await send(store, "t", "steer", "Left.")
        seen: list[str] = []
        follower.subscribe(lambda c: seen.extend(x.status for x in c.commands if x.seq == command.seq))
        while "pending" not in seen:
            await asyncio.sleep(0.01)
        assert [c.seq for c in follower.model.commands] == [command.seq]
        await store.update_command(command.seq, "applied")
        while "applied" not in seen:
            await asyncio.sleep(0.01)
        assert follower.model.commands == []


async def test_a_command_sent_and_settled_between_two_looks_is_still_reported() -> None:
    # Seen in CI: a fast runner delivered and applied an abort before the app's follower
    # looked again, so the app showed "pending" for good. Look by hand to force that order.
    store = MemoryCheckpointer()
    old = await store.send_command("t", "abort")
    await store.update_command(old.seq, "refused", "too late")
    follower = ThreadFollower(store, "t")
    first = await follower.refresh(force=True)
    assert first is not None and first.commands == ()  # history's settled commands are not news
    command = await store.send_command("t", "abort")
    await store.update_command(command.seq, "delivered")
    await store.update_command(command.seq, "applied")
    change = await follower.refresh()
    assert change is not None and [(c.seq, c.status) for c in change.commands] == [(command.seq, "applied")]
    assert follower.model.commands == []
    assert await follower.refresh() is None  # reported once


class SneakyStore(MemoryCheckpointer):
    """Sends a command right after the follower's command read, once armed: the write lands
    in the middle of the follower's refresh, as another window's would."""

    armed = False
    sent = None

    async def list_commands(self, thread_id, statuses=None, *, after=0):  # type: ignore[no-untyped-def]
        out = await super().list_commands(thread_id, statuses, after=after)
        if self.armed:
            self.armed = False
            self.sent = await self.send_command(thread_id, "abort")
        return out


async def test_a_command_sent_during_a_refresh_and_settled_before_the_next_is_reported() -> None:
    store = SneakyStore()
    await store.append("t", [user_text("hi")])
    follower = ThreadFollower(store, "t")
    reported: list[tuple[int, str]] = []
    follower.subscribe(lambda c: reported.extend((x.seq, x.status) for x in c.commands))
    await follower.refresh(force=True)
    store.armed = True
    await follower.refresh()
    assert store.sent is not None
    await store.update_command(store.sent.seq, "applied")
    await follower.refresh()
    await follower.refresh()
    assert reported == [(store.sent.seq, "applied")]


class CountingStore(MemoryCheckpointer):
    """A memory store that counts whole loads and incremental reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.reads_after: list[object] = []

    async def load(self, thread_id: str):  # type: ignore[no-untyped-def]
        self.loads += 1
        return await super().load(thread_id)

    async def load_after(self, thread_id: str, after_id: object):  # type: ignore[no-untyped-def]
        self.reads_after.append(after_id)
        return await super().load_after(thread_id, after_id)


async def test_the_follower_reads_only_new_rows_after_the_first_load() -> None:
    store = CountingStore()
    await store.append("t", [user_text(f"m{i}") for i in range(50)])
    follower = ThreadFollower(store, "t", reload_interval=0)
    await follower.refresh(force=True)
    for i in range(50, 55):
        await store.append("t", [user_text(f"m{i}")])
        change = await follower.refresh(force=False)
        assert change is not None and [m.text for m in change.added] == [f"m{i}"]
    await follower.refresh(force=False)  # nothing new: an empty read, no change
    assert store.loads == 1 and store.reads_after == [50, 51, 52, 53, 54, 55]  # ids start at 1
    assert [m.text for m in follower.model.messages] == [f"m{i}" for i in range(55)]


async def test_undecodable_rows_are_kept_once_across_incremental_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    from core.checkpoint.sqlite import SQLiteCheckpointer

    path = tmp_path / "t.sqlite"
    async with await SQLiteCheckpointer.open(path) as store:
        await store.append("t", [user_text("one")])
        follower = ThreadFollower(store, "t", reload_interval=0)
        await follower.refresh(force=True)
        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('t', 'not json at all')")
        db.close()
        await follower.refresh(force=False)
        await store.append("t", [user_text("three")])
        change = await follower.refresh(force=False)
        assert change is not None and [m.text for m in change.added] == ["three"]
        await follower.refresh(force=False)
    assert [p.row_id for p in follower.model.problems] == [2]
    assert [m.text for m in follower.model.messages] == ["one", "three"] and follower.model.message_ids == [1, 3]


async def test_a_lease_that_expires_turns_crashed_without_any_write() -> None:
    store = MemoryCheckpointer()
    await store.claim_run("t", "r1")
    now = time.time()
    await store.acquire_lease(Lease("t", "h", 1, "other-host", "r1", now, now, now + 0.3), is_stale=lambda _l: True)
    async with ThreadFollower(store, "t") as follower:
        assert follower.model.lease_view.state is LeaseState.RUNNING_ELSEWHERE
        token = await store.change_token()
        while follower.model.lease_view.state is not LeaseState.CRASHED:
            await asyncio.sleep(0.02)
        assert time.time() >= now + 0.3 and await store.change_token() == token


async def test_watch_threads_lists_again_on_changes_and_on_expiry() -> None:
    store = MemoryCheckpointer()
    await store.append("a", [user_text("Hi")])
    stream = watch_threads(store, min_interval=0.01)
    first = await anext(stream)
    assert [t.thread_id for t in first.threads] == ["a"] and first.views["a"].state is LeaseState.NONE
    await store.claim_run("b", "r1")
    now = time.time()
    await store.acquire_lease(Lease("b", "h", 1, "other-host", "r1", now, now, now + 0.4), is_stale=lambda _l: True)
    await store.append("b", [user_text("Yo")])
    second = await asyncio.wait_for(anext(stream), 10)
    while second.views.get("b") is None or second.views["b"].state is not LeaseState.RUNNING_ELSEWHERE:
        second = await asyncio.wait_for(anext(stream), 10)
    third = await asyncio.wait_for(anext(stream), 10)  # no write: the lease expired
    assert third.views["b"].state is LeaseState.CRASHED and time.time() >= now + 0.4
    await stream.aclose()


def test_the_streaming_reply_carries_its_model() -> None:
    fold = LiveFold()
    fold.apply(
        [
            ev(1, type="message_start", i=0, role="assistant", model="claude-x"),
            ev(2, type="text_delta", i=0, b=0, d="Hi"),
        ],
        persisted=0,
        answered=set(),
    )
    assert fold.partial is not None and fold.partial.model_id == "claude-x"
    fold.apply(
        [ev(3, type="message_snapshot", i=1, model="claude-y", content=[{"type": "text", "text": "So"}])],
        persisted=1,
        answered=set(),
    )
    assert fold.partial is not None and fold.partial.model_id == "claude-y" and fold.partial.text == "So"
    fold.apply([ev(4, type="message_start", i=2, role="assistant")], persisted=2, answered=set())  # an older writer
    assert fold.partial is not None and fold.partial.model_id == ""


async def test_the_live_log_names_the_model_of_a_reply() -> None:
    from core.events import MessageStart
    from core.live import LiveLog

    store = MemoryCheckpointer()
    log = LiveLog(store, "t")
    log.start()
    log.add(MessageStart(AssistantMessage(model_id="claude-x")), 0)
    await log.flush()
    await log.close()
    rows = [e.data for e in await store.read_live_events("t")]
    assert {"type": "message_start", "i": 0, "role": "assistant", "model": "claude-x"} in rows


def test_the_fold_reports_a_retry_wait_until_the_next_attempt_streams() -> None:
    from core.events import RetryWait
    from core.live import LiveRetry

    def wait(seq: int, i: int, until: float) -> LiveEvent:
        return ev(
            seq, type="retry_wait", i=i, until=until, seconds=12.0, reason="rate limited", attempt=1, max_attempts=5
        )

    fold = LiveFold()
    out = fold.apply([ev(1, type="message_start", i=1, role="assistant"), wait(2, 1, 5000.5)], 1, set())
    assert out.retry and fold.retry == LiveRetry(RetryWait(12.0, "rate limited", 1, 5), until=5000.5, index=1)
    out = fold.apply([ev(3, type="text_delta", i=1, b=0, d="Sales")], 1, set())  # the next attempt streams
    assert out.retry and fold.retry is None
    # A wait is also over when its message is persisted, or the run ends.
    fold.apply([wait(4, 1, 6000.0)], 1, set())
    out = fold.apply([ev(5, type="message_end", i=1, role="assistant")], 1, set())
    assert out.retry and fold.retry is None
    fold.apply([wait(6, 2, 7000.0)], 2, set())
    out = fold.apply([ev(7, type="agent_end", run_id="r1", outcome="failed", error="x")], 2, set())
    assert out.retry and fold.retry is None
    # The wait of a message the reader already loaded is over: never shown.
    out = fold.apply([wait(8, 2, 8000.0)], 3, set())
    assert not out.retry and fold.retry is None
    # A follower that stops seeing a live lease forgets it, as it forgets the partial.
    fold.apply([wait(9, 3, 9000.0)], 3, set())
    assert fold.clear().retry and fold.retry is None


async def test_the_live_log_writes_a_retry_wait_with_its_end_in_unix_seconds() -> None:
    from core.events import MessageUpdate, RetryWait
    from core.live import LiveLog

    store = MemoryCheckpointer()
    log = LiveLog(store, "t")
    before = time.time()
    log.add(MessageUpdate(AssistantMessage(), RetryWait(12.0, "rate limited", 1, 5)), 3)
    after = time.time()
    await log.close()
    (row,) = [e.data for e in await store.read_live_events("t")]
    assert before + 12.0 <= row.pop("until") <= after + 12.0
    assert row == {
        "type": "retry_wait",
        "i": 3,
        "seconds": 12.0,
        "reason": "rate limited",
        "attempt": 1,
        "max_attempts": 5,
    }
