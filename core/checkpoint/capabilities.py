"""What a store can do beyond CubePi's three calls, as small protocols, and the one check.

A backend declares each capability it has by naming the protocol among its bases
(``class PostgresCheckpointer(ToolJournal, Jobs, Leases, ...)``), and callers ask
:func:`supports` before they use one. The check is nominal - the protocol must be among
the store's classes - so a store that merely has a method of the same name (cubeloop's
own checkpointers, a test double) is never taken for one that keeps our tables, and a
type checker sees the same protocols the check uses.

Method contracts (shapes, units, errors) are documented once, here. The records they
read and write (``Lease``, ``Command``, ...) and the rules on them (command moves, the
lease fence) live in :mod:`core.checkpoint.base`.

A store may have a capability and still be unable to write it for now: a database opened
browse-only (a cubeloop file, or an older schema of ours) returns ``None`` / empty from
the readers and raises ``ReadOnlyStoreError`` from the writers until
:meth:`SchemaUpgrade.upgrade` ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Sequence
from typing import Any, Literal, Protocol, TypeGuard, TypeVar

from core.checkpoint.base import (
    CheckpointData,
    Checkpointer,
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
)
from core.checkpoint.pages import MessagePage, RowReader, RowSink

C = TypeVar("C")


def supports(store: object, capability: type[C]) -> TypeGuard[C]:
    """Whether ``store`` declares ``capability`` (one of the protocols below) among its classes.

    Nominal on purpose (see the module docstring); ``False`` for ``None``. Never raises.
    """
    return store is not None and capability in type(store).__mro__


def lacking(store: object, capabilities: Sequence[type]) -> list[type]:
    """The protocols of ``capabilities`` that ``store`` does not declare (:func:`supports`), in order."""
    return [c for c in capabilities if not supports(store, c)]


class IncrementalReads(Protocol):
    """Reading only what is new of a thread (a follower's reads)."""

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """Like ``load``, but ``messages``, ``message_ids`` and the undecodable rows in
        ``problems`` hold only rows whose id is greater than ``after_id`` (a value from
        ``message_ids`` or a ``CorruptRow.row_id``); ``extra``, ``runs`` and ``journal`` are
        whole. Never ``None``: an unknown thread gives empty data. Costs what the new rows
        cost, not the whole thread (a 10,000-message thread is not decoded again)."""
        ...


class ThreadVersions(Protocol):
    """The thread listing read again only where it changed (the picker's watch,
    :func:`core.follow.watch_threads`): each thread's version, then the summaries of the
    threads whose version moved."""

    async def thread_versions(self) -> dict[str, Hashable]:
        """Every thread ``list_threads`` lists, by thread id, with its version: a value that
        differs after every write that changes the thread's summary (its messages, a run
        claimed or completed, its lease taken, renewed or released, its pending request
        set or cleared, its extra or its record written), by this program or another
        (cubeloop's rows included). Compare versions for equality only. Cheap: one query
        (or a few round trips) whatever the number of threads, no message decoded, work
        that does not grow with messages per thread. A thread absent here is gone."""
        ...

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        """The summaries of ``thread_ids`` exactly as ``list_threads`` gives them, in its
        order (``core.checkpoint.listing.in_listing_order``), from one snapshot; an id that
        is not a listed thread of this owner's (missing, gone, another owner's) is absent.
        Costs what those threads cost, not the whole listing."""
        ...


class ListingVersions(ThreadVersions, Protocol):
    """The whole listing and its versions in one read (the picker's first listing,
    :func:`core.follow.watch_threads`): one snapshot, so no write can fall between them,
    and one trip to the store instead of two. SQLite and Postgres declare it; Redis (a
    script per 500 threads each, no one snapshot) and the memory store (two reads in
    memory cost nothing) do not, and are read versions first."""

    async def list_threads_and_versions(self) -> tuple[list[ThreadSummary], dict[str, Hashable]]:
        """``(list_threads(), thread_versions())`` as both would give them at one instant:
        every summary's thread has its version, and the versions are those of the
        summaries given (a write after the read moves a version the next
        ``thread_versions`` shows)."""
        ...


class PagedReads(Protocol):
    """Reading a thread without holding all of it: its newest rows a page at a time, and
    every row once, handed over a chunk at a time (the thread view's reads, issue 10).
    Records: :mod:`core.checkpoint.pages`."""

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """The newest ``limit`` rows whose id is below ``before`` (a ``message_ids`` value
        or a ``CorruptRow.row_id``; ``None``: the thread's newest rows), in row order and
        decoded (undecodable ones in ``problems``), with how many rows come before them;
        in one query, one snapshot. An empty page for a missing thread or another owner's.
        Raises ``ValueError`` for a ``limit`` below 1 (:func:`~core.checkpoint.pages.check_limit`)."""
        ...

    async def load_streamed(
        self, thread_id: str, sink: RowSink, *, upto: Any = None, reader: RowReader | None = None
    ) -> CheckpointData | None:
        """``load``, except that the message rows (those with id at most ``upto`` when it
        is given) are read :data:`~core.checkpoint.pages.READ_CHUNK` at a time - decoded, or
        with a ``reader`` only what it reads of each (:func:`~core.checkpoint.pages.read_rows`:
        a row it refuses is decoded) - and handed to ``sink`` in row order, never all held:
        the result's ``messages`` and
        ``message_ids`` are empty and its ``problems`` holds only what is not a message
        row (an unreadable extra or record). Everything comes from one snapshot (SQLite,
        Postgres: one read transaction; Redis: one script per chunk over an append-only
        list, so the rows up to the first chunk's length). ``sink`` may be called on the
        store's own thread (SQLite's connection thread): it must not touch the event loop;
        what it raises ends the read and is raised. ``None`` where ``load`` gives ``None``."""
        ...


class ToolJournal(Protocol):
    """When each tool call started and ended, so a diagnosis need not guess."""

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

        Raises ``LeaseLostError`` when fenced by ``holder_id`` and the lease is not its
        (nothing written), ``ValueError`` for another ``phase``."""
        ...

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """Map tool call id -> entry; ``None`` when the store keeps no journal (a cubeloop file)."""
        ...


class Jobs(Protocol):
    """Idempotent jobs under deterministic keys (see :mod:`core.jobs`)."""

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
        begun, ``ValueError`` for another ``status``, ``TypeError`` when ``result`` is not JSON,
        ``LeaseLostError`` when fenced by ``holder_id`` and the lease is not its (nothing written).
        A job already done stays as it was."""
        ...

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """The job under ``key``, or ``None``."""
        ...


class Leases(Protocol):
    """Run exclusivity: one holder per thread until its lease expires (see :mod:`core.leases`).

    A store with this capability fences the writes of ``Checkpointer``, ``ToolJournal``
    and ``Jobs`` given ``holder_id=`` (see :mod:`core.checkpoint.base`, "Fenced writes").
    """

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


class LiveEvents(Protocol):
    """A bounded per-thread log of live events (text deltas, tool progress), pruned when a run ends."""

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


class Commands(Protocol):
    """Abort, steer and follow-up across processes: the durable outbox (see :mod:`core.supervisor`).

    Kinds and statuses are checked by :func:`core.checkpoint.base.check_command_kind` and
    :func:`~core.checkpoint.base.check_command_status`, moves by
    :func:`~core.checkpoint.base.check_command_move`, in every backend.
    """

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """Queue a command as ``pending`` and return it. Raises ``ValueError`` for an unknown ``kind``."""
        ...

    async def update_command(
        self, seq: int, status: CommandStatus, note: str = "", *, expected_revision: int | None = None
    ) -> Command:
        """Move a command to ``status`` (with ``note``) and return it with its revision one
        higher, checked and written in one transaction (a conditional UPDATE): only the moves
        in ``COMMAND_TRANSITIONS`` are made. Raises ``CommandTransitionError`` (``command``:
        the command as stored, unchanged) when its current status does not allow the move,
        e.g. it was discarded meanwhile; ``ConflictError`` when ``expected_revision`` is
        given and the command's revision differs; ``KeyError`` for an unknown ``seq`` or a
        command of a thread this store's owner cannot see (the same sentence for both);
        ``ValueError`` for an unknown ``status``."""
        ...

    async def edit_command(self, seq: int, text: str, *, expected_revision: int) -> Command:
        """Replace the text of a still ``pending`` command and return it with its revision one
        higher: a compare-and-set on the command row, checked and written in one transaction,
        so a runner that delivered it meanwhile is never overtaken (the user's edit and the
        runner's ``delivered`` cannot both win). Raises ``ConflictError`` when the command's
        revision is not ``expected_revision`` (it was edited or moved meanwhile),
        ``CommandTransitionError`` (``command``: as stored) when it is no longer ``pending``
        (:func:`~core.checkpoint.base.check_command_edit`), ``KeyError`` as ``update_command``."""
        ...

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """The thread's commands in ``seq`` order, optionally only those in ``statuses``;
        only those with ``seq > after`` (a follower's high-water mark, so a command sent and
        settled between two looks is still seen)."""
        ...


class ChangeNotification(Protocol):
    """Learning cheaply that anything in the store changed, from any process (see :mod:`core.changes`)."""

    async def change_token(self) -> Hashable:
        """A cheap value that differs whenever any thread's data changed since it was last read."""
        ...

    def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """Yield ``None`` soon after changes committed by any process (SQLite: a file watch;
        Postgres: LISTEN/NOTIFY; Redis: a stream read; memory: in-process), batched so that
        a steady writer yields a few times a second; may yield when nothing changed (the
        caller checks :meth:`change_token`). Ends when ``stop`` is set. Raises what the
        store raises when it cannot watch at all; callers fall back to polling the token."""
        ...


class HumanRequests(Protocol):
    """The pending human request of a thread (cubeloop's ``save_pending_request``).

    ``load`` and ``list_threads`` report it in ``pending_request``. cubeloop's programs
    write it when they ask; a run of ours writes it through this call before it waits,
    fenced by its lease (``holder_id=``), and clears it through
    :meth:`HumanAnswers.settle_request` once the answer is applied.
    """

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None, holder_id: str | None = None
    ) -> None:
        """Set (or with ``None`` clear) the thread's pending request, in one transaction.
        ``request_json`` is ``core.hitl.HumanRequest.model_dump_json()``, stored as given.
        With ``holder_id`` the write is fenced like a run's other writes (``LeaseLostError``,
        nothing written, when that holder does not hold a live lease): a runner that lost
        its thread can then never replace the request the new holder waits on. Unfenced
        (cubeloop's call) without it. ``ThreadNotFoundError`` as :class:`OwnerScoped` says."""
        ...


