"""The Postgres store's connections cut under it (``pg_terminate_backend`` from an admin
connection, a commit whose acknowledgement is lost on the way back): every call gets
through on a new connection, ``on_status`` hears "reconnecting" then "back", nothing is
lost and nothing is written twice."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.checkpoint.base import Lease
from core.checkpoint.postgres import PostgresCheckpointer
from core.checkpoint.reconnect import StoreStatus, delays_within
from core.errors import StoreConnectionError
from core.messages import user_text
from tests.helpers.pg import new_store
from tests.helpers.pg_proxy import CommitDropper

pytestmark = pytest.mark.postgres

WAIT = 60.0  # seconds; a liveness bound, reached only by a failing test


async def _terminate_ours(admin: asyncpg.Connection, where: str = "") -> int:
    return len(
        await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'cubepi-tui'" + where
        )
    )


async def test_connections_cut_between_calls_are_replaced() -> None:
    store = await new_store("between")
    admin = await asyncpg.connect(store._url, timeout=10)
    try:
        await store.append("t", [user_text("one")])
        assert await _terminate_ours(admin) >= 1
        await store.append("t", [user_text("two")])
        assert await _terminate_ours(admin) >= 1
        data = await store.load("t")
        assert [m.text for m in data.messages] == ["one", "two"]  # type: ignore[union-attr]
    finally:
        await admin.close()
        await store.close()


async def test_a_connection_cut_during_a_write_is_retried_once_it_is_back() -> None:
    statuses: list[StoreStatus] = []
    store = await new_store("during", on_status=statuses.append)
    admin = await asyncpg.connect(store._url, timeout=10)
    try:
        await store.append("t", [user_text("one")])
        # Hold cubeloop's per-thread lock, so our append waits inside its transaction ...
        await admin.execute("SELECT pg_advisory_lock(hashtext('t'))")
        writing = asyncio.ensure_future(store.append("t", [user_text("two"), user_text("three")]))
        deadline = asyncio.get_running_loop().time() + WAIT
        while not await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND application_name = 'cubepi-tui'"
        ):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        # ... and cut its connection there.
        assert await _terminate_ours(admin, " AND wait_event_type = 'Lock'") == 1
        await admin.execute("SELECT pg_advisory_unlock(hashtext('t'))")
        await asyncio.wait_for(writing, WAIT)
        data = await store.load("t")
        assert [m.text for m in data.messages] == ["one", "two", "three"]  # type: ignore[union-attr]
        assert data.message_ids == [1, 2, 3]  # type: ignore[union-attr]
        assert statuses[0].reconnecting and statuses[0].attempt == 1
        assert statuses[-1] == StoreStatus(False)
    finally:
        await admin.close()
        await store.close()


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"))


async def test_a_commit_whose_acknowledgement_was_lost_is_not_written_twice() -> None:
    origin = await new_store("lostack")
    host = urlsplit(origin._url)
    proxy = CommitDropper(host.hostname or "127.0.0.1", host.port or 5432)
    port = await proxy.start()
    statuses: list[StoreStatus] = []
    store = await PostgresCheckpointer.open(_through(origin._url, port), create=False, on_status=statuses.append)
    now = time.time()
    await origin.acquire_lease(Lease("t", "me", 1, "here", None, now, now, now + 600), is_stale=lambda _: False)
    try:
        calls = {
            "append": lambda: store.append("t", [user_text("once")]),
            "fenced append": lambda: store.append("t", [user_text("fenced")], holder_id="me"),
            "claim_run": lambda: store.claim_run("t", "r1"),
            "send_command": lambda: store.send_command("t", "steer", "left"),
            "job_begin": lambda: store.job_begin("t", "k"),
            "save_extra": lambda: store.save_extra("t", {"k": 1}),
            "live events": lambda: store.append_live_events("t", None, [{"type": "delta"}]),
            "tool event": lambda: store.record_tool_event("t", "c1", "start", tool_name="read", holder_id="me"),
            "renew_lease": lambda: store.renew_lease("t", "me", now + 1, now + 601),
        }
        results = {}
        for name, call in calls.items():
            statuses.clear()
            proxy.arm()
            dropped = proxy.dropped
            results[name] = await asyncio.wait_for(call(), WAIT)
            assert proxy.dropped == dropped + 1, f"{name}: its commit's answer was withheld"
            assert statuses and statuses[0].reconnecting and statuses[-1] == StoreStatus(False), name
        data = await origin.load("t")
        assert [m.text for m in data.messages] == ["once", "fenced"]  # type: ignore[union-attr]
        assert [(r.run_id, r.completed) for r in data.runs] == [("r1", False)]  # type: ignore[union-attr]
        commands = await origin.list_commands("t")
        assert [c.text for c in commands] == ["left"] and results["send_command"] == commands[0]
        job = await origin.job_get("t", "k")
        assert job is not None and job.attempts == 1 and results["job_begin"] == job
        assert data.extra == {"k": 1}  # type: ignore[union-attr]
        assert [e.data for e in await origin.read_live_events("t")] == [{"type": "delta"}]
        assert list(data.journal or {}) == ["c1"]
        assert results["renew_lease"] is True
        lease = await origin.get_lease("t")
        assert lease is not None and lease.expires_at == now + 601
    finally:
        await store.close()
        await proxy.close()
        await origin.close()


async def test_a_server_gone_for_good_is_one_error_per_call_and_no_driver_noise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The pool kept a floor of one connection, which asyncpg reopened in a task of its own,
    # outside the reconnect policy, logging a traceback each second ("Failed to restore the
    # pool connection floor; retrying") for as long as the server stayed away: a runner
    # whose server was gone printed them to its stderr until it exited.
    from tests.helpers.cut_proxy import CutProxy, through

    origin = await new_store("gone")
    proxy = CutProxy.to(origin._url)
    port = await proxy.start()
    store = await PostgresCheckpointer.open(
        through(origin._url, port), create=False, reconnect_delays=delays_within(1.5)
    )
    caplog.set_level(logging.WARNING)
    try:
        await store.append("t", [user_text("one")])
        await proxy.cut()
        for _ in range(3):  # each call retries for 1.5 s, then says so once
            with pytest.raises(StoreConnectionError, match=r"could not get it back in 1\.5 s, so the append"):
                await store.append("t", [user_text("two")])
        assert [r.getMessage() for r in caplog.records if r.name.startswith("asyncpg")] == []
        await proxy.restore()
        await store.append("t", [user_text("three")])
        data = await origin.load("t")
        assert [m.text for m in data.messages] == ["one", "three"]  # type: ignore[union-attr]
    finally:
        await store.close()
        await proxy.close()
        await origin.close()
