"""Human requests and their answers, in cubeloop's wire format (pure: no I/O).

A run that needs a person writes a :class:`HumanRequest` as the thread's pending request
(cubeloop's ``thread_pending_request.request_json``) and waits for one answer row
(``thread_hitl_answers.answer_json``). The models here mirror cubeloop 0.15's
``cubeloop.hitl.types`` field for field and in the same order, so
``model_dump_json()`` gives the bytes cubeloop writes and cubeloop reads what we write
(tests/core/test_hitl.py compares both against the real package).

Three kinds of request (``payload.kind``) and the answer each takes:

* ``confirm`` (:class:`ConfirmRequest`): a JSON boolean;
* ``ask`` (:class:`AskRequest`): a JSON object, question key -> string (a list of strings
  for a ``multi_select`` question);
* ``approve`` (:class:`ApproveRequest`, before a tool call runs): an
  :class:`ApprovalAnswer` object.

What a person replies (:data:`Reply`) becomes that JSON through :func:`answer_json_for`,
and every answer read back is checked by :func:`check_answer`; both raise
:class:`~core.errors.AnswerMismatchError` (one sentence) when the reply does not fit.
What a decision turns the tool's result into (texts and ``details["hitl"]``) is made
here only, by the ``*_result`` functions, as cubeloop makes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, Field, ValidationError

from core.errors import AnswerMismatchError, UnreadableRequestError

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


# --- reading a request, checking an answer ----------------------------------------------------


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


def dump_answer(value: bool | dict[str, Any] | ApprovalAnswer) -> str:
    """``value`` as cubeloop stores it (pydantic's compact JSON, UTF-8 kept: the
    ``TypeAdapter(StructuredValue).dump_json`` of cubeloop/checkpointer/sqlite.py:39-40)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return pydantic_core.to_json(value).decode("utf-8")


def check_answer(request: HumanRequest, answer_json: str) -> bool | dict[str, str | list[str]] | ApprovalAnswer:
    """The answer ``answer_json`` decoded, once it is known to fit ``request``: a bool for
    a confirm, ``{key: str | list[str]}`` for an ask, an :class:`ApprovalAnswer` for an
    approval. Raises :class:`~core.errors.AnswerMismatchError` (one sentence) when it does
    not: not JSON, another type than the kind takes, an unknown question key, a required
    question unanswered, a value that is none of the question's options (unless one of
    them ``allow_input``), several values for a single-choice question, ``edit`` without
    arguments or arguments given to another decision. Edited arguments are not checked
    against the tool's parameters here (the runtime validates them as the model's)."""
    try:
        value = json.loads(answer_json)
    except ValueError:
        raise AnswerMismatchError("The answer is not JSON.") from None
    payload = request.payload
    if isinstance(payload, ConfirmRequest):
        if not isinstance(value, bool):
            raise AnswerMismatchError("This request asks yes or no; the answer must be true or false.")
        return value
    if isinstance(payload, ApproveRequest):
        return _checked_approval(value)
    return _checked_asks(payload, value)


def _checked_approval(value: Any) -> ApprovalAnswer:
    try:
        answer = ApprovalAnswer.model_validate(value)
    except ValidationError:
        raise AnswerMismatchError(
            "This request asks for an approval; the answer must be approve, deny (with a reason) or edit (with arguments)."
        ) from None
    if answer.decision == "edit" and answer.edited_args is None:
        raise AnswerMismatchError("An edit must give the tool's new arguments.")
    if answer.decision != "edit" and answer.edited_args is not None:
        raise AnswerMismatchError(f"Only an edit gives new arguments, not {answer.decision}.")
    return answer


def _checked_asks(payload: AskRequest, value: Any) -> dict[str, str | list[str]]:
    if not isinstance(value, dict):
        raise AnswerMismatchError("This request asks questions; the answer must give each question's key and answer.")
    questions = {q.key: q for q in payload.questions}
    for key in value:
        if key not in questions:
            raise AnswerMismatchError(f"The request has no question {key!r} (its keys: {_listed(questions)}).")
    for q in payload.questions:
        if q.key in value:
            _check_one(q, value[q.key])
        elif q.required:
            raise AnswerMismatchError(f"Question {q.key!r} ({q.prompt}) needs an answer.")
    return value


def _check_one(q: Question, given: Any) -> None:
    if q.multi_select:
        if not isinstance(given, list) or not all(isinstance(v, str) for v in given):
            raise AnswerMismatchError(f"Question {q.key!r} takes a list of choices.")
        values = given
    else:
        if not isinstance(given, str):
            raise AnswerMismatchError(f"Question {q.key!r} takes one answer, as text.")
        values = [given]
    if q.required and not any(v.strip() for v in values):
        raise AnswerMismatchError(f"Question {q.key!r} ({q.prompt}) needs an answer.")
    if q.options is None or any(o.allow_input for o in q.options):
        return
    allowed = [o.value for o in q.options]
    for v in values:
        if v not in allowed:
            raise AnswerMismatchError(
                f"{v!r} is not an option of question {q.key!r} (its options: {_listed(allowed)})."
            )


