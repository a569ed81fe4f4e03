"""Fingerprints: what a thread was started with, so a continuation by another agent is seen.

A thread records (:class:`~core.checkpoint.base.Fingerprints`, through
``ThreadRecords.save_fingerprints``) the sha256 of its first input and of the agent's
definition - the model id, the system prompt, each tool's name and parameter schema - and
a user-given workflow version. Before a run goes on (``Agent.prompt``, ``resume``,
``start``) the stored fingerprints are compared with the current ones: the same - go on;
different - :func:`mismatch_error` refuses in one sentence naming each change
(:func:`changes`), and nothing runs until the caller passes ``accept_changes``, which
records the new fingerprints and a :class:`~core.checkpoint.base.FingerprintOverride`.
``Agent.start`` with another first input than the thread's is always refused
(:func:`first_input_error`): a thread id names one job, and no override applies.

This follows the lesson on resuming interrupted agents that the store design follows: a
run row keeps its ``input`` and the input's sha256 ``fingerprint`` beside a ``workflow``
version, and "the same run requires the same input and workflow".

Every hash here is the sha256 hex of UTF-8 text; structured values are hashed as
canonical JSON (:func:`canonical_json`), so key order and whitespace never matter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from core.approvals import APPROVAL_PART, Approvals, approval_parts
from core.checkpoint.base import Fingerprints
from core.errors import FingerprintMismatchError, FirstInputChangedError
from core.messages import AnyMessage, TextContent, ToolSpec, UserMessage
from core.untrusted import holds_control

MODEL_PART = "model"
"""The part of :func:`definition_parts` holding the model id, as is."""

SYSTEM_PROMPT_PART = "system_prompt"
"""The part of :func:`definition_parts` holding the system prompt's sha256 hex."""

TOOL_PART = "tool:"
"""The prefix of each tool's part (``"tool:read_file"``): the sha256 hex of its parameter schema."""

FIRST_INPUT_CHANGED = "first input changed"
"""The change :func:`changes` names when two fingerprints name other first inputs (a thread
started with another first input is refused on its own, :func:`first_input_error`)."""


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON: sorted keys, no whitespace, non-ASCII kept as is.

    Raises ``TypeError`` for values JSON cannot hold (tool arguments always can).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def text_sha256(text: str) -> str:
    """The sha256 hex of ``text`` as UTF-8. A lone surrogate (undecodable bytes read with
    ``surrogateescape``) is hashed in its 3-byte form, never an error; every other text
    encodes exactly as strict UTF-8 does."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def canonical_sha256(value: Any) -> str:
    """The sha256 hex of :func:`canonical_json` of ``value`` (``TypeError`` as there)."""
    return text_sha256(canonical_json(value))


def input_fingerprint(first_input: str | UserMessage) -> str:
    """The sha256 hex of a thread's first input: the canonical JSON of its content blocks.

    A text is taken as the one text block a prompt of it is stored as, and a message whose
    content is a plain string (older CubePi rows) the same way, so ``prompt(text)`` and the
    stored first user message give the same fingerprint. Never raises for a stored message.
    """
    if isinstance(first_input, str):
        blocks: Sequence[Any] = [TextContent(text=first_input)]
    elif isinstance(first_input.content, str):
        blocks = [TextContent(text=first_input.content)]
    else:
        blocks = first_input.content
    return canonical_sha256([b.model_dump(mode="json") for b in blocks])


def first_input(messages: Sequence[AnyMessage]) -> UserMessage | None:
    """The thread's first user message (its first input), ``None`` when it has none."""
    return next((m for m in messages if isinstance(m, UserMessage)), None)


def definition_parts(
    system_prompt: str, tools: Sequence[ToolSpec], model_id: str, approvals: Approvals | None = None
) -> dict[str, str]:
    """The agent's definition by part: ``"model"`` -> ``model_id`` as is, ``"system_prompt"``
    -> its sha256 hex, ``"tool:NAME"`` -> the sha256 hex of the canonical JSON of that
    tool's parameter schema (its description does not count: it does not change what a
    stored call means). ``tools`` are what providers are told (``AgentTool.spec``).
    ``approvals`` adds ``"approval:NAME"`` -> the rule in words for each tool that asks
    (:func:`core.approvals.approval_parts`; printable, so a change reads "approval
    delete_file: always -> none"); an agent without approvals has no such part, so the
    fingerprints of threads written before approvals existed are unchanged."""
    parts = {MODEL_PART: model_id, SYSTEM_PROMPT_PART: text_sha256(system_prompt)}
    for spec in tools:
        parts[TOOL_PART + spec.name] = canonical_sha256(spec.parameters)
    parts.update(approval_parts(approvals or {}))
    return parts


def agent_fingerprint(parts: Mapping[str, str], workflow: str | None) -> str:
    """The sha256 hex of the whole definition: the canonical JSON of ``parts`` and ``workflow``."""
    return canonical_sha256({"parts": dict(parts), "workflow": workflow})


