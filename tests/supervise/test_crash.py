"""Runners that die: crashed only once the lease is stale, and steers they never delivered."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from core.agent import Agent
from core.commands import discard, send, undelivered
from core.errors import ThreadCrashedError
from core.follow import ThreadFollower
from core.lease_status import LeaseState
from core.messages import ToolResultMessage, UserMessage
from core.recovery import ThreadState
from core.supervisor import Supervisor
from tests.helpers.supervise import SIGKILL, SIGSTOP, until

from .child import GatedProvider, work


async def test_killed_runner_on_this_host_is_crashed_once_its_process_is_gone(db: Path, store, spawn) -> None:
    # On this host the rule that decides (core.leases.is_stale, shared by lease_status) is:
    # a lease whose holder's pid no longer exists is stale at once, expired or not.
    runner = spawn(db, "t-kill", "Do the work.", "--lease-ttl", "1.5", "--heartbeat", "0.3")
    async with ThreadFollower(store, "t-kill") as follower:
        view = await until(follower, lambda m: m.running_tools and m.lease_view, "the tool to run", runner=runner)
        assert view.state is LeaseState.RUNNING_ELSEWHERE and view.lease.pid == runner.pid
        assert f"(pid {runner.pid}, beat " in view.label
        assert not view.may_resume
        runner.signal(SIGKILL)
        assert await runner.wait() == -SIGKILL
        view = await until(follower, lambda m: m.lease_view.state is LeaseState.CRASHED and m.lease_view, "crashed")
        assert view.gone and view.may_resume and f"pid {runner.pid} gone" in view.label
        assert follower.model.partial is None and not follower.model.running_tools
        assert follower.model.diagnosis().state is ThreadState.CRASHED
    with pytest.raises(ThreadCrashedError, match="resume the thread first"):
        await send(store, "t-kill", "steer", "Too late.")


async def test_killed_runner_elsewhere_stays_running_until_its_lease_expires(
    db: Path, store, spawn, tmp_path: Path
) -> None:
    # A holder on another host cannot be probed: only expiry (no heartbeat for ttl seconds) decides.
    runner = spawn(
        db,
        "t-away",
        argv=[
            sys.executable,
            "-m",
            "tests.supervise.child",
            str(db),
            "t-away",
            "Do the work.",
            "elsewhere.invalid",
            "3",
            "0.5",
        ],
    )
    async with ThreadFollower(store, "t-away") as follower:
        await until(follower, lambda m: m.running_tools, "the tool to run", runner=runner)
        runner.signal(SIGKILL)
        assert await runner.wait() == -SIGKILL
        lease = await store.get_lease("t-away")
        assert lease.host == "elsewhere.invalid"
        states = []
        follower.subscribe(lambda change: states.append((time.time(), change.model.lease_view.state)))
        await follower.refresh()
        if time.time() < lease.expires_at - 0.2:
            assert follower.model.lease_view.state is LeaseState.RUNNING_ELSEWHERE
        await until(follower, lambda m: m.lease_view.state is LeaseState.CRASHED, "crashed after expiry")
        # Nothing was written after the kill: the follower's own timer turned it crashed, on time.
        crashed_at = next(at for at, state in states if state is LeaseState.CRASHED)
        assert crashed_at >= lease.expires_at
        assert all(state is LeaseState.RUNNING_ELSEWHERE for at, state in states if at < lease.expires_at)
        assert "lease expired" in follower.model.lease_view.label


async def _crash_with_undelivered_steers(db: Path, store, spawn, thread: str):
    """A runner that took steer A (queued with its agent for the next turn boundary, so
    still pending), was frozen, got steer B (pending: nobody reads it), and was killed."""
    runner = spawn(db, thread, "Do the work.", "--lease-ttl", "4", "--heartbeat", "0.5")
    await runner.file("started-1")
    a = await send(store, thread, "steer", "Steer A.")
    await runner.file(f"queued-{a.seq}")
    runner.signal(SIGSTOP)
    b = await send(store, thread, "steer", "Steer B.")  # its lease is still live: accepted
    runner.signal(SIGKILL)
    assert await runner.wait() == -SIGKILL
    return a, b


async def test_undelivered_steers_after_a_crash_go_with_the_resume(db: Path, store, spawn) -> None:
    a, b = await _crash_with_undelivered_steers(db, store, spawn, "t-outbox")
    pending = await undelivered(store, "t-outbox")
    assert [(c.seq, c.text, c.status) for c in pending] == [
        (a.seq, "Steer A.", "pending"),
        (b.seq, "Steer B.", "pending"),
    ]

    agent = Agent(GatedProvider(turns=1, pause=False), store, "t-outbox", tools=[work])
    async with Supervisor(agent) as sup:
        assert [c.seq for c in await sup.pending()] == [a.seq, b.seq]
        assert await sup.resume(include_pending=True) == "completed"

    messages = (await store.load("t-outbox")).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool_result", "user", "user", "assistant"]
    settled = messages[2]
    assert (
        isinstance(settled, ToolResultMessage) and settled.is_error and settled.metadata.get("settled") == "interrupted"
    )
    steers = messages[3:5]
    assert all(isinstance(m, UserMessage) and m.metadata.get("kind") == "steer" for m in steers)
    assert [m.metadata["command_seq"] for m in steers] == [a.seq, b.seq]
    assert messages[5].text == "All done. Steers: Steer A.; Steer B."
    assert {c.seq: c.status for c in await store.list_commands("t-outbox")} == {a.seq: "applied", b.seq: "applied"}
    assert await undelivered(store, "t-outbox") == []


async def test_undelivered_steers_after_a_crash_can_be_discarded(db: Path, store, spawn) -> None:
    a, b = await _crash_with_undelivered_steers(db, store, spawn, "t-drop")
    dropped = await discard(store, "t-drop", [a.seq])
    assert [(c.seq, c.status) for c in dropped] == [(a.seq, "discarded")]
    assert [c.seq for c in await undelivered(store, "t-drop")] == [b.seq]

    agent = Agent(GatedProvider(turns=1, pause=False), store, "t-drop", tools=[work])
    async with Supervisor(agent) as sup:
        assert await sup.resume(include_pending=True) == "completed"
    messages = (await store.load("t-drop")).messages
    assert [m.text for m in messages if isinstance(m, UserMessage) and m.metadata.get("kind") == "steer"] == [
        "Steer B."
    ]
    assert messages[-1].text == "All done. Steers: Steer B."
    assert {c.seq: c.status for c in await store.list_commands("t-drop")} == {a.seq: "discarded", b.seq: "applied"}