def _listed(names: Sequence[str] | Mapping[str, Any]) -> str:
    return ", ".join(repr(n) for n in names)


# --- what a person replies, made into the answer JSON ---------------------------------------


@dataclass(frozen=True, slots=True)
class ApproveReply:
    """Run the tool call as the model asked (an approval)."""


@dataclass(frozen=True, slots=True)
class DenyReply:
    """Do not run the tool call; ``reason`` becomes its result's text (an approval)."""

    reason: str | None = None


@dataclass(frozen=True, slots=True)
class EditReply:
    """Run the tool call with ``args`` instead (an approval)."""

    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class YesNoReply:
    """Yes (``True``) or no (a confirm)."""

    yes: bool


@dataclass(frozen=True, slots=True)
class TextReply:
    """Free text, for an ask of one question (or one whose options allow input)."""

    text: str


@dataclass(frozen=True, slots=True)
class ChoiceReply:
    """One or more options, by value or label, for an ask of one question with options."""

    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KeyedReply:
    """Answers by question key, for an ask of any number of questions; a value is text
    (or an option's value or label), a sequence for a multi-select question."""

    values: Mapping[str, str | Sequence[str]]


Reply = ApproveReply | DenyReply | EditReply | YesNoReply | TextReply | ChoiceReply | KeyedReply
"""What a person can reply to a request."""


_FITS = {
    "approve": "approve, deny or edit",
    "confirm": "yes or no",
    "ask": "text, a choice or answers by key",
}


def answer_json_for(request: HumanRequest, reply: Reply) -> str:
    """The answer JSON ``reply`` gives ``request`` (see the module docstring for the JSON of
    each kind), checked by :func:`check_answer`. Option labels are turned into their values.
    Raises :class:`~core.errors.AnswerMismatchError` when the reply does not fit the request:
    another kind of reply (text to a yes/no question...), a text or choice to an ask of
    several questions, or what :func:`check_answer` refuses."""
    payload = request.payload
    value: bool | dict[str, Any] | ApprovalAnswer
    if isinstance(payload, ApproveRequest) and isinstance(reply, ApproveReply):
        value = ApprovalAnswer(decision="approve")
    elif isinstance(payload, ApproveRequest) and isinstance(reply, DenyReply):
        value = ApprovalAnswer(decision="deny", reason=reply.reason)
    elif isinstance(payload, ApproveRequest) and isinstance(reply, EditReply):
        value = ApprovalAnswer(decision="edit", edited_args=dict(reply.args))
    elif isinstance(payload, ConfirmRequest) and isinstance(reply, YesNoReply):
        value = reply.yes
    elif isinstance(payload, AskRequest) and isinstance(reply, TextReply | ChoiceReply):
        q = _only_question(payload)
        value = {q.key: _shaped(q, [reply.text] if isinstance(reply, TextReply) else list(reply.values))}
    elif isinstance(payload, AskRequest) and isinstance(reply, KeyedReply):
        questions = {q.key: q for q in payload.questions}
        value = {
            key: _shaped(questions[key], [given] if isinstance(given, str) else list(given))
            if key in questions
            else given
            for key, given in reply.values.items()
        }
    else:
        raise AnswerMismatchError(f"This request takes {_FITS[payload.kind]}, not {_reply_words(reply)}.")
    answer_json = dump_answer(value)
    check_answer(request, answer_json)
    return answer_json


def _only_question(payload: AskRequest) -> Question:
    if len(payload.questions) != 1:
        keys = _listed([q.key for q in payload.questions])
        raise AnswerMismatchError(f"This request asks {len(payload.questions)} questions; answer each by key ({keys}).")
    return payload.questions[0]


def _shaped(q: Question, values: list[str]) -> str | list[str]:
    """``values`` with option labels made values, as the question takes them (a list for a
    multi-select question, else the one value)."""
    by_label = {o.label: o.value for o in q.options or () if o.label != o.value}
    known = {o.value for o in q.options or ()}
    values = [v if v in known else by_label.get(v, v) for v in values]
    if q.multi_select:
        return values
    if len(values) != 1:
        raise AnswerMismatchError(f"Question {q.key!r} takes one answer, not {len(values)}.")
    return values[0]


def _reply_words(reply: Reply) -> str:
    return {
        ApproveReply: "an approval",
        DenyReply: "a denial",
        EditReply: "edited arguments",
        YesNoReply: "yes or no",
        TextReply: "text",
        ChoiceReply: "a choice",
        KeyedReply: "answers by key",
    }[type(reply)]


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
