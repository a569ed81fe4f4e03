"""The Agent on the faux provider and the memory store: state, persistence, runs, resume."""

from __future__ import annotations

import asyncio
import io
import sys

import pytest

import core.agent as agent_module
from core.agent import Agent
from core.checkpoint.base import CorruptRow
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import AgentBusyError, NothingToResumeError, RunError, UnreadableThreadError
from core.events import AgentEnd, MessageEnd, MessageUpdate, ToolExecutionUpdate
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import CrashPoint, ResumeAction, ThreadState, diagnose
from core.request import RequestBuilder
from core.tools import ToolContext, tool
from tests.helpers.own_loop import run_in_own_loop
from tests.helpers.transcripts import assert_every_call_answered, squash

WAIT = 10.0  # seconds; reached only by a failing test


@tool
async def count(n: int, ctx: ToolContext) -> str:
    """Count to n, reporting progress."""
    for i in range(1, n + 1):
        ctx.report(progress=i / n, text=f"{i} of {n}")
    return f"counted to {n}"


@tool
async def wait_for_abort(ctx: ToolContext) -> str:
    """Block until the run is aborted."""
    ctx.report(text="waiting")
    await ctx.signal.wait()
    return "interrupted: abort signal received"


TOOLS = (count, wait_for_abort)


def make_agent(provider, store=None, thread="t1", **options) -> Agent:
    return Agent(provider, store or MemoryCheckpointer(), thread, tools=options.pop("tools", TOOLS), **options)


def kinds(events) -> list[str]:
    out = []
    for e in events:
        role = getattr(getattr(e, "message", None), "role", None)
        out.append(f"{e.type}:{role}" if e.type.startswith("message") else e.type)
    return out


async def stored(agent: Agent):
    return await agent.checkpointer.load(agent.thread_id)


async def test_one_tool_run_event_sequence_and_persistence():
    provider = FauxProvider([faux_reply("Counting.", faux_tool_call("count", {"n": 2})), faux_reply("Done.")])
    agent = make_agent(provider)
    events = []
    agent.subscribe(events.append)
    assert await asyncio.wait_for(agent.prompt("count to two"), WAIT) == "completed"
    assert squash(kinds(events)) == [
        "agent_start",
        "turn_start",
        "message_start:user",
        "message_end:user",
        "message_start:assistant",
        "message_update:assistant",
        "message_end:assistant",
        "tool_execution_start",
        "tool_execution_update",
        "tool_execution_update",
        "tool_execution_end",
        "message_start:tool_result",
        "message_end:tool_result",
        "turn_end",
        "turn_start",
        "message_start:assistant",
        "message_update:assistant",
        "message_end:assistant",
        "turn_end",
        "agent_end",
    ]
    progress = [(e.progress, e.text) for e in events if isinstance(e, ToolExecutionUpdate)]
    assert progress == [(0.5, "1 of 2"), (1.0, "2 of 2")]

    data = await stored(agent)
    state = agent.state
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert [m.model_dump() for m in data.messages] == [m.model_dump() for m in state.messages]
    run_id = state.run_id
    assert all(m.run_id == run_id for m in data.messages)
    assert data.messages[0].metadata == {"kind": "prompt"}
    assert [(r.run_id, r.completed) for r in data.runs] == [(run_id, True)]
    assert (state.is_running, state.last_outcome, state.error) == (False, "completed", None)
    assert state.streaming_message is None and state.running_tools == {}


async def test_each_message_is_persisted_before_listeners_hear_of_it():
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "Done."])
    agent = make_agent(provider)
    checks: list[bool] = []

    async def listener(event):
        if isinstance(event, MessageEnd):
            data = await stored(agent)
            checks.append(data.messages[-1].model_dump() == event.message.model_dump())

    agent.subscribe(listener)
    await agent.prompt("go")
    assert checks == [True, True, True, True]


