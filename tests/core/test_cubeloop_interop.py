"""The real peer: threads cubeloop (0.15.3) wrote are opened, diagnosed and continued here, and
threads we wrote load in cubeloop, pass its tool-cycle checker and continue in its Agent.

cubeloop's threads come from child processes running cubeloop's own Agent, FauxProvider and
SQLiteCheckpointer (``tests/helpers/cubeloop_child.py``), some SIGKILLed at a known moment;
ours from our Agent on our SQLite store, a crash included (``tests/helpers/our_child.py``,
SIGKILLed mid-tool). The crash-point threads themselves (between turns, after a result,
mid-tool, partial batches, abort) are resumed in ``test_fixture_resume.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core.agent import Agent
from core.answers import answer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import AlreadyAnsweredError, RunError
from core.events import ToolExecutionStart
from core.hitl import ApprovalAnswer
from core.hitl_replies import ApproveReply, DenyReply, TextReply
from core.hitl_results import approval_result, ask_answered_result
from core.messages import ToolResultMessage, UserMessage
from core.owners import UNOWNED
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ResumeAction, ThreadState, diagnose
from core.request import check_request
from core.tools import ToolContext, tool
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.cubeloop_peer import (
    CONTINUED,
    check_cycles,
    cubeloop_continue,
    cubeloop_fork,
    cubeloop_load,
    run_completed,
)
from tests.helpers.cubeloop_threads import CUBELOOP_TABLES, read_rows, run_cubeloop
from tests.helpers.our_child import PROMPT, our_tools
from tests.helpers.transcripts import assert_every_call_answered

NEXT = "Anything else to check?"


async def upgraded(db: Path) -> SQLiteCheckpointer:
    # cubeloop's threads record no owner: the unowned scope opens them.
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    await store.upgrade()  # cubeloop's file: browse-only until upgraded
    return store


def cubeloop_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of cubeloop's tables, read with plain sqlite3."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: c.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid").fetchall() for t in CUBELOOP_TABLES}
    finally:
        c.close()


def run_ids(db: Path, thread_id: str) -> list[str]:
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] for r in c.execute("SELECT run_id FROM runs WHERE thread_id = ? ORDER BY rowid", (thread_id,))]
    finally:
        c.close()


async def continue_here(db: Path, thread_id: str) -> FauxProvider:
    """Send :data:`NEXT` on the thread with our Agent; it must complete with every call answered."""
    provider = FauxProvider(fallback=lambda request: faux_reply("Nothing else."))
    store = await upgraded(db)
    try:
        agent = Agent(provider, store, thread_id, tools=our_tools())
        assert await agent.prompt(NEXT) == "completed", agent.state.error
    finally:
        await store.close()
    assert provider.requests
    assert_every_call_answered(provider.requests)
    return provider


# --- cubeloop wrote it, we open it ----------------------------------------------------------


async def test_cubeloop_tool_turns_are_continued_here_and_then_there(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "two_runs", "tr")
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("tr")
    assert data is not None and not data.problems
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"] * 2
    assert [r.completed for r in data.runs] == [True, True]
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED

    await continue_here(db, "tr")
    check_cycles((await cubeloop_load(db, "tr")).messages)
    run_id = await cubeloop_continue(db, "tr")
    assert run_completed(db, "tr", run_id)


async def test_a_cubeloop_fork_opens_and_continues_here(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "two_runs", "tr")
    first_run = run_ids(db, "tr")[0]
    run_cubeloop(db, "fork", "tr-fork", arg=f"tr {first_run}")
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("tr-fork")
    assert data is not None and not data.problems and data.parent_thread_id == "tr"
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant", "user", "assistant"]
    assert data.messages[-1].text == "Forked: src/app.py looks fine."  # type: ignore[union-attr]
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED

    await continue_here(db, "tr-fork")
    check_cycles((await cubeloop_load(db, "tr-fork")).messages)


async def test_a_cubeloop_steer_is_read_in_place_and_continued(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "steer", "st")
    provider = await continue_here(db, "st")
    first = provider.requests[0].messages
    assert [m.role for m in first[:5]] == ["user", "assistant", "tool_result", "user", "assistant"]
    assert isinstance(first[3], UserMessage) and first[3].text == "Run the tests first."


async def test_calls_cubeloop_left_unanswered_before_its_last_reply_are_settled_before_our_model_call(
    tmp_path: Path,
) -> None:
    # cubeloop continued a thread killed mid-tool with a new prompt and got a reply: the
    # killed call now sits, unanswered, before the last assistant message. A real API
    # refuses such a request (400); it must be diagnosed and settled before any model call,
    # the result stamped with the run that issued the call.
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "crash_mid_tool", "cm", kill_at=("tool_started:slow_step",))
    killed_run = run_ids(db, "cm")[0]
    run_cubeloop(db, "continue", "cm", arg="Are you still there?")
    assert [r["role"] for r in read_rows(db, "cm")] == ["user", "assistant", "user", "assistant"]

    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("cm")
    assert data is not None
    verdict = diagnose(data.messages, data.runs)
    assert [d.call.id for d in verdict.dangling] == ["call_slow_1"], verdict

    await continue_here(db, "cm")
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        after = await store.load("cm")
    assert after is not None
    (settled,) = [m for m in after.messages if isinstance(m, ToolResultMessage) and m.tool_call_id == "call_slow_1"]
    assert settled.is_error and settled.metadata.get("settled") == "interrupted"
    assert settled.run_id == killed_run


async def test_a_pending_human_question_waits_for_its_answer_and_cubeloop_takes_it(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "ask_and_detach", "q", arg="run-ask-1")
    before = cubeloop_rows(db)
    assert len(before["thread_pending_request"]) == 1
    assert [r["role"] for r in read_rows(db, "q")] == ["user", "assistant"]  # the ask_user call has no result yet

    store = await upgraded(db)
    try:
        agent = Agent(FauxProvider(), store, "q", tools=our_tools())
        plan = await agent.plan_resume()
        assert plan.diagnosis.state is not ThreadState.CRASHED, plan.diagnosis
        assert "waiting for an answer" in plan.diagnosis.label
        assert "Which file should I check?" in plan.diagnosis.detail
        assert plan.calls == ()
        with pytest.raises(RunError):  # resume refuses: the question waits for the human, not for us
            await agent.resume()
    finally:
        await store.close()
    after = cubeloop_rows(db)
    assert after == before, "the question was settled or its pending row touched"

    run_cubeloop(db, "respond", "q", arg="src/cli.py")
    rows = read_rows(db, "q")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "assistant"]
    assert rows[2]["details"]["hitl"]["answers"] == {"target": "src/cli.py"} and not rows[2]["is_error"]
    assert cubeloop_rows(db)["thread_pending_request"] == []
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("q")
    assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


def answer_cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cubepi-tui answer --db DB --unowned --upgrade ARGS`` as a child process (cubeloop's
    threads record no owner; its file is browse-only until upgraded)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUBEPI_OWNER", "CUBEPI_DB")}
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", "answer", "--db", str(db), "--unowned", "--upgrade", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def hitl_rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """cubeloop's pending rows and answer rows, read with plain sqlite3."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        pending = c.execute("SELECT thread_id, request_json, run_id FROM thread_pending_request").fetchall()
        answers = c.execute("SELECT thread_id, run_id, question_id, answer_json FROM thread_hitl_answers").fetchall()
    finally:
        c.close()
    return pending, answers


