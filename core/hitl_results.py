"""What an answer to a human request, or its absence, makes of the asking tool call's result:
its text, error flag and ``details["hitl"]``, made here only, as cubeloop makes them
(cubeloop/hitl/middleware.py:56-117, ask_user.py:57-108). Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.hitl import ApprovalAnswer

# --- what the tool's result becomes (cubeloop/hitl/middleware.py:56-117, ask_user.py:57-108) --

BLOCKED_TEXT = "Tool execution was blocked"
"""A blocked call's result text when no reason was given (cubeloop/agent/tools.py:259-268)."""


@dataclass(frozen=True, slots=True)
class HumanOutcome:
    """What an answer (or its absence) makes of the asking tool call's result.

    ``text``: the result's text when the tool does not run (``None``: the tool runs and its
    own result is used, the tool's ``details`` given ``hitl`` by :func:`with_hitl`);
    ``is_error``: the result's flag when the tool does not run; ``hitl``: the value of the
    result's ``details["hitl"]``.
    """

    text: str | None
    is_error: bool
    hitl: dict[str, Any]

    @property
    def runs_tool(self) -> bool:
        """Whether the tool runs (approved or edited)."""
        return self.text is None


def approval_result(answer: ApprovalAnswer, original_args: Mapping[str, Any]) -> HumanOutcome:
    """The outcome of a person's approval answer: approve and edit run the tool (edit with
    ``answer.edited_args``, ``original_args`` kept in the details); deny gives an error
    result whose text is the reason (:data:`BLOCKED_TEXT` when none)."""
    if answer.decision == "approve":
        return HumanOutcome(None, False, {"decision": "human_approve"})
    if answer.decision == "edit":
        return HumanOutcome(
            None, False, {"decision": "edit", "original_args": dict(original_args), "edited_args": answer.edited_args}
        )
    return HumanOutcome(answer.reason or BLOCKED_TEXT, True, {"decision": "human_deny", "reason": answer.reason})


def policy_denial_result(reason: str) -> HumanOutcome:
    """A call the approval policy denied without asking; the text is the reason."""
    return HumanOutcome(reason or BLOCKED_TEXT, True, {"decision": "policy_deny", "reason": reason})


def approval_timeout_result() -> HumanOutcome:
    """An approval nobody answered in time: a denial (cubeloop has no default answer)."""
    return HumanOutcome("approval_timeout", True, {"decision": "timed_out"})


def approval_cancelled_result(reason: str) -> HumanOutcome:
    """An approval the host cancelled with ``reason``."""
    return HumanOutcome(f"cancelled: {reason}", True, {"decision": "cancelled", "reason": reason})


def aborted_result(reason: str) -> HumanOutcome:
    """The asking call of a run aborted while it waited (cubeloop's ``abort_pending``,
    agent.py:1177-1178)."""
    return HumanOutcome(f"aborted: {reason}", True, {"decision": "aborted", "reason": reason})


def ask_answered_result(answers: Mapping[str, str | list[str]]) -> HumanOutcome:
    """An ask answered: ``"User answers:\\n"`` and the answers as indented JSON (the
    ``ask_user`` tool's result; the text is the tool's own, so ``text`` is set)."""
    text = "User answers:\n" + json.dumps(dict(answers), indent=2, ensure_ascii=False)
    return HumanOutcome(text, False, {"kind": "ask", "answers": dict(answers)})


def ask_cancelled_result(reason: str) -> HumanOutcome:
    """An ask the host cancelled with ``reason``."""
    return HumanOutcome(f"cancelled by user: {reason}", True, {"outcome": "cancelled", "reason": reason})


def ask_timeout_result(seconds: float) -> HumanOutcome:
    """An ask nobody answered within ``seconds``."""
    return HumanOutcome(f"timed out after {seconds} seconds", True, {"outcome": "timed_out", "seconds": seconds})


def with_hitl(details: Any, hitl: Mapping[str, Any]) -> Any:
    """A tool result's ``details`` with ``hitl`` under ``"hitl"`` (cubeloop's
    ``_merge_hitl_details``, agent/tools.py:119-130): ``{"hitl": …}`` for no details, the
    dict with the key set for a dict, else ``{"_non_dict_details": details, "hitl": …}``."""
    if details is None:
        return {"hitl": dict(hitl)}
    if isinstance(details, dict):
        return {**details, "hitl": dict(hitl)}
    return {"_non_dict_details": details, "hitl": dict(hitl)}


_DENIALS = frozenset({"human_deny", "policy_deny"})
"""The ``details["hitl"]["decision"]`` values of a call that was denied, not run."""


def was_denied(details: Any) -> bool:
    """Whether a tool result's ``details`` say its call was denied (by a person or by the
    approval policy) rather than run: ``details["hitl"]["decision"]`` as :func:`approval_result`
    and :func:`policy_denial_result` write it, and as cubeloop does. Any other shape: ``False``."""
    hitl = details.get("hitl") if isinstance(details, dict) else None
    return isinstance(hitl, dict) and hitl.get("decision") in _DENIALS
