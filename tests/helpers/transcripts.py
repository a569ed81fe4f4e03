"""Checks on transcripts and requests that several test modules share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.providers.anthropic import to_api_messages
from core.providers.base import ModelRequest


def assert_every_call_answered(requests: Sequence[ModelRequest]) -> None:
    """Every request answers every tool call, in an order our writers and the API accept.

    Transcript (DESIGN.md): no call is left without a result, and no user message lands
    between a call and its result - unless it was written by an earlier run than the
    result (another writer left the call dangling; the append-only log cannot move the
    message, so the settling run's result follows it). A user message of the result's
    own run there means the loop delivered it before settling.
    API (Anthropic's "Handle tool calls" page): in ``to_api_messages`` form every
    ``tool_use`` is answered by a ``tool_result`` in the very next message, and those
    ``tool_result`` blocks come before any other block of it.
    """
    for n, req in enumerate(requests):
        open_calls: set[str] = set()
        waiting: list[UserMessage] = []
        for message in req.messages:
            if isinstance(message, ToolResultMessage):
                early = [m.text for m in waiting if m.run_id == message.run_id]
                assert not early, (
                    f"request {n}: user message(s) {early} delivered before the result of {message.tool_call_id}"
                )
                open_calls.discard(message.tool_call_id)
                continue
            if open_calls and isinstance(message, UserMessage):
                waiting.append(message)
                continue
            assert not open_calls, f"request {n}: {message.role} message before results of {open_calls}"
            waiting = []
            if isinstance(message, AssistantMessage):
                open_calls = {c.id for c in message.tool_calls}
        assert not open_calls, f"request {n} ends with unanswered calls {open_calls}"
        assert_valid_api_order(to_api_messages(req.messages), f"request {n}")


def assert_valid_api_order(api: Sequence[dict], where: str = "request") -> None:
    """Each assistant turn's ``tool_use`` ids are answered by exactly the ``tool_result``
    blocks that open the next (user) turn; no ``tool_result`` appears anywhere else.
    Rules from https://platform.claude.com/docs/en/agents-and-tools/tool-use/handle-tool-calls."""
    asked: set[str] = set()
    for i, turn in enumerate(api):
        types = [b["type"] for b in turn["content"]]
        lead = next((k for k, t in enumerate(types) if t != "tool_result"), len(types))
        answers = {b["tool_use_id"] for b in turn["content"][:lead]} if turn["role"] == "user" else set()
        assert answers == asked, f"{where}, message {i}: answers {answers or 'nothing'} to tool_use {asked or 'none'}"
        assert "tool_result" not in types[lead:], f"{where}, message {i}: a tool_result after other blocks: {types}"
        asked = {b["id"] for b in turn["content"] if b["type"] == "tool_use"}
    assert not asked, f"{where} ends with unanswered tool_use {asked}"


def squash(kinds: list[str]) -> list[str]:
    """Collapse runs of message_update into one entry (their count depends on chunking)."""
    out: list[str] = []
    for k in kinds:
        if not (out and k == out[-1] == "message_update:assistant"):
            out.append(k)
    return out


def assert_paired(messages: list[Any], where: str) -> None:
    """Each tool call has exactly one result after it, before the next assistant or user message."""
    open_calls: dict[str, int] = {}
    for i, m in enumerate(messages):
        if isinstance(m, (AssistantMessage, UserMessage)):
            assert all(open_calls.values()), f"{where}: message {i} follows unanswered calls {open_calls}"
            open_calls = {c.id: 0 for c in m.tool_calls} if isinstance(m, AssistantMessage) else {}
        elif isinstance(m, ToolResultMessage):
            assert open_calls.get(m.tool_call_id) == 0, f"{where}: result {i} for {m.tool_call_id} is stray or a repeat"
            open_calls[m.tool_call_id] = 1
    assert all(open_calls.values()), f"{where}: ends with unanswered calls {open_calls}"
