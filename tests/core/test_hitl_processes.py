"""Human requests across real processes: a runner child's tool call waits for approval,
the answer comes from this process (or two racing children) through the store, the
runner is SIGKILLed while it waits and a resumer child applies the answer.

What is counted across processes is the tool body's runs (one line each in the effects
file) and what the model was sent (the faux model replies ``saw: <its tool result>``).
On SQLite always; on PostgreSQL and Redis when the servers are up (else skipped, see
tests/helpers/services.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.agent import Agent
from core.answers import answer
from core.checkpoint.locations import open_store
from core.commands import send
from core.hitl import ApprovalAnswer
from core.hitl_replies import ApproveReply, DenyReply
from core.messages import ToolResultMessage
from core.providers.faux import FauxProvider
from core.recovery import ResumeAction
from tests.helpers.children import CHILD_TIMEOUT, REPO_ROOT
from tests.helpers.hitl_child import CALL_ID, REASON
from tests.helpers.hitl_runner import THREAD, Child, body_runs, last_reply, result_of
from tests.helpers.services import postgres_database, redis_prefix


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def location(request, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "hitl.sqlite")
    elif request.param == "postgres":
        async with postgres_database("hitl") as url:
            yield url
    else:
        async with redis_prefix("hitl") as (url, prefix):
            yield f"{url}?prefix={prefix}"


@pytest.fixture
def sqlite_location(tmp_path: Path) -> str:
    return str(tmp_path / "hitl.sqlite")


async def thread_data(location: str):
    store = await open_store(location, create=False)
    try:
        return await store.load(THREAD)
    finally:
        await store.close()


async def answer_here(location: str, value: ApprovalAnswer) -> None:
    """Answer the pending request from this process with the app's call (core.answers.answer)."""
    reply = ApproveReply() if value.decision == "approve" else DenyReply(value.reason)
    store = await open_store(location, create=False)
    try:
        await answer(store, THREAD, reply)
    finally:
        await store.close()


