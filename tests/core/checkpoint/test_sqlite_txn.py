"""The transaction helpers of the SQLite store: a failed COMMIT must not leave the
connection inside a transaction (every later call on it would then fail)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from core.checkpoint.sqlite_schema import read_txn, write_txn


def test_a_commit_refused_as_busy_rolls_back_so_the_next_call_works(tmp_path: Path) -> None:
    path = tmp_path / "rollback-journal.sqlite"
    writer = sqlite3.connect(path, isolation_level=None, timeout=0.1)
    writer.execute("CREATE TABLE t (x)")  # journal_mode=delete, as cubeloop's files are
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()  # a SHARED lock: the writer's COMMIT is busy
    with pytest.raises(sqlite3.OperationalError, match="locked"), write_txn(writer):
        writer.execute("INSERT INTO t VALUES (1)")
    assert not writer.in_transaction
    reader.execute("COMMIT")
    with write_txn(writer):
        writer.execute("INSERT INTO t VALUES (2)")
    with read_txn(writer):
        assert writer.execute("SELECT x FROM t").fetchall() == [(2,)]
    writer.close()
    reader.close()
