"""The loop on its own: event order, transcript, dangling calls, abort, steering, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from core.errors import ToolDefinitionError
from core.events import (
    AgentEnd,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    StreamEnd,
    TextDelta,
    ThinkingDelta,
    UsageUpdate,
)
from core.loop import LoopConfig, run_loop
from core.messages import (
    AnyMessage,
    AssistantMessage,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    user_text,
)
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_thinking, faux_tool_call
from core.recovery import ThreadState, diagnose, unanswered_calls
from core.tools import ToolContext, tool
from tests.helpers.transcripts import assert_every_call_answered, assert_valid_api_order, squash

WAIT = 10.0  # seconds; reached only by a failing test


def test_the_request_check_refuses_a_user_message_of_the_settling_run_and_text_before_results():
    call = AssistantMessage(content=[ToolCall(id="c1", name="t")], stop_reason="tool_use", run_id="old")
    result = ToolResultMessage(tool_call_id="c1", run_id="new")
    foreign = [user_text("go", run_id="old"), call, user_text("done?", run_id="old"), result]
    assert_every_call_answered([ModelRequest("", foreign, ())])
    early = [user_text("go", run_id="old"), call, user_text("done?", run_id="new"), result]
    with pytest.raises(AssertionError, match="delivered before the result of c1"):
        assert_every_call_answered([ModelRequest("", early, ())])
    text_first = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1"}]},
        {"role": "user", "content": [{"type": "text", "text": "done?"}, {"type": "tool_result", "tool_use_id": "c1"}]},
    ]
    with pytest.raises(AssertionError, match="answers nothing to tool_use"):
        assert_valid_api_order(text_first)


@tool
async def count(n: int, ctx: ToolContext) -> str:
    """Count to n, reporting progress."""
    for i in range(1, n + 1):
        ctx.report(progress=i / n)
    return f"counted to {n}"


@tool
async def wait_for_abort(ctx: ToolContext) -> str:
    """Block until the run is aborted."""
    ctx.report(text="waiting")
    await ctx.signal.wait()
    return "interrupted: abort signal received"


class Run:
    """One loop run's inputs and everything it emitted."""

    def __init__(self, provider, *, history: Sequence[AnyMessage] = (), **config) -> None:
        self.provider = provider
        self.messages: list[AnyMessage] = list(history)
        self.events: list = []
        self.signal = asyncio.Event()
        self.config = LoopConfig(provider, run_id="run-1", tools=config.pop("tools", (count, wait_for_abort)), **config)
        self.abort_on = None  # predicate over events

    async def emit(self, event) -> None:
        self.events.append(event)
        if self.abort_on is not None and self.abort_on(event):
            self.signal.set()

    async def __call__(self, *prompts: str):
        users = [user_text(p, run_id="run-1") for p in prompts]
        return await asyncio.wait_for(run_loop(self.messages, self.config, self.emit, self.signal, users), WAIT)

    def kinds(self) -> list[str]:
        out = []
        for e in self.events:
            role = getattr(getattr(e, "message", None), "role", None)
            out.append(f"{e.type}:{role}" if e.type.startswith("message") else e.type)
        return out


