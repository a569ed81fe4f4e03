"""A runner whose database file is deleted or replaced under it stops with an error.

SQLite keeps writing to the file it opened even after the path is unlinked or renamed
over, so the runner used to print every message, say "run completed" and exit 0 while
nothing it wrote could ever be read again.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import DatabaseGoneError
from core.messages import user_text
from tests.helpers.supervise import runner_argv


def _argv(db: Path) -> list[str]:
    return runner_argv(db, "t1", "--agent", "tests.supervise.child:make_agent", "do the work")


@pytest.mark.parametrize(
    "how, release",
    [("deleted", True), ("replaced", True), ("deleted", False)],
    ids=["deleted, then a message", "replaced, then a message", "deleted, seen by the heartbeat"],
)
async def test_a_runner_whose_database_vanished_stops_non_zero(db: Path, spawn, how: str, release: bool) -> None:
    runner = spawn(db, "t1", argv=_argv(db))
    await runner.file("started-1")  # the tool runs: the user message and the first reply are saved
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    else:
        other = db.with_name("other.sqlite")
        sqlite3.connect(other).close()
        os.replace(other, db)
    if release:  # the tool's result is the next write; else the tool waits for the abort
        runner.gate("release-1")
    status = await runner.wait()
    out, err = runner.output()
    assert status == 1, (out, err)
    assert "run completed" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(db) in lines[0] and f"was {how}" in lines[0], lines[0]


async def test_a_store_refuses_calls_once_its_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path)
    try:
        await store.list_threads()
        store.check_file()  # still the file it opened: no error
        path.rename(tmp_path / "moved.sqlite")
        with pytest.raises(DatabaseGoneError, match="was deleted"):
            await store.list_threads()
        with pytest.raises(DatabaseGoneError, match="was deleted"):
            store.check_file()
    finally:
        await store.close()


async def test_a_file_put_in_place_of_a_runners_database_keeps_its_own_data(db: Path, spawn) -> None:
    # SQLite finds a WAL by the database's path: the runner's -wal, left beside a file that
    # replaced its database, was replayed into that file by the next program to open it,
    # wiping out the replacement's own threads.
    other = db.with_name("other.sqlite")
    async with await SQLiteCheckpointer.open(other, create=True) as theirs:
        await theirs.append("theirs", [user_text(f"message {i}") for i in range(7)])
    runner = spawn(db, "t1", argv=_argv(db))
    await runner.file("started-1")
    os.replace(other, db)
    runner.gate("release-1")
    assert await runner.wait() == 1
    async with await SQLiteCheckpointer.open(db, create=False) as store:
        data = await store.load("theirs")
        assert data is not None and len(data.messages) == 7
        assert await store.load("t1") is None
