"""AnthropicProvider through the real SDK, against hand-written SSE streams (no network)."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import MissingApiKeyError
from core.events import StreamEnd, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart, UsageUpdate
from core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UnknownMessage,
    Usage,
    UserMessage,
    user_text,
)
from core.providers.anthropic import AnthropicProvider, to_api_messages
from core.providers.base import ModelRequest, Provider
from core.tools import tool

MODEL = "claude-test-1"


def sse(*events: dict) -> bytes:
    """A Messages streaming response body: one ``event:``/``data:`` pair per event."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def message_start(input_tokens=25, cache_read=0, cache_write=0) -> dict:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 1,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
            },
        },
    }


def block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, body: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": body}


def block_stop(index: int) -> dict:
    return {"type": "content_block_stop", "index": index}


def message_end(stop_reason: str, output_tokens: int = 40) -> list[dict]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def text_reply(text: str, stop_reason: str = "end_turn") -> bytes:
    return sse(
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": text}),
        block_stop(0),
        *message_end(stop_reason),
    )


TOOL_TURN = sse(
    message_start(input_tokens=120, cache_read=100, cache_write=20),
    {"type": "ping"},
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "The user wants "}),
    delta(0, {"type": "thinking_delta", "thinking": "the file."}),
    delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
    block_stop(0),
    block_start(1, {"type": "text", "text": ""}),
    delta(1, {"type": "text_delta", "text": "Reading it"}),
    delta(1, {"type": "text_delta", "text": " now."}),
    block_stop(1),
    block_start(2, {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {}}),
    delta(2, {"type": "input_json_delta", "partial_json": ""}),
    delta(2, {"type": "input_json_delta", "partial_json": '{"path": "src/'}),
    delta(2, {"type": "input_json_delta", "partial_json": 'app.py"}'}),
    block_stop(2),
    *message_end("tool_use", output_tokens=57),
)


class Server:
    """Answers each request with the next scripted response and keeps the request bodies."""

    def __init__(self, *responses) -> None:
        self.responses = list(responses)
        self.bodies: list[dict] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(json.loads(request.content))
        response = self.responses.pop(0)
        if isinstance(response, Exception):
            raise response
        if isinstance(response, bytes):
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=response)
        return response

    def provider(self, **options) -> AnthropicProvider:
        # Prompt caching and retries are tested against the real server (test_anthropic_sse).
        client = httpx2.AsyncClient(transport=httpx2.MockTransport(self))
        options = {"max_retries": 0, "prompt_caching": False, **options}
        return AnthropicProvider(MODEL, api_key="test-key", http_client=client, **options)


async def collect(provider: AnthropicProvider, request: ModelRequest) -> list:
    return [e async for e in provider.stream(request, asyncio.Event())]


def ask(text: str = "hi") -> ModelRequest:
    return ModelRequest("You are terse.", [user_text(text)])


async def test_stream_maps_thinking_text_tool_use_and_usage():
    server = Server(TOOL_TURN)
    events = await collect(server.provider(), ask())
    assert events[:-1] == [
        UsageUpdate(Usage(input_tokens=120, output_tokens=1, cache_read_tokens=100, cache_write_tokens=20)),
        ThinkingDelta(0, ""),
        ThinkingDelta(0, "The user wants "),
        ThinkingDelta(0, "the file."),
        TextDelta(1, ""),
        TextDelta(1, "Reading it"),
        TextDelta(1, " now."),
        ToolCallStart(2, "toolu_01", "read_file"),
        ToolCallDelta(2, ""),
        ToolCallDelta(2, '{"path": "src/'),
        ToolCallDelta(2, 'app.py"}'),
        UsageUpdate(Usage(input_tokens=120, output_tokens=57, cache_read_tokens=100, cache_write_tokens=20)),
    ]
    end = events[-1]
    assert isinstance(end, StreamEnd)
    message = end.message
    assert message.content == [
        ThinkingContent(thinking="The user wants the file.", signature="EqQBCgIYAhIM"),
        TextContent(text="Reading it now."),
        ToolCall(id="toolu_01", name="read_file", arguments={"path": "src/app.py"}),
    ]
    assert message.stop_reason == "tool_use"
    assert message.usage.model_dump() == {
        "input_tokens": 120,
        "output_tokens": 57,
        "cache_read_tokens": 100,
        "cache_write_tokens": 20,
    }
    assert (message.provider_id, message.model_id, message.response_id) == ("anthropic", MODEL, "msg_01")
    assert message.metadata == {}