def final_text(rows: list[dict[str, Any]]) -> str:
    """The text of the thread's last assistant row."""
    (last,) = [r for r in rows[-1:] if r["role"] == "assistant"]
    return " ".join(b["text"] for b in last["content"] if b["type"] == "text")


@pytest.mark.parametrize("by", ["call", "cli"])
async def test_a_cubeloop_question_answered_here_is_taken_by_cubeloops_agent(tmp_path: Path, by: str) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "ask_and_detach", "q", arg="run-ask-1")
    (pending,), _ = hitl_rows(db)
    qid = json.loads(pending[1])["question_id"]
    if by == "call":
        store = await upgraded(db)
        try:
            done = await answer(store, "q", TextReply("src/cli.py"))
            assert done.run_id == "run-ask-1" and done.request.question_id == qid
            with pytest.raises(AlreadyAnsweredError):
                await answer(store, "q", TextReply("README.md"))
        finally:
            await store.close()
    else:
        result = answer_cli(db, "--thread", "q", "--text", "src/cli.py")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Thread 'q': the question answered {")
        assert answer_cli(db, "--thread", "q", "--text", "README.md").returncode == 2
    assert hitl_rows(db)[1] == [("q", "run-ask-1", qid, '{"target":"src/cli.py"}')]

    run_cubeloop(db, "respond_stored", "q")
    rows = read_rows(db, "q")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "assistant"]
    ours = ask_answered_result({"target": "src/cli.py"})  # what our runtime writes for the same answer
    assert rows[2]["details"]["hitl"] == ours.hitl and not rows[2]["is_error"]
    assert rows[2]["content"][0]["text"] == ours.text
    assert final_text(rows) == 'The tool said: User answers:\n{\n  "target": "src/cli.py"\n}', "what the model saw"
    assert hitl_rows(db) == ([], []), "cubeloop's resume settles the request and its answers"
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("q")
    assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


