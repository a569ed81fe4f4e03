"""Human requests and their answers, in cubeloop's wire format (pure: no I/O).

A run that needs a person writes a :class:`HumanRequest` as the thread's pending request
(cubeloop's ``thread_pending_request.request_json``) and waits for one answer row
(``thread_hitl_answers.answer_json``). The models here mirror cubeloop 0.15's
``cubeloop.hitl.types`` field for field and in the same order, so
``model_dump_json()`` gives the bytes cubeloop writes and cubeloop reads what we write
(tests/core/test_human_requests.py compares both against the real package).

Three kinds of request (``payload.kind``) and the answer each takes:

* ``confirm`` (:class:`ConfirmRequest`): a JSON boolean;
* ``ask`` (:class:`AskRequest`): a JSON object, question key -> string (a list of strings
  for a ``multi_select`` question);
* ``approve`` (:class:`ApproveRequest`, before a tool call runs): an
  :class:`ApprovalAnswer` object.

Beside this module: what a person replies, made into that answer JSON and checked when read
back (:mod:`core.hitl_replies`), and what a decision turns the tool's result into
(:mod:`core.hitl_results`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from core.errors import UnreadableRequestError

# --- the wire models (cubeloop/hitl/types.py, lines 10-58) ---------------------------------


class Option(BaseModel):
    """One option of a question: ``value`` is what the answer holds, ``label`` what a
    person reads; ``allow_input`` marks an "Other, specify" option (any text is then a
    valid answer to its question)."""

    label: str
    value: str
    description: str | None = None
    allow_input: bool = False


class Question(BaseModel):
    """One question of an ask, answered under ``key``: free text when ``options`` is
    ``None``, else one option's value (a list of them when ``multi_select``)."""

    key: str
    prompt: str
    options: list[Option] | None = None
    multi_select: bool = False
    required: bool = True


class ConfirmRequest(BaseModel):
    """A yes/no question; answered by a JSON boolean."""

    kind: Literal["confirm"] = "confirm"
    prompt: str
    details: dict[str, Any] | None = None


class ApproveRequest(BaseModel):
    """A tool call waiting for approval before it runs; answered by an :class:`ApprovalAnswer`."""

    kind: Literal["approve"] = "approve"
    tool_name: str
    tool_call_id: str
    args: dict[str, Any]
    details: dict[str, Any] | None = None


class AskRequest(BaseModel):
    """One or more questions; answered by a JSON object keyed by :attr:`Question.key`."""

    kind: Literal["ask"] = "ask"
    questions: list[Question]


RequestPayload = ConfirmRequest | ApproveRequest | AskRequest
"""What is asked, told apart by ``kind``."""


class HumanRequest(BaseModel):
    """The pending request of a thread (cubeloop's ``HitlRequest``): ``question_id`` names
    it (see :func:`question_id_for`), ``created_at`` is unix seconds, ``timeout_seconds``
    how long the asker waits (``None``: forever)."""

    question_id: str
    thread_id: str | None
    payload: RequestPayload = Field(discriminator="kind")
    created_at: float
    timeout_seconds: float | None = None


class ApprovalAnswer(BaseModel):
    """The answer to an approval (cubeloop's ``ApproveAnswer``): ``edit`` runs the tool
    with ``edited_args`` instead of the model's arguments; ``reason`` is a denial's reason."""

    decision: Literal["approve", "deny", "edit"]
    edited_args: dict[str, Any] | None = None
    reason: str | None = None


# --- question ids (cubeloop/hitl/channel.py, lines 160-176, 427, 461, 493-506) ----------------


def content_hash(payload: ConfirmRequest | AskRequest) -> str:
    """The 32 hex digits cubeloop derives from a confirm's or an ask's content: sha256 of
    ``json.dumps({"kind", "payload"}, sort_keys=True, default=str)``, where the payload
    is ``{"prompt", "details"}`` for a confirm and the questions' JSON dumps for an ask."""
    if isinstance(payload, ConfirmRequest):
        shown: Any = {"prompt": payload.prompt, "details": payload.details}
    else:
        shown = [q.model_dump(mode="json") for q in payload.questions]
    data = json.dumps({"kind": payload.kind, "payload": shown}, sort_keys=True, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:32]


def question_id_for(payload: RequestPayload, *, seq: int = 0, tool_call_id: str | None = None) -> str:
    """The question id cubeloop gives ``payload``: an approval's ``tool_call_id``; a
    confirm's ``tool_call_id`` when one is given; else ``content_hash(payload) + "." + seq``
    where ``seq`` counts the earlier asks of the same content in this run (0 first), so
    asking again after a resume gives the same ids in the same order
    (:class:`QuestionIds` keeps that count)."""
    if isinstance(payload, ApproveRequest):
        return payload.tool_call_id
    if isinstance(payload, ConfirmRequest) and tool_call_id:
        return tool_call_id
    return f"{content_hash(payload)}.{seq}"


class QuestionIds:
    """The per-content counter of one run's asks (cubeloop keeps one per channel): a
    fresh one replays the same ids in the same order."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def next(self, payload: RequestPayload, *, tool_call_id: str | None = None) -> str:
        """The id of the next ask of ``payload`` (see :func:`question_id_for`); counts only
        the asks whose id comes from their content."""
        if isinstance(payload, ApproveRequest) or (isinstance(payload, ConfirmRequest) and tool_call_id):
            return question_id_for(payload, tool_call_id=tool_call_id)
        digest = content_hash(payload)
        seq = self._seen.get(digest, 0)
        self._seen[digest] = seq + 1
        return f"{digest}.{seq}"


# --- how stores key and match answers ----------------------------------------------------------


def run_key(run_id: str | None) -> str:
    """The run id an answer row is stored under: ``''`` for a request of no run, as
    cubeloop stores it (``_run_key``, cubeloop/checkpointer/sqlite.py:35-36)."""
    return run_id or ""


def question_id_of(request_json: str) -> str | None:
    """The ``question_id`` of a stored request's text, without validating the rest;
    ``None`` when the text is not a JSON object with a string ``question_id``."""
    try:
        value = json.loads(request_json)
    except ValueError:
        return None
    qid = value.get("question_id") if isinstance(value, dict) else None
    return qid if isinstance(qid, str) else None


def is_pending(request_json: str | None, pending_run_id: str | None, run_id: str | None, question_id: str) -> bool:
    """Whether a thread's pending request (``request_json`` and its ``pending_run_id``;
    ``None``: none) is ``question_id`` of run ``run_id`` (``None`` and ``''`` are one run)."""
    return (
        request_json is not None
        and run_key(pending_run_id) == run_key(run_id)
        and question_id_of(request_json) == question_id
    )


# --- reading a request ----------------------------------------------------------------


def parse_request(request_json: str) -> HumanRequest:
    """The request stored as ``request_json`` (a pending row's text). Raises
    :class:`~core.errors.UnreadableRequestError` when it is not JSON or not a request of
    a kind this version knows; the sentence names the first field that does not fit."""
    try:
        return HumanRequest.model_validate_json(request_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the text"
        raise UnreadableRequestError(
            f"The pending request cannot be read by this version ({where}: {first['msg']})."
        ) from None
