"""The checkpointer contract: how a thread's messages and runs are stored.

Every backend (memory, SQLite, Postgres, Redis) implements :class:`Checkpointer` and
passes the one contract suite in ``tests/core/checkpoint/test_contract.py``.

Invariants every backend keeps:

* append-only: messages are never rewritten or deleted;
* ``load`` returns messages in append order (the store's own sequence, never timestamps);
* ``load`` is idempotent and returns fresh objects: callers never share mutable state
  with the store (copies in, copies out);
* ``save_extra`` merges key by key, atomically (no read-modify-write race between
  processes);
* a row that cannot be decoded is never dropped or changed: ``load`` reports it in
  ``CheckpointData.problems`` and the rest of the thread still loads.

Fenced writes. Every write a run makes (``append``, ``claim_run``,
``mark_run_complete``, ``record_tool_event``, ``job_begin``, ``job_finish``) takes an
optional keyword ``holder_id``. Given, the store checks inside the write's own
transaction (SQLite: the same ``BEGIN IMMEDIATE``; memory: under its lock) that the
thread's lease is held by that holder and has not expired (:func:`check_lease_holder`);
otherwise it raises ``LeaseLostError`` and writes nothing. Time a write spent waiting for
another program's write lock does not count against the lease: nobody can take a lease
over while the file is locked, and a takeover after the lock would have put another
holder in the row (:func:`lock_wait_credit`). So a runner that lost its
lease - its event loop blocked past the lease's expiry, say, while another process took
the thread over - can never write after the new holder. Without ``holder_id`` the write
is unfenced (cubeloop's ``append(thread_id, messages)``); a store that keeps no leases
(cubeloop's) is never given one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from core.errors import (
    CommandTransitionError,
    ConflictError,
    CorruptRecordError,
    LeaseLostError,
    RunAlreadyClaimedError,
    RunAlreadyCompletedError,
    RunNotClaimedError,
    ThreadNotFoundError,
)
from core.messages import AnyMessage
from core.owners import UNOWNED
from core.untrusted import holds_control


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of a thread: claimed when it starts, completed only when it finished cleanly.

    Times are unix seconds. ``completion_seq`` orders completed runs within a thread
    (1, 2, ...), as cubeloop numbers them.
    """

    run_id: str
    claimed_at: float | None
    completed_at: float | None = None
    completion_seq: int | None = None
    revision: int = 1
    """1 when claimed, 2 once completed; cubeloop's rows (which keep none) read as either."""

    @property
    def completed(self) -> bool:
        """Whether the run was marked complete."""
        return self.completed_at is not None


