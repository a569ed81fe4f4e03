"""Crash diagnosis: from a thread's persisted messages and runs, where did it stop?

Pure functions, no I/O. The three crash points and the clean states are defined in
``DESIGN.md`` ("The three crash points"); the tests check this module against threads
the real cubeloop writes and kills (``tests/helpers/crashpoint_verdicts.py``).

Only finished messages are persisted, so the persisted messages tell the story:

1. **between turns**: the last message is a user message nobody answered, or a final
   assistant reply whose run never completed;
2. **after tool result**: every tool call has its result, but results were saved after
   the last assistant message and the next model call never finished;
3. **mid-tool**: tool calls without results anywhere in the thread, whatever follows
   them (a user message, or a later reply another writer added, does not hide them).

Not crashes: completed, aborted, **failed** (the last reply ended in a provider error;
resume retries the model call without re-running tools), **waiting for an answer** (a
pending human request, cubeloop's HITL: never settled, its row left as it is, until it is
answered; once its answer is stored, resuming applies it: ``APPLY_ANSWER``, see
:mod:`core.human_wait`) and empty.
Whatever the state, what the request builder (:mod:`core.request`) has to leave out or
place, unreadable rows and writes another run interleaved are said in
:attr:`Diagnosis.notes`.

Whether resume calls the model is decided by the one test the loop makes,
:attr:`core.request.BuiltRequest.needs_reply` (what is sent, once dangling calls are
settled, ends with a user message or a tool result): when the request would end with a
reply, that reply is final and resume settles, then waits for the user
(``SETTLE_THEN_WAIT``, ``WAIT_FOR_USER``) instead of calling the model - e.g. a result
stored after a later reply is placed after its call and is not a point-2 crash.

For mid-tool, :func:`plan_call` decides each dangling call's settlement from facts the
agent gathers (is the tool known, idempotent, is its job done) and :class:`ResumePlan`
applies the user's choices (:meth:`ResumePlan.settlement`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.checkpoint.base import CorruptRow, JobStatus, JournalEntry, PendingRequest, RunRecord, StepRecord
from core.errors import ResumeChoiceError
from core.hitl import parse_request
from core.messages import AnyMessage, AssistantMessage, ToolCall, ToolResultMessage
from core.recovery_fold import HistoryFold
from core.request import BuiltRequest, Repair, Unanswered, build_request
from core.words import counted


class ThreadState(enum.StrEnum):
    """What a stored thread is, from its records alone."""

    EMPTY = "empty"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    CRASHED = "crashed"
    WAITING = "waiting for an answer"


class CrashPoint(enum.IntEnum):
    """Where a crashed run stopped; the numbers are DESIGN.md's."""

    BETWEEN_TURNS = 1
    AFTER_TOOL_RESULT = 2
    MID_TOOL = 3

    @property
    def words(self) -> str:
        """The crash point named for people."""
        return _CRASH_WORDS[self]


_CRASH_WORDS = {
    CrashPoint.BETWEEN_TURNS: "between turns",
    CrashPoint.AFTER_TOOL_RESULT: "after tool result",
    CrashPoint.MID_TOOL: "mid-tool",
}


class ResumeAction(enum.StrEnum):
    """What ``Agent.resume()`` does for a diagnosis."""

    NONE = "none"
    """Nothing to resume: the thread is clean; a new message starts the next run."""
    CALL_MODEL = "call_model"
    """Call the model again with the persisted history."""
    WAIT_FOR_USER = "wait_for_user"
    """The last reply is final; close the run and wait for the next user message."""
    SETTLE_THEN_CALL_MODEL = "settle_then_call_model"
    """Give each dangling tool call a result, then call the model."""
    SETTLE_THEN_WAIT = "settle_then_wait"
    """Give each dangling tool call a result, then wait for the next user message: the
    request would end with a later reply (another writer went on past the calls), which
    is final, so the model is not called (:attr:`core.request.BuiltRequest.needs_reply`)."""
    RETRY_MODEL_CALL = "retry_model_call"
    """The last model call failed: call the model again with the saved history (the
    failed reply is not sent, no tool runs again)."""
    APPLY_ANSWER = "apply_answer"
    """The thread waits for an answer that is stored now: continue the waiting run, the
    asking call given the answer (an approval's decision, or its body run again to take
    it), settle any other dangling call, then call the model."""