class HumanAnswers(Protocol):
    """The one answer to a thread's pending request (cubeloop's ``thread_hitl_answers``:
    SQLite ``thread_hitl_answers``, Postgres ``cubepi_hitl_answers``, Redis a hash of ours,
    memory a dict), recorded exactly once.

    Anyone may answer (a person in the app, ``cubepi-tui answer``, another process): the
    answer is not fenced by the lease. Only the lease holder applies it, and settles the
    request after the tool's result is appended. A ``run_id`` of ``None`` names the pending
    request of no run and is stored as ``''``, as cubeloop stores it. Answers are JSON text
    as :mod:`core.hitl` builds them (checking them against the request is the caller's
    job: :func:`core.hitl_replies.check_answer`). Every write here changes :meth:`ChangeNotification.change_token`
    and wakes ``change_signals``, so a runner waiting in another process sees the answer.
    """

    async def answer(self, thread_id: str, run_id: str | None, question_id: str, answer_json: str) -> None:
        """Record ``answer_json`` as the answer to ``question_id`` of run ``run_id``, in one
        transaction (one Lua script on Redis): the thread's pending request must be that
        question of that run, then a plain insert that fails on the key (thread, run,
        question). Never an upsert: cubeloop's ``save_hitl_answer`` overwrites (the
        last writer wins), which is the double application this prevents. Raises
        ``StaleAnswerError`` when the pending request is another question, another run's
        or none; ``AlreadyAnsweredError`` (with the stored answer) when the question has an
        answer already, even an identical one; ``ThreadNotFoundError`` as
        :class:`OwnerScoped` says for a thread unavailable to this owner; ``ReadOnlyStoreError``
        on a browse-only store. Nothing is written then."""
        ...

    async def load_answer(self, thread_id: str, run_id: str | None, question_id: str) -> str | None:
        """The answer JSON recorded for ``question_id`` of run ``run_id``, as stored; ``None``
        when there is none or the thread is unavailable to this owner."""
        ...

    async def settle_request(
        self, thread_id: str, run_id: str | None, question_id: str, *, holder_id: str | None = None
    ) -> bool:
        """Once the answer is applied (the asking call's result appended): in one
        transaction, clear the pending request if it still is ``question_id`` of run
        ``run_id`` and then delete that run's answers (what cubeloop's resume does,
        loop.py:350-358). ``True`` when it cleared the request, ``False`` (nothing
        changed) when it was not that question any more, so a second settle is a no-op.
        ``holder_id`` fences it as for :meth:`HumanRequests.save_pending_request`
        (``LeaseLostError``); ``ThreadNotFoundError`` as :class:`OwnerScoped` says."""
        ...


