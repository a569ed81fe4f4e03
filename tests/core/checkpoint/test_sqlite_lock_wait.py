"""A locked SQLite database is waited on with bounded backoff, and leases taken after the wait
still have their whole time to live. Every lock here is held by a real second process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import StoreBusyError
from core.messages import user_text
from tests.helpers.locks import LockHolder

TTL = 15.0


def _lease(holder: str = "h1") -> Lease:
    now = time.time()
    return Lease("t1", holder, 1, "box", "r1", now, now, now + TTL)


async def test_a_lease_taken_after_waiting_for_a_lock_keeps_its_whole_time_to_live(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path)
    try:
        holder = LockHolder(path, 3.0).start()
        try:
            wanted = _lease()
            taken = await store.acquire_lease(wanted, is_stale=lambda lease: False)
            written_at = time.time()
        finally:
            holder.stop()
        assert written_at - wanted.heartbeat_at >= 2.5  # it did wait for the lock
        # Stamped before the wait, it would expire some 3 s early; moved on, it counts from the write.
        assert taken.expires_at >= written_at + TTL - 1.0
        assert await store.get_lease("t1") == taken

        holder = LockHolder(path, 3.0).start()
        try:
            before = time.time()
            assert await store.renew_lease("t1", "h1", before, before + TTL)
            renewed_at = time.time()
        finally:
            holder.stop()
        stored = await store.get_lease("t1")
        assert stored is not None and stored.expires_at >= renewed_at + TTL - 1.0
    finally:
        await store.close()


async def test_a_lease_written_without_waiting_is_stored_exactly_as_given(tmp_path: Path) -> None:
    async with await SQLiteCheckpointer.open(tmp_path / "threads.sqlite") as store:
        old = Lease("t1", "h1", 1, "box", "r1", 100.0, 100.0, 115.0)  # long expired, on purpose
        assert await store.acquire_lease(old, is_stale=lambda lease: False) == old
        assert await store.get_lease("t1") == old


async def test_a_lock_held_past_the_budget_gives_up_within_it_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    waits: list[int] = []
    store = await SQLiteCheckpointer.open(path, busy_timeout=0.2, lock_wait=2.0, on_busy=waits.append)
    try:
        holder = LockHolder(path, 30.0).start()
        try:
            with pytest.raises(StoreBusyError) as error:
                await store.append("t1", [user_text("blocked")])
            still_held = holder.proc is not None and holder.proc.poll() is None
        finally:
            holder.stop()
        assert still_held  # it gave up on its own budget, not because the lock went away
        sentence = str(error.value)
        assert "\n" not in sentence
        assert sentence.endswith(" stayed locked by another program for about 2 s, so the append did not happen.")
        assert waits == list(range(1, len(waits) + 1)) and len(waits) >= 3  # retried, each retry reported
        await store.append("t1", [user_text("through")])  # the lock released: it works again
    finally:
        await store.close()