@dataclass(frozen=True, slots=True)
class DanglingCall:
    """A tool call that has no persisted result anywhere after it.

    ``started_at`` / ``ended_at`` are unix seconds from the tool journal, ``None`` when
    it never started (or ended) or when the store keeps no journal (``journaled`` tells
    which).
    """

    call: ToolCall
    journaled: bool = False
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def status_words(self) -> str:
        """ "never started", "started HH:MM:SS, never finished" or "may have started" (no
        journal); "started HH:MM:SS, ended HH:MM:SS, result never saved" when the crash
        fell between the tool's end and the saving of its result."""
        if not self.journaled:
            return "may have started"
        if self.started_at is None:
            return "never started"
        if self.ended_at is not None:
            return f"started {_clock(self.started_at)}, ended {_clock(self.ended_at)}, result never saved"
        return f"started {_clock(self.started_at)}, never finished"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


QUESTION_CHARS = 60
"""A pending question is cut to this many characters in :attr:`Diagnosis.label` (the
whole question is in ``Diagnosis.detail``)."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The verdict on one thread.

    ``crash_point`` is set only when ``state`` is ``CRASHED``; ``dangling`` lists the
    calls without results (mid-tool, or before a failed reply) and ``answered`` the ids
    of calls of the same assistant messages that do have results (a partly answered
    parallel batch). ``notes`` are short phrases about the rest of the history
    ("2 unreadable rows", "1 orphan result"); ``repairs`` what the request builder does
    in what is sent (worded by :func:`core.request.repair_words`); ``pending`` the human
    request the thread waits on, and ``answer_stored`` whether its answer is stored.
    """

    state: ThreadState
    crash_point: CrashPoint | None = None
    dangling: tuple[DanglingCall, ...] = ()
    answered: tuple[str, ...] = ()
    action: ResumeAction = ResumeAction.NONE
    detail: str = ""
    notes: tuple[str, ...] = ()
    repairs: tuple[Repair, ...] = field(default=(), compare=False)  # indices are of the messages given
    pending: PendingRequest | None = None
    answer_stored: bool = False

    @property
    def label(self) -> str:
        """Short state for a list: "completed", "crashed at point 3 (mid-tool)", "waiting
        for an answer: Deploy to which environment?" ("answered: ..." once its answer is
        stored; the question on one line, cut at :data:`QUESTION_CHARS`), each followed by
        its notes ("completed · 2 unreadable rows")."""
        if self.crash_point is not None:
            base = f"crashed at point {int(self.crash_point)} ({self.crash_point.words})"
        elif self.pending is not None:
            question = " ".join(self.pending.question.split())
            if len(question) > QUESTION_CHARS:
                question = question[: QUESTION_CHARS - 1] + "…"
            state = ANSWERED_WORDS if self.answer_stored else self.state.value
            base = f"{state}: {question}"
        else:
            base = self.state.value
        return " · ".join((base, *self.notes))

    @property
    def resumable(self) -> bool:
        """Whether ``resume()`` has work to do."""
        return self.action is not ResumeAction.NONE

    @property
    def resume_plan(self) -> str:
        """One sentence saying what resume will do. How each dangling call is settled
        depends on the agent's tools, so it is said as the rule (:data:`SETTLE_RULE`);
        :attr:`ResumePlan.sentence` says it call by call."""
        if self.action is ResumeAction.CALL_MODEL:
            return "Resume calls the model again with the saved conversation."
        if self.action is ResumeAction.RETRY_MODEL_CALL:
            return _settle_words(self.dangling) + _RETRY_WORDS if self.dangling else f"Resume {_RETRY_ONLY_WORDS}"
        if self.action is ResumeAction.WAIT_FOR_USER:
            return "The last reply is final: resume closes the run and waits for your next message."
        if self.action is ResumeAction.SETTLE_THEN_CALL_MODEL:
            return _settle_words(self.dangling) + _CALL_WORDS
        if self.action is ResumeAction.SETTLE_THEN_WAIT:
            return _settle_words(self.dangling) + _WAIT_WORDS
        if self.action is ResumeAction.APPLY_ANSWER:
            first = _ANSWER_WORDS if self.answer_stored else _DUE_WORDS
            return f"{first}, settles any other dangling call ({SETTLE_RULE}), then it {_CALL_WORDS}"
        if self.state is ThreadState.WAITING:
            return (
                "Nothing to resume until its question is answered (in the app, with cubepi-tui answer, or in the "
                "program that asked it); resuming then applies the answer."
            )
        return "Nothing to resume; send a new message to continue."


