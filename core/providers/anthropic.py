"""Anthropic's Messages API through the official ``anthropic`` SDK, streamed.

The only module that imports ``anthropic``. It maps our messages and tool specs to the
API's request shape, and the API's server-sent events back to our stream events:
text, thinking (with its signature, needed to replay it), tool use with streamed JSON
input, usage, and the stop reason. Failures end the stream as an error reply with one
sentence, as the provider contract in :mod:`core.providers.base` requires.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator, Sequence

import anthropic

from core.errors import MissingApiKeyError
from core.events import StreamEnd, StreamEvent, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart
from core.messages import (
    AnyMessage,
    AssistantMessage,
    ContentBlock,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from core.providers.base import ModelRequest, error_reply
from core.request import build_request

DEFAULT_MODEL = "claude-sonnet-4-5"

# API stop reason -> ours; anything else (refusal, pause_turn, ...) is "stop", with the
# raw reason kept in metadata["provider_stop_reason"].
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}
_PLAIN_STOPS = {"end_turn", "stop_sequence", "tool_use", "max_tokens"}


class AnthropicProvider:
    """A :class:`~core.providers.base.Provider` for Claude models.

    ``model`` is the model id; ``max_tokens`` caps each reply (tokens);
    ``thinking_budget`` (tokens, below ``max_tokens``) turns on extended thinking.
    ``api_key`` defaults to ``ANTHROPIC_API_KEY``; ``max_retries`` is the SDK's retry
    count for overload and rate-limit responses; ``base_url`` and ``http_client`` (an
    ``httpx2.AsyncClient``) are passed to the SDK. Raises
    :class:`~core.errors.MissingApiKeyError` when there is no key.
    """

    name = "anthropic"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        api_key: str | None = None,
        max_tokens: int = 8192,
        thinking_budget: int | None = None,
        max_retries: int = 2,
        base_url: str | None = None,
        http_client: Any = None,
    ) -> None:
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise MissingApiKeyError("No Anthropic API key: set ANTHROPIC_API_KEY or pass api_key.")
        self.model = model
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self._client = anthropic.AsyncAnthropic(
            api_key=key, base_url=base_url, max_retries=max_retries, http_client=http_client
        )

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """Stream one reply; see :class:`~core.providers.base.Provider`. Never raises
        (except ``CancelledError``): failures end with an error reply."""
        reply = _ReplyBuilder(self)
        try:
            response = await self._client.messages.create(**self.request_params(request), stream=True)
            async with response:
                async for event in response:
                    if signal.is_set():
                        yield StreamEnd(reply.failed("Aborted by the user.", stop_reason="aborted"))
                        return
                    for out in reply.apply(event):
                        yield out
        except anthropic.APIStatusError as exc:
            yield StreamEnd(reply.failed(_status_sentence(exc)))
            return
        except anthropic.APITimeoutError:
            yield StreamEnd(reply.failed("The Anthropic API did not answer in time."))
            return
        except anthropic.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            yield StreamEnd(reply.failed(_period(f"Could not reach the Anthropic API: {_first_line(cause)}")))
            return
        except Exception as exc:
            yield StreamEnd(reply.failed(_period(f"The Anthropic stream failed: {_first_line(exc)}")))
            return
        yield StreamEnd(reply.finish())

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request`` (without ``stream``)."""
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": to_api_messages(request.messages),
        }
        if request.system_prompt:
            params["system"] = request.system_prompt
        if request.tools:
            params["tools"] = to_api_tools(request.tools)
        if self.thinking_budget:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        return params


# --- our messages -> the API ------------------------------------------------------------------