@pytest.mark.parametrize(
    ("command", "doing"),
    [
        (["answer", "--thread", "q", "--text", "src/cli.py"], "answering"),
        (["run", "--thread", "q", "--demo", "Go on."], "running"),
        (["delete", "q"], "deleting"),
    ],
)
def test_a_headless_command_on_a_cubeloop_file_asks_for_upgrade_and_writes_nothing(
    tmp_path: Path, command: list[str], doing: str
) -> None:
    """``answer``, ``run`` and ``delete`` on cubeloop's file without ``--upgrade``: exit 2
    with one sentence naming the flag and what was refused, and not a byte written."""
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "ask_and_detach", "q", arg="run-ask-1")
    before = cubeloop_rows(db)
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    env = {k: v for k, v in os.environ.items() if k not in ("CUBEPI_OWNER", "CUBEPI_DB")}
    verb, *rest = command
    result = subprocess.run(
        [sys.executable, "-m", "tui.cli", verb, "--db", str(db), "--unowned", *rest],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "pass --upgrade" in result.stderr and f"before {doing}." in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert cubeloop_rows(db) == before
    after = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert after == tables


@pytest.mark.parametrize("by", ["call", "cli"])
async def test_a_cubeloop_approval_approved_here_runs_the_tool_once_in_cubeloop(tmp_path: Path, by: str) -> None:
    db = tmp_path / "cubeloop.sqlite"
    asked = run_cubeloop(db, "approve_and_detach", "k", arg="run-k-1")
    assert "asked" in asked and not any(m.startswith("tool_done:delete_file") for m in asked)
    if by == "call":
        store = await upgraded(db)
        try:
            await answer(store, "k", ApproveReply())
        finally:
            await store.close()
    else:
        result = answer_cli(db, "--thread", "k", "--approve")
        assert result.returncode == 0, result.stderr
        assert (
            result.stdout == "Thread 'k': the call delete_file (call_del_1) approved; resume the thread to apply it.\n"
        )

    marks = run_cubeloop(db, "respond_stored", "k")
    assert marks.count("tool_done:delete_file:/etc/k") == 1
    rows = read_rows(db, "k")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "assistant"]
    assert rows[2]["content"][0]["text"] == "deleted /etc/k" and not rows[2]["is_error"]
    ours = approval_result(ApprovalAnswer(decision="approve"), {"path": "/etc/k"})
    assert rows[2]["details"] == {"hitl": ours.hitl} == {"hitl": {"decision": "human_approve"}}
    assert final_text(rows) == "The tool said: deleted /etc/k"
    assert hitl_rows(db) == ([], [])


