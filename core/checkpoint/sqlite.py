"""SQLite checkpointer on aiosqlite, sharing its tables with cubeloop.

The file holds cubeloop's tables (``messages``, ``thread_extra``, ``runs``,
``thread_pending_request``, ``thread_hitl_answers``) exactly as cubeloop creates them,
so either program opens the other's files, plus our own beside them: ``cubepi_schema``
(the schema version), an index on ``messages(thread_id, id)``, from schema v2 the
supervision tables (tool journal, jobs, leases, live events, commands) and from v3 the
thread records (owner, fingerprints, the extra's revision) and tool steps. The schema and
its migrations live in :mod:`core.checkpoint.sqlite_schema`.

A store is opened for one owner (``open(..., owner=...)``, :mod:`core.owners`): every read
carries the owner in its query and every write begins with the owner's admission, in its
own transaction (:mod:`core.checkpoint.sqlite_owners`), so another owner's thread reads and
refuses exactly like a missing one. Threads without a record (cubeloop's, ours before v3)
are unowned.

How a file is opened depends on what it is (see :meth:`SQLiteCheckpointer.open`):

* ours, at the version this module knows: read-write, WAL, short transactions;
* new (missing or without tables) and creating is allowed: created with the full schema;
* foreign (cubeloop's: no ``cubepi_schema``) or an older version of ours: **browse-only**
  through a read-only URI, so its bytes never change; :meth:`~SQLiteCheckpointer.upgrade`
  migrates it in one transaction once the user agrees. Meanwhile the supervision readers
  return ``None`` / empty and the writers raise ``ReadOnlyStoreError``;
* newer than this module knows: :class:`~core.errors.SchemaError`.

Every public call is one hop to aiosqlite's connection thread that runs a whole
transaction there (:mod:`~core.checkpoint.sqlite_queries` for cubeloop's tables,
:mod:`~core.checkpoint.sqlite_supervised` and :mod:`~core.checkpoint.sqlite_records` for
ours), so a call never leaves a transaction open and never interleaves with another call;
opening, modes and that call live in :mod:`~core.checkpoint.sqlite_file`. Writes take the
write lock first (``BEGIN IMMEDIATE``), so a compare-and-set reads and writes under it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Sequence
from typing import Any, Literal

from core.checkpoint import codec
from core.checkpoint import sqlite_answers as answers
from core.checkpoint import sqlite_listing as listing
from core.checkpoint import sqlite_owners as owners
from core.checkpoint import sqlite_queries as queries
from core.checkpoint import sqlite_records as records
from core.checkpoint import sqlite_supervised as supervised
from core.checkpoint.base import (
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
    StepRecord,
    ThreadMeta,
    ThreadSummary,
    check_command_kind,
    check_command_status,
    check_tool_phase,
    encode_fingerprints,
    encode_job_result,
    encode_override,
    encode_step_data,
)
from core.checkpoint.capabilities import (
    FileBacked,
    HumanAnswers,
    HumanRequests,
    ListingVersions,
    SchemaUpgrade,
    SupervisedStore,
)
from core.checkpoint.listing import FIRST_PROMPT_CHARS
from core.checkpoint.sqlite_file import SQLiteFile
from core.checkpoint.sqlite_pages import SQLitePages
from core.checkpoint.sqlite_queries import julianday_to_unix
from core.checkpoint.sqlite_schema import MIGRATIONS
from core.checkpoint.watch import watch_sqlite
from core.messages import AnyMessage

__all__ = ["FIRST_PROMPT_CHARS", "MIGRATIONS", "SQLiteCheckpointer", "julianday_to_unix"]


class SQLiteCheckpointer(
    SQLiteFile, SQLitePages, SupervisedStore, ListingVersions, HumanRequests, HumanAnswers, SchemaUpgrade, FileBacked
):
    """A :class:`~core.checkpoint.base.Checkpointer` and ``SupervisedStore`` in one SQLite file.

    Build it with ``await SQLiteCheckpointer.open(path, create=..., owner=...)`` (see
    :meth:`SQLiteFile.open <core.checkpoint.sqlite_file.SQLiteFile.open>`); it is also an
    async context manager that closes itself. All methods may raise ``StoreBusyError``
    (another process kept the file locked past every retry) and, for writes on a
    browse-only store, ``ReadOnlyStoreError``; every write on a thread may raise
    ``ThreadNotFoundError`` (:func:`~core.checkpoint.base.thread_unavailable`) when the
    thread is another owner's, having written nothing. Times returned are unix seconds.
    """

    _before_commit: supervised.BeforeCommit | None = None
    """Test seam, never set by the program: when set, each compare-and-set write
    (``save_extra``, ``save_fingerprints``, ``step_commit``, ``update_command``) calls it
    with the write's name and the ``sqlite3.Connection`` on the connection thread, inside
    its transaction, after its UPDATE and before its COMMIT, so a test can look at the
    uncommitted update, raise there (the transaction rolls back and the exception reaches
    the caller) or have the process killed there. Read once per call, when the call is made."""

    # --- the contract --------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``: messages in row-id order, undecodable rows in ``problems``;
        ``journal`` is ``None`` for a file without our journal table (cubeloop's, or our v1);
        ``meta`` ``None`` for a thread without a record. ``None`` for another owner's thread."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: queries.load(c, layout, owner, thread_id), "load")

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """See ``SupervisedStore.load_after``: rows with ``id > after_id`` (the row id index)."""
        layout, owner = self._layout, self._owner
        data = await self._run(lambda c: queries.load(c, layout, owner, thread_id, after_id), "load")
        return data if data is not None else CheckpointData()  # never: an after_id read returns data

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.append``: one transaction (the owner's admission and the lease
        fence included); ``created_at`` is the insert time."""
        if not messages:
            return
        self._check_writable()
        rows = [(thread_id, codec.encode(m), getattr(m, "run_id", None)) for m in messages]
        owner = self._owner
        await self._run_short(
            lambda c: queries.append(c, owner, thread_id, rows, holder_id, self.locked_since), "append"
        )

    async def save_extra(self, thread_id: str, extra: dict[str, Any], *, expected_revision: int | None = None) -> int:
        """See ``CheckedExtra.save_extra``: the revision's compare-and-set and the merge inside
        one ``BEGIN IMMEDIATE``; returns the new revision.

        Raises ``TypeError`` for values JSON cannot hold, ``ConflictError`` when
        ``expected_revision`` is not the stored one, and ``CorruptRecordError`` when the
        stored extra is not a JSON object (it is left unchanged rather than overwritten).
        """
        self._check_writable()
        patch = json.loads(codec.encode_extra(extra))  # the copy in; fails early on bad values
        owner, seam = self._owner, self._before_commit
        return await self._run(
            lambda c: queries.save_extra(c, owner, thread_id, patch, expected_revision, seam), "save"
        )

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.claim_run``; ``claimed_at`` is stored as ``julianday('now')``."""
        self._check_writable()
        owner = self._owner
        await self._run_short(
            lambda c: queries.claim_run(c, owner, thread_id, run_id, holder_id, self.locked_since), "claim"
        )

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.mark_run_complete``: ``completion_seq`` is the thread's next number."""
        self._check_writable()
        owner = self._owner
        await self._run_short(
            lambda c: queries.mark_run_complete(c, owner, thread_id, run_id, holder_id, self.locked_since),
            "completion",
        )

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None, holder_id: str | None = None
    ) -> None:
        """See ``HumanRequests.save_pending_request``: cubeloop's own statement on its table,
        fenced by ``holder_id`` in the same transaction."""
        self._check_writable()
        owner = self._owner
        await self._run(
            lambda c: queries.save_pending_request(
                c, owner, thread_id, request_json, run_id, holder_id, self.locked_since
            ),
            "save",
        )

    async def answer(self, thread_id: str, run_id: str | None, question_id: str, answer_json: str) -> None:
        """See ``HumanAnswers.answer``: one ``BEGIN IMMEDIATE`` (:mod:`core.checkpoint.sqlite_answers`)."""
        self._check_writable()
        layout, owner = self._layout, self._owner
        await self._run(
            lambda c: answers.answer(c, layout, owner, thread_id, run_id, question_id, answer_json), "answer"
        )

    async def load_answer(self, thread_id: str, run_id: str | None, question_id: str) -> str | None:
        """See ``HumanAnswers.load_answer``: cubeloop's row as it stored it."""
        layout, owner = self._layout, self._owner
        return await self._run(
            lambda c: answers.load_answer(c, layout, owner, thread_id, run_id, question_id), "answer read"
        )

    async def settle_request(
        self, thread_id: str, run_id: str | None, question_id: str, *, holder_id: str | None = None
    ) -> bool:
        """See ``HumanAnswers.settle_request``: one ``BEGIN IMMEDIATE`` (:mod:`core.checkpoint.sqlite_answers`)."""
        self._check_writable()
        layout, owner = self._layout, self._owner
        return await self._run(
            lambda c: answers.settle_request(
                c, layout, owner, thread_id, run_id, question_id, holder_id, self.locked_since
            ),
            "settle",
        )

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``: this owner's threads, in a handful of queries
        whatever the number of threads (the owner is a predicate inside each of them).

        Decodes only each thread's tail (from its last assistant row) and reads the first
        prompt without decoding its row (:mod:`core.checkpoint.sqlite_listing`); corrupt
        rows never break it.
        Each summary carries the thread's lease record (live or expired), if any.
        """
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: listing.summaries(c, layout, owner, None), "listing")

    async def thread_versions(self) -> dict[str, Hashable]:
        """See ``ThreadVersions.thread_versions``: one query of index probes per thread
        (:func:`core.checkpoint.sqlite_listing.thread_versions`), whoever wrote the file."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: listing.thread_versions(c, layout, owner), "listing")

    async def list_threads_and_versions(self) -> tuple[list[ThreadSummary], dict[str, Hashable]]:
        """See ``ListingVersions.list_threads_and_versions``: :meth:`thread_versions`'s query
        and :meth:`list_threads`'s in one read transaction, one hop to the connection thread
        (:func:`core.checkpoint.sqlite_listing.listing_and_versions`)."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: listing.listing_and_versions(c, layout, owner), "listing")

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        """See ``ThreadVersions.summaries``: :meth:`list_threads`'s queries, driven from the
        named threads of this owner's."""
        layout, owner, among = self._layout, self._owner, list(thread_ids)
        if not among:
            return []
        return await self._run(lambda c: listing.summaries(c, layout, owner, among), "listing")

    # --- owners, thread records, deletion -------------------------------------------------

    async def unowned_count(self) -> int:
        """See ``OwnerScoped.unowned_count``: listed threads without an owner, in one query."""
        layout = self._layout
        return await self._run(lambda c: owners.unowned_count(c, layout), "listing")

    async def load_meta(self, thread_id: str) -> ThreadMeta | None:
        """See ``ThreadRecords.load_meta``."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: records.load_meta(c, layout, owner, thread_id), "record read")

    async def save_fingerprints(
        self,
        thread_id: str,
        fingerprints: Fingerprints,
        *,
        expected_revision: int,
        override: FingerprintOverride | None = None,
    ) -> ThreadMeta:
        """See ``ThreadRecords.save_fingerprints``: one compare-and-set UPDATE of the thread's
        record inside one ``BEGIN IMMEDIATE``."""
        self._check_writable()
        text = encode_fingerprints(fingerprints)
        extra = None if override is None else encode_override(override)
        owner, seam = self._owner, self._before_commit
        return await self._run(
            lambda c: records.save_fingerprints(c, owner, thread_id, text, expected_revision, extra, seam),
            "fingerprints write",
        )

    async def delete_thread(self, thread_id: str) -> None:
        """See ``ThreadDeletion.delete_thread``: every table's rows of the thread in one
        transaction; a lease is live while ``expires_at`` is in the future."""
        self._check_writable()
        layout, owner = self._layout, self._owner
        now = time.time()
        await self._run(lambda c: records.delete_thread(c, layout, owner, thread_id, now), "deletion")

    # --- tool steps ----------------------------------------------------------------------

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
        """See ``ToolSteps.step_begin``: one ``BEGIN IMMEDIATE`` (insert unless there, then compare)."""
        self._check_writable()
        owner = self._owner
        return await self._run(
            lambda c: records.step_begin(
                c,
                owner,
                thread_id,
                key,
                input_fingerprint,
                workflow,
                total_steps,
                tool_call_id,
                holder_id,
                self.locked_since,
            ),
            "step start",
        )

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
        """See ``ToolSteps.step_commit``: the lesson's one conditional UPDATE (row count 1)
        inside one ``BEGIN IMMEDIATE``; ``TypeError`` for data JSON cannot hold, before any write."""
        text = encode_step_data(key, data)
        self._check_writable()
        owner, seam = self._owner, self._before_commit
        return await self._run(
            lambda c: records.step_commit(
                c,
                owner,
                thread_id,
                key,
                expected_revision,
                workflow,
                next_step,
                text,
                holder_id,
                self.locked_since,
                seam,
            ),
            "step commit",
        )

    async def step_get(self, thread_id: str, key: str) -> StepRecord | None:
        """See ``ToolSteps.step_get``."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: records.step_get(c, layout, owner, thread_id, key), "step read")

    async def list_steps(self, thread_id: str) -> list[StepRecord]:
        """See ``ToolSteps.list_steps``."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: records.list_steps(c, layout, owner, thread_id), "step read")

    # --- SupervisedStore: tool journal and jobs ------------------------------------------

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
        """See ``SupervisedStore.record_tool_event``: one upsert (after the lease fence, in one transaction).

        ``tool_name``, ``run_id`` and ``job_key`` overwrite the entry's only when given, so
        an ``end`` keeps what ``start`` wrote; a ``start`` clears an earlier end (a resume
        re-ran the call). Raises ``ValueError`` for another ``phase``.
        """
        check_tool_phase(phase)
        self._check_writable()
        when = time.time() if at is None else at
        owner = self._owner
        await self._run_short(
            lambda c: supervised.record_tool_event(
                c, owner, thread_id, tool_call_id, phase, tool_name, run_id, job_key, when, holder_id, self.locked_since
            ),
            "journal write",
        )

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """See ``SupervisedStore.load_journal``: ``None`` for a file without the journal table."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: supervised.read_journal(c, layout, owner, thread_id), "journal read")

    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """See ``SupervisedStore.job_begin``: one ``BEGIN IMMEDIATE``, atomic across processes.

        ``done``: returned unchanged. Absent: inserted as ``started``, ``attempts=1``.
        ``started`` (an earlier start crashed, or still runs elsewhere) or ``failed``: set to
        ``started`` again with ``attempts + 1``, a fresh ``started_at``, no result. So of
        any number of processes beginning one key, exactly one gets ``attempts == 1``; a
        caller that sees more should know another start happened (leases keep two
        runners off one thread, so that is normally a crashed start).
        """
        self._check_writable()
        owner = self._owner
        return await self._run(
            lambda c: supervised.job_begin(c, owner, thread_id, key, tool_call_id, holder_id, self.locked_since),
            "job start",
        )

    async def job_finish(
        self,
        thread_id: str,
        key: str,
        status: Literal["done", "failed"],
        result: Any = None,
        *,
        holder_id: str | None = None,
    ) -> None:
        """See ``SupervisedStore.job_finish``: status, JSON result and ``finished_at`` in one transaction.

        A job already ``done`` stays as it is (the first result wins: callers may have
        reused it). Raises ``KeyError`` if never begun, ``ValueError`` for another
        ``status``, ``TypeError`` when ``result`` is not JSON (nothing is written).
        """
        text = encode_job_result(key, status, result)
        self._check_writable()
        owner = self._owner
        await self._run(
            lambda c: supervised.job_finish(c, owner, thread_id, key, status, text, holder_id, self.locked_since),
            "job finish",
        )

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """See ``SupervisedStore.job_get``; ``None`` also for a file without the jobs table."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: supervised.job_get(c, layout, owner, thread_id, key), "job read")

    # --- SupervisedStore: leases ---------------------------------------------------------

    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """See ``SupervisedStore.acquire_lease``: read, decide and upsert in one ``BEGIN IMMEDIATE``.

        Of processes racing for one thread exactly one wins. ``is_stale`` runs on the
        connection thread while the write lock is held: it must be quick and must not
        touch the event loop (compare times, probe a pid). The lease is stored as given,
        unless the call waited a second or more for another program's write lock: then its
        times move on by that wait, so its time to live counts from the write; the lease as
        stored is returned.
        Raises ``RunAlreadyClaimedError`` ("Thread X is already running (holder pid P on
        HOST, heartbeat Ns ago).") with ``lease`` set to the current lease.
        """
        self._check_writable()
        called_at, owner = time.time(), self._owner
        return await self._run(lambda c: supervised.acquire_lease(c, owner, lease, is_stale, called_at), "lease")

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """See ``SupervisedStore.renew_lease``: one guarded UPDATE; ``False`` once another holder took it.
        Times move on by a wait for another program's lock, as in :meth:`acquire_lease`."""
        self._check_writable()
        called_at, owner = time.time(), self._owner
        return await self._run_short(
            lambda c: supervised.renew_lease(c, owner, thread_id, holder_id, heartbeat_at, expires_at, called_at),
            "heartbeat",
        )

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """See ``SupervisedStore.release_lease``."""
        self._check_writable()
        owner = self._owner
        await self._run(lambda c: supervised.release_lease(c, owner, thread_id, holder_id), "lease release")

    async def get_lease(self, thread_id: str) -> Lease | None:
        """See ``SupervisedStore.get_lease``."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: supervised.get_lease(c, layout, owner, thread_id), "lease read")

    async def list_leases(self) -> dict[str, Lease]:
        """See ``SupervisedStore.list_leases``: this owner's threads only."""
        layout, owner = self._layout, self._owner
        return await self._run(lambda c: supervised.all_leases(c, layout, owner), "lease read")

    # --- SupervisedStore: live events and commands ---------------------------------------

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """See ``SupervisedStore.append_live_events``: insert and prune in one transaction.

        Every event of a batch gets the same ``at``. Raises ``TypeError`` (nothing written)
        when an event is not JSON.
        """
        if not events:
            return
        texts = [json.dumps(e, separators=(",", ":")) for e in events]  # TypeError before any write
        self._check_writable()
        at, owner = time.time(), self._owner
        await self._run_short(
            lambda c: supervised.append_live_events(c, owner, thread_id, run_id, texts, at, keep), "live events"
        )

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """See ``SupervisedStore.read_live_events``."""
        layout, owner = self._layout, self._owner
        return await self._run(
            lambda c: supervised.read_live_events(c, layout, owner, thread_id, after_seq), "live read"
        )

    async def prune_live_events(self, thread_id: str) -> None:
        """See ``SupervisedStore.prune_live_events``."""
        self._check_writable()
        owner = self._owner
        await self._run(lambda c: supervised.prune_live_events(c, owner, thread_id), "live prune")

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """See ``SupervisedStore.send_command``; raises ``ValueError`` for an unknown ``kind``."""
        check_command_kind(kind)
        self._check_writable()
        owner = self._owner
        return await self._run(lambda c: supervised.send_command(c, owner, thread_id, kind, text), "command")

    async def update_command(
        self, seq: int, status: CommandStatus, note: str = "", *, expected_revision: int | None = None
    ) -> Command:
        """See ``Commands.update_command``: one conditional UPDATE (source statuses, revision,
        and the owner through the command's thread), so only the moves of
        ``COMMAND_TRANSITIONS`` happen, even between processes; ``ValueError`` for an unknown ``status``."""
        check_command_status(status)
        self._check_writable()
        layout, owner, seam = self._layout, self._owner, self._before_commit
        return await self._run(
            lambda c: supervised.update_command(c, layout, owner, seq, status, note, expected_revision, seam),
            "command update",
        )

    async def edit_command(self, seq: int, text: str, *, expected_revision: int) -> Command:
        """See ``Commands.edit_command``: one conditional UPDATE (pending, revision, owner)."""
        self._check_writable()
        layout, owner = self._layout, self._owner
        return await self._run(
            lambda c: supervised.edit_command(c, layout, owner, seq, text, expected_revision), "command edit"
        )

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """See ``SupervisedStore.list_commands``."""
        layout, owner = self._layout, self._owner
        wanted = None if statuses is None else list(statuses)
        return await self._run(
            lambda c: supervised.list_commands(c, layout, owner, thread_id, wanted, after), "command read"
        )

    async def change_token(self) -> tuple[int, int]:
        """See ``SupervisedStore.change_token``: ``(PRAGMA data_version, total_changes)`` of our connection.

        ``data_version`` moves when any other connection commits, ``total_changes`` when
        this one writes; one pragma, no table read. Also works on a browse-only file.
        """
        return await self._run(supervised.change_token, "change check")

    def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """See ``ChangeNotification.change_signals``: a watch on the file's directory
        (:func:`core.checkpoint.watch.watch_sqlite`), which sees every commit of any process."""
        return watch_sqlite(self.path, stop_event=stop, step_ms=quiet_ms)
