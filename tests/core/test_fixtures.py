"""The cubeloop crash-point database, thread by thread: our store and diagnosis agree with
how it was made.

The database is written by the real cubeloop for each test run
(``tests/helpers/cubeloop_threads.py``); its description records, for every thread cubeloop
wrote (and killed at a known moment), its roles, unanswered tool calls, run completion and
crash point; ``EXPECTED`` maps crash points to our diagnosis.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.owners import UNOWNED
from core.recovery import diagnose
from tests.helpers.crashpoint_verdicts import EXPECTED, THREADS
from tests.helpers.cubeloop_threads import CRASHPOINT_THREADS, CUBELOOP_TABLES, run_cubeloop


def test_every_crash_point_in_the_fixture_is_mapped() -> None:
    assert {t["crash_point"] for t in THREADS} <= set(EXPECTED)


@pytest.fixture
async def store(fixture_db: Path):
    # cubeloop's threads record no owner: the unowned scope opens them.
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as opened:
        yield opened


@pytest.mark.parametrize("thread", THREADS, ids=[t["thread_id"] for t in THREADS])
async def test_load_and_diagnose(
    store: SQLiteCheckpointer, thread: dict[str, Any], fixture_json: dict[str, Any]
) -> None:
    thread = made(fixture_json, thread)
    data = await store.load(thread["thread_id"])
    assert data is not None and data.problems == []
    assert [m.role for m in data.messages] == thread["roles"]
    assert data.message_ids == thread["message_row_ids"]
    assert [(r.run_id, r.completed, r.completion_seq) for r in data.runs] == [
        (r["run_id"], r["completed"], r["completion_seq"]) for r in thread["runs"]
    ]
    assert all(r.completed == thread["run_completed"] for r in data.runs)

    diagnosis = diagnose(data.messages, data.runs)  # cubeloop keeps no tool journal
    state, point = EXPECTED[thread["crash_point"]]
    assert (diagnosis.state, diagnosis.crash_point) == (state, point)
    assert [d.call.id for d in diagnosis.dangling] == thread["unanswered_tool_call_ids"]
    assert all(d.status_words == "may have started" for d in diagnosis.dangling)
    if thread["crash_point"] == "mid_tool_batch_partial_results":
        answered = [c for c in thread["tool_calls_in_last_assistant"] if c not in thread["unanswered_tool_call_ids"]]
        assert list(diagnosis.answered) == answered and answered


@pytest.mark.parametrize("thread", THREADS, ids=[t["thread_id"] for t in THREADS])
async def test_list_threads_gives_the_same_verdict(
    store: SQLiteCheckpointer, thread: dict[str, Any], fixture_json: dict[str, Any]
) -> None:
    thread = made(fixture_json, thread)
    summaries = {s.thread_id: s for s in await store.list_threads()}
    summary = summaries[thread["thread_id"]]
    assert summary.message_count == len(thread["roles"]) and summary.problems == ()
    assert [m.role for m in summary.tail] == thread["roles"][_last_assistant(thread["roles"]) :]
    assert [r.completed for r in summary.runs] == [r["completed"] for r in thread["runs"]]
    assert summary.first_prompt.startswith(f"Scenario {thread['thread_id']}:")

    diagnosis = diagnose(summary.tail, summary.runs, tail_only=True)
    assert (diagnosis.state, diagnosis.crash_point) == EXPECTED[thread["crash_point"]]
    assert [d.call.id for d in diagnosis.dangling] == thread["unanswered_tool_call_ids"]


async def test_threads_are_listed_newest_first(store: SQLiteCheckpointer) -> None:
    listed = [s.thread_id for s in await store.list_threads()]
    # the fixture's threads were written one after another in JSON order
    assert listed == [t["thread_id"] for t in reversed(THREADS)]


def made(description: dict[str, Any], thread: dict[str, Any]) -> dict[str, Any]:
    """``thread``'s entry in the generated database's description (with its row and run ids)."""
    return next(t for t in description["threads"] if t["thread_id"] == thread["thread_id"])


def _last_assistant(roles: list[str]) -> int:
    return max((i for i, role in enumerate(roles) if role == "assistant"), default=0)


def test_the_generated_database_holds_what_each_thread_says(fixture_db: Path) -> None:
    # Read with plain sqlite3 and JSON, never through our store: the database must be what
    # the threads' descriptions say before any test believes our reading of it.
    c = sqlite3.connect(f"file:{fixture_db}?mode=ro", uri=True)
    try:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # cubeloop's default: rollback journal
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert set(CUBELOOP_TABLES) <= tables and not any(t.startswith("cubepi_") for t in tables)
        indexed = {
            r[0] for r in c.execute("SELECT tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        }
        assert "messages" not in indexed  # cubeloop creates no index on messages.thread_id
        extra = {r[0] for r in c.execute("SELECT thread_id FROM thread_extra")}
        for t in CRASHPOINT_THREADS:
            rows = [
                json.loads(r[0])
                for r in c.execute("SELECT message_json FROM messages WHERE thread_id = ? ORDER BY id", (t.thread_id,))
            ]
            runs = c.execute("SELECT run_id, completed_at FROM runs WHERE thread_id = ?", (t.thread_id,)).fetchall()
            assert tuple(r["role"] for r in rows) == t.roles, t.thread_id
            last = max(i for i, r in enumerate(rows) if r["role"] == "assistant") if "assistant" in t.roles else None
            calls = [b["id"] for b in rows[last]["content"] if b["type"] == "tool_call"] if last is not None else []
            answered = {r["tool_call_id"] for r in rows[(last or 0) + 1 :] if r["role"] == "tool_result"}
            assert tuple(calls) == t.tool_calls_in_last_assistant, t.thread_id
            assert tuple(x for x in calls if x not in answered) == t.unanswered_tool_call_ids, t.thread_id
            assert len(runs) == 1 and (runs[0][1] is not None) == t.run_completed, t.thread_id
            assert all(r["run_id"] == runs[0][0] for r in rows), t.thread_id
            assert all(len(r["id"]) == 32 and int(r["id"], 16) >= 0 for r in rows), (
                t.thread_id
            )  # cubeloop's uuid4().hex
            assert (t.thread_id in extra) == t.thread_extra_row, t.thread_id
    finally:
        c.close()


def test_a_child_that_misses_its_kill_mark_is_reported(tmp_path: Path) -> None:
    # The generator's SIGKILL is checked, not assumed: a child that ends before the mark
    # the parent waits for is a failure, never a silently different thread.
    from tests.helpers.children import ChildFailed

    with pytest.raises(ChildFailed, match="before its marks"):
        run_cubeloop(tmp_path / "t.sqlite", "completed", "t", kill_at=("model_thinking",))