@pytest.mark.parametrize("by", ["call", "cli"])
async def test_a_cubeloop_approval_denied_here_reaches_cubeloops_model_as_the_result(tmp_path: Path, by: str) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "approve_and_detach", "k", arg="run-k-1")
    if by == "call":
        store = await upgraded(db)
        try:
            await answer(store, "k", DenyReply("not on prod"))
        finally:
            await store.close()
    else:
        result = answer_cli(db, "--thread", "k", "--deny", "not on prod")
        assert result.returncode == 0, result.stderr

    marks = run_cubeloop(db, "respond_stored", "k")
    assert not any(m.startswith("tool_done:delete_file") for m in marks), "a denied call never runs"
    rows = read_rows(db, "k")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "assistant"]
    ours = approval_result(ApprovalAnswer(decision="deny", reason="not on prod"), {"path": "/etc/k"})
    assert rows[2]["is_error"] is ours.is_error is True and rows[2]["content"][0]["text"] == ours.text == "not on prod"
    assert rows[2]["details"]["hitl"] == ours.hitl == {"decision": "human_deny", "reason": "not on prod"}
    assert final_text(rows) == "The tool said: not on prod"
    assert hitl_rows(db) == ([], [])


async def test_a_cubeloop_fork_of_a_thread_we_resumed_keeps_each_result_with_its_call(tmp_path: Path) -> None:
    # cubeloop was killed mid-tool, we resumed (settling the call), cubeloop forked after our
    # resume run: the fork must not hold a result whose call it lacks (an orphan the API
    # refuses), and must start with the prompt.
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "crash_mid_tool", "cm", kill_at=("tool_started:slow_step",))
    store = await upgraded(db)
    try:
        agent = Agent(FauxProvider([faux_reply("Settled.")]), store, "cm", tools=our_tools())
        assert await agent.resume() == "completed", agent.state.error
        resume_run = agent.state.run_id
    finally:
        await store.close()
    assert resume_run is not None
    check_cycles((await cubeloop_load(db, "cm")).messages)
    await cubeloop_fork(db, "cm", "cm-fork", after_run_id=resume_run)

    fork = await cubeloop_load(db, "cm-fork")
    check_cycles(fork.messages)
    assert fork.messages and fork.messages[0].role == "user"
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("cm-fork")
    assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
    await continue_here(db, "cm-fork")


# --- we wrote it, cubeloop opens it ---------------------------------------------------------


async def test_a_thread_we_wrote_passes_cubeloops_checks_and_continues_there(tmp_path: Path) -> None:
    db = tmp_path / "ours.sqlite"
    store = await SQLiteCheckpointer.open(db, create=True)
    try:
        provider = FauxProvider(
            [
                faux_reply(
                    faux_tool_call("read_file", {"path": "a"}, id="c1"),
                    faux_tool_call("read_file", {"path": "b"}, id="c2"),
                ),
                faux_reply("Read both."),
                faux_reply(faux_tool_call("read_file", {"path": "c"}, id="c3")),
                faux_reply("Read c."),
            ]
        )
        agent = Agent(provider, store, "ours", tools=our_tools())
        assert await agent.prompt("Read a and b.") == "completed"
        assert await agent.prompt("Now c.") == "completed"
    finally:
        await store.close()
    theirs = await cubeloop_load(db, "ours")
    assert [m.role for m in theirs.messages] == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",
        "user",
        "assistant",
        "tool_result",
        "assistant",
    ]
    check_cycles(theirs.messages)
    run_id = await cubeloop_continue(db, "ours")
    assert run_completed(db, "ours", run_id)
    assert read_rows(db, "ours")[-1]["content"][0]["text"] == CONTINUED


async def test_an_abort_we_saved_passes_cubeloops_checks_and_continues_there(tmp_path: Path) -> None:
    db = tmp_path / "ours.sqlite"

    @tool
    async def wait_for_abort(label: str, ctx: ToolContext) -> str:
        """Wait until aborted."""
        await ctx.signal.wait()
        return "stopped by the abort"

    store = await SQLiteCheckpointer.open(db, create=True)
    try:
        provider = FauxProvider([faux_reply(faux_tool_call("wait_for_abort", {"label": "x"}, id="c1"))])
        agent = Agent(provider, store, "ours", tools=[wait_for_abort])
        agent.subscribe(lambda e: agent.abort() if isinstance(e, ToolExecutionStart) else None)
        assert await agent.prompt("Wait.") == "aborted"
        data = await store.load("ours")
        assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.ABORTED
    finally:
        await store.close()
    check_cycles((await cubeloop_load(db, "ours")).messages)
    run_id = await cubeloop_continue(db, "ours")
    assert run_completed(db, "ours", run_id)


