"""The Postgres store's one-statement writes (our PL/pgSQL functions, schema v2): their
refusals are the same one sentence as before and write nothing, and the fence judges the
lease at the time the statement got past the locks, not when it was sent."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from core.checkpoint.base import Lease
from core.errors import CorruptRecordError, LeaseLostError, RunAlreadyCompletedError
from core.messages import user_text
from tests.helpers.pg import new_store

pytestmark = pytest.mark.postgres

WAIT = 60.0  # seconds; a liveness bound, reached only by a failing test


async def test_an_append_to_a_completed_run_is_one_sentence_and_writes_nothing() -> None:
    store = await new_store("completed")
    try:
        await store.claim_run("t", "r1")
        await store.append("t", [user_text("go", run_id="r1")])
        await store.mark_run_complete("t", "r1")
        with pytest.raises(RunAlreadyCompletedError) as error:
            await store.append("t", [user_text("late", run_id="r2"), user_text("later", run_id="r1")])
        assert str(error.value) == "Run r1 of thread 't' is already completed, so nothing was appended."
        data = await store.load("t")
        assert [m.text for m in data.messages] == ["go"]  # type: ignore[union-attr]
        await store.append("t", [user_text("next", run_id="r2")])  # the thread's lock was let go
        assert (await store.load("t")).message_ids == [1, 2]  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_save_extra_onto_an_extra_that_is_not_an_object_is_one_sentence() -> None:
    store = await new_store("extra")
    admin = await asyncpg.connect(store._url, timeout=10)
    try:
        await store.save_extra("t", {"k": 1})
        await admin.execute("UPDATE cubepi_threads SET extra = '[1, 2]'::jsonb WHERE thread_id = 't'")
        with pytest.raises(CorruptRecordError) as error:
            await store.save_extra("t", {"k": 2})
        assert str(error.value) == (
            "The extra data of thread 't' is not a JSON object, so it was left unchanged and the new keys were not saved."
        )
        assert (error.value.thread_id, error.value.row_id) == ("t", "extra")
        assert await admin.fetchval("SELECT extra::text FROM cubepi_threads WHERE thread_id = 't'") == "[1, 2]"
    finally:
        await admin.close()
        await store.close()


async def test_a_lease_that_expires_while_the_append_waits_for_the_thread_lock_refuses_it() -> None:
    store = await new_store("waits")
    admin = await asyncpg.connect(store._url, timeout=10)
    loop = asyncio.get_running_loop()
    try:
        now = time.time()
        lease = Lease("t", "me", 1, "box", None, now, now, now + 2.0)
        await store.acquire_lease(lease, is_stale=lambda _: False)
        await store.append("t", [user_text("before")], holder_id="me")
        # cubeloop's per-thread lock, held elsewhere: the append is sent while the lease is
        # live and waits inside its statement until the lease has expired.
        await admin.execute("SELECT pg_advisory_lock(hashtext('t'))")
        writing = asyncio.ensure_future(store.append("t", [user_text("too late")], holder_id="me"))
        deadline = loop.time() + WAIT
        while not await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND application_name = 'cubepi-tui'"
        ):
            assert loop.time() < deadline
            await asyncio.sleep(0.02)
        while time.time() <= lease.expires_at + 0.2:
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        await admin.execute("SELECT pg_advisory_unlock(hashtext('t'))")
        with pytest.raises(LeaseLostError) as error:
            await asyncio.wait_for(writing, WAIT)
        assert error.value.why == "it expired without a heartbeat"
        assert [m.text for m in (await store.load("t")).messages] == ["before"]  # type: ignore[union-attr]
    finally:
        await admin.close()
        await store.close()
