"""PostgreSQL checkpointer on asyncpg, sharing its tables with cubeloop's ``PostgresCheckpointer``.

The database holds cubeloop 0.15.3's schema v5 exactly as cubeloop creates it
(``cubepi_threads``, ``cubepi_messages`` hash-partitioned in 64, ``cubepi_runs``,
``cubepi_hitl_answers``, ``cubepi_schema_version``), read and written statement for
statement as cubeloop does (its per-thread advisory lock for seq allocation, its run
rules, its msgpack payloads), so both programs can append to one thread at once; ours
sit beside them, prefixed ``cubepi_tui_`` (:mod:`core.checkpoint.postgres_schema`).

How a database is opened (read-write, created, browse-only until :meth:`upgrade`,
refused) is :meth:`PostgresStore.open <core.checkpoint.postgres_store.PostgresStore.open>`;
every call is one transaction on a pooled connection, retried through
:func:`core.checkpoint.reconnect.with_reconnect` when the connection breaks, and every
write is idempotent across those retries (a write id in its own transaction). The hot
writes (append, ``save_extra``, tool events, live events, heartbeats) are one statement
each, a function of ours doing the whole write on the server: one round trip.

A store is opened for one owner (``open(..., owner=...)``, :mod:`core.owners`). Every query
carries that owner in its own text (the thread record's owner compared with it), and every
write passes the server's owner admission first, in its own transaction: a thread of
another owner reads as missing and refuses writes with
:func:`~core.checkpoint.base.thread_unavailable`. Threads without a record - cubeloop's,
and ours from before schema v3 - are unowned (:data:`core.owners.UNOWNED`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Literal

from core.checkpoint import codec
from core.checkpoint import postgres_answers as answers
from core.checkpoint import postgres_listing as listing
from core.checkpoint import postgres_queries as queries
from core.checkpoint import postgres_rows as rows
from core.checkpoint import postgres_supervised as supervised
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
    encode_job_result,
    encode_step_data,
)
from core.checkpoint.capabilities import HumanAnswers, HumanRequests, ListingVersions, SchemaUpgrade, SupervisedStore
from core.checkpoint.postgres_pages import PostgresPages
from core.checkpoint.postgres_store import PostgresStore
from core.messages import AnyMessage

__all__ = ["PostgresCheckpointer"]


class PostgresCheckpointer(
    PostgresStore, PostgresPages, SupervisedStore, ListingVersions, HumanRequests, HumanAnswers, SchemaUpgrade
):
    """A :class:`~core.checkpoint.base.Checkpointer` and ``SupervisedStore`` in one PostgreSQL database.

    Build it with ``await PostgresCheckpointer.open(url, create=..., on_status=..., owner=...)``;
    it is also an async context manager that closes itself. Every method may raise
    ``StoreConnectionError`` (the server stayed unreachable past every retry) and, for
    writes on a browse-only store, ``ReadOnlyStoreError``; every write to another owner's
    thread (or from a named owner to an unowned one) raises ``ThreadNotFoundError``
    (:func:`~core.checkpoint.base.thread_unavailable`) and writes nothing. Times returned
    are unix seconds.
    """

    # --- the contract --------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``: messages in seq order, undecodable rows in ``problems``;
        ``journal`` is ``None`` without our tables (a cubeloop database, browsed)."""
        ours, scope = self._ours, self._scope
        return await self._read(lambda c: queries.load(c, scope, thread_id, None, ours), "load")

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """See ``SupervisedStore.load_after``: rows with ``seq > after_id`` (the primary key's order)."""
        ours, scope = self._ours, self._scope
        data = await self._read(lambda c: queries.load(c, scope, thread_id, int(after_id), ours), "load")
        return data if data is not None else CheckpointData()

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.append``: one statement, one round trip (our ``cubepi_tui_append``):
        cubeloop's per-thread lock, the lease fence, the batch in one INSERT."""
        if not messages:
            return
        self._check_writable()
        encoded = [rows.encode_message(m) for m in messages]
        owner = self._owner
        await self._write_call(lambda c, w: queries.append(c, w, owner, thread_id, encoded, holder_id), "append")

    async def save_extra(self, thread_id: str, extra: dict[str, Any], *, expected_revision: int | None = None) -> int:
        """See ``CheckedExtra.save_extra``: one statement (``cubepi_tui_save_extra``) doing the
        owner admission, the compare-and-set of the extra's revision (kept in the thread's
        record) and cubeloop's upsert merged by the server (JSONB ``||``), in one transaction.

        Raises ``ConflictError`` (both revisions) when ``expected_revision`` is given and
        stale, ``TypeError`` for values JSON cannot hold and ``CorruptRecordError`` when the
        stored extra is not a JSON object (it is left unchanged rather than overwritten).
        """
        patch = codec.encode_extra(extra)  # the copy in; fails early on bad values
        owner = self._owner
        return await self._write_call(
            lambda c, w: queries.save_extra(c, w, owner, thread_id, patch, expected_revision), "save"
        )

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.claim_run``; ``claimed_at`` is the server's ``now()``, as cubeloop stamps it."""
        await self._write_owned("claim", queries.claim_run, thread_id, run_id, holder_id)

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.mark_run_complete``: ``completion_seq`` is the thread's next number."""
        await self._write_owned("completion", queries.mark_run_complete, thread_id, run_id, holder_id)

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None, holder_id: str | None = None
    ) -> None:
        """See ``HumanRequests.save_pending_request``: cubeloop's statements on its row, and the
        exact text in ours (JSONB keeps the value, not the text); fenced by ``holder_id``."""
        now = time.time()
        await self._write_owned("save", queries.save_pending_request, thread_id, request_json, run_id, now, holder_id)

    async def answer(self, thread_id: str, run_id: str | None, question_id: str, answer_json: str) -> None:
        """See ``HumanAnswers.answer``: one transaction (:mod:`core.checkpoint.postgres_answers`)."""
        await self._write_owned("answer", answers.answer, thread_id, run_id, question_id, answer_json)

    async def load_answer(self, thread_id: str, run_id: str | None, question_id: str) -> str | None:
        """See ``HumanAnswers.load_answer``: JSONB's text of the stored answer (the same value
        cubeloop stored; its keys may read in another order)."""
        scope = self._scope
        return await self._read(lambda c: answers.load_answer(c, scope, thread_id, run_id, question_id), "answer read")

    async def settle_request(
        self, thread_id: str, run_id: str | None, question_id: str, *, holder_id: str | None = None
    ) -> bool:
        """See ``HumanAnswers.settle_request``: one transaction (:mod:`core.checkpoint.postgres_answers`)."""
        return await self._write_owned("settle", answers.settle_request, thread_id, run_id, question_id, holder_id)

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``: this owner's threads, in four queries whatever
        their number (each driven from this owner's threads), each thread's counts from our
        trigger-kept stats table (browsing: one aggregate). Decodes only each thread's tail
        and unpacks its first user row (:mod:`core.checkpoint.postgres_listing`); corrupt
        rows never break it."""
        ours, scope = self._ours, self._scope
        return await self._read(lambda c: listing.summaries(c, scope, ours, None), "listing")

    async def thread_versions(self) -> dict[str, Hashable]:
        """See ``ThreadVersions.thread_versions``: one query of index probes per thread
        (:func:`core.checkpoint.postgres_listing.thread_versions`), whoever wrote the rows."""
        ours, scope = self._ours, self._scope
        return await self._read(lambda c: listing.thread_versions(c, scope, ours), "listing")

    async def list_threads_and_versions(self) -> tuple[list[ThreadSummary], dict[str, Hashable]]:
        """See ``ListingVersions.list_threads_and_versions``: :meth:`thread_versions`'s query
        and :meth:`list_threads`'s in one repeatable-read transaction (one snapshot)."""
        ours, scope = self._ours, self._scope

        async def both(c: Any) -> tuple[list[ThreadSummary], dict[str, Hashable]]:
            versions = await listing.thread_versions(c, scope, ours)
            return await listing.summaries(c, scope, ours, None), versions

        return await self._read(both, "listing")

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        """See ``ThreadVersions.summaries``: :meth:`list_threads`'s queries, driven from the
        named threads of this owner's."""
        ours, scope, among = self._ours, self._scope, list(thread_ids)
        if not among:
            return []
        return await self._read(lambda c: listing.summaries(c, scope, ours, among), "listing")

    async def unowned_count(self) -> int:
        """See ``OwnerScoped.unowned_count``: thread rows without an owner (one count)."""
        scope = self._scope
        return await self._read(lambda c: queries.unowned_count(c, scope), "listing")

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
        """See ``SupervisedStore.record_tool_event``: the fence and one upsert in one statement.

        ``tool_name``, ``run_id`` and ``job_key`` overwrite the entry's only when given, so
        an ``end`` keeps what ``start`` wrote; a ``start`` clears an earlier end. Raises
        ``ValueError`` for another ``phase``.
        """
        check_tool_phase(phase)
        when = time.time() if at is None else at
        owner = self._owner
        await self._write_call(
            lambda c, w: supervised.record_tool_event(
                c, w, owner, thread_id, tool_call_id, phase, tool_name, run_id, job_key, when, holder_id
            ),
            "journal write",
        )

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """See ``SupervisedStore.load_journal``: ``None`` without our tables."""
        if not self._ours:
            return None
        scope = self._scope
        return await self._read(lambda c: supervised.read_journal(c, scope, thread_id), "journal read")

    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """See ``SupervisedStore.job_begin``: insert-or-lock in one transaction, atomic across
        processes: of any number beginning one key, exactly one gets ``attempts == 1``."""
        return await self._write_owned("job start", supervised.job_begin, thread_id, key, tool_call_id, holder_id)

    async def job_finish(
        self,
        thread_id: str,
        key: str,
        status: Literal["done", "failed"],
        result: Any = None,
        *,
        holder_id: str | None = None,
    ) -> None:
        """See ``SupervisedStore.job_finish``: a job already ``done`` stays as it is. Raises
        ``KeyError`` if never begun, ``ValueError`` for another ``status``, ``TypeError`` when
        ``result`` is not JSON (nothing is written)."""
        text = encode_job_result(key, status, result)
        await self._write_owned("job finish", supervised.job_finish, thread_id, key, status, text, holder_id)

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """See ``SupervisedStore.job_get``; ``None`` also without our tables."""
        if not self._ours:
            return None
        scope = self._scope
        return await self._read(lambda c: supervised.job_get(c, scope, thread_id, key), "job read")

    # --- SupervisedStore: leases ---------------------------------------------------------

    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """See ``SupervisedStore.acquire_lease``: read, decide and upsert under a per-thread
        advisory lock, so of processes racing for one thread exactly one wins. ``is_stale``
        runs while that lock is held: it must be quick. Raises ``RunAlreadyClaimedError``
        ("Thread X is already running (holder pid P on HOST, heartbeat Ns ago).") with
        ``lease`` set to the current lease. Returns the lease as stored, with its revision."""
        scope = self._scope
        return await self._write(
            lambda c: supervised.acquire_lease(c, scope, lease, is_stale), "lease", lease.thread_id
        )

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """See ``SupervisedStore.renew_lease``: one UPDATE guarded by the holder, one statement."""
        owner = self._owner
        return await self._write_call(
            lambda c, w: supervised.renew_lease(c, w, owner, thread_id, holder_id, heartbeat_at, expires_at),
            "heartbeat",
        )

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """See ``SupervisedStore.release_lease``."""
        await self._write_owned("lease release", supervised.release_lease, thread_id, holder_id)

    async def get_lease(self, thread_id: str) -> Lease | None:
        """See ``SupervisedStore.get_lease``; ``None`` without our tables."""
        if not self._ours:
            return None
        scope = self._scope
        return await self._read(lambda c: supervised.get_lease(c, scope, thread_id), "lease read")

    async def list_leases(self) -> dict[str, Lease]:
        """See ``SupervisedStore.list_leases``: this owner's threads' leases; empty without our tables."""
        if not self._ours:
            return {}
        scope = self._scope
        return await self._read(lambda c: supervised.all_leases(c, scope), "lease read")

    # --- SupervisedStore: live events and commands ---------------------------------------

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """See ``SupervisedStore.append_live_events``: insert and prune in one statement;
        every event of a batch gets the same ``at``. Raises ``TypeError`` (nothing written)
        when an event is not JSON."""
        if not events:
            return
        texts = [json.dumps(e, separators=(",", ":")) for e in events]  # TypeError before any write
        at, owner = time.time(), self._owner
        await self._write_call(
            lambda c, w: supervised.append_live_events(c, w, owner, thread_id, run_id, texts, at, keep), "live events"
        )

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """See ``SupervisedStore.read_live_events``; empty without our tables."""
        if not self._ours:
            return []
        scope = self._scope
        return await self._read(lambda c: supervised.read_live_events(c, scope, thread_id, after_seq), "live read")

    async def prune_live_events(self, thread_id: str) -> None:
        """See ``SupervisedStore.prune_live_events``."""
        await self._write_owned("live prune", supervised.prune_live_events, thread_id)

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """See ``SupervisedStore.send_command`` (revision 1); raises ``ValueError`` for an unknown ``kind``."""
        check_command_kind(kind)
        return await self._write_owned("command", supervised.send_command, thread_id, kind, text)

    async def update_command(
        self, seq: int, status: CommandStatus, note: str = "", *, expected_revision: int | None = None
    ) -> Command:
        """See ``Commands.update_command``: one conditional UPDATE by ``seq``, joined to the
        command's thread owner, so only the moves of ``COMMAND_TRANSITIONS`` happen, at the
        expected revision, even between processes; ``ValueError`` for an unknown ``status``."""
        check_command_status(status)
        scope = self._scope
        return await self._write(
            lambda c: supervised.update_command(c, scope, seq, status, note, expected_revision),
            "command update",
            None,
        )

    async def edit_command(self, seq: int, text: str, *, expected_revision: int) -> Command:
        """See ``Commands.edit_command``: one conditional UPDATE by ``seq`` (pending, revision,
        the command's thread owner)."""
        scope = self._scope
        return await self._write(
            lambda c: supervised.edit_command(c, scope, seq, text, expected_revision), "command edit", None
        )

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """See ``SupervisedStore.list_commands``; empty without our tables."""
        if not self._ours:
            return []
        wanted, scope = (None if statuses is None else list(statuses)), self._scope
        return await self._read(lambda c: supervised.list_commands(c, scope, thread_id, wanted, after), "command read")

    # --- tool steps, thread records, deletion ---------------------------------------------

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
        """See ``ToolSteps.step_begin``: insert-or-lock in one transaction."""
        return await self._write_owned(
            "step start",
            supervised.step_begin,
            thread_id,
            key,
            input_fingerprint,
            workflow,
            total_steps,
            tool_call_id,
            holder_id,
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
        """See ``ToolSteps.step_commit``: the admission, the fence and the lesson's one
        ``UPDATE ... WHERE revision = expected AND workflow = ...`` (row count 1) in one
        transaction. Another workflow is reported before a stale revision."""
        text = encode_step_data(key, data)  # TypeError before any round trip
        return await self._write_owned(
            "step commit",
            supervised.step_commit,
            thread_id,
            key,
            expected_revision,
            workflow,
            next_step,
            text,
            holder_id,
        )

    async def step_get(self, thread_id: str, key: str) -> StepRecord | None:
        """See ``ToolSteps.step_get``; ``None`` before schema v3 (browsing an older store)."""
        if not self._scope.records:
            return None
        scope = self._scope
        return await self._read(lambda c: supervised.step_get(c, scope, thread_id, key), "step read")

    async def list_steps(self, thread_id: str) -> list[StepRecord]:
        """See ``ToolSteps.list_steps``; empty before schema v3."""
        if not self._scope.records:
            return []
        scope = self._scope
        return await self._read(lambda c: supervised.list_steps(c, scope, thread_id), "step read")

    async def load_meta(self, thread_id: str) -> ThreadMeta | None:
        """See ``ThreadRecords.load_meta``: one query; cubeloop's threads read unowned at revision 0."""
        scope = self._scope
        return await self._read(lambda c: supervised.load_meta(c, scope, thread_id), "record read")

    async def save_fingerprints(
        self,
        thread_id: str,
        fingerprints: Fingerprints,
        *,
        expected_revision: int,
        override: FingerprintOverride | None = None,
    ) -> ThreadMeta:
        """See ``ThreadRecords.save_fingerprints``: the admission and one UPDATE at the
        expected revision, in one transaction."""
        return await self._write_owned(
            "fingerprints", supervised.save_fingerprints, thread_id, fingerprints, expected_revision, override
        )

    async def delete_thread(self, thread_id: str) -> None:
        """See ``ThreadDeletion.delete_thread``: one transaction under cubeloop's per-thread
        lock. A lease is live while its ``expires_at`` is ahead of this client's clock."""
        await self._write_owned("delete", supervised.delete_thread, thread_id)
