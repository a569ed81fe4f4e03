"""Everything an :class:`~core.agent.Agent` writes to its store for a run, in one place.

One :class:`RunRecorder` per agent holds each write rule once:

* **lease and fencing** (:mod:`core.leases`): a run first takes the thread's lease and
  heartbeats; every write of a leased run carries ``holder_id`` (the store refuses it once
  another holder has the thread or the lease expired); once the lease is lost nothing
  more is written (:attr:`RunRecorder.fenced`);
* **messages**: one ``append`` per finished message, marked as covered by our tool journal
  when it holds tool calls;
* **the tool journal**: each call's start (before its work) and end;
* **runs**: cubeloop's claim and completion, beside the lease;
* **jobs and tool steps**: the thread's :class:`~core.jobs.Jobs` and
  :class:`~core.steps.StepLogs`, fenced by the same holder, handed to the loop;
* **the thread's record**: the check of its fingerprints against the agent's definition
  before a run goes on (refused, or recorded with an override when accepted), written
  compare-and-set on the record's revision (:mod:`core.fingerprints`).

Stores without a capability (cubeloop's) simply get none of its writes: no lease, journal,
jobs, steps or fingerprints. The agent keeps its public API and the folding of events into
its state; what it learns from a write (saved or not, the lease lost) comes back from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal

from core.checkpoint.base import Checkpointer, FingerprintOverride, Fingerprints, JobRecord, StepRecord, ThreadMeta
from core.checkpoint.capabilities import Jobs as JobStore
from core.checkpoint.capabilities import Leases, OwnerScoped, ThreadRecords, ToolJournal, ToolSteps, supports
from core.errors import LeaseLostError, WriteFailed, error_sentence
from core.fingerprints import changes, first_input, input_fingerprint, mismatch_error
from core.jobs import Jobs
from core.leases import HeldLease, LeaseHolder
from core.messages import AnyMessage, AssistantMessage, ensure_message_id
from core.owners import UNOWNED
from core.recovery import JOURNALED_KEY
from core.steps import StepLogs

_log = logging.getLogger(__name__)


class RunRecorder:
    """The store writes of one thread's runs (see the module docstring).

    ``store`` is the agent's checkpointer, ``holder`` who the agent is to other processes;
    ``lease_ttl`` and ``heartbeat_interval`` (seconds) as :class:`~core.agent.Agent` says.
    ``jobs`` and ``steps`` are ``None`` when the store keeps no jobs / tool steps; both are
    fenced by ``holder`` when the store keeps leases.
    """

    def __init__(
        self,
        store: Checkpointer,
        thread_id: str,
        holder: LeaseHolder,
        *,
        lease_ttl: float,
        heartbeat_interval: float,
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.holder = holder
        self.lease_ttl = lease_ttl
        self.heartbeat_interval = heartbeat_interval
        self._leases: Leases | None = store if supports(store, Leases) else None
        self._journal: ToolJournal | None = store if supports(store, ToolJournal) else None
        self._records: ThreadRecords | None = store if supports(store, ThreadRecords) else None
        fence_id = holder.holder_id if self._leases is not None else None
        self.jobs: Jobs | None = Jobs(store, thread_id, fence_id) if supports(store, JobStore) else None
        self.steps: StepLogs | None = StepLogs(store, thread_id, fence_id) if supports(store, ToolSteps) else None
        self._lease: HeldLease | None = None

    # --- what the store keeps ----------------------------------------------------------------

    @property
    def journaled(self) -> bool:
        """Whether the store keeps a tool journal (ours do, cubeloop's do not)."""
        return self._journal is not None

    @property
    def keeps_records(self) -> bool:
        """Whether the store keeps each thread's owner and fingerprints record."""
        return self._records is not None

    @property
    def owner(self) -> str:
        """The owner the store was opened for (:data:`core.owners.UNOWNED` for a store that
        knows no owners)."""
        return self.store.owner if supports(self.store, OwnerScoped) else UNOWNED

    # --- the lease -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def leased(self, run_id: str, on_lost: Callable[[], None]) -> AsyncIterator[None]:
        """Hold the thread's lease (heartbeating) for the run ``run_id``; ``on_lost()`` is
        called once if it is lost meanwhile. Without a lease store, nothing is held.
        Raises ``RunAlreadyClaimedError`` when another holder runs the thread (see
        :meth:`core.leases.HeldLease.acquire`) and the store's errors."""
        if self._leases is None:
            yield
            return
        held = await HeldLease.acquire(
            self._leases,
            self.thread_id,
            self.holder,
            run_id,
            ttl=self.lease_ttl,
            interval=self.heartbeat_interval,
            on_lost=on_lost,
        )
        self._lease = held
        try:
            yield
        finally:
            self._lease = None
            await held.release()

    @property
    def lost(self) -> str | None:
        """Why the current run's lease was lost (one sentence), ``None`` while it holds it
        (or holds none)."""
        return self._lease.lost if self._lease is not None else None

    @property
    def fenced(self) -> bool:
        """Whether nothing more may be written: the run's lease is lost."""
        # After the lease is lost another holder may be running the thread: writing
        # more would interleave two runs' messages, so nothing more is saved.
        return self.lost is not None

    def fence(self) -> dict[str, str]:
        """The keyword that fences a write by this run's lease (none when no lease is held)."""
        return {} if self._lease is None else {"holder_id": self.holder.holder_id}

    def note_lost(self, exc: BaseException) -> bool:
        """If ``exc`` says a fenced write found the lease gone, record the loss (which
        aborts the run, as when the heartbeat notices) and return True."""
        if not isinstance(exc, LeaseLostError) or self._lease is None:
            return False
        why = exc.why or "it expired or another process took the thread over"
        self._lease.lose(
            f"This run lost its lease on thread {self.thread_id!r} ({why}), so it stopped without saving more."
        )
        return True

    def stopped_by(self, what: str, exc: Exception) -> WriteFailed:
        """The error that ends the run after the write ``what`` failed with ``exc``."""
        if self.note_lost(exc) and self.lost:
            return WriteFailed(self.lost)
        return WriteFailed(f"{what}: {error_sentence(exc)}")

    # --- runs and messages ---------------------------------------------------------------------

    async def claim(self, run_id: str) -> None:
        """Claim the run (cubeloop's run claim, kept beside the lease so cubeloop sees our
        runs too); the store's errors propagate."""
        await self.store.claim_run(self.thread_id, run_id, **self.fence())

    async def complete(self, run_id: str) -> None:
        """Mark the run complete; the store's errors propagate."""
        await self.store.mark_run_complete(self.thread_id, run_id, **self.fence())

    async def append(self, message: AnyMessage) -> tuple[bool, Exception | None]:
        """Save one finished message: ``(True, None)`` when saved, ``(False, error)`` when
        the store refused it, ``(False, None)`` when nothing may be written any more.

        Gives the message its id first, and marks an assistant message with tool calls as
        covered by our tool journal (:data:`core.recovery.JOURNALED_KEY`), in place, so the
        agent's own copy says the same as the row."""
        if self.journaled and isinstance(message, AssistantMessage) and message.tool_calls:
            # A call missing from the journal then "never started"; calls written by
            # cubeloop (no mark), even into an upgraded file, stay "may have started".
            message.metadata[JOURNALED_KEY] = True
        if self.fenced:
            return False, None
        try:
            await self.store.append(self.thread_id, [ensure_message_id(message)], **self.fence())
        except Exception as exc:
            return False, exc
        return True, None

    async def journal(
        self,
        tool_call_id: str,
        phase: Literal["start", "end"],
        *,
        tool_name: str,
        run_id: str | None,
        job_key: str | None,
        at: float,
    ) -> Exception | None:
        """Journal the start or end of a tool call; return the store's error, if any (a
        refusal because the lease is gone also records the loss). Nothing is written by a
        store without a journal or once the lease is lost."""
        if self._journal is None or self.fenced:
            return None
        try:
            await self._journal.record_tool_event(
                self.thread_id,
                tool_call_id,
                phase,
                tool_name=tool_name,
                run_id=run_id,
                job_key=job_key,
                at=at,
                **self.fence(),
            )
        except Exception as exc:
            # Even a lost end stops the run once the lease is gone (nothing more may be saved).
            self.note_lost(exc)
            return exc
        return None

    # --- reads the resume plan needs -----------------------------------------------------------

    async def job(self, key: str) -> JobRecord | None:
        """The job under ``key``, ``None`` when there is none or the store keeps no jobs."""
        return await self.jobs.get(key) if self.jobs is not None else None

    async def step(self, key: str) -> StepRecord | None:
        """The step record under job ``key``, ``None`` when there is none or the store keeps none."""
        return await self.steps.store.step_get(self.thread_id, key) if self.steps is not None else None

    # --- the thread's record -------------------------------------------------------------------

    async def load_meta(self) -> ThreadMeta | None:
        """The thread's owner and fingerprints record, ``None`` when the store keeps none
        (or the thread has none)."""
        return await self._records.load_meta(self.thread_id) if self._records is not None else None

    async def record_fingerprints(
        self, meta: ThreadMeta | None, fingerprints: Fingerprints, *, overriding: Sequence[str] = ()
    ) -> ThreadMeta | None:
        """Record ``fingerprints`` for the thread whose record was ``meta`` when loaded,
        compare-and-set on its revision (0 for a thread that recorded none), with a
        :class:`~core.checkpoint.base.FingerprintOverride` (now, the store's owner,
        ``overriding``) when ``overriding`` names changes the caller accepted. Returns the
        new record, ``None`` for a store that keeps none (nothing written). Raises
        ``ConflictError`` when another writer was first and ``ThreadNotFoundError`` for a
        thread this owner cannot see; nothing is written then."""
        if self._records is None:
            return None
        override = FingerprintOverride(time.time(), self.owner, tuple(overriding)) if overriding else None
        return await self._records.save_fingerprints(
            self.thread_id,
            fingerprints,
            expected_revision=meta.revision if meta is not None else 0,
            override=override,
        )

    async def admit(
        self,
        meta: ThreadMeta | None,
        messages: Sequence[AnyMessage],
        current: Fingerprints,
        *,
        offered: str | None = None,
        accept_changes: bool = False,
    ) -> ThreadMeta | None:
        """Check the thread's fingerprints before a run goes on, and record the agent's.

        ``meta`` is the thread's record and ``messages`` its messages as just loaded under
        the lease; ``current`` the agent's fingerprints (its ``input`` unused); ``offered``
        the text a thread without messages is started with (its first prompt). The first
        input is not compared here: ``Agent.start`` refuses another one before anything
        runs (:func:`~core.fingerprints.first_input_error`). Returns the record as stored
        afterwards.

        Same definition: nothing is written. Changes (:func:`~core.fingerprints.changes`)
        on a thread with messages: :func:`~core.fingerprints.mismatch_error` unless
        ``accept_changes``, then the agent's fingerprints are recorded with an override
        naming the changes. A thread that recorded none (cubeloop's, older ones) records
        the agent's without refusing; so does one without messages, whatever it recorded
        (a run that died before its first message was saved wrote nothing else). The
        record names the thread's first user message as its input, or ``offered`` when it
        has none yet. Raises ``FingerprintMismatchError`` (nothing written) and what
        :meth:`record_fingerprints` raises.
        """
        stored = meta.fingerprints if meta is not None else None
        found = list(changes(stored, dataclasses.replace(current, input=None))) if stored is not None else []
        fresh = not messages
        if found and not fresh and not accept_changes:
            raise mismatch_error(self.thread_id, found)
        first = first_input(messages)
        if first is not None:
            named: str | None = input_fingerprint(first)
        elif offered is not None:
            named = input_fingerprint(offered)
        else:
            named = stored.input if stored is not None else None
        wanted = dataclasses.replace(current, input=named)
        if stored == wanted:
            return meta
        saved = await self.record_fingerprints(meta, wanted, overriding=() if fresh else tuple(found))
        return saved if saved is not None else meta