@dataclass(frozen=True, slots=True)
class CorruptRow:
    """A stored row that could not be decoded: where it is, why, and its raw text (kept as is)."""

    row_id: Any
    reason: str
    raw: str


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A human request a run is waiting on (cubeloop's HITL, table ``thread_pending_request``).

    ``request_json`` is the row as cubeloop wrote it (``HitlRequest.model_dump_json()``:
    ``question_id``, ``thread_id``, ``payload`` of kind ``confirm`` / ``approve`` /
    ``ask``, ``created_at``), kept as is and never rewritten here; ``run_id`` the run that
    asked; ``created_at`` unix seconds (``None`` if unknown); ``answered`` whether the
    store holds the answer to this request (its run and question id in
    ``thread_hitl_answers``), read in the same query as the request itself: an answer
    recorded that the run has not applied yet (applying it settles the request, and the
    request and its answer go together).
    """

    request_json: str
    run_id: str | None = None
    created_at: float | None = None
    answered: bool = False

    @property
    def question(self) -> str:
        """The question for people, from the payload: a confirm's prompt, "approve TOOL
        (CALL ID)?", an ask's prompts joined with " / "; text that is not such a
        request reads "(a request this version cannot read)"."""
        try:
            payload = json.loads(self.request_json)["payload"]
            kind = payload["kind"]
            if kind == "confirm":
                return str(payload["prompt"])
            if kind == "approve":
                return f"approve {payload['tool_name']} ({payload['tool_call_id']})?"
            if kind == "ask":
                return " / ".join(str(q["prompt"]) for q in payload["questions"])
        except (ValueError, KeyError, TypeError):
            pass
        return "(a request this version cannot read)"


@dataclass(slots=True)
class CheckpointData:
    """Everything stored for one thread.

    ``messages`` are in append order; ``extra`` is the merged extra JSON object;
    ``runs`` are in claim order; ``problems`` lists undecodable rows (empty when sound).
    ``message_ids`` gives each message's store sequence id (same length as ``messages``).
    """

    messages: list[AnyMessage] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    problems: list[CorruptRow] = field(default_factory=list)
    message_ids: list[Any] = field(default_factory=list)
    parent_thread_id: str | None = None
    journal: dict[str, JournalEntry] | None = None
    """Tool journal by tool call id; ``None`` when the store keeps none (cubeloop files)."""
    pending_request: PendingRequest | None = None
    """The human request the thread waits on, if any."""
    extra_revision: int = 0
    """The revision of ``extra``: 0 before any ``save_extra`` of ours, then one more per
    ``save_extra`` (cubeloop's own ``save_extra`` does not count: it keeps no revision)."""
    meta: ThreadMeta | None = None
    """The thread's owner and fingerprints record; ``None`` when it has none (cubeloop's)."""


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One line of the thread picker, read without loading the whole thread.

    ``message_count`` counts rows; ``last_activity`` is unix seconds of the newest row or
    claim (``None`` if unknown); ``tail`` holds the last assistant message and every
    message after it (or all messages if there is no assistant message) - exactly what
    :func:`core.recovery.diagnose` needs; ``problems`` are undecodable rows in the tail;
    ``first_prompt`` the first user message's text as one line
    (:func:`core.checkpoint.listing.prompt_line`, ``""`` for none). A listing is in
    :func:`core.checkpoint.listing.in_listing_order`.
    """

    thread_id: str
    message_count: int
    last_activity: float | None
    runs: tuple[RunRecord, ...] = ()
    tail: tuple[AnyMessage, ...] = ()
    problems: tuple[CorruptRow, ...] = ()
    first_prompt: str = ""
    lease: Lease | None = None
    """The thread's lease record (live or expired), ``None`` if none or the store keeps none."""
    pending_request: PendingRequest | None = None
    """The human request the thread waits on, if any."""


@runtime_checkable
class Checkpointer(Protocol):
    """Storage of threads. All methods are coroutines and safe to call concurrently.

    Errors: ``DatabaseOpenError`` when the store cannot be reached or opened,
    ``ReadOnlyStoreError`` for a write on a browse-only store, ``StoreBusyError`` when
    another process holds a lock past every retry. No method raises for an unknown
    thread except where stated: unknown threads load as ``None`` and list as absent.
    """

    async def load(self, thread_id: str) -> CheckpointData | None:
        """Return the thread's data, or ``None`` if it has no messages, extra or runs."""
        ...

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """Append ``messages`` in order, in one transaction, each tagged with its ``run_id``.

        Raises ``RunAlreadyCompletedError`` if a message names a run already completed,
        and ``LeaseLostError`` when ``holder_id`` is given and does not hold the thread's
        live lease (see "Fenced writes" above; nothing is appended then).
        """
        ...

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        """Merge ``extra`` into the thread's extra object key by key, atomically."""
        ...

    async def list_threads(self) -> list[ThreadSummary]:
        """Every thread in the store, most recently active first."""
        ...

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """Record that ``run_id`` started on ``thread_id``.

        Raises ``RunAlreadyClaimedError`` if that run id is already claimed and not
        completed, ``RunAlreadyCompletedError`` if it completed, ``LeaseLostError`` as
        for ``append`` when fenced by ``holder_id``.
        """
        ...

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """Mark ``run_id`` completed and give it the next ``completion_seq``; idempotent.

        Raises ``RunNotClaimedError`` if the run was never claimed, ``LeaseLostError`` as
        for ``append`` when fenced by ``holder_id``.
        """
        ...

    async def close(self) -> None:
        """Release connections; the object is unusable afterwards."""
        ...


def run_taken(thread_id: str, run_id: str, *, completed: bool) -> RunAlreadyClaimedError | RunAlreadyCompletedError:
    """``claim_run``'s refusal of a run id the thread already has: ``RunAlreadyCompletedError``
    when that run ``completed``, else ``RunAlreadyClaimedError`` (it is still running)."""
    if completed:
        return RunAlreadyCompletedError(f"Run {run_id} of thread {thread_id!r} already completed.")
    return RunAlreadyClaimedError(f"Run {run_id} of thread {thread_id!r} is already running.")


def run_never_claimed(thread_id: str, run_id: str) -> RunNotClaimedError:
    """``mark_run_complete``'s refusal of a run id the thread never claimed."""
    return RunNotClaimedError(f"Run {run_id} of thread {thread_id!r} was never claimed.")


def run_completed_append(thread_id: str, run_id: str) -> RunAlreadyCompletedError:
    """``append``'s refusal of messages naming ``run_id``, a run that already completed; nothing was appended."""
    return RunAlreadyCompletedError(
        f"Run {run_id} of thread {thread_id!r} is already completed, so nothing was appended."
    )


def parse_extra(
    raw: str | bytes | None, thread_id: str, row_id: str = "extra"
) -> tuple[dict[str, Any], CorruptRow | None]:
    """A thread's stored extra JSON text (``None`` or empty: none) as ``(object, None)``; text
    that is not a JSON object gives ``({}, CorruptRow(row_id, reason, the text shown raw))``
    instead of raising (``row_id``: how the backend names the row). Every backend's ``load``
    and ``save_extra`` read the extra through it."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value, None
    reason = f"The extra data of thread {thread_id!r} is not a JSON object; it is shown raw and left unchanged."
    return {}, CorruptRow(row_id, reason, _shown(raw))


def extra_not_object(thread_id: str, row_id: str = "extra") -> CorruptRecordError:
    """``save_extra``'s refusal to merge into a stored extra that is not a JSON object (see
    :func:`parse_extra`): it is left unchanged and nothing is saved."""
    return CorruptRecordError(
        f"The extra data of thread {thread_id!r} is not a JSON object, so it was left"
        " unchanged and the new keys were not saved.",
        thread_id=thread_id,
        row_id=row_id,
    )


def _shown(raw: str | bytes | None) -> str:
    """Stored text as it is shown in a ``CorruptRow``: bytes that are not UTF-8 kept as lone surrogates."""
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)


# --- tool journal, jobs, leases, live events, commands ------------------------------------
# Records our own tables keep beside cubeloop's. A store opened on a file without them
# (cubeloop's, browse-only) returns None / empty from the readers and raises
# ReadOnlyStoreError from the writers.


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """The tool journal's record of one tool call: when it started and ended (unix seconds).

    Written at ``tool_execution_start`` and ``tool_execution_end``, so a diagnosis can say
    "started 12:03:10, never finished" or "never started" instead of guessing.
    """

    tool_call_id: str
    tool_name: str = ""
    run_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    job_key: str | None = None


JobStatus = Literal["started", "done", "failed"]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One idempotent job: ``key`` -> status, JSON ``result`` (when done), times in unix seconds.

    ``attempts`` counts how many times the work was started under this key.
    """

    key: str
    status: JobStatus
    result: Any = None
    tool_call_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 1
    revision: int = 1
    """One more per write of this record (begin, each retry's begin, finish)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who runs a thread right now: a holder (one process or app instance) until ``expires_at``.

    ``holder_id`` is unique per holder (uuid hex); ``pid`` and ``host`` say where it runs;
    times are unix seconds. The holder renews (heartbeats) before expiry; a lease past
    ``expires_at`` whose run did not complete means the holder crashed.
    """

    thread_id: str
    holder_id: str
    pid: int
    host: str
    run_id: str | None
    acquired_at: float
    heartbeat_at: float
    expires_at: float
    revision: int = 1
    """One more per write of this lease row (acquire, takeover, renew); a new row starts at 1."""


CommandKind = Literal["abort", "steer", "follow_up", "stop", "interrupt", "note"]
CommandStatus = Literal["pending", "delivered", "applied", "refused", "discarded"]

COMMAND_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"delivered", "applied", "refused", "discarded"}),
    "delivered": frozenset({"delivered", "applied", "refused", "discarded"}),
    "applied": frozenset(),
    "refused": frozenset(),
    "discarded": frozenset(),
}
"""Current status -> the statuses ``update_command`` may move a command to.

How supervision uses them (:mod:`core.supervisor`, :mod:`core.commands`): a runner marks a command ``delivered`` when it hands
it to its agent (again, ``delivered`` -> ``delivered``, when a resumed run takes over
what a crashed runner had delivered), ``applied`` once it took effect (an abort stopped
the run; a steer's message was persisted - also found after a crash, and possible
straight from ``pending`` when writing ``delivered`` failed), ``refused`` when it came
too late; the user ``discarded`` an undelivered one. ``applied``, ``refused`` and
``discarded`` are final, and nothing returns to ``pending``: so a discard from one
window is never overwritten by a runner in another.
"""


