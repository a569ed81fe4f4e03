"""FauxProvider: scripted, chunked, deterministic, records requests, honours the signal."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.events import StreamEnd, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart, UsageUpdate
from core.messages import AssistantMessage, Usage, user_text
from core.providers.base import ModelRequest, Provider
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_thinking, faux_tool_call


async def collect(provider: FauxProvider, request: ModelRequest, signal: asyncio.Event | None = None) -> list:
    return [e async for e in provider.stream(request, signal or asyncio.Event())]


def request(*texts: str) -> ModelRequest:
    return ModelRequest("be brief", [user_text(t) for t in texts])


def test_is_a_provider():
    assert isinstance(FauxProvider(), Provider)


async def test_text_streams_in_chunks_and_ends_with_the_reply():
    provider = FauxProvider([faux_reply(faux_text("Hello, world!"))], chunk_size=5)
    events = await collect(provider, request("hi"))
    # The input is reported before the first token, as Anthropic's message_start does.
    first = UsageUpdate(Usage(input_tokens=3))
    assert events[:-1] == [first, TextDelta(0, "Hello"), TextDelta(0, ", wor"), TextDelta(0, "ld!")]
    end = events[-1]
    assert isinstance(end, StreamEnd)
    assert end.message.text == "Hello, world!"
    assert end.message.stop_reason == "stop"
    assert (end.message.provider_id, end.message.model_id) == ("faux", "faux-1")
    assert end.message.usage.output_tokens == 4  # 13 characters, about 4 per token
    assert end.message.usage.input_tokens == 3  # "be brief" + "hi"


async def test_tool_calls_stream_as_start_and_json_deltas():
    reply = faux_reply(faux_thinking("plan"), faux_text("Reading."), faux_tool_call("read", {"path": "a.txt", "n": 3}))
    provider = FauxProvider([reply], chunk_size=4)
    events = await collect(provider, request("go"))
    assert events[:2] == [UsageUpdate(Usage(input_tokens=3)), ThinkingDelta(0, "plan")]  # "be brief" + "go"
    start = next(e for e in events if isinstance(e, ToolCallStart))
    assert (start.index, start.name) == (2, "read")
    args = "".join(e.arguments_delta for e in events if isinstance(e, ToolCallDelta))
    assert json.loads(args) == {"path": "a.txt", "n": 3}
    final = events[-1].message
    assert final.stop_reason == "tool_use"
    # an id unique within the thread, the same on every run: history length and block index
    assert final.tool_calls[0].id == start.id == "call_1_2"


async def test_explicit_tool_call_id_is_kept():
    provider = FauxProvider([faux_reply(faux_tool_call("read", {}, id="call_x"))])
    events = await collect(provider, request("go"))
    assert events[-1].message.tool_calls[0].id == "call_x"


async def test_requests_are_recorded_as_snapshots():
    provider = FauxProvider(["one", "two"])
    transcript = [user_text("first")]
    await collect(provider, ModelRequest("sys", transcript))
    transcript.append(user_text("second"))
    await collect(provider, ModelRequest("sys", transcript))
    assert [len(r.messages) for r in provider.requests] == [1, 2]
    assert provider.requests[0].messages[0].text == "first"


async def test_callable_and_string_entries():
    provider = FauxProvider([lambda req: faux_reply(f"you sent {len(req.messages)}"), "plain"])
    first = await collect(provider, request("a", "b"))
    second = await collect(provider, request("c"))
    assert first[-1].message.text == "you sent 2"
    assert second[-1].message.text == "plain"


async def test_exhausted_script_gives_a_clear_error_reply():
    provider = FauxProvider(["only"])
    await collect(provider, request("a"))
    events = await collect(provider, request("b"))
    assert len(events) == 1
    message = events[0].message
    assert message.stop_reason == "error"
    assert message.error_message == "The faux provider has no scripted reply left for call 2."


async def test_fallback_answers_once_the_script_is_used_up():
    provider = FauxProvider(["scripted"], fallback=lambda req: f"echo {req.messages[-1].text}")
    await collect(provider, request("a"))
    events = await collect(provider, request("again"))
    assert events[-1].message.text == "echo again"


async def test_scripted_messages_are_not_shared_between_calls():
    reply = faux_reply("same")
    provider = FauxProvider([reply, reply])
    first = (await collect(provider, request("a")))[-1].message
    second = (await collect(provider, request("a")))[-1].message
    first.content.clear()
    assert second.text == "same" and reply.text == "same"


async def test_signal_stops_the_stream_promptly():
    provider = FauxProvider([faux_reply("x" * 1000)], chunk_size=1, delay=0.001)
    signal = asyncio.Event()
    events = []
    async for event in provider.stream(request("go"), signal):
        events.append(event)
        if len(events) == 3:
            signal.set()
    assert len(events) == 4
    assert events[-1].message.stop_reason == "aborted"
    assert events[-1].message.error_message == "Aborted by the user."
    assert events[-1].message.usage == Usage(input_tokens=3)  # as reported so far: "be brief" + "go"


async def test_deterministic():
    script = [faux_reply(faux_text("abc def ghi"), faux_tool_call("t", {"a": [1, 2]}))]

    def dump(events):
        return [e.message.model_dump(exclude={"timestamp"}) if isinstance(e, StreamEnd) else e for e in events]

    one = await collect(FauxProvider(list(script), chunk_size=3), request("x"))
    two = await collect(FauxProvider(list(script), chunk_size=3), request("x"))
    assert dump(one) == dump(two)


def test_builders():
    reply = faux_reply("text", faux_tool_call("t", {"a": 1}))
    assert isinstance(reply, AssistantMessage)
    assert reply.stop_reason == "tool_use"
    assert faux_reply("x", stop_reason="length").stop_reason == "length"
    assert faux_tool_call("t").arguments == {}


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_size"):
        FauxProvider(chunk_size=0)