SETTLE_RULE = (
    "a call of an idempotent tool is re-run or its done job's result reused, and any other call is recorded "
    "as interrupted, its effects to be checked, unless you choose to re-run it"
)
"""How resume settles dangling calls by default, in words: the rule of :func:`default_settlement`."""

_RETRY_WORDS = (
    "retries the failed model call with the saved conversation (the failed reply is not sent, and no call "
    "that has its result runs again)."
)
_CALL_WORDS = "calls the model again."
_RETRY_ONLY_WORDS = (
    "retries the failed model call with the saved conversation; the failed reply is not sent and no tool runs again."
)
_WAIT_WORDS = "waits for your next message (the last reply is final, so the model is not called)."
_ANSWER_WORDS = "Answered: resuming applies the stored answer to the call that asked"
_DUE_WORDS = (
    "The question's deadline passed: resuming lets the call that asked take its default (or end the run "
    "waiting again without one)"
)
ANSWERED_WORDS = "answered"
"""What :attr:`Diagnosis.label` says of a waiting thread whose answer is stored."""


def _settle_words(dangling: Sequence[DanglingCall]) -> str:
    if not dangling:
        return "Resume "
    names = ", ".join(f"{d.call.name} ({d.call.id})" for d in dangling)
    return f"Resume first settles {names}: {SETTLE_RULE}; then it "


JOURNALED_KEY = "cubepi_journaled"
"""Assistant-message metadata key: true when the writer journaled its tool calls.

Only such calls can be "never started"; a call from a writer without a journal
(cubeloop, even in a file we upgraded later) "may have started"."""


def diagnose(
    messages: Sequence[AnyMessage],
    runs: Iterable[RunRecord] = (),
    journal: Mapping[str, JournalEntry] | None = None,
    *,
    problems: Sequence[CorruptRow] = (),
    pending: PendingRequest | None = None,
    answer_stored: bool | None = None,
    deadline_passed: bool = False,
    tail_only: bool = False,
) -> Diagnosis:
    """Classify a thread from its persisted ``messages`` (append order) and ``runs``.

    ``messages`` is the whole thread, or with ``tail_only=True`` its tail from the last
    assistant message on (``ThreadSummary.tail``): then results answering calls before
    the tail are not taken for orphans, and calls before the tail are not seen.
    ``journal`` maps tool call id to its journal entry; pass ``None`` for stores without
    a journal (cubeloop's), so dangling calls "may have started". The journal is
    believed only for an assistant message whose metadata carries :data:`JOURNALED_KEY`
    (its writer journaled its calls). ``problems`` are the thread's unreadable rows and
    ``pending`` its pending human request, ``answer_stored`` whether its answer is in the
    store (``HumanAnswers.load_answer``; ``None``: as the store said when it read the
    request, ``pending.answered``), ``deadline_passed`` whether its
    ``created_at + timeout_seconds`` is past (the asker then takes its default, or ends
    waiting again). Returns a :class:`Diagnosis`; never raises.
    The same as :func:`diagnosis_of` a :class:`~core.recovery_fold.HistoryFold` fed
    ``messages`` (a history read in pieces is diagnosed that way).

    In this order: a pending human request makes the thread **waiting for an answer**
    (its call is the question, and is never settled here) - with its answer stored, the
    action is ``APPLY_ANSWER`` and the dangling calls are listed; a last reply that ended in
    a provider error makes it **failed** (retry the model call; any call without a
    result is settled first); calls without results anywhere make it mid-tool (point
    3), even when user messages or later replies follow them, e.g. ``[user,
    assistant(c1), user]`` from a cubeloop or hand-edited thread. DESIGN.md defines
    point 3 by exactly that condition and requires such calls to be settled before any
    model call; the loop does so (:func:`unanswered_calls`, the builder's definition), so
    the diagnosis is what the loop does, and the calls are in the resume plan so the
    user can choose how each is settled.
    """
    fold = HistoryFold(tail=tail_only)
    fold.add(messages)
    return diagnosis_of(
        fold,
        runs,
        journal,
        problems=problems,
        pending=pending,
        answer_stored=answer_stored,
        deadline_passed=deadline_passed,
    )