async def test_one_tool_run_emits_the_expected_sequence():
    provider = FauxProvider([faux_reply("Counting.", faux_tool_call("count", {"n": 2})), faux_reply("Done.")])
    run = Run(provider)
    assert await run("count to two") == "completed"
    assert squash(run.kinds()) == [
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
    assert [m.role for m in run.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert all(m.run_id == "run-1" for m in run.messages)
    assert run.messages[2].text == "counted to 2"
    assert run.events[-1] == AgentEnd("run-1", "completed")


async def test_streamed_deltas_update_one_partial_message_in_place():
    provider = FauxProvider([faux_reply("abcdefghij")], chunk_size=3)
    run = Run(provider)
    await run("hi")
    start = next(e for e in run.events if isinstance(e, MessageStart) and e.message.role == "assistant")
    updates = [e for e in run.events if isinstance(e, MessageUpdate)]
    usage = UsageUpdate(Usage(input_tokens=1))
    assert [u.delta for u in updates] == [
        usage,
        TextDelta(0, "abc"),
        TextDelta(0, "def"),
        TextDelta(0, "ghi"),
        TextDelta(0, "j"),
    ]
    assert all(u.message is start.message for u in updates)
    assert start.message.text == "abcdefghij"
    end = [e for e in run.events if isinstance(e, MessageEnd)][-1]
    assert end.message.text == "abcdefghij" and end.message is run.messages[-1]


@pytest.mark.parametrize("listener_keeps_text", [False, True])
async def test_the_partial_text_is_complete_at_every_update(listener_keeps_text: bool):
    """Each delta is appended in place (no copy of the whole reply per token): at every
    ``message_update`` the partial's text and thinking are exactly the deltas so far, also when
    a listener keeps a reference to the previous string (which must not change under it)."""
    pieces = [f"w{i % 97:02d} " for i in range(300)]
    thoughts = [f"t{i} " for i in range(40)]
    provider = FauxProvider([faux_reply(faux_thinking("".join(thoughts)), "".join(pieces))], chunk_size=4)
    run = Run(provider)
    seen: list[tuple[str, str, TextDelta | ThinkingDelta]] = []
    kept: list[tuple[str, str]] = []

    async def emit(event) -> None:
        await Run.emit(run, event)
        if isinstance(event, MessageUpdate) and isinstance(event.delta, (TextDelta, ThinkingDelta)):
            blocks = event.message.content
            thinking = next((b.thinking for b in blocks if isinstance(b, ThinkingContent)), "")
            text = next((b.text for b in blocks if isinstance(b, TextContent)), "")
            seen.append((thinking, text, event.delta))
            if listener_keeps_text:
                kept.append((text, str(text)))  # the string object, and a copy of its value

    run.emit = emit  # type: ignore[method-assign]
    await run("hi")
    thinking_so_far = text_so_far = ""
    for thinking, text, delta in seen:
        if isinstance(delta, ThinkingDelta):
            thinking_so_far += delta.delta
        else:
            text_so_far += delta.delta
        assert (thinking, text) == (thinking_so_far, text_so_far)
    assert (thinking_so_far, text_so_far) == ("".join(thoughts), "".join(pieces))
    assert all(held == value for held, value in kept)  # no string a listener holds was changed
    partial = next(e.message for e in run.events if isinstance(e, MessageStart) and e.message.role == "assistant")
    assert partial.content[1].model_fields_set >= {"text"}  # recorded as set, as by assignment
    assert partial.model_dump()["content"][1]["text"] == "".join(pieces)


async def test_the_provider_gets_one_request_list_grown_in_place_not_a_copy_per_call():
    # The request builder keeps its own list for the run and appends only new messages
    # to it, so no model call copies the history.
    seen: list[Sequence[AnyMessage]] = []
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1}, id="c1")), "ok"])
    stream = provider.stream

    def spy(request, signal):
        seen.append(request.messages)
        return stream(request, signal)

    provider.stream = spy  # type: ignore[method-assign]
    run = Run(provider)
    await run("hi")
    assert len(seen) == 2 and seen[0] is seen[1]
    assert [id(m) for m in seen[1]] == [id(m) for m in run.messages[:-1]]  # all but the last reply


async def test_dangling_calls_are_settled_before_the_prompt():
    crashed = [
        user_text("old prompt", run_id="run-0"),
        AssistantMessage(
            content=[
                ToolCall(id="c1", name="count", arguments={"n": 1}),
                ToolCall(id="c2", name="count", arguments={"n": 1}),
            ],
            stop_reason="tool_use",
            run_id="run-0",
        ),
        ToolResultMessage(tool_call_id="c1", tool_name="count", run_id="run-0"),
    ]
    provider = FauxProvider(["Fine."])
    run = Run(provider, history=crashed)
    await run("new prompt")
    settled = run.messages[3]
    assert isinstance(settled, ToolResultMessage)
    assert (settled.tool_call_id, settled.is_error, settled.metadata) == ("c2", True, {"settled": "interrupted"})
    assert "interrupted" in settled.text and "effects must be checked" in settled.text
    assert settled.run_id == "run-0"  # the run that issued c2, as cubeloop's per-run tool-cycle check needs
    assert isinstance(run.messages[4], UserMessage) and run.messages[4].text == "new prompt"
    # the settled result was emitted (so the agent persists it) before the prompt
    ends = [e.message for e in run.events if isinstance(e, MessageEnd)]
    assert ends[:2] == [settled, run.messages[4]]
    assert_every_call_answered(provider.requests)


def test_unanswered_calls_are_found_anywhere_in_the_history():
    # x sits before a later reply (another writer went on without answering it): it is
    # still unanswered, and must be settled before the next model call.
    a = AssistantMessage(content=[ToolCall(id="x", name="t")], stop_reason="tool_use")
    b = AssistantMessage(content=[ToolCall(id="y", name="t"), ToolCall(id="z", name="t")], stop_reason="tool_use")
    answered_y = ToolResultMessage(tool_call_id="y")
    go = user_text("go")
    assert [c.id for c in unanswered_calls([go, a, b, answered_y])] == ["x", "z"]
    assert unanswered_calls([go, a, ToolResultMessage(tool_call_id="x"), user_text("next")]) == []
    # A reply before the first user message is never sent, so neither are its calls.
    assert unanswered_calls([a, b, answered_y]) == []
    assert unanswered_calls([]) == []


