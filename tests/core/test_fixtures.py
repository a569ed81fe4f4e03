"""The cubeloop fixture, thread by thread: our store and diagnosis agree with how it was made.

``shared/fixtures/cubeloop_crashpoints.json`` records, for every thread cubeloop wrote
(and killed at a known moment), its roles, unanswered tool calls, run completion and
crash point; the README there maps crash points to our diagnosis (``EXPECTED``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.recovery import CrashPoint, ThreadState, diagnose

from tests.conftest import FIXTURE_JSON

EXPECTED: dict[str, tuple[ThreadState, CrashPoint | None]] = {
    "after_user_before_assistant": (ThreadState.CRASHED, CrashPoint.BETWEEN_TURNS),
    "after_tool_result_before_next_assistant": (ThreadState.CRASHED, CrashPoint.AFTER_TOOL_RESULT),
    "mid_tool_dangling_tool_call": (ThreadState.CRASHED, CrashPoint.MID_TOOL),
    "mid_tool_batch_partial_results": (ThreadState.CRASHED, CrashPoint.MID_TOOL),
    "none_completed": (ThreadState.COMPLETED, None),
    "aborted_by_host": (ThreadState.ABORTED, None),
}
"""The mapping table of shared/fixtures/README.md."""

THREADS: list[dict[str, Any]] = json.loads(FIXTURE_JSON.read_text())["threads"]


def test_every_crash_point_in_the_fixture_is_mapped() -> None:
    assert {t["crash_point"] for t in THREADS} <= set(EXPECTED)


@pytest.fixture
async def store(fixture_db: Path):
    async with await SQLiteCheckpointer.open(fixture_db, create=False) as opened:
        yield opened


@pytest.mark.parametrize("thread", THREADS, ids=[t["thread_id"] for t in THREADS])
async def test_load_and_diagnose(store: SQLiteCheckpointer, thread: dict[str, Any]) -> None:
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
async def test_list_threads_gives_the_same_verdict(store: SQLiteCheckpointer, thread: dict[str, Any]) -> None:
    summaries = {s.thread_id: s for s in await store.list_threads()}
    summary = summaries[thread["thread_id"]]
    assert summary.message_count == len(thread["roles"]) and summary.problems == ()
    assert [m.role for m in summary.tail] == thread["roles"][_last_assistant(thread["roles"]) :]
    assert [r.completed for r in summary.runs] == [r["completed"] for r in thread["runs"]]
    assert summary.first_prompt.startswith(f"Scenario {thread['thread_id']}:")

    diagnosis = diagnose(summary.tail, summary.runs)
    assert (diagnosis.state, diagnosis.crash_point) == EXPECTED[thread["crash_point"]]
    assert [d.call.id for d in diagnosis.dangling] == thread["unanswered_tool_call_ids"]


async def test_threads_are_listed_newest_first(store: SQLiteCheckpointer) -> None:
    listed = [s.thread_id for s in await store.list_threads()]
    # the fixture's threads were written one after another in JSON order
    assert listed == [t["thread_id"] for t in reversed(THREADS)]


def _last_assistant(roles: list[str]) -> int:
    return max((i for i, role in enumerate(roles) if role == "assistant"), default=0)