async def test_a_crash_we_settled_by_resume_passes_cubeloops_checks_per_run_and_forks_whole(tmp_path: Path) -> None:
    db = tmp_path / "ours.sqlite"
    run_marked(
        [sys.executable, "-m", "tests.helpers.our_child", str(db), "mid_tool", "ours"],
        "our child",
        kill_at=("tool_started:slow_step",),
        cwd=str(REPO_ROOT),
    )
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        provider = FauxProvider([faux_reply("Settled; the build must be checked.")])
        agent = Agent(provider, store, "ours", tools=our_tools())
        plan = await agent.plan_resume()
        assert [c.call.id for c in plan.calls] == ["call_read_1", "call_slow_1"]
        assert await agent.resume() == "completed", agent.state.error
        assert_every_call_answered(provider.requests)
    finally:
        await store.close()
    ids = [row["id"] for row in read_rows(db, "ours")]  # settled results too carry cubeloop's id
    assert len(set(ids)) == len(ids) == 5 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids), ids

    theirs = await cubeloop_load(db, "ours")
    assert [m.role for m in theirs.messages] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
    check_cycles(theirs.messages)  # whole history, then per run: each settled result belongs to the run that called
    continued = await cubeloop_continue(db, "ours")
    assert run_completed(db, "ours", continued)

    # cubeloop's fork copies the messages of completed runs: the crashed run's prompt and
    # calls must come along with their settled results.
    await cubeloop_fork(db, "ours", "ours-fork", after_run_id=continued)
    fork = await cubeloop_load(db, "ours-fork")
    check_cycles(fork.messages)
    assert fork.messages[0].role == "user" and fork.messages[0].content[0].text == PROMPT
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("ours-fork")  # the fork is cubeloop's thread: it records no owner
    assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


def test_the_kill_left_both_calls_unanswered(tmp_path: Path) -> None:
    # The crash above is real: the child is SIGKILLed while both calls of the parallel batch
    # run (read_file's body has run), and neither result was saved.
    db = tmp_path / "ours.sqlite"
    run_marked(
        [sys.executable, "-m", "tests.helpers.our_child", str(db), "mid_tool", "ours"],
        "our child",
        kill_at=("tool_started:slow_step",),
        cwd=str(REPO_ROOT),
    )
    rows = read_rows(db, "ours")
    assert [r["role"] for r in rows] == ["user", "assistant"]
    assert [b["id"] for b in rows[1]["content"] if b["type"] == "tool_call"] == ["call_read_1", "call_slow_1"]


async def test_resuming_a_mid_tool_thread_cubeloop_continued_settles_and_waits_without_a_prefill(
    tmp_path: Path,
) -> None:
    # Settled, the killed call's result is sent right after its call, so what would be sent
    # ends with cubeloop's final reply: a prefill (refused with thinking on). Resume settles
    # and waits for the user, as the plan says; the next prompt is answered normally.
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "crash_mid_tool", "cp", kill_at=("tool_started:slow_step",))
    run_cubeloop(db, "continue", "cp", arg="Never mind, just say hi. ")
    async with await upgraded(db) as store:
        provider = FauxProvider(fallback=lambda request: faux_reply("hi"))
        agent = Agent(provider, store, "cp")
        plan = await agent.plan_resume()
        assert plan.action is ResumeAction.SETTLE_THEN_WAIT
        assert plan.sentence.endswith(
            "Then it waits for your next message (the last reply is final, so the model is not called)."
        )
        assert "calls the model" not in plan.sentence and "calls the model" not in plan.diagnosis.resume_plan
        assert await agent.resume() == "completed"
        assert provider.requests == []
        assert agent.diagnosis().state is ThreadState.COMPLETED
        assert await agent.prompt(NEXT) == "completed"
        (request,) = provider.requests
        assert check_request(request.messages) is None
        assert isinstance(request.messages[-1], UserMessage) and request.messages[-1].text == NEXT