async def test_state_tracks_streaming_and_running_tools():
    provider = FauxProvider([faux_reply("Let me count.", faux_tool_call("count", {"n": 2})), "Done."])
    agent = make_agent(provider)
    seen = []

    def listener(event):
        state = agent.state
        if isinstance(event, MessageUpdate):
            seen.append(("streaming", state.streaming_message is event.message, state.is_running))
        elif isinstance(event, ToolExecutionUpdate):
            running = state.running_tools[event.tool_call_id]
            seen.append(("tool", running.name, running.args, running.progress, running.text))
        elif isinstance(event, MessageEnd) and event.message.role == "assistant":
            seen.append(("ended", state.streaming_message))

    agent.subscribe(listener)
    await agent.prompt("go")
    assert ("streaming", True, True) in seen
    assert ("tool", "count", {"n": 2}, 0.5, "1 of 2") in seen
    assert ("tool", "count", {"n": 2}, 1.0, "2 of 2") in seen
    assert ("ended", None) in seen


async def test_a_fresh_agent_continues_the_thread():
    store = MemoryCheckpointer()
    first = make_agent(FauxProvider(["The capital is Paris."]), store)
    await first.prompt("Capital of France?")

    provider = FauxProvider(["About 2 million people."])
    second = make_agent(provider, store)
    await second.load()
    assert [m.role for m in second.state.messages] == ["user", "assistant"]
    await second.prompt("How many live there?")
    texts = [m.text for m in provider.requests[0].messages]
    assert texts == ["Capital of France?", "The capital is Paris.", "How many live there?"]
    data = await stored(second)
    assert len(data.runs) == 2 and all(r.completed for r in data.runs)


async def test_each_run_reloads_what_other_writers_added():
    store = MemoryCheckpointer()
    provider = FauxProvider(["one", "two"])
    agent = make_agent(provider, store)
    await agent.prompt("first")
    await store.append("t1", [user_text("written by another process")])
    await agent.prompt("second")
    assert [m.text for m in provider.requests[1].messages][-2:] == ["written by another process", "second"]


async def long_thread_and_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[MemoryCheckpointer, list[int]]:
    """A store holding thread ``t1`` of 200 question/answer pairs (400 messages), and the
    index of every message any request builder reads from now on, in read order."""
    store = MemoryCheckpointer()
    history = []
    for i in range(200):
        history += [user_text(f"question {i}"), AssistantMessage(content=[TextContent(text=f"answer {i}")])]
    await store.append("t1", history)
    read: list[int] = []
    add = RequestBuilder._add

    def counted(self: RequestBuilder, i: int, message: object) -> None:
        read.append(i)
        add(self, i, message)

    monkeypatch.setattr(RequestBuilder, "_add", counted)
    return store, read


async def test_a_run_reads_the_threads_history_once(monkeypatch: pytest.MonkeyPatch):
    # A pass over the history costs ~3 us a message on the event loop (~0.3 s at 100,000):
    # the crashed-run check and the loop share one request builder.
    store, read = await long_thread_and_reads(monkeypatch)
    provider = FauxProvider(["done"])
    agent = make_agent(provider, store)

    assert await agent.prompt("one more") == "completed"

    assert len(read) == len(set(read)) == 401, "a message was read twice"  # 400 + the prompt
    assert [m.text for m in provider.requests[0].messages][-2:] == ["answer 199", "one more"]


async def test_a_long_history_is_read_in_slices_with_the_event_loop_let_in(monkeypatch: pytest.MonkeyPatch):
    store, read = await long_thread_and_reads(monkeypatch)
    monkeypatch.setattr(agent_module, "HISTORY_SLICE", 100)
    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append(len(read))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    provider = FauxProvider(["done"])
    try:
        assert await make_agent(provider, store).prompt("one more") == "completed"
    finally:
        watcher.cancel()

    assert {100, 200, 300} <= set(seen), "the event loop did not run between slices"
    assert [m.text for m in provider.requests[0].messages][-2:] == ["answer 199", "one more"]


async def test_abort_during_streaming_then_a_new_prompt_works():
    provider = FauxProvider([faux_reply("x" * 400), "Fresh answer."], chunk_size=1, delay=0.001)
    agent = make_agent(provider)
    stop = agent.subscribe(
        lambda e: agent.abort() if isinstance(e, MessageUpdate) and len(e.message.text) == 5 else None
    )
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    stop()
    data = await stored(agent)
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED
    assert data.messages[-1].text == "xxxxx"
    assert data.runs[0].completed is False
    assert agent.state.last_outcome == "aborted"

    assert await asyncio.wait_for(agent.prompt("again"), WAIT) == "completed"
    data = await stored(agent)
    assert data.messages[-1].text == "Fresh answer."
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
    assert [r.completed for r in data.runs] == [False, True]


