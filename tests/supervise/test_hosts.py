"""One supervisor, runners on several hosts: real ``cubepi-tui run`` processes, each given its
own ``CUBEPI_HOST_ID``, share one store with the test (the supervisor, itself host "desk").

Commands reach the runner holding their thread's lease and no other; a runner killed on
another host reads running until its lease expires, then crashed with that host named (its
pid, dead here, proves nothing about another host); on the supervisor's own host the dead
pid counts at once. Every test runs once per backend (``tests.helpers.store_backends``).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.checkpoint.base import Checkpointer, Lease
from core.commands import send
from core.errors import ThreadCrashedError
from core.lease_status import LeaseState, lease_status
from core.leases import HOST_ID_ENV, pid_alive
from core.messages import UserMessage
from tests.helpers.store_backends import BACKEND_PARAMS, new_location
from tests.helpers.store_locations import open_location
from tests.helpers.supervise import ROOT, SIGKILL, TIMEOUT, Runner, runner_argv, until_status
from tests.helpers.tui import fast_session
from tui.session import Session

SUPERVISOR_HOST = "desk"
"""The test process's host id: no runner's but the "same host" one."""


@pytest.fixture(params=BACKEND_PARAMS)
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store every runner of the test and the test itself use, on each backend
    (created here, so runners and test never race to create it)."""
    async with new_location(request.param, tmp_path, "hosts") as made:
        created = await open_location(made, create=True)
        await created.close()
        yield made


@pytest.fixture
async def store(location: str) -> AsyncIterator[Checkpointer]:
    opened = await open_location(location, create=False)
    yield opened
    await opened.close()


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make the test process (the supervisor, and its session) host ``desk``."""
    monkeypatch.setenv(HOST_ID_ENV, SUPERVISOR_HOST)
    return SUPERVISOR_HOST


@pytest.fixture
def start(location: str, tmp_path: Path, here: str):
    """``start(thread, host, *runner_options)`` runs the gated test agent on ``thread`` in a
    runner whose host id is ``host``, with its own gate directory; all are killed at the end."""
    runners: list[Runner] = []

    def run(thread: str, host: str, *options: str) -> Runner:
        gates = tmp_path / f"gates-{thread}"
        gates.mkdir()
        argv = runner_argv(location, thread, "--agent", "tests.supervise.child:make_agent", *options, "Do the work.")
        runner = Runner(argv, gates, {HOST_ID_ENV: host, "CUBEPI_TEST_TURNS": "2"})
        runners.append(runner)
        return runner

    yield run
    for runner in runners:
        runner.kill()
        for stream in (runner.proc.stdout, runner.proc.stderr):
            if stream is not None:
                stream.close()


async def _lease(store: Checkpointer, thread: str) -> Lease:
    lease = await store.get_lease(thread)  # type: ignore[attr-defined]
    assert lease is not None, f"thread {thread!r} has no lease"
    return lease


def _steers(messages: object) -> list[tuple[str, object]]:
    return [
        (m.text, m.metadata.get("command_seq"))
        for m in messages  # type: ignore[attr-defined]
        if isinstance(m, UserMessage) and m.metadata.get("kind") == "steer"
    ]


async def _session(location: str) -> Session:
    """The app's session (what its picker lists) on its own connection to ``location``."""
    session = fast_session(await open_location(location, create=False))
    await session.open()
    return session


async def _row_state(session: Session, thread: str) -> str:
    return next(row.state for row in await session.rows() if row.thread_id == thread)


async def test_each_command_is_applied_by_the_runner_holding_its_threads_lease(store: Checkpointer, start) -> None:
    a = start("t-a", "build-7")
    b = start("t-b", "build-8")
    await a.file("started-1")
    await b.file("started-1")
    lease_a, lease_b = await _lease(store, "t-a"), await _lease(store, "t-b")
    assert (lease_a.host, lease_a.pid) == ("build-7", a.pid)
    assert (lease_b.host, lease_b.pid) == ("build-8", b.pid)

    # Steers, sent the way the app sends them, while both tools run.
    steer_a = await send(store, "t-a", "steer", "Steer for build-7.")
    steer_b = await send(store, "t-b", "steer", "Steer for build-8.")
    await a.file(f"queued-{steer_a.seq}")  # each runner has its steer queued for the turn boundary
    await b.file(f"queued-{steer_b.seq}")
    a.gate("release-1")
    b.gate("release-1")
    assert (await until_status(store, "t-a", steer_a.seq, {"applied"}))[-1] == "applied"  # type: ignore[arg-type]
    assert (await until_status(store, "t-b", steer_b.seq, {"applied"}))[-1] == "applied"  # type: ignore[arg-type]
    await a.file("started-2")
    await b.file("started-2")
    # Each steer is in its own thread's conversation only, under its command's number.
    data_a, data_b = await store.load("t-a"), await store.load("t-b")
    assert data_a is not None and data_b is not None
    assert _steers(data_a.messages) == [("Steer for build-7.", steer_a.seq)]
    assert _steers(data_b.messages) == [("Steer for build-8.", steer_b.seq)]

    # An abort stops the runner of its thread, and that one only.
    abort_a = await send(store, "t-a", "abort")
    assert await a.wait() == 130
    assert (await until_status(store, "t-a", abort_a.seq, {"applied"}))[-1] == "applied"  # type: ignore[arg-type]
    assert b.alive()
    before = await _lease(store, "t-b")
    deadline = time.monotonic() + TIMEOUT
    while (await _lease(store, "t-b")).heartbeat_at == before.heartbeat_at:  # b still runs, heartbeating
        assert b.alive() and time.monotonic() < deadline, "runner b stopped heartbeating"
        await asyncio.sleep(0.1)
    assert (await _lease(store, "t-b")).holder_id == lease_b.holder_id
    abort_b = await send(store, "t-b", "abort")
    assert await b.wait() == 130
    assert (await until_status(store, "t-b", abort_b.seq, {"applied"}))[-1] == "applied"  # type: ignore[arg-type]

    # Each runner printed its own thread's steer, never the other's.
    out_a, out_b = a.output()[0], b.output()[0]
    assert "steer: Steer for build-7." in out_a and "build-8" not in out_a and "run aborted" in out_a
    assert "steer: Steer for build-8." in out_b and "build-7" not in out_b and "run aborted" in out_b


