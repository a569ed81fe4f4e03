"""Answering a thread's pending human request, from anywhere (the app, the CLI, a script).

    await answer(store, "t1", ApproveReply())
    await answer(store, "t1", DenyReply("not on prod"))
    await answer(store, "t1", KeyedReply({"target": "src/cli.py", "env": "prod"}))

The reply is made into cubeloop's answer JSON for the request's kind (:mod:`core.hitl`)
and recorded once (``HumanAnswers.answer``). Recording is all this does: the run that asked
(in this process, another one, or cubeloop's own ``Agent``) applies it - it wakes on the
store's change signal, or takes it when resumed. Works on cubeloop's threads too (their
owner is :data:`core.owners.UNOWNED`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from core.checkpoint.base import Checkpointer, PendingRequest, ThreadSummary, thread_unavailable
from core.checkpoint.capabilities import HumanAnswers, Leases, OwnerScoped, ThreadVersions, supports
from core.errors import NotWaitingError, StaleAnswerError
from core.hitl import ApprovalAnswer, ApproveRequest, AskRequest, HumanRequest, parse_request
from core.hitl_replies import Reply, answer_json_for, check_answer
from core.lease_status import lease_status
from core.owners import UNOWNED


@dataclass(frozen=True, slots=True)
class Answered:
    """An answer recorded: the thread, the request answered (its ``question_id``,
    ``run_id`` as the pending row names it) and the answer JSON stored."""

    thread_id: str
    run_id: str | None
    request: HumanRequest
    answer_json: str
    live: bool = True
    """Whether a run held the thread's live lease just after the answer was stored (it then
    applies the answer at once); ``False``: resuming the thread applies it."""

    @property
    def sentence(self) -> str:
        """One line for people: what was asked and the answer (the answer's text may be
        tool or model text: show it with :func:`core.untrusted.escape` or a plain renderer)."""
        payload = self.request.payload
        value = check_answer(self.request, self.answer_json)
        if isinstance(payload, ApproveRequest):
            assert isinstance(value, ApprovalAnswer)
            what = f"the call {payload.tool_name} ({payload.tool_call_id})"
            said = {"approve": "approved", "deny": "denied", "edit": "approved with edited arguments"}[value.decision]
            if value.decision == "deny" and value.reason:
                said += f": {value.reason}"
        elif isinstance(payload, AskRequest):
            what = "the question" if len(payload.questions) == 1 else f"{len(payload.questions)} questions"
            said = f"answered {self.answer_json}"
        else:
            what = "the question"
            said = "answered yes" if value is True else "answered no"
        then = "the run that asked goes on with it" if self.live else "resume the thread to apply it"
        return f"Thread {self.thread_id!r}: {what} {said}; {then}."


async def pending_request(store: Checkpointer, thread_id: str) -> PendingRequest | None:
    """The thread's pending request as stored, ``None`` when it has none (or is unavailable
    to the store's owner); from the thread's summary where the store gives one (no message
    decoded but its tail), else from a whole ``load``."""
    _found, pending = await _pending_of(store, thread_id)
    return pending


async def _pending_of(store: Checkpointer, thread_id: str) -> tuple[bool, PendingRequest | None]:
    """Whether the store's owner sees ``thread_id`` at all, and its pending request."""
    if supports(store, ThreadVersions):
        summaries: list[ThreadSummary] = await store.summaries([thread_id])
        return (True, summaries[0].pending_request) if summaries else (False, None)
    data = await store.load(thread_id)
    return (False, None) if data is None else (True, data.pending_request)


async def answer(store: Checkpointer, thread_id: str, reply: Reply, *, question_id: str | None = None) -> Answered:
    """Answer the pending request of ``thread_id`` with ``reply`` and return what was recorded.

    ``reply`` is one of :data:`core.hitl_replies.Reply`: ``ApproveReply()``, ``DenyReply(reason)``,
    ``EditReply(args)`` for an approval; ``YesNoReply(yes)`` for a confirm; ``TextReply(text)``,
    ``ChoiceReply(values)`` (option values or labels) for an ask of one question;
    ``KeyedReply({key: text | [texts]})`` for any ask. ``question_id``, when given, must be
    the pending request's (so an answer meant for one question never lands on the next).

    Raises (each one sentence): ``ThreadNotFoundError`` when the thread is missing or
    another owner's (:func:`~core.checkpoint.base.thread_unavailable`: the same sentence
    for both); ``NotWaitingError`` when it has no pending request; ``StaleAnswerError`` when ``question_id`` is
    not the pending one, or the request was settled or replaced between the read and the
    write; ``UnreadableRequestError`` for a request this version cannot read;
    ``AnswerMismatchError`` when the reply does not fit the request; ``AlreadyAnsweredError``
    (naming the answer kept) when someone answered first; what the store's writes raise
    (``ReadOnlyStoreError`` on a browse-only store, ``StoreConnectionError``, ...).
    ``TypeError`` for a store that does not keep answers (not one of ours).
    """
    if not supports(store, HumanAnswers):
        raise TypeError(f"{type(store).__name__} does not record human answers (HumanAnswers).")
    found, pending = await _pending_of(store, thread_id)
    if not found:
        raise thread_unavailable(thread_id, store.owner if supports(store, OwnerScoped) else UNOWNED)
    if pending is None:
        raise NotWaitingError.of(thread_id)
    request = parse_request(pending.request_json)
    if question_id is not None and question_id != request.question_id:
        raise StaleAnswerError.of(thread_id, question_id)
    answer_json = answer_json_for(request, reply)
    await store.answer(thread_id, pending.run_id, request.question_id, answer_json)
    return Answered(thread_id, pending.run_id, request, answer_json, await _live(store, thread_id))


async def _live(store: Checkpointer, thread_id: str) -> bool:
    """Whether a run holds ``thread_id``'s live lease now (:func:`core.lease_status.lease_status`);
    a store that keeps no leases, or fails to say, reads as live (the run may be there)."""
    if not supports(store, Leases):
        return True
    try:
        return lease_status(await store.get_lease(thread_id), (), time.time()).live
    except Exception:
        return True