async def test_abort_during_a_tool_then_a_new_prompt_works():
    provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort")), "Back again."])
    agent = make_agent(provider)
    stop = agent.subscribe(lambda e: agent.abort() if isinstance(e, ToolExecutionUpdate) else None)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    stop()
    data = await stored(agent)
    # the shape cubeloop writes: user, assistant(tool call), tool_result, assistant(aborted, empty)
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert (data.messages[-1].stop_reason, data.messages[-1].content) == ("aborted", [])
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED
    assert not data.runs[0].completed

    assert await asyncio.wait_for(agent.prompt("again"), WAIT) == "completed"
    assert_every_call_answered(provider.requests)


async def test_abort_is_idempotent_and_a_no_op_when_idle():
    provider = FauxProvider(["hello"])
    agent = make_agent(provider)
    agent.abort()
    agent.abort()
    assert await agent.prompt("hi") == "completed"  # an abort while idle does not leak into the next run


async def test_steer_is_delivered_at_the_next_turn_boundary():
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "Steered."])
    agent = make_agent(provider)
    agent.subscribe(lambda e: agent.steer("check the other file") if e.type == "tool_execution_start" else None)
    await agent.prompt("go")
    second = provider.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool_result", "user"]
    steer = second[-1]
    assert steer.text == "check the other file"
    assert steer.metadata == {"kind": "steer"} and steer.run_id == agent.state.run_id
    assert agent.state.pending_steers == []
    assert_every_call_answered(provider.requests)


async def test_follow_up_waits_for_the_final_reply():
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "Answer one.", "Answer two."])
    agent = make_agent(provider)
    queued = []

    def listener(event):
        if event.type == "tool_execution_start" and not queued:
            agent.follow_up("now summarise")
            queued.append(len(agent.state.pending_follow_ups))

    agent.subscribe(listener)
    assert await agent.prompt("go") == "completed"
    texts = [m.text for m in agent.state.messages if not isinstance(m, ToolResultMessage)]
    assert texts[-3:] == ["Answer one.", "now summarise", "Answer two."]
    follow_up = agent.state.messages[-2]
    assert follow_up.metadata == {"kind": "follow_up"}
    assert queued == [1] and len(provider.requests) == 3


async def test_steer_and_follow_up_need_a_run():
    agent = make_agent(FauxProvider())
    with pytest.raises(RunError, match=r"No run is in progress; send it as a new prompt\."):
        agent.steer("x")
    with pytest.raises(RunError, match="No run is in progress"):
        agent.follow_up("x")


async def test_a_second_prompt_while_running_is_refused():
    provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort"))])
    agent = make_agent(provider)
    refused = []

    async def listener(event):
        if isinstance(event, ToolExecutionUpdate):
            with pytest.raises(AgentBusyError):
                await agent.prompt("again")
            with pytest.raises(AgentBusyError):
                await agent.load()
            refused.append(True)
            agent.abort()

    agent.subscribe(listener)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    assert refused == [True]


def crashed_mid_tool(run_id: str = "old-run") -> list:
    return [
        user_text("old prompt", run_id=run_id),
        AssistantMessage(
            content=[
                ToolCall(id="c1", name="count", arguments={"n": 1}),
                ToolCall(id="c2", name="count", arguments={"n": 1}),
            ],
            stop_reason="tool_use",
            run_id=run_id,
        ),
        ToolResultMessage(tool_call_id="c1", tool_name="count", run_id=run_id),
    ]


async def seeded(messages, *, run_completed: bool = False) -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    await store.claim_run("t1", "old-run")
    await store.append("t1", messages)
    if run_completed:
        await store.mark_run_complete("t1", "old-run")
    return store


