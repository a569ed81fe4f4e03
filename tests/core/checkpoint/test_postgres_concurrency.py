"""Many writers on one Postgres database at once: real processes appending to one thread,
many connections merging extra, and change signals from another program's commits."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from core.checkpoint.postgres import PostgresCheckpointer
from core.owners import UNOWNED
from tests.helpers.pg import new_store

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[3]
WAIT = 120.0  # seconds; a liveness bound on a loaded 2-core machine, reached only by a failing test


async def test_processes_appending_to_one_thread_keep_every_message_once_in_one_order() -> None:
    store = await new_store("procs", owner=UNOWNED)  # cubeloop writes the thread too: it is unowned
    try:
        writers = {"a": "ours", "b": "ours", "c": "cubeloop"}
        count = 40
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.helpers.pg_appender",
                store._url,
                "t",
                name,
                str(count),
                who,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for name, who in writers.items()
        ]
        outputs = await asyncio.wait_for(asyncio.gather(*(c.communicate() for c in children)), WAIT)
        for child, (out, err) in zip(children, outputs, strict=True):
            assert child.returncode == 0 and out.strip() == b"done", err.decode()
        data = await store.load("t")
        assert data is not None and data.problems == []
        assert data.message_ids == list(range(1, 3 * count + 1))
        texts = [m.text for m in data.messages]  # type: ignore[union-attr]
        assert sorted(texts) == sorted(f"{n}-{i}" for n in writers for i in range(count))
        for name in writers:
            assert [t for t in texts if t.startswith(f"{name}-")] == [f"{name}-{i}" for i in range(count)]
        (summary,) = await store.list_threads()
        assert summary.message_count == 3 * count  # the trigger-kept stats saw every writer
    finally:
        await store.close()


async def test_a_hundred_concurrent_extra_writers_on_separate_connections_lose_no_key() -> None:
    store = await new_store("extra")
    others = [await PostgresCheckpointer.open(store._url, create=False) for _ in range(4)]
    try:
        stores = [store, *others]
        await asyncio.wait_for(
            asyncio.gather(*(stores[i % len(stores)].save_extra("t", {f"k{i}": i}) for i in range(100))), WAIT
        )
        data = await store.load("t")
        assert data is not None and data.extra == {f"k{i}": i for i in range(100)}
    finally:
        for other in others:
            await other.close()
        await store.close()


async def test_change_signals_wake_on_another_programs_commit_and_survive_a_dropped_listener() -> None:
    import asyncpg
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres

    store = await new_store("signals", owner=UNOWNED)  # cubeloop's thread "t" is unowned
    stop = asyncio.Event()
    signals = asyncio.Queue[None]()

    async def watch() -> None:
        async for _ in store.change_signals(stop, quiet_ms=10):
            signals.put_nowait(None)

    watcher = asyncio.ensure_future(watch())
    try:
        admin = await asyncpg.connect(store._url, timeout=10)
        try:
            # the watch is listening once its connection is there
            await _until(lambda: _listeners(admin), "the LISTEN connection")
            async with CubeloopPostgres(store._url) as theirs:
                await theirs.save_extra("t", {"from": "cubeloop"})
            await asyncio.wait_for(signals.get(), WAIT)
            while not signals.empty():
                signals.get_nowait()
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%'"
            )
            await asyncio.wait_for(signals.get(), WAIT)  # the one yield after re-listening
            await _until(lambda: _listeners(admin), "the LISTEN connection again")
            while not signals.empty():
                signals.get_nowait()
            await store.append_live_events("t", None, [{"type": "x"}])
            await asyncio.wait_for(signals.get(), WAIT)
        finally:
            await admin.close()
    finally:
        stop.set()
        await asyncio.wait_for(watcher, WAIT)
        await store.close()


async def _listeners(admin: object) -> bool:
    return bool(
        await admin.fetchval(  # type: ignore[attr-defined]
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
    )


async def _until(check: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited {WAIT} s for {what}"
        await asyncio.sleep(0.05)
