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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from core.errors import CommandTransitionError, LeaseLostError
from core.messages import AnyMessage


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
    asked; ``created_at`` unix seconds (``None`` if unknown).
    """

    request_json: str
    run_id: str | None = None
    created_at: float | None = None

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


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One line of the thread picker, read without loading the whole thread.

    ``message_count`` counts rows; ``last_activity`` is unix seconds of the newest row or
    claim (``None`` if unknown); ``tail`` holds the last assistant message and every
    message after it (or all messages if there is no assistant message) - exactly what
    :func:`core.recovery.diagnose` needs; ``problems`` are undecodable rows in the tail.
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


@runtime_checkable
class HumanRequests(Protocol):
    """The pending human request of a thread (cubeloop's ``save_pending_request``).

    ``load`` and ``list_threads`` report it in ``pending_request``; this project only
    ever reads it (the program that asked clears it when answered), but a store that
    keeps it can be given one, as cubeloop gives it.
    """

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None
    ) -> None:
        """Set (or with ``None`` clear) the thread's pending request, in one transaction."""
        ...


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


CommandKind = Literal["abort", "steer", "follow_up"]
CommandStatus = Literal["pending", "delivered", "applied", "refused", "discarded"]

COMMAND_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"delivered", "applied", "refused", "discarded"}),
    "delivered": frozenset({"delivered", "applied", "refused", "discarded"}),
    "applied": frozenset(),
    "refused": frozenset(),
    "discarded": frozenset(),
}
"""Current status -> the statuses ``update_command`` may move a command to.

How ``core.supervise`` uses them: a runner marks a command ``delivered`` when it hands
it to its agent (again, ``delivered`` -> ``delivered``, when a resumed run takes over
what a crashed runner had delivered), ``applied`` once it took effect (an abort stopped
the run; a steer's message was persisted - also found after a crash, and possible
straight from ``pending`` when writing ``delivered`` failed), ``refused`` when it came
too late; the user ``discarded`` an undelivered one. ``applied``, ``refused`` and
``discarded`` are final, and nothing returns to ``pending``: so a discard from one
window is never overwritten by a runner in another.
"""


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


@dataclass(frozen=True, slots=True)
class Command:
    """A command to a thread's runner, kept durably: the outbox of steers and follow-ups.

    ``seq`` orders commands in the store; ``status`` moves pending -> delivered (the runner
    read it) -> applied (it took effect), or to refused (with ``note``) or discarded (the
    user dropped it); see :data:`COMMAND_TRANSITIONS`. Times are unix seconds.
    """

    seq: int
    thread_id: str
    kind: CommandKind
    text: str
    status: CommandStatus
    created_at: float
    updated_at: float
    note: str = ""


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


class SupervisedStore(Protocol):
    """What supervision and safe resume need beyond :class:`Checkpointer`.

    Implemented by the memory and SQLite backends (and every later one); tested by the
    same contract suite. Errors as for :class:`Checkpointer`, plus those named below.
    A store that implements this protocol fences the writes of :class:`Checkpointer`
    too (``holder_id=``, see the module docstring).
    """

    # tool journal
    async def record_tool_event(
        self,
        thread_id: str,
        tool_call_id: str,
        phase: Literal["start", "end"],
        *,
        tool_name: str = "",
        run_id: str | None = None,
        job_key: str | None = None,
        at: float | None = None,
        holder_id: str | None = None,
    ) -> None:
        """Journal the start or end of a tool call (``at`` defaults to now, unix seconds).

        Raises ``LeaseLostError`` when fenced by ``holder_id`` and the lease is not its (nothing written)."""
        ...

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """Map tool call id -> entry; ``None`` when the store keeps no journal (a cubeloop file)."""
        ...

    # incremental reads (a follower reads only what is new)
    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """Like ``load``, but ``messages``, ``message_ids`` and the undecodable rows in
        ``problems`` hold only rows whose id is greater than ``after_id`` (a value from
        ``message_ids`` or a ``CorruptRow.row_id``); ``extra``, ``runs`` and ``journal`` are
        whole. Never ``None``: an unknown thread gives empty data. Costs what the new rows
        cost, not the whole thread (a 10,000-message thread is not decoded again)."""
        ...

    # jobs (idempotency keys)
    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """Atomically look up ``key``: if done, return it unchanged (the caller reuses the result);
        otherwise record it as started (insert, or bump ``attempts``) and return that record.
        Raises ``LeaseLostError`` when fenced by ``holder_id`` and the lease is not its (nothing written)."""
        ...

    async def job_finish(
        self,
        thread_id: str,
        key: str,
        status: Literal["done", "failed"],
        result: Any = None,
        *,
        holder_id: str | None = None,
    ) -> None:
        """Record the outcome and JSON ``result`` in one transaction. Raises ``KeyError`` if never
        begun, ``LeaseLostError`` when fenced by ``holder_id`` and the lease is not its (nothing written)."""
        ...

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """The job under ``key``, or ``None``."""
        ...

    # leases
    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """Take the thread's lease for ``lease.holder_id`` atomically and return it.

        Succeeds when no lease exists, the same holder holds it, or ``is_stale(current)``
        is true (expired, or its holder's process is gone). Otherwise raises
        ``RunAlreadyClaimedError`` whose ``lease`` attribute is the current lease.
        """
        ...

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """Heartbeat: extend the holder's lease; ``False`` if it no longer holds it."""
        ...

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """Drop the lease if ``holder_id`` holds it; otherwise do nothing."""
        ...

    async def get_lease(self, thread_id: str) -> Lease | None:
        """The thread's current lease record (live or expired), or ``None``."""
        ...

    async def list_leases(self) -> dict[str, Lease]:
        """Every lease record by thread id (for the picker)."""
        ...

    # live events (bounded log, pruned when a run ends)
    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """Append a batch in one transaction, then keep only the newest ``keep`` for the thread."""
        ...

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """Events with ``seq > after_seq`` in order."""
        ...

    async def prune_live_events(self, thread_id: str) -> None:
        """Delete the thread's live events (called when its run ends)."""
        ...

    # commands (abort / steer / follow-up across processes; the durable outbox)
    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """Queue a command as ``pending`` and return it."""
        ...

    async def update_command(self, seq: int, status: CommandStatus, note: str = "") -> Command:
        """Move a command to ``status`` (with ``note``) and return it, checked and written in
        one transaction (a conditional UPDATE): only the moves in :data:`COMMAND_TRANSITIONS`
        are made. Raises ``CommandTransitionError`` (``command``: the command as stored,
        unchanged) when its current status does not allow the move, e.g. it was discarded
        meanwhile; ``KeyError`` for an unknown ``seq``; ``ValueError`` for an unknown ``status``."""
        ...

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """The thread's commands in ``seq`` order, optionally only those in ``statuses``;
        only those with ``seq > after`` (a follower's high-water mark, so a command sent and
        settled between two looks is still seen)."""
        ...

    async def change_token(self) -> Any:
        """A cheap value that changes whenever any thread's data changes (poll fallback for watchers)."""
        ...


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
