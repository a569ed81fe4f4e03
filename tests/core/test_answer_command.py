"""``cubepi-tui answer`` as a real child process (``python -m tui.cli answer ...``): the store
chosen by ``--db`` on every backend, one line on success, one sentence and exit 2 otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.changes import StoreWatch
from core.checkpoint.locations import open_store
from core.hitl import ApproveRequest, AskRequest, HumanRequest, Option, Question, RequestPayload, question_id_for
from core.messages import user_text
from core.owners import OWNER_ENV
from tests.helpers.children import REPO_ROOT
from tests.helpers.store_backends import BACKEND_PARAMS, new_location

TIMEOUT = 120.0
"""Seconds one child may take (a loaded 2-core machine, a server backend)."""

APPROVAL = ApproveRequest(tool_name="delete_file", tool_call_id="call_1", args={"path": "/etc/k"})
ASK = AskRequest(
    questions=[
        Question(key="target", prompt="Which file?"),
        Question(
            key="env", prompt="Where?", options=[Option(label="Prod", value="prod"), Option(label="Dev", value="dev")]
        ),
    ]
)


def _answer(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (OWNER_ENV, "CUBEPI_DB")}
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", "answer", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


async def _waiting(location: str, payload: RequestPayload, thread_id: str = "t1") -> str:
    store = await open_store(location, create=True, owner="alice")
    try:
        qid = question_id_for(payload)
        text = HumanRequest(question_id=qid, thread_id=thread_id, payload=payload, created_at=time.time())
        await store.append(thread_id, [user_text("go")])
        await store.save_pending_request(thread_id, text.model_dump_json(), run_id="run-1")
    finally:
        await store.close()
    return qid


async def _idle(location: str, thread_id: str) -> None:
    store = await open_store(location, create=False, owner="alice")
    try:
        await store.append(thread_id, [user_text("hello")])
    finally:
        await store.close()


async def _stored(location: str, thread_id: str, qid: str) -> object:
    store = await open_store(location, create=False, owner="alice")
    try:
        raw = await store.load_answer(thread_id, "run-1", qid)
    finally:
        await store.close()
    return None if raw is None else json.loads(raw)


@pytest.fixture(params=BACKEND_PARAMS)
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with new_location(request.param, tmp_path, "answer") as where:
        yield where


async def test_an_approval_answered_from_the_shell_on_every_backend(location: str) -> None:
    qid = await _waiting(location, APPROVAL)
    done = _answer("--db", location, "--owner", "alice", "--thread", "t1", "--deny", "not on prod")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout
        == "Thread 't1': the call delete_file (call_1) denied: not on prod; resume the thread to apply it.\n"
    )
    assert await _stored(location, "t1", qid) == {"decision": "deny", "edited_args": None, "reason": "not on prod"}
    again = _refused(_answer("--db", location, "--owner", "alice", "--thread", "t1", "--approve"))
    assert again.startswith("Question 'call_1' of thread 't1' was already answered (")
    assert await _stored(location, "t1", qid) == {"decision": "deny", "edited_args": None, "reason": "not on prod"}


POLL = 60.0
"""The waiter's fallback poll (seconds): far longer than the child takes, so a wake soon after
the answer is the change signal's doing."""
WAKE_WITHIN = 10.0
"""Seconds after the answering child ended by which the waiter must have seen the answer."""


async def test_an_answer_from_another_process_wakes_a_waiter_through_the_change_signal(location: str) -> None:
    """How a runner waiting for a person in one process learns of the answer given in another."""
    qid = await _waiting(location, APPROVAL)
    store = await open_store(location, create=False, owner="alice")
    loop = asyncio.get_running_loop()
    ended: list[float] = []

    def answer_in_a_child() -> subprocess.CompletedProcess[str]:
        try:
            return _answer("--db", location, "--owner", "alice", "--thread", "t1", "--approve")
        finally:
            ended.append(loop.time())

    try:
        async with StoreWatch(store, poll=POLL) as watch:
            child = asyncio.create_task(asyncio.to_thread(answer_in_a_child))
            seen = None
            async with asyncio.timeout(POLL + TIMEOUT):
                while seen is None:
                    await watch.wait()
                    seen = await store.load_answer("t1", "run-1", qid)
            woke = loop.time()
            result = await child
    finally:
        await store.close()
    assert result.returncode == 0, result.stderr
    assert json.loads(seen)["decision"] == "approve"
    assert woke < ended[0] + WAKE_WITHIN, (
        f"woken {woke - ended[0]:.1f} s after the child ended: by the poll, not a signal"
    )


async def test_questions_answered_by_key(tmp_path: Path) -> None:
    db = str(tmp_path / "a.sqlite")
    qid = await _waiting(db, ASK)
    done = _answer(
        "--db", db, "--owner", "alice", "--thread", "t1", "--answer", "target=src/cli.py", "--answer", "env=Prod"
    )
    assert done.returncode == 0, done.stderr
    assert await _stored(db, "t1", qid) == {"target": "src/cli.py", "env": "prod"}


async def test_bad_replies_are_one_sentence_and_record_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "a.sqlite")
    qid = await _waiting(db, ASK)
    base = ("--db", db, "--owner", "alice", "--thread", "t1")
    assert _refused(_answer(*base, "--yes")) == "This request takes text, a choice or answers by key, not yes or no."
    assert "answer each by key ('target', 'env')" in _refused(_answer(*base, "--text", "x"))
    assert _refused(_answer(*base, "--answer", "target=x", "--answer", "env=mars")).startswith(
        "'mars' is not an option of question 'env'"
    )
    assert _refused(_answer(*base, "--answer", "nokey")) == "cubepi-tui answer: --answer takes KEY=VALUE, not 'nokey'."
    assert "not allowed with argument" in _refused(_answer(*base, "--approve", "--yes"))
    assert "One of the arguments --approve --deny" in _refused(_answer(*base))
    assert await _stored(db, "t1", qid) is None


async def test_a_thread_not_waiting_or_another_owners(tmp_path: Path) -> None:
    db = str(tmp_path / "a.sqlite")
    await _waiting(db, APPROVAL)
    # Another owner's thread and a missing one read the same sentence.
    assert _refused(_answer("--db", db, "--owner", "bob", "--thread", "t1", "--approve")) == (
        "Thread 't1' is unavailable: owner bob has no such thread."
    )
    assert _refused(_answer("--db", db, "--owner", "alice", "--thread", "t9", "--approve")) == (
        "Thread 't9' is unavailable: owner alice has no such thread."
    )
    await _idle(db, "t2")
    assert _refused(_answer("--db", db, "--owner", "alice", "--thread", "t2", "--approve")) == (
        "Thread 't2' is not waiting for an answer."
    )
    stale = _refused(_answer("--db", db, "--owner", "alice", "--thread", "t1", "--question", "call_0", "--approve"))
    assert stale.startswith("Thread 't1' has no pending question 'call_0'; ")
    edit = _refused(_answer("--db", db, "--owner", "alice", "--thread", "t1", "--edit", "[1]"))
    assert edit.startswith("cubepi-tui answer: --edit takes the tool's arguments as a JSON object")


async def test_request_text_is_printed_escaped(tmp_path: Path) -> None:
    """The tool name comes from the model: a terminal escape in it is shown, never sent."""
    db = str(tmp_path / "a.sqlite")
    await _waiting(db, ApproveRequest(tool_name="rm\x1b[2J", tool_call_id="call_1", args={}))
    done = _answer("--db", db, "--owner", "alice", "--thread", "t1", "--approve")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "rm" in done.stdout
