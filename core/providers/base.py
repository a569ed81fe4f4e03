"""The provider contract: how the loop asks a model for one reply.

A provider turns a :class:`ModelRequest` into a stream of
:data:`~core.events.StreamEvent` ending with exactly one
:class:`~core.events.StreamEnd` that carries the finished
:class:`~core.messages.AssistantMessage`.

Contract, relied on by the loop:

* ``stream`` never raises, except ``asyncio.CancelledError``. A failure (network, HTTP
  status, bad response) ends the stream with an assistant message whose
  ``stop_reason`` is ``"error"`` and whose ``error_message`` is one sentence a user can
  act on (build it with :func:`error_reply`).
* ``request.messages`` is the caller's live transcript: read it, never mutate it, and
  copy it if you must keep it after the stream ends.
* When ``signal`` is set, stop streaming promptly (the loop also stops reading).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.events import StreamEvent
from core.messages import AnyMessage, AssistantMessage, ContentBlock, ToolSpec

ABORTED_TEXT = "Aborted by the user."
"""The ``error_message`` of a reply ended by the abort signal (``stop_reason="aborted"``)."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything a provider needs for one model call.

    ``messages`` is the transcript in order, shared with the caller (never copied per
    call, so a call costs the same at any history length); it may hold
    ``UnknownMessage`` rows, which providers skip. ``tools`` are the callable tools.
    """

    system_prompt: str
    messages: Sequence[AnyMessage]
    tools: tuple[ToolSpec, ...] = ()


@runtime_checkable
class Provider(Protocol):
    """A model behind a streaming API; ``name`` (e.g. ``"anthropic"``) and ``model`` (its model id)
    are stamped on every reply as ``provider_id`` and ``model_id``."""

    name: str
    model: str

    def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """Stream one reply to ``request``; see the module docstring for the contract."""
        ...


def error_reply(
    provider: Provider,
    error_message: str,
    *,
    content: list[ContentBlock] | None = None,
    stop_reason: str = "error",
) -> AssistantMessage:
    """The final message of a failed (or aborted) stream: ``error_message`` is one sentence.

    ``content`` keeps what had streamed before the failure, without tool calls (their
    arguments may be incomplete, and a call that is never run must not be recorded).
    """
    kept = [b for b in content or () if getattr(b, "type", None) != "tool_call"]
    return AssistantMessage(
        content=kept,
        stop_reason=stop_reason,
        error_message=error_message,
        provider_id=provider.name,
        model_id=provider.model,
    )
