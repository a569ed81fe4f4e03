"""Resuming every thread of the cubeloop fixture, after upgrading a copy of it.

For each thread of the cubeloop crash-point database (always a private copy):
open it (browse-only: cubeloop's file), upgrade it, diagnose it as its JSON says, then
resume it with an agent whose tools carry the fixture's tool names (``read_file``
idempotent, ``slow_step`` and ``wait_for_abort`` not). A crashed thread must complete with
each dangling call settled (re-run or recorded as interrupted), no tool call left without
its result - in the thread and in every request the model received - and no row cubeloop
wrote changed, in any table, of any thread. A clean thread (completed, aborted) refuses
to resume and takes a new prompt.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from core.agent import Agent
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import NothingToResumeError
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.owners import UNOWNED
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ResumeAction, ThreadState, diagnose
from core.tools import AgentTool, ToolContext, tool
from tests.helpers.crashpoint_verdicts import EXPECTED, THREADS
from tests.helpers.transcripts import assert_paired

CUBELOOP_TABLES = ("messages", "runs", "thread_extra", "thread_pending_request", "thread_hitl_answers")
FINAL = "Checked src/app.py again; nothing else to do."


def snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of cubeloop's tables, by rowid, read with plain sqlite3 (never through the store)."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: c.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid").fetchall() for t in CUBELOOP_TABLES}
    finally:
        c.close()


def assert_unchanged(
    before: dict[str, list[tuple[Any, ...]]],
    after: dict[str, list[tuple[Any, ...]]],
    closed_runs: set[str] = frozenset(),
) -> None:
    """Every row of ``before`` is as it was; a run in ``closed_runs`` (a crashed run whose
    calls the resume settled) may only have gained its completion (``completed_at``,
    ``completion_seq``), as cubeloop's fork copies completed runs only."""
    for table, rows in before.items():
        now = {row[0]: row for row in after[table]}
        for row in rows:
            if table == "runs" and row[2] in closed_runs:
                new = now.get(row[0])
                assert new is not None and new[:4] == row[:4] and row[4] is None and new[4] is not None, (row, new)
                continue
            assert now.get(row[0]) == row, f"{table} row {row[0]} changed: {row} -> {now.get(row[0])}"


def fixture_tools(ran: list[str]) -> list[AgentTool]:
    @tool(idempotent=True)
    async def read_file(path: str, ctx: ToolContext) -> str:
        """Read a file."""
        ran.append(f"read_file {ctx.tool_call_id}")
        return f"contents of {path}"

    @tool
    async def slow_step(label: str, ctx: ToolContext) -> str:
        """A long step, not safe to repeat."""
        ran.append(f"slow_step {ctx.tool_call_id}")
        return f"{label} done"

    @tool
    async def wait_for_abort(label: str, ctx: ToolContext) -> str:
        """Wait until aborted."""
        ran.append(f"wait_for_abort {ctx.tool_call_id}")
        return "stopped"

    return [read_file, slow_step, wait_for_abort]


def model(request: ModelRequest) -> AssistantMessage:
    """After a user message, read a file first; otherwise answer."""
    if isinstance(request.messages[-1], UserMessage):
        return faux_reply("Let me look again.", faux_tool_call("read_file", {"path": "src/app.py"}))
    return faux_reply(FINAL)


async def upgraded(db: Path) -> SQLiteCheckpointer:
    # cubeloop's threads record no owner: the unowned scope opens them.
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    assert store.needs_upgrade and store.read_only  # cubeloop's file: browse-only until upgraded
    await store.upgrade()
    assert not store.read_only and not store.needs_upgrade
    return store


def _choices(thread: dict[str, Any], rerun_slow: bool) -> dict[str, str]:
    if not rerun_slow:
        return {}
    return {c: "rerun" for c in thread["unanswered_tool_call_ids"] if "slow" in c}


CASES = [pytest.param(t, False, id=t["thread_id"]) for t in THREADS] + [
    pytest.param(t, True, id=f"{t['thread_id']}-rerun-chosen")
    for t in THREADS
    if any("slow" in c for c in t["unanswered_tool_call_ids"])
]


