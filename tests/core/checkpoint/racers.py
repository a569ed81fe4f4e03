"""Child-process bodies for the cross-process tests in ``test_sqlite_supervised.py``.

They run in processes started with multiprocessing's *spawn* method (a fresh
interpreter, no inherited threads or event loop), so they must live in an importable
module. Each opens its own :class:`SQLiteCheckpointer` on the same file and, round after
round, waits at a shared barrier and then races the other process for the same row.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import RunAlreadyClaimedError


def expired(lease: Lease) -> bool:
    """``is_stale`` for the races: every round's seeded lease has expired."""
    return lease.expires_at < time.time()


def race_leases(path: str, holder: str, rounds: int, barrier: Any, out: Any) -> None:
    """Per round, take over thread ``race-<i>``'s expired lease; report ``(round, won, other holder, start)``."""
    out.put((holder, asyncio.run(_race_leases(path, holder, rounds, barrier))))


async def _race_leases(path: str, holder: str, rounds: int, barrier: Any) -> list[tuple[int, bool, str | None, float]]:
    store = await SQLiteCheckpointer.open(path, create=False, busy_timeout=10)
    results = []
    for i in range(rounds):
        barrier.wait()  # blocks this child's loop on purpose: nothing else runs here
        now = time.time()
        lease = Lease(f"race-{i}", holder, os.getpid(), socket.gethostname(), None, now, now, now + 60)
        try:
            await store.acquire_lease(lease, is_stale=expired)
            results.append((i, True, None, now))
        except RunAlreadyClaimedError as error:
            results.append((i, False, error.lease.holder_id, now))  # type: ignore[attr-defined]
    await store.close()
    return results


def race_jobs(path: str, holder: str, rounds: int, barrier: Any, out: Any) -> None:
    """Per round, ``job_begin`` key ``k<i>`` of thread ``jobs``; report ``(round, attempts, status)``."""
    out.put((holder, asyncio.run(_race_jobs(path, rounds, barrier))))


async def _race_jobs(path: str, rounds: int, barrier: Any) -> list[tuple[int, int, str]]:
    store = await SQLiteCheckpointer.open(path, create=False, busy_timeout=10)
    results = []
    for i in range(rounds):
        barrier.wait()
        record = await store.job_begin("jobs", f"k{i}", tool_call_id=f"call-{i}")
        results.append((i, record.attempts, record.status))
    await store.close()
    return results
