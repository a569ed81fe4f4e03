"""Crash diagnosis: from a thread's persisted messages and runs, where did it stop?

Pure functions, no I/O. The three crash points and the clean states are defined in
``DESIGN.md`` ("The three crash points"); the tests check this module against threads
the real cubeloop writes and kills (``tests/helpers/crashpoint_verdicts.py``).

Only finished messages are persisted, so the last persisted messages tell the story:

1. **between turns**: the last message is a user message nobody answered, or a final
   assistant reply whose run never completed;
2. **after tool result**: every tool call of the last assistant message has its result,
   but the next model call never finished;
3. **mid-tool**: the last assistant message has tool calls without results, whatever
   follows it (a user message after unanswered calls does not hide them).

For mid-tool, :func:`plan_call` decides each dangling call's settlement from facts the
agent gathers (is the tool known, idempotent, is its job done) and :class:`ResumePlan`
applies the user's choices (:meth:`ResumePlan.settlement`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Sequence

from core.checkpoint.base import JobStatus, JournalEntry, RunRecord
from core.errors import ResumeChoiceError
from core.messages import AnyMessage, AssistantMessage, ToolCall, ToolResultMessage, UserMessage


class ThreadState(enum.StrEnum):
    """What a stored thread is, from its records alone."""

    EMPTY = "empty"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    CRASHED = "crashed"


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


@dataclass(frozen=True, slots=True)
class DanglingCall:
    """A tool call of the last assistant message that has no persisted result.

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
        """"never started", "started HH:MM:SS, never finished" or "may have started" (no
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


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The verdict on one thread.

    ``crash_point`` is set only when ``state`` is ``CRASHED``; ``dangling`` lists the
    unanswered calls (mid-tool only) and ``answered`` the ids of calls of the same
    assistant message that do have results (a partly answered parallel batch).
    """

    state: ThreadState
    crash_point: CrashPoint | None = None
    dangling: tuple[DanglingCall, ...] = ()
    answered: tuple[str, ...] = ()
    action: ResumeAction = ResumeAction.NONE
    detail: str = ""

    @property
    def label(self) -> str:
        """Short state for a list: "completed", "crashed at point 3 (mid-tool)", ..."""
        if self.crash_point is not None:
            return f"crashed at point {int(self.crash_point)} ({self.crash_point.words})"
        return self.state.value

    @property
    def resumable(self) -> bool:
        """Whether ``resume()`` has work to do."""
        return self.action is not ResumeAction.NONE

    @property
    def resume_plan(self) -> str:
        """One sentence saying what resume will do."""
        if self.action is ResumeAction.CALL_MODEL:
            return "Resume calls the model again with the saved conversation."
        if self.action is ResumeAction.WAIT_FOR_USER:
            return "The last reply is final: resume closes the run and waits for your next message."
        if self.action is ResumeAction.SETTLE_THEN_CALL_MODEL:
            names = ", ".join(f"{d.call.name} ({d.call.id})" for d in self.dangling)
            return (
                f"Resume first records {names} as interrupted (its effects must be checked), "
                "then calls the model again."
            )
        return "Nothing to resume; send a new message to continue."


JOURNALED_KEY = "cubepi_journaled"
"""Assistant-message metadata key: true when the writer journaled its tool calls.

Only such calls can be "never started"; a call from a writer without a journal
(cubeloop, even in a file we upgraded later) "may have started"."""


def diagnose(
    messages: Sequence[AnyMessage],
    runs: Iterable[RunRecord] = (),
    journal: Mapping[str, JournalEntry] | None = None,
) -> Diagnosis:
    """Classify a thread from its persisted ``messages`` (append order) and ``runs``.

    ``messages`` may be the whole thread or its tail from the last assistant message on
    (``ThreadSummary.tail``). ``journal`` maps tool call id to its journal entry; pass
    ``None`` for stores without a journal (cubeloop's), so dangling calls "may have
    started". The journal is believed only for an assistant message whose metadata
    carries :data:`JOURNALED_KEY` (its writer journaled its calls). Returns a :class:`Diagnosis`; never raises.

    Calls of the last assistant message without results make the thread mid-tool (point
    3) even when user messages follow them, e.g. ``[user, assistant(c1), user]`` from a
    cubeloop or hand-edited thread, or a steer saved by a writer that did not settle
    first. DESIGN.md defines point 3 by exactly that condition and requires dangling
    calls to be settled before any model call, while point 1 is a user message the
    model can be sent as it is; this one cannot until c1 has a result. Reporting
    point 3 also keeps the diagnosis equal to what the loop does (it settles
    :func:`unanswered_calls` before every model call), and puts the calls in the
    resume plan so the user can choose how each is settled.
    """
    relevant = [m for m in messages if isinstance(m, (UserMessage, AssistantMessage, ToolResultMessage))]
    if not relevant:
        return Diagnosis(ThreadState.EMPTY, detail="The thread has no messages yet.")
    at, assistant, answered = _last_batch(relevant)
    calls = assistant.tool_calls if assistant is not None else []
    missing = [c for c in calls if c.id not in answered]
    if assistant is not None and missing:
        return _mid_tool(assistant, missing, answered, relevant[at + 1 :], journal)
    if assistant is None or isinstance(relevant[-1], UserMessage):
        return _crashed(CrashPoint.BETWEEN_TURNS, ResumeAction.CALL_MODEL, "The last user message was never answered.")
    if calls:
        return _crashed(
            CrashPoint.AFTER_TOOL_RESULT,
            ResumeAction.CALL_MODEL,
            "Every tool call has its result, but the next model call never finished.",
        )
    if assistant.stop_reason == "aborted":
        return Diagnosis(ThreadState.ABORTED, detail="The run was aborted.")
    if assistant.stop_reason == "error":
        reason = assistant.error_message or "unknown provider error"
        return Diagnosis(ThreadState.FAILED, detail=f"The model call failed: {reason}")
    run_id = assistant.run_id
    run = next((r for r in runs if r.run_id == run_id), None) if run_id else None
    if run is not None and not run.completed:
        return _crashed(
            CrashPoint.BETWEEN_TURNS,
            ResumeAction.WAIT_FOR_USER,
            "The final reply was saved but its run never completed.",
        )
    return Diagnosis(ThreadState.COMPLETED, detail="The run completed.")


