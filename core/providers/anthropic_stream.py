"""Anthropic's Messages stream events -> our stream events and the finished reply.

The events are the SDK's parsed objects of the documented stream
(https://platform.claude.com/docs/en/build-with-claude/streaming): ``message_start``,
``content_block_start`` / ``_delta`` / ``_stop`` (text, thinking with its
``signature_delta``, ``redacted_thinking``, ``tool_use`` with ``input_json_delta``
fragments), ``message_delta`` (stop reason, usage), ``message_stop``. Read by attribute
(``event.type`` and the documented fields), so this module needs no SDK import.
"""

from __future__ import annotations

import json
from typing import Any

from core.events import StreamEvent, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart, UsageUpdate
from core.messages import AssistantMessage, ContentBlock, TextContent, ThinkingContent, ToolCall, Usage
from core.providers.base import Provider, error_reply

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
# Stop reasons that cut the reply off wherever the model was: the last block, if a
# tool_use, holds incomplete input (the stop-reasons page,
# https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons: max_tokens
# "Raise max_tokens or continue the response", model_context_window_exceeded "Treat the
# response as truncated"). Such a call must not run; it is marked (ToolCall.arguments_error)
# and answered with an error result, so the model makes it again.
_CUT_STOPS = {"max_tokens", "model_context_window_exceeded"}
_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
CUT_OFF = "the reply was cut off at the output limit"
"""The ``ToolCall.arguments_error`` of a call whose input a cut-off reply left incomplete."""


class ReplyBuilder:
    """Assembles the final reply from the API's events and yields our stream events.

    API content indices are mapped to ours because block types we do not keep (server
    tool results) are skipped. ``streamed`` tells whether a content event was yielded
    (usage snapshots do not count: they change nothing a retry would repeat).
    """

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.content: list[ContentBlock] = []
        self.index: dict[int, int] = {}
        self.json: dict[int, list[str]] = {}
        self.unread: dict[int, str] = {}  # tool call index -> why its input could not be read
        self.empty: set[int] = set()  # tool call indices whose input streamed no JSON at all
        self.usage = Usage()
        self.model = provider.model
        self.response_id: str | None = None
        self.raw_stop: str | None = None
        self.complete = False
        self.streamed = False

    def apply(self, event: Any) -> list[StreamEvent]:
        """Fold one API event in; return our events for it (deltas, a ``UsageUpdate``)."""
        kind = event.type
        if kind == "content_block_delta":
            out = self._delta(event.index, event.delta)
        elif kind == "content_block_start":
            out = self._start(event.index, event.content_block)
        else:
            if kind == "content_block_stop":
                self._stop(event.index)
            elif kind == "message_start":
                self.response_id = event.message.id
                self.model = event.message.model or self.model
                return self._usage(event.message.usage)
            elif kind == "message_delta":
                self.raw_stop = event.delta.stop_reason or self.raw_stop
                return self._usage(event.usage)
            elif kind == "message_stop":
                self.complete = True
            return []
        self.streamed = self.streamed or bool(out)
        return out

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
        if at is not None:
            self._read_input(at)

    def _read_input(self, at: int) -> None:
        # A tool_use block's input is the concatenated input_json_delta fragments; none at
        # all is the empty input {} (the block starts with input {}). Unreadable input is
        # recorded, never replaced by {}: a tool run with its defaults did what nobody asked.
        fragments = self.json.pop(at, None)
        block = self.content[at]
        if fragments is None or not isinstance(block, ToolCall):
            return
        text = "".join(fragments)
        if not text.strip():
            self.empty.add(at)
            return
        try:
            arguments = json.loads(text)
        except ValueError as exc:
            self.unread[at] = f"they were not valid JSON: {exc}"
            return
        if isinstance(arguments, dict):
            block.arguments = arguments
        else:
            self.unread[at] = f"they were a JSON {_JSON_KINDS.get(type(arguments), 'value')}, not an object"

    def _usage(self, usage: Any) -> list[StreamEvent]:
        if usage is None:
            return []
        if usage.input_tokens is not None:
            self.usage.input_tokens = usage.input_tokens
        if usage.output_tokens is not None:
            self.usage.output_tokens = usage.output_tokens
        if usage.cache_read_input_tokens is not None:
            self.usage.cache_read_tokens = usage.cache_read_input_tokens
        if usage.cache_creation_input_tokens is not None:
            self.usage.cache_write_tokens = usage.cache_creation_input_tokens
        return [UsageUpdate(self.usage.model_copy())]

    def finish(self) -> AssistantMessage:
        """The finished reply (call after ``message_stop``).

        A tool call whose input could not be read gets ``arguments_error`` (see
        :class:`~core.messages.ToolCall`): input that is not a JSON object, or, when the
        reply was cut off (``max_tokens``, ``model_context_window_exceeded``), any input of
        the last block, the one being written when the limit was reached (:data:`CUT_OFF`),
        unless it parsed as a whole object.
        """
        raw = self.raw_stop or "end_turn"
        for at in list(self.json):
            self._read_input(at)  # a block the stream never closed
        last = len(self.content) - 1
        if raw in _CUT_STOPS and (last in self.unread or last in self.empty):
            self.unread[last] = CUT_OFF
        for at, why in self.unread.items():
            block = self.content[at]
            if isinstance(block, ToolCall):
                block.arguments_error = why
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
        """The reply of a failed or aborted stream: what streamed so far (no tool calls),
        the usage reported so far, and ``sentence`` as its error."""
        message = error_reply(self.provider, sentence, content=self.content, stop_reason=stop_reason)
        message.usage = self.usage
        message.response_id = self.response_id
        return message