async def test_dangling_calls_are_settled_before_a_new_prompt():
    store = await seeded(crashed_mid_tool())
    provider = FauxProvider(["Carrying on."])
    agent = make_agent(provider, store)
    assert await agent.prompt("new prompt") == "completed"
    request = provider.requests[0].messages
    assert [m.role for m in request] == ["user", "assistant", "tool_result", "tool_result", "user"]
    settled = request[3]
    assert (settled.tool_call_id, settled.is_error, settled.metadata) == ("c2", True, {"settled": "interrupted"})
    assert_every_call_answered(provider.requests)
    data = await stored(agent)
    assert data.messages[3].metadata == {"settled": "interrupted"}  # persisted, not only sent


async def test_resume_call_model_after_an_unanswered_prompt():
    store = await seeded([user_text("never answered", run_id="old-run")])
    provider = FauxProvider(["Answered now."])
    agent = make_agent(provider, store)
    await agent.load()
    assert agent.diagnosis().action is ResumeAction.CALL_MODEL
    assert await agent.resume() == "completed"
    assert [m.text for m in provider.requests[0].messages] == ["never answered"]
    data = await stored(agent)
    assert data.messages[-1].text == "Answered now."
    new_run = data.messages[-1].run_id
    assert new_run != "old-run"
    assert {r.run_id: r.completed for r in data.runs} == {"old-run": False, new_run: True}


async def test_resume_settles_then_calls_the_model():
    store = await seeded(crashed_mid_tool())
    provider = FauxProvider(["Checked."])
    agent = make_agent(provider, store)
    await agent.load()
    plan = agent.diagnosis()
    assert (plan.crash_point, plan.action) == (CrashPoint.MID_TOOL, ResumeAction.SETTLE_THEN_CALL_MODEL)
    events = []
    agent.subscribe(events.append)
    assert await agent.resume() == "completed"
    assert [m.role for m in provider.requests[0].messages] == ["user", "assistant", "tool_result", "tool_result"]
    assert kinds(events)[:4] == ["agent_start", "turn_start", "message_start:tool_result", "message_end:tool_result"]
    assert_every_call_answered(provider.requests)
    data = await stored(agent)
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_resume_after_tool_results_calls_the_model():
    messages = [
        *crashed_mid_tool()[:2],
        ToolResultMessage(tool_call_id="c1", tool_name="count", run_id="old-run"),
        ToolResultMessage(tool_call_id="c2", tool_name="count", run_id="old-run"),
    ]
    store = await seeded(messages)
    provider = FauxProvider(["Both done."])
    agent = make_agent(provider, store)
    assert await agent.resume() == "completed"
    assert len(provider.requests[0].messages) == 4


async def test_resume_waits_for_the_user_after_a_final_reply():
    store = await seeded([user_text("hi", run_id="old-run"), AssistantMessage(content=[], run_id="old-run")])
    provider = FauxProvider()
    agent = make_agent(provider, store)
    await agent.load()
    assert agent.diagnosis().action is ResumeAction.WAIT_FOR_USER
    assert await agent.resume() == "completed"
    assert provider.requests == []
    data = await stored(agent)
    assert [(r.run_id, r.completed) for r in data.runs] == [("old-run", True)]
    assert agent.diagnosis().state is ThreadState.COMPLETED


async def test_resume_with_nothing_to_do_raises():
    store = await seeded(
        [user_text("hi", run_id="old-run"), AssistantMessage(content=[], run_id="old-run")], run_completed=True
    )
    agent = make_agent(FauxProvider(), store)
    with pytest.raises(NothingToResumeError, match=r"^Nothing to resume: the thread is completed; send a new message"):
        await agent.resume()
    assert agent.state.is_running is False
    with pytest.raises(NothingToResumeError):
        await make_agent(FauxProvider(), MemoryCheckpointer(), "empty").resume()


async def test_failed_run_is_not_marked_complete():
    agent = make_agent(FauxProvider([]))
    assert await agent.prompt("go") == "failed"
    data = await stored(agent)
    assert data.runs[0].completed is False
    assert agent.state.error == "The faux provider has no scripted reply left for call 1."
    assert diagnose(data.messages, data.runs).state is ThreadState.FAILED