def _mid_tool(
    assistant: AssistantMessage,
    missing: Sequence[ToolCall],
    answered: set[str],
    after: Sequence[AnyMessage],
    journal: Mapping[str, JournalEntry] | None,
) -> Diagnosis:
    covered = journal if assistant.metadata.get(JOURNALED_KEY) else None
    dangling = tuple(_dangling(c, covered) for c in missing)
    calls = assistant.tool_calls
    answered_ids = tuple(c.id for c in calls if c.id in answered)
    partly = f"; {len(answered_ids)} of {len(calls)} calls in the batch have results" if answered_ids else ""
    users = sum(isinstance(m, UserMessage) for m in after)
    waiting = f"; {users} user message(s) after them wait until they are settled" if users else ""
    return Diagnosis(
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        dangling=dangling,
        answered=answered_ids,
        action=ResumeAction.SETTLE_THEN_CALL_MODEL,
        detail=f"{len(missing)} tool call(s) have no result{partly}{waiting}.",
    )


def _crashed(point: CrashPoint, action: ResumeAction, detail: str) -> Diagnosis:
    return Diagnosis(ThreadState.CRASHED, point, action=action, detail=detail)


def _dangling(call: ToolCall, journal: Mapping[str, JournalEntry] | None) -> DanglingCall:
    if journal is None:
        return DanglingCall(call)
    entry = journal.get(call.id)
    if entry is None:
        return DanglingCall(call, journaled=True)
    return DanglingCall(call, journaled=True, started_at=entry.started_at, ended_at=entry.ended_at)


def _last_batch(messages: Sequence[AnyMessage]) -> tuple[int, AssistantMessage | None, set[str]]:
    # (index of the last assistant message, that message, ids of the results after it).
    # Scans back only that far, so the loop's per-call check costs the same at any
    # history length.
    answered: set[str] = set()
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, ToolResultMessage):
            answered.add(message.tool_call_id)
        elif isinstance(message, AssistantMessage):
            return i, message, answered
    return -1, None, answered


def unanswered_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The tool calls of the last assistant message with no result after it, in call order.

    User messages after that assistant message do not matter: their calls are still
    unanswered (see :func:`diagnose`). This is the one definition both ``diagnose``
    and the loop's settlement use. Cost grows with the messages after the last
    assistant message, not with the history. Never raises.
    """
    _, assistant, answered = _last_batch(messages)
    if assistant is None:
        return []
    return [c for c in assistant.tool_calls if c.id not in answered]


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
    "started 12:03:10, never finished", "may have started").
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

    @property
    def words(self) -> str:
        """One sentence for people: the call, where it stopped, what resume does with it."""
        what = {
            "reuse": "its job is done, so the stored result is reused without running it again",
            "rerun": "it is idempotent, so it runs again" if self.idempotent else "it runs again, as you chose",
            "interrupt": "it is recorded as interrupted and not run again (its effects must be checked)",
        }[self.action]
        if not self.known:
            what = "this agent does not have that tool, so it is recorded as interrupted"
        return f"{self.call.name} ({self.call.id}): {self.status_words}; {what}."


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
        settle: dict[str, SettleChoice] = {c.call.id: "interrupt" if c.action == "interrupt" else "rerun" for c in self.calls}
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
        if self.action is not ResumeAction.SETTLE_THEN_CALL_MODEL:
            return self.diagnosis.resume_plan
        return "Resume first settles each dangling call - " + " ".join(c.words for c in self.calls) + " Then it calls the model again."


def plan_call(
    dangling: DanglingCall,
    *,
    known: bool,
    idempotent: bool,
    job_key: str | None,
    job_status: JobStatus | None,
) -> CallPlan:
    """The default settlement of one dangling call (pure).

    Unknown tool: interrupt, no choice. Idempotent tool: reuse when its job is done,
    else rerun; no choice (re-running is safe by declaration). Known tool that is not
    idempotent: interrupt by default, the user may choose rerun.
    """
    idempotent = known and idempotent
    action: SettleAction
    choices: tuple[SettleChoice, ...] = ()
    if not known:
        action = "interrupt"
    elif idempotent:
        action = "reuse" if job_status == "done" else "rerun"
    else:
        action = "interrupt"
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
    )