COMMAND_KINDS: frozenset[str] = frozenset({"abort", "steer", "follow_up", "stop", "interrupt", "note"})
"""Every ``CommandKind``, for the check each backend makes before it writes a command.

``stop``: stop after this turn (no text); ``interrupt``: abort the running tools, then
deliver its text as a steer; ``note``: a passive note (``Agent.stop_after_turn``,
``interrupt``, ``note``). The ``kind`` column is plain text in every backend and cubeloop
never reads our command table, so the new kinds need no schema change. A cubepi runner
older than them takes a note or an interrupt as a follow-up and refuses a stop (it has no
text), so mixing versions loses nothing but the new meaning."""

TEXTLESS_KINDS: frozenset[str] = frozenset({"abort", "stop"})
"""The kinds that carry no text: the others are messages for the agent (queued, editable)."""

COMMAND_STATUSES: frozenset[str] = frozenset(COMMAND_TRANSITIONS)
"""Every ``CommandStatus``."""


def check_command_kind(kind: str) -> None:
    """Raise ``ValueError`` unless ``kind`` is a ``CommandKind``; every backend's ``send_command`` calls it."""
    if kind not in COMMAND_KINDS:
        raise ValueError(f"A command is one of {', '.join(sorted(COMMAND_KINDS))}, not {kind!r}.")


