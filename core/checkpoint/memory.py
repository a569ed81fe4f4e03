"""In-memory checkpointer: the reference implementation of the contract in ``base.py``.

Implements :class:`~core.checkpoint.base.Checkpointer` and
:class:`~core.checkpoint.capabilities.SupervisedStore`. Nothing survives the process. Used by
tests and by programs that need no persistence.

A store is opened for one owner (:mod:`core.owners`); ``MemoryCheckpointer(owner,
shared=other)`` opens another owner's view of the same data (one lock, one counter), which
is how tests put two owners on one store.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from core.checkpoint.base import (
    EXTRA_RECORD,
    FINGERPRINTS_RECORD,
    CheckpointData,
    Command,
    CommandKind,
    CommandStatus,
    FingerprintOverride,
    Fingerprints,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    PendingRequest,
    RunRecord,
    StepRecord,
    ThreadMeta,
    ThreadSummary,
    check_command_edit,
    check_command_kind,
    check_command_move,
    check_command_status,
    check_deletable,
    check_lease_holder,
    check_step_input,
    check_tool_phase,
    command_record_name,
    encode_job_result,
    encode_step_data,
    lease_held,
    no_such_command,
    revision_conflict,
    run_completed_append,
    run_never_claimed,
    run_taken,
    step_refusal,
    thread_unavailable,
)
from core.checkpoint.capabilities import HumanAnswers, HumanRequests, SupervisedStore
from core.checkpoint.codec import copy_message
from core.checkpoint.listing import in_listing_order, prompt_line
from core.checkpoint.memory_pages import MemoryPages
from core.errors import AlreadyAnsweredError, StaleAnswerError
from core.hitl import is_pending, question_id_of, run_key
from core.messages import AnyMessage, AssistantMessage, UserMessage
from core.owners import UNOWNED, resolve_owner


@dataclass
class _Thread:
    messages: list[AnyMessage] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    extra_revision: int = 0
    runs: dict[str, RunRecord] = field(default_factory=dict)
    touched: float = 0.0
    pending: PendingRequest | None = None


@dataclass
class _Record:
    """A thread's own record (what SQL keeps in its thread-record row): owner and fingerprints."""

    owner: str
    created_at: float
    revision: int = 0
    fingerprints: Fingerprints | None = None
    overrides: tuple[FingerprintOverride, ...] = ()


class _Data:
    """Everything one store holds; stores opened with ``shared=`` hold the same one."""

    def __init__(self) -> None:
        self.threads: dict[str, _Thread] = {}
        self.records: dict[str, _Record] = {}
        self.lock = asyncio.Lock()
        self.seq = 0
        self.changes = 0
        self.changed = asyncio.Event()
        self.journal: dict[str, dict[str, JournalEntry]] = {}
        self.jobs: dict[tuple[str, str], JobRecord] = {}
        self.leases: dict[str, Lease] = {}
        self.events: dict[str, list[LiveEvent]] = {}
        self.event_seq = 0
        self.commands: dict[int, Command] = {}
        self.command_seq = 0
        self.steps: dict[tuple[str, str], StepRecord] = {}
        self.answers: dict[tuple[str, str, str], str] = {}
        """Answer JSON by (thread id, run key, question id) (:func:`core.hitl.run_key`)."""


