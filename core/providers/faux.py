"""A scripted, deterministic provider for tests and the demo: no network, no API key.

    provider = FauxProvider([
        faux_reply(faux_text("Let me look."), faux_tool_call("read", {"path": "a.txt"})),
        faux_reply(faux_text("Done.")),
        lambda request: faux_reply(faux_text(f"You sent {len(request.messages)} messages.")),
    ])

Each model call takes the next script entry (a reply, a string, or a callable of the
request returning either) and streams it in small deltas, exactly as a real provider
would: first a usage snapshot with the input tokens (as Anthropic's ``message_start``),
then the content. ``provider.requests`` keeps a snapshot of every request for assertions.

Like the real Messages API, which answers 400 to a request whose tool calls and results
do not pair up, the faux provider refuses (an error reply, no script entry used) a
request that breaks the rule of :func:`core.request.check_request`.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from core.events import StreamEnd, StreamEvent, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallStart, UsageUpdate
from core.messages import (
    AnyMessage,
    AssistantMessage,
    ContentBlock,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from core.providers.base import ABORTED_TEXT, ModelRequest, error_reply
from core.request import RequestChecker

Reply = AssistantMessage | str
ScriptEntry = Reply | Callable[[ModelRequest], Reply]
"""One scripted model call: a reply, plain text, or a function of the request returning either."""

_CHARS_PER_TOKEN = 4


def faux_text(text: str) -> TextContent:
    """A text block for :func:`faux_reply`."""
    return TextContent(text=text)


def faux_thinking(thinking: str, signature: str | None = "faux-signature") -> ThinkingContent:
    """A thinking block for :func:`faux_reply`."""
    return ThinkingContent(thinking=thinking, signature=signature)


def faux_tool_call(
    name: str, args: dict[str, Any] | None = None, id: str | None = None, *, arguments_error: str | None = None
) -> ToolCall:
    """A tool call block; without ``id`` the provider gives it one unique within the thread
    (``call_<history length>_<block index>``), the same on every run. ``arguments_error``
    scripts a call whose arguments a real provider could not read (e.g. a reply cut off
    at its output limit mid-call; see :class:`~core.messages.ToolCall`)."""
    return ToolCall(id=id or "", name=name, arguments=dict(args or {}), arguments_error=arguments_error)


def faux_reply(*blocks: ContentBlock | str, stop_reason: str | None = None) -> AssistantMessage:
    """An assistant reply of ``blocks`` (strings become text blocks).

    ``stop_reason`` defaults to ``"tool_use"`` when a tool call is present, else ``"stop"``.
    """
    content = [faux_text(b) if isinstance(b, str) else b for b in blocks]
    if stop_reason is None:
        stop_reason = "tool_use" if any(isinstance(b, ToolCall) for b in content) else "stop"
    return AssistantMessage(content=content, stop_reason=stop_reason)


class FauxProvider:
    """Replays a script of replies as a streaming provider (see the module docstring).

    ``chunk_size`` is the number of characters per delta; ``delay`` the seconds slept
    before each delta (0 still yields to the event loop, so an abort can land).
    ``fallback`` answers requests once the script is exhausted; without it such a
    request gets an error reply. ``record=False`` stops keeping request snapshots
    (each snapshot copies the message list, which matters at very long histories).
    """

    name = "faux"

    def __init__(
        self,
        script: Iterable[ScriptEntry] = (),
        *,
        model: str = "faux-1",
        chunk_size: int = 8,
        delay: float = 0.0,
        fallback: Callable[[ModelRequest], Reply] | None = None,
        record: bool = True,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1 character.")
        self.model = model
        self.chunk_size = chunk_size
        self.delay = delay
        self.fallback = fallback
        self.record = record
        self.requests: list[ModelRequest] = []
        self._script: deque[ScriptEntry] = deque(script)
        self._calls = 0
        self._counted: tuple[int, int, int] = (0, 0, 0)  # id of the list, messages counted, their chars
        self._checker = RequestChecker()  # incremental on the same growing list

    def add(self, *entries: ScriptEntry) -> None:
        """Append entries to the script."""
        self._script.extend(entries)

    @property
    def remaining(self) -> int:
        """How many scripted entries have not been used yet."""
        return len(self._script)

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """Stream the next scripted reply; see :class:`~core.providers.base.Provider`."""
        self._calls += 1
        if self.record:
            self.requests.append(ModelRequest(request.system_prompt, tuple(request.messages), request.tools))
        problem = self._checker.check(request.messages)
        if problem is not None:
            yield StreamEnd(
                error_reply(self, f"The faux provider refused the request (the API would answer 400): {problem}")
            )
            return
        reply = self._next_reply(request)
        if reply is None:
            yield StreamEnd(error_reply(self, f"The faux provider has no scripted reply left for call {self._calls}."))
            return
        for event in self._deltas(reply):
            if self.delay > 0:
                await asyncio.sleep(self.delay)
            else:
                await asyncio.sleep(0)
            if signal.is_set():
                aborted = error_reply(self, ABORTED_TEXT, stop_reason="aborted")
                if reply.usage is not None:
                    aborted.usage = reply.usage.model_copy(update={"output_tokens": 0})  # as reported so far
                yield StreamEnd(aborted)
                return
            yield event
        yield StreamEnd(reply)

    def _next_reply(self, request: ModelRequest) -> AssistantMessage | None:
        if self._script:
            entry = self._script.popleft()
        elif self.fallback is not None:
            entry = self.fallback
        else:
            return None
        value = entry(request) if callable(entry) else entry
        reply = faux_reply(value) if isinstance(value, str) else value.model_copy(deep=True)
        for index, block in enumerate(reply.content):
            if isinstance(block, ToolCall) and not block.id:
                block.id = f"call_{len(request.messages)}_{index}"
        reply.provider_id = reply.provider_id or self.name
        reply.model_id = reply.model_id or self.model
        if reply.usage is None:
            reply.usage = Usage(input_tokens=self._input_tokens(request), output_tokens=_tokens(_reply_chars(reply)))
        return reply

    def _deltas(self, reply: AssistantMessage) -> Iterable[StreamEvent]:
        size = self.chunk_size
        if reply.usage is not None:
            # What a real API knows before the first token: the input, no output yet.
            yield UsageUpdate(reply.usage.model_copy(update={"output_tokens": 0}))
        for index, block in enumerate(reply.content):
            if isinstance(block, TextContent):
                for i in range(0, len(block.text), size):
                    yield TextDelta(index, block.text[i : i + size])
            elif isinstance(block, ThinkingContent):
                for i in range(0, len(block.thinking), size):
                    yield ThinkingDelta(index, block.thinking[i : i + size])
            elif isinstance(block, ToolCall):
                yield ToolCallStart(index, block.id, block.name)
                arguments = json.dumps(block.arguments)
                for i in range(0, len(arguments), size):
                    yield ToolCallDelta(index, arguments[i : i + size])

    def _input_tokens(self, request: ModelRequest) -> int:
        # Counted incrementally while the same transcript list grows, so a call's cost
        # does not grow with the history.
        list_id, counted, chars = self._counted
        messages = request.messages
        if list_id != id(messages) or counted > len(messages):
            counted, chars = 0, len(request.system_prompt)
        for i in range(counted, len(messages)):
            chars += _message_chars(messages[i])
        self._counted = (id(messages), len(messages), chars)
        return _tokens(chars)


def _tokens(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


def _reply_chars(reply: AssistantMessage) -> int:
    return sum(_block_chars(b) for b in reply.content)


def _message_chars(message: AnyMessage) -> int:
    if isinstance(message, UserMessage) and isinstance(message.content, str):
        return len(message.content)
    if isinstance(message, (UserMessage, AssistantMessage, ToolResultMessage)):
        return sum(_block_chars(b) for b in message.content)
    return 0


def _block_chars(block: Any) -> int:
    if isinstance(block, TextContent):
        return len(block.text)
    if isinstance(block, ThinkingContent):
        return len(block.thinking)
    if isinstance(block, ToolCall):
        return len(block.name) + len(json.dumps(block.arguments))
    return 0
