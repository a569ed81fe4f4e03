"""Run exclusivity: one holder per thread, heartbeats, stale leases taken over, a lost lease stops the run."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import time

import pytest

from core.agent import Agent
from core.checkpoint.base import Lease
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import NothingToResumeError, RunAlreadyClaimedError
from core.events import ToolExecutionUpdate
from core.leases import HeldLease, LeaseHolder, holder_gone, is_stale, pid_alive
from core.messages import ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ThreadState, diagnose
from core.tools import ToolContext, tool
from tests.helpers.transcripts import assert_every_call_answered

WAIT = 10.0  # seconds; reached only by a failing test
HOST = socket.gethostname()


@tool
async def wait_for_abort(ctx: ToolContext) -> str:
    """Block until the run is aborted."""
    ctx.report(text="waiting")
    await ctx.signal.wait()
    return "stopped: abort signal received"


def waiting_script() -> list:
    return [faux_reply(faux_tool_call("wait_for_abort", id="c_wait")), "never"]


def agent_on(store, provider, **options) -> Agent:
    return Agent(provider, store, "t", tools=[wait_for_abort], **options)


async def running(agent: Agent, text: str = "go") -> tuple[asyncio.Task, asyncio.Event]:
    """Start ``agent.prompt(text)`` and return once its tool is running."""
    started = asyncio.Event()
    agent.subscribe(lambda e: started.set() if isinstance(e, ToolExecutionUpdate) else None)
    task = asyncio.create_task(agent.prompt(text))
    await asyncio.wait_for(started.wait(), WAIT)
    return task, started


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def foreign_lease(*, pid: int, host: str = HOST, expires_in: float = 60.0, holder_id: str = "someone-else") -> Lease:
    now = time.time()
    return Lease("t", holder_id, pid, host, "their-run", now - 1, now - 1, now + expires_in)


async def test_a_second_agent_is_refused_while_the_first_runs_then_may_run():
    store = MemoryCheckpointer()
    first = agent_on(store, FauxProvider(waiting_script()))
    second_provider = FauxProvider(["Second."])
    second = agent_on(store, second_provider)
    task, _ = await running(first)

    lease = await store.get_lease("t")
    assert (lease.holder_id, lease.pid, lease.host, lease.run_id) == (
        first.holder.holder_id,
        os.getpid(),
        HOST,
        first.state.run_id,
    )
    with pytest.raises(RunAlreadyClaimedError) as refused:
        await second.prompt("me too")
    sentence = str(refused.value)
    assert sentence.startswith("Thread 't' is already running in process ")
    assert f"process {os.getpid()} on {HOST}" in sentence and sentence.endswith("abort it there.")
    assert refused.value.lease == lease
    with pytest.raises(RunAlreadyClaimedError, match="already running"):
        await second.resume()
    assert second.state.is_running is False and second_provider.requests == []

    first.abort()
    assert await asyncio.wait_for(task, WAIT) == "aborted"
    assert await store.get_lease("t") is None  # released at run end
    assert await asyncio.wait_for(second.prompt("now me"), WAIT) == "completed"
    assert_every_call_answered(second_provider.requests)
    # cubeloop's run claims are still written beside the lease
    assert [r.completed for r in (await store.load("t")).runs] == [False, True]


async def test_the_same_holder_may_run_again_and_leases_are_per_thread():
    store = MemoryCheckpointer()
    holder = LeaseHolder()
    agent = Agent(FauxProvider(["one", "two"]), store, "t", holder=holder)
    other = Agent(FauxProvider(["other"]), store, "u")
    assert await agent.prompt("a") == "completed"
    assert await agent.prompt("b") == "completed"
    assert await other.prompt("c") == "completed"
    assert agent.holder is holder and other.holder.holder_id != holder.holder_id


async def test_an_expired_lease_is_taken_over():
    store = MemoryCheckpointer()
    await store.acquire_lease(foreign_lease(pid=os.getpid(), expires_in=-1.0), is_stale=lambda _: True)
    agent = agent_on(store, FauxProvider(["Taken over."]))
    assert await agent.prompt("go") == "completed"
    assert await store.get_lease("t") is None


async def test_a_lease_whose_process_died_on_this_host_is_taken_over():
    store = MemoryCheckpointer()
    pid = dead_pid()
    assert not pid_alive(pid)
    await store.acquire_lease(foreign_lease(pid=pid), is_stale=lambda _: True)
    agent = agent_on(store, FauxProvider(["Taken over."]))
    assert await agent.prompt("go") == "completed"


async def test_a_live_lease_elsewhere_is_respected():
    store = MemoryCheckpointer()
    # A dead-looking pid on another machine proves nothing: only expiry frees it.
    await store.acquire_lease(foreign_lease(pid=dead_pid(), host="another-host"), is_stale=lambda _: True)
    agent = agent_on(store, FauxProvider([]))
    with pytest.raises(RunAlreadyClaimedError, match="on another-host"):
        await agent.prompt("go")
    # and a live process on this host holding an unexpired lease
    await store.acquire_lease(foreign_lease(pid=os.getpid(), holder_id="x"), is_stale=lambda _: True)
    with pytest.raises(RunAlreadyClaimedError, match=f"process {os.getpid()} on {HOST}"):
        await agent.prompt("go")


def test_is_stale():
    now = 1000.0
    live = Lease("t", "h", os.getpid(), HOST, None, 0, now, now + 10)
    assert not is_stale(live, now=now, host=HOST)
    assert is_stale(live, now=now + 10, host=HOST)
    dead = Lease("t", "h", dead_pid(), HOST, None, 0, now, now + 10)
    assert is_stale(dead, now=now, host=HOST)
    assert not is_stale(dead, now=now, host="elsewhere")  # another host's pid cannot be checked


def test_holder_gone_probes_only_this_hosts_pids_with_the_probe_given():
    lease = Lease("t", "h", 4242, HOST, None, 0, 1000.0, 1010.0)
    probed: list[int] = []

    def dead(pid: int) -> bool:
        probed.append(pid)
        return False

    assert holder_gone(lease, host=HOST, alive=dead) and probed == [4242]
    assert not holder_gone(lease, host=HOST, alive=lambda pid: True)
    assert not holder_gone(lease, host="elsewhere", alive=dead) and probed == [4242]
    # is_stale takes the same probe: a live lease whose holder is gone here is stale at once.
    assert is_stale(lease, now=1000.0, host=HOST, alive=dead)
    assert not is_stale(lease, now=1000.0, host=HOST, alive=lambda pid: True)


async def test_heartbeats_extend_the_lease_past_its_ttl():
    store = MemoryCheckpointer()
    # A ttl of seconds, not tenths: on a loaded 2-core CI machine the heartbeat task was seen
    # held off for 1.3 s, which let a 0.4 s lease lapse although every heartbeat was due.
    agent = agent_on(store, FauxProvider(waiting_script()), lease_ttl=2.0, heartbeat_interval=0.05)
    task, _ = await running(agent)
    first = await store.get_lease("t")
    await asyncio.sleep(2.5)  # longer than the ttl
    later = await store.get_lease("t")
    assert later.holder_id == first.holder_id
    assert later.heartbeat_at > first.heartbeat_at and later.expires_at > first.expires_at
    assert later.expires_at > time.time()  # still live although the ttl has passed since it was taken
    other = agent_on(store, FauxProvider([]))
    with pytest.raises(RunAlreadyClaimedError):
        await other.prompt("go")
    agent.abort()
    assert await asyncio.wait_for(task, WAIT) == "aborted"


async def test_a_lost_lease_aborts_the_run_and_saves_nothing_more():
    store = MemoryCheckpointer()
    agent = agent_on(store, FauxProvider(waiting_script()), lease_ttl=1.0, heartbeat_interval=0.02)
    task, _ = await running(agent)
    before = [m.role for m in (await store.load("t")).messages]
    assert before == ["user", "assistant"]

    # Another process decides this holder is gone and takes the thread over.
    thief = foreign_lease(pid=os.getpid(), holder_id="thief")
    await store.acquire_lease(thief, is_stale=lambda _: True)

    assert await asyncio.wait_for(task, WAIT) == "failed"
    assert agent.state.error.startswith("This run lost its lease on thread 't'")
    assert agent.state.is_running is False
    data = await store.load("t")
    assert [m.role for m in data.messages] == before  # the tool's result and the aborted reply were not written
    assert agent.state.messages == data.messages  # the agent shows what the store holds
    assert (await store.get_lease("t")).holder_id == "thief"  # the new holder's lease is untouched

    # Once the thief is done, the thread resumes cleanly: the call is settled first.
    await store.release_lease("t", "thief")
    provider = FauxProvider(["Recovered."])
    resumer = agent_on(store, provider)
    assert (await resumer.plan_resume()).diagnosis.state is ThreadState.CRASHED
    assert await resumer.resume() == "completed"
    settled = [m for m in (await store.load("t")).messages if isinstance(m, ToolResultMessage)]
    assert [s.metadata for s in settled] == [{"settled": "interrupted"}]
    assert_every_call_answered(provider.requests)


async def test_the_lease_is_released_however_the_run_ends():
    store = MemoryCheckpointer()
    failing = agent_on(store, FauxProvider([]))
    assert await failing.prompt("go") == "failed"
    assert await store.get_lease("t") is None
    assert await agent_on(store, FauxProvider([])).resume() == "failed"  # the retry fails again
    assert await store.get_lease("t") is None
    assert await agent_on(store, FauxProvider(["done"])).resume() == "completed"
    with pytest.raises(NothingToResumeError):
        await agent_on(store, FauxProvider([])).resume()
    assert await store.get_lease("t") is None

    cancelled = agent_on(store, FauxProvider(waiting_script()))
    task, _ = await running(cancelled)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.get_lease("t") is None


@pytest.mark.parametrize("ttl, interval", [(1.0, 1.0), (1.0, 0.0), (1.0, 2.0)])
def test_heartbeat_must_be_shorter_than_the_ttl(ttl, interval):
    with pytest.raises(ValueError, match="heartbeat_interval"):
        Agent(FauxProvider([]), MemoryCheckpointer(), "t", lease_ttl=ttl, heartbeat_interval=interval)


class RenewFails(MemoryCheckpointer):
    """A store whose heartbeats keep failing (say, the disk went away)."""

    async def renew_lease(self, thread_id, holder_id, heartbeat_at, expires_at):
        raise OSError("disk I/O error")


async def test_heartbeats_that_keep_failing_past_the_ttl_stop_the_run():
    store = RenewFails()
    agent = agent_on(store, FauxProvider(waiting_script()), lease_ttl=0.3, heartbeat_interval=0.05)
    task, _ = await running(agent)
    assert await asyncio.wait_for(task, WAIT) == "failed"
    assert agent.state.error == (
        "This run could not renew its lease on thread 't' before it expired (OSError), so it stopped; "
        "another process may take the thread over."
    )


async def test_failing_heartbeats_give_up_before_the_lease_can_expire():
    lost_at: list[float] = []
    gave_up = asyncio.Event()

    def on_lost() -> None:
        lost_at.append(time.time())
        gave_up.set()

    held = await HeldLease.acquire(RenewFails(), "t", LeaseHolder(), "r1", ttl=1.0, interval=0.2, on_lost=on_lost)
    try:
        await asyncio.wait_for(gave_up.wait(), WAIT)
    finally:
        await held.release()
    # The run is told while the lease is still its own, so no other holder can have
    # taken the thread before it stops.
    assert lost_at[0] < held.lease.expires_at
    assert held.lost.startswith("This run could not renew its lease on thread 't' before it expired")


# --- write-time fencing: the reviewer's scenario ----------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def two_connections(request, tmp_path):
    """The store runner A writes through, and the one runner B (another process) uses."""
    if request.param == "memory":
        store = MemoryCheckpointer()
        yield store, store
        return
    from core.checkpoint.sqlite import SQLiteCheckpointer

    path = tmp_path / "threads.sqlite"
    a = await SQLiteCheckpointer.open(path, create=True)
    b = await SQLiteCheckpointer.open(path, create=False)
    try:
        yield a, b
    finally:
        await b.close()
        await a.close()


async def test_a_runner_whose_lease_expired_mid_tool_never_writes_after_the_next_holder(two_connections):
    # As when A's tool blocks its event loop past the lease's ttl (no heartbeat runs): the
    # lease expires, B resumes the thread, settles A's call as interrupted and finishes;
    # then A's tool returns. Its result must not land after B's final reply.
    store_a, store_b = two_connections
    resumed: list[str] = []

    @tool
    async def deploy(ctx: ToolContext) -> str:
        """Deploy (not idempotent, so a resume interrupts it)."""
        lease = await store_a.get_lease("t")
        # Time passed for A without a heartbeat: its lease is past its expiry.
        await store_a.acquire_lease(dataclasses.replace(lease, expires_at=time.time() - 1), is_stale=lambda _: True)
        b = Agent(FauxProvider(["B resumed and finished."]), store_b, "t", tools=[deploy])
        resumed.append(await b.resume())
        return "A's deploy finished"

    a = Agent(
        FauxProvider([faux_reply(faux_tool_call("deploy", id="c1")), "A's final reply"]),
        store_a,
        "t",
        tools=[deploy],
        lease_ttl=30.0,
        heartbeat_interval=10.0,
    )
    assert await asyncio.wait_for(a.prompt("go"), WAIT) == "failed"
    assert resumed == ["completed"]
    assert a.state.error == (
        "This run lost its lease on thread 't' (nobody holds it now), so it stopped without saving more."
    )

    data = await store_b.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert data.messages[2].metadata["settled"] == "interrupted"
    assert data.messages[3].text == "B resumed and finished."
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED
    assert data.journal["c1"].ended_at is None, "A's journal end was refused too"
    assert [m.model_dump() for m in a.state.messages] == [m.model_dump() for m in data.messages]