async def test_a_runners_tool_waits_for_an_approval_given_from_another_process_and_runs_once(
    location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(location, "run", effects)
    await runner.until("waiting")
    data = await thread_data(location)
    assert data.pending_request is not None and json.loads(data.pending_request.request_json)["question_id"] == CALL_ID
    assert body_runs(effects) == []
    await answer_here(location, ApprovalAnswer(decision="approve"))
    marks = await runner.finish()
    assert "outcome:completed" in marks
    assert len(body_runs(effects)) == 1
    data = await thread_data(location)
    assert last_reply(data) == "saw: deleted /etc/passwd"
    assert result_of(data).details == {"hitl": {"decision": "human_approve"}}
    assert data.pending_request is None


async def test_a_denial_given_from_another_process_reaches_the_model_as_the_tools_result(
    sqlite_location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(sqlite_location, "run", effects)
    await runner.until("waiting")
    await answer_here(sqlite_location, ApprovalAnswer(decision="deny", reason=REASON))
    assert "outcome:completed" in await runner.finish()
    assert body_runs(effects) == []
    data = await thread_data(sqlite_location)
    result = result_of(data)
    assert result.is_error and result.details == {"hitl": {"decision": "human_deny", "reason": REASON}}
    assert last_reply(data) == f"saw: {REASON}"


async def test_a_runner_killed_while_waiting_leaves_the_request_pending_and_a_resume_applies_its_answer_once(
    location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(location, "run", effects)
    await runner.until("waiting")
    await runner.kill()

    data = await thread_data(location)
    pending = data.pending_request
    assert pending is not None and json.loads(pending.request_json)["question_id"] == CALL_ID
    assert [m.role for m in data.messages] == ["user", "assistant"]
    assert data.journal is not None and (CALL_ID not in data.journal or data.journal[CALL_ID].started_at is None)
    assert not any(r.completed for r in data.runs if r.run_id == pending.run_id)
    assert body_runs(effects) == []

    await answer_here(location, ApprovalAnswer(decision="approve"))
    resumer = await Child.start(location, "resume", effects)
    assert "outcome:completed" in await resumer.finish()
    assert len(body_runs(effects)) == 1, body_runs(effects)
    data = await thread_data(location)
    assert result_of(data).run_id == pending.run_id
    assert last_reply(data) == "saw: deleted /etc/passwd"
    assert data.pending_request is None
    store = await open_store(location, create=False)
    try:
        plan = await Agent(FauxProvider(), store, THREAD).plan_resume()
        assert plan.action is ResumeAction.NONE, plan.diagnosis
    finally:
        await store.close()


async def test_two_answers_raced_from_two_processes_exactly_one_applies(location: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(location, "run", effects)
    await runner.until("waiting")
    racers = [await Child.start(location, "answer", effects, d) for d in ("approve", "deny")]
    for r in racers:
        await r.until("ready")  # both have read the question and poll for the go file
    Path(str(effects) + ".go").touch()
    marks = [m for r in racers for m in await r.finish()]
    won = [m.split(":")[1] for m in marks if m.startswith("answered:")]
    lost = [m.split(":")[1] for m in marks if m.startswith("already:")]
    assert len(won) == 1 and len(lost) == 1 and set(won + lost) == {"approve", "deny"}, marks
    assert "outcome:completed" in await runner.finish()
    data = await thread_data(location)
    if won == ["approve"]:
        assert len(body_runs(effects)) == 1 and last_reply(data) == "saw: deleted /etc/passwd"
    else:
        assert body_runs(effects) == [] and last_reply(data) == f"saw: {REASON}"
    assert len([m for m in data.messages if isinstance(m, ToolResultMessage)]) == 1


async def test_a_timeout_without_default_ends_the_runner_waiting_and_a_late_answer_still_applies(
    sqlite_location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    assert "outcome:waiting" in await (await Child.start(sqlite_location, "run", effects, "timeout")).finish()
    data = await thread_data(sqlite_location)
    assert data.pending_request is not None and body_runs(effects) == []
    await answer_here(sqlite_location, ApprovalAnswer(decision="approve"))
    assert "outcome:completed" in await (await Child.start(sqlite_location, "resume", effects, "timeout")).finish()
    assert len(body_runs(effects)) == 1


async def test_detach_ends_the_runner_waiting(sqlite_location: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    marks = await (await Child.start(sqlite_location, "run", effects, "detach")).finish()
    assert "outcome:waiting" in marks
    data = await thread_data(sqlite_location)
    assert data.pending_request is not None and body_runs(effects) == []
    assert [m.role for m in data.messages] == ["user", "assistant"]


async def test_an_abort_sent_while_the_runner_waits_ends_the_call_aborted(sqlite_location: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(sqlite_location, "supervised", effects)
    await runner.until("waiting")
    store = await open_store(sqlite_location, create=False)
    try:
        await send(store, THREAD, "abort")
    finally:
        await store.close()
    assert "outcome:aborted" in await runner.finish()
    assert body_runs(effects) == []
    data = await thread_data(sqlite_location)
    result = result_of(data)
    assert result.is_error and result.details["hitl"]["decision"] == "aborted"
    assert data.pending_request is None


async def test_a_call_killed_after_its_approval_started_is_an_ordinary_dangling_call_never_run_twice(
    sqlite_location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(sqlite_location, "run", effects, "slow")
    await runner.until("waiting")
    await answer_here(sqlite_location, ApprovalAnswer(decision="approve"))
    await runner.until("tool_started")
    await runner.kill()
    data = await thread_data(sqlite_location)
    assert data.journal[CALL_ID].started_at is not None
    assert data.pending_request is not None, "settled only once the result is saved"

    assert "outcome:completed" in await (await Child.start(sqlite_location, "resume", effects, "slow")).finish()
    assert len(body_runs(effects)) == 1, "the journal said it started: it is not run again"
    data = await thread_data(sqlite_location)
    result = result_of(data)
    assert result.is_error and result.metadata.get("settled") == "interrupted"
    assert data.pending_request is None
    assert all(r.completed for r in data.runs)


async def test_a_deadline_counts_from_the_stored_request_so_a_default_applies_after_a_crash(
    sqlite_location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(sqlite_location, "run", effects, "default")
    await runner.until("waiting")
    await runner.kill()
    data = await thread_data(sqlite_location)
    request = json.loads(data.pending_request.request_json)
    assert request["timeout_seconds"] == 1.0
    await asyncio.sleep(max(0.0, request["created_at"] + 1.0 - time.time()) + 0.1)
    assert "outcome:completed" in await (await Child.start(sqlite_location, "resume", effects, "default")).finish()
    assert body_runs(effects) == []
    data = await thread_data(sqlite_location)
    assert last_reply(data) == "saw: no answer in 1 s; the default was used: deny"
    assert data.pending_request is None


async def test_an_approval_given_with_cubepi_tui_answer_reaches_the_waiting_runner(
    sqlite_location: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runner = await Child.start(sqlite_location, "run", effects)
    await runner.until("waiting")
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tui.cli",
        "answer",
        "--db",
        sqlite_location,
        "--thread",
        THREAD,
        "--approve",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), CHILD_TIMEOUT)
    assert cli.returncode == 0, err.decode()
    assert f"delete_file ({CALL_ID})" in out.decode() and "approved" in out.decode()
    assert "outcome:completed" in await runner.finish()
    assert len(body_runs(effects)) == 1
    assert last_reply(await thread_data(sqlite_location)) == "saw: deleted /etc/passwd"
