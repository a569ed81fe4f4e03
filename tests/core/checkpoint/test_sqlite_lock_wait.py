"""A locked SQLite database is waited on with bounded backoff, and leases taken after the wait
still have their whole time to live. Every lock here is held by a real second process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.checkpoint.sqlite_schema import LEASES
from core.errors import LeaseLostError, StoreBusyError
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


# --- fenced writes that waited for a lock: the wait does not count against the lease --------

SHORT_TTL = 3.0  # seconds: the lease expires while the lock (held twice as long) is waited out


async def _leased_store(path: Path, *, expires_in: float) -> SQLiteCheckpointer:
    store = await SQLiteCheckpointer.open(path)
    now = time.time()
    await store.acquire_lease(Lease("t1", "h1", 1, "box", "r1", now, now, now + expires_in), is_stale=lambda _: False)
    await store.claim_run("t1", "r1")
    return store


async def test_a_lease_that_expires_while_another_program_holds_the_lock_stays_the_runs(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await _leased_store(path, expires_in=SHORT_TTL)
    try:
        expires_at = (await store.get_lease("t1")).expires_at
        holder = LockHolder(path, 2 * SHORT_TTL).start()
        try:
            await store.append("t1", [user_text("the finished reply", run_id="r1")], holder_id="h1")
            written_at = time.time()
        finally:
            holder.stop()
        assert written_at > expires_at + 1.0  # the lease had expired by the time the write got in
        lease = await store.get_lease("t1")
        # Moved on by the wait: it keeps what it had left when the lock began (almost SHORT_TTL).
        assert lease is not None and lease.holder_id == "h1" and lease.expires_at > written_at + 1.0
        await store.mark_run_complete("t1", "r1", holder_id="h1")  # the next write needs no wait
        data = await store.load("t1")
    finally:
        await store.close()
    assert [m.text for m in data.messages] == ["the finished reply"] and data.runs[0].completed


async def test_a_lease_that_expired_before_the_lock_stays_lost(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await _leased_store(path, expires_in=-5.0)
    try:
        holder = LockHolder(path, SHORT_TTL).start()
        try:
            with pytest.raises(LeaseLostError) as error:
                await store.append("t1", [user_text("too late", run_id="r1")], holder_id="h1")
        finally:
            holder.stop()
        assert error.value.why == "it expired without a heartbeat"
        data = await store.load("t1")
    finally:
        await store.close()
    assert data.messages == []


async def test_a_lease_taken_over_by_the_program_holding_the_lock_stays_lost(tmp_path: Path) -> None:
    # The other program takes the lease over inside its locked transaction (the first
    # holder's lease expires meanwhile); once it commits, the first holder's write is refused.
    path = tmp_path / "threads.sqlite"
    store = await _leased_store(path, expires_in=SHORT_TTL)
    takeover = (
        f"UPDATE {LEASES} SET holder_id = 'h2', pid = 2, host = 'other', expires_at = ? WHERE thread_id = 't1'",
        [time.time() + 600],
    )
    try:
        holder = LockHolder(path, 2 * SHORT_TTL, statements=[takeover]).start()
        try:
            with pytest.raises(LeaseLostError) as error:
                await store.append("t1", [user_text("after the takeover", run_id="r1")], holder_id="h1")
        finally:
            holder.stop()
        assert error.value.why == "process 2 on other took the thread over"
        assert not await store.renew_lease("t1", "h1", time.time(), time.time() + 15)
        data = await store.load("t1")
        lease = await store.get_lease("t1")
    finally:
        await store.close()
    assert data.messages == [] and lease is not None and lease.holder_id == "h2"


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
        assert sentence == f"The database {path} stayed locked by another program for 2 s; try again when it is free."
        assert waits == list(range(1, len(waits) + 1)) and len(waits) >= 3  # retried, each retry reported
        await store.append("t1", [user_text("through")])  # the lock released: it works again
    finally:
        await store.close()
