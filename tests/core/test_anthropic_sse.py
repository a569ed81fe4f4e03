"""AnthropicProvider through the official SDK and real HTTP, against a loopback server
speaking the documented Messages stream: blocks, partial JSON, signatures, usage, stop
reasons, HTTP and stream failures, our retries, and the prompt-caching breakpoints."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from core.checkpoint.codec import decode, encode
from core.events import RetryWait, StreamEnd, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart, UsageUpdate
from core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    user_text,
)
from core.providers.anthropic import MAX_CACHE_BREAKPOINTS, AnthropicProvider
from core.providers.base import ModelRequest
from core.tools import tool
from tests.helpers.messages_server import (
    Cut,
    Hold,
    MessagesServer,
    Status,
    Stream,
    block_delta,
    block_start,
    error_event,
    message_delta,
    message_end,
    message_start,
    message_stop,
    ping,
    text_block,
    text_stream,
    thinking_block,
    tool_use_block,
)

MODEL = "claude-test-1"
LIVENESS = 30.0  # seconds; reached only by a failing test

ARGUMENTS = {"path": "src/caf\u00e9.py", "pattern": 'say "hi" \\ twice', "limit": 10, "flags": [True, None]}
ENCODED = json.dumps(ARGUMENTS)  # ensure_ascii: the é is the escape \u00e9
# Fragments cut inside a key, right after a backslash, inside a \u escape, inside a number
# and between "tru" and "e": a decoder that parses fragments on their own would fail.
_CUTS = [
    3,
    ENCODED.index("\\u") + 1,
    ENCODED.index("\\u") + 4,
    ENCODED.index("\\\\") + 1,
    ENCODED.index("10") + 1,
    ENCODED.index("true") + 3,
]
FRAGMENTS = [ENCODED[a:b] for a, b in zip([0, *sorted(_CUTS)], [*sorted(_CUTS), len(ENCODED)], strict=False)]


@pytest.fixture
async def server():
    async with MessagesServer() as running:
        yield running


def provider_for(server: MessagesServer, **options) -> AnthropicProvider:
    return AnthropicProvider(MODEL, api_key="test-key", base_url=server.base_url, **options)


def ask(text: str = "hi") -> ModelRequest:
    return ModelRequest("You are terse.", [user_text(text)])


async def collect(provider: AnthropicProvider, request: ModelRequest, signal: asyncio.Event | None = None) -> list:
    async def run() -> list:
        return [e async for e in provider.stream(request, signal or asyncio.Event())]

    return await asyncio.wait_for(run(), LIVENESS)


def assert_one_sentence(text: str | None) -> None:
    assert text and text.endswith(".") and "\n" not in text, text
    assert text.count(". ") == 0, text


# --- the stream mapped ----------------------------------------------------------------------


async def test_thinking_text_and_tool_use_from_partial_json_map_through_real_http(server):
    assert "".join(FRAGMENTS) == ENCODED and len(FRAGMENTS) == 7
    server.add(
        Stream(
            [
                message_start(120, cache_read=100, cache_write=20, id="msg_real"),
                ping(),
                *thinking_block(0, ["The user wants ", "the file."], "EqQBCgIYAhIM+sig=="),
                *text_block(1, "Reading it", " now."),
                ping(),
                *tool_use_block(2, "toolu_01", "read_file", FRAGMENTS),
                message_delta("tool_use", 57),
                message_stop(),
            ]
        )
    )
    events = await collect(provider_for(server), ask())
    content_events = [e for e in events[:-1] if not isinstance(e, UsageUpdate)]
    assert content_events == [
        ThinkingDelta(0, ""),
        ThinkingDelta(0, "The user wants "),
        ThinkingDelta(0, "the file."),
        TextDelta(1, ""),
        TextDelta(1, "Reading it"),
        TextDelta(1, " now."),
        ToolCallStart(2, "toolu_01", "read_file"),
        *[ToolCallDelta(2, f) for f in FRAGMENTS],
    ]
    message = events[-1].message
    assert message.content == [
        ThinkingContent(thinking="The user wants the file.", signature="EqQBCgIYAhIM+sig=="),
        TextContent(text="Reading it now."),
        ToolCall(id="toolu_01", name="read_file", arguments=ARGUMENTS),
    ]
    assert message.stop_reason == "tool_use" and message.metadata == {}
    assert message.usage == Usage(input_tokens=120, output_tokens=57, cache_read_tokens=100, cache_write_tokens=20)
    assert (message.provider_id, message.model_id, message.response_id) == ("anthropic", MODEL, "msg_real")
    (received,) = server.requests
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert received.body["stream"] is True and received.body["model"] == MODEL
    # The next call sends the thinking back with its signature, and the parsed arguments.
    server.add(text_stream("done"))
    result = ToolResultMessage(tool_call_id="toolu_01", content=[TextContent(text="print(1)")])
    await collect(provider_for(server, prompt_caching=False), ModelRequest("", [user_text("hi"), message, result]))
    assert server.requests[1].body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "The user wants the file.", "signature": "EqQBCgIYAhIM+sig=="},
        {"type": "text", "text": "Reading it now."},
        {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": ARGUMENTS},
    ]


async def test_usage_is_reported_as_it_arrives_and_message_delta_updates_every_count(server):
    # message_delta carries the cumulative usage; newer API versions repeat the input counts there.
    server.add(
        Stream(
            [
                message_start(30, output_tokens=1, cache_read=7, cache_write=5),
                *text_block(0, "ok"),
                message_delta(
                    "end_turn", 12, input_tokens=31, cache_read_input_tokens=8, cache_creation_input_tokens=6
                ),
                message_stop(),
            ]
        )
    )
    events = await collect(provider_for(server), ask())
    snapshots = [e.usage for e in events if isinstance(e, UsageUpdate)]
    assert snapshots == [
        Usage(input_tokens=30, output_tokens=1, cache_read_tokens=7, cache_write_tokens=5),
        Usage(input_tokens=31, output_tokens=12, cache_read_tokens=8, cache_write_tokens=6),
    ]
    assert events[-1].message.usage == snapshots[-1]
    assert isinstance(events[0], UsageUpdate)  # known before the first token


@pytest.mark.parametrize(
    "raw, ours, metadata",
    [
        ("end_turn", "stop", {}),
        ("stop_sequence", "stop", {}),
        ("max_tokens", "length", {}),
        ("tool_use", "tool_use", {}),
        ("refusal", "stop", {"provider_stop_reason": "refusal"}),
        ("pause_turn", "stop", {"provider_stop_reason": "pause_turn"}),
    ],
)
async def test_stop_reasons(server, raw, ours, metadata):
    server.add(text_stream("ok", raw))
    message = (await collect(provider_for(server), ask()))[-1].message
    assert (message.stop_reason, message.metadata, message.text, message.error_message) == (ours, metadata, "ok", None)


# --- tool input that cannot be read: marked, never replaced by {} ---------------------------


@pytest.mark.parametrize(
    "stop, fragments, why",
    [
        ("max_tokens", ['{"env": "staging", "dry_r'], "the reply was cut off at the output limit"),
        ("model_context_window_exceeded", ['{"env": "sta'], "the reply was cut off at the output limit"),
        ("max_tokens", [], "the reply was cut off at the output limit"),  # cut before any input
        ("tool_use", ['{"env": "staging", "dry_run": tr'], "they were not valid JSON: Expecting value"),
        ("tool_use", ['["staging"]'], "they were a JSON array, not an object"),
        ("tool_use", ["null"], "they were a JSON null, not an object"),
    ],
)
async def test_a_tool_call_whose_input_cannot_be_read_is_marked_and_keeps_the_mark(server, stop, fragments, why):
    # A complete call before the unreadable one: it was closed by the model, so it is kept as read.
    server.add(
        Stream(
            [
                message_start(),
                *tool_use_block(0, "toolu_ok", "read_file", ['{"path": "a.txt"}']),
                *tool_use_block(1, "toolu_bad", "deploy", fragments),
                *message_end(stop),
            ]
        )
    )
    message = (await collect(provider_for(server), ask()))[-1].message
    good, bad = message.tool_calls
    assert (good.arguments, good.arguments_error) == ({"path": "a.txt"}, None)
    assert bad.arguments == {} and bad.arguments_error is not None and bad.arguments_error.startswith(why)
    # The stored row keeps the mark; a readable call's row has no such key (as cubeloop writes it).
    row = json.loads(encode(message))
    assert [b.get("arguments_error") for b in row["content"]] == [None, bad.arguments_error]
    assert "arguments_error" not in row["content"][0]
    assert decode(encode(message)).tool_calls == [good, bad]


@pytest.mark.parametrize("stop", ["tool_use", "max_tokens"])
async def test_a_complete_tool_call_is_read_even_when_the_reply_was_cut_after_it(server, stop):
    # No input at all is the empty input of a tool without parameters, and a whole JSON
    # object is complete even in a reply cut off later (by a text block that followed it).
    server.add(
        Stream(
            [
                message_start(),
                *tool_use_block(0, "toolu_1", "list_dir", []),
                *tool_use_block(1, "toolu_2", "read_file", ['{"path":', ' "b"}']),
                *text_block(2, "and then some"),
                *message_end(stop),
            ]
        )
    )
    message = (await collect(provider_for(server), ask()))[-1].message
    assert [(c.arguments, c.arguments_error) for c in message.tool_calls] == [({}, None), ({"path": "b"}, None)]


# --- failures: one sentence each, never an exception ------------------------------------------


@pytest.mark.parametrize(
    "status, sentence",
    [
        (
            Status(400, "invalid_request_error", "messages: roles must alternate between user and assistant"),
            "Anthropic API error 400 (invalid request): messages: roles must alternate between user and assistant.",
        ),
        (
            Status(401, "authentication_error", "invalid x-api-key"),
            "Anthropic API error 401 (authentication): invalid x-api-key.",
        ),
        (
            Status(
                429,
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit.",
                {"retry-after": "1"},
            ),
            "Anthropic API error 429 (rate limit): Number of request tokens has exceeded your per-minute rate limit.",
        ),
        (Status(529, "overloaded_error", "Overloaded"), "Anthropic API error 529 (overloaded): Overloaded."),
    ],
)
async def test_http_errors_end_in_one_sentence_without_retries(server, status, sentence):
    server.add(status)
    events = await collect(provider_for(server, max_retries=0), ask())
    assert len(events) == 1 and isinstance(events[0], StreamEnd)
    message = events[0].message
    assert (message.stop_reason, message.error_message, message.content) == ("error", sentence, [])
    assert_one_sentence(message.error_message)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "status", [Status(400, "invalid_request_error", "bad"), Status(401, "authentication_error", "no")]
)
async def test_client_errors_are_never_retried(server, status):
    server.add(status, text_stream("never sent"))
    events = await collect(provider_for(server), ask())
    assert not any(isinstance(e, RetryWait) for e in events)
    assert events[-1].message.stop_reason == "error"
    assert len(server.requests) == 1 and server.remaining == 1


async def test_an_error_event_after_text_keeps_the_text_and_is_not_retried(server):
    server.add(
        Stream(
            [
                message_start(),
                *text_block(0, "Half an ans")[:2],
                block_start(1, {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}),
                error_event("overloaded_error", "Overloaded"),
            ]
        ),
        text_stream("never sent"),
    )
    events = await collect(provider_for(server), ask())
    message = events[-1].message
    assert (message.stop_reason, message.error_message) == ("error", "Anthropic API error (overloaded): Overloaded.")
    assert message.content == [TextContent(text="Half an ans")]  # the unfinished tool call is dropped
    assert message.usage == Usage(input_tokens=25, output_tokens=1)
    assert not any(isinstance(e, RetryWait) for e in events) and len(server.requests) == 1


async def test_a_cut_connection_mid_reply_is_one_sentence_with_the_partial_text(server):
    server.add(
        Stream(
            [
                message_start(),
                block_start(0, {"type": "text", "text": ""}),
                block_delta(0, {"type": "text_delta", "text": "Hel"}),
                Cut(),
            ]
        )
    )
    message = (await collect(provider_for(server), ask()))[-1].message
    assert message.stop_reason == "error" and message.text == "Hel"
    assert message.error_message.startswith("The connection to the Anthropic API was lost: ")
    assert_one_sentence(message.error_message)
    assert len(server.requests) == 1


async def test_a_stream_that_ends_without_message_stop_is_an_error(server):
    server.add(Stream([message_start(), *text_block(0, "Hel")]))
    message = (await collect(provider_for(server, max_retries=0), ask()))[-1].message
    assert (message.stop_reason, message.error_message, message.text) == (
        "error",
        "The Anthropic stream ended before the reply was complete.",
        "Hel",
    )


# --- our retries ------------------------------------------------------------------------------


async def test_a_429_with_retry_after_is_waited_out_once_then_answered(server):
    server.add(
        Status(429, "rate_limit_error", "Number of requests has exceeded your rate limit.", {"retry-after": "1"}),
        text_stream("Here you are."),
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await collect(provider_for(server), ask())
    waits = [e for e in events if isinstance(e, RetryWait)]
    assert waits == [RetryWait(1.0, "rate limited", 1, 5)]
    assert events.index(waits[0]) == 0  # announced before anything else
    assert events[-1].message.text == "Here you are." and events[-1].message.stop_reason == "stop"
    assert len(server.requests) == 2 and server.requests[0].body == server.requests[1].body
    assert loop.time() - started >= 0.9  # the wait the server asked for was kept


async def test_retry_after_ms_is_preferred_and_overload_and_5xx_are_retried(server):
    server.add(
        Status(529, "overloaded_error", "Overloaded", {"retry-after-ms": "50", "retry-after": "30"}),
        Status(503, "api_error", "Service unavailable", {"retry-after-ms": "20"}),
        text_stream("fine"),
    )
    events = await collect(provider_for(server), ask())
    assert [e for e in events if isinstance(e, RetryWait)] == [
        RetryWait(0.05, "overloaded", 1, 5),
        RetryWait(0.02, "server error 503", 2, 5),
    ]
    assert events[-1].message.text == "fine"


async def test_an_overload_event_and_a_cut_before_any_content_are_retried(server):
    server.add(
        Stream([message_start(), ping(), error_event("overloaded_error", "Overloaded")]),
        Stream([message_start(), Cut()]),
        text_stream("third time"),
    )
    events = await collect(provider_for(server), ask())
    waits = [e for e in events if isinstance(e, RetryWait)]
    assert [(w.reason, w.attempt) for w in waits] == [("overloaded", 1), ("connection lost", 2)]
    assert all(0 < w.seconds <= 1.0 for w in waits)  # the SDK's backoff: 0.5 s, then 1 s, less jitter
    assert events[-1].message.text == "third time" and len(server.requests) == 3


async def test_after_the_last_attempt_the_sentence_says_it_gave_up(server):
    for _ in range(3):
        server.add(Status(529, "overloaded_error", "Overloaded", {"retry-after-ms": "10"}))
    events = await collect(provider_for(server, max_retries=2), ask())
    assert [e.attempt for e in events if isinstance(e, RetryWait)] == [1, 2]
    message = events[-1].message
    assert message.error_message == "Anthropic API error 529 (overloaded): Overloaded (gave up after 3 attempts)."
    assert_one_sentence(message.error_message)
    assert len(server.requests) == 3


async def test_a_wait_longer_than_the_limit_is_not_waited_and_the_sentence_says_so(server):
    server.add(Status(429, "rate_limit_error", "Slow down.", {"retry-after": "3600"}), text_stream("never sent"))
    events = await collect(provider_for(server), ask())
    assert not any(isinstance(e, RetryWait) for e in events)
    assert events[-1].message.error_message == (
        "Anthropic API error 429 (rate limit): Slow down (the API asked to wait 3600 s, longer than the 60 s this app waits)."
    )
    assert len(server.requests) == 1


async def test_x_should_retry_false_is_obeyed(server):
    server.add(Status(529, "overloaded_error", "Overloaded", {"x-should-retry": "false"}), text_stream("never"))
    events = await collect(provider_for(server), ask())
    assert not any(isinstance(e, RetryWait) for e in events) and len(server.requests) == 1


async def test_a_refused_connection_is_retried_then_reported():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = AnthropicProvider(MODEL, api_key="k", base_url=f"http://127.0.0.1:{port}", max_retries=1)
    events = await collect(provider, ask())
    waits = [e for e in events if isinstance(e, RetryWait)]
    assert [(w.reason, w.attempt, w.max_attempts) for w in waits] == [("connection failed", 1, 2)]
    message = events[-1].message
    assert message.error_message.startswith("Could not reach the Anthropic API: ")
    assert message.error_message.endswith(" (gave up after 2 attempts).")
    assert_one_sentence(message.error_message)


async def test_an_abort_during_a_long_retry_wait_ends_at_once(server):
    server.add(Status(429, "rate_limit_error", "Slow down.", {"retry-after": "60"}), text_stream("never sent"))
    signal = asyncio.Event()
    provider = provider_for(server)
    events: list = []

    async def run() -> None:
        async for event in provider.stream(ask(), signal):
            events.append(event)
            if isinstance(event, RetryWait):
                signal.set()

    await asyncio.wait_for(run(), LIVENESS)  # far below the 60 s the server asked for
    assert [type(e) for e in events] == [RetryWait, StreamEnd]
    assert events[0].seconds == 60.0
    message = events[-1].message
    assert (message.stop_reason, message.error_message) == ("aborted", "Aborted by the user.")
    assert len(server.requests) == 1


async def test_an_abort_mid_stream_keeps_the_usage_reported_so_far(server):
    hold = Hold()
    server.add(Stream([message_start(40, cache_read=900, cache_write=3), *text_block(0, "Partial")[:2], hold]))
    signal = asyncio.Event()
    events: list = []

    async def run() -> None:
        async for event in provider_for(server).stream(ask(), signal):
            events.append(event)
            if isinstance(event, TextDelta) and event.delta == "Partial":
                signal.set()
                hold.release()  # the next event is read, and the abort is seen there

    await asyncio.wait_for(run(), LIVENESS)
    message = events[-1].message
    assert (message.stop_reason, message.text) == ("aborted", "Partial")
    assert message.usage == Usage(input_tokens=40, output_tokens=1, cache_read_tokens=900, cache_write_tokens=3)


@pytest.mark.parametrize("streamed_first", [True, False], ids=["mid-reply", "before-any-event"])
async def test_an_abort_while_the_stream_stalls_ends_it_at_once(server, streamed_first):
    # The server sends nothing more (a stalled connection) until the client goes away; the
    # SDK's own read timeout is minutes, so only the abort can end this call in time.
    hold = Hold()
    head = [message_start(), *text_block(0, "Partial")[:2]] if streamed_first else []
    server.add(Stream([*head, hold, *message_end("end_turn")]))
    signal = asyncio.Event()

    async def abort_when_held() -> None:
        await hold.reached.wait()
        await asyncio.sleep(0.2)  # the client is inside its read of the stream now
        signal.set()

    aborter = asyncio.create_task(abort_when_held())
    # collect's liveness bound (LIVENESS) fails the test unless the abort ends the call:
    # the stall itself never does.
    events = await collect(provider_for(server), ask(), signal)
    await aborter
    message = events[-1].message
    assert (message.stop_reason, message.error_message) == ("aborted", "Aborted by the user.")
    assert message.text == ("Partial" if streamed_first else "")
    assert not hold.released.is_set() and len(server.requests) == 1


# --- prompt caching ---------------------------------------------------------------------------


@tool
async def read_file(path: str) -> str:
    """Read a text file."""
    return path


@tool
async def list_dir(path: str = ".") -> str:
    """List a directory."""
    return path


def _breakpoints(body: dict) -> list[str]:
    """Where ``cache_control`` sits in a request body, as readable paths."""
    found = []
    for i, block in enumerate(body.get("system") or []):
        if isinstance(block, dict) and "cache_control" in block:
            found.append(f"system[{i}]")
    for i, spec in enumerate(body.get("tools") or []):
        if "cache_control" in spec:
            found.append(f"tools[{i}]")
    for m, turn in enumerate(body["messages"]):
        for b, block in enumerate(turn["content"]):
            if "cache_control" in block:
                found.append(f"messages[{m}].{turn['role']}[{b}].{block['type']}")
    return found


async def test_cache_breakpoints_on_system_last_tool_and_the_last_two_user_turns(server):
    history = [
        user_text("look at a and b"),
        AssistantMessage(
            content=[
                ThinkingContent(thinking="plan", signature="sig"),
                ToolCall(id="t1", name="read_file", arguments={"path": "a"}),
                ToolCall(id="t2", name="read_file", arguments={"path": "b"}),
            ],
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id="t1", content=[TextContent(text="A")]),
        ToolResultMessage(tool_call_id="t2", content=[TextContent(text="B")]),
        AssistantMessage(content=[TextContent(text="Both read.")], stop_reason="stop"),
        user_text("and this picture?"),
        AssistantMessage(content=[TextContent(text="Send it.")], stop_reason="stop"),
        *[user_text("here"), AssistantMessage(content=[TextContent(text="Seen.")], stop_reason="stop")] * 3,
    ]
    history.append(
        UserMessage(content=[TextContent(text="the last one"), ImageContent(data="aGk=", mime_type="image/png")])
    )
    server.add(text_stream("ok", input_tokens=12, cache_read=3000, cache_write=400))
    request = ModelRequest("You are a careful engineer.", history, (read_file.spec, list_dir.spec))
    events = await collect(provider_for(server), request)
    body = server.requests[0].body
    last = len(body["messages"]) - 1
    assert _breakpoints(body) == [
        "system[0]",
        "tools[1]",
        f"messages[{last - 2}].user[0].text",
        f"messages[{last}].user[1].image",
    ]
    assert len(_breakpoints(body)) <= MAX_CACHE_BREAKPOINTS
    assert body["system"] == [
        {"type": "text", "text": "You are a careful engineer.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"][1]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in body["tools"][0]
    assert body["messages"][last]["content"][0] == {"type": "text", "text": "the last one"}
    # The cache counts the API reports are the reply's usage.
    usage = events[-1].message.usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (12, 3000, 400)


async def test_a_tool_turn_marks_its_results_and_the_prompt_before_them(server):
    history = [
        user_text("read a"),
        AssistantMessage(
            content=[ToolCall(id="t1", name="read_file", arguments={"path": "a"})], stop_reason="tool_use"
        ),
        ToolResultMessage(tool_call_id="t1", content=[TextContent(text="A")]),
    ]
    server.add(text_stream("ok"))
    await collect(provider_for(server), ModelRequest("", history, ()))
    body = server.requests[0].body
    assert "system" not in body and "tools" not in body
    assert _breakpoints(body) == ["messages[0].user[0].text", "messages[2].user[0].tool_result"]
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "A"}],
        "cache_control": {"type": "ephemeral"},
    }


async def test_prompt_caching_can_be_turned_off(server):
    server.add(text_stream("ok"))
    await collect(provider_for(server, prompt_caching=False), ModelRequest("sys", [user_text("hi")], (read_file.spec,)))
    body = server.requests[0].body
    assert _breakpoints(body) == [] and body["system"] == "sys"
