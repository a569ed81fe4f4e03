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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

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

    async def append(self, thread_id: str, messages: Sequence[AnyMessage]) -> None:
        """Append ``messages`` in order, in one transaction, each tagged with its ``run_id``.

        Raises ``RunAlreadyCompletedError`` if a message names a run already completed.
        """
        ...

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        """Merge ``extra`` into the thread's extra object key by key, atomically."""
        ...

    async def list_threads(self) -> list[ThreadSummary]:
        """Every thread in the store, most recently active first."""
        ...

    async def claim_run(self, thread_id: str, run_id: str) -> None:
        """Record that ``run_id`` started on ``thread_id``.

        Raises ``RunAlreadyClaimedError`` if that run id is already claimed and not
        completed, ``RunAlreadyCompletedError`` if it completed.
        """
        ...

    async def mark_run_complete(self, thread_id: str, run_id: str) -> None:
        """Mark ``run_id`` completed and give it the next ``completion_seq``; idempotent.

        Raises ``RunNotClaimedError`` if the run was never claimed.
        """
        ...

    async def close(self) -> None:
        """Release connections; the object is unusable afterwards."""
        ...