def diagnosis_of(
    fold: HistoryFold,
    runs: Iterable[RunRecord] = (),
    journal: Mapping[str, JournalEntry] | None = None,
    *,
    problems: Sequence[CorruptRow] = (),
    pending: PendingRequest | None = None,
    answer_stored: bool | None = None,
    deadline_passed: bool = False,
) -> Diagnosis:
    """:func:`diagnose` of the history ``fold`` was fed (whole, or its tail when the fold
    was made with ``tail=True``); the other arguments are :func:`diagnose`'s. Cost grows
    with the open part of the history and the number of repairs, not with its length, so a
    follower can diagnose again after each message it reads. Never raises."""
    if answer_stored is None:
        answer_stored = pending is not None and pending.answered
    tail_only = fold.tail
    built = fold.built()
    notes = _notes(fold.unknown, built, problems, tail_only)
    # Unanswered calls are settled before any model call, not left out: they are the
    # dangling calls of the diagnosis, not a repair.
    repairs = tuple(
        r for r in built.repairs if r.kind != "unanswered_call" and not (tail_only and r.kind == "orphan_result")
    )
    info = {"notes": notes, "repairs": repairs}
    if pending is not None and not (answer_stored or deadline_passed):
        return Diagnosis(ThreadState.WAITING, pending=pending, detail=f"The run asked: {pending.question}", **info)
    dangling, answered = _dangling_of(built.unanswered, journal)
    if pending is not None:
        then = (
            "the answer is stored, and resuming applies it"
            if answer_stored
            else "its deadline passed: resuming records the asker's default, or ends the run waiting again without one"
        )
        return Diagnosis(
            ThreadState.WAITING,
            dangling=dangling,
            answered=answered,
            action=ResumeAction.APPLY_ANSWER,
            detail=f"The run asked: {pending.question}; {then}.",
            pending=pending,
            answer_stored=answer_stored,
            **info,  # type: ignore[arg-type]
        )
    if fold.last_known < 0:
        return Diagnosis(ThreadState.EMPTY, detail="The thread has no messages yet.", **info)
    at, last = fold.last_assistant or (-1, None)
    if isinstance(last, AssistantMessage) and last.stop_reason == "error" and at == fold.last_known:
        return _failed(last, built, dangling, answered, info)
    if dangling:
        return _mid_tool(built, dangling, answered, fold, **info)
    # The model is called only when the request ends with a user message or a tool
    # result (``needs_reply``): the same test the loop makes, so the verdict is what
    # resume does. A reply that is last in what is sent is final even when results or
    # empty messages were stored after it.
    if built.needs_reply and (last is None or fold.user_after_last_assistant):
        return _crashed(
            CrashPoint.BETWEEN_TURNS, ResumeAction.CALL_MODEL, "The last user message was never answered.", info
        )
    # Results saved after the last reply that the model has not seen yet (not orphans
    # or duplicates, which are never sent; in a tail, only results of the tail's calls).
    left_out = {r.index for r in built.repairs if r.kind in ("orphan_result", "duplicate_result")}
    fresh = [i for i in fold.results_after_last_assistant if i not in left_out]
    if built.needs_reply and fresh:
        return _crashed(
            CrashPoint.AFTER_TOOL_RESULT,
            ResumeAction.CALL_MODEL,
            "Every tool call has its result, but the next model call never finished.",
            info,
        )
    if last is None:
        return Diagnosis(ThreadState.EMPTY, detail="The thread has no message that can be sent to the model.", **info)
    if last.stop_reason == "aborted":
        return Diagnosis(ThreadState.ABORTED, detail="The run was aborted.", **info)
    if last.stop_reason == "error":
        return _failed(last, built, (), (), info)
    run_id = last.run_id
    run = next((r for r in runs if r.run_id == run_id), None) if run_id else None
    if run is not None and not run.completed:
        return _crashed(
            CrashPoint.BETWEEN_TURNS,
            ResumeAction.WAIT_FOR_USER,
            "The final reply was saved but its run never completed.",
            info,
        )
    return Diagnosis(ThreadState.COMPLETED, detail="The run completed.", **info)


