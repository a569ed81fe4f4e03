"""Waiting for a person: the one waiter of every human request a run makes.

A tool call asks a person in two ways: before it starts, when the agent's approval
policy says so (:mod:`core.approvals`, driven by :mod:`core.tool_execution`), or from its
body through ``ToolContext.human`` (:class:`CallHuman`). Both go through
:meth:`HumanDesk.wait_for`, which, one question at a time per run (the store keeps one
pending request per thread, cubeloop's ``thread_pending_request``):

1. returns at once an answer already stored for the question (a resume asking again);
2. persists the request (:class:`core.hitl.HumanRequest`, fenced by the run's lease)
   *before* waiting, so a crash from here on leaves a question someone can answer;
3. announces it (:class:`core.events.HumanRequestStarted`: the bell of the app);
4. waits for the first of: the answer appearing in the store (``HumanAnswers.load_answer``,
   woken by the store's change signal as the runner's command watch is,
   :class:`core.changes.StoreWatch`, with a fallback poll), the deadline
   ``created_at + timeout_seconds`` (counted from the stored ``created_at``, so it
   survives a crash), the run's abort signal, and :meth:`HumanDesk.detach`.

At the deadline a default, when the asker gave one, is recorded through the same
exactly-once ``HumanAnswers.answer`` insert a person's answer uses: if a person won that
race, their answer applies. Without a default, and on detach, the run ends **waiting for
an answer** (:class:`EndedWaiting`): the run stays open, its request pending, and
resuming once it is answered applies the answer. Whatever happens, what is applied is
what ``load_answer`` returns, never a value handed over in memory: the store's insert is
the one arbiter of which answer counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.changes import StoreWatch
from core.checkpoint.base import PendingRequest
from core.checkpoint.capabilities import ChangeNotification, HumanAnswers, HumanRequests, supports
from core.errors import AlreadyAnsweredError, AnswerMismatchError, ToolError
from core.events import HumanRequestStarted
from core.hitl import (
    AskRequest,
    ConfirmRequest,
    HumanRequest,
    Option,
    Question,
    QuestionIds,
    RequestPayload,
    is_pending,
)
from core.hitl_replies import check_answer, dump_answer
from core.tools import HumanChannel

Announce = Callable[[HumanRequestStarted], Awaitable[None]]
"""Where :meth:`HumanDesk.wait_for` tells that a request now waits (awaited once)."""

Fence = Callable[[], Mapping[str, str]]
"""The keyword arguments that fence a write by the run's lease (``{"holder_id": ...}`` or none)."""

OnWriteError = Callable[[str, Exception], Exception]
"""What a failed write of the request becomes: ``(what failed, the store's error) -> the
exception to raise`` (the agent's ``RunRecorder.stopped_by``, which also records a lost
lease, so the run ends failed saying why)."""

ANSWER_POLL = 1.0
"""Seconds between two checks of the store while waiting, when no change signal came:
the fallback of :class:`~core.changes.StoreWatch` (a signal normally wakes the wait within
its quiet period, ~80 ms on SQLite)."""


def deadline(created_at: float, timeout_seconds: float | None) -> float | None:
    """When a request times out, unix seconds: ``created_at + timeout_seconds`` as stored
    (so a crash does not restart the clock), ``None`` without a timeout."""
    return None if timeout_seconds is None else created_at + timeout_seconds


def deadline_of(request_json: str) -> float | None:
    """:func:`deadline` of a stored request's text; ``None`` when it has no timeout or
    cannot be read."""
    try:
        request = HumanRequest.model_validate_json(request_json)
    except ValueError:
        return None
    return deadline(request.created_at, request.timeout_seconds)


class WaitEnded(BaseException):
    """A wait for a person ended without an answer to apply; ``sentence`` says why.

    A ``BaseException``, as ``asyncio.CancelledError`` is, so that a tool body's ``except
    Exception`` cannot swallow the end of its run."""

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


class EndedWaiting(WaitEnded):
    """The run ends **waiting for an answer** (detached, or a deadline without default):
    its request stays pending; raised out of the executor to ``Agent``, which ends the
    run with the outcome ``"waiting"``."""


class AbortedWhileWaiting(WaitEnded):
    """The run was aborted while a call waited: that call ends with the "aborted:" result."""


ABORTED_WHILE_WAITING = "the run was aborted while this call waited for an answer"
"""The reason in the "aborted: ..." result of a call aborted while it waited."""


@dataclass(frozen=True, slots=True)
class Answered:
    """The answer to apply: ``answer_json`` as the store holds it, for ``request``;
    ``defaulted`` when it is the asker's default, recorded at the deadline by this wait."""

    request: HumanRequest
    answer_json: str
    defaulted: bool = False

    def note(self, shown: str | None = None) -> str | None:
        """What the call's result says of a default ("no answer in 60 s; the default was
        used: main"; ``shown`` is the default in words, else its answer JSON), ``None``
        when a person answered."""
        if not self.defaulted:
            return None
        return default_note(self.request.timeout_seconds or 0, shown if shown is not None else self.answer_json)