class BrokenStore(MemoryCheckpointer):
    """A store whose disk fills up when the first tool result is written."""

    async def append(self, thread_id, messages, **fence):
        if any(isinstance(m, ToolResultMessage) for m in messages):
            raise OSError("No space left on device")
        await super().append(thread_id, messages, **fence)


async def test_persist_failure_fails_the_run_but_still_delivers_the_event():
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "never"])
    agent = make_agent(provider, BrokenStore())
    events = []
    agent.subscribe(events.append)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "failed"
    assert "message_end:tool_result" in kinds(events)
    end = events[-1]
    assert isinstance(end, AgentEnd) and end.outcome == "failed"
    assert end.error == "Could not save a message, so the run stopped: OSError: No space left on device"
    assert agent.state.error == end.error and agent.state.is_running is False
    assert len(provider.requests) == 1
    data = await stored(agent)
    assert not data.runs[0].completed


class CorruptStore(MemoryCheckpointer):
    """A store holding one row it cannot decode."""

    async def load(self, thread_id):
        data = await super().load(thread_id)
        data.problems.append(CorruptRow(row_id=7, reason="malformed JSON", raw="{"))
        return data


async def test_unreadable_thread_cannot_be_continued():
    store = CorruptStore()
    await store.append("t1", [user_text("hi")])
    provider = FauxProvider(["never"])
    agent = make_agent(provider, store)
    with pytest.raises(UnreadableThreadError, match="1 unreadable row"):
        await agent.prompt("go")
    with pytest.raises(UnreadableThreadError):
        await agent.resume()
    assert provider.requests == [] and agent.state.is_running is False
    await agent.load()  # browsing still works
    assert len(agent.state.problems) == 1


async def test_listeners_sync_async_unsubscribe_and_failing():
    agent = make_agent(FauxProvider(["one", "two"]))
    sync_seen, async_seen = [], []

    async def async_listener(event):
        async_seen.append(event.type)

    def broken(event):
        raise ValueError("listener bug")

    agent.subscribe(broken)
    unsubscribe = agent.subscribe(sync_seen.append)
    agent.subscribe(async_listener)
    assert await agent.prompt("first") == "completed"
    assert [e.type for e in sync_seen] == async_seen and async_seen[-1] == "agent_end"
    unsubscribe()
    unsubscribe()
    before = len(sync_seen)
    await agent.prompt("second")
    assert len(sync_seen) == before and len(async_seen) > before


async def test_every_message_of_a_run_carries_its_run_id():
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "Done."])
    agent = make_agent(provider)
    agent.subscribe(lambda e: agent.steer("s") if e.type == "tool_execution_end" else None)
    await agent.prompt("go")
    run_id = agent.state.run_id
    assert run_id and len(run_id) == 32
    assert all(m.run_id == run_id for m in agent.state.messages)
    assert any(isinstance(m, UserMessage) and m.metadata == {"kind": "steer"} for m in agent.state.messages)


async def test_sequential_agent_runs_tools_in_order():
    provider = FauxProvider(
        [faux_reply(faux_tool_call("count", {"n": 1}, id="a"), faux_tool_call("count", {"n": 2}, id="b")), "ok"]
    )
    agent = make_agent(provider, tool_execution="sequential")
    events = []
    agent.subscribe(events.append)
    await agent.prompt("go")
    ids = [e.tool_call_id for e in events if e.type in ("tool_execution_start", "tool_execution_end")]
    assert ids == ["a", "a", "b", "b"]


async def test_a_steer_left_by_an_abort_is_delivered_by_the_next_run():
    provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort")), "Next."])
    agent = make_agent(provider)

    def listener(event):
        if isinstance(event, ToolExecutionUpdate):
            agent.steer("after the abort")
            agent.abort()

    stop = agent.subscribe(listener)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    stop()
    assert [m.text for m in agent.state.pending_steers] == ["after the abort"]
    assert await agent.prompt("again") == "completed"
    assert [m.text for m in provider.requests[1].messages][-2:] == ["again", "after the abort"]
    assert agent.state.pending_steers == []


# --- abort: both kinds of tool leave a thread that diagnoses as aborted and continues ------------


@tool
async def stubborn() -> str:
    """Ignore the abort signal."""
    await asyncio.sleep(60)
    return "never"


