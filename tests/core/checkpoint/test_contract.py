"""The checkpointer contract (``core/checkpoint/base.py``), one suite for every backend.

Each test takes the parametrized ``checkpointer`` fixture (``tests/conftest.py``), so a
new backend passes or fails exactly these tests.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from core.checkpoint.base import Checkpointer
from core.errors import RunAlreadyClaimedError, RunAlreadyCompletedError, RunNotClaimedError
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
    import time

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
        [user_text("inspect the repo"), reply("looking", calls=("c1",)), result("c1"), reply("done", calls=("c2", "c3"))],
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
    assert (asked.first_prompt, tools.first_prompt, steered.first_prompt) == ("only a question", "inspect the repo", "first")
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