def default_note(timeout: float, shown: str) -> str:
    """The one sentence of a default used at a deadline: "no answer in 60 s; the default
    was used: deny" (the approval's default denial reads it as its reason)."""
    return f"no answer in {timeout:g} s; the default was used: {shown}"


class HumanDesk:
    """The human requests of one run of one thread; see the module docstring.

    ``store`` must declare :class:`~core.checkpoint.capabilities.HumanAnswers` and
    :class:`~core.checkpoint.capabilities.HumanRequests` (else :attr:`available` is false
    and nothing may be asked); ``fence()`` gives the lease fence of the run's writes;
    ``signal`` is the run's abort signal; ``known`` the pending request the thread had
    when the run loaded it (a question asked again by a resume keeps its ``created_at``,
    hence its deadline); ``poll`` as :data:`ANSWER_POLL`; ``on_write_error`` turns a
    failed write of the request or its settlement into the error raised
    (:data:`OnWriteError`; default: the store's error as is).
    """

    def __init__(
        self,
        store: object,
        thread_id: str,
        *,
        fence: Fence,
        signal: asyncio.Event,
        known: PendingRequest | None = None,
        poll: float = ANSWER_POLL,
        on_write_error: OnWriteError | None = None,
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.fence = fence
        self.signal = signal
        self.poll = poll
        self.known = known
        self.on_write_error = on_write_error
        self.waiting: HumanRequest | None = None
        self._detached = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def available(self) -> bool:
        """Whether the store can keep requests and their answers."""
        return supports(self.store, HumanAnswers) and supports(self.store, HumanRequests)

    def detach(self) -> bool:
        """End the run as waiting for an answer if it waits for one now; returns whether it
        does (``False``, nothing changed, when no question waits)."""
        if self.waiting is None:
            return False
        self._detached.set()
        return True

    async def wait_for(
        self,
        payload: RequestPayload,
        *,
        run_id: str | None,
        question_id: str,
        tool_call_id: str,
        announce: Announce,
        timeout: float | None = None,
        default_json: str | None = None,
    ) -> Answered:
        """Ask ``payload`` as ``question_id`` of run ``run_id`` (the run that issued the
        asking call ``tool_call_id``) and return the answer to apply (see the module
        docstring). Raises :class:`EndedWaiting` (detached, or the deadline passed without
        ``default_json``), :class:`AbortedWhileWaiting`, and the store's errors
        (through ``on_write_error``; ``LeaseLostError`` when the run lost its lease:
        nothing was persisted)."""
        if not self.available:
            raise ToolError("No person can be asked: this store keeps no answers to human requests.")
        store: Any = self.store
        async with self._lock:
            stored = await store.load_answer(self.thread_id, run_id, question_id)
            created_at = self._created_at(run_id, question_id)
            request = HumanRequest(
                question_id=question_id,
                thread_id=self.thread_id,
                payload=payload,
                created_at=created_at if created_at is not None else time.time(),
                timeout_seconds=timeout,
            )
            if stored is not None:
                return Answered(request, stored)
            text = request.model_dump_json()
            try:
                await store.save_pending_request(self.thread_id, text, run_id=run_id, **self.fence())
            except Exception as exc:
                raise self._failed("Could not save the question, so nobody was asked and the run stopped", exc) from exc
            due = deadline(request.created_at, timeout)
            question = PendingRequest(text, run_id, request.created_at).question
            # Waiting from here on: a listener told of the request may detach at once.
            self.waiting = request
            try:
                await announce(
                    HumanRequestStarted(tool_call_id, question_id, question, text, run_id, request.created_at, due)
                )
                return await self._wait(request, run_id, due, default_json)
            finally:
                self.waiting = None

    async def settle(self, run_id: str | None, question_id: str) -> bool:
        """Clear the pending request if it still is ``question_id`` of ``run_id``, and that
        run's answers (``HumanAnswers.settle_request``, fenced): once its answer is
        applied. Returns whether it cleared it; the store's errors propagate."""
        if not self.available:
            return False
        store: Any = self.store
        try:
            return await store.settle_request(self.thread_id, run_id, question_id, **self.fence())
        except Exception as exc:
            raise self._failed("Could not settle the answered question", exc) from exc

    def _failed(self, what: str, exc: Exception) -> Exception:
        return self.on_write_error(what, exc) if self.on_write_error is not None else exc

    def _created_at(self, run_id: str | None, question_id: str) -> float | None:
        known = self.known
        if known is None or not is_pending(known.request_json, known.run_id, run_id, question_id):
            return None
        try:
            return HumanRequest.model_validate_json(known.request_json).created_at
        except ValueError:
            return None

    async def _wait(
        self, request: HumanRequest, run_id: str | None, due: float | None, default_json: str | None
    ) -> Answered:
        store: Any = self.store
        qid = request.question_id
        watch = StoreWatch(store, poll=self.poll) if supports(store, ChangeNotification) else None
        async with watch if watch is not None else contextlib.nullcontext():
            while True:
                stored = await store.load_answer(self.thread_id, run_id, qid)
                if stored is not None:
                    return Answered(request, stored)
                if self.signal.is_set():
                    raise AbortedWhileWaiting(ABORTED_WHILE_WAITING)
                if self._detached.is_set():
                    raise EndedWaiting("The run was detached while it waited for an answer; it ends waiting for one.")
                now = time.time()
                if due is not None and now >= due:
                    if default_json is None:
                        raise EndedWaiting(
                            f"No answer in {request.timeout_seconds:g} s and no default: the run ends waiting for one."
                        )
                    try:
                        await store.answer(self.thread_id, run_id, qid, default_json)
                    except AlreadyAnsweredError:
                        continue  # a person was first: theirs applies
                    return Answered(request, await store.load_answer(self.thread_id, run_id, qid) or default_json, True)
                step = self.poll if due is None else max(0.0, min(self.poll, due - now))
                await _first_of(
                    watch.wait(step) if watch is not None else asyncio.sleep(step),
                    self.signal.wait(),
                    self._detached.wait(),
                )


async def _first_of(*aws: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``aws`` is done; cancel the others. Their exceptions are
    dropped: the caller's loop checks the store and the events again."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


ANSWER_KEY = "answer"
"""The question key of :meth:`CallHuman.ask_text` and :meth:`CallHuman.ask_choice`."""


class CallHuman(HumanChannel):
    """``ToolContext.human`` of one tool call in a run that can ask (see
    :class:`core.tools.HumanChannel` for the contract). Question ids follow cubeloop's
    formula (:class:`core.hitl.QuestionIds`, counted per call: a re-run of the call asks
    the same ids in the same order). Each answer, once received, settles its request, so
    the thread no longer waits and a crash later is an ordinary dangling call.
    ``notes`` collects what the result must say of defaults used."""

    def __init__(self, desk: HumanDesk, run_id: str | None, tool_call_id: str, announce: Announce) -> None:
        self.desk = desk
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.announce = announce
        self.notes: list[str] = []
        self._ids = QuestionIds()

    async def confirm(self, prompt: str, *, timeout: float | None = None, default: bool | None = None) -> bool:
        """Ask yes or no (a ``confirm`` request); returns the answer."""
        shown = None if default is None else ("yes" if default else "no")
        value = await self._ask(ConfirmRequest(prompt=prompt), timeout, default, shown)
        assert isinstance(value, bool)
        return value

    async def ask_text(self, prompt: str, *, timeout: float | None = None, default: str | None = None) -> str:
        """Ask one free-text question (an ``ask`` request of one question keyed
        :data:`ANSWER_KEY`); returns the text."""
        question = Question(key=ANSWER_KEY, prompt=prompt)
        shaped = None if default is None else {ANSWER_KEY: default}
        answers = await self._ask(AskRequest(questions=[question]), timeout, shaped, default)
        value = answers.get(ANSWER_KEY, "")
        return value if isinstance(value, str) else ", ".join(value)

    async def ask_choice(
        self,
        prompt: str,
        options: Sequence[str | Option],
        *,
        multi: bool = False,
        timeout: float | None = None,
        default: str | Sequence[str] | None = None,
    ) -> str | list[str]:
        """Ask for one of ``options`` (strings are label and value at once), or several
        with ``multi``; returns the chosen value (a list with ``multi``)."""
        listed = [o if isinstance(o, Option) else Option(label=o, value=o) for o in options]
        question = Question(key=ANSWER_KEY, prompt=prompt, options=listed, multi_select=multi)
        if default is None:
            shaped: dict[str, str | list[str]] | None = None
        else:
            shaped = {ANSWER_KEY: ([default] if isinstance(default, str) else list(default)) if multi else default}  # type: ignore[dict-item]
        shown = None if default is None else (default if isinstance(default, str) else ", ".join(default))
        answers = await self._ask(AskRequest(questions=[question]), timeout, shaped, shown)
        return answers[ANSWER_KEY]

    async def ask(
        self,
        questions: Sequence[Question],
        *,
        timeout: float | None = None,
        default: Mapping[str, str | list[str]] | None = None,
    ) -> dict[str, str | list[str]]:
        """Ask ``questions`` as one ``ask`` request; returns ``{key: answer}``."""
        value = await self._ask(
            AskRequest(questions=list(questions)), timeout, None if default is None else dict(default)
        )
        assert isinstance(value, dict)
        return value

    async def _ask(
        self,
        payload: ConfirmRequest | AskRequest,
        timeout: float | None,
        default: bool | dict[str, Any] | None,
        shown: str | None = None,
    ) -> Any:
        qid = self._ids.next(payload)
        answered = await self.desk.wait_for(
            payload,
            run_id=self.run_id,
            question_id=qid,
            tool_call_id=self.tool_call_id,
            announce=self.announce,
            timeout=timeout,
            default_json=None if default is None else dump_answer(default),
        )
        await self.desk.settle(self.run_id, qid)
        note = answered.note(shown)
        if note is not None:
            self.notes.append(note)
        try:
            return check_answer(answered.request, answered.answer_json)
        except AnswerMismatchError as exc:
            raise ToolError(f"The stored answer cannot be used: {exc}") from None
