"""What a person replies to a human request, made into the answer JSON cubeloop stores, and
every answer read back checked against its request (pure: no I/O).

What a person replies (:data:`Reply`) becomes that JSON through :func:`answer_json_for`,
and every answer read back is checked by :func:`check_answer`; both raise
:class:`~core.errors.AnswerMismatchError` (one sentence) when the reply does not fit. The
request and answer models are :mod:`core.hitl`'s (cubeloop 0.15's wire format).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from pydantic import BaseModel, ValidationError

from core.errors import AnswerMismatchError
from core.hitl import ApprovalAnswer, ApproveRequest, AskRequest, ConfirmRequest, HumanRequest, Question


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