async def test_abort_during_streaming_keeps_the_partial_text_and_drops_tool_calls():
    provider = FauxProvider(
        [faux_reply("A long answer that is cut short.", faux_tool_call("count", {"n": 1}))], chunk_size=2, delay=0.001
    )
    run = Run(provider)
    updates = 0

    def third_update(event) -> bool:
        nonlocal updates
        updates += isinstance(event, MessageUpdate)
        return updates == 3

    run.abort_on = third_update
    assert await run("go") == "aborted"
    last = run.messages[-1]
    assert isinstance(last, AssistantMessage)
    assert last.stop_reason == "aborted" and last.error_message == "Aborted by the user."
    assert 0 < len(last.text) < len("A long answer that is cut short.")
    assert last.tool_calls == []
    assert run.events[-1] == AgentEnd("run-1", "aborted")
    assert diagnose(run.messages).state is ThreadState.ABORTED


async def test_abort_while_the_provider_is_silent_stops_at_once():
    class Silent:
        name, model = "silent", "silent-1"

        async def stream(self, request, signal):
            await asyncio.sleep(3600)
            yield StreamEnd(faux_reply("never"))

    run = Run(Silent())
    run.abort_on = lambda e: isinstance(e, MessageStart) and e.message.role == "assistant"
    assert await run("go") == "aborted"  # within WAIT, though the provider never answers
    assert run.messages[-1].stop_reason == "aborted"


async def test_abort_during_a_tool_ends_with_an_aborted_assistant_message():
    provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort")), "never used"])
    run = Run(provider)
    run.abort_on = lambda e: e.type == "tool_execution_update"
    assert await run("go") == "aborted"
    assert [m.role for m in run.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert run.messages[2].text == "interrupted: abort signal received"
    last = run.messages[-1]
    assert (last.stop_reason, last.content) == ("aborted", [])
    assert len(provider.requests) == 1  # the model was not called again
    assert diagnose(run.messages).state is ThreadState.ABORTED


async def test_steering_arrives_after_the_tool_results_before_the_next_call():
    steers = [[], [user_text("use n=3 next time", kind="steer")], []]
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "Noted."])

    async def get_steering() -> list[UserMessage]:
        return steers.pop(0) if steers else []

    run = Run(provider, get_steering=get_steering)
    await run("go")
    second = provider.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool_result", "user"]
    assert second[-1].text == "use n=3 next time"
    assert second[-1].run_id == "run-1"
    assert_every_call_answered(provider.requests)


async def test_follow_ups_only_when_the_agent_would_stop():
    follow_ups = [[user_text("and then?", kind="follow_up")]]
    provider = FauxProvider([faux_reply(faux_tool_call("count", {"n": 1})), "First answer.", "Second answer."])

    async def get_follow_ups() -> list[UserMessage]:
        return follow_ups.pop(0) if follow_ups else []

    run = Run(provider, get_follow_ups=get_follow_ups)
    assert await run("go") == "completed"
    assert [m.role for m in run.messages] == ["user", "assistant", "tool_result", "assistant", "user", "assistant"]
    assert run.messages[3].text == "First answer."
    assert run.messages[4].text == "and then?"
    assert run.messages[5].text == "Second answer."


async def test_provider_error_fails_the_run_with_its_sentence():
    provider = FauxProvider([])
    run = Run(provider)
    assert await run("go") == "failed"
    assert run.events[-1] == AgentEnd("run-1", "failed", "The faux provider has no scripted reply left for call 1.")
    assert run.messages[-1].stop_reason == "error"
    assert diagnose(run.messages).state is ThreadState.FAILED


async def test_error_reply_never_records_tool_calls():
    provider = FauxProvider([faux_reply("partial", faux_tool_call("count", {"n": 1}), stop_reason="error")])
    run = Run(provider)
    assert await run("go") == "failed"
    assert run.messages[-1].tool_calls == []
    assert run.events[-1].error == "The model call failed."


@pytest.mark.parametrize(
    "body, sentence",
    [
        ("raise", "The provider failed unexpectedly: boom"),
        ("end", "The provider ended its stream without a final message."),
    ],
)
async def test_provider_breaking_the_contract_fails_the_run(body, sentence):
    class Broken:
        name, model = "broken", "broken-1"

        async def stream(self, request, signal):
            yield TextDelta(0, "so far")
            if body == "raise":
                raise RuntimeError("boom")

    run = Run(Broken())
    assert await run("go") == "failed"
    assert run.events[-1].error == sentence
    assert run.messages[-1].text == "so far"


def test_tool_names_must_be_unique():
    with pytest.raises(ToolDefinitionError, match="'count'"):
        LoopConfig(FauxProvider(), tools=(count, count))


def test_config_builds_tool_specs_once():
    config = LoopConfig(FauxProvider(), tools=(count,))
    assert config.tool_specs == (count.spec,)
    assert config.tools_by_name["count"] is count