def tail_is_enough(tail: Sequence[AnyMessage]) -> bool:
    """Whether ``diagnose(tail, tail_only=True)`` tells as much as the whole thread would
    about the tail's results: false when the tail holds a tool result whose call is not
    in it (an orphan, or a late answer to an earlier call: only the whole thread tells
    which). Cost grows with the tail only."""
    calls = {c.id for m in tail if isinstance(m, AssistantMessage) for c in m.tool_calls}
    return all(m.tool_call_id in calls for m in tail if isinstance(m, ToolResultMessage))


def _notes(unknown: int, built: BuiltRequest, problems: Sequence[CorruptRow], tail_only: bool) -> tuple[str, ...]:
    """The short phrases of :attr:`Diagnosis.notes`, in a fixed order."""
    notes: list[str] = []
    if problems:
        notes.append(counted(len(problems), "unreadable row", "unreadable rows"))
    if unknown:
        notes.append(counted(unknown, "row of unknown role", "rows of unknown role"))
    orphans = sum(r.kind == "orphan_result" for r in built.repairs)
    if orphans and not tail_only:
        notes.append(counted(orphans, "orphan result", "orphan results"))
    duplicates = sum(r.kind == "duplicate_result" for r in built.repairs)
    if duplicates:
        notes.append(counted(duplicates, "duplicate result", "duplicate results"))
    if built.interleaved:
        n = len(built.interleaved)
        notes.append(
            f"another run wrote between {counted(n, 'tool call and its result', 'tool calls and their results')}"
        )
    return tuple(notes)


def _dangling_of(
    unanswered: Sequence[Unanswered], journal: Mapping[str, JournalEntry] | None
) -> tuple[tuple[DanglingCall, ...], tuple[str, ...]]:
    """The dangling calls and the ids of the answered calls of the same assistant messages."""
    dangling = tuple(_dangling(u.call, journal if u.message.metadata.get(JOURNALED_KEY) else None) for u in unanswered)
    missing = {u.call.id for u in unanswered}
    issuers = {id(u.message): u.message for u in unanswered}
    answered = tuple(c.id for m in issuers.values() for c in m.tool_calls if c.id not in missing)
    return dangling, answered


def _failed(
    last: AssistantMessage,
    built: BuiltRequest,
    dangling: tuple[DanglingCall, ...],
    answered: tuple[str, ...],
    info: Mapping[str, tuple],
) -> Diagnosis:
    """A thread whose last reply ended in a provider error: retry the model call (after
    settling), unless what is sent would end with an earlier final reply."""
    detail = f"The model call failed: {last.error_message or 'unknown provider error'}"
    if built.needs_reply:
        action = ResumeAction.RETRY_MODEL_CALL
    else:
        action = ResumeAction.SETTLE_THEN_WAIT if dangling else ResumeAction.NONE
        detail += "; the reply before it is final, so the model is not called again"
    return Diagnosis(
        ThreadState.FAILED,
        dangling=dangling,
        answered=answered,
        action=action,
        detail=detail,
        **info,  # type: ignore[arg-type]
    )


