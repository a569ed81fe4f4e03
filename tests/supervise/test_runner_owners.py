"""Owners through the headless runner (real ``python -m core.runner`` children), on every
backend: another owner's thread cannot be resumed, prompted, started, deleted or commanded,
and every refusal reads exactly as for a thread that does not exist; ``--workflow``,
``--accept-changes`` and ``--start``; a bad owner name is one sentence, exit 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.checkpoint.base import Lease, not_deleted_sentence, thread_unavailable
from core.checkpoint.locations import open_store
from core.commands import send
from core.errors import ThreadNotFoundError
from core.fingerprints import first_input_error
from core.leases import deleted_sentence
from core.owners import OWNER_ENV, UNOWNED
from tests.helpers import owner_agents
from tests.helpers.store_backends import BACKEND_PARAMS, new_location
from tests.helpers.supervise import ROOT, Runner

TIMEOUT = 120.0
"""Seconds one runner child may take (a loaded 2-core machine, a server backend)."""

V1 = ["--agent", "tests.helpers.owner_agents:v1"]
V2 = ["--agent", "tests.helpers.owner_agents:v2"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m core.runner ARGS`` run to its end (no owner from the environment unless given)."""
    base = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    return subprocess.run(
        [sys.executable, "-m", "core.runner", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**base, **(env or {})},
    )


def _run(location: str, owner: str | None, thread: str, *args: str) -> subprocess.CompletedProcess[str]:
    who = ["--unowned"] if owner == UNOWNED else ([] if owner is None else ["--owner", owner])
    return _cli("run", "--db", location, "--thread", thread, *who, *args)


def _delete(location: str, owner: str, thread: str) -> subprocess.CompletedProcess[str]:
    who = ["--unowned"] if owner == UNOWNED else ["--owner", owner]
    return _cli("delete", "--db", location, *who, thread)


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one sentence of a run refused as bad input (exit 2, nothing on stdout)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