def check_command_status(status: str) -> None:
    """Raise ``ValueError`` unless ``status`` is a ``CommandStatus``; every backend's ``update_command`` calls it."""
    if status not in COMMAND_STATUSES:
        raise ValueError(f"A command status is one of {', '.join(sorted(COMMAND_STATUSES))}, not {status!r}.")


def check_tool_phase(phase: str) -> None:
    """Raise ``ValueError`` unless ``phase`` is ``start`` or ``end``; every backend's
    ``record_tool_event`` calls it before it writes."""
    if phase not in ("start", "end"):
        raise ValueError(f"A tool event's phase is 'start' or 'end', not {phase!r}.")


def encode_job_result(key: str, status: str, result: Any) -> str:
    """The JSON text of job ``key``'s ``result``, once ``status`` is checked; every backend's
    ``job_finish`` calls it before it writes. Raises ``ValueError`` unless ``status`` is
    ``done`` or ``failed``, ``TypeError`` (one sentence) for a result JSON cannot hold."""
    if status not in ("done", "failed"):
        raise ValueError(f"A job can finish as 'done' or 'failed', not {status!r}.")
    try:
        return json.dumps(result, separators=(",", ":"))
    except (TypeError, ValueError):
        raise TypeError(
            f"The result of job {key!r} cannot be stored: it is not JSON ({type(result).__name__})."
        ) from None


def command_sources(status: str) -> tuple[str, ...]:
    """The statuses a command may move to ``status`` from (see :data:`COMMAND_TRANSITIONS`), sorted."""
    return tuple(sorted(old for old, targets in COMMAND_TRANSITIONS.items() if status in targets))


def check_command_move(current: Command, status: str) -> None:
    """Raise ``CommandTransitionError`` (``command=current``) unless ``current`` may move to
    ``status`` (see :data:`COMMAND_TRANSITIONS`); each backend calls it in the update's transaction."""
    if status not in COMMAND_TRANSITIONS.get(current.status, frozenset()):
        raise CommandTransitionError(
            f"Command {current.seq} is already {current.status}, so it was not marked {status}.", command=current
        )


EDITABLE_STATUS = "pending"
"""The one status in which a command's text may still be changed (``edit_command``): once its
runner marked it ``delivered`` the agent may have read it, so the text is what was sent."""


def check_command_edit(current: Command) -> None:
    """Raise ``CommandTransitionError`` (``command=current``) unless ``current`` is still
    :data:`EDITABLE_STATUS`; each backend calls it in ``edit_command``'s transaction."""
    if current.status != EDITABLE_STATUS:
        raise CommandTransitionError(
            f"Command {current.seq} is already {current.status}, so its text was not changed.", command=current
        )


@dataclass(frozen=True, slots=True)
class Command:
    """A command to a thread's runner, kept durably: the outbox of steers and follow-ups.

    ``seq`` orders commands in the store; ``status`` moves pending -> delivered (its run
    took it: see :mod:`core.supervisor`) -> applied (it took effect), or to refused (with
    ``note``) or discarded (the user dropped it); see :data:`COMMAND_TRANSITIONS`. Times
    are unix seconds.
    """

    seq: int
    thread_id: str
    kind: CommandKind
    text: str
    status: CommandStatus
    created_at: float
    updated_at: float
    note: str = ""
    revision: int = 1
    """1 when sent, one more per ``update_command`` or ``edit_command``."""


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One entry of a thread's bounded live-event log (text deltas, tool progress, ...).

    ``seq`` increases per store; ``data`` is a JSON object whose ``type`` names the
    lifecycle event it summarises; ``at`` is unix seconds.
    """

    seq: int
    thread_id: str
    run_id: str | None
    data: dict[str, Any]
    at: float


def live_event_data(text: str) -> dict[str, Any]:
    """A stored live event's JSON text as its ``data``; text that is not a JSON object reads
    ``{"type": "unreadable", "raw": text}`` (kept and shown, never dropped)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"type": "unreadable", "raw": text}


