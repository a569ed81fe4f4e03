"""In-memory checkpointer: the reference implementation of the contract in ``base.py``.

Implements :class:`~core.checkpoint.base.Checkpointer` and
:class:`~core.checkpoint.base.SupervisedStore`. Nothing survives the process. Used by
tests and by programs that need no persistence.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from core.checkpoint.base import (
    CheckpointData,
    Command,
    CommandKind,
    CommandStatus,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    PendingRequest,
    RunRecord,
    ThreadSummary,
    check_command_kind,
    check_command_move,
    check_command_status,
    check_lease_holder,
    check_tool_phase,
    encode_job_result,
)
from core.checkpoint.capabilities import HumanRequests, SupervisedStore
from core.checkpoint.codec import copy_message
from core.errors import RunAlreadyClaimedError, RunAlreadyCompletedError, RunNotClaimedError
from core.messages import AnyMessage, AssistantMessage, UserMessage


@dataclass
class _Thread:
    messages: list[AnyMessage] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    touched: float = 0.0
    pending: PendingRequest | None = None


class MemoryCheckpointer(SupervisedStore, HumanRequests):
    """A dict of threads guarded by one asyncio lock; copies in and out.

    Every write bumps one counter, which is what :meth:`change_token` returns. Journal,
    jobs, leases, live events and commands live beside the threads and never make a
    thread appear in :meth:`list_threads` on their own (as in SQLite).
    """

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._lock = asyncio.Lock()
        self._seq = 0
        self._changes = 0
        self._changed = asyncio.Event()
        self._journal: dict[str, dict[str, JournalEntry]] = {}
        self._jobs: dict[tuple[str, str], JobRecord] = {}
        self._leases: dict[str, Lease] = {}
        self._events: dict[str, list[LiveEvent]] = {}
        self._event_seq = 0
        self._commands: dict[int, Command] = {}
        self._command_seq = 0

    # --- Checkpointer ------------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``; ``journal`` is always a dict here (maybe empty)."""
        async with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                return None
            return CheckpointData(
                messages=[copy_message(m) for m in t.messages],
                extra=_json_copy(t.extra),
                runs=list(t.runs.values()),
                message_ids=list(t.ids),
                journal=dict(self._journal.get(thread_id, {})),
                pending_request=t.pending,
            )

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """See ``SupervisedStore.load_after``."""
        async with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                return CheckpointData(journal={})
            start = bisect.bisect_right(t.ids, after_id)
            return CheckpointData(
                messages=[copy_message(m) for m in t.messages[start:]],
                extra=_json_copy(t.extra),
                runs=list(t.runs.values()),
                message_ids=t.ids[start:],
                journal=dict(self._journal.get(thread_id, {})),
                pending_request=t.pending,
            )

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.append`` (fenced by ``holder_id`` under the lock)."""
        if not messages:
            return
        async with self._lock:
            self._fence(thread_id, holder_id)
            t = self._threads.setdefault(thread_id, _Thread())
            for m in messages:
                run = t.runs.get(m.run_id) if m.run_id else None
                if run is not None and run.completed:
                    raise RunAlreadyCompletedError(f"Run {m.run_id} of thread {thread_id!r} is already completed.")
            for m in messages:
                self._seq += 1
                t.messages.append(copy_message(m))
                t.ids.append(self._seq)
            t.touched = time.time()
            self._bump()

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        """See ``Checkpointer.save_extra``."""
        patch = _json_copy(extra)
        async with self._lock:
            t = self._threads.setdefault(thread_id, _Thread())
            t.extra.update(patch)
            t.touched = time.time()
            self._bump()

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``; each summary carries the thread's lease, if any."""
        async with self._lock:
            out = [
                ThreadSummary(
                    thread_id=tid,
                    message_count=len(t.messages),
                    last_activity=t.touched or None,
                    runs=tuple(t.runs.values()),
                    tail=tuple(copy_message(m) for m in _tail(t.messages)),
                    first_prompt=_first_prompt(t.messages),
                    lease=self._leases.get(tid),
                    pending_request=t.pending,
                )
                for tid, t in self._threads.items()
            ]
        out.sort(key=lambda s: s.last_activity or 0.0, reverse=True)
        return out

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None
    ) -> None:
        """See ``HumanRequests.save_pending_request``."""
        async with self._lock:
            t = self._threads.setdefault(thread_id, _Thread())
            t.pending = None if request_json is None else PendingRequest(request_json, run_id, time.time())
            t.touched = time.time()
            self._bump()

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.claim_run``."""
        async with self._lock:
            self._fence(thread_id, holder_id)
            t = self._threads.setdefault(thread_id, _Thread())
            existing = t.runs.get(run_id)
            if existing is not None:
                if existing.completed:
                    raise RunAlreadyCompletedError(f"Run {run_id} of thread {thread_id!r} already completed.")
                raise RunAlreadyClaimedError(f"Run {run_id} of thread {thread_id!r} is already running.")
            t.runs[run_id] = RunRecord(run_id=run_id, claimed_at=time.time())
            t.touched = time.time()
            self._bump()

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.mark_run_complete``."""
        async with self._lock:
            self._fence(thread_id, holder_id)
            t = self._threads.get(thread_id)
            run = t.runs.get(run_id) if t else None
            if t is None or run is None:
                raise RunNotClaimedError(f"Run {run_id} of thread {thread_id!r} was never claimed.")
            if run.completed:
                return
            seq = 1 + max((r.completion_seq or 0 for r in t.runs.values()), default=0)
            t.runs[run_id] = RunRecord(run_id, run.claimed_at, time.time(), seq)
            self._bump()

    async def close(self) -> None:
        """Nothing to release."""

    def _fence(self, thread_id: str, holder_id: str | None) -> None:
        """Raise ``LeaseLostError`` unless an unfenced write or ``holder_id`` holds the live lease (lock held)."""
        if holder_id is not None:
            check_lease_holder(self._leases.get(thread_id), thread_id, holder_id, time.time())

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
        records the end. Raises ``ValueError`` for another ``phase``.
        """
        check_tool_phase(phase)
        when = time.time() if at is None else at
        async with self._lock:
            self._fence(thread_id, holder_id)
            entries = self._journal.setdefault(thread_id, {})
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
        """See ``SupervisedStore.load_journal``: always a dict here (empty for an unknown thread)."""
        async with self._lock:
            return dict(self._journal.get(thread_id, {}))

    # --- jobs --------------------------------------------------------------------------------

    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """See ``SupervisedStore.job_begin``.

        ``done``: returned unchanged. Absent: inserted as ``started`` with ``attempts=1``.
        ``started`` (a crashed or concurrent earlier start) or ``failed``: set to ``started``
        again with ``attempts + 1``, a fresh ``started_at`` and no result. So of two callers
        beginning the same key, exactly one sees ``attempts == 1``.
        """
        async with self._lock:
            self._fence(thread_id, holder_id)
            old = self._jobs.get((thread_id, key))
            if old is not None and old.status == "done":
                return _copy_job(old)
            record = JobRecord(
                key=key,
                status="started",
                tool_call_id=tool_call_id if tool_call_id is not None else (old.tool_call_id if old else None),
                started_at=time.time(),
                attempts=old.attempts + 1 if old else 1,
            )
            self._jobs[(thread_id, key)] = record
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
        have reused it). Raises ``KeyError`` if never begun, ``ValueError`` for another
        ``status``, ``TypeError`` when ``result`` is not JSON.
        """
        stored = json.loads(encode_job_result(key, status, result))
        async with self._lock:
            self._fence(thread_id, holder_id)
            old = self._jobs.get((thread_id, key))
            if old is None:
                raise KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
            if old.status == "done":
                return
            self._jobs[(thread_id, key)] = replace(old, status=status, result=stored, finished_at=time.time())
            self._bump()

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """See ``SupervisedStore.job_get``; the result is a fresh copy."""
        async with self._lock:
            record = self._jobs.get((thread_id, key))
        return None if record is None else _copy_job(record)

    # --- leases ------------------------------------------------------------------------------

    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """See ``SupervisedStore.acquire_lease``; the lease is stored exactly as given."""
        async with self._lock:
            current = self._leases.get(lease.thread_id)
            if current is not None and current.holder_id != lease.holder_id and not is_stale(current):
                raise RunAlreadyClaimedError(_lease_refusal(current), lease=current)
            self._leases[lease.thread_id] = lease
            self._bump()
            return lease

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """See ``SupervisedStore.renew_lease``."""
        async with self._lock:
            current = self._leases.get(thread_id)
            if current is None or current.holder_id != holder_id:
                return False
            self._leases[thread_id] = replace(current, heartbeat_at=heartbeat_at, expires_at=expires_at)
            self._bump()
            return True

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """See ``SupervisedStore.release_lease``."""
        async with self._lock:
            current = self._leases.get(thread_id)
            if current is not None and current.holder_id == holder_id:
                del self._leases[thread_id]
                self._bump()

    async def get_lease(self, thread_id: str) -> Lease | None:
        """See ``SupervisedStore.get_lease``."""
        async with self._lock:
            return self._leases.get(thread_id)

    async def list_leases(self) -> dict[str, Lease]:
        """See ``SupervisedStore.list_leases``."""
        async with self._lock:
            return dict(self._leases)

    # --- live events -------------------------------------------------------------------------

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """See ``SupervisedStore.append_live_events``; raises ``TypeError`` for non-JSON data."""
        if not events:
            return
        copies = [_json_copy(e) for e in events]
        now = time.time()
        async with self._lock:
            log = self._events.setdefault(thread_id, [])
            for data in copies:
                self._event_seq += 1
                log.append(LiveEvent(self._event_seq, thread_id, run_id, data, now))
            if len(log) > keep:
                del log[: len(log) - max(keep, 0)]
            self._bump()

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """See ``SupervisedStore.read_live_events``; each ``data`` is a fresh copy."""
        async with self._lock:
            found = [e for e in self._events.get(thread_id, ()) if e.seq > after_seq]
        return [replace(e, data=_json_copy(e.data)) for e in found]

    async def prune_live_events(self, thread_id: str) -> None:
        """See ``SupervisedStore.prune_live_events``."""
        async with self._lock:
            if self._events.pop(thread_id, None):
                self._bump()

    # --- commands ----------------------------------------------------------------------------

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """See ``SupervisedStore.send_command``; raises ``ValueError`` for an unknown ``kind``."""
        check_command_kind(kind)
        now = time.time()
        async with self._lock:
            self._command_seq += 1
            command = Command(self._command_seq, thread_id, kind, text, "pending", now, now)
            self._commands[command.seq] = command
            self._bump()
            return command

    async def update_command(self, seq: int, status: CommandStatus, note: str = "") -> Command:
        """See ``SupervisedStore.update_command``: only the moves of ``COMMAND_TRANSITIONS``."""
        check_command_status(status)
        async with self._lock:
            old = self._commands.get(seq)
            if old is None:
                raise KeyError(f"There is no command {seq}.")
            check_command_move(old, status)
            new = replace(old, status=status, note=note, updated_at=time.time())
            self._commands[seq] = new
            self._bump()
            return new

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """See ``SupervisedStore.list_commands``."""
        wanted = None if statuses is None else set(statuses)
        async with self._lock:
            return [
                c
                for c in self._commands.values()
                if c.thread_id == thread_id and c.seq > after and (wanted is None or c.status in wanted)
            ]

    async def change_token(self) -> int:
        """See ``ChangeNotification.change_token``: the number of writes so far (an int)."""
        return self._changes

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """See ``ChangeNotification.change_signals``: woken by this process's writes (there is no other)."""
        while not stop.is_set():
            stopping = asyncio.ensure_future(stop.wait())
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({stopping, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                changed.cancel()
            if stop.is_set():
                return
            self._changed.clear()
            await asyncio.sleep(quiet_ms / 1000)
            yield None

    def _bump(self) -> None:
        self._changes += 1
        self._changed.set()


# --- helpers (backends are independent, so each keeps its own copy of these sentences) -------


def _lease_refusal(current: Lease, now: float | None = None) -> str:
    """The one sentence ``acquire_lease`` raises when ``current`` is live and someone else's."""
    ago = max(0.0, (time.time() if now is None else now) - current.heartbeat_at)
    return (
        f"Thread {current.thread_id} is already running "
        f"(holder pid {current.pid} on {current.host}, heartbeat {ago:.0f}s ago)."
    )


def _copy_job(record: JobRecord) -> JobRecord:
    return record if record.result is None else replace(record, result=json.loads(json.dumps(record.result)))


def _tail(messages: list[AnyMessage]) -> list[AnyMessage]:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], AssistantMessage):
            return messages[i:]
    return messages


def _first_prompt(messages: list[AnyMessage]) -> str:
    for m in messages:
        if isinstance(m, UserMessage):
            return m.text
    return ""


def _json_copy(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value))