class OwnerScoped(Protocol):
    """A store opened for one owner (:mod:`core.owners`): every read and write it makes is
    filtered by that owner in the query itself.

    What that means for each call, on every backend:

    * reads (``load``, ``load_after``, ``list_threads``, ``load_journal``, ``job_get``,
      ``get_lease``, ``list_leases``, ``read_live_events``, ``list_commands``, the step and
      meta readers) see only this owner's threads: another owner's reads as missing
      (``None`` / empty / absent from lists), with the same queries and no count of them;
    * ``change_token`` may change for any owner's writes (it only says "look again");
    * writes to a thread that does not exist create it, owned by this owner (the unowned
      scope creates it with no owner); writes to another owner's thread, or from a named
      owner to an unowned thread, raise :func:`~core.checkpoint.base.thread_unavailable`'s
      ``ThreadNotFoundError`` and write nothing, the check made inside the write's own
      transaction (or Lua script);
    * ``update_command`` of another owner's command raises ``KeyError`` as for an unknown seq.
    """

    @property
    def owner(self) -> str:
        """The owner this store was opened for (:data:`core.owners.UNOWNED` for the unowned scope)."""
        ...

    async def unowned_count(self) -> int:
        """How many threads record no owner (so a named owner's empty list can say that
        ``--unowned`` opens them); never counts another named owner's threads."""
        ...