def check_lease_holder(
    lease: Lease | None, thread_id: str, holder_id: str, now: float, *, locked_since: float | None = None
) -> None:
    """The fence of every fenced write: raise ``LeaseLostError`` unless ``lease`` (the
    thread's lease record, or ``None``) is held by ``holder_id`` and still valid at
    ``now`` (unix seconds), or expired only while the store waited for another program's
    write lock (``locked_since``, see :func:`lock_wait_credit`). Each backend calls it
    inside the write's own transaction."""
    if (
        lease is not None
        and lease.holder_id == holder_id
        and (lease.expires_at > now or lock_wait_credit(lease, now, locked_since) > 0)
    ):
        return
    if lease is None:
        why = "nobody holds it now"
    elif lease.holder_id != holder_id:
        why = f"process {lease.pid} on {lease.host} took the thread over"
    else:
        why = "it expired without a heartbeat"
    raise LeaseLostError(
        f"This run no longer holds the lease on thread {thread_id!r} ({why}), so nothing was written.", why=why
    )


def lock_wait_credit(lease: Lease, now: float, locked_since: float | None) -> float:
    """Seconds by which a fenced write moves ``lease``'s times on because it expired while
    the database was locked by another program; ``0.0`` when there is nothing to give back.

    ``locked_since`` (unix seconds, or ``None`` when no wait is known) is when the store
    began finding the database locked, until this write got through at ``now``. A lease
    that still had time left then (``expires_at > locked_since``) but expired by ``now``
    gets that wait back, so it keeps the time it had left when the lock began: while the
    file was locked nobody could take the lease over, and a takeover would have replaced
    its holder, which the fence refuses. A lease already expired before the wait began,
    or one still valid at ``now``, gets nothing. The store writes the moved times in the
    same transaction, so the run's next writes see a live lease until its heartbeat renews
    it (as :meth:`SupervisedStore.acquire_lease` and ``renew_lease`` move theirs by their wait).
    """
    if locked_since is None or lease.expires_at > now or lease.expires_at <= locked_since:
        return 0.0
    return now - locked_since


def lease_held(lease: Lease, now: float | None = None) -> RunAlreadyClaimedError:
    """The one error for a thread whose live ``lease`` is someone else's: what ``acquire_lease``
    raises (``lease`` the current holder's) and ``delete_thread`` (see
    :func:`check_deletable`). The sentence is "Thread X is already running (holder pid P on
    HOST, heartbeat Ns ago)." with the heartbeat's age at ``now`` (unix seconds; default the
    clock); the error carries ``lease``."""
    ago = max(0.0, (time.time() if now is None else now) - lease.heartbeat_at)
    return RunAlreadyClaimedError(
        f"Thread {lease.thread_id} is already running "
        f"(holder pid {lease.pid} on {lease.host}, heartbeat {ago:.0f}s ago).",
        lease=lease,
    )


def not_deleted_sentence(
    thread_id: str, lease: Lease | None = None, *, now: float | None = None, here: bool = False
) -> str:
    """The one sentence for a thread that was not deleted because a run holds it - the
    same in the app, the runner and the library (every backend's ``delete_thread``: :func:`check_deletable`, :func:`deletion_refused`): ``"Thread 'd' was
    not deleted: process 4242 on box is running it (heartbeat 0 s ago)."`` for another
    process's live ``lease`` (heartbeat age at ``now``, unix seconds, default the clock),
    ``"... this app is running it; abort it first."`` when ``here``, and a sentence without
    a holder when the lease is unknown. The host comes from the store: callers show the
    sentence as untrusted text."""
    if here:
        return f"Thread {thread_id!r} was not deleted: this app is running it; abort it first."
    if lease is None:
        return f"Thread {thread_id!r} was not deleted: a run is holding it; wait for that run to end or abort it."
    ago = max(0.0, (time.time() if now is None else now) - lease.heartbeat_at)
    return (
        f"Thread {thread_id!r} was not deleted: process {lease.pid} on {lease.host} is running it "
        f"(heartbeat {ago:.0f} s ago)."
    )


