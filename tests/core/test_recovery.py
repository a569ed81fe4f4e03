"""``core.recovery.diagnose``: a table of transcripts, one row per state and crash point."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.checkpoint.base import RunRecord
from core.messages import (
    AnyMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UnknownMessage,
    user_text,
)
from core.recovery import (
    JOURNALED_KEY,
    CrashPoint,
    JournalEntry,
    ResumeAction,
    ThreadState,
    dangling_calls,
    diagnose,
    unanswered_calls,
)

RUN = "r1"


def ask(text: str = "inspect the repo", kind: str = "prompt") -> AnyMessage:
    return user_text(text, kind=kind, run_id=RUN)


def say(text: str = "done", stop: str = "stop", error: str | None = None) -> AnyMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason=stop, error_message=error, run_id=RUN)


def call(*ids: str) -> AnyMessage:
    return AssistantMessage(
        content=[ToolCall(id=i, name=f"tool_{i}", arguments={}) for i in ids], stop_reason="tool_use", run_id=RUN
    )


def answer(call_id: str) -> AnyMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name=f"tool_{call_id}", content=[TextContent(text="ok")], run_id=RUN
    )


OPEN = (RunRecord(RUN, claimed_at=1.0),)
DONE = (RunRecord(RUN, claimed_at=1.0, completed_at=2.0, completion_seq=1),)


@dataclass(frozen=True)
class Case:
    messages: list[AnyMessage]
    runs: tuple[RunRecord, ...]
    state: ThreadState
    point: CrashPoint | None = None
    action: ResumeAction = ResumeAction.NONE
    dangling: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


CASES = {
    "empty": Case([], (), ThreadState.EMPTY),
    "only unknown roles": Case(
        [UnknownMessage(role="system")], (), ThreadState.EMPTY, notes=("1 row of unknown role",)
    ),
    "completed": Case([ask(), call("c1"), answer("c1"), say()], DONE, ThreadState.COMPLETED),
    "completed, store without runs": Case([ask(), say()], (), ThreadState.COMPLETED),
    "aborted": Case([ask(), call("c1"), answer("c1"), say("", stop="aborted")], OPEN, ThreadState.ABORTED),
    "failed": Case(
        [ask(), say("", stop="error", error="overloaded")],
        OPEN,
        ThreadState.FAILED,
        action=ResumeAction.RETRY_MODEL_CALL,
    ),
    "between turns: first prompt unanswered": Case(
        [ask()], OPEN, ThreadState.CRASHED, CrashPoint.BETWEEN_TURNS, ResumeAction.CALL_MODEL
    ),
    "between turns: follow-up after a final reply": Case(
        [ask(), say(), ask("and the tests?", kind="follow_up")],
        DONE,
        ThreadState.CRASHED,
        CrashPoint.BETWEEN_TURNS,
        ResumeAction.CALL_MODEL,
    ),
    "between turns: steer after tool results": Case(
        [ask(), call("c1"), answer("c1"), ask("also check docs", kind="steer")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.BETWEEN_TURNS,
        ResumeAction.CALL_MODEL,
    ),
    "between turns: final reply, run never completed": Case(
        [ask(), say()], OPEN, ThreadState.CRASHED, CrashPoint.BETWEEN_TURNS, ResumeAction.WAIT_FOR_USER
    ),
    "after tool result": Case(
        [ask(), call("c1"), answer("c1")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.AFTER_TOOL_RESULT,
        ResumeAction.CALL_MODEL,
    ),
    "after tool result: whole parallel batch answered": Case(
        [ask(), call("c1", "c2"), answer("c2"), answer("c1")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.AFTER_TOOL_RESULT,
        ResumeAction.CALL_MODEL,
    ),
    "mid-tool": Case(
        [ask(), call("c1")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1",),
    ),
    "mid-tool: parallel batch, nothing answered": Case(
        [ask(), call("c1", "c2")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1", "c2"),
    ),
    "mid-tool: parallel batch partly answered": Case(
        [ask(), call("c1", "c2", "c3"), answer("c2")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1", "c3"),
        answered=("c2",),
    ),
    "mid-tool: an older turn's result does not answer the new call": Case(
        [ask(), call("c1"), answer("c1"), call("c1b")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1b",),
    ),
    "mid-tool: a user message after the unanswered call": Case(
        [ask(), call("c1"), ask("are you done?", kind="steer")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1",),
    ),
    "mid-tool: a user message inside a partly answered batch": Case(
        [ask(), call("c1", "c2"), answer("c1"), ask("hurry up", kind="steer"), ask("please")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c2",),
        answered=("c1",),
    ),
    "mid-tool: unknown rows after the call are ignored": Case(
        [ask(), call("c1"), UnknownMessage(role="note")],
        OPEN,
        ThreadState.CRASHED,
        CrashPoint.MID_TOOL,
        ResumeAction.SETTLE_THEN_CALL_MODEL,
        dangling=("c1",),
        notes=("1 row of unknown role",),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_diagnosis_table(name: str) -> None:
    case = CASES[name]
    diagnosis = diagnose(case.messages, case.runs)
    assert diagnosis.state is case.state
    assert diagnosis.crash_point is case.point
    assert diagnosis.action is case.action
    assert tuple(d.call.id for d in diagnosis.dangling) == case.dangling
    assert diagnosis.answered == case.answered
    assert diagnosis.resumable == (case.action is not ResumeAction.NONE)
    assert diagnosis.detail.endswith(".") or diagnosis.state is ThreadState.FAILED
    assert diagnosis.resume_plan.endswith(".")
    base = f"crashed at point {int(case.point)} ({case.point.words})" if case.point is not None else case.state.value
    assert diagnosis.label == " · ".join((base, *case.notes))


@pytest.mark.parametrize("name", list(CASES))
def test_the_tail_alone_gives_the_same_diagnosis(name: str) -> None:
    """``ThreadSummary.tail`` (last assistant message onward) is enough for ``diagnose``."""
    case = CASES[name]
    last = max((i for i, m in enumerate(case.messages) if isinstance(m, AssistantMessage)), default=0)
    assert diagnose(case.messages[last:], case.runs, tail_only=True) == diagnose(case.messages, case.runs)


@pytest.mark.parametrize("name", list(CASES))
def test_the_loop_settles_exactly_the_calls_diagnose_reports(name: str) -> None:
    case = CASES[name]
    assert tuple(c.id for c in unanswered_calls(case.messages)) == case.dangling


def test_user_messages_after_dangling_calls_are_said_to_wait() -> None:
    diagnosis = diagnose([ask(), call("c1"), ask("are you done?", kind="steer")], OPEN)
    assert diagnosis.detail == "1 tool call has no result; 1 user message after it waits until it is settled."
    assert "tool_c1 (c1)" in diagnosis.resume_plan


def test_without_a_journal_dangling_calls_may_have_started() -> None:
    diagnosis = diagnose([ask(), call("c1")], OPEN, journal=None)
    (dangling,) = diagnosis.dangling
    assert not dangling.journaled and dangling.status_words == "may have started"
    assert "tool_c1 (c1)" in diagnosis.resume_plan


def journaled(message: AnyMessage) -> AnyMessage:
    """``message`` as a journaling writer (our agent) persists it."""
    message.metadata[JOURNALED_KEY] = True
    return message


def test_with_a_journal_dangling_calls_say_whether_they_started() -> None:
    journal = {"c1": JournalEntry("c1", started_at=1_700_000_000.0, job_key="job-1")}
    diagnosis = diagnose([ask(), journaled(call("c1", "c2"))], OPEN, journal=journal)
    started, never = diagnosis.dangling
    assert started.journaled and started.started_at == 1_700_000_000.0
    assert started.status_words.startswith("started ") and started.status_words.endswith(", never finished")
    assert never.journaled and never.started_at is None and never.status_words == "never started"


def test_a_journal_is_not_believed_for_calls_its_writer_did_not_journal() -> None:
    """A cubeloop call in a file that has our journal table since an upgrade may have started."""
    journal = {"other": JournalEntry("other", started_at=1_700_000_000.0)}
    (dangling,) = diagnose([ask(), call("c1")], OPEN, journal=journal).dangling
    assert not dangling.journaled and dangling.status_words == "may have started"


def test_failed_detail_carries_the_provider_error() -> None:
    assert "overloaded" in diagnose([ask(), say("", stop="error", error="overloaded")]).detail


def test_dangling_calls_helper() -> None:
    assert [c.id for c in dangling_calls([ask(), call("c1", "c2"), answer("c1")])] == ["c2"]
    assert dangling_calls([ask(), say()]) == []
