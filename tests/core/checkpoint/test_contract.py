"""The checkpointer contract (``core/checkpoint/base.py``), one suite for every backend.

Each test takes the parametrized ``checkpointer`` fixture (``tests/conftest.py``), so a
new backend passes or fails exactly these tests.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from core.checkpoint.base import Checkpointer, Command, JobRecord, JournalEntry, Lease, LiveEvent
from core.errors import (
    CommandTransitionError,
    ConflictError,
    LeaseLostError,
    RunAlreadyClaimedError,
    RunAlreadyCompletedError,
    RunNotClaimedError,
)
from core.messages import (
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    UserMessage,
    user_text,
)


def reply(text: str, *, run_id: str | None = None, calls: tuple[str, ...] = ()) -> AssistantMessage:
    blocks = [TextContent(text=text), *(ToolCall(id=c, name="read", arguments={"path": c}) for c in calls)]
    return AssistantMessage(content=blocks, stop_reason="tool_use" if calls else "stop", run_id=run_id)


def result(call_id: str, *, run_id: str | None = None) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="read", content=[TextContent(text="ok")], run_id=run_id)


def dumps(messages: object) -> list[dict]:
    return [m.model_dump(mode="json") for m in messages]  # type: ignore[attr-defined]


async def test_is_a_checkpointer(checkpointer: Checkpointer) -> None:
    assert isinstance(checkpointer, Checkpointer)


async def test_unknown_thread_loads_as_none_and_lists_as_absent(checkpointer: Checkpointer) -> None:
    assert await checkpointer.load("nobody") is None
    assert await checkpointer.list_threads() == []


async def test_append_then_load_keeps_append_order_across_calls(checkpointer: Checkpointer) -> None:
    first = [user_text("one"), reply("two", calls=("c1",))]
    second = [result("c1"), reply("three")]
    await checkpointer.append("t", first)
    await checkpointer.append("t", second)
    data = await checkpointer.load("t")
    assert data is not None
    assert dumps(data.messages) == dumps(first + second)
    assert len(data.message_ids) == 4 and data.message_ids == sorted(data.message_ids)
    assert data.problems == []


async def test_order_is_append_order_not_timestamps(checkpointer: Checkpointer) -> None:
    late, early = user_text("written first"), user_text("written second")
    late.timestamp, early.timestamp = 2_000_000_000.0, 1_000_000_000.0
    await checkpointer.append("t", [late])
    await checkpointer.append("t", [early])
    data = await checkpointer.load("t")
    assert [m.text for m in data.messages] == ["written first", "written second"]  # type: ignore[union-attr]


async def test_threads_are_kept_apart(checkpointer: Checkpointer) -> None:
    await checkpointer.append("a", [user_text("for a")])
    await checkpointer.append("b", [user_text("for b")])
    await checkpointer.append("a", [reply("answer a")])
    a, b = await checkpointer.load("a"), await checkpointer.load("b")
    assert [m.role for m in a.messages] == ["user", "assistant"]  # type: ignore[union-attr]
    assert [m.text for m in b.messages] == ["for b"]  # type: ignore[union-attr]


async def test_load_is_idempotent(checkpointer: Checkpointer) -> None:
    await checkpointer.append("t", [user_text("hi"), reply("hello")])
    one, two = await checkpointer.load("t"), await checkpointer.load("t")
    assert dumps(one.messages) == dumps(two.messages) and one.message_ids == two.message_ids  # type: ignore[union-attr]


async def test_copies_in_and_out(checkpointer: Checkpointer) -> None:
    sent = reply("original", calls=("c1",))
    await checkpointer.append("t", [sent])
    await checkpointer.save_extra("t", {"nested": {"k": [1]}})
    # mutate what we passed in ...
    sent.content[0].text = "changed after append"  # type: ignore[union-attr]
    # ... and what we got out
    loaded = (await checkpointer.load("t")).messages[0]  # type: ignore[union-attr]
    loaded.content[0].text = "changed after load"  # type: ignore[union-attr]
    loaded.content[1].arguments["path"] = "elsewhere"  # type: ignore[union-attr]
    (await checkpointer.load("t")).extra["nested"]["k"].append(2)  # type: ignore[union-attr]
    again = await checkpointer.load("t")
    assert again.messages[0].content[0].text == "original"  # type: ignore[union-attr]
    assert again.messages[0].content[1].arguments == {"path": "c1"}  # type: ignore[union-attr]
    assert again.extra == {"nested": {"k": [1]}}  # type: ignore[union-attr]


async def test_unknown_fields_roles_and_blocks_round_trip(checkpointer: Checkpointer) -> None:
    from core.checkpoint import codec

    cubeloop_style = codec.decode(
        json.dumps(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}, {"type": "hologram", "payload": {"x": 1}}],
                "id": "4b00f767",
                "error_type": None,
                "tokens_in": 12,
                "stop_reason": "stop",
                "timestamp": 1.5,
                "metadata": {},
                "run_id": None,
            }
        )
    )
    alien = codec.decode(json.dumps({"role": "system", "text": "be brief", "priority": 3, "timestamp": 2.5}))
    assert isinstance(alien, UnknownMessage) and isinstance(cubeloop_style.content[1], UnknownContent)  # type: ignore[union-attr]
    await checkpointer.append("t", [cubeloop_style, alien])
    data = await checkpointer.load("t")
    assert dumps(data.messages) == dumps([cubeloop_style, alien])  # type: ignore[union-attr]
    assert data.messages[0].model_dump()["tokens_in"] == 12  # type: ignore[union-attr]
    assert data.messages[1].model_dump()["priority"] == 3  # type: ignore[union-attr]


async def test_user_content_as_plain_string_round_trips(checkpointer: Checkpointer) -> None:
    await checkpointer.append("t", [UserMessage(content="old style")])
    data = await checkpointer.load("t")
    assert data.messages[0].content == "old style"  # type: ignore[union-attr]


async def test_extra_merges_key_by_key(checkpointer: Checkpointer) -> None:
    await checkpointer.save_extra("t", {"a": 1, "b": {"x": 1}})
    await checkpointer.save_extra("t", {"b": {"y": 2}, "c": None})
    data = await checkpointer.load("t")
    assert data is not None, "a thread with only extra data exists"
    assert data.extra == {"a": 1, "b": {"y": 2}, "c": None}
    assert data.messages == []


async def test_concurrent_save_extra_loses_no_key(checkpointer: Checkpointer) -> None:
    await asyncio.gather(*(checkpointer.save_extra("t", {f"k{i}": i}) for i in range(40)))
    data = await checkpointer.load("t")
    assert data.extra == {f"k{i}": i for i in range(40)}  # type: ignore[union-attr]


async def test_save_extra_rejects_values_json_cannot_hold(checkpointer: Checkpointer) -> None:
    with pytest.raises(TypeError):
        await checkpointer.save_extra("t", {"when": object()})


async def test_claim_and_complete_runs(checkpointer: Checkpointer) -> None:
    await checkpointer.claim_run("t", "r1")
    with pytest.raises(RunAlreadyClaimedError):
        await checkpointer.claim_run("t", "r1")
    await checkpointer.mark_run_complete("t", "r1")
    await checkpointer.mark_run_complete("t", "r1")  # idempotent
    with pytest.raises(RunAlreadyCompletedError):
        await checkpointer.claim_run("t", "r1")
    await checkpointer.claim_run("t", "r2")
    await checkpointer.claim_run("t", "r3")
    await checkpointer.mark_run_complete("t", "r3")
    await checkpointer.mark_run_complete("t", "r2")
    with pytest.raises(RunNotClaimedError):
        await checkpointer.mark_run_complete("t", "never")
    with pytest.raises(RunNotClaimedError):
        await checkpointer.mark_run_complete("other-thread", "r1")
    data = await checkpointer.load("t")
    assert data is not None, "a thread with only runs exists"
    runs = {r.run_id: r for r in data.runs}
    assert [r.run_id for r in data.runs] == ["r1", "r2", "r3"]  # claim order
    assert (runs["r1"].completion_seq, runs["r3"].completion_seq, runs["r2"].completion_seq) == (1, 2, 3)
    assert all(r.completed and r.claimed_at and r.completed_at >= r.claimed_at for r in data.runs)  # type: ignore[operator]


async def test_run_ids_are_per_thread(checkpointer: Checkpointer) -> None:
    await checkpointer.claim_run("a", "r1")
    await checkpointer.claim_run("b", "r1")
    await checkpointer.mark_run_complete("b", "r1")
    await checkpointer.claim_run("b", "r2")
    await checkpointer.mark_run_complete("b", "r2")
    await checkpointer.mark_run_complete("a", "r1")
    a = await checkpointer.load("a")
    assert [r.completion_seq for r in a.runs] == [1]  # type: ignore[union-attr]


async def test_claim_times_are_unix_seconds(checkpointer: Checkpointer) -> None:
    before = time.time()
    await checkpointer.claim_run("t", "r1")
    run = (await checkpointer.load("t")).runs[0]  # type: ignore[union-attr]
    assert before - 2 <= run.claimed_at <= time.time() + 2  # type: ignore[operator]
    assert not run.completed and run.completion_seq is None


async def test_append_to_a_completed_run_raises_and_writes_nothing(checkpointer: Checkpointer) -> None:
    await checkpointer.claim_run("t", "r1")
    await checkpointer.append("t", [user_text("go", run_id="r1")])
    await checkpointer.mark_run_complete("t", "r1")
    with pytest.raises(RunAlreadyCompletedError):
        await checkpointer.append("t", [user_text("fine", run_id=None), reply("late", run_id="r1")])
    data = await checkpointer.load("t")
    assert [m.text for m in data.messages] == ["go"]  # type: ignore[union-attr]
    await checkpointer.append("t", [user_text("new run", run_id="r2")])  # an unclaimed run id is accepted


async def test_append_nothing_is_a_no_op(checkpointer: Checkpointer) -> None:
    await checkpointer.append("t", [])
    assert await checkpointer.load("t") is None


async def test_list_threads_counts_tail_and_first_prompt(checkpointer: Checkpointer) -> None:
    await checkpointer.append("asked", [user_text("only a question")])
    await checkpointer.append(
        "tools",
        [
            user_text("inspect the repo"),
            reply("looking", calls=("c1",)),
            result("c1"),
            reply("done", calls=("c2", "c3")),
        ],
    )
    await checkpointer.append("tools", [result("c2")])
    await checkpointer.append("steered", [user_text("first"), reply("ok"), user_text("and then?", run_id=None)])
    by_id = {s.thread_id: s for s in await checkpointer.list_threads()}
    assert set(by_id) == {"asked", "tools", "steered"}

    asked, tools, steered = by_id["asked"], by_id["tools"], by_id["steered"]
    assert (asked.message_count, tools.message_count, steered.message_count) == (1, 5, 3)
    assert [m.role for m in asked.tail] == ["user"]  # no assistant: every message
    assert [m.role for m in tools.tail] == ["assistant", "tool_result"]
    assert tools.tail[0].text == "done" and tools.tail[1].tool_call_id == "c2"  # type: ignore[union-attr]
    assert [m.role for m in steered.tail] == ["assistant", "user"]
    assert (asked.first_prompt, tools.first_prompt, steered.first_prompt) == (
        "only a question",
        "inspect the repo",
        "first",
    )
    assert all(s.problems == () and s.last_activity is not None for s in by_id.values())


async def test_list_threads_includes_threads_with_only_runs_or_extra(checkpointer: Checkpointer) -> None:
    await checkpointer.claim_run("claimed", "r1")
    await checkpointer.save_extra("noted", {"title": "x"})
    by_id = {s.thread_id: s for s in await checkpointer.list_threads()}
    assert set(by_id) == {"claimed", "noted"}
    assert by_id["claimed"].message_count == 0 and [r.run_id for r in by_id["claimed"].runs] == ["r1"]
    assert by_id["claimed"].tail == () and by_id["claimed"].first_prompt == ""


async def test_list_threads_most_recently_active_first(checkpointer: Checkpointer) -> None:
    for tid in ("old", "middle", "new"):
        await checkpointer.append(tid, [user_text(tid)])
        await asyncio.sleep(0.02)  # sqlite's julianday('now') has millisecond resolution
    await checkpointer.append("old", [reply("old wakes up")])
    assert [s.thread_id for s in await checkpointer.list_threads()] == ["old", "new", "middle"]


async def test_list_threads_tail_is_a_copy(checkpointer: Checkpointer) -> None:
    await checkpointer.append("t", [user_text("q"), reply("a")])
    summary = (await checkpointer.list_threads())[0]
    summary.tail[0].content[0].text = "mutated"  # type: ignore[union-attr]
    assert (await checkpointer.load("t")).messages[1].text == "a"  # type: ignore[union-attr]


# --- SupervisedStore: tool journal, jobs, leases, live events, commands ----------------------


@pytest.fixture
def store(checkpointer: Checkpointer) -> Any:
    """The same backend, seen as a ``SupervisedStore`` (every backend implements both)."""
    return checkpointer


def lease_for(
    holder: str, *, thread: str = "t", now: float | None = None, ttl: float = 30.0, run: str | None = "r1"
) -> Lease:
    at = time.time() if now is None else now
    return Lease(
        thread,
        holder,
        pid=1000 + len(holder),
        host="box",
        run_id=run,
        acquired_at=at,
        heartbeat_at=at,
        expires_at=at + ttl,
    )


def never_stale(_lease: Lease) -> bool:
    return False


def expired(lease: Lease) -> bool:
    return lease.expires_at < time.time()


async def test_journal_start_and_end_round_trip(store: Any) -> None:
    await store.append("t", [user_text("go"), reply("on it", calls=("c1", "c2"))])
    await store.record_tool_event("t", "c1", "start", tool_name="read", run_id="r1", job_key="k1", at=100.0)
    await store.record_tool_event("t", "c2", "start", tool_name="read", run_id="r1", at=101.0)
    await store.record_tool_event("t", "c1", "end", at=102.5)  # keeps what start wrote
    journal = await store.load_journal("t")
    assert journal == {
        "c1": JournalEntry("c1", "read", "r1", 100.0, 102.5, "k1"),
        "c2": JournalEntry("c2", "read", "r1", 101.0, None, None),
    }
    data = await store.load("t")
    assert data.journal == journal
    assert await store.load_journal("elsewhere") == {}


async def test_journal_start_again_clears_the_old_end_and_end_alone_is_kept(store: Any) -> None:
    await store.record_tool_event("t", "c1", "start", tool_name="read", at=1.0)
    await store.record_tool_event("t", "c1", "end", at=2.0)
    await store.record_tool_event("t", "c1", "start", at=3.0)  # a resume re-runs the call
    await store.record_tool_event("t", "c9", "end", tool_name="write", at=4.0)
    journal = await store.load_journal("t")
    assert journal["c1"] == JournalEntry("c1", "read", None, 3.0, None, None)
    assert journal["c9"] == JournalEntry("c9", "write", None, None, 4.0, None)
    with pytest.raises(ValueError):
        await store.record_tool_event("t", "c1", "middle")


async def test_journal_times_default_to_now(store: Any) -> None:
    before = time.time()
    await store.record_tool_event("t", "c1", "start")
    entry = (await store.load_journal("t"))["c1"]
    assert before - 1 <= entry.started_at <= time.time() + 1


async def test_load_has_an_empty_journal_when_no_tool_ran(store: Any) -> None:
    await store.append("t", [user_text("hi")])
    assert (await store.load("t")).journal == {}


async def test_job_begin_finish_get(store: Any) -> None:
    assert await store.job_get("t", "k") is None
    first = await store.job_begin("t", "k", tool_call_id="c1")
    assert (first.key, first.status, first.attempts, first.tool_call_id, first.result) == (
        "k",
        "started",
        1,
        "c1",
        None,
    )
    assert first.started_at is not None and first.finished_at is None
    again = await store.job_begin("t", "k")  # started -> started: an earlier start crashed or still runs
    assert (again.status, again.attempts, again.tool_call_id) == ("started", 2, "c1")
    await store.job_finish("t", "k", "done", {"rows": [1, 2], "ok": True})
    done = await store.job_get("t", "k")
    assert (done.status, done.result, done.attempts) == ("done", {"rows": [1, 2], "ok": True}, 2)
    assert done.finished_at is not None and done.finished_at >= done.started_at
    assert await store.job_begin("t", "k", tool_call_id="c7") == done  # done is returned unchanged
    await store.job_finish("t", "k", "failed", "a late duplicate")  # the first result wins
    assert await store.job_get("t", "k") == done


async def test_a_failed_job_may_begin_again(store: Any) -> None:
    await store.job_begin("t", "k")
    await store.job_finish("t", "k", "failed", {"error": "disk full"})
    failed = await store.job_get("t", "k")
    assert (failed.status, failed.result) == ("failed", {"error": "disk full"})
    retry = await store.job_begin("t", "k")
    assert (retry.status, retry.attempts, retry.result, retry.finished_at) == ("started", 2, None, None)


async def test_jobs_are_per_thread_and_finish_needs_a_begin(store: Any) -> None:
    await store.job_begin("a", "k")
    await store.job_finish("a", "k", "done", 1)
    assert (await store.job_begin("b", "k")).status == "started"
    with pytest.raises(KeyError):
        await store.job_finish("c", "k", "done", 1)
    with pytest.raises(TypeError) as error:
        await store.job_finish("b", "k", "done", object())
    assert str(error.value).endswith(".")
    assert (await store.job_get("b", "k")).status == "started", "a refused result writes nothing"


async def test_job_results_are_copies(store: Any) -> None:
    await store.job_begin("t", "k")
    sent = {"items": [1]}
    await store.job_finish("t", "k", "done", sent)
    sent["items"].append(2)
    got = await store.job_get("t", "k")
    got.result["items"].append(3)
    assert (await store.job_get("t", "k")).result == {"items": [1]}
    assert isinstance(got, JobRecord)


async def test_concurrent_job_begins_in_one_process_give_one_fresh_start(store: Any) -> None:
    records = await asyncio.gather(*(store.job_begin("t", "k") for _ in range(10)))
    assert sorted(r.attempts for r in records) == list(range(1, 11))


async def test_lease_acquire_reacquire_refuse_and_take_over(store: Any) -> None:
    mine = lease_for("me")
    assert await store.acquire_lease(mine, is_stale=never_stale) == mine
    assert await store.get_lease("t") == mine
    # Each write of the lease row takes the next revision (the caller's is not stored).
    renewed = replace(mine, heartbeat_at=mine.heartbeat_at + 1, expires_at=mine.expires_at + 1, revision=2)
    assert await store.acquire_lease(replace(renewed, revision=1), is_stale=never_stale) == renewed  # same holder
    with pytest.raises(RunAlreadyClaimedError) as error:
        await store.acquire_lease(lease_for("you"), is_stale=never_stale)
    assert error.value.lease == renewed
    message = str(error.value)
    assert message.startswith("Thread t is already running (holder pid 1002 on box, heartbeat ") and message.endswith(
        "s ago)."
    )
    assert await store.get_lease("t") == renewed, "a refused acquire changes nothing"

    seen: list[Lease] = []
    sent = lease_for("you")
    yours = replace(sent, revision=3)  # a takeover writes the same row again
    assert await store.acquire_lease(sent, is_stale=lambda cur: seen.append(cur) or True) == yours
    assert seen == [renewed], "is_stale is asked about the current lease"
    assert await store.get_lease("t") == yours
    assert await store.renew_lease("t", "me", 1.0, 2.0) is False, "the old holder lost it"
    assert await store.renew_lease("t", "you", yours.heartbeat_at + 5, yours.expires_at + 5) is True
    got = await store.get_lease("t")
    assert (got.heartbeat_at, got.expires_at, got.acquired_at, got.revision) == (
        yours.heartbeat_at + 5,
        yours.expires_at + 5,
        yours.acquired_at,
        4,
    )


async def test_an_expired_lease_is_taken_over(store: Any) -> None:
    old = lease_for("crashed", now=time.time() - 100, ttl=10)
    await store.acquire_lease(old, is_stale=expired)
    with pytest.raises(RunAlreadyClaimedError):
        await store.acquire_lease(lease_for("next"), is_stale=lambda cur: False)
    await store.acquire_lease(lease_for("next"), is_stale=expired)
    assert (await store.get_lease("t")).holder_id == "next"


async def test_lease_release_only_by_its_holder_and_listing(store: Any) -> None:
    await store.acquire_lease(lease_for("me"), is_stale=never_stale)
    await store.acquire_lease(lease_for("me", thread="u"), is_stale=never_stale)
    assert await store.renew_lease("nothing", "me", 1.0, 2.0) is False
    await store.release_lease("t", "someone-else")
    assert (await store.get_lease("t")).holder_id == "me"
    assert set(await store.list_leases()) == {"t", "u"}
    await store.release_lease("t", "me")
    await store.release_lease("t", "me")  # releasing nothing is fine
    assert await store.get_lease("t") is None
    assert list(await store.list_leases()) == ["u"]
    await store.acquire_lease(lease_for("other"), is_stale=never_stale)  # free again


async def test_concurrent_acquires_in_one_process_have_one_winner(store: Any) -> None:
    async def try_take(holder: str) -> bool:
        try:
            await store.acquire_lease(lease_for(holder), is_stale=never_stale)
        except RunAlreadyClaimedError:
            return False
        return True

    wins = await asyncio.gather(*(try_take(f"h{i}") for i in range(12)))
    assert sum(wins) == 1


async def test_thread_summary_carries_its_lease(store: Any) -> None:
    await store.append("t", [user_text("hi")])
    await store.append("free", [user_text("hi")])
    mine = await store.acquire_lease(lease_for("me"), is_stale=never_stale)
    by_id = {s.thread_id: s for s in await store.list_threads()}
    assert by_id["t"].lease == mine and by_id["free"].lease is None


async def test_live_events_in_order_after_seq_and_pruned(store: Any) -> None:
    await store.append_live_events(
        "t", "r1", [{"type": "text_delta", "text": "a"}, {"type": "text_delta", "text": "b"}]
    )
    await store.append_live_events("u", None, [{"type": "tool_progress", "pct": 10}])
    await store.append_live_events("t", "r1", [{"type": "text_delta", "text": "c"}])
    await store.append_live_events("t", "r1", [])
    events = await store.read_live_events("t")
    assert [e.data["text"] for e in events] == ["a", "b", "c"]
    assert all(isinstance(e, LiveEvent) and e.thread_id == "t" and e.run_id == "r1" for e in events)
    assert [e.seq for e in events] == sorted(e.seq for e in events) and len({e.seq for e in events}) == 3
    assert [e.data["text"] for e in await store.read_live_events("t", after_seq=events[0].seq)] == ["b", "c"]
    assert await store.read_live_events("t", after_seq=events[-1].seq) == []
    u = await store.read_live_events("u")
    assert [(e.run_id, e.data) for e in u] == [(None, {"type": "tool_progress", "pct": 10})]
    await store.prune_live_events("t")
    assert await store.read_live_events("t") == []
    assert len(await store.read_live_events("u")) == 1
    await store.append_live_events("t", "r2", [{"type": "text_delta", "text": "d"}])
    (d,) = await store.read_live_events("t")
    assert d.seq > events[-1].seq, "seq keeps increasing after a prune"


async def test_live_events_are_bounded_per_thread(store: Any) -> None:
    await store.append_live_events("other", None, [{"type": "x", "i": -1}])
    for start in range(0, 30, 7):
        await store.append_live_events(
            "t", "r1", [{"type": "x", "i": i} for i in range(start, min(start + 7, 30))], keep=10
        )
    events = await store.read_live_events("t")
    assert [e.data["i"] for e in events] == list(range(20, 30))
    await store.append_live_events("t", "r1", [{"type": "x", "i": i} for i in range(30, 45)], keep=10)
    assert [e.data["i"] for e in await store.read_live_events("t")] == list(range(35, 45))
    assert len(await store.read_live_events("other")) == 1, "bounding one thread leaves the others alone"


async def test_live_events_are_copies_and_must_be_json(store: Any) -> None:
    sent = {"type": "x", "items": [1]}
    await store.append_live_events("t", None, [sent])
    sent["items"].append(2)
    (got,) = await store.read_live_events("t")
    got.data["items"].append(3)
    assert (await store.read_live_events("t"))[0].data == {"type": "x", "items": [1]}
    with pytest.raises(TypeError):
        await store.append_live_events("t", None, [{"type": "x", "when": object()}])
    assert len(await store.read_live_events("t")) == 1


async def test_live_event_times_are_unix_seconds(store: Any) -> None:
    before = time.time()
    await store.append_live_events("t", None, [{"type": "x"}])
    (event,) = await store.read_live_events("t")
    assert before - 1 <= event.at <= time.time() + 1


async def test_load_after_reads_only_newer_rows_and_the_whole_rest(store: Any) -> None:
    first = [user_text("one"), reply("two", calls=("c1",))]
    await store.append("t", first)
    await store.claim_run("t", "r1")
    await store.save_extra("t", {"title": "x"})
    await store.record_tool_event("t", "c1", "start", tool_name="read")
    ids = (await store.load("t")).message_ids
    await store.append("t", [result("c1"), reply("three")])
    whole = await store.load("t")
    newer = await store.load_after("t", ids[-1])
    assert dumps(newer.messages) == dumps(whole.messages[2:]) and newer.message_ids == whole.message_ids[2:]
    assert newer.runs == whole.runs and newer.extra == {"title": "x"} and newer.journal == whole.journal
    assert dumps((await store.load_after("t", ids[0])).messages) == dumps(whole.messages[1:])
    nothing = await store.load_after("t", whole.message_ids[-1])
    assert nothing.messages == [] and nothing.message_ids == [] and nothing.runs == whole.runs
    unknown = await store.load_after("nobody", 0)
    assert unknown is not None and unknown.messages == [] and unknown.runs == []
    # copies out: changing what was read changes nothing stored
    newer.messages[0].content[0].text = "changed"
    assert dumps((await store.load("t")).messages) == dumps(whole.messages)


async def test_commands_lifecycle(store: Any) -> None:
    before = time.time()
    steer = await store.send_command("t", "steer", "look at tests first")
    abort = await store.send_command("t", "abort")
    other = await store.send_command("u", "follow_up", "then deploy")
    assert isinstance(steer, Command) and steer.seq < abort.seq < other.seq
    assert (steer.thread_id, steer.kind, steer.text, steer.status, steer.note) == (
        "t",
        "steer",
        "look at tests first",
        "pending",
        "",
    )
    assert before - 1 <= steer.created_at == steer.updated_at <= time.time() + 1
    assert abort.text == ""
    assert await store.list_commands("t") == [steer, abort]
    delivered = await store.update_command(steer.seq, "delivered")
    assert (delivered.status, delivered.created_at, delivered.text) == ("delivered", steer.created_at, steer.text)
    assert delivered.updated_at >= steer.updated_at
    refused = await store.update_command(abort.seq, "refused", "the run had already ended")
    assert (refused.status, refused.note) == ("refused", "the run had already ended")
    assert await store.list_commands("t", statuses=["pending"]) == []
    assert await store.list_commands("t", statuses=["delivered", "refused"]) == [delivered, refused]
    assert await store.list_commands("u", statuses=["pending"]) == [other]
    applied = await store.update_command(steer.seq, "applied")
    assert await store.list_commands("t") == [applied, refused]
    assert await store.list_commands("t", after=steer.seq) == [refused]
    assert await store.list_commands("t", ["applied"], after=steer.seq - 1) == [applied]
    assert await store.list_commands("t", after=abort.seq) == []
    assert await store.list_commands("nobody") == []


async def test_commands_refuse_unknown_seq_kind_and_status(store: Any) -> None:
    with pytest.raises(KeyError):
        await store.update_command(12345, "applied")
    with pytest.raises(ValueError):
        await store.send_command("t", "reboot")
    sent = await store.send_command("t", "abort")
    with pytest.raises(ValueError):
        await store.update_command(sent.seq, "exploded")
    assert await store.list_commands("t") == [sent]


async def test_change_token_changes_after_every_kind_of_write(store: Any) -> None:
    tokens = [await store.change_token()]

    async def changed() -> None:
        token = await store.change_token()
        assert token != tokens[-1]
        tokens.append(token)

    assert await store.change_token() == tokens[-1], "reading changes nothing"
    await store.append("t", [user_text("hi")])
    await changed()
    await store.save_extra("t", {"a": 1})
    await changed()
    await store.claim_run("t", "r1")
    await changed()
    await store.record_tool_event("t", "c1", "start")
    await changed()
    await store.job_begin("t", "k")
    await changed()
    await store.acquire_lease(lease_for("me"), is_stale=never_stale)
    await changed()
    await store.append_live_events("t", "r1", [{"type": "x"}])
    await changed()
    await store.send_command("t", "abort")
    await changed()
    await store.load("t")
    await store.list_threads()
    assert await store.change_token() == tokens[-1]


# --- fenced writes: a run writes only while it holds the thread's live lease -----------------


def fenced_writes(store: Any, holder: str) -> dict[str, Any]:
    """Each write a run makes, fenced by ``holder``, as a call to make (run r1 claimed, job k begun)."""
    return {
        "append": lambda: store.append("t", [reply("late", run_id="r1")], holder_id=holder),
        "claim_run": lambda: store.claim_run("t", "r2", holder_id=holder),
        "mark_run_complete": lambda: store.mark_run_complete("t", "r1", holder_id=holder),
        "record_tool_event": lambda: store.record_tool_event("t", "c1", "end", holder_id=holder),
        "job_begin": lambda: store.job_begin("t", "k2", holder_id=holder),
        "job_finish": lambda: store.job_finish("t", "k", "done", "late", holder_id=holder),
    }


async def snapshot(store: Any) -> tuple[Any, ...]:
    data = await store.load("t")
    jobs = (await store.job_get("t", "k"), await store.job_get("t", "k2"))
    return dumps(data.messages), data.runs, data.journal, jobs


@pytest.mark.parametrize(
    "lease, why",
    [
        (None, "nobody holds it now"),
        ("another holder", "process 1003 on box took the thread over"),
        ("expired", "it expired without a heartbeat"),
    ],
)
async def test_fenced_writes_without_the_live_lease_raise_and_write_nothing(
    store: Any, lease: str | None, why: str
) -> None:
    await store.claim_run("t", "r1")
    await store.append("t", [user_text("go", run_id="r1")])
    await store.record_tool_event("t", "c1", "start", tool_name="read", run_id="r1", at=1.0)
    await store.job_begin("t", "k")
    if lease == "another holder":
        await store.acquire_lease(lease_for("you"), is_stale=never_stale)
    elif lease == "expired":
        await store.acquire_lease(lease_for("me", now=time.time() - 100, ttl=10), is_stale=never_stale)
    before = await snapshot(store)
    for name, write in fenced_writes(store, "me").items():
        with pytest.raises(LeaseLostError) as error:
            await write()
        assert str(error.value) == (
            f"This run no longer holds the lease on thread 't' ({why}), so nothing was written."
        ), name
        assert error.value.why == why
    assert await snapshot(store) == before


async def test_a_lease_that_expired_and_was_taken_over_stays_lost_to_its_first_holder(store: Any) -> None:
    await store.claim_run("t", "r1")
    await store.append("t", [user_text("go", run_id="r1")])
    await store.record_tool_event("t", "c1", "start", tool_name="read", run_id="r1", at=1.0)
    await store.job_begin("t", "k")
    await store.acquire_lease(lease_for("me", now=time.time() - 100, ttl=10), is_stale=never_stale)
    await store.acquire_lease(lease_for("you"), is_stale=expired)  # the takeover of the expired lease
    before = await snapshot(store)
    for name, write in fenced_writes(store, "me").items():
        with pytest.raises(LeaseLostError) as error:
            await write()
        assert error.value.why == "process 1003 on box took the thread over", name
    # Nor does a late heartbeat of the first holder bring the lease back.
    now = time.time()
    assert await store.renew_lease("t", "me", now, now + 30) is False
    assert (await store.get_lease("t")).holder_id == "you"
    assert await snapshot(store) == before


async def test_fenced_writes_of_the_live_holder_and_unfenced_writes_go_through(store: Any) -> None:
    await store.acquire_lease(lease_for("me"), is_stale=never_stale)
    await store.claim_run("t", "r1", holder_id="me")
    await store.append("t", [user_text("go", run_id="r1"), reply("on it", run_id="r1", calls=("c1",))], holder_id="me")
    await store.record_tool_event("t", "c1", "start", tool_name="read", at=1.0, holder_id="me")
    await store.job_begin("t", "k", "c1", holder_id="me")
    await store.job_finish("t", "k", "done", {"ok": 1}, holder_id="me")
    await store.record_tool_event("t", "c1", "end", at=2.0, holder_id="me")
    await store.append("t", [result("c1", run_id="r1"), reply("done", run_id="r1")], holder_id="me")
    await store.mark_run_complete("t", "r1", holder_id="me")
    # Another holder takes the thread: writes without a holder id (cubeloop's) are not fenced.
    await store.acquire_lease(lease_for("you"), is_stale=lambda _: True)
    await store.append("t", [user_text("from cubeloop")])
    await store.claim_run("t", "r2")
    data = await store.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant", "user"]
    assert [(r.run_id, r.completed) for r in data.runs] == [("r1", True), ("r2", False)]
    assert data.journal["c1"] == JournalEntry("c1", "read", None, 1.0, 2.0, None)
    assert (await store.job_get("t", "k")).result == {"ok": 1}


# --- command status transitions ----------------------------------------------------------------

STATUSES = ("pending", "delivered", "applied", "refused", "discarded")
ALLOWED_MOVES = {
    ("pending", "delivered"),
    ("pending", "applied"),
    ("pending", "refused"),
    ("pending", "discarded"),
    ("delivered", "delivered"),
    ("delivered", "applied"),
    ("delivered", "refused"),
    ("delivered", "discarded"),
}
"""Written out, not derived from ``COMMAND_TRANSITIONS``: applied, refused and discarded are
final, and nothing goes back to pending."""


@pytest.mark.parametrize("old", STATUSES)
async def test_command_status_moves_only_as_allowed(store: Any, old: str) -> None:
    for new in STATUSES:
        command = await store.send_command("t", "steer", f"{old} -> {new}")
        if old != "pending":
            command = await store.update_command(command.seq, old, "before")
        if (old, new) in ALLOWED_MOVES:
            moved = await store.update_command(command.seq, new, "after")
            assert (moved.status, moved.note) == (new, "after")
            continue
        with pytest.raises(CommandTransitionError) as error:
            await store.update_command(command.seq, new, "after")
        assert str(error.value) == f"Command {command.seq} is already {old}, so it was not marked {new}."
        assert error.value.command == command
        assert [c for c in await store.list_commands("t") if c.seq == command.seq] == [command], "nothing changed"


async def test_a_discarded_command_is_never_delivered_by_a_later_update(store: Any) -> None:
    steer = await store.send_command("t", "steer", "Go left.")
    discarded = await store.update_command(steer.seq, "discarded", "discarded by the user")
    # A runner that read the command before the discard now tries to hand it over.
    with pytest.raises(CommandTransitionError):
        await store.update_command(steer.seq, "delivered")
    assert await store.list_commands("t") == [discarded]


async def test_a_pending_command_is_edited_by_compare_and_set(store: Any) -> None:
    steer = await store.send_command("t", "steer", "Go left.")
    edited = await store.edit_command(steer.seq, "Go right.", expected_revision=steer.revision)
    assert (edited.text, edited.status, edited.revision) == ("Go right.", "pending", steer.revision + 1)
    assert (edited.created_at, edited.kind, edited.note) == (steer.created_at, "steer", "")
    assert edited.updated_at >= steer.updated_at
    assert await store.list_commands("t") == [edited]
    # A second window still holding the first revision loses, and changes nothing.
    with pytest.raises(ConflictError):
        await store.edit_command(steer.seq, "Go back.", expected_revision=steer.revision)
    assert await store.list_commands("t") == [edited]
    with pytest.raises(KeyError):
        await store.edit_command(12345, "nobody's", expected_revision=1)


@pytest.mark.parametrize("status", ["delivered", "applied", "refused", "discarded"])
async def test_a_command_no_longer_pending_keeps_its_text(store: Any, status: str) -> None:
    steer = await store.send_command("t", "steer", "As sent.")
    moved = await store.update_command(steer.seq, status, "by the runner")
    # The runner delivered it meanwhile: the edit at the revision it read is a conflict...
    with pytest.raises(ConflictError):
        await store.edit_command(steer.seq, "Too late.", expected_revision=steer.revision)
    # ...and at the current revision it is refused by its status.
    with pytest.raises(CommandTransitionError) as error:
        await store.edit_command(steer.seq, "Too late.", expected_revision=moved.revision)
    assert str(error.value) == f"Command {steer.seq} is already {status}, so its text was not changed."
    assert error.value.command == moved
    assert await store.list_commands("t") == [moved]


async def test_a_pending_human_request_is_loaded_and_listed_and_cleared(checkpointer: Checkpointer) -> None:
    # cubeloop's HITL row (thread_pending_request): kept as written, read with the thread.
    from core.checkpoint.capabilities import HumanRequests, supports

    assert supports(checkpointer, HumanRequests)
    raw = json.dumps({"question_id": "q1", "thread_id": "t", "payload": {"kind": "confirm", "prompt": "Ship it?"}})
    await checkpointer.append("t", [user_text("ship"), reply("Asking.", run_id=None, calls=("ask1",))])
    assert (await checkpointer.load("t")).pending_request is None  # type: ignore[union-attr]
    await checkpointer.save_pending_request("t", raw, run_id="r1")
    data = await checkpointer.load("t")
    assert data is not None and data.pending_request is not None
    assert (data.pending_request.request_json, data.pending_request.run_id) == (raw, "r1")
    assert data.pending_request.question == "Ship it?"
    assert data.pending_request.created_at is not None and abs(data.pending_request.created_at - time.time()) < 120
    (summary,) = await checkpointer.list_threads()
    assert summary.pending_request == data.pending_request
    await checkpointer.save_pending_request("t", None)
    assert (await checkpointer.load("t")).pending_request is None  # type: ignore[union-attr]
    assert (await checkpointer.list_threads())[0].pending_request is None