async def test_a_runner_killed_on_another_host_is_running_until_its_lease_expires(
    location: str, store: Checkpointer, start
) -> None:
    lease_options = ("--lease-ttl", "5", "--heartbeat", "0.3")
    a = start("t-a", "build-7", *lease_options)
    b = start("t-b", "build-8", *lease_options)
    await a.file("started-1")
    await b.file("started-1")
    session = await _session(location)
    assert (await _row_state(session, "t-a")).startswith(f"running on build-7 (pid {a.pid}, beat ")

    a.signal(SIGKILL)
    assert await a.wait() == -SIGKILL
    killed_at = time.time()
    lease = await _lease(store, "t-a")
    assert lease.host == "build-7" and not pid_alive(lease.pid)  # its pid is dead on this machine...
    assert lease.expires_at > killed_at - 1.0  # ...and its lease was live when it died
    seen: list[tuple[float, str]] = []  # (a time after the row was read, its state)
    deadline = time.monotonic() + TIMEOUT
    while not seen or not seen[-1][1].startswith("crashed"):
        assert time.monotonic() < deadline, f"t-a never read crashed: {seen[-3:]}"
        state = await _row_state(session, "t-a")
        seen.append((time.time(), state))
        await asyncio.sleep(0.1)
    # ...yet it read running (on build-7) until its lease expired, not a moment less.
    before = [state for at, state in seen if at < lease.expires_at]
    assert before and all(state.startswith(f"running on build-7 (pid {a.pid}, beat ") for state in before), seen
    crashed_at, crashed = seen[-1]
    assert crashed_at >= lease.expires_at and re.match(
        r"crashed at point \d \([^)]*\) on build-7 \(lease expired ", crashed
    ), seen
    view = lease_status(lease, (await store.load("t-a")).runs)  # type: ignore[union-attr]
    assert view.state is LeaseState.CRASHED and not view.gone
    with pytest.raises(ThreadCrashedError, match=f"process {a.pid} on build-7 stopped"):
        await send(store, "t-a", "steer", "Too late.")

    # The other host's runner never noticed: still running, and still obeys its commands.
    assert b.alive() and (await _row_state(session, "t-b")).startswith(f"running on build-8 (pid {b.pid}, beat ")
    abort_b = await send(store, "t-b", "abort")
    assert await b.wait() == 130
    assert (await until_status(store, "t-b", abort_b.seq, {"applied"}))[-1] == "applied"  # type: ignore[arg-type]
    await session.close()


async def test_a_runner_killed_on_the_supervisors_host_is_crashed_at_once(
    location: str, store: Checkpointer, start, here: str
) -> None:
    # Same host id as the supervisor: the dead pid is checked here and counts before expiry.
    a = start("t-a", here, "--lease-ttl", "600", "--heartbeat", "0.3")
    await a.file("started-1")
    session = await _session(location)
    assert (await _row_state(session, "t-a")).startswith(f"running on {here} (pid {a.pid}, beat ")
    a.signal(SIGKILL)
    assert await a.wait() == -SIGKILL
    assert re.fullmatch(
        rf"crashed at point \d \([^)]*\) on {re.escape(here)} \(pid {a.pid} gone\)", await _row_state(session, "t-a")
    )
    assert (await _lease(store, "t-a")).expires_at > time.time() + 500  # long before its expiry
    await session.close()


async def test_a_runner_given_a_bad_host_id_refuses_in_one_sentence_and_writes_nothing(
    location: str, store: Checkpointer
) -> None:
    argv = runner_argv(location, "t-bad", "--demo", "Do the work.")
    env = {**os.environ, HOST_ID_ENV: "build\x077"}
    done = await asyncio.to_thread(
        subprocess.run, argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert (done.returncode, done.stderr.strip()) == (2, "CUBEPI_HOST_ID must be printable text, not 'build\\x077'.")
    assert await store.load("t-bad") is None and await store.get_lease("t-bad") is None  # type: ignore[attr-defined]