@pytest.mark.parametrize(
    "raw, ours, metadata",
    [
        ("end_turn", "stop", {}),
        ("stop_sequence", "stop", {}),
        ("max_tokens", "length", {}),
        ("refusal", "stop", {"provider_stop_reason": "refusal"}),
        ("pause_turn", "stop", {"provider_stop_reason": "pause_turn"}),
    ],
)
async def test_stop_reasons(raw, ours, metadata):
    events = await collect(Server(text_reply("ok", raw)).provider(), ask())
    message = events[-1].message
    assert (message.stop_reason, message.metadata, message.text) == (ours, metadata, "ok")


async def test_request_body_maps_the_transcript_and_tools():
    @tool
    async def read_file(path: str, limit: int = 100) -> str:
        """Read a text file."""
        return ""

    transcript = [
        UserMessage(content=[TextContent(text="Look at this"), ImageContent(data="aGk=", mime_type="image/png")]),
        AssistantMessage(
            content=[
                ThinkingContent(thinking="plan", signature="sig-1"),
                ThinkingContent(thinking="unsigned, cannot be replayed"),
                TextContent(text="Reading both."),
                ToolCall(id="toolu_a", name="read_file", arguments={"path": "a"}),
                ToolCall(id="toolu_b", name="read_file", arguments={"path": "b"}),
            ],
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id="toolu_b", content=[TextContent(text="B body")]),
        ToolResultMessage(tool_call_id="toolu_a", content=[TextContent(text="No such file")], is_error=True),
        UnknownMessage(role="system_note"),
        user_text("also check c"),
        AssistantMessage(content=[], stop_reason="aborted", error_message="Aborted by the user."),
        UserMessage(content="plain string content"),
    ]
    server = Server(text_reply("ok"))
    provider = server.provider(max_tokens=1000)
    await collect(provider, ModelRequest("Be careful.", transcript, (read_file.spec,)))
    body = server.bodies[0]
    assert body["model"] == MODEL and body["max_tokens"] == 1000 and body["stream"] is True
    assert body["system"] == "Be careful."
    assert body["tools"] == [
        {
            "name": "read_file",
            "description": "Read a text file.",
            "input_schema": read_file.spec.parameters,
        }
    ]
    assert body["tools"][0]["input_schema"]["required"] == ["path"]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at this"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig-1"},
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "B body"}]},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "content": [{"type": "text", "text": "No such file"}],
                    "is_error": True,
                },
                {"type": "text", "text": "also check c"},
                {"type": "text", "text": "plain string content"},
            ],
        },
    ]
    assert "thinking" not in body


def test_tool_results_open_the_user_turn_even_when_user_text_was_saved_before_them():
    # A thread from another writer may hold a user message between a call and its
    # result; the API refuses text before the tool_result blocks (400).
    transcript = [
        user_text("deploy it"),
        AssistantMessage(
            content=[
                TextContent(text="Deploying."),
                ToolCall(id="c1", name="deploy", arguments={}),
                ToolCall(id="c2", name="notify", arguments={}),
            ],
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id="c2", content=[TextContent(text="notified")]),
        user_text("are you done?"),
        UserMessage(content=[ImageContent(data="aGk=", mime_type="image/png")]),
        ToolResultMessage(tool_call_id="c1", content=[TextContent(text="interrupted")], is_error=True),
    ]
    api = to_api_messages(transcript)
    assert [m["role"] for m in api] == ["user", "assistant", "user"]
    assert api[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "notified"}]},
        {
            "type": "tool_result",
            "tool_use_id": "c1",
            "content": [{"type": "text", "text": "interrupted"}],
            "is_error": True,
        },
        {"type": "text", "text": "are you done?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
    ]


def test_an_image_is_sent_in_the_shape_it_has_and_one_without_data_is_left_out():
    base64 = {"type": "base64", "media_type": "image/png", "data": "aGk="}
    url = {"type": "url", "url": "https://example.com/a.png"}
    blocks = [
        {"type": "text", "text": "look"},
        {"type": "image", "source": base64},  # the API's own shape
        {"type": "image", "source": url},
        {"type": "image", "source": "", "media_type": "image/png"},  # cubeloop's shape, no bytes
        {"type": "image"},
    ]
    api = to_api_messages([UserMessage.model_validate({"role": "user", "content": blocks})])
    assert api == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": base64},
                {"type": "image", "source": url},
            ],
        }
    ]