@pytest.mark.parametrize(("thread", "rerun_slow"), CASES)
async def test_resume_each_fixture_thread_after_upgrade(
    fixture_db: Path, thread: dict[str, Any], rerun_slow: bool
) -> None:
    thread_id = thread["thread_id"]
    before = snapshot(fixture_db)
    store = await upgraded(fixture_db)
    try:
        assert_unchanged(before, snapshot(fixture_db))  # the upgrade changed no row
        data = await store.load(thread_id)
        assert data is not None and not data.problems
        old = [m.model_dump_json() for m in data.messages]
        verdict = diagnose(data.messages, data.runs, data.journal)
        state, point = EXPECTED[thread["crash_point"]]
        assert (verdict.state, verdict.crash_point) == (state, point)
        assert [d.call.id for d in verdict.dangling] == thread["unanswered_tool_call_ids"]

        ran: list[str] = []
        provider = FauxProvider(fallback=model)
        agent = Agent(provider, store, thread_id, tools=fixture_tools(ran))
        plan = await agent.plan_resume()
        assert plan.diagnosis.state is state
        for call in plan.calls:
            assert call.known
            assert call.action == ("rerun" if call.call.name == "read_file" else "interrupt"), call
            assert call.choices == (() if call.call.name == "read_file" else ("interrupt", "rerun"))

        if state is not ThreadState.CRASHED:
            assert plan.action is ResumeAction.NONE
            with pytest.raises(NothingToResumeError):
                await agent.resume()
            assert_unchanged(before, snapshot(fixture_db))
            outcome = await agent.prompt("Please check src/app.py once more.")
        else:
            outcome = await agent.resume(_choices(thread, rerun_slow))
        assert outcome == "completed", agent.state.error

        after = await store.load(thread_id)
        assert after is not None and not after.problems
        messages = after.messages
        assert [m.model_dump_json() for m in messages[: len(old)]] == old
        assert diagnose(messages, after.runs, after.journal).state is ThreadState.COMPLETED
        assert isinstance(messages[-1], AssistantMessage) and messages[-1].stop_reason == "stop"
        assert messages[-1].text == FINAL
        assert_paired(messages, f"{thread_id} after resume")
        assert provider.requests
        for i, request in enumerate(provider.requests):
            assert_paired(list(request.messages), f"{thread_id}, request {i}")

        settled = {m.tool_call_id: m for m in messages[len(old) :] if isinstance(m, ToolResultMessage)}
        for call_id in thread["unanswered_tool_call_ids"]:
            result = settled[call_id]
            if call_id.startswith("call_read") or (rerun_slow and "slow" in call_id):
                assert result.metadata.get("settled") == "rerun" and not result.is_error, result
                assert any(r.endswith(f" {call_id}") for r in ran)
            else:
                assert result.metadata.get("settled") == "interrupted" and result.is_error, result
                assert "interrupted" in result.text
                assert not any(r.endswith(f" {call_id}") for r in ran)  # never re-run on its own
        # Every row cubeloop wrote, of every thread, is as it was, but the crashed run the
        # resume settled is closed now.
        unanswered = set(thread["unanswered_tool_call_ids"])
        closed = {
            m.run_id
            for m in data.messages
            if isinstance(m, AssistantMessage) and m.run_id and unanswered & {c.id for c in m.tool_calls}
        }
        assert_unchanged(before, snapshot(fixture_db), closed)
    finally:
        await store.close()


async def test_a_cubeloop_call_still_may_have_started_after_upgrade(fixture_db: Path) -> None:
    # crash-mid-tool was killed while slow_step slept: the call did start. cubeloop kept
    # no journal, so even once the file has our journal table the diagnosis must not
    # claim "never started" - a user deciding whether to re-run would be misled.
    store = await upgraded(fixture_db)
    try:
        data = await store.load("crash-mid-tool")
        assert data is not None
        (dangling,) = diagnose(data.messages, data.runs, data.journal).dangling
        assert dangling.status_words == "may have started"
    finally:
        await store.close()


async def test_browse_only_diagnosis_says_may_have_started(fixture_db: Path) -> None:
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        data = await store.load("crash-mid-tool")
        assert data is not None and data.journal is None
        (dangling,) = diagnose(data.messages, data.runs, data.journal).dangling
        assert dangling.status_words == "may have started"