def _mid_tool(
    built: BuiltRequest,
    dangling: tuple[DanglingCall, ...],
    answered: tuple[str, ...],
    fold: HistoryFold,
    **info: tuple,
) -> Diagnosis:
    calls = len(dangling) + len(answered)
    partly = f"; {len(answered)} of {calls} calls in the batch have results" if answered else ""
    first = built.unanswered[0].index
    users = fold.users_after(first)
    them, are = ("it", "it is") if len(dangling) == 1 else ("them", "they are")
    wait = "waits" if users == 1 else "wait"
    waiting = f"; {counted(users, 'user message')} after {them} {wait} until {are} settled" if users else ""
    replies = fold.replies_after(first)
    later = f"; {counted(replies, 'later reply', 'later replies')} went on without {them}" if replies else ""
    return Diagnosis(
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        dangling=dangling,
        answered=answered,
        action=ResumeAction.SETTLE_THEN_CALL_MODEL if built.needs_reply else ResumeAction.SETTLE_THEN_WAIT,
        detail=f"{counted(len(dangling), 'tool call has', 'tool calls have')} no result{partly}{waiting}{later}.",
        **info,  # type: ignore[arg-type]
    )


def _crashed(point: CrashPoint, action: ResumeAction, detail: str, info: Mapping[str, tuple]) -> Diagnosis:
    return Diagnosis(ThreadState.CRASHED, point, action=action, detail=detail, **info)  # type: ignore[arg-type]


def _dangling(call: ToolCall, journal: Mapping[str, JournalEntry] | None) -> DanglingCall:
    if journal is None:
        return DanglingCall(call)
    entry = journal.get(call.id)
    if entry is None:
        return DanglingCall(call, journaled=True)
    return DanglingCall(call, journaled=True, started_at=entry.started_at, ended_at=entry.ended_at)