class CheckedExtra(Protocol):
    """``save_extra`` with a revision (compare-and-set), beside cubeloop's plain merge."""

    async def save_extra(self, thread_id: str, extra: dict[str, Any], *, expected_revision: int | None = None) -> int:
        """Merge ``extra`` key by key, atomically, and return the extra's new revision (one
        higher; ``CheckpointData.extra_revision`` reads it). With ``expected_revision``
        the merge is made only when the stored revision equals it (0: never saved), in the
        same transaction; otherwise ``ConflictError`` names the thread and both revisions and
        nothing is written. ``ThreadNotFoundError`` as :class:`OwnerScoped` says."""
        ...


class ThreadRecords(Protocol):
    """Each thread's owner and fingerprints record (:class:`~core.checkpoint.base.ThreadMeta`)."""

    async def load_meta(self, thread_id: str) -> ThreadMeta | None:
        """The thread's record, ``None`` when the thread is unavailable to this owner or
        keeps none (cubeloop's threads read with ``owner=UNOWNED`` and revision 0 when
        they exist)."""
        ...

    async def save_fingerprints(
        self,
        thread_id: str,
        fingerprints: Fingerprints,
        *,
        expected_revision: int,
        override: FingerprintOverride | None = None,
    ) -> ThreadMeta:
        """Record ``fingerprints`` (and append ``override`` to the overrides, when given),
        compare-and-set on the record's revision: ``expected_revision`` 0 for a thread that
        recorded none yet. Returns the record with its revision one higher. Raises
        ``ConflictError`` (both revisions) when another writer was first, and
        ``ThreadNotFoundError`` as :class:`OwnerScoped` says; nothing is written then."""
        ...


