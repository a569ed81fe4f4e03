"""SQLite-only behaviour: files, modes, migrations, cubeloop compatibility, bad input, locks.

Real files and real SQLite throughout; the cubeloop fixture is only ever used through
the ``fixture_db`` copy.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint import sqlite as sqlite_module
from core.checkpoint import sqlite_schema
from core.checkpoint.base import Fingerprints, Lease
from core.checkpoint.sqlite import MIGRATIONS, SQLiteCheckpointer, julianday_to_unix
from core.checkpoint.watch import watch_sqlite
from core.errors import (
    CheckpointError,
    CorruptRecordError,
    DatabaseOpenError,
    ReadOnlyStoreError,
    SchemaError,
    StoreBusyError,
)
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.owners import UNOWNED
from tests.helpers.older_files import write_older_file

ROOT = Path(__file__).resolve().parents[3]


SUPERVISION_TABLES = {"cubepi_tool_journal", "cubepi_jobs", "cubepi_leases", "cubepi_live_events", "cubepi_commands"}
OWNER_TABLES = {"cubepi_thread_records", "cubepi_steps"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> set[str]:
    return {p.name for p in path.parent.iterdir()} - {path.name}


def plain(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection, the way cubeloop or a person with the sqlite3 shell reads."""
    return sqlite3.connect(path, isolation_level=None)


def one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text and "Traceback" not in text


# --- our own files ---------------------------------------------------------------------------


