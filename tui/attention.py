"""Which threads need the person at the keyboard, and when the terminal tells them.

One place for the rules the picker, its needs-attention toggle and the bell share:

* **waiting for you**: the thread's pending human request has no answer yet
  (:func:`waiting_for_you`); such rows sort first (:func:`waiting_first`) and read
  :data:`WAITING_WORDS` instead of the diagnosis' "waiting for an answer". Once its answer
  is stored (and until a run applies it) the person's part is done: the row reads
  :data:`ANSWERED_WORDS`, sorts with the others and needs no attention;
* **needs attention** (the picker's ``!``): waiting for you, or crashed, failed or aborted
  and run by nobody now (:func:`needs_attention`);
* **alerts**: when a thread starts waiting for you or its runner dies, :class:`AttentionWatch`
  says so once per request (once per crashed run), never for what was already so when
  the app first listed the store; the app rings the bell and shows the notice as
  :class:`Alerts` allows (``--no-bell``, ``--no-notices``).

No widgets here: the rows come from :mod:`tui.session_rows`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.lease_status import LeaseState
from core.recovery import ANSWERED_WORDS as RECOVERY_ANSWERED
from core.recovery import Diagnosis, ThreadState

if TYPE_CHECKING:
    from tui.session_rows import ThreadRow

WAITING_WORDS = "waiting for you"
"""A picker row's state while its thread waits for an answer nobody gave yet."""

ANSWERED_WORDS = "answered — resume to apply"
"""A picker row's state, and the thread screen's, while its thread's answer is stored and
no run has applied it yet (a run waiting on it applies it at once; else resuming does)."""

ATTENTION_STATES = frozenset({ThreadState.CRASHED, ThreadState.FAILED, ThreadState.ABORTED})
"""The states besides waiting for you that the needs-attention toggle keeps (issue 11, item 2),
when nobody runs the thread."""

NOTICE_CHARS = 80
"""A notice names the question or the crash cut to this many characters."""


def waiting_for_you(diagnosis: Diagnosis) -> bool:
    """Whether ``diagnosis`` is a pending request still to be answered: WAITING with
    nothing to resume (once its answer is stored, resuming applies it and the person's
    part is done)."""
    return diagnosis.state is ThreadState.WAITING and not diagnosis.resumable


def answer_to_apply(diagnosis: Diagnosis) -> bool:
    """Whether ``diagnosis`` is a pending request whose answer is stored, not yet applied."""
    return diagnosis.state is ThreadState.WAITING and diagnosis.answer_stored


def waiting_label(diagnosis: Diagnosis) -> str:
    """``diagnosis.label`` with "waiting for an answer" said as :data:`WAITING_WORDS`
    ("waiting for you: Which file?"); any other label as it is."""
    if not waiting_for_you(diagnosis):
        return diagnosis.label
    return diagnosis.label.replace(ThreadState.WAITING.value, WAITING_WORDS, 1)


def answered_label(diagnosis: Diagnosis) -> str:
    """``diagnosis.label`` with an answered request's "answered" said as
    :data:`ANSWERED_WORDS` ("answered — resume to apply: Which file?"); any other label,
    "waiting for an answer: ..." included, as it is."""
    if not answer_to_apply(diagnosis):
        return diagnosis.label
    return diagnosis.label.replace(RECOVERY_ANSWERED, ANSWERED_WORDS, 1)


def needs_attention(row: ThreadRow) -> bool:
    """Whether the needs-attention toggle keeps ``row``: waiting for you (even while a
    process holds the run, as it waits on you), or in :data:`ATTENTION_STATES` while no
    run is live on it."""
    diagnosis = row.diagnosis
    if waiting_for_you(diagnosis):
        return True
    return not row.running and not row.elsewhere and diagnosis.state in ATTENTION_STATES


def waiting_first(rows: Sequence[ThreadRow]) -> tuple[list[ThreadRow], int]:
    """``rows`` with the threads waiting for you first, each part in its order (most
    recently active first, as listed), and how many wait. One pass over the rows."""
    waiting: list[ThreadRow] = []
    rest: list[ThreadRow] = []
    for row in rows:
        (waiting if waiting_for_you(row.diagnosis) else rest).append(row)
    return (waiting + rest if waiting else rest), len(waiting)


def alert_key(row: ThreadRow) -> str | None:
    """What an alert about ``row`` is about, ``None`` when nothing is: the pending request's
    stored text for a thread waiting for you (one alert per request); for a crash, the run
    whose lease went stale (expired, or its process gone: ``LeaseState.CRASHED``), named by
    the lease's holder and run. Only a stale lease says a runner died: a thread written by
    a program that takes no lease (cubeloop) reads "crashed" at every tool call in flight,
    which must not ring."""
    diagnosis = row.diagnosis
    if waiting_for_you(diagnosis) and diagnosis.pending is not None:
        pending = diagnosis.pending
        return f"waiting\n{pending.run_id}\n{pending.request_json}"
    view = row.lease
    if diagnosis.state is ThreadState.CRASHED and view is not None and view.state is LeaseState.CRASHED:
        lease = view.lease
        return f"crashed\n{lease.holder_id}\n{lease.run_id}" if lease is not None else "crashed"
    return None


def alert_sentence(row: ThreadRow) -> str:
    """The notice for ``row`` (whose :func:`alert_key` is set): "Thread 't1' is waiting for
    you: Which file?" or "Thread 't1' crashed at point 3 (mid-tool) on box (lease expired
    40 s ago); open it to see what resuming does." (store text, cleaned, on one line)."""
    # tui.text imports Rich, and the headless `cubepi-tui run` reaches this module through
    # tui.session without any UI (tests/tui/test_shell.py): imported when a notice is made.
    from tui.text import clean, one_line

    thread = one_line(row.thread_id, 40)
    diagnosis = row.diagnosis
    if waiting_for_you(diagnosis) and diagnosis.pending is not None:
        return f"Thread {thread!r} is {WAITING_WORDS}: {one_line(diagnosis.pending.question, NOTICE_CHARS)}"
    return f"Thread {thread!r} {one_line(clean(row.state), NOTICE_CHARS)}; open it to see what resuming does."


@dataclass(frozen=True, slots=True)
class Alerts:
    """How the terminal tells the person (the session's settings): ``bell`` rings it,
    ``notices`` shows a notice naming the thread. Both on unless switched off
    (``--no-bell``, ``--no-notices``)."""

    bell: bool = True
    notices: bool = True


@dataclass
class AttentionWatch:
    """Decides which rows deserve an alert, from every listing the picker gets.

    The first complete listing is the baseline: what is already waiting or crashed then
    rings nothing. From then on a row alerts when its :func:`alert_key` is one not alerted
    before for that thread, so one request (or one crashed run) alerts once however often
    the listing is read, and a thread that leaves and re-enters the same state (a lagging
    read) does not ring again; a new request, or a later crash, does.
    """

    _ready: bool = False
    _seen: dict[str, set[str]] = field(default_factory=dict)

    def rows_seen(self, rows: Iterable[ThreadRow], *, complete: bool) -> list[ThreadRow]:
        """Note ``rows`` (a listing's rows, or the changed ones among them) and return
        those to alert about, in order. ``complete``: the listing holds every thread (a
        large first listing is handed out in parts; the baseline waits for all of them)."""
        alerts: list[ThreadRow] = []
        for row in rows:
            key = alert_key(row)
            if key is None:
                continue
            seen = self._seen.setdefault(row.thread_id, set())
            if key in seen:
                continue
            seen.add(key)
            if self._ready:
                alerts.append(row)
        if complete:
            self._ready = True
        return alerts