def fingerprints_of(parts: Mapping[str, str], workflow: str | None, first: str | UserMessage | None) -> Fingerprints:
    """The :class:`~core.checkpoint.base.Fingerprints` of a definition (``parts`` from
    :func:`definition_parts`) and a first input (``None``: the thread has none yet)."""
    return Fingerprints(
        input=input_fingerprint(first) if first is not None else None,
        agent=agent_fingerprint(parts, workflow),
        parts=dict(parts),
        workflow=workflow,
    )


def changes(stored: Fingerprints, current: Fingerprints) -> tuple[str, ...]:
    """What differs between the ``stored`` and the ``current`` fingerprints, one short
    phrase each, in a fixed order: the first input (compared only when both have one),
    the model (``"model: a -> b"``), the system prompt, each tool by name (``"tool grep:
    added"``, ``"tool grep: removed"``, ``"tool read_file: parameters changed"``), any
    other part, then the workflow (``"workflow: 1 -> 2"``, ``none`` for no version).
    Empty when they are the same. Never raises."""
    found: list[str] = []
    if stored.input is not None and current.input is not None and stored.input != current.input:
        found.append(FIRST_INPUT_CHANGED)
    old, new = stored.parts, current.parts
    if old.get(MODEL_PART) != new.get(MODEL_PART):
        found.append(f"model: {_shown(old.get(MODEL_PART))} -> {_shown(new.get(MODEL_PART))}")
    if old.get(SYSTEM_PROMPT_PART) != new.get(SYSTEM_PROMPT_PART):
        found.append("system prompt changed")
    others = sorted((set(old) | set(new)) - {MODEL_PART, SYSTEM_PROMPT_PART})
    for part in others:
        before, after = old.get(part), new.get(part)
        if before == after:
            continue
        if part.startswith(APPROVAL_PART):
            # Approval parts are words, not hashes: say what the rule was and is.
            found.append(f"approval {part[len(APPROVAL_PART) :]}: {_shown(before)} -> {_shown(after)}")
            continue
        what = f"tool {part[len(TOOL_PART) :]}" if part.startswith(TOOL_PART) else part
        if before is None:
            found.append(f"{what}: added")
        elif after is None:
            found.append(f"{what}: removed")
        else:
            found.append(f"{what}: parameters changed" if part.startswith(TOOL_PART) else f"{what} changed")
    if stored.workflow != current.workflow:
        found.append(f"workflow: {_shown(stored.workflow)} -> {_shown(current.workflow)}")
    if not found and stored.agent != current.agent:
        # Parts and workflow agree but the whole does not: hashed another way (another version).
        found.append("definition changed")
    return tuple(found)


def mismatch_sentence(thread_id: str, found: Sequence[str]) -> str:
    """The one refusal every caller shows (agent, runner, app) for the changes ``found``:
    ``"Thread 'x' was written by another definition of the agent: tool read_file:
    parameters changed. Nothing ran; run again with --accept-changes (or press a in the
    app) to go on, and the override is recorded in the thread."``"""
    return (
        f"Thread {thread_id!r} was written by another definition of the agent: {'; '.join(found)}. "
        "Nothing ran; run again with --accept-changes (or press a in the app) to go on, "
        "and the override is recorded in the thread."
    )


def first_input_error(thread_id: str) -> FirstInputChangedError:
    """The one refusal of ``Agent.start`` (and so of ``cubepi-tui run --start``) for a text
    that is not the thread's first input: a thread id names one job, so nothing ran, and no
    override applies."""
    return FirstInputChangedError(
        f"Thread {thread_id!r} was started with another first input; nothing ran: a thread id names one job, "
        "so start this input as another thread (another thread id)."
    )


MAX_WORKFLOW_CHARS = 200
"""Longest workflow version accepted, in characters (a version, a tag or a commit id fits)."""


def check_workflow(version: str) -> str:
    """Return ``version`` when it can be a workflow version; raise ``ValueError`` (one
    sentence) when it is empty or all spaces, longer than :data:`MAX_WORKFLOW_CHARS`, or
    holds a control or format character (it is stored in the thread and shown in the app
    and the runner's refusals). The one rule of the runner's and the app's ``--workflow``
    and of ``Agent(workflow=...)``; ``None`` (no version) is never passed here."""
    if not version.strip():
        raise ValueError("A workflow version cannot be empty; leave --workflow out for none.")
    if len(version) > MAX_WORKFLOW_CHARS:
        raise ValueError(f"A workflow version is at most {MAX_WORKFLOW_CHARS} characters, not {len(version)}.")
    if holds_control(version):
        raise ValueError(f"The workflow version {version!r} holds a control character.")
    return version


def mismatch_error(thread_id: str, found: Sequence[str]) -> FingerprintMismatchError:
    """The :class:`~core.errors.FingerprintMismatchError` for ``found`` (its ``changes``),
    worded by :func:`mismatch_sentence`."""
    return FingerprintMismatchError(mismatch_sentence(thread_id, found), changes=tuple(found))


def _shown(value: str | None) -> str:
    return "none" if value is None else value
