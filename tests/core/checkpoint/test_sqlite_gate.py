"""Short writes on the caller's thread (core/checkpoint/sqlite_gate.py): where each write ran,
that none overtakes a call made before it, that another program's lock never blocks the
event loop, and that a durable store keeps every write on the connection's thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.checkpoint.sqlite_gate import CHECKPOINT_EVERY, call
from core.messages import user_text


async def _trace_threads(store: SQLiteCheckpointer) -> list[tuple[int, str]]:
    """``(thread ident, statement)`` of every statement the store's connection runs from now on."""
    seen: list[tuple[int, str]] = []
    assert store._db is not None
    await call(store._db, lambda c: c.set_trace_callback(lambda sql: seen.append((threading.get_ident(), sql))))
    return seen


def _inserts(seen: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(ident, sql) for ident, sql in seen if sql.startswith("INSERT INTO messages")]


async def _texts(store: SQLiteCheckpointer, thread_id: str) -> list[str]:
    data = await store.load(thread_id)
    assert data is not None
    return [m.text for m in data.messages]


async def test_an_append_on_an_idle_store_runs_on_the_callers_thread(tmp_path: Path) -> None:
    async with await SQLiteCheckpointer.open(tmp_path / "s.sqlite") as store:
        await store.append("t", [user_text("first")])  # learns the journal mode
        seen = await _trace_threads(store)
        await store.append("t", [user_text("second")])
        assert _inserts(seen) and {ident for ident, _ in _inserts(seen)} == {threading.get_ident()}
        assert await _texts(store, "t") == ["first", "second"]


async def test_a_durable_store_keeps_every_write_on_the_connection_thread(tmp_path: Path) -> None:
    async with await SQLiteCheckpointer.open(tmp_path / "s.sqlite", durable=True) as store:
        await store.append("t", [user_text("first")])
        seen = await _trace_threads(store)
        await store.append("t", [user_text("second")])
        assert _inserts(seen) and threading.get_ident() not in {ident for ident, _ in _inserts(seen)}


async def test_a_write_never_overtakes_a_call_made_before_it(tmp_path: Path) -> None:
    async with await SQLiteCheckpointer.open(tmp_path / "s.sqlite") as store:
        await store.append("t", [user_text("0")])
        assert store._db is not None
        release = threading.Event()
        # A queued call holds the connection thread; the appends made meanwhile must wait behind it.
        held = asyncio.ensure_future(store._run(lambda c: release.wait(10), "hold"))
        first = asyncio.ensure_future(store.append("t", [user_text("1")]))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(store.append("t", [user_text("2")]))
        await asyncio.sleep(0.05)
        assert not first.done() and not second.done()
        release.set()
        await asyncio.gather(held, first, second)
        assert await _texts(store, "t") == ["0", "1", "2"]


async def test_another_programs_lock_sends_the_write_to_the_queue_without_blocking_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    async with await SQLiteCheckpointer.open(path) as store:
        await store.append("t", [user_text("before")])
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
        try:
            write = asyncio.ensure_future(store.append("t", [user_text("after")]))
            ticks = 0
            started = time.monotonic()
            while time.monotonic() - started < 0.3:
                await asyncio.sleep(0.01)
                ticks += 1
            assert not write.done()
            assert ticks >= 10, "the event loop was blocked while another program held the lock"
        finally:
            other.execute("ROLLBACK")
            other.close()
        await asyncio.wait_for(write, 10)
        assert await _texts(store, "t") == ["before", "after"]


async def test_writes_from_two_threads_at_once_all_land(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    async with await SQLiteCheckpointer.open(path) as store:
        loop = asyncio.get_running_loop()

        def elsewhere() -> None:
            # A second thread with its own loop, writing through the same store meanwhile.
            async def writes() -> None:
                for i in range(100):
                    await store.append("b", [user_text(f"b{i}")])

            asyncio.run(writes())

        other = loop.run_in_executor(None, elsewhere)
        for i in range(100):
            await store.append("a", [user_text(f"a{i}")])
        await other
        assert await _texts(store, "a") == [f"a{i}" for i in range(100)]
        assert await _texts(store, "b") == [f"b{i}" for i in range(100)]


async def test_a_call_queued_from_another_thread_waits_for_the_one_running_in_place(tmp_path: Path) -> None:
    async with await SQLiteCheckpointer.open(tmp_path / "s.sqlite") as store:
        db, gate = store._db, store._gate
        assert db is not None
        events: list[str] = []
        started = threading.Event()

        def other_thread() -> None:
            async def queue_one() -> None:
                pending = asyncio.ensure_future(gate.queued(db, lambda c: events.append("queued ran")))
                await asyncio.sleep(0)
                started.set()
                await pending

            asyncio.run(queue_one())

        def in_place(c: sqlite3.Connection) -> None:
            thread = threading.Thread(target=other_thread)
            thread.start()
            started.wait(5)
            time.sleep(0.2)  # the connection thread would have run the queued call by now
            events.append("in place done")
            thread_holder.append(thread)

        thread_holder: list[threading.Thread] = []
        assert gate.in_place(db, in_place) is None
        thread_holder[0].join(5)
        assert events == ["in place done", "queued ran"]


async def test_a_reader_holding_an_old_snapshot_makes_every_write_ask_for_a_checkpoint(tmp_path: Path) -> None:
    """While a checkpoint cannot copy every frame back, the next write in place asks for
    another (as SQLite's own is tried at each commit past its threshold); once one copies
    everything, checkpoints are spaced again. Spaced only, the WAL grew to ~800 MB beside
    such a reader."""
    path = tmp_path / "s.sqlite"
    async with await SQLiteCheckpointer.open(path) as store:
        await store.append("t", [user_text("first")])
        seen = await _trace_threads(store)

        def checkpoints() -> int:
            return sum("wal_checkpoint(PASSIVE)" in sql for _, sql in seen)

        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # holds this snapshot
        try:
            for i in range(2 * CHECKPOINT_EVERY):
                await store.append("t", [user_text(f"held {i}")])
            await asyncio.sleep(0.05)
            held = checkpoints()
        finally:
            reader.execute("COMMIT")
            reader.close()
        for i in range(3 * CHECKPOINT_EVERY):
            await store.append("t", [user_text(f"free {i}")])
        await asyncio.sleep(0.05)
        free = checkpoints() - held
        assert held >= CHECKPOINT_EVERY // 4, f"only {held} checkpoints while the reader held its snapshot"
        assert 1 <= free <= 6, f"{free} checkpoints for {3 * CHECKPOINT_EVERY} writes once nothing held one back"
