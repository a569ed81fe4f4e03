"""Events: what providers stream to the loop, and what the loop tells its subscribers.

Two families, both plain frozen dataclasses (cheap to build at thousands per second):

* provider stream events (:data:`StreamEvent`): deltas of one assistant reply, ended by
  exactly one :class:`StreamEnd` carrying the finished :class:`AssistantMessage`;
* agent lifecycle events (:data:`AgentEvent`), named as in CubePi and pi-mono:
  ``agent_start``/``agent_end`` bracket a run, ``turn_start``/``turn_end`` one model call
  and its tools, ``message_start``/``message_update``/``message_end`` one message, and
  ``tool_execution_start``/``_update``/``_end`` one tool call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, Usage

# --- provider stream events -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More text for the text block at ``index`` of the reply's content."""

    index: int
    delta: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """More reasoning text for the thinking block at ``index``."""

    index: int
    delta: str
    type: Literal["thinking_delta"] = "thinking_delta"


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model began a tool call at content ``index``; its arguments stream next."""

    index: int
    id: str
    name: str
    type: Literal["tool_call_start"] = "tool_call_start"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of the JSON arguments of the tool call at ``index``."""

    index: int
    arguments_delta: str
    type: Literal["tool_call_delta"] = "tool_call_delta"


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """The reply's token usage as reported so far (a snapshot, not an increment).

    Sent when the provider learns it (Anthropic: ``message_start`` gives the input and
    cache tokens, ``message_delta`` the output so far), so a reply that is aborted
    mid-stream still records what was used. ``usage`` is the provider's own copy: the
    loop copies it into the partial reply; don't mutate it.
    """

    usage: Usage
    type: Literal["usage_update"] = "usage_update"


@dataclass(frozen=True, slots=True)
class RetryWait:
    """A model call failed retryably; the provider waits ``seconds`` before attempt ``attempt + 1``.

    ``reason`` is a short phrase for people ("rate limited", "overloaded", "server error
    503", "connection failed"); ``attempt`` is the 1-based attempt that failed, of at most
    ``max_attempts``. The wait ends early when the run is aborted. Nothing of the failed
    attempt was streamed (a provider retries only then), so the partial reply is unchanged.
    """

    seconds: float
    reason: str
    attempt: int
    max_attempts: int
    type: Literal["retry_wait"] = "retry_wait"


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The reply is finished; ``message`` is complete, with stop reason and usage.

    A failed call ends the same way, with ``stop_reason="error"`` and ``error_message``.
    """

    message: AssistantMessage
    type: Literal["stream_end"] = "stream_end"


StreamEvent = TextDelta | ThinkingDelta | ToolCallStart | ToolCallDelta | UsageUpdate | RetryWait | StreamEnd
"""One event of a provider's reply stream."""

# --- agent lifecycle events -------------------------------------------------------------

RunOutcome = Literal["completed", "aborted", "failed", "interrupted", "waiting"]
"""How a run ended: finished normally, aborted by the user, ended by a provider error,
stopped with work left (e.g. a dangling call the user chose not to settle), or
**waiting for an answer**: a tool call asked a person and the run stopped before the
answer came (``Agent.detach()``, or a deadline without default). A waiting run stays
open with its pending request; resuming once it is answered applies the answer
(:mod:`core.human_wait`)."""


@dataclass(frozen=True, slots=True)
class AgentStart:
    """A run began (``run_id`` names it in the store's ``runs`` table)."""

    run_id: str
    type: Literal["agent_start"] = "agent_start"


@dataclass(frozen=True, slots=True)
class AgentEnd:
    """A run ended with ``outcome``; ``error`` is the one-sentence reason when it failed."""

    run_id: str
    outcome: RunOutcome
    error: str | None = None
    type: Literal["agent_end"] = "agent_end"


@dataclass(frozen=True, slots=True)
class TurnStart:
    """A turn began: one model call, then the tools it asked for."""

    type: Literal["turn_start"] = "turn_start"


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """A turn ended with the assistant ``message`` and the ``tool_results`` of its calls."""

    message: AssistantMessage
    tool_results: tuple[ToolResultMessage, ...] = ()
    type: Literal["turn_end"] = "turn_end"


@dataclass(frozen=True, slots=True)
class MessageStart:
    """A message began; for an assistant reply ``message`` is the (empty) partial reply."""

    message: AnyMessage
    type: Literal["message_start"] = "message_start"


@dataclass(frozen=True, slots=True)
class MessageUpdate:
    """A streamed ``delta`` was applied to the partial assistant ``message``.

    ``message`` is the live partial object, not a copy: read it, don't keep it.
    """

    message: AssistantMessage
    delta: StreamEvent
    type: Literal["message_update"] = "message_update"


@dataclass(frozen=True, slots=True)
class MessageEnd:
    """A message is finished; the agent persists it when this event is emitted.

    ``persisted`` is what an agent's listeners learn of that: false when the message
    could not be saved (the run then ends failed) or was not written because the run
    lost its lease. Whoever emits the event (the loop) leaves it true.
    """

    message: AnyMessage
    persisted: bool = True
    type: Literal["message_end"] = "message_end"


@dataclass(frozen=True, slots=True)
class ToolExecutionStart:
    """Tool ``tool_name`` started running call ``tool_call_id`` with ``args``."""

    tool_call_id: str
    tool_name: str
    args: dict[str, Any] = field(default_factory=dict)
    job_key: str | None = None
    type: Literal["tool_execution_start"] = "tool_execution_start"


@dataclass(frozen=True, slots=True)
class ToolExecutionUpdate:
    """Progress of a running tool call: ``progress`` is a fraction 0..1 and/or ``text`` a short status."""

    tool_call_id: str
    tool_name: str
    progress: float | None = None
    text: str | None = None
    type: Literal["tool_execution_update"] = "tool_execution_update"


@dataclass(frozen=True, slots=True)
class ToolExecutionEnd:
    """A tool call finished with ``result`` (``is_error`` mirrors ``result.is_error``)."""

    tool_call_id: str
    tool_name: str
    result: ToolResultMessage
    is_error: bool = False
    type: Literal["tool_execution_end"] = "tool_execution_end"


@dataclass(frozen=True, slots=True)
class HumanRequestStarted:
    """A tool call now waits for a person: the request was persisted as the thread's
    pending request before this event (so a bell rung on it never points at nothing).

    ``request_json`` is the stored text (:class:`core.hitl.HumanRequest`), ``question_id``
    its id, ``tool_call_id`` the asking call, ``question`` the question for people
    (``PendingRequest.question``), ``run_id`` the run the request is stored under (the
    run that issued the call), ``created_at`` and ``deadline`` unix seconds (``deadline``
    ``None`` without a timeout).
    """

    tool_call_id: str
    question_id: str
    question: str
    request_json: str
    run_id: str | None = None
    created_at: float = 0.0
    deadline: float | None = None
    type: Literal["human_request_started"] = "human_request_started"


AgentEvent = (
    AgentStart
    | AgentEnd
    | TurnStart
    | TurnEnd
    | MessageStart
    | MessageUpdate
    | MessageEnd
    | ToolExecutionStart
    | ToolExecutionUpdate
    | ToolExecutionEnd
    | HumanRequestStarted
)
"""One of the eleven lifecycle events a subscriber receives."""

Listener = Callable[[AgentEvent], Awaitable[None] | None]
"""A subscriber: called with each event, in order; may be sync or async."""
