"""Live events: what a supervised run writes to the store's live-event log, and the fold
that rebuilds the run's unfinished state from them in another process.

Persisted messages stay the record; the log only carries what is not persisted yet (the
reply streaming now, the tools running now) plus markers telling a reader when to reload
messages. Each event is a JSON object whose ``type`` names the lifecycle event it
summarises; ``i`` is the index the message has (or will have) in the thread's message
list, which is how a reader tells a live partial from a message it already loaded:

==========================  =========================================================
``agent_start``             ``run_id``: a run began (readers forget older live state)
``message_start``           ``i``, ``role``, ``model``: an assistant reply began streaming
``text_delta``              ``i``, ``b`` (content block index), ``d`` (text); consecutive
                            deltas of one block within a batch are joined into one event
``thinking_delta``          as ``text_delta``, for a thinking block
``tool_call_start``         ``i``, ``b``, ``id``, ``name``: the reply began a tool call
``message_snapshot``        ``i``, ``model``, ``content`` (blocks as JSON): the whole partial so far,
                            written every ``keep // 2`` rows so a bounded log always holds
                            a starting point for it
``message_end``             ``i``, ``role``: message ``i`` is persisted (written after
                            its commit, so a reader that sees it can load the message)
``tool_execution_start``    ``id``, ``name``, ``args``
``tool_execution_update``   ``id``, ``name``, ``progress`` (0..1 or null), ``text``;
                            only the newest update of a tool within a batch is kept
``tool_execution_end``      ``id``, ``name``, ``is_error``
``retry_wait``              ``i``, ``until``, ``seconds``, ``reason``, ``attempt``, ``max_attempts``:
                            the model call for message ``i`` failed retryably and waits
                            (:class:`~core.events.RetryWait`); ``until`` is when the wait
                            ends, in unix seconds of the writer's clock, so a reader that
                            reads the row late still counts down right. The reader's clock
                            must be close to it: the same machine, or hosts kept within a
                            fraction of a second by NTP, as with a shared database file. A
                            wait is over at the next delta, ``message_end`` or ``agent_end``.
``agent_end``               ``run_id``, ``outcome``, ``error``
==========================  =========================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from core.checkpoint.base import LiveEvent
from core.checkpoint.capabilities import LiveEvents
from core.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RetryWait,
    TextDelta,
    ThinkingDelta,
    ToolCallStart,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.messages import AssistantMessage, ToolCall, ToolResultMessage
from core.partial import append_piece

_log = logging.getLogger(__name__)

BATCH_INTERVAL = 0.05
"""Seconds between two writes of the live-event log (one transaction each)."""

KEEP = 2000
"""Live events kept per thread; older ones are pruned in the same transaction."""

_DELTAS = ("text_delta", "thinking_delta")
_ENDS_A_WAIT = (*_DELTAS, "tool_call_start", "message_start", "message_end", "agent_start", "agent_end")
"""Rows after which a model call no longer waits: the next attempt streams, or it is over."""


class LiveLog:
    """The writer: turns one agent's events into batched rows of the live-event log.

    Call :meth:`add` from an agent listener with each event and ``index`` (the index the
    event's message has in the thread; see the module docstring). Rows are buffered and
    written every ``interval`` seconds by a background task, one ``append_live_events``
    call (one transaction) per batch; :meth:`flush` writes now. A failed write is logged
    and its batch dropped: live events are a view, the persisted messages stay the
    record. ``batches``, ``rows`` and ``failures`` count what was written.
    """

    def __init__(
        self, store: LiveEvents, thread_id: str, *, interval: float = BATCH_INTERVAL, keep: int = KEEP
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.interval = interval
        self.keep = keep
        self.run_id: str | None = None
        self.batches = 0
        self.rows = 0
        self.failures = 0
        self._buffer: list[dict[str, Any]] = []
        self._updates: dict[str, int] = {}  # tool call id -> position of its update in the buffer
        self._partial: AssistantMessage | None = None
        self._partial_index = 0
        self._since_anchor = 0  # rows since the partial's message_start or last snapshot
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_write = 0.0

    def start(self) -> None:
        """Start the background writer (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"live events {self.thread_id}")

    async def close(self) -> None:
        """Stop the writer and write what is buffered; never raises."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.flush()

    def add(self, event: AgentEvent, index: int) -> None:
        """Buffer the live-event rows for ``event`` (events that carry nothing live are skipped)."""
        if isinstance(event, MessageUpdate):
            self._delta(event, index)
        elif isinstance(event, ToolExecutionUpdate):
            row = {
                "type": "tool_execution_update",
                "id": event.tool_call_id,
                "name": event.tool_name,
                "progress": event.progress,
                "text": event.text,
            }
            at = self._updates.get(event.tool_call_id)
            if at is not None:
                # Progress supersedes progress: only the newest matters to a reader.
                self._buffer[at] = row
            else:
                self._updates[event.tool_call_id] = len(self._buffer)
                self._push(row)
        elif isinstance(event, MessageStart):
            if isinstance(event.message, AssistantMessage):
                self._partial, self._partial_index, self._since_anchor = event.message, index, 0
                self._push({"type": "message_start", "i": index, "role": "assistant", "model": event.message.model_id})
        elif isinstance(event, MessageEnd):
            if event.message is self._partial:
                self._partial = None
            self._push({"type": "message_end", "i": index, "role": event.message.role})
        elif isinstance(event, ToolExecutionStart):
            self._push(
                {
                    "type": "tool_execution_start",
                    "id": event.tool_call_id,
                    "name": event.tool_name,
                    "args": _jsonable(event.args),
                }
            )
        elif isinstance(event, ToolExecutionEnd):
            self._updates.pop(event.tool_call_id, None)
            self._push(
                {
                    "type": "tool_execution_end",
                    "id": event.tool_call_id,
                    "name": event.tool_name,
                    "is_error": event.is_error,
                }
            )
        elif isinstance(event, AgentStart):
            self.run_id = event.run_id
            self._push({"type": "agent_start", "run_id": event.run_id})
        elif isinstance(event, AgentEnd):
            self._partial = None
            self._push({"type": "agent_end", "run_id": event.run_id, "outcome": event.outcome, "error": event.error})

    async def flush(self) -> None:
        """Write the buffered rows now, in one transaction (nothing when the buffer is empty)."""
        async with self._write_lock:
            batch, self._buffer = self._buffer, []
            self._updates.clear()
            self._wake.clear()
            if not batch:
                return
            self._last_write = time.monotonic()
            try:
                await self.store.append_live_events(self.thread_id, self.run_id, batch, keep=self.keep)
            except Exception:
                self.failures += 1
                _log.warning("could not write %d live events of thread %s", len(batch), self.thread_id, exc_info=True)
                return
            self.batches += 1
            self.rows += len(batch)

    def _delta(self, event: MessageUpdate, index: int) -> None:
        delta = event.delta
        if isinstance(delta, (TextDelta, ThinkingDelta)):
            kind = delta.type
            last = self._buffer[-1] if self._buffer else None
            if last is not None and last["type"] == kind and last["i"] == index and last["b"] == delta.index:
                last["d"] += delta.delta
                return
            self._push({"type": kind, "i": index, "b": delta.index, "d": delta.delta})
        elif isinstance(delta, ToolCallStart):
            self._push({"type": "tool_call_start", "i": index, "b": delta.index, "id": delta.id, "name": delta.name})
        elif isinstance(delta, RetryWait):
            row = {"type": "retry_wait", "i": index, "until": time.time() + delta.seconds, "seconds": delta.seconds}
            self._push(row | {"reason": delta.reason, "attempt": delta.attempt, "max_attempts": delta.max_attempts})
            return  # the partial is unchanged: no snapshot due
        else:
            return  # tool call arguments: the persisted message carries them
        if self._since_anchor >= max(self.keep // 2, 1) and self._partial is not None:
            self._push(
                {
                    "type": "message_snapshot",
                    "i": self._partial_index,
                    "model": self._partial.model_id,
                    "content": [b.model_dump(mode="json") for b in self._partial.content],
                }
            )
            self._since_anchor = 0

    def _push(self, row: dict[str, Any]) -> None:
        self._buffer.append(row)
        self._since_anchor += 1
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            # The first row after a quiet spell waits at most one interval; under a steady
            # stream rows go out once per interval, each batch one transaction.
            delay = self._last_write + self.interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.flush()


def _jsonable(value: Any) -> Any:
    # Tool arguments are JSON already; anything else is shown, not allowed to break the batch.
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


# --- the reader's fold ---------------------------------------------------------------------


@dataclass(slots=True)
class LiveTool:
    """A tool call running in another process: ``progress`` 0..1 or ``None``, ``text`` its
    last status line, ``started_at`` unix seconds (``None`` when its start was not seen)."""

    tool_call_id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    progress: float | None = None
    text: str | None = None


@dataclass(frozen=True, slots=True)
class LiveRetry:
    """A model call of the run waiting to be retried: ``wait`` as the provider announced it,
    ``until`` the unix seconds (the runner's clock) when the wait ends, ``index`` the
    message the call is for."""

    wait: RetryWait
    until: float
    index: int


@dataclass(frozen=True, slots=True)
class PartialDelta:
    """Text appended to block ``block`` of the streaming reply (``kind`` text or thinking)."""

    block: int
    kind: Literal["text", "thinking"]
    text: str


@dataclass(slots=True)
class FoldResult:
    """What folding some live events changed (see :meth:`LiveFold.apply`)."""

    reload: bool = False
    partial_reset: bool = False
    deltas: list[PartialDelta] = field(default_factory=list)
    tools: bool = False
    retry: bool = False
    started: str | None = None
    ended: dict[str, Any] | None = None

    def merge(self, other: FoldResult) -> None:
        """Fold ``other`` (a later result) into this one in place: flags OR-ed, deltas
        appended in order, the later run start or end wins."""
        self.reload |= other.reload
        self.partial_reset |= other.partial_reset
        self.deltas.extend(other.deltas)
        self.tools |= other.tools
        self.retry |= other.retry
        self.started = other.started or self.started
        self.ended = other.ended or self.ended


class LiveFold:
    """The reader: the unfinished state of a run, rebuilt from its live events.

    ``partial`` is the reply streaming now (``None`` if none) and ``partial_index`` the
    index it will have in the thread; ``tools`` the calls running now; ``retry`` the
    model call's retry wait going on now (``None``: none). Events about a
    message the reader already loaded (index below ``persisted``) are ignored, so a
    message is never shown twice: once as a partial, once persisted.
    """

    def __init__(self) -> None:
        self.partial: AssistantMessage | None = None
        self.partial_index: int | None = None
        self.tools: dict[str, LiveTool] = {}
        self.retry: LiveRetry | None = None
        self.run_id: str | None = None

    def apply(self, events: Iterable[LiveEvent], persisted: int, answered: set[str]) -> FoldResult:
        """Fold ``events`` in order. ``persisted`` is how many messages the reader has loaded,
        ``answered`` the tool call ids that have a persisted result. ``reload`` in the
        result says a message at or past ``persisted`` was persisted meanwhile (or a run
        started or ended): load the thread again, then call :meth:`settle`."""
        out = FoldResult()
        for event in events:
            data = event.data
            kind = data.get("type")
            i = data.get("i")
            if kind in _ENDS_A_WAIT:
                self._drop_retry(out)
            if kind in _DELTAS:
                partial = self._partial_for(i, persisted, out)
                if partial is not None:
                    block_kind = "text" if kind == "text_delta" else "thinking"
                    append_piece(partial, int(data.get("b", 0)), block_kind, str(data.get("d", "")))
                    out.deltas.append(PartialDelta(int(data.get("b", 0)), block_kind, str(data.get("d", ""))))
            elif kind == "tool_call_start":
                partial = self._partial_for(i, persisted, out)
                if partial is not None:
                    partial.content.append(ToolCall(id=str(data.get("id", "")), name=str(data.get("name", ""))))
                    out.partial_reset = True
            elif kind == "message_start":
                if isinstance(i, int) and i >= persisted:
                    self.partial, self.partial_index = AssistantMessage(run_id=event.run_id, model_id=_model(data)), i
                    out.partial_reset = True
            elif kind == "message_snapshot":
                if isinstance(i, int) and i >= persisted:
                    try:
                        message = AssistantMessage.model_validate(
                            {"content": data.get("content", []), "run_id": event.run_id, "model_id": _model(data)}
                        )
                    except ValueError:
                        continue
                    self.partial, self.partial_index = message, i
                    out.partial_reset = True
            elif kind == "message_end":
                if isinstance(i, int) and i >= persisted:
                    out.reload = True
                if self.partial_index is not None and i == self.partial_index:
                    self._drop_partial(out)
            elif kind == "retry_wait":
                retry = _retry(data, persisted)
                if retry is not None:
                    self.retry = retry
                    out.retry = True
            elif kind == "tool_execution_start":
                call_id = str(data.get("id", ""))
                if call_id not in answered:
                    args = data.get("args")
                    self.tools[call_id] = LiveTool(
                        call_id, str(data.get("name", "")), args if isinstance(args, dict) else {}, event.at
                    )
                    out.tools = True
            elif kind == "tool_execution_update":
                call_id = str(data.get("id", ""))
                if call_id not in answered:
                    tool = self.tools.get(call_id)
                    if tool is None:  # its start was pruned from the bounded log
                        tool = self.tools[call_id] = LiveTool(call_id, str(data.get("name", "")))
                    if data.get("progress") is not None:
                        tool.progress = float(data["progress"])
                    if data.get("text") is not None:
                        tool.text = str(data["text"])
                    out.tools = True
            elif kind == "tool_execution_end":
                if self.tools.pop(str(data.get("id", "")), None) is not None:
                    out.tools = True
            elif kind == "agent_start":
                self.clear(out)
                self.run_id = data.get("run_id") or event.run_id
                out.started = self.run_id
                out.reload = True
            elif kind == "agent_end":
                self.clear(out)
                out.ended = {"run_id": data.get("run_id"), "outcome": data.get("outcome"), "error": data.get("error")}
                out.reload = True
        return out

    def settle(self, persisted: int, answered: set[str]) -> FoldResult:
        """Forget what is persisted now: the partial once its index is loaded, tools once
        their result is."""
        out = FoldResult()
        if self.partial_index is not None and self.partial_index < persisted:
            self._drop_partial(out)
        if self.retry is not None and self.retry.index < persisted:
            self._drop_retry(out)
        for call_id in [c for c in self.tools if c in answered]:
            del self.tools[call_id]
            out.tools = True
        return out

    def clear(self, out: FoldResult | None = None) -> FoldResult:
        """Forget all live state (the run ended, or its runner is gone)."""
        out = out or FoldResult()
        if self.partial is not None:
            self._drop_partial(out)
        if self.tools:
            self.tools.clear()
            out.tools = True
        self._drop_retry(out)
        return out

    def _partial_for(self, i: Any, persisted: int, out: FoldResult) -> AssistantMessage | None:
        if not isinstance(i, int) or i < persisted:
            return None
        if self.partial is None or self.partial_index != i:
            # Its message_start was pruned from the bounded log (a snapshot should follow).
            self.partial, self.partial_index = AssistantMessage(), i
            out.partial_reset = True
        return self.partial

    def _drop_partial(self, out: FoldResult) -> None:
        self.partial, self.partial_index = None, None
        out.partial_reset = True

    def _drop_retry(self, out: FoldResult) -> None:
        if self.retry is not None:
            self.retry = None
            out.retry = True


def answered_ids(messages: Iterable[Any]) -> set[str]:
    """Tool call ids that have a result among ``messages``."""
    return {m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)}


def _retry(data: dict[str, Any], persisted: int) -> LiveRetry | None:
    """The wait a ``retry_wait`` row announces; ``None`` for one whose message is loaded
    already (that wait is over) or whose fields are unusable."""
    i, until, seconds = data.get("i"), data.get("until"), data.get("seconds")
    attempt, most, reason = data.get("attempt"), data.get("max_attempts"), data.get("reason")
    if not isinstance(i, int) or i < persisted or not isinstance(reason, str):
        return None
    if not (isinstance(until, (int, float)) and isinstance(seconds, (int, float))):
        return None
    if not (isinstance(attempt, int) and isinstance(most, int)):
        return None
    return LiveRetry(RetryWait(float(seconds), reason, attempt, most), float(until), i)


def _model(data: dict[str, Any]) -> str:
    """The model id a live row names (rows of older writers name none: ``""``)."""
    model = data.get("model")
    return model if isinstance(model, str) else ""
