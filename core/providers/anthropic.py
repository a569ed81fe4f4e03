"""Anthropic's Messages API through the official ``anthropic`` SDK, streamed.

The only module that imports ``anthropic``. It maps our messages and tool specs to the
API's request shape, and the API's server-sent events back to our stream events:
text, thinking (with its signature, needed to replay it), tool use with streamed JSON
input, usage, and the stop reason. Failures end the stream as an error reply with one
sentence, as the provider contract in :mod:`core.providers.base` requires.

Retries are ours, not the SDK's (it is built with ``max_retries=0``): a retryable failure
before anything was streamed is announced as a :class:`~core.events.RetryWait` event and
waited out on the abort signal, with the numbers of :class:`~core.providers.retry.RetryPolicy`.
Requests carry prompt-caching breakpoints (:func:`add_cache_breakpoints`).
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2

from core.errors import MissingApiKeyError
from core.events import RetryWait, StreamEnd, StreamEvent
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
    UserMessage,
)
from core.providers.anthropic_stream import ReplyBuilder
from core.providers.base import ABORTED_TEXT, ModelRequest
from core.providers.retry import RetryPolicy, retry_after, wait_or_abort
from core.request import build_request, image_source, sendable

DEFAULT_MODEL = "claude-sonnet-4-5"

# Error events inside a 200 stream that are worth another attempt (the errors page lists
# api_error and overloaded_error as the API's own transient failures).
_RETRYABLE_ERROR_EVENTS = {"overloaded_error", "api_error", "rate_limit_error"}


class AnthropicProvider:
    """A :class:`~core.providers.base.Provider` for Claude models.

    ``model`` is the model id; ``max_tokens`` caps each reply (tokens);
    ``thinking_budget`` (tokens, below ``max_tokens``) turns on extended thinking.
    ``api_key`` defaults to ``ANTHROPIC_API_KEY``. ``max_retries`` is how many times a
    call that failed retryably (HTTP 408, 409, 429, 5xx and 529, a lost or refused
    connection, a timeout, an overload error event) is tried again, only ever before
    anything of it was streamed, with the backoff of :class:`~core.providers.retry.RetryPolicy`;
    the SDK itself never retries. ``prompt_caching`` adds the ``cache_control``
    breakpoints of :func:`add_cache_breakpoints`. ``base_url`` and ``http_client`` (an
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
        max_retries: int = RetryPolicy().max_retries,
        prompt_caching: bool = True,
        base_url: str | None = None,
        http_client: Any = None,
    ) -> None:
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise MissingApiKeyError("No Anthropic API key: set ANTHROPIC_API_KEY or pass api_key.")
        self.model = model
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.retry = RetryPolicy(max_retries=max(max_retries, 0))
        self.prompt_caching = prompt_caching
        self._client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0, http_client=http_client)

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """Stream one reply; see :class:`~core.providers.base.Provider`. Never raises
        (except ``CancelledError``): failures end with an error reply, after the retries
        described in the class docstring, each announced by a ``RetryWait``."""
        params = self.request_params(request)
        attempts = self.retry.max_retries + 1
        attempt = 0
        while True:
            attempt += 1
            reply = ReplyBuilder(self)
            fault: _Fault | None = None
            answered = False
            try:
                # Every wait on the SDK (the response's headers, each event) is raced with
                # the abort signal: a stalled stream would otherwise hold an abort until
                # the SDK's read timeout (minutes), against the provider contract.
                response = await _unless_aborted(self._client.messages.create(**params, stream=True), signal)
                if response is _ABORTED:
                    yield StreamEnd(reply.failed(ABORTED_TEXT, stop_reason="aborted"))
                    return
                answered = True
                async with response:
                    events = aiter(response)
                    while (event := await _unless_aborted(anext(events, _END), signal)) is not _END:
                        if event is _ABORTED:
                            yield StreamEnd(reply.failed(ABORTED_TEXT, stop_reason="aborted"))
                            return
                        for out in reply.apply(event):
                            yield out
            except Exception as exc:
                fault = _fault(exc, answered=answered)
            if fault is None and not reply.complete:
                fault = _Fault("The Anthropic stream ended before the reply was complete", "the stream was cut", True)
            if fault is None:
                yield StreamEnd(reply.finish())
                return
            if signal.is_set():
                yield StreamEnd(reply.failed(ABORTED_TEXT, stop_reason="aborted"))
                return
            wait = self._retry_wait(fault, attempt, reply)
            if wait is None:
                yield StreamEnd(reply.failed(self._final_sentence(fault, attempt, reply)))
                return
            yield RetryWait(wait, fault.reason, attempt, attempts)
            if await wait_or_abort(signal, wait):
                yield StreamEnd(reply.failed(ABORTED_TEXT, stop_reason="aborted"))
                return

    def _retry_wait(self, fault: _Fault, attempt: int, reply: ReplyBuilder) -> float | None:
        # Seconds to wait before the next attempt, or None to give up. Nothing streamed
        # may be retried: the loop has already shown (and applied) those deltas.
        if not fault.retryable or reply.streamed or attempt > self.retry.max_retries:
            return None
        if fault.retry_after is not None:
            return fault.retry_after if fault.retry_after <= self.retry.max_retry_after else None
        return self.retry.backoff(attempt)

    def _final_sentence(self, fault: _Fault, attempt: int, reply: ReplyBuilder) -> str:
        base = fault.sentence.rstrip(". ")
        retryable = fault.retryable and not reply.streamed
        asked = fault.retry_after
        if retryable and asked is not None and asked > self.retry.max_retry_after and attempt <= self.retry.max_retries:
            cap = self.retry.max_retry_after
            return f"{base} (the API asked to wait {asked:.0f} s, longer than the {cap:.0f} s this app waits)."
        if attempt > 1:
            return f"{base} (gave up after {attempt} attempts)."
        return _period(base)

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request`` (without ``stream``);
        undecodable bytes in the history are sent escaped (:func:`core.request.sendable`)."""
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
        if self.prompt_caching:
            add_cache_breakpoints(params)
        return sendable(params)


_ABORTED = object()  # what _unless_aborted returns when the signal came first
_END = object()  # the end of the SDK's event stream


async def _unless_aborted(step: Awaitable[Any], signal: asyncio.Event) -> Any:
    """``await step``, unless ``signal`` is set first (or already): then ``step`` is
    cancelled (and awaited, so the SDK's response can be closed after it) and
    :data:`_ABORTED` is returned. An abort wins over a result that is ready at the same
    time, as the loop would not use it. Exceptions of ``step`` propagate."""
    if signal.is_set():
        if inspect.iscoroutine(step):
            step.close()  # never started: nothing to cancel
        return _ABORTED
    task = asyncio.ensure_future(step)
    aborted = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if signal.is_set():
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: an error raised as the abort came is not reported
        return _ABORTED
    return task.result()


# --- prompt caching -----------------------------------------------------------------------------

MAX_CACHE_BREAKPOINTS = 4
"""Anthropic's limit of ``cache_control`` breakpoints per request (prompt-caching page)."""


def add_cache_breakpoints(params: dict[str, Any]) -> int:
    """Mark ``params`` (``messages.create`` keywords, changed in place) for prompt caching;
    return how many breakpoints were set (at most :data:`MAX_CACHE_BREAKPOINTS`).

    Following https://platform.claude.com/docs/en/build-with-claude/prompt-caching: a
    ``cache_control: {"type": "ephemeral"}`` breakpoint caches the prefix up to and
    including its block, in the order tools, system, messages; a request may hold up to 4
    breakpoints; the system prompt is sent as a text block to carry one. The breakpoints
    are: the system prompt; the last tool (caching every tool definition); the last block
    of the last user-side message (tool results, prompt), so the next call reads the whole
    history from the cache; and the last block of the user-side message before it, which
    is where the previous call wrote its cache entry, so that entry is read back even when
    more blocks than the page's lookback window (about 20 blocks) came after it - the
    page's multi-turn example marks the last and the second-to-last user message likewise.
    A prefix shorter than the model's minimum (1024 tokens and up) is simply not cached.
    """
    marks = 0
    system = params.get("system")
    if isinstance(system, str) and system:
        params["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        marks += 1
    tools = params.get("tools")
    if tools:
        tools[-1] = {**tools[-1], "cache_control": {"type": "ephemeral"}}
        marks += 1
    user_turns = [turn for turn in params.get("messages", ()) if turn["role"] == "user" and turn["content"]]
    for turn in user_turns[-2:]:
        blocks = turn["content"]
        blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
        marks += 1
    return marks


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
    orphan and duplicate results, unknown rows, failed replies, blank text and images
    without data). An image is sent with the source :func:`core.request.image_source`
    gives. Thinking without a signature (which the API cannot verify) is left out; a
    message left empty is dropped. Never raises.
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
        elif isinstance(b, ImageContent) and (source := image_source(b)) is not None:
            blocks.append({"type": "image", "source": source})
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


# --- failures -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fault:
    """One failed attempt: ``sentence`` for the error reply (no final period), ``reason``
    for a retry notice, whether another attempt may help, the wait the server asked for."""

    sentence: str
    reason: str
    retryable: bool
    retry_after: float | None = None


def _fault(exc: Exception, *, answered: bool) -> _Fault:
    """What one failed attempt says. ``answered``: whether the response's headers had come,
    so a transport failure was a connection lost while the body streamed, not a server
    that could not be reached. The SDK raises that failure as ``APIConnectionError`` from
    anthropic 2.17 (wrapping the transport's error) and as the transport's own error before."""
    if isinstance(exc, anthropic.APIStatusError):
        return _status_fault(exc)
    if isinstance(exc, anthropic.APITimeoutError):
        return _Fault("The Anthropic API did not answer in time", "timed out", True)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        cause = exc.__cause__ or exc if isinstance(exc, anthropic.APIConnectionError) else exc
        if answered or isinstance(exc, httpx2.TransportError):
            return _Fault(
                f"The connection to the Anthropic API was lost: {_first_line(cause)}", "connection lost", True
            )
        return _Fault(f"Could not reach the Anthropic API: {_first_line(cause)}", "connection failed", True)
    return _Fault(f"The Anthropic stream failed: {_first_line(exc)}", "stream failed", False)


def _status_fault(exc: anthropic.APIStatusError) -> _Fault:
    status = exc.status_code
    kind = exc.type or ""
    headers = exc.response.headers
    if status < 400:
        # An error event inside a 200 stream: its type says what happened.
        retryable = kind in _RETRYABLE_ERROR_EVENTS
    else:
        retryable = _retryable_status(status, headers.get("x-should-retry"))
    return _Fault(_status_sentence(exc), _status_reason(status, kind), retryable, retry_after(headers))


def _retryable_status(status: int, should_retry: str | None) -> bool:
    # The SDK's own rule (BaseClient._should_retry): the server's x-should-retry header
    # wins; else request timeout, lock timeout, rate limit and every 5xx (529 overloaded).
    if should_retry in ("true", "false"):
        return should_retry == "true"
    return status in (408, 409, 429) or status >= 500


def _status_reason(status: int, kind: str) -> str:
    if status == 429 or kind == "rate_limit_error":
        return "rate limited"
    if status == 529 or kind == "overloaded_error":
        return "overloaded"
    if status == 408 or kind == "timeout_error":
        return "timed out"
    if status >= 500:
        return f"server error {status}"
    if kind == "api_error":
        return "server error"
    return f"HTTP {status}" if status >= 400 else "stream error"


def _status_sentence(exc: anthropic.APIStatusError) -> str:
    # "Anthropic API error 529 (overloaded): Overloaded" (the caller ends the sentence).
    # An error event inside a 200 stream has no meaningful status, so the code is left out then.
    kind = (exc.type or "").removesuffix("_error").replace("_", " ")
    detail = (exc.api_message or "").strip() or _first_line(exc)
    code = f" {exc.status_code}" if exc.status_code >= 400 else ""
    label = f" ({kind})" if kind else ""
    return f"Anthropic API error{code}{label}: {' '.join(detail.split())}".rstrip(".")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _period(sentence: str) -> str:
    return sentence if sentence.endswith((".", "!", "?")) else sentence + "."