async def abort_timing(agent: Agent) -> dict[str, float]:
    """Abort once the first tool reports progress; record when, and when it ended."""
    loop = asyncio.get_running_loop()
    times: dict[str, float] = {}

    def listener(event):
        if event.type in ("tool_execution_update", "tool_execution_start") and "abort" not in times:
            if event.type == "tool_execution_update" or event.tool_name == "stubborn":
                times["abort"] = loop.time()
                agent.abort()
        elif event.type == "tool_execution_end":
            times["end"] = loop.time()

    agent.subscribe(listener)
    return times


async def continues_after_abort(agent: Agent, provider: FauxProvider) -> None:
    data = await stored(agent)
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.ABORTED
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert await asyncio.wait_for(agent.prompt("carry on"), WAIT) == "completed"
    data = await stored(agent)
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED
    assert_every_call_answered(provider.requests)


async def test_abort_a_tool_that_honours_the_signal_stops_it_at_once():
    provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort")), "Continuing."])
    agent = make_agent(provider, abort_grace=30.0)
    times = await abort_timing(agent)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    assert times["end"] - times["abort"] < 1.0  # generous; bench/bench_abort.py measures it (well under 100 ms)
    result = (await stored(agent)).messages[2]
    assert (result.text, result.is_error, result.metadata) == ("interrupted: abort signal received", False, {})
    await continues_after_abort(agent, provider)


async def test_abort_cancels_a_tool_that_ignores_the_signal_after_the_grace():
    provider = FauxProvider([faux_reply(faux_tool_call("stubborn")), "Continuing."])
    agent = make_agent(provider, tools=(stubborn,), abort_grace=0.2)
    times = await abort_timing(agent)
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "aborted"
    assert 0.2 <= times["end"] - times["abort"] < 5.0
    result = (await stored(agent)).messages[2]
    assert result.is_error and result.metadata == {"settled": "aborted"}
    assert result.text.startswith("aborted: the tool did not stop within 0.2 s of the abort and was cancelled")
    await continues_after_abort(agent, provider)


# --- the tool journal -------------------------------------------------------------------------


async def test_a_tool_start_is_journaled_before_its_work_begins_and_its_end_after():
    store = MemoryCheckpointer()
    seen_by_tool = []

    @tool
    async def look(ctx: ToolContext) -> str:
        """Look at the journal from inside the tool."""
        seen_by_tool.append((await store.load_journal("t1"))[ctx.tool_call_id])
        return "looked"

    provider = FauxProvider([faux_reply(faux_tool_call("look", id="c1")), "ok"])
    agent = make_agent(provider, store, tools=(look,))
    assert await agent.prompt("go") == "completed"
    (during,) = seen_by_tool
    assert during.started_at is not None and during.ended_at is None
    after = (await store.load_journal("t1"))["c1"]
    assert (after.tool_name, after.run_id, after.job_key) == ("look", agent.state.run_id, None)
    assert after.started_at == during.started_at and after.ended_at >= after.started_at
    assert agent.state.journal["c1"].ended_at is not None  # the agent's own view is kept up to date


async def test_parallel_results_are_saved_as_each_tool_finishes():
    store = MemoryCheckpointer()

    @tool
    async def fast() -> str:
        """Return at once."""
        return "fast"

    @tool
    async def slow() -> str:
        """Finish only once the sibling's result and journal end are in the store."""
        for _ in range(1000):
            data = await store.load("t1")
            journal = data.journal or {}
            if any(isinstance(m, ToolResultMessage) and m.tool_call_id == "c_fast" for m in data.messages):
                assert journal["c_fast"].ended_at is not None and journal["c_slow"].ended_at is None
                return "slow"
            await asyncio.sleep(0.005)
        raise AssertionError("the fast result was held back")

    provider = FauxProvider(
        [faux_reply(faux_tool_call("slow", id="c_slow"), faux_tool_call("fast", id="c_fast")), "ok"]
    )
    agent = make_agent(provider, store, tools=(slow, fast))
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "completed"
    results = [m for m in (await stored(agent)).messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.text, r.is_error) for r in results] == [
        ("c_fast", "fast", False),
        ("c_slow", "slow", False),
    ]


