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
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Any, Literal, Protocol, TypeGuard, TypeVar

from core.checkpoint.base import (
    CheckpointData,
    Checkpointer,
    Command,
    CommandKind,
    CommandStatus,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
)

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
    """Abort, steer and follow-up across processes: the durable outbox (see :mod:`core.supervise`).

    Kinds and statuses are checked by :func:`core.checkpoint.base.check_command_kind` and
    :func:`~core.checkpoint.base.check_command_status`, moves by
    :func:`~core.checkpoint.base.check_command_move`, in every backend.
    """

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """Queue a command as ``pending`` and return it. Raises ``ValueError`` for an unknown ``kind``."""
        ...

    async def update_command(self, seq: int, status: CommandStatus, note: str = "") -> Command:
        """Move a command to ``status`` (with ``note``) and return it, checked and written in
        one transaction (a conditional UPDATE): only the moves in ``COMMAND_TRANSITIONS``
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

    ``load`` and ``list_threads`` report it in ``pending_request``; this project only
    ever reads it (the program that asked clears it when answered), but a store that
    keeps it can be given one, as cubeloop gives it.
    """

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None
    ) -> None:
        """Set (or with ``None`` clear) the thread's pending request, in one transaction."""
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


class SupervisedStore(IncrementalReads, ToolJournal, Jobs, Leases, LiveEvents, Commands, ChangeNotification, Protocol):
    """Everything supervision and safe resume use beyond ``Checkpointer``: every backend of
    ours (memory, SQLite, Postgres, Redis) declares it, and the contract suite tests it."""


# --- what a caller needs of several -------------------------------------------------------
# For signatures only: no store names these among its bases, so supports() of one is False;
# check each part (``lacking(store, LIVE)``).


class CommandStore(Checkpointer, Leases, Commands, Protocol):
    """What sending and settling commands uses (:mod:`core.supervise`): the thread, its lease, its commands."""


class WatchedStore(Checkpointer, ChangeNotification, Protocol):
    """What watching the thread list uses (:func:`core.follow.watch_threads`)."""


class LiveStore(CommandStore, LiveEvents, ChangeNotification, Protocol):
    """What following a run in another process and commanding it use: a
    :class:`~core.supervise.Supervisor` writes live events and takes commands, a
    :class:`~core.follow.ThreadFollower` and the app read them. The capabilities to
    check are :data:`LIVE`."""


LIVE: tuple[type, ...] = (Leases, LiveEvents, Commands, ChangeNotification)
"""The capabilities of :class:`LiveStore` beyond ``Checkpointer``, for :func:`lacking`."""