async def test_new_file_has_the_full_schema_in_wal(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    store = await SQLiteCheckpointer.open(sqlite_path, create=True)
    assert not store.read_only and not store.needs_upgrade and store.schema_version == len(MIGRATIONS)
    await store.close()
    with plain(sqlite_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        triggers = {r[0] for r in db.execute("SELECT tbl_name FROM sqlite_master WHERE type = 'trigger'")}
        assert db.execute("SELECT version FROM cubepi_schema").fetchall() == [(len(MIGRATIONS),)]
    assert {"messages", "thread_extra", "runs", "thread_pending_request", "thread_hitl_answers"} <= tables
    assert {"ix_runs_thread_completion", "ix_messages_thread_id"} <= indexes
    assert tables >= SUPERVISION_TABLES | OWNER_TABLES and len(MIGRATIONS) == 4
    assert {"ix_cubepi_live_events_thread", "ix_cubepi_commands_thread_status"} <= indexes
    assert "ix_cubepi_thread_records_owner" in indexes
    assert triggers == {"messages", "thread_extra", "runs", "thread_pending_request"}, (
        "cubeloop's new threads get a record"
    )


async def test_reopening_our_file_is_writable_at_once(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("one")])
    async with await SQLiteCheckpointer.open(sqlite_path, create=False) as store:
        assert not store.read_only
        await store.append("t", [user_text("two")])
        assert [m.text for m in (await store.load("t")).messages] == ["one", "two"]  # type: ignore[union-attr]


async def test_an_empty_file_is_initialised_when_creating(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    sqlite_path.write_bytes(b"")
    async with await SQLiteCheckpointer.open(sqlite_path, create=True) as store:
        assert store.schema_version == len(MIGRATIONS)


async def test_message_we_write_reads_the_way_cubeloop_reads_it(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    before = time.time()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.claim_run("t", "r1")
        await store.append("t", [user_text("hello cubeloop", run_id="r1")])
        await store.save_extra("t", {"title": "greeting"})
        await store.mark_run_complete("t", "r1")
    with plain(sqlite_path) as db:
        ((thread_id, text, created, run_id, kind),) = db.execute(
            "SELECT thread_id, message_json, created_at, run_id, typeof(created_at) FROM messages"
        ).fetchall()
        runs = db.execute("SELECT run_id, completed_at, completion_seq FROM runs").fetchall()
        extra = db.execute("SELECT extra_json FROM thread_extra WHERE thread_id = 't'").fetchone()[0]
    row = json.loads(text)
    assert thread_id == "t" and run_id == "r1" and row["run_id"] == "r1"
    assert row["role"] == "user" and row["content"] == [{"type": "text", "text": "hello cubeloop"}]
    assert kind == "real" and before - 2 < julianday_to_unix(created) < time.time() + 2  # type: ignore[operator]
    assert runs[0][0] == "r1" and runs[0][1] is not None and runs[0][2] == 1
    assert json.loads(extra) == {"title": "greeting"}


# --- cubeloop's file ---------------------------------------------------------------------------


async def test_cubeloop_threads_load_with_every_field_kept(fixture_db: Path) -> None:
    with plain(fixture_db) as db:
        stored = db.execute("SELECT thread_id, id, message_json FROM messages ORDER BY id").fetchall()
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        loaded: dict[int, dict[str, Any]] = {}
        for thread_id in {t for t, _, _ in stored}:
            data = await store.load(thread_id)
            assert data is not None and data.problems == []
            loaded.update(zip(data.message_ids, (m.model_dump(mode="json") for m in data.messages), strict=False))
    assert sorted(loaded) == [row_id for _, row_id, _ in stored]
    for _, row_id, text in stored:
        assert loaded[row_id] == json.loads(text), f"row {row_id} changed on load"


async def test_browsing_cubeloop_file_changes_no_byte(fixture_db: Path, fixture_json: dict[str, Any]) -> None:
    before, others = sha256(fixture_db), siblings(fixture_db)
    # cubeloop's threads record no owner: the unowned scope sees them (even when creating is allowed)
    store = await SQLiteCheckpointer.open(fixture_db, create=True, owner=UNOWNED)
    assert store.needs_upgrade and store.read_only and store.schema_version is None
    summaries = await store.list_threads()
    assert {s.thread_id for s in summaries} == {t["thread_id"] for t in fixture_json["threads"]}
    for summary in summaries:
        data = await store.load(summary.thread_id)
        assert data is not None and data.journal is None, "cubeloop keeps no journal"
        assert summary.lease is None
        assert await store.load_journal(summary.thread_id) is None
        assert await store.job_get(summary.thread_id, "k") is None
        assert await store.read_live_events(summary.thread_id) == []
        assert await store.list_commands(summary.thread_id) == []
        assert siblings(fixture_db) == others, "browsing created a -wal, -shm or -journal file"
    assert await store.list_leases() == {} and await store.get_lease("completed") is None
    token = await store.change_token()
    assert await store.change_token() == token
    await store.close()
    assert sha256(fixture_db) == before
    assert siblings(fixture_db) == others
    with plain(fixture_db) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


async def test_writes_before_upgrade_raise_and_change_nothing(fixture_db: Path) -> None:
    before = sha256(fixture_db)
    async with await SQLiteCheckpointer.open(fixture_db, create=False) as store:
        attempts = [
            store.append("completed", [user_text("more")]),
            store.save_extra("completed", {"k": 1}),
            store.claim_run("completed", "r9"),
            store.mark_run_complete("completed", "r9"),
            store.record_tool_event("completed", "c1", "end"),
            store.job_begin("completed", "k"),
            store.job_finish("completed", "k", "done", 1),
            store.acquire_lease(Lease("completed", "me", 1, "box", None, 0.0, 0.0, 1.0), is_stale=lambda _: True),
            store.renew_lease("completed", "me", 1.0, 2.0),
            store.release_lease("completed", "me"),
            store.append_live_events("completed", None, [{"type": "x"}]),
            store.prune_live_events("completed"),
            store.send_command("completed", "steer", "hi"),
            store.update_command(1, "applied"),
            store.save_extra("completed", {"k": 2}, expected_revision=0),
            store.save_fingerprints("completed", Fingerprints("i", "a", {}), expected_revision=0),
            store.step_begin("completed", "k", input_fingerprint="i", workflow="w"),
            store.step_commit("completed", "k", expected_revision=0, workflow="w", next_step=1, data=None),
            store.delete_thread("completed"),
        ]
        for attempt in attempts:
            with pytest.raises(ReadOnlyStoreError) as error:
                await attempt
            assert one_sentence(str(error.value)) and "upgrade" in str(error.value)
    assert sha256(fixture_db) == before


async def test_upgrade_then_write_and_cubeloop_still_reads(fixture_db: Path) -> None:
    with plain(fixture_db) as db:
        rows_before = db.execute("SELECT * FROM messages ORDER BY id").fetchall()
        runs_before = db.execute("SELECT * FROM runs ORDER BY rowid").fetchall()
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        await store.upgrade()
        assert not store.read_only and not store.needs_upgrade and store.schema_version == len(MIGRATIONS)
        await store.upgrade()  # a no-op now
        await store.claim_run("crash-after-user", "r-new")
        await store.append(
            "crash-after-user", [AssistantMessage(content=[TextContent(text="resumed")], run_id="r-new")]
        )
        await store.mark_run_complete("crash-after-user", "r-new")
        data = await store.load("crash-after-user")
        assert [m.role for m in data.messages] == ["user", "assistant"]  # type: ignore[union-attr]
    with plain(fixture_db) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT * FROM messages WHERE id <= 22 ORDER BY id").fetchall() == rows_before
        assert db.execute("SELECT * FROM runs ORDER BY rowid").fetchall()[: len(runs_before)] == runs_before
        new_row = db.execute("SELECT message_json, run_id FROM messages WHERE id > 22").fetchone()
        assert json.loads(new_row[0])["role"] == "assistant" and new_row[1] == "r-new"
        assert db.execute("SELECT completion_seq FROM runs WHERE run_id = 'r-new'").fetchone() == (1,)
    async with await SQLiteCheckpointer.open(fixture_db, create=False) as store:
        assert not store.read_only, "an upgraded file reopens writable"


def reply_with_call(call_id: str) -> AssistantMessage:
    return AssistantMessage(
        content=[TextContent(text="calling"), ToolCall(id=call_id, name="read", arguments={})], stop_reason="tool_use"
    )


async def write_v1_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file at our schema version 1 (before the supervision tables) holding a message, extra and a run."""
    write_older_file(path, 1, monkeypatch, {"t": [user_text("from version 1"), reply_with_call("c1")]})


def table_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with plain(path) as db:
        return {
            t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in ("messages", "thread_extra", "runs")
        }


async def test_v1_file_of_ours_browses_then_upgrades_to_the_current_schema_keeping_every_row(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_v1_file(sqlite_path, monkeypatch)
    rows_before, before = table_rows(sqlite_path), sha256(sqlite_path)
    # Threads written before owners existed record none: the unowned scope opens them.
    store = await SQLiteCheckpointer.open(sqlite_path, create=True, owner=UNOWNED)
    assert store.needs_upgrade and store.read_only and store.schema_version == 1
    data = await store.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant"] and data.journal is None  # type: ignore[union-attr]
    # Supervision readers see nothing, writers refuse, the file is untouched.
    assert await store.load_journal("t") is None and await store.job_get("t", "k") is None
    assert await store.get_lease("t") is None and await store.list_leases() == {}
    assert await store.read_live_events("t") == [] and await store.list_commands("t") == []
    assert (await store.list_threads())[0].lease is None
    await store.change_token()
    for write in (
        store.record_tool_event("t", "c1", "start"),
        store.job_begin("t", "k"),
        store.acquire_lease(Lease("t", "me", 1, "box", None, 0.0, 0.0, 1.0), is_stale=lambda _: True),
        store.append_live_events("t", None, [{"type": "x"}]),
        store.send_command("t", "abort"),
        store.append("t", [user_text("not yet")]),
    ):
        with pytest.raises(ReadOnlyStoreError):
            await write
    assert sha256(sqlite_path) == before

    await store.upgrade()
    assert store.schema_version == len(MIGRATIONS) and not store.needs_upgrade and not store.read_only
    assert (await store.load("t")).journal == {}  # type: ignore[union-attr]
    await store.record_tool_event("t", "c1", "start", tool_name="read")
    assert (await store.job_begin("t", "k")).attempts == 1
    await store.close()
    with plain(sqlite_path) as db:
        assert db.execute("SELECT version FROM cubepi_schema").fetchall() == [(len(MIGRATIONS),)]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables >= SUPERVISION_TABLES | OWNER_TABLES
    assert table_rows(sqlite_path) == rows_before, "the upgrade changed no existing row"


async def test_a_failed_upgrade_from_v1_adds_no_table(sqlite_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await write_v1_file(sqlite_path, monkeypatch)

    def broken(db: sqlite3.Connection) -> None:
        db.execute("THIS IS NOT SQL")

    with plain(sqlite_path) as db:
        schema_before = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", [*MIGRATIONS, broken])
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        assert store.schema_version == 1
        with pytest.raises(CheckpointError):
            await store.upgrade()
        assert store.needs_upgrade and await store.load_journal("t") is None
    with plain(sqlite_path) as db:
        assert db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() == schema_before
        assert db.execute("SELECT version FROM cubepi_schema").fetchall() == [(1,)]


async def test_a_later_schema_step_upgrades_our_current_file(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_path.parent.mkdir()
    current = len(MIGRATIONS)
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("from the current version")])

    def next_notes(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE notes (thread_id TEXT, note TEXT)")

    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", [*MIGRATIONS, next_notes])
    before = sha256(sqlite_path)
    store = await SQLiteCheckpointer.open(sqlite_path, create=True)
    assert store.needs_upgrade and store.schema_version == current
    with pytest.raises(ReadOnlyStoreError):
        await store.append("t", [user_text("not yet")])
    assert sha256(sqlite_path) == before
    await store.upgrade()
    assert store.schema_version == current + 1 and not store.needs_upgrade
    await store.append("t", [user_text("from the next version")])
    assert len((await store.load("t")).messages) == 2  # type: ignore[union-attr]
    await store.close()
    with plain(sqlite_path) as db:
        assert db.execute("SELECT version FROM cubepi_schema").fetchall() == [(current + 1,)]
        assert db.execute("SELECT count(*) FROM notes").fetchone() == (0,)


async def test_failed_migration_leaves_the_file_as_it_was(fixture_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x)")
        db.execute("THIS IS NOT SQL")

    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", [*MIGRATIONS, broken])
    with plain(fixture_db) as db:
        schema_before = db.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        with pytest.raises(CheckpointError):
            await store.upgrade()
        assert store.read_only and store.needs_upgrade
        assert await store.load("completed") is not None, "still browsable after a failed upgrade"
    with plain(fixture_db) as db:
        assert db.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema_before


async def test_newer_schema_is_refused(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path):
        pass
    with plain(sqlite_path) as db:
        db.execute("UPDATE cubepi_schema SET version = ?", (len(MIGRATIONS) + 1,))
    before = sha256(sqlite_path)
    with pytest.raises(SchemaError) as error:
        await SQLiteCheckpointer.open(sqlite_path)
    assert one_sentence(str(error.value)) and "newer" in str(error.value)
    assert sha256(sqlite_path) == before


# --- bad input ---------------------------------------------------------------------------------


async def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 200)
    before = sha256(path)
    for create in (True, False):
        with pytest.raises(DatabaseOpenError) as error:
            await SQLiteCheckpointer.open(path, create=create)
        assert str(error.value) == f"{path} is not a SQLite database."
    assert sha256(path) == before and siblings(path) == set()


async def test_sqlite_file_without_agent_tables_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with plain(path) as db:
        db.execute("CREATE TABLE recipes (name TEXT)")
    before = sha256(path)
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(path, create=True)
    assert one_sentence(str(error.value)) and str(path) in str(error.value)
    assert sha256(path) == before


async def test_missing_file_when_creating_is_not_allowed(tmp_path: Path) -> None:
    path = tmp_path / "absent.sqlite"
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(path, create=False)
    assert str(error.value) == f"{path} does not exist."
    assert not path.exists()


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody, root included, can create files in.

    chmod 0o555 is enough for ordinary users; root ignores mode bits, so then the
    directory is made immutable (``chattr +i``, which stops root too on ext4/xfs).
    """
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    immutable = False
    if os.access(locked, os.W_OK):
        done = subprocess.run(["chattr", "+i", str(locked)], capture_output=True)
        immutable = done.returncode == 0
    try:
        probe = locked / "probe"
        try:
            probe.write_text("x")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a directory unwritable here: chmod is ignored (root) and chattr +i failed")
        yield locked
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o755)


async def test_missing_file_in_an_unwritable_directory(unwritable_dir: Path) -> None:
    path = unwritable_dir / "threads.sqlite"
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(path, create=True)
    assert str(error.value) == f"Cannot create {path}: the directory {unwritable_dir} is not writable."
    assert not path.exists()


async def test_missing_file_whose_parent_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(blocker / "threads.sqlite", create=True)
    assert one_sentence(str(error.value)) and "is not a directory" in str(error.value)


async def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(tmp_path, create=True)
    assert one_sentence(str(error.value)) and str(tmp_path) in str(error.value)


async def test_closed_store_says_so(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    store = await SQLiteCheckpointer.open(sqlite_path)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(CheckpointError, match="closed"):
        await store.load("t")


async def test_a_loaded_thread_is_freed_once_its_caller_drops_it(sqlite_path: Path) -> None:
    # aiosqlite's worker keeps the value its last call returned until its next call ends;
    # the store must not leave a loaded thread there (it would be freed inside that call).
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("kept only by its caller")])
        data = await store.load("t")
        assert data is not None and [m.text for m in data.messages] == ["kept only by its caller"]
        loaded = weakref.ref(data.messages[0])
        del data
        gc.collect()
        assert loaded() is None


# --- corrupt rows ------------------------------------------------------------------------------


async def test_malformed_json_row_is_reported_not_fatal(fixture_db: Path) -> None:
    broken = '{"role": "tool_result", "content": ['
    with plain(fixture_db) as db:
        db.execute("UPDATE messages SET message_json = ? WHERE id = 9", (broken,))
    before = sha256(fixture_db)
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        data = await store.load("completed")
        summaries = {s.thread_id: s for s in await store.list_threads()}
    assert data is not None
    assert data.message_ids == [7, 8, 10] and [m.role for m in data.messages] == ["user", "assistant", "assistant"]
    (problem,) = data.problems
    assert problem.row_id == 9 and problem.raw == broken
    assert "malformed JSON" in problem.reason and one_sentence(problem.reason)
    assert len(summaries) == 8 and summaries["completed"].message_count == 4
    assert sha256(fixture_db) == before


async def test_invalid_message_and_corrupt_tail_rows(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        call = ToolCall(id="c1", name="read")
        await store.append("t", [user_text("go"), AssistantMessage(content=[call], stop_reason="tool_use")])
        with plain(sqlite_path) as db:
            # valid JSON, invalid message: a tool result without its call id
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('t', '{\"role\": \"tool_result\"}')")
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('t', 'not json at all')")
        data = await store.load("t")
        (summary,) = await store.list_threads()
    assert [m.role for m in data.messages] == ["user", "assistant"]  # type: ignore[union-attr]
    assert [p.row_id for p in data.problems] == [3, 4]  # type: ignore[union-attr]
    assert "invalid message" in data.problems[0].reason  # type: ignore[union-attr]
    assert summary.message_count == 4 and [m.role for m in summary.tail] == ["assistant"]
    assert [p.row_id for p in summary.problems] == [3, 4]


async def test_load_after_reports_only_the_newer_undecodable_rows(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("one")])
        with plain(sqlite_path) as db:
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('t', 'not json at all')")
        await store.append("t", [user_text("three")])
        with plain(sqlite_path) as db:
            db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('t', '{\"role\": \"tool_result\"}')")
        after_one = await store.load_after("t", 1)
        after_two = await store.load_after("t", 2)
        after_four = await store.load_after("t", 4)
    assert [m.text for m in after_one.messages] == ["three"] and after_one.message_ids == [3]
    assert [p.row_id for p in after_one.problems] == [2, 4]
    assert [p.row_id for p in after_two.problems] == [4] and after_two.message_ids == [3]
    assert after_four.messages == [] and after_four.problems == []


async def test_rows_that_would_join_into_valid_json_are_kept_apart(sqlite_path: Path) -> None:
    # Each row alone is malformed; joined with a comma (as a batch decode does) they would
    # read as one valid message. The batch must not swallow or shift them.
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("before")])
        with plain(sqlite_path) as db:
            db.executemany(
                "INSERT INTO messages (thread_id, message_json) VALUES ('t', ?)",
                [('{"role": "user", "content": "a", "x": [1',), ("2]}",)],
            )
        await store.append("t", [user_text("after")])
        data = await store.load("t")
    assert [m.text for m in data.messages] == ["before", "after"]  # type: ignore[union-attr]
    assert data.message_ids == [1, 4] and [p.row_id for p in data.problems] == [2, 3]  # type: ignore[union-attr]