class MemoryCheckpointer(MemoryPages, SupervisedStore, HumanRequests, HumanAnswers):
    """A dict of threads guarded by one asyncio lock; copies in and out; opened for one owner.

    ``owner``: the owner every read and write is scoped by (``None``: the default owner,
    :func:`core.owners.resolve_owner`; :data:`core.owners.UNOWNED` for the unowned scope);
    raises ``ValueError`` for a name :func:`core.owners.check_owner` refuses. ``shared``:
    another ``MemoryCheckpointer`` whose data (and lock) this one uses, so two owners (or two
    store objects of one owner) can be tested on one store.

    Every write bumps one counter, which is what :meth:`change_token` returns. Journal,
    jobs, leases, live events, commands, steps and the thread's record live beside the
    threads and never make a thread appear in :meth:`list_threads` or :meth:`load` on their
    own (as in SQLite), though each write of them creates the thread's record, owned by
    this store's owner, when the thread has none.
    """

    def __init__(self, owner: str | None = None, *, shared: MemoryCheckpointer | None = None) -> None:
        self._owner = resolve_owner(owner)
        self._d = shared._d if shared is not None else _Data()

    @property
    def owner(self) -> str:
        """See ``OwnerScoped.owner``."""
        return self._owner

    # --- owner scope (every helper here runs with the lock held) -----------------------------

    def _visible(self, thread_id: str) -> bool:
        """Whether ``thread_id`` exists and is this owner's."""
        record = self._d.records.get(thread_id)
        return record is not None and record.owner == self._owner

    def _writable(self, thread_id: str) -> None:
        """Raise ``ThreadNotFoundError`` when ``thread_id`` exists and is another owner's
        (a named owner's thread for the unowned scope, an unowned one for a named owner).
        The record is the whole existence check here: every write that creates anything of
        a thread (cubeloop's kinds of row or ours: a job, a command...) gives it its record
        first (:meth:`_adopt`), and this store has no data from before owners."""
        record = self._d.records.get(thread_id)
        if record is not None and record.owner != self._owner:
            raise thread_unavailable(thread_id, self._owner)

    def _owner_of(self, thread_id: str) -> str | None:
        record = self._d.records.get(thread_id)
        return None if record is None else record.owner

    def _adopt(self, thread_id: str) -> None:
        """Give a thread that has no record one owned by this store's owner (before a write)."""
        if thread_id not in self._d.records:
            self._d.records[thread_id] = _Record(self._owner, time.time())

    def _meta(self, thread_id: str) -> ThreadMeta | None:
        record = self._d.records.get(thread_id)
        if record is None:
            return None
        fingerprints = record.fingerprints
        return ThreadMeta(
            thread_id=thread_id,
            owner=record.owner,
            created_at=record.created_at,
            revision=record.revision,
            fingerprints=None if fingerprints is None else replace(fingerprints, parts=dict(fingerprints.parts)),
            overrides=record.overrides,
        )

    # --- Checkpointer ------------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``; ``journal`` is always a dict here (maybe empty). ``None``
        for another owner's thread, as for a missing one."""
        async with self._d.lock:
            t = self._d.threads.get(thread_id)
            if t is None or not self._visible(thread_id):
                return None
            return self._data(thread_id, t, 0)

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """See ``SupervisedStore.load_after``; another owner's thread gives empty data, as a missing one."""
        async with self._d.lock:
            t = self._d.threads.get(thread_id)
            if t is None or not self._visible(thread_id):
                return CheckpointData(journal={})
            return self._data(thread_id, t, bisect.bisect_right(t.ids, after_id))

    def _data(self, thread_id: str, t: _Thread, start: int) -> CheckpointData:
        return CheckpointData(
            messages=[copy_message(m) for m in t.messages[start:]],
            extra=_json_copy(t.extra),
            runs=list(t.runs.values()),
            message_ids=t.ids[start:],
            journal=dict(self._d.journal.get(thread_id, {})),
            pending_request=self._pending(thread_id, t),
            extra_revision=t.extra_revision,
            meta=self._meta(thread_id),
        )

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.append`` (fenced by ``holder_id`` under the lock); raises
        ``ThreadNotFoundError`` for another owner's thread."""
        if not messages:
            return
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            t = self._d.threads.get(thread_id) or _Thread()
            for m in messages:
                run = t.runs.get(m.run_id) if m.run_id else None
                if run is not None and run.completed:
                    raise run_completed_append(thread_id, m.run_id)
            self._adopt(thread_id)
            self._d.threads[thread_id] = t
            for m in messages:
                self._d.seq += 1
                t.messages.append(copy_message(m))
                t.ids.append(self._d.seq)
            t.touched = time.time()
            self._bump()

    async def save_extra(self, thread_id: str, extra: dict[str, Any], *, expected_revision: int | None = None) -> int:
        """See ``CheckedExtra.save_extra``: the merge and the revision check under one lock.
        Raises ``TypeError`` for values JSON cannot hold."""
        patch = _json_copy(extra)
        async with self._d.lock:
            self._writable(thread_id)
            t = self._d.threads.get(thread_id)
            actual = t.extra_revision if t is not None else 0
            if expected_revision is not None and expected_revision != actual:
                raise revision_conflict(thread_id, EXTRA_RECORD, expected_revision, actual)
            self._adopt(thread_id)
            t = self._d.threads.setdefault(thread_id, _Thread())
            t.extra.update(patch)
            t.extra_revision += 1
            t.touched = time.time()
            self._bump()
            return t.extra_revision

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``: this owner's threads only; each summary carries
        the thread's lease, if any."""
        async with self._d.lock:
            return self._summaries(None)

    async def thread_versions(self) -> dict[str, Hashable]:
        """See ``ThreadVersions.thread_versions``: per thread of this owner's, what its
        writes change (newest message id, extra revision and write time, runs, pending
        request, lease, record revision), under the lock."""
        async with self._d.lock:
            return {
                tid: (
                    t.ids[-1] if t.ids else None,
                    t.extra_revision,
                    t.touched,
                    tuple(t.runs.values()),
                    self._pending(tid, t),
                    self._d.leases.get(tid),
                    self._d.records[tid].revision,
                )
                for tid, t in self._d.threads.items()
                if self._visible(tid)
            }

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        """See ``ThreadVersions.summaries``: :meth:`list_threads` of the named threads."""
        async with self._d.lock:
            return self._summaries(set(thread_ids))

    def _summaries(self, only: set[str] | None) -> list[ThreadSummary]:
        """The summaries of this owner's threads (only those in ``only``, when given), in
        listing order (lock held); tails are copies."""
        return in_listing_order(
            ThreadSummary(
                thread_id=tid,
                message_count=len(t.messages),
                last_activity=t.touched or None,
                runs=tuple(t.runs.values()),
                tail=tuple(copy_message(m) for m in _tail(t.messages)),
                first_prompt=_first_prompt(t.messages),
                lease=self._d.leases.get(tid),
                pending_request=self._pending(tid, t),
            )
            for tid, t in self._d.threads.items()
            if (only is None or tid in only) and self._visible(tid)
        )

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None, holder_id: str | None = None
    ) -> None:
        """See ``HumanRequests.save_pending_request`` (fenced by ``holder_id`` under the lock);
        ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            self._adopt(thread_id)
            t = self._d.threads.setdefault(thread_id, _Thread())
            t.pending = None if request_json is None else PendingRequest(request_json, run_id, time.time())
            t.touched = time.time()
            self._bump()

    # --- human answers --------------------------------------------------------------------------

    def _pending(self, thread_id: str, t: _Thread) -> PendingRequest | None:
        """The thread's pending request as read, with whether its answer is stored (lock held)."""
        pending = t.pending
        if pending is None:
            return None
        question_id = question_id_of(pending.request_json)
        stored = question_id is not None and (thread_id, run_key(pending.run_id), question_id) in self._d.answers
        return replace(pending, answered=True) if stored else pending

    def _pending_is(self, thread_id: str, run_id: str | None, question_id: str) -> bool:
        """Whether the visible thread's pending request is ``question_id`` of ``run_id`` (lock held)."""
        t = self._d.threads.get(thread_id)
        pending = t.pending if t is not None else None
        return pending is not None and is_pending(pending.request_json, pending.run_id, run_id, question_id)

    async def answer(self, thread_id: str, run_id: str | None, question_id: str, answer_json: str) -> None:
        """See ``HumanAnswers.answer``: checked and inserted under the one lock."""
        async with self._d.lock:
            if not self._visible(thread_id):
                raise thread_unavailable(thread_id, self._owner)
            if not self._pending_is(thread_id, run_id, question_id):
                raise StaleAnswerError.of(thread_id, question_id)
            key = (thread_id, run_key(run_id), question_id)
            stored = self._d.answers.get(key)
            if stored is not None:
                raise AlreadyAnsweredError.of(thread_id, question_id, stored)
            self._d.answers[key] = answer_json
            self._bump()

    async def load_answer(self, thread_id: str, run_id: str | None, question_id: str) -> str | None:
        """See ``HumanAnswers.load_answer``."""
        async with self._d.lock:
            if not self._visible(thread_id):
                return None
            return self._d.answers.get((thread_id, run_key(run_id), question_id))

    async def settle_request(
        self, thread_id: str, run_id: str | None, question_id: str, *, holder_id: str | None = None
    ) -> bool:
        """See ``HumanAnswers.settle_request``: compared and cleared under the one lock."""
        async with self._d.lock:
            if not self._visible(thread_id):
                raise thread_unavailable(thread_id, self._owner)
            self._fence(thread_id, holder_id)
            if not self._pending_is(thread_id, run_id, question_id):
                return False
            t = self._d.threads[thread_id]
            t.pending = None
            t.touched = time.time()
            run = run_key(run_id)
            for key in [k for k in self._d.answers if k[0] == thread_id and k[1] == run]:
                del self._d.answers[key]
            self._bump()
            return True

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.claim_run``; the run's revision is 1. ``ThreadNotFoundError`` for
        another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            t = self._d.threads.get(thread_id)
            existing = t.runs.get(run_id) if t is not None else None
            if existing is not None:
                raise run_taken(thread_id, run_id, completed=existing.completed)
            self._adopt(thread_id)
            t = self._d.threads.setdefault(thread_id, _Thread())
            t.runs[run_id] = RunRecord(run_id=run_id, claimed_at=time.time())
            t.touched = time.time()
            self._bump()

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.mark_run_complete``; the run's revision goes 1 -> 2.
        ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            t = self._d.threads.get(thread_id)
            run = t.runs.get(run_id) if t else None
            if t is None or run is None:
                raise run_never_claimed(thread_id, run_id)
            if run.completed:
                return
            seq = 1 + max((r.completion_seq or 0 for r in t.runs.values()), default=0)
            t.runs[run_id] = replace(run, completed_at=time.time(), completion_seq=seq, revision=run.revision + 1)
            self._bump()

    async def close(self) -> None:
        """Nothing to release (a store sharing this one's data keeps it)."""

    def _fence(self, thread_id: str, holder_id: str | None) -> None:
        """Raise ``LeaseLostError`` unless an unfenced write or ``holder_id`` holds the live lease (lock held)."""
        if holder_id is not None:
            check_lease_holder(self._d.leases.get(thread_id), thread_id, holder_id, time.time())

    # --- owner scope, thread records ----------------------------------------------------------

    async def unowned_count(self) -> int:
        """See ``OwnerScoped.unowned_count``: threads :meth:`list_threads` would show to the
        unowned scope."""
        async with self._d.lock:
            return sum(1 for tid in self._d.threads if self._owner_of(tid) == UNOWNED)

    async def load_meta(self, thread_id: str) -> ThreadMeta | None:
        """See ``ThreadRecords.load_meta``."""
        async with self._d.lock:
            return self._meta(thread_id) if self._visible(thread_id) else None

    async def save_fingerprints(
        self,
        thread_id: str,
        fingerprints: Fingerprints,
        *,
        expected_revision: int,
        override: FingerprintOverride | None = None,
    ) -> ThreadMeta:
        """See ``ThreadRecords.save_fingerprints``: checked and written under one lock."""
        kept = replace(fingerprints, parts=dict(fingerprints.parts))
        async with self._d.lock:
            self._writable(thread_id)
            record = self._d.records.get(thread_id)
            actual = record.revision if record is not None else 0
            if expected_revision != actual:
                raise revision_conflict(thread_id, FINGERPRINTS_RECORD, expected_revision, actual)
            self._adopt(thread_id)
            record = self._d.records[thread_id]
            record.fingerprints = kept
            if override is not None:
                record.overrides = (*record.overrides, override)
            record.revision += 1
            self._bump()
            meta = self._meta(thread_id)
            assert meta is not None  # just adopted
            return meta

    async def delete_thread(self, thread_id: str) -> None:
        """See ``ThreadDeletion.delete_thread``. A lease is live while ``expires_at`` is in the
        future (this store cannot ask about other processes: there are none)."""
        async with self._d.lock:
            if not self._visible(thread_id):
                raise thread_unavailable(thread_id, self._owner)
            check_deletable(self._d.leases.get(thread_id), time.time())
            d = self._d
            for table in (d.threads, d.records, d.journal, d.leases, d.events):
                table.pop(thread_id, None)  # type: ignore[attr-defined]
            for keyed in (d.jobs, d.steps, d.answers):
                for key in [k for k in keyed if k[0] == thread_id]:
                    del keyed[key]  # type: ignore[attr-defined]
            for seq in [s for s, c in d.commands.items() if c.thread_id == thread_id]:
                del d.commands[seq]
            self._bump()

    # --- tool journal ------------------------------------------------------------------------

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
        """See ``SupervisedStore.record_tool_event``.

        ``start`` sets ``started_at``, ``end`` sets ``ended_at``; ``tool_name``, ``run_id``
        and ``job_key`` overwrite the entry's only when given (non-empty), so an ``end``
        without them keeps what ``start`` wrote. An ``end`` without a ``start`` still
        records the end. Raises ``ValueError`` for another ``phase``,
        ``ThreadNotFoundError`` for another owner's thread.
        """
        check_tool_phase(phase)
        when = time.time() if at is None else at
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            self._adopt(thread_id)
            entries = self._d.journal.setdefault(thread_id, {})
            old = entries.get(tool_call_id) or JournalEntry(tool_call_id)
            new = replace(
                old,
                tool_name=tool_name or old.tool_name,
                run_id=run_id if run_id is not None else old.run_id,
                job_key=job_key if job_key is not None else old.job_key,
            )
            # A start (again, when a resume re-runs the call) clears an old end.
            entries[tool_call_id] = (
                replace(new, started_at=when, ended_at=None) if phase == "start" else replace(new, ended_at=when)
            )
            self._bump()

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """See ``SupervisedStore.load_journal``: always a dict here (empty for an unknown
        thread or another owner's)."""
        async with self._d.lock:
            return dict(self._d.journal.get(thread_id, {})) if self._visible(thread_id) else {}

    # --- jobs --------------------------------------------------------------------------------

    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """See ``SupervisedStore.job_begin``.

        ``done``: returned unchanged. Absent: inserted as ``started`` with ``attempts=1``,
        revision 1. ``started`` (a crashed or concurrent earlier start) or ``failed``: set to
        ``started`` again with ``attempts + 1``, revision + 1, a fresh ``started_at`` and no
        result. So of two callers beginning the same key, exactly one sees ``attempts == 1``.
        ``ThreadNotFoundError`` for another owner's thread.
        """
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            old = self._d.jobs.get((thread_id, key))
            if old is not None and old.status == "done":
                return _copy_job(old)
            record = JobRecord(
                key=key,
                status="started",
                tool_call_id=tool_call_id if tool_call_id is not None else (old.tool_call_id if old else None),
                started_at=time.time(),
                attempts=old.attempts + 1 if old else 1,
                revision=old.revision + 1 if old else 1,
            )
            self._adopt(thread_id)
            self._d.jobs[(thread_id, key)] = record
            self._bump()
            return record

    async def job_finish(
        self,
        thread_id: str,
        key: str,
        status: Literal["done", "failed"],
        result: Any = None,
        *,
        holder_id: str | None = None,
    ) -> None:
        """See ``SupervisedStore.job_finish``.

        A job already ``done`` stays as it is (the first result wins: callers may already
        have reused it); otherwise its revision goes up by one. Raises ``KeyError`` if never
        begun, ``ValueError`` for another ``status``, ``TypeError`` when ``result`` is not
        JSON, ``ThreadNotFoundError`` for another owner's thread.
        """
        stored = json.loads(encode_job_result(key, status, result))
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            old = self._d.jobs.get((thread_id, key))
            if old is None:
                raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
            if old.status == "done":
                return
            self._d.jobs[(thread_id, key)] = replace(
                old, status=status, result=stored, finished_at=time.time(), revision=old.revision + 1
            )
            self._bump()

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """See ``SupervisedStore.job_get``; the result is a fresh copy."""
        async with self._d.lock:
            record = self._d.jobs.get((thread_id, key)) if self._visible(thread_id) else None
        return None if record is None else _copy_job(record)

    # --- leases ------------------------------------------------------------------------------

    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """See ``SupervisedStore.acquire_lease``; the lease is stored as given but for its
        ``revision``: 1 for a new row, the current row's + 1 for a re-acquire or a takeover.
        ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(lease.thread_id)
            current = self._d.leases.get(lease.thread_id)
            if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
                raise lease_held(current)
            stored = replace(lease, revision=1 if current is None else current.revision + 1)
            self._adopt(lease.thread_id)
            self._d.leases[lease.thread_id] = stored
            self._bump()
            return stored

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """See ``SupervisedStore.renew_lease`` (the revision goes up by one);
        ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            current = self._d.leases.get(thread_id)
            if current is None or current.holder_id != holder_id:
                return False
            self._d.leases[thread_id] = replace(
                current, heartbeat_at=heartbeat_at, expires_at=expires_at, revision=current.revision + 1
            )
            self._bump()
            return True

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """See ``SupervisedStore.release_lease``; ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            current = self._d.leases.get(thread_id)
            if current is not None and current.holder_id == holder_id:
                del self._d.leases[thread_id]
                self._bump()

    async def get_lease(self, thread_id: str) -> Lease | None:
        """See ``SupervisedStore.get_lease``."""
        async with self._d.lock:
            return self._d.leases.get(thread_id) if self._visible(thread_id) else None

    async def list_leases(self) -> dict[str, Lease]:
        """See ``SupervisedStore.list_leases``: this owner's threads only."""
        async with self._d.lock:
            return {tid: lease for tid, lease in self._d.leases.items() if self._visible(tid)}

    # --- live events -------------------------------------------------------------------------

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """See ``SupervisedStore.append_live_events``; raises ``TypeError`` for non-JSON data,
        ``ThreadNotFoundError`` for another owner's thread."""
        if not events:
            return
        copies = [_json_copy(e) for e in events]
        now = time.time()
        async with self._d.lock:
            self._writable(thread_id)
            self._adopt(thread_id)
            log = self._d.events.setdefault(thread_id, [])
            for data in copies:
                self._d.event_seq += 1
                log.append(LiveEvent(self._d.event_seq, thread_id, run_id, data, now))
            if len(log) > keep:
                del log[: len(log) - max(keep, 0)]
            self._bump()

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """See ``SupervisedStore.read_live_events``; each ``data`` is a fresh copy."""
        async with self._d.lock:
            log = self._d.events.get(thread_id, ()) if self._visible(thread_id) else ()
            found = [e for e in log if e.seq > after_seq]
        return [replace(e, data=_json_copy(e.data)) for e in found]

    async def prune_live_events(self, thread_id: str) -> None:
        """See ``SupervisedStore.prune_live_events``; ``ThreadNotFoundError`` for another owner's thread."""
        async with self._d.lock:
            self._writable(thread_id)
            if self._d.events.pop(thread_id, None):
                self._bump()

    # --- commands ----------------------------------------------------------------------------

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """See ``SupervisedStore.send_command`` (revision 1); raises ``ValueError`` for an
        unknown ``kind``, ``ThreadNotFoundError`` for another owner's thread."""
        check_command_kind(kind)
        now = time.time()
        async with self._d.lock:
            self._writable(thread_id)
            self._adopt(thread_id)
            self._d.command_seq += 1
            command = Command(self._d.command_seq, thread_id, kind, text, "pending", now, now)
            self._d.commands[command.seq] = command
            self._bump()
            return command

    async def update_command(
        self, seq: int, status: CommandStatus, note: str = "", *, expected_revision: int | None = None
    ) -> Command:
        """See ``Commands.update_command``: only the moves of ``COMMAND_TRANSITIONS``; the
        revision is compared before the move is."""
        check_command_status(status)
        async with self._d.lock:
            old = self._d.commands.get(seq)
            if old is None or not self._visible(old.thread_id):
                raise no_such_command(seq)
            if expected_revision is not None and expected_revision != old.revision:
                raise revision_conflict(old.thread_id, command_record_name(seq), expected_revision, old.revision)
            check_command_move(old, status)
            new = replace(old, status=status, note=note, updated_at=time.time(), revision=old.revision + 1)
            self._d.commands[seq] = new
            self._bump()
            return new

    async def edit_command(self, seq: int, text: str, *, expected_revision: int) -> Command:
        """See ``Commands.edit_command``: the revision is compared before the status is."""
        async with self._d.lock:
            old = self._d.commands.get(seq)
            if old is None or not self._visible(old.thread_id):
                raise no_such_command(seq)
            if expected_revision != old.revision:
                raise revision_conflict(old.thread_id, command_record_name(seq), expected_revision, old.revision)
            check_command_edit(old)
            new = replace(old, text=text, updated_at=time.time(), revision=old.revision + 1)
            self._d.commands[seq] = new
            self._bump()
            return new

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """See ``SupervisedStore.list_commands``."""
        wanted = None if statuses is None else set(statuses)
        async with self._d.lock:
            if not self._visible(thread_id):
                return []
            return [
                c
                for c in self._d.commands.values()
                if c.thread_id == thread_id and c.seq > after and (wanted is None or c.status in wanted)
            ]

    # --- tool steps --------------------------------------------------------------------------

    async def step_begin(
        self,
        thread_id: str,
        key: str,
        *,
        input_fingerprint: str,
        workflow: str,
        total_steps: int | None = None,
        tool_call_id: str | None = None,
        holder_id: str | None = None,
    ) -> StepRecord:
        """See ``ToolSteps.step_begin``."""
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            existing = self._d.steps.get((thread_id, key))
            if existing is not None:
                check_step_input(existing, input_fingerprint, workflow)
                return _copy_step(existing)
            record = StepRecord(
                thread_id=thread_id,
                key=key,
                input_fingerprint=input_fingerprint,
                workflow=workflow,
                total_steps=total_steps,
                tool_call_id=tool_call_id,
                updated_at=time.time(),
            )
            self._adopt(thread_id)
            self._d.steps[(thread_id, key)] = record
            self._bump()
            return _copy_step(record)

    async def step_commit(
        self,
        thread_id: str,
        key: str,
        *,
        expected_revision: int,
        workflow: str,
        next_step: int,
        data: Any,
        holder_id: str | None = None,
    ) -> StepRecord:
        """See ``ToolSteps.step_commit``: every check, then the write, under one lock. Another
        workflow is reported before a stale revision."""
        stored = json.loads(encode_step_data(key, data))
        async with self._d.lock:
            self._writable(thread_id)
            self._fence(thread_id, holder_id)
            old = self._d.steps.get((thread_id, key))
            if old is None or old.workflow != workflow or old.revision != expected_revision:
                raise step_refusal(thread_id, key, old, workflow, expected_revision)
            new = replace(old, next_step=next_step, revision=old.revision + 1, data=stored, updated_at=time.time())
            self._d.steps[(thread_id, key)] = new
            self._bump()
            return _copy_step(new)

    async def step_get(self, thread_id: str, key: str) -> StepRecord | None:
        """See ``ToolSteps.step_get``; a fresh copy."""
        async with self._d.lock:
            record = self._d.steps.get((thread_id, key)) if self._visible(thread_id) else None
        return None if record is None else _copy_step(record)

    async def list_steps(self, thread_id: str) -> list[StepRecord]:
        """See ``ToolSteps.list_steps``: by ``key``, fresh copies."""
        async with self._d.lock:
            if not self._visible(thread_id):
                return []
            found = sorted((r for (tid, _), r in self._d.steps.items() if tid == thread_id), key=lambda r: r.key)
        return [_copy_step(r) for r in found]

    # --- change notification ------------------------------------------------------------------

    async def change_token(self) -> int:
        """See ``ChangeNotification.change_token``: the number of writes so far by any owner (an int)."""
        return self._d.changes

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """See ``ChangeNotification.change_signals``: woken by this process's writes (there is no other)."""
        while not stop.is_set():
            stopping = asyncio.ensure_future(stop.wait())
            changed = asyncio.ensure_future(self._d.changed.wait())
            try:
                await asyncio.wait({stopping, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                changed.cancel()
            if stop.is_set():
                return
            self._d.changed.clear()
            await asyncio.sleep(quiet_ms / 1000)
            yield None

    def _bump(self) -> None:
        self._d.changes += 1
        self._d.changed.set()


# --- helpers ----------------------------------------------------------------------------------


def _copy_job(record: JobRecord) -> JobRecord:
    return record if record.result is None else replace(record, result=json.loads(json.dumps(record.result)))


def _copy_step(record: StepRecord) -> StepRecord:
    return record if record.data is None else replace(record, data=json.loads(json.dumps(record.data)))


def _tail(messages: list[AnyMessage]) -> list[AnyMessage]:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], AssistantMessage):
            return messages[i:]
    return messages


def _first_prompt(messages: list[AnyMessage]) -> str:
    for m in messages:
        if isinstance(m, UserMessage):
            return prompt_line(m.text)
    return ""


def _json_copy(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value))
