"""tui.attention's rules (waiting for you, needs attention, one alert per request or dead run)
and the pending-request panel's words, without an app."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import replace

from core.checkpoint.base import Lease, PendingRequest
from core.hitl import ConfirmRequest, HumanRequest
from core.lease_status import LeaseState, LeaseView
from core.recovery import Diagnosis, ResumeAction, ThreadState, diagnose
from tui.attention import (
    AttentionWatch,
    alert_key,
    answered_label,
    needs_attention,
    waiting_first,
    waiting_for_you,
    waiting_label,
)
from tui.session import ThreadRow, state_label
from tui.widgets.pending_request import describe_request, waited_words

NOW = 1_795_954_400.0


def _pending(prompt: str = "Ship it?", *, timeout: float | None = None, qid: str = "q1") -> PendingRequest:
    request = HumanRequest(
        question_id=qid,
        thread_id="t",
        payload=ConfirmRequest(prompt=prompt),
        created_at=NOW - 90,
        timeout_seconds=timeout,
    )
    return PendingRequest(request.model_dump_json(), run_id="r1", created_at=NOW - 90)


def _row(thread_id: str, diagnosis: Diagnosis, **kw: object) -> ThreadRow:
    return ThreadRow(thread_id, diagnosis.label, 2, NOW, "go", diagnosis, **kw)  # type: ignore[arg-type]


WAITING = Diagnosis(ThreadState.WAITING, pending=_pending())
CRASHED = Diagnosis(ThreadState.CRASHED)
DONE = Diagnosis(ThreadState.COMPLETED)


def _stale(run_id: str = "r1", holder: str = "h1") -> LeaseView:
    lease = Lease("t", holder, 42, "box", run_id, NOW - 100, NOW - 100, NOW - 40)
    return LeaseView(LeaseState.CRASHED, lease)


def test_a_waiting_thread_reads_waiting_for_you_until_its_answer_is_stored() -> None:
    assert waiting_label(WAITING) == "waiting for you: Ship it?"
    answered = replace(WAITING, action=ResumeAction.CALL_MODEL)
    assert waiting_label(answered) == answered.label  # resumable: the person's part is done
    assert waiting_label(DONE) == "completed"


def test_an_answered_request_reads_answered_sorts_with_the_rest_and_needs_no_attention() -> None:
    """Its answer stored (the store read it with the request), the person's part is done
    until a run applies it: "answered — resume to apply", not first, not for ``!``, no alert."""
    answered = diagnose([], pending=replace(_pending(), answered=True))
    assert answered.action is ResumeAction.APPLY_ANSWER and not waiting_for_you(answered)
    assert answered_label(answered) == "answered — resume to apply: Ship it?"
    assert state_label(answered, None, running=False) == "answered — resume to apply: Ship it?"
    runs_there = LeaseView(LeaseState.RUNNING_ELSEWHERE, _stale().lease)
    assert state_label(answered, runs_there, running=False) == runs_there.label  # the run there applies it
    assert state_label(answered, None, running=True) == "running here"
    assert answered_label(WAITING) == WAITING.label == "waiting for an answer: Ship it?"
    assert answered_label(DONE) == "completed"
    rows = [_row("a", answered), _row("d", DONE), _row("w", WAITING)]
    ordered, waiting = waiting_first(rows)
    assert ([r.thread_id for r in ordered], waiting) == (["w", "a", "d"], 1)
    assert not needs_attention(rows[0]) and needs_attention(rows[2])
    assert alert_key(rows[0]) is None


def test_waiting_first_keeps_the_order_within_each_part() -> None:
    rows = [_row("a", DONE), _row("w1", WAITING), _row("b", CRASHED), _row("w2", WAITING)]
    ordered, waiting = waiting_first(rows)
    assert ([r.thread_id for r in ordered], waiting) == (["w1", "w2", "a", "b"], 2)
    assert waiting_first(rows[:1]) == ([rows[0]], 0)


def test_needs_attention_leaves_out_what_runs_and_what_is_fine() -> None:
    assert needs_attention(_row("w", WAITING, elsewhere=True))  # a live run waits on the person
    assert needs_attention(_row("c", CRASHED))
    assert not needs_attention(_row("c", CRASHED, elsewhere=True))  # running there: not crashed
    assert not needs_attention(_row("d", DONE))
    for state in (ThreadState.FAILED, ThreadState.ABORTED):
        assert needs_attention(_row("x", Diagnosis(state)))


def test_an_alert_is_given_once_per_request_and_per_dead_run_and_never_for_the_first_listing() -> None:
    watch = AttentionWatch()
    first = [_row("old", WAITING), _row("dead", CRASHED, lease=_stale())]
    assert watch.rows_seen(first[:1], complete=False) == []  # a first listing in parts: still the baseline
    assert watch.rows_seen(first, complete=True) == []
    asked = _row("t", WAITING)
    assert watch.rows_seen([asked], complete=True) == [asked]
    assert watch.rows_seen([asked], complete=True) == []
    assert watch.rows_seen([_row("t", DONE)], complete=True) == []
    assert watch.rows_seen([asked], complete=True) == []  # the same request seen again after a lagging read
    again = _row("t", replace(WAITING, pending=_pending(qid="q2")))
    assert watch.rows_seen([again], complete=True) == [again]
    died = _row("t", CRASHED, lease=_stale("r2"))
    assert watch.rows_seen([died, died], complete=True) == [died]


def test_a_crash_alerts_only_when_a_lease_went_stale() -> None:
    assert alert_key(_row("c", CRASHED)) is None  # no lease (cubeloop): every tool call in flight reads so
    assert alert_key(_row("c", CRASHED, lease=_stale())) is not None
    live = LeaseView(LeaseState.RUNNING_ELSEWHERE, _stale().lease)
    assert alert_key(_row("c", CRASHED, lease=live, elsewhere=True)) is None


def test_the_panel_says_how_long_it_waited_and_when_the_asker_gives_up() -> None:
    assert [waited_words(s) for s in (2, 12, 250, 3900, 7200, 200_000)] == [
        "just now",
        "12 s",
        "4 min",
        "1 h 5 min",
        "2 h",
        "2 d",
    ]
    text = describe_request(_pending(timeout=600), now=NOW).plain
    assert text.startswith("Waiting for you: yes or no?  · asked 1 min ago · gives up in 8 min")
    assert "Ship it?" in text and text.endswith("y: answer it")
    late = describe_request(_pending(timeout=60), now=NOW).plain
    assert "its time limit has passed" in late
    answered = describe_request(_pending(), answer_json="true", now=NOW).plain
    assert answered.startswith("Answered, not applied yet") and "answer: true" in answered
    # The store's flag alone says it too, before the answer's text is read.
    flagged = dataclasses.replace(_pending(timeout=60), answered=True)
    text = describe_request(flagged, now=NOW).plain
    assert text.startswith("Answered, not applied yet") and "answer:" not in text and "y: answer it" not in text
    assert "time limit" not in text and "r resumes it" in text


def test_a_request_this_version_cannot_read_is_said_in_one_sentence() -> None:
    text = describe_request(PendingRequest('{"payload": {"kind": "poll"}}'), now=time.time()).plain
    assert text.startswith("A pending request  The pending request cannot be read by this version (")
