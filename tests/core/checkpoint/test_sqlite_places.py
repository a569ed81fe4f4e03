"""Existing files in awkward places: read-only directories, empty files, table-less databases."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import DatabaseOpenError, ReadOnlyStoreError
from core.messages import user_text


@pytest.fixture
def locked_later(tmp_path: Path) -> Iterator[tuple[Path, callable]]:
    """A directory and a function that makes it unwritable for everyone, root included."""
    place = tmp_path / "place"
    place.mkdir()
    state = {"immutable": False}

    def lock() -> None:
        place.chmod(0o555)
        if os.access(place, os.W_OK):  # root ignores mode bits; chattr +i stops root too
            state["immutable"] = subprocess.run(["chattr", "+i", str(place)], capture_output=True).returncode == 0
        try:
            (place / "probe").write_text("x")
        except OSError:
            return
        (place / "probe").unlink()
        pytest.skip("cannot make a directory unwritable here: chmod is ignored (root) and chattr +i failed")

    try:
        yield place, lock
    finally:
        if state["immutable"]:
            subprocess.run(["chattr", "-i", str(place)], check=True)
        place.chmod(0o755)


async def test_our_wal_database_in_a_read_only_place_is_browsed(locked_later) -> None:
    place, lock = locked_later
    path = place / "threads.sqlite"
    async with await SQLiteCheckpointer.open(path, create=True) as store:
        await store.append("t", [user_text("hello")])
    lock()  # now SQLite could not create the -shm a WAL reader needs
    async with await SQLiteCheckpointer.open(path, create=True) as store:
        assert store.read_only
        data = await store.load("t")
        assert data is not None and [m.text for m in data.messages] == ["hello"]
        with pytest.raises(ReadOnlyStoreError):
            await store.append("t", [user_text("more")])


async def test_a_sqlite_file_without_tables_is_refused_not_converted(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).execute("PRAGMA user_version = 7").connection.commit()
    before = path.read_bytes()
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(path, create=True)
    assert str(error.value) == f"{path} is a SQLite database but holds no agent threads (it has no tables)."
    assert path.read_bytes() == before


async def test_an_existing_text_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.log"
    path.write_text("not a database\n")
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(path, create=True)
    assert str(error.value) == f"{path} is not a SQLite database."
    assert path.read_text() == "not a database\n"


async def test_an_empty_file_becomes_our_database(tmp_path: Path) -> None:
    path = tmp_path / "fresh.sqlite"
    path.touch()
    async with await SQLiteCheckpointer.open(path, create=True) as store:
        assert not store.read_only
        await store.append("t", [user_text("hi")])