def check_deletable(lease: Lease | None, now: float) -> None:
    """``delete_thread``'s refusal, made inside its transaction once the thread is known to be
    the owner's: raise ``RunAlreadyClaimedError`` (carrying ``lease``) with
    :func:`not_deleted_sentence` while ``lease`` (the thread's lease record, or ``None``) is
    live at ``now`` (unix seconds: ``expires_at`` after it); nothing is deleted."""
    if lease is not None and lease.expires_at > now:
        raise deletion_refused(lease, now)


def deletion_refused(lease: Lease, now: float | None = None) -> RunAlreadyClaimedError:
    """The error of a ``delete_thread`` refused because ``lease`` is live: its sentence is
    :func:`not_deleted_sentence` (heartbeat age at ``now``, unix seconds, default the clock),
    and it carries ``lease``. For a backend whose own script decided the lease is live (Redis)."""
    return RunAlreadyClaimedError(not_deleted_sentence(lease.thread_id, lease, now=now), lease=lease)


# --- owners, revisions, fingerprints, tool steps ------------------------------------------
# The design follows a lesson on resuming interrupted agents (a small, strict checkpoint
# store): rows carry an owner, the input's sha256 fingerprint, a workflow version, the next
# step, a revision and JSON data; reads filter by id *and* owner in the query; an update is
# one ``UPDATE ... WHERE revision = ?`` whose row count must be 1, inside one transaction.


def thread_unavailable(thread_id: str, owner: str) -> ThreadNotFoundError:
    """The one error for a thread that is missing *or* another owner's, as seen by ``owner``
    (:data:`core.owners.UNOWNED` for the unowned scope). Every backend and every caller that
    needs the thread to exist raises this, so the two cases read the same sentence."""
    from core.owners import owner_label

    return ThreadNotFoundError(f"Thread {thread_id!r} is unavailable: owner {owner_label(owner)} has no such thread.")


def check_new_thread_id(thread_id: str) -> str:
    """Return ``thread_id`` when a new thread may be given it; raise ``ValueError`` (one
    sentence) when it holds a control or format character (:func:`core.untrusted.holds_control`,
    the rule of owner names and workflow versions: an id is stored and shown). Only an id
    that would start a thread is checked: one already stored (cubeloop takes any id) still
    loads, runs and deletes."""
    if holds_control(thread_id):
        raise ValueError(f"The thread id {thread_id!r} holds a control character.")
    return thread_id


def revision_conflict(thread_id: str, record: str, expected: int | None, actual: int | None) -> ConflictError:
    """The one error of a compare-and-set write that found ``actual`` where it expected
    ``expected`` (``None``: no such record) for ``record`` of ``thread_id``; nothing was written."""

    def shown(revision: int | None) -> str:
        return "none" if revision is None else f"revision {revision}"

    return ConflictError(
        f"The {record} of thread {thread_id!r} changed under this write: it expected {shown(expected)}, "
        f"the store has {shown(actual)}; nothing was written.",
        thread_id=thread_id,
        record=record,
        expected=expected,
        actual=actual,
    )


def input_conflict(thread_id: str, record: str) -> ConflictError:
    """The error for creating ``record`` of ``thread_id`` again with the same key but another
    input or workflow (the lesson's "same run requires same input and workflow")."""
    return ConflictError(
        f"The {record} of thread {thread_id!r} already exists with another input or workflow: "
        "the same run requires the same input and workflow; nothing was written.",
        thread_id=thread_id,
        record=record,
    )


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """What a thread was started with, to compare with what would continue it.

    ``input`` is the sha256 hex of the thread's first input (see
    :func:`core.fingerprints.input_fingerprint`); ``agent`` the sha256 hex of the agent's
    definition; ``parts`` that definition by part, so a change can be named: ``"model"`` ->
    the model id as is, ``"system_prompt"`` -> its sha256 hex, ``"tool:NAME"`` -> the sha256
    hex of the tool's parameter schema; ``workflow`` the user-given workflow version (``None``
    when none was given).
    """

    input: str | None
    agent: str
    parts: dict[str, str]
    workflow: str | None = None