@pytest.fixture(params=BACKEND_PARAMS)
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty store of each backend, its schema made (so no two children race to make it)."""
    async with new_location(request.param, tmp_path, "owners") as where:
        store = await open_store(where, create=True, owner="alice")
        await store.close()
        yield where


async def _opened(location: str, owner: str):  # type: ignore[no-untyped-def]
    return await open_store(location, create=False, owner=owner)


async def test_another_owners_thread_cannot_be_resumed_prompted_started_or_deleted_and_reads_as_missing(
    location: str,
) -> None:
    # First the id is missing: what alice is told then is what she must be told later.
    missing_resume = _refused(_run(location, "alice", "t-b", *V1, "--resume"))
    missing_delete = _refused(_delete(location, "alice", "t-b"))
    sentence = str(thread_unavailable("t-b", "alice"))
    assert missing_resume == missing_delete == sentence

    _ok(_run(location, "bob", "t-b", *V1, "hello from bob"))
    bob = await _opened(location, "bob")
    try:
        before = await bob.load("t-b")
        assert before is not None and [m.text for m in before.messages] == ["hello from bob", owner_agents.REPLY]

        assert _refused(_run(location, "alice", "t-b", *V1, "--resume")) == missing_resume
        assert _refused(_delete(location, "alice", "t-b")) == missing_delete
        # A prompt or a start would append to bob's thread: refused with the same sentence.
        assert _refused(_run(location, "alice", "t-b", *V1, "let me in")) == sentence
        assert _refused(_run(location, "alice", "t-b", *V1, "--start", "hello from bob")) == sentence
        # The unowned scope is another owner too.
        assert _refused(_run(location, UNOWNED, "t-b", *V1, "--resume")) == str(thread_unavailable("t-b", UNOWNED))

        after = await bob.load("t-b")
        assert after is not None and after.messages == before.messages and after.runs == before.runs
        meta = await bob.load_meta("t-b")
        assert meta is not None and meta.owner == "bob"
        alice = await _opened(location, "alice")
        try:
            assert await alice.load("t-b") is None
            assert [t.thread_id for t in await alice.list_threads()] == []
        finally:
            await alice.close()

        # Bob may delete his own; then it is missing for him too, in the same words.
        assert _ok(_delete(location, "bob", "t-b")).strip() == "Thread 't-b' deleted."
        assert await bob.load("t-b") is None
        assert _refused(_run(location, "bob", "t-b", *V1, "--resume")) == str(thread_unavailable("t-b", "bob"))
    finally:
        await bob.close()


async def test_commands_to_another_owners_live_run_read_as_for_a_missing_thread(location: str, tmp_path: Path) -> None:
    alice = await _opened(location, "alice")
    bob = await _opened(location, "bob")
    gates = tmp_path / "gates"
    gates.mkdir()
    runner: Runner | None = None
    try:
        kinds = [("abort", ""), ("steer", "turn left"), ("follow_up", "and then?")]
        missing = []
        for kind, text in kinds:
            with pytest.raises(ThreadNotFoundError) as refused:
                await send(alice, "t-live", kind, text)  # type: ignore[arg-type]
            missing.append(str(refused.value))
        assert set(missing) == {str(thread_unavailable("t-live", "alice"))}

        argv = [
            sys.executable,
            *("-m", "core.runner", "run", "--db", location, "--thread", "t-live", "--owner", "bob"),
            *("--agent", "tests.supervise.child:make_agent", "Do the work."),
        ]
        runner = Runner(argv, gates)
        await runner.file("started-1")  # bob's run holds the lease, its tool is working

        for (kind, text), said in zip(kinds, missing, strict=True):
            with pytest.raises(ThreadNotFoundError) as refused:
                await send(alice, "t-live", kind, text)  # type: ignore[arg-type]
            assert str(refused.value) == said
        assert await alice.get_lease("t-live") is None
        assert await alice.list_commands("t-live") == []

        # Bob's own abort reaches the run: it was live and commandable all along.
        command = await send(bob, "t-live", "abort")
        assert await runner.wait() == 130
        commands = await bob.list_commands("t-live")
        assert [(c.seq, c.kind) for c in commands] == [(command.seq, "abort")]
    finally:
        if runner is not None:
            runner.kill()
            for stream in (runner.proc.stdout, runner.proc.stderr):
                if stream is not None:
                    stream.close()
        await alice.close()
        await bob.close()


async def test_a_changed_tool_schema_is_refused_then_accepted_with_the_override_recorded(location: str) -> None:
    _ok(_run(location, "alice", "t-wf", *V1, "--workflow", "1", "hello"))
    store = await _opened(location, "alice")
    try:
        first = await store.load("t-wf")
        assert first is not None and len(first.messages) == 2

        refused = _refused(_run(location, "alice", "t-wf", *V2, "--workflow", "1", "again"))
        assert "tool lookup: parameters changed" in refused and "--accept-changes" in refused
        unchanged = await store.load("t-wf")
        assert unchanged is not None and unchanged.messages == first.messages
        meta = await store.load_meta("t-wf")
        assert meta is not None and meta.overrides == () and meta.fingerprints is not None
        assert meta.fingerprints.workflow == "1"

        out = _ok(_run(location, "alice", "t-wf", *V2, "--workflow", "1", "--accept-changes", "again"))
        assert out.splitlines()[-1] == "run completed"
        meta = await store.load_meta("t-wf")
        assert meta is not None and [o.changes for o in meta.overrides] == [("tool lookup: parameters changed",)]
        assert meta.overrides[0].owner == "alice"

        # The definition accepted is now the thread's: the same one goes on without a word.
        _ok(_run(location, "alice", "t-wf", *V2, "--workflow", "1", "once more"))
        refused = _refused(_run(location, "alice", "t-wf", *V2, "--workflow", "2", "and v2"))
        assert "workflow: 1 -> 2" in refused
    finally:
        await store.close()


async def test_delete_while_a_run_holds_the_thread_is_refused_in_the_apps_words(location: str) -> None:
    _ok(_run(location, "alice", "t-busy", *V1, "work"))
    store = await _opened(location, "alice")
    try:
        now = time.time()
        lease = Lease("t-busy", "holder", 4242, "far-box", "r1", now, now, now + 120)
        await store.acquire_lease(lease, is_stale=lambda _lease: True)
        refused = _refused(_delete(location, "alice", "t-busy"))
        # One sentence, made in core.leases, for the runner and the app alike.
        assert re.fullmatch(
            r"Thread 't-busy' was not deleted: process 4242 on far-box is running it \(heartbeat \d+ s ago\)\.",
            refused,
        ), refused
        assert refused.split(" (heartbeat")[0] == not_deleted_sentence("t-busy", lease).split(" (heartbeat")[0]
        assert await store.load("t-busy") is not None  # nothing was deleted
        await store.release_lease("t-busy", "holder")
        assert _ok(_delete(location, "alice", "t-busy")).strip() == deleted_sentence("t-busy")
        assert await store.load("t-busy") is None
    finally:
        await store.close()


async def test_start_creates_a_thread_once_and_refuses_another_first_input(location: str) -> None:
    _ok(_run(location, "alice", "t-start", *V1, "--start", "count the words"))
    store = await _opened(location, "alice")
    try:
        created = await store.load("t-start")
        assert created is not None and [m.text for m in created.messages] == ["count the words", owner_agents.REPLY]
        # The same input again is the same run: nothing new is written.
        _ok(_run(location, "alice", "t-start", *V1, "--start", "count the words"))
        again = await store.load("t-start")
        assert again is not None and again.messages == created.messages
        meta = await store.load_meta("t-start")
        refused = _refused(_run(location, "alice", "t-start", *V1, "--start", "something else"))
        assert refused == str(first_input_error("t-start"))
        # Always: accepting changes covers another definition of the agent, not another job.
        assert _refused(_run(location, "alice", "t-start", *V1, "--start", "--accept-changes", "something else")) == (
            refused
        )
        still = await store.load("t-start")
        assert still is not None and still.messages == created.messages
        assert await store.load_meta("t-start") == meta  # no override, the first input as it was
        # The thread's own first input still finds it done.
        _ok(_run(location, "alice", "t-start", *V1, "--start", "count the words"))
        assert (await store.load("t-start")).messages == created.messages  # type: ignore[union-attr]
    finally:
        await store.close()


@pytest.mark.parametrize(
    "args, env, sentence",
    [
        (["--owner", ""], {}, "An owner name cannot be empty"),
        (["--owner", "eve\x07"], {}, "holds a control character"),
        (["--owner", "x" * 201], {}, "at most 200 characters"),
        (["--owner", "eve", "--unowned"], {}, "not allowed with argument"),
        ([], {OWNER_ENV: "eve\x1b[31m"}, f"{OWNER_ENV}: The owner name"),
    ],
)
def test_a_bad_owner_exits_2_with_one_sentence_for_run_delete_and_the_app(
    tmp_path: Path, args: list[str], env: dict[str, str], sentence: str
) -> None:
    db = str(tmp_path / "x.sqlite")
    for result in (
        _cli("run", "--db", db, "--thread", "t", "--demo", *args, "hi", env=env),
        _cli("delete", "--db", db, *args, "t", env=env),
        subprocess.run(
            [sys.executable, "-m", "tui.cli", db, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, **env},
        ),
    ):
        line = _refused(result)
        assert sentence in line, line
    assert not Path(db).exists()  # refused before any store was opened


@pytest.mark.parametrize(
    "workflow, sentence",
    [
        ("", "A workflow version cannot be empty"),
        ("   ", "A workflow version cannot be empty"),
        ("v1\x1b[2J", "holds a control character"),
        ("v\u202e1", "holds a control character"),
        ("x" * 201, "at most 200 characters, not 201"),
    ],
)
def test_a_bad_workflow_exits_2_with_one_sentence_for_run_and_the_app(
    tmp_path: Path, workflow: str, sentence: str
) -> None:
    db = str(tmp_path / "x.sqlite")
    for result in (
        _cli("run", "--db", db, "--thread", "t", "--demo", "--workflow", workflow, "hi"),
        subprocess.run(
            [sys.executable, "-m", "tui.cli", db, "--workflow", workflow],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        ),
    ):
        line = _refused(result)
        assert sentence in line, line
        assert "\x1b" not in line and "\u202e" not in line, repr(line)  # quoted escaped, never raw
    assert not Path(db).exists()  # refused before any store was opened