def unanswered_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The tool calls of the whole history with no result after them, in the order they
    were made (the request builder's definition, :meth:`core.request.RequestBuilder.unanswered`).

    User messages or later replies after a call do not matter: it is still unanswered
    (see :func:`diagnose`). Calls of a reply that ended in a provider error are not
    counted (that reply is never sent). Cost grows with the history; the loop keeps a
    builder instead, fed only new messages. Never raises.
    """
    return [u.call for u in build_request(messages).unanswered]


def dangling_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The calls :func:`diagnose` reports as dangling; the same as :func:`unanswered_calls`."""
    return unanswered_calls(messages)


# --- resume planning ------------------------------------------------------------------------

SettleAction = Literal["rerun", "reuse", "interrupt"]
"""What resume does with one dangling call: run it again, reuse its done job's stored
result (no work), or record an error result saying it was interrupted."""

SettleChoice = Literal["rerun", "interrupt"]
"""What a user may choose for a dangling call of a known tool that is not idempotent."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """How resume settles one dangling tool call, and what the user may choose instead.

    ``known``: the tool is in this agent's tool list (a call of another program's tool,
    e.g. a cubeloop thread's, is not). ``job_key``/``job_status``: the call's job
    (idempotent tools only; ``job_status`` is ``None`` when no job was recorded or the
    store keeps none). ``action`` is the default; ``choices`` lists what the user may
    pick instead - ``("interrupt", "rerun")`` for a known tool that is not idempotent,
    else ``()``. ``status_words`` come from the tool journal ("never started",
    "started 12:03:10, never finished", "may have started"). ``step`` is the call's step
    record when the tool committed steps (:mod:`core.steps`; idempotent tools only): a
    re-run continues after its last committed step. ``waited`` is the call's part in a
    run that waited for an answer now stored (:func:`waiting_roles`), ``None`` otherwise.
    """

    call: ToolCall
    known: bool
    idempotent: bool
    job_key: str | None
    job_status: JobStatus | None
    action: SettleAction
    choices: tuple[SettleChoice, ...]
    status_words: str
    started_at: float | None = None
    step: StepRecord | None = None
    waited: WaitRole | None = None

    @property
    def step_words(self) -> str:
        """ "step 4 of 8 committed at 12:03:10" (local time, as the journal's times), or
        "" when no step was committed (:func:`step_words`)."""
        return step_words(self.step) if self.step is not None else ""

    @property
    def words(self) -> str:
        """One sentence for people: the call, where it stopped, what resume does with it."""
        rerun = "it is idempotent, so it runs again"
        if self.step is not None and self.step.next_step > 0:
            rerun += f", continuing after step {self.step.next_step}"
        what = {
            "reuse": "its job is done, so the stored result is reused without running it again",
            "rerun": rerun if self.idempotent else "it runs again, as you chose",
            "interrupt": "it is recorded as interrupted and not run again (its effects must be checked)",
        }[self.action]
        if not self.known:
            what = "this agent does not have that tool, so it is recorded as interrupted"
        elif self.waited is not None:
            what = _WAIT_ROLE_WORDS[self.waited]
        where = f"{self.status_words}; {self.step_words}" if self.step_words else self.status_words
        return f"{self.call.name} ({self.call.id}): {where}; {what}."


WaitRole = Literal["answered", "not_started"]
"""A dangling call's part in a run that waited for an answer now stored: the call that
asked (``"answered"``: it runs again and the answer applies) or a call of that run that
never started because the run waited first (``"not_started"``: it runs now)."""

_WAIT_ROLE_WORDS: dict[str, str] = {
    "answered": "it asked the question, so it runs again and takes the stored answer (or, past the deadline, the default)",
    "not_started": "the run waited for an answer before it started, so it runs now",
}


def waiting_roles(
    pending: PendingRequest, dangling: Sequence[DanglingCall], issuers: Mapping[str, str | None]
) -> dict[str, WaitRole]:
    """Tool call id -> :data:`WaitRole` for the dangling calls a stored answer to
    ``pending`` continues (pure; ``issuers`` maps a call id to the run id of its
    assistant message). Only calls of the run that asked take part, and only on the
    tool journal's word:

    * a call that never started (journaled, no start) runs now: the approval it waited
      for (``question_id`` = its id) or one stored earlier applies, or it asks anew;
    * for a question asked from a tool body (confirm / ask), the one call of that run
      that started and has no result asked it, and runs again to take its answer; when
      several did (a parallel batch killed while others ran), none is chosen and each
      follows the ordinary rule (:func:`default_settlement`): a call is never run twice
      on a guess;
    * an approved call the journal shows started ran after its approval: it is an
      ordinary dangling call (its tool never runs twice);
    * a writer without a journal (cubeloop): the one dangling call of the asking run
      runs again to take the answer, as cubeloop's own ``respond()`` does (a pending row
      there means its call still waits: cubeloop clears the row before it runs an
      answered call live).

    Calls missing here follow the ordinary rule. Never raises."""
    try:
        request = parse_request(pending.request_json)
    except ValueError:
        return {}
    run = pending.run_id or None
    mine = [d for d in dangling if (issuers.get(d.call.id) or None) == run]
    roles: dict[str, WaitRole] = {}
    for d in mine:
        if d.journaled and d.started_at is None:
            roles[d.call.id] = "answered" if d.call.id == request.question_id else "not_started"
    started = [d for d in mine if d.call.id not in roles]
    if len(started) == 1 and not started[0].journaled:
        # A writer without a journal (cubeloop): its own respond() re-executes the unanswered
        # call of the asking run (cubeloop/agent/loop.py:264-300), and so does this resume.
        roles[started[0].call.id] = "answered"
    elif request.payload.kind != "approve" and len(started) == 1:
        roles[started[0].call.id] = "answered"
    return roles


def plan_waiting(plan: CallPlan, role: WaitRole) -> CallPlan:
    """``plan`` for a call with ``role`` in a run continued with its answer: it runs
    (``"rerun"``, no choice)."""
    return dataclasses.replace(plan, action="rerun", choices=(), waited=role)


def step_words(step: StepRecord) -> str:
    """How far a stepped tool got: "step 4 of 8 committed at 12:03:10" ("step 4 committed
    at ..." when it declared no total; local time, as the journal's times are shown), or ""
    when no step was committed yet."""
    if step.next_step <= 0:
        return ""
    of = f" of {step.total_steps}" if step.total_steps is not None else ""
    return f"step {step.next_step}{of} committed at {_clock(step.updated_at)}"


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """What ``Agent.resume()`` will do: the diagnosis and one :class:`CallPlan` per
    dangling call (empty unless the thread crashed mid-tool)."""

    diagnosis: Diagnosis
    calls: tuple[CallPlan, ...] = ()

    @property
    def action(self) -> ResumeAction:
        """The diagnosis's resume action."""
        return self.diagnosis.action

    @property
    def needs_choice(self) -> bool:
        """Whether some call lets the user choose (a known tool that is not idempotent)."""
        return any(c.choices for c in self.calls)

    def settlement(self, choices: Mapping[str, SettleChoice]) -> dict[str, SettleChoice]:
        """Tool call id -> ``"rerun"`` / ``"interrupt"`` for every dangling call: the plan
        (reuse is a re-run whose done job answers without work) with ``choices`` applied.

        Raises ``ResumeChoiceError`` when a choice names a call not in the plan, or an
        action that call does not offer.
        """
        by_id = {c.call.id: c for c in self.calls}
        settle: dict[str, SettleChoice] = {
            c.call.id: "interrupt" if c.action == "interrupt" else "rerun" for c in self.calls
        }
        for call_id, choice in choices.items():
            planned = by_id.get(call_id)
            if planned is None:
                raise ResumeChoiceError(
                    f"Tool call {call_id} is not waiting for a result in this thread (it may have changed); "
                    "plan the resume again."
                )
            if choice not in planned.choices:
                offered = " or ".join(repr(c) for c in planned.choices) or "nothing (it has no choice)"
                raise ResumeChoiceError(
                    f"Tool call {planned.call.name} ({call_id}) cannot be settled with {choice!r}; it offers {offered}."
                )
            settle[call_id] = choice
        return settle

    @property
    def sentence(self) -> str:
        """What resume will do, with the default action of each call."""
        then = _THEN.get(self.action)
        if not self.calls or then is None:
            return self.diagnosis.resume_plan
        if self.action is ResumeAction.APPLY_ANSWER:
            first = _ANSWER_WORDS if self.diagnosis.answer_stored else _DUE_WORDS
            return f"{first} - " + " ".join(c.words for c in self.calls) + " " + then
        return "Resume first settles each dangling call - " + " ".join(c.words for c in self.calls) + " " + then


_THEN = {
    ResumeAction.APPLY_ANSWER: "Then it " + _CALL_WORDS,
    ResumeAction.RETRY_MODEL_CALL: "Then it " + _RETRY_WORDS,
    ResumeAction.SETTLE_THEN_CALL_MODEL: "Then it " + _CALL_WORDS,
    ResumeAction.SETTLE_THEN_WAIT: "Then it " + _WAIT_WORDS,
}


def default_settlement(*, known: bool, idempotent: bool) -> SettleChoice:
    """How a dangling call is settled unless the user chooses (:data:`SETTLE_RULE`):
    re-run (``"rerun"``, which reuses a done job's result) for a known idempotent tool,
    else ``"interrupt"``. The one decision both :func:`plan_call` and the loop's
    default (``LoopConfig.settle_choice``) make."""
    return "rerun" if known and idempotent else "interrupt"


def plan_call(
    dangling: DanglingCall,
    *,
    known: bool,
    idempotent: bool,
    job_key: str | None,
    job_status: JobStatus | None,
    step: StepRecord | None = None,
) -> CallPlan:
    """The default settlement of one dangling call (pure).

    Unknown tool: interrupt, no choice. Idempotent tool: reuse when its job is done,
    else rerun (continuing after ``step``'s last committed step, when given); no choice
    (re-running is safe by declaration). Known tool that is not idempotent: interrupt by
    default, the user may choose rerun.
    """
    idempotent = known and idempotent
    action: SettleAction = default_settlement(known=known, idempotent=idempotent)
    choices: tuple[SettleChoice, ...] = ()
    if action == "rerun" and job_status == "done":
        action = "reuse"
    elif known and not idempotent:
        choices = ("interrupt", "rerun")
    return CallPlan(
        dangling.call,
        known,
        idempotent,
        job_key if idempotent else None,
        job_status if idempotent else None,
        action,
        choices,
        dangling.status_words,
        dangling.started_at,
        step if idempotent else None,
    )