@dataclass(frozen=True, slots=True)
class FingerprintOverride:
    """One explicit "go on anyway": when (unix seconds), by which owner, over which changes."""

    at: float
    owner: str
    changes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ThreadMeta:
    """A thread's own record beside cubeloop's tables: its owner and fingerprints.

    ``owner`` is :data:`core.owners.UNOWNED` for a thread that records none; ``created_at``
    unix seconds; ``revision`` counts writes of ``fingerprints``/``overrides`` (0 when none
    was recorded yet); ``overrides`` in the order they were made.
    """

    thread_id: str
    owner: str
    created_at: float | None = None
    revision: int = 0
    fingerprints: Fingerprints | None = None
    overrides: tuple[FingerprintOverride, ...] = ()


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A stepped tool's committed progress (the lesson's run row), keyed by the call's job key.

    ``next_step`` is the number of steps committed (0 before the first; the tool's next step
    to run is ``next_step + 1``); ``total_steps`` how many it declared (``None`` if unknown);
    ``revision`` one more per commit (0 at begin); ``data`` the JSON value the last step
    committed; ``input_fingerprint`` the sha256 hex of the call's arguments and ``workflow``
    the tool's workflow version, both fixed at begin; ``updated_at`` unix seconds of the
    last commit (or the begin).
    """

    thread_id: str
    key: str
    input_fingerprint: str
    workflow: str
    next_step: int = 0
    total_steps: int | None = None
    revision: int = 0
    data: Any = None
    tool_call_id: str | None = None
    updated_at: float = 0.0


def step_record_name(key: str) -> str:
    """How a :class:`ConflictError` names the step record of job ``key`` (``record``): ``"step KEY"``."""
    return f"step {key}"


def command_record_name(seq: int) -> str:
    """How a :class:`ConflictError` names command ``seq`` (``record``): ``"command SEQ"``."""
    return f"command {seq}"


EXTRA_RECORD = "extra"
"""How a :class:`ConflictError` names a thread's extra object (``record``)."""

FINGERPRINTS_RECORD = "fingerprints"
"""How a :class:`ConflictError` names a thread's fingerprints record (``record``)."""


def no_such_command(seq: int) -> KeyError:
    """The ``KeyError`` of ``update_command`` for a ``seq`` that names no command *or* a command
    of a thread this store's owner cannot see: one sentence for both."""
    return KeyError(f"There is no command {seq}.")


def step_never_begun(thread_id: str, key: str) -> KeyError:
    """The ``KeyError`` of ``step_commit`` for job ``key``'s step record that was never begun."""
    return KeyError(f"The step record of job {key!r} of thread {thread_id!r} was never begun.")


def encode_step_data(key: str, data: Any) -> str:
    """The JSON text of a step's ``data`` for job ``key``; every backend's ``step_commit`` calls
    it before it writes. Raises ``TypeError`` (one sentence) for data JSON cannot hold
    (including NaN and infinities, which JSON has no words for)."""
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(
            f"The step data of job {key!r} cannot be stored: it is not JSON ({type(data).__name__})."
        ) from None


def check_step_input(record: StepRecord, input_fingerprint: str, workflow: str) -> None:
    """``step_begin``'s check of the step record it found (or just made) for the call: raise
    :func:`input_conflict` (the lesson's "same run requires same input and workflow") unless
    ``record`` was begun with this ``input_fingerprint`` and ``workflow``."""
    if record.input_fingerprint != input_fingerprint or record.workflow != workflow:
        raise input_conflict(record.thread_id, step_record_name(record.key))


def step_refusal(thread_id: str, key: str, current: StepRecord | None, workflow: str, expected: int) -> Exception:
    """Why ``step_commit`` of job ``key`` at revision ``expected`` under ``workflow`` writes
    nothing, from the record as the store has it (``current``, ``None`` if never begun):
    :func:`step_never_begun` (a ``KeyError``), else :func:`input_conflict` for another
    workflow (reported before a stale revision), else :func:`revision_conflict` with both
    revisions. Only for a ``current`` that does refuse the commit."""
    if current is None:
        return step_never_begun(thread_id, key)
    if current.workflow != workflow:
        return input_conflict(thread_id, step_record_name(key))
    return revision_conflict(thread_id, step_record_name(key), expected, current.revision)


# --- the fingerprints record's JSON, as every backend stores it ---------------------------

RECORD_ROW = "record"
"""The ``row_id`` naming a thread's unreadable fingerprints record: of the
``CorruptRecordError`` that ``load_meta`` raises and of the ``CorruptRow`` that ``load`` reports."""

_COMPACT = (",", ":")
_SPACED = (", ", ": ")