class JournalFails(MemoryCheckpointer):
    """A store that cannot write the tool journal."""

    async def record_tool_event(self, thread_id, tool_call_id, phase, **kwargs):
        raise OSError("journal is read-only")


async def test_a_tool_whose_start_cannot_be_journaled_never_runs():
    ran = []

    @tool
    async def effect() -> str:
        """Have a side effect."""
        ran.append(True)
        return "done"

    provider = FauxProvider([faux_reply(faux_tool_call("effect", id="c1")), "never"])
    agent = make_agent(provider, JournalFails(), tools=(effect,))
    events = []
    agent.subscribe(events.append)
    assert await agent.prompt("go") == "failed"
    assert ran == [] and len(provider.requests) == 1
    assert agent.state.error == (
        "Could not journal the start of tool call effect (c1), so it did not run and the run stopped: "
        "OSError: journal is read-only"
    )
    assert "tool_execution_start" not in kinds(events)
    data = await stored(agent)
    verdict = diagnose(data.messages, data.runs, data.journal)
    assert verdict.crash_point is CrashPoint.MID_TOOL and verdict.dangling[0].status_words == "never started"


# --- a tool that tries to end the program ---------------------------------------------------


@tool
async def quit_program(how: str) -> str:
    """End the program the way a script would: ``sys.exit(0)`` or ``raise SystemExit("x")``."""
    if how == "exit0":
        sys.exit(0)
    raise SystemExit("x")


QUIT_TEXTS = {
    "exit0": "The tool called sys.exit(0); a tool cannot end the program that runs it, "
    "so this call failed and the run goes on.",
    "message": "The tool called sys.exit('x'); a tool cannot end the program that runs it, "
    "so this call failed and the run goes on.",
}


def quitting_provider(how: str) -> FauxProvider:
    """A model that calls ``quit_program`` once, then answers what the result said."""
    return FauxProvider(
        [
            faux_reply("Quitting.", faux_tool_call("quit_program", {"how": how}, id="call_quit")),
            lambda request: faux_reply(f"The tool said: {request.messages[-1].text}"),
        ]
    )


@pytest.mark.parametrize("how", ["exit0", "message"])
def test_a_tool_ending_the_program_fails_its_call_and_the_run_completes(how):
    # Before: SystemExit left the event loop, the run was never ended and the thread read crashed mid-tool.
    agent = make_agent(quitting_provider(how), tools=(quit_program,))

    async def scenario() -> None:
        assert await asyncio.wait_for(agent.prompt("quit"), WAIT) == "completed"
        data = await stored(agent)
        assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
        result = data.messages[2]
        assert isinstance(result, ToolResultMessage) and result.is_error and result.text == QUIT_TEXTS[how]
        assert data.messages[3].text == f"The tool said: {QUIT_TEXTS[how]}"  # the model read it and went on
        assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
        assert [r.completed for r in data.runs] == [True]

    run_in_own_loop(scenario())


def test_an_idempotent_tool_ending_the_program_leaves_its_job_failed_not_started():
    from core.jobs import idempotent, job_key

    store = MemoryCheckpointer()
    agent = make_agent(quitting_provider("exit0"), store, tools=(idempotent(quit_program),))

    async def scenario() -> None:
        assert await asyncio.wait_for(agent.prompt("quit"), WAIT) == "completed"
        job = await store.job_get("t1", job_key("quit_program", {"how": "exit0"}))
        assert job is not None and job.status == "failed"  # a later call runs it again; resume never trusts it

    run_in_own_loop(scenario())


def test_the_headless_runner_survives_a_tool_ending_the_program(tmp_path):
    from core.runner import AgentSpec, run_headless

    out, err = io.StringIO(), io.StringIO()
    spec = AgentSpec(quitting_provider("exit0"), tools=[quit_program])
    run = run_headless(tmp_path / "t.sqlite", "t1", "quit", agent=lambda: spec, out=out, err=err, handle_signals=True)
    assert run_in_own_loop(run) == 0, err.getvalue()
    assert QUIT_TEXTS["exit0"] in out.getvalue()