def to_api_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs in the API's shape (``name``, ``description``, ``input_schema``)."""
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def to_api_messages(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The transcript in the API's shape: a list of ``{"role", "content": [block, ...]}``.

    Tool results become ``tool_result`` blocks of a user message, consecutive ones (and
    any user message right before or after them) merged into one message, as the API
    requires. In every user message the ``tool_result`` blocks come first, in their
    original order, then the other blocks in theirs: Anthropic's "Handle tool calls"
    page (https://platform.claude.com/docs/en/agents-and-tools/tool-use/handle-tool-calls)
    says tool results must immediately follow their tool use and that in the user
    message containing them "the tool_result blocks must come FIRST in the content
    array"; otherwise the request is refused with a 400. A persisted thread can hold a
    user message between a call and its result (one written by cubeloop or by hand,
    settled by resume later): the messages are first put in an order the API accepts by
    :func:`core.request.build_request` (the one request builder; it also leaves out
    orphan and duplicate results, unknown rows and failed replies). Empty text, and
    thinking without a signature (which the API cannot verify) are left out; a message
    left empty is dropped. Never raises.
    """
    out: list[dict[str, Any]] = []
    for message in build_request(messages).messages:
        if isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message.content)
        elif isinstance(message, ToolResultMessage):
            role, blocks = "user", [_tool_result_block(message)]
        elif isinstance(message, UserMessage):
            content = message.content
            role, blocks = "user", _plain_blocks([TextContent(text=content)] if isinstance(content, str) else content)
        else:
            continue
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for turn in out:
        if turn["role"] == "user":
            turn["content"] = _tool_results_first(turn["content"])
    return out


def _tool_results_first(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # sorted() is stable: results keep their order, and so does the text after them.
    return sorted(blocks, key=lambda b: b["type"] != "tool_result")


def _plain_blocks(content: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, TextContent) and b.text:
            blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageContent):
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": b.mime_type, "data": b.data}})
    return blocks


def _assistant_blocks(content: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, TextContent) and b.text:
            blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ThinkingContent):
            redacted = (b.model_extra or {}).get("redacted_data")
            if redacted:
                blocks.append({"type": "redacted_thinking", "data": redacted})
            elif b.signature:
                blocks.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
        elif isinstance(b, ToolCall):
            blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.arguments})
    return blocks


def _tool_result_block(message: ToolResultMessage) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    content = _plain_blocks(message.content)
    if content:
        block["content"] = content
    if message.is_error:
        block["is_error"] = True
    return block


# --- the API's stream -> our events -------------------------------------------------------------


class _ReplyBuilder:
    """Assembles the final reply from the API's events and yields our stream events.

    API content indices are mapped to ours because block types we do not keep (server
    tool results) are skipped.
    """

    def __init__(self, provider: AnthropicProvider) -> None:
        self.provider = provider
        self.content: list[ContentBlock] = []
        self.index: dict[int, int] = {}
        self.json: dict[int, list[str]] = {}
        self.usage = Usage()
        self.model = provider.model
        self.response_id: str | None = None
        self.raw_stop: str | None = None
        self.complete = False

    def apply(self, event: Any) -> list[StreamEvent]:
        kind = event.type
        if kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        if kind == "content_block_start":
            return self._start(event.index, event.content_block)
        if kind == "content_block_stop":
            self._stop(event.index)
        elif kind == "message_start":
            self.response_id = event.message.id
            self.model = event.message.model or self.model
            self._usage(event.message.usage)
        elif kind == "message_delta":
            self.raw_stop = event.delta.stop_reason or self.raw_stop
            self._usage(event.usage)
        elif kind == "message_stop":
            self.complete = True
        return []

    def _start(self, api_index: int, block: Any) -> list[StreamEvent]:
        at = len(self.content)
        if block.type == "text":
            self.content.append(TextContent(text=block.text))
            event: StreamEvent = TextDelta(at, block.text)
        elif block.type == "thinking":
            self.content.append(ThinkingContent(thinking=block.thinking, signature=block.signature or None))
            event = ThinkingDelta(at, block.thinking)
        elif block.type == "redacted_thinking":
            self.content.append(ThinkingContent(thinking="", redacted_data=block.data))
            event = ThinkingDelta(at, "")
        elif block.type == "tool_use":
            self.content.append(ToolCall(id=block.id, name=block.name))
            self.json[at] = []
            event = ToolCallStart(at, block.id, block.name)
        else:
            return []
        self.index[api_index] = at
        return [event]

    def _delta(self, api_index: int, delta: Any) -> list[StreamEvent]:
        at = self.index.get(api_index)
        if at is None:
            return []
        block = self.content[at]
        kind = delta.type
        if kind == "text_delta" and isinstance(block, TextContent):
            block.text += delta.text
            return [TextDelta(at, delta.text)]
        if kind == "thinking_delta" and isinstance(block, ThinkingContent):
            block.thinking += delta.thinking
            return [ThinkingDelta(at, delta.thinking)]
        if kind == "signature_delta" and isinstance(block, ThinkingContent):
            block.signature = (block.signature or "") + delta.signature
        elif kind == "input_json_delta" and at in self.json:
            self.json[at].append(delta.partial_json)
            return [ToolCallDelta(at, delta.partial_json)]
        return []

    def _stop(self, api_index: int) -> None:
        at = self.index.get(api_index)
        fragments = self.json.pop(at, None) if at is not None else None
        if fragments is None:
            return
        text = "".join(fragments)
        try:
            arguments = json.loads(text) if text else {}
        except ValueError:
            arguments = {}
        block = self.content[at]
        if isinstance(block, ToolCall) and isinstance(arguments, dict):
            block.arguments = arguments

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        if usage.input_tokens is not None:
            self.usage.input_tokens = usage.input_tokens
        if usage.output_tokens is not None:
            self.usage.output_tokens = usage.output_tokens
        if usage.cache_read_input_tokens is not None:
            self.usage.cache_read_tokens = usage.cache_read_input_tokens
        if usage.cache_creation_input_tokens is not None:
            self.usage.cache_write_tokens = usage.cache_creation_input_tokens

    def finish(self) -> AssistantMessage:
        if not self.complete:
            return self.failed("The Anthropic stream ended before the reply was complete.")
        raw = self.raw_stop or "end_turn"
        return AssistantMessage(
            content=self.content,
            stop_reason=_STOP_REASONS.get(raw, "stop"),
            usage=self.usage,
            provider_id=self.provider.name,
            model_id=self.model,
            response_id=self.response_id,
            metadata={} if raw in _PLAIN_STOPS else {"provider_stop_reason": raw},
        )

    def failed(self, sentence: str, *, stop_reason: str = "error") -> AssistantMessage:
        message = error_reply(self.provider, sentence, content=self.content, stop_reason=stop_reason)
        message.usage = self.usage
        message.response_id = self.response_id
        return message


def _status_sentence(exc: anthropic.APIStatusError) -> str:
    # "Anthropic API error 529 (overloaded): Overloaded." An error event inside a 200
    # stream has no meaningful status, so the code is left out then.
    kind = (getattr(exc, "type", None) or "").removesuffix("_error").replace("_", " ")
    detail = (getattr(exc, "api_message", None) or "").strip() or _first_line(exc)
    code = f" {exc.status_code}" if exc.status_code >= 400 else ""
    label = f" ({kind})" if kind else ""
    return _period(f"Anthropic API error{code}{label}: {' '.join(detail.split())}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _period(sentence: str) -> str:
    return sentence if sentence.endswith((".", "!", "?")) else sentence + "."