async def test_corrupt_extra_is_reported_and_never_overwritten(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("hi")])
        with plain(sqlite_path) as db:
            db.execute("INSERT INTO thread_extra (thread_id, extra_json) VALUES ('t', '{broken')")
        data = await store.load("t")
        assert data.extra == {} and [p.row_id for p in data.problems] == ["thread_extra"]  # type: ignore[union-attr]
        with pytest.raises(CorruptRecordError):
            await store.save_extra("t", {"k": 1})
    with plain(sqlite_path) as db:
        assert db.execute("SELECT extra_json FROM thread_extra").fetchone() == ("{broken",)


# --- list_threads details --------------------------------------------------------------------------


async def test_tail_reaches_past_the_window(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    calls = [ToolCall(id=f"c{i}", name="read") for i in range(20)]
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("batch", [user_text("go"), AssistantMessage(content=calls, stop_reason="tool_use")])
        await store.append("batch", [ToolResultMessage(tool_call_id=c.id) for c in calls[:15]])
        await store.append("chatty", [user_text(f"message {i}") for i in range(30)])
        await store.append("late", [user_text("q"), AssistantMessage(content=[TextContent(text="a")])])
        await store.append("late", [user_text(f"steer {i}") for i in range(12)])
        by_id = {s.thread_id: s for s in await store.list_threads()}
    assert len(by_id["batch"].tail) == 16 and by_id["batch"].tail[0].role == "assistant"
    assert [m.text for m in by_id["chatty"].tail] == [f"message {i}" for i in range(30)]  # type: ignore[union-attr]
    assert [m.role for m in by_id["late"].tail] == ["assistant"] + ["user"] * 12


async def test_first_prompt_is_one_shortened_line(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append(
            "t", [AssistantMessage(content=[TextContent(text="greeting first")]), user_text("x\n  y " * 200)]
        )
        (summary,) = await store.list_threads()
    assert summary.first_prompt.startswith("x y x y") and "\n" not in summary.first_prompt
    assert len(summary.first_prompt) == sqlite_module.FIRST_PROMPT_CHARS and summary.first_prompt.endswith("…")


# --- sharing the file ----------------------------------------------------------------------------------

_WRITER = """
import asyncio, sys
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import user_text

async def main(path, n):
    store = await SQLiteCheckpointer.open(path, create=False, busy_timeout=5)
    for i in range(n):
        await store.append("shared", [user_text(f"proc {i}")])
        await store.append("proc", [user_text(f"proc {i}")])
        await store.save_extra("shared", {f"proc{i}": i})
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def test_two_processes_and_two_connections_lose_nothing(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    n = 150
    first = await SQLiteCheckpointer.open(sqlite_path, busy_timeout=5)
    second = await SQLiteCheckpointer.open(sqlite_path, busy_timeout=5)
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, str(sqlite_path), str(n), cwd=ROOT)

    async def write(store: SQLiteCheckpointer, name: str) -> None:
        for i in range(n):
            await store.append("shared", [user_text(f"{name} {i}")])
            await store.append(name, [user_text(f"{name} {i}"), user_text(f"{name} {i}b")])
            await store.save_extra("shared", {f"{name}{i}": i})

    await asyncio.gather(write(first, "a"), write(second, "b"))
    assert await child.wait() == 0
    shared = await first.load("shared")
    assert shared is not None
    texts = [m.text for m in shared.messages]  # type: ignore[union-attr]
    assert len(texts) == 3 * n and not shared.problems
    for name in ("a", "b", "proc"):
        assert [t for t in texts if t.startswith(name + " ")] == [f"{name} {i}" for i in range(n)]
    assert len(shared.extra) == 3 * n
    assert (await second.load("a")).message_ids == sorted((await second.load("a")).message_ids)  # type: ignore[union-attr]
    assert len((await second.load("proc")).messages) == n  # type: ignore[union-attr]
    await first.close()
    await second.close()


async def test_a_held_lock_is_retried_then_reported(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    waits: list[int] = []
    store = await SQLiteCheckpointer.open(sqlite_path, busy_timeout=0.05, retries=2, on_busy=waits.append)
    holder = plain(sqlite_path)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreBusyError) as error:
        await store.append("t", [user_text("blocked")])
    assert one_sentence(str(error.value)) and waits == [1, 2]
    holder.execute("COMMIT")
    await store.append("t", [user_text("through")])
    # A lock released while retrying is waited out, not reported.
    holder.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.1, holder.execute, "COMMIT")
    await store.append("t", [user_text("after a wait")])
    assert [m.text for m in (await store.load("t")).messages] == ["through", "after a wait"]  # type: ignore[union-attr]
    holder.close()
    await store.close()


async def test_reads_hold_no_transaction_between_calls(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        await store.append("t", [user_text("one")])
        await store.load("t")
        await store.list_threads()
        with plain(sqlite_path) as other:
            other.execute("BEGIN EXCLUSIVE")  # would fail with "locked" if a reader were still open
            other.execute("COMMIT")
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy


async def test_watch_reports_commits_from_another_connection(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    reader = await SQLiteCheckpointer.open(sqlite_path)
    writer = await SQLiteCheckpointer.open(sqlite_path)
    stop = asyncio.Event()
    seen = asyncio.Event()
    batches = 0

    async def watch() -> None:
        nonlocal batches
        async for _ in watch_sqlite(sqlite_path, stop_event=stop, step_ms=10):
            batches += 1
            seen.set()

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.3)  # the watcher is armed
    (sqlite_path.parent / "unrelated.txt").write_text("not the database")
    await asyncio.sleep(0.2)
    assert batches == 0, "a change to another file was reported"
    for attempt in range(10):  # a loaded machine may arm the watcher late: write again
        await writer.append("t", [user_text(f"news {attempt}")])
        try:
            await asyncio.wait_for(seen.wait(), timeout=1)
            break
        except TimeoutError:
            continue
    assert seen.is_set(), "no change reported for commits from another connection"
    assert (await reader.load("t")).messages[0].text == "news 0"  # type: ignore[union-attr]
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    await reader.close()
    await writer.close()


_CRASHING_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 1")  # spill to the file early, so the journal is hot
db.execute("BEGIN")
for i in range(5000):
    db.execute("INSERT INTO messages (thread_id, message_json) VALUES ('late', ?)", ("x" * 200,))
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_a_writer_killed_mid_transaction_is_explained_not_rolled_back(fixture_db: Path) -> None:
    killed = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(fixture_db)])
    assert killed.returncode == -9
    journal = Path(f"{fixture_db}-journal")
    assert journal.exists(), "the killed cubeloop-style writer left a hot journal"
    before = sha256(fixture_db), sha256(journal)
    with pytest.raises(DatabaseOpenError) as error:
        await SQLiteCheckpointer.open(fixture_db, create=False)
    assert one_sentence(str(error.value)) and "unfinished write" in str(error.value)
    assert (sha256(fixture_db), sha256(journal)) == before


_OPEN_AND_PRINT = """
import asyncio, sys
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import DatabaseOpenError

async def main(path):
    try:
        await SQLiteCheckpointer.open(path, create=True)
    except DatabaseOpenError as error:
        print(error)

asyncio.run(main(sys.argv[1]))
"""


async def test_unreadable_file() -> None:
    # Root reads any file, so as root the open runs in a child process as "nobody".
    # tmp_path's parents are private to root, hence a directory of its own under /tmp.
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="cubepi-unreadable-"))
    try:
        folder.chmod(0o755)
        path = folder / "secret.sqlite"
        with plain(path) as db:
            db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, thread_id TEXT, message_json TEXT)")
        path.chmod(0o000)
        if os.geteuid() != 0:
            with pytest.raises(DatabaseOpenError) as error:
                await SQLiteCheckpointer.open(path)
            said = str(error.value)
        else:
            try:
                child = subprocess.run(
                    [sys.executable, "-c", _OPEN_AND_PRINT, str(path)],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    user="nobody",
                    env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                )
            except OSError as exc:
                child = subprocess.CompletedProcess([], 1, "", str(exc))
            if child.returncode != 0:
                pytest.skip(
                    "root reads every file and 'nobody' cannot run this Python "
                    f"({(child.stderr.strip().splitlines() or ['?'])[-1]})"
                )
            said = child.stdout.strip()
        assert said == f"{path} cannot be read: permission denied."
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