def encode_fingerprints(fingerprints: Fingerprints, *, spaced: bool = False) -> str:
    """The JSON text a store keeps for ``fingerprints``: an object of ``input``, ``agent``,
    ``parts`` and ``workflow``, in that order, non-ASCII written as ``\\uXXXX`` escapes;
    compact, or with ``spaced`` the separators ``", "`` and ``": "`` (what the Postgres store
    has always written to its column, kept byte for byte). Read back by :func:`decode_thread_meta`."""
    value = {
        "input": fingerprints.input,
        "agent": fingerprints.agent,
        "parts": dict(fingerprints.parts),
        "workflow": fingerprints.workflow,
    }
    return json.dumps(value, separators=_SPACED if spaced else _COMPACT)


def encode_override(override: FingerprintOverride, *, spaced: bool = False) -> str:
    """The JSON text of one override, an element of the stored overrides array: an object of
    ``at``, ``owner`` and ``changes`` (a list), in that order; ``spaced`` as for
    :func:`encode_fingerprints`."""
    return json.dumps(_override_value(override), separators=_SPACED if spaced else _COMPACT)


def encode_overrides(overrides: Sequence[FingerprintOverride], *, spaced: bool = False) -> str:
    """The JSON array of ``overrides`` in the order they were made (each element as
    :func:`encode_override` writes it; ``"[]"`` for none)."""
    return json.dumps([_override_value(o) for o in overrides], separators=_SPACED if spaced else _COMPACT)


def _override_value(override: FingerprintOverride) -> dict[str, Any]:
    return {"at": override.at, "owner": override.owner, "changes": list(override.changes)}


class _Unreadable(Exception):
    """A part of a stored record that is not what the encoders above write (``raw``: its text)."""

    def __init__(self, raw: str | bytes | None) -> None:
        super().__init__()
        self.raw = raw


def _decoded(
    fingerprints: str | bytes | None, overrides: str | bytes | None
) -> tuple[Fingerprints | None, tuple[FingerprintOverride, ...]]:
    """The two JSON texts of a record, read; raises ``_Unreadable`` with the one that is not ours."""
    try:
        found = None
        if fingerprints is not None:
            f = json.loads(fingerprints)
            found = Fingerprints(input=f["input"], agent=f["agent"], parts=dict(f["parts"]), workflow=f.get("workflow"))
    except (ValueError, KeyError, TypeError):
        raise _Unreadable(fingerprints) from None
    try:
        made = tuple(
            FingerprintOverride(at=float(o["at"]), owner=str(o["owner"]), changes=tuple(o["changes"]))
            for o in json.loads("[]" if overrides is None else overrides)
        )
    except (ValueError, KeyError, TypeError):
        raise _Unreadable(overrides) from None
    return found, made


def decode_thread_meta(
    thread_id: str,
    owner: str | None,
    created_at: float | None,
    revision: int,
    fingerprints: str | bytes | None,
    overrides: str | bytes | None,
) -> ThreadMeta:
    """A thread's record from what a store keeps of it: ``owner`` (``None`` or ``""``:
    unowned), ``created_at`` (unix seconds, ``None`` if unknown), ``revision``, the JSON text
    :func:`encode_fingerprints` wrote (``None``: none recorded yet) and the array
    :func:`encode_overrides` wrote (``None``: none made), as ``str`` or ``bytes``. Raises
    ``CorruptRecordError`` (one sentence, ``row_id`` :data:`RECORD_ROW`) when either text is
    not what those write; the stored text is left as it is. What ``load_meta`` and a write's
    returned record use."""
    try:
        found, made = _decoded(fingerprints, overrides)
    except _Unreadable as part:
        # The part's text rides along as the cause, for load_thread_meta to show.
        raise CorruptRecordError(
            f"The fingerprints record of thread {thread_id!r} cannot be read; it was left as it is.",
            thread_id=thread_id,
            row_id=RECORD_ROW,
        ) from part
    return ThreadMeta(thread_id, owner or UNOWNED, created_at, revision, found, made)


def load_thread_meta(thread_id: str, *stored: Any) -> tuple[ThreadMeta | None, CorruptRow | None]:
    """:func:`decode_thread_meta` (``stored``: its arguments after ``thread_id``) for ``load``,
    which reports an unreadable record instead of raising, so the rest of the thread still
    loads: ``(record, None)``, or ``(None, CorruptRow(RECORD_ROW, the sentence, the
    unreadable text))`` (bytes that are not UTF-8 kept as lone surrogates)."""
    try:
        return decode_thread_meta(thread_id, *stored), None
    except CorruptRecordError as error:
        raw = error.__cause__.raw if isinstance(error.__cause__, _Unreadable) else None
        return None, CorruptRow(RECORD_ROW, str(error), _shown(raw))
