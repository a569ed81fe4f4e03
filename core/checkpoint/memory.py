"""In-memory checkpointer: the reference implementation of the contract in ``base.py``.

Nothing survives the process. Used by tests and by programs that need no persistence.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from core.checkpoint.base import CheckpointData, RunRecord, ThreadSummary
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


class MemoryCheckpointer:
    """A dict of threads guarded by one asyncio lock; copies in and out."""

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._lock = asyncio.Lock()
        self._seq = 0

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``."""
        async with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                return None
            return CheckpointData(
                messages=[copy_message(m) for m in t.messages],
                extra=_json_copy(t.extra),
                runs=list(t.runs.values()),
                message_ids=list(t.ids),
            )

    async def append(self, thread_id: str, messages: Sequence[AnyMessage]) -> None:
        """See ``Checkpointer.append``."""
        if not messages:
            return
        async with self._lock:
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

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        """See ``Checkpointer.save_extra``."""
        async with self._lock:
            t = self._threads.setdefault(thread_id, _Thread())
            t.extra.update(_json_copy(extra))
            t.touched = time.time()

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``."""
        async with self._lock:
            out = [
                ThreadSummary(
                    thread_id=tid,
                    message_count=len(t.messages),
                    last_activity=t.touched or None,
                    runs=tuple(t.runs.values()),
                    tail=tuple(copy_message(m) for m in _tail(t.messages)),
                    first_prompt=_first_prompt(t.messages),
                )
                for tid, t in self._threads.items()
            ]
        out.sort(key=lambda s: s.last_activity or 0.0, reverse=True)
        return out

    async def claim_run(self, thread_id: str, run_id: str) -> None:
        """See ``Checkpointer.claim_run``."""
        async with self._lock:
            t = self._threads.setdefault(thread_id, _Thread())
            existing = t.runs.get(run_id)
            if existing is not None:
                if existing.completed:
                    raise RunAlreadyCompletedError(f"Run {run_id} of thread {thread_id!r} already completed.")
                raise RunAlreadyClaimedError(f"Run {run_id} of thread {thread_id!r} is already running.")
            t.runs[run_id] = RunRecord(run_id=run_id, claimed_at=time.time())
            t.touched = time.time()

    async def mark_run_complete(self, thread_id: str, run_id: str) -> None:
        """See ``Checkpointer.mark_run_complete``."""
        async with self._lock:
            t = self._threads.get(thread_id)
            run = t.runs.get(run_id) if t else None
            if t is None or run is None:
                raise RunNotClaimedError(f"Run {run_id} of thread {thread_id!r} was never claimed.")
            if run.completed:
                return
            seq = 1 + max((r.completion_seq or 0 for r in t.runs.values()), default=0)
            t.runs[run_id] = RunRecord(run_id, run.claimed_at, time.time(), seq)

    async def close(self) -> None:
        """Nothing to release."""


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
    import json

    return json.loads(json.dumps(value))