async def test_thinking_budget_and_redacted_thinking_round_trip():
    redacted = sse(
        message_start(),
        block_start(0, {"type": "redacted_thinking", "data": "opaque=="}),
        block_stop(0),
        block_start(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "ok"}),
        block_stop(1),
        *message_end("end_turn"),
    )
    server = Server(redacted, text_reply("again"))
    provider = server.provider(thinking_budget=2048)
    events = await collect(provider, ask())
    reply = events[-1].message
    assert events[1] == ThinkingDelta(0, "")  # keeps the partial message's indices aligned
    assert reply.text == "ok"
    await collect(provider, ModelRequest("", [user_text("hi"), reply, user_text("more")]))
    assert server.bodies[0]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert server.bodies[1]["messages"][1]["content"] == [
        {"type": "redacted_thinking", "data": "opaque=="},
        {"type": "text", "text": "ok"},
    ]


def error_response(status: int, kind: str, message: str) -> httpx2.Response:
    return httpx2.Response(status, json={"type": "error", "error": {"type": kind, "message": message}})


@pytest.mark.parametrize(
    "response, sentence",
    [
        (error_response(529, "overloaded_error", "Overloaded"), "Anthropic API error 529 (overloaded): Overloaded."),
        (
            error_response(401, "authentication_error", "invalid x-api-key"),
            "Anthropic API error 401 (authentication): invalid x-api-key.",
        ),
        (
            error_response(429, "rate_limit_error", "Number of requests has exceeded your rate limit."),
            "Anthropic API error 429 (rate limit): Number of requests has exceeded your rate limit.",
        ),
        (httpx2.ConnectError("connection refused"), "Could not reach the Anthropic API: connection refused."),
    ],
)
async def test_http_failures_end_the_stream_with_one_sentence(response, sentence):
    server = Server(response)
    events = await collect(server.provider(), ask())
    assert len(events) == 1 and isinstance(events[0], StreamEnd)
    message = events[0].message
    assert (message.stop_reason, message.error_message) == ("error", sentence)
    assert message.content == []
    assert len(server.bodies) == 1


async def test_error_event_mid_stream_keeps_the_partial_text():
    body = sse(
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "Half an ans"}),
        block_start(1, {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    events = await collect(Server(body).provider(), ask())
    message = events[-1].message
    assert message.stop_reason == "error"
    assert message.error_message == "Anthropic API error (overloaded): Overloaded."
    assert message.content == [TextContent(text="Half an ans")]  # the unfinished tool call is dropped


async def test_a_stream_cut_short_is_an_error():
    body = sse(
        message_start(), block_start(0, {"type": "text", "text": ""}), delta(0, {"type": "text_delta", "text": "Hel"})
    )
    events = await collect(Server(body).provider(), ask())
    message = events[-1].message
    assert (message.stop_reason, message.error_message) == (
        "error",
        "The Anthropic stream ended before the reply was complete.",
    )
    assert message.text == "Hel"


def test_missing_api_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingApiKeyError, match=r"^No Anthropic API key: set ANTHROPIC_API_KEY or pass api_key\.$"):
        AnthropicProvider()


def test_key_from_the_environment_and_defaults(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    provider = AnthropicProvider()
    assert isinstance(provider, Provider)
    assert (provider.name, provider.model, provider.max_tokens) == ("anthropic", "claude-sonnet-4-5", 8192)


async def test_agent_runs_a_tool_through_the_sdk():
    @tool
    async def read_file(path: str) -> str:
        """Read a text file."""
        return f"contents of {path}"

    server = Server(TOOL_TURN, text_reply("It defines the app."))
    agent = Agent(server.provider(), MemoryCheckpointer(), "t1", tools=[read_file])
    assert await asyncio.wait_for(agent.prompt("What is in src/app.py?"), 10) == "completed"
    assert [m.role for m in agent.state.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert agent.state.messages[2].text == "contents of src/app.py"
    second = server.bodies[1]["messages"]
    assert second[-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [{"type": "text", "text": "contents of src/app.py"}],
            }
        ],
    }
    assert second[1]["content"][0] == {
        "type": "thinking",
        "thinking": "The user wants the file.",
        "signature": "EqQBCgIYAhIM",
    }