class ToolSteps(Protocol):
    """Committed progress of long tools (:class:`~core.checkpoint.base.StepRecord`), the
    lesson's store given to tools through ``ToolContext.steps`` (:mod:`core.steps`)."""

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
        """The step record of job ``key``, created at ``next_step`` 0, revision 0 when new;
        the existing one, unchanged, when ``input_fingerprint`` and ``workflow`` match.
        Raises ``ConflictError`` (:func:`~core.checkpoint.base.input_conflict`) when they
        differ; ``LeaseLostError`` when fenced by ``holder_id`` and not the holder;
        ``ThreadNotFoundError`` as :class:`OwnerScoped` says."""
        ...

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
        """Write ``next_step``, ``data`` (JSON) and ``revision = revision + 1`` in one
        ``UPDATE ... WHERE revision = expected AND workflow = ...`` whose row count must be 1,
        inside one transaction (checks first, then the write, then commit: an exception or
        a kill before the commit leaves the earlier record exactly as it was). Returns the
        new record. Raises ``ConflictError`` (both revisions; or ``input_conflict`` for
        another workflow) when the row does not match, ``KeyError`` when the step record was
        never begun, ``TypeError`` for data JSON cannot hold, ``LeaseLostError`` as for
        ``step_begin``; nothing is written then."""
        ...

    async def step_get(self, thread_id: str, key: str) -> StepRecord | None:
        """Job ``key``'s step record, ``None`` if never begun (or the thread is unavailable)."""
        ...

    async def list_steps(self, thread_id: str) -> list[StepRecord]:
        """Every step record of the thread, by ``key``."""
        ...


class ThreadDeletion(Protocol):
    """Removing a whole thread."""

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread and everything stored for it (messages, extra, runs, pending
        request, journal, jobs, steps, live events, commands, lease, its record), in one
        transaction. Raises ``ThreadNotFoundError`` (the same sentence for missing and
        another owner's), ``RunAlreadyClaimedError`` (with the lease) while a live lease
        holds it, ``ReadOnlyStoreError`` on a browse-only store; nothing is deleted then."""
        ...


class SchemaUpgrade(Protocol):
    """A store that opens a foreign or older database browse-only until the user agrees to upgrade."""

    @property
    def needs_upgrade(self) -> bool:
        """Whether writes are refused until :meth:`upgrade` ran."""
        ...

    async def upgrade(self) -> None:
        """Add our tables (or migrate older ones) in one transaction; existing rows are unchanged.
        Raises ``DatabaseOpenError`` when the database cannot be written."""
        ...

    @property
    def upgrade_explanation(self) -> str:
        """What :meth:`upgrade` will do to this store, in a few sentences ending with the
        question the app asks before it upgrades. A backend whose upgrade does more than
        add its own records (SQLite also switches the journal mode) says so in its own."""
        return (
            "This database was written by another program (cubeloop) or an older version and is open "
            "for browsing only. To write to it, cubepi-tui adds its own records beside the existing ones; "
            "no existing record is changed and cubeloop can still read and write it. Upgrade now?"
        )


class FileBacked(Protocol):
    """A store kept in one local file, which can be deleted or replaced while it is open (SQLite)."""

    def check_file(self) -> None:
        """Raise ``DatabaseGoneError`` (one sentence naming the path) when the file this store
        opened is no longer at its path; call it before reporting work as saved."""
        ...


class SupervisedStore(
    IncrementalReads,
    ThreadVersions,
    ToolJournal,
    Jobs,
    Leases,
    LiveEvents,
    Commands,
    ChangeNotification,
    OwnerScoped,
    CheckedExtra,
    ThreadRecords,
    ToolSteps,
    ThreadDeletion,
    Protocol,
):
    """Everything supervision and safe resume use beyond ``Checkpointer``: every backend of
    ours (memory, SQLite, Postgres, Redis) declares it, and the contract suite tests it."""


# --- what a caller needs of several -------------------------------------------------------
# For signatures only: no store names these among its bases, so supports() of one is False;
# check each part (``lacking(store, LIVE)``).


class CommandStore(Checkpointer, Leases, Commands, Protocol):
    """What sending and settling commands uses (:mod:`core.commands`): the thread, its lease, its commands."""


class WatchedStore(Checkpointer, ChangeNotification, Protocol):
    """What watching the thread list uses (:func:`core.follow.watch_threads`)."""


class LiveStore(CommandStore, LiveEvents, ChangeNotification, Protocol):
    """What following a run in another process and commanding it use: a
    :class:`~core.supervisor.Supervisor` writes live events and takes commands, a
    :class:`~core.follow.ThreadFollower` and the app read them. The capabilities to
    check are :data:`LIVE`."""


LIVE: tuple[type, ...] = (Leases, LiveEvents, Commands, ChangeNotification)
"""The capabilities of :class:`LiveStore` beyond ``Checkpointer``, for :func:`lacking`."""
