"""Supervision in one process on the memory store: lease views, commands, the live-event log."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import pytest

from core.agent import Agent
from core.checkpoint.base import Lease, RunRecord, thread_unavailable
from core.checkpoint.memory import MemoryCheckpointer
from core.commands import ORPHANED_ABORT, RUN_ENDED, discard, refuse_orphaned_aborts, send, undelivered
from core.errors import (
    CommandError,
    RunAlreadyClaimedError,
    ThreadCrashedError,
    ThreadNotFoundError,
    ThreadNotRunningError,
)
from core.events import AgentEnd, MessageStart
from core.lease_status import LeaseState, lease_status
from core.leases import LeaseHolder, host_id, is_stale
from core.live import LiveFold
from core.messages import UserMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
from core.supervisor import STALE_ABORT, Supervisor
from core.tools import ToolContext, tool

HOST = host_id()
NOW = 1_800_000_000.0


def _lease(
    *,
    host: str = "other-host",
    pid: int = 4242,
    run_id: str | None = "r1",
    heartbeat: float = NOW - 1,
    expires: float = NOW + 5,
    thread: str = "t",
) -> Lease:
    return Lease(thread, "holder-1", pid, host, run_id, NOW - 60, heartbeat, expires)


# --- lease_status ------------------------------------------------------------------------------


def test_no_lease_is_not_running() -> None:
    view = lease_status(None, (), NOW)
    assert view.state is LeaseState.NONE and not view.live and view.may_resume and view.label == "not running"


def test_a_live_lease_of_another_host_runs_elsewhere_until_it_expires() -> None:
    lease = _lease(heartbeat=NOW - 1.2, expires=NOW + 3)
    view = lease_status(lease, [RunRecord("r1", NOW - 60)], NOW, alive=lambda pid: False)
    assert view.state is LeaseState.RUNNING_ELSEWHERE and view.live and not view.may_resume
    assert view.label == "running on other-host (pid 4242, beat 1 s ago)"
    assert view.heartbeat_age == pytest.approx(1.2) and view.expires_in == pytest.approx(3)
    # Past expiry with its run not completed: crashed. Not a moment before.
    assert lease_status(lease, [RunRecord("r1", NOW - 60)], NOW + 2.99).state is LeaseState.RUNNING_ELSEWHERE
    crashed = lease_status(lease, [RunRecord("r1", NOW - 60)], NOW + 3)
    assert crashed.state is LeaseState.CRASHED and crashed.may_resume and not crashed.gone
    assert crashed.label == "crashed on other-host (lease expired 0 s ago)"
    assert lease_status(lease, [], NOW + 183).label.endswith("lease expired 3 min ago)")


def test_an_expired_lease_whose_run_completed_has_ended() -> None:
    view = lease_status(_lease(expires=NOW - 1), [RunRecord("r1", NOW - 60, NOW - 2, 1)], NOW)
    assert view.state is LeaseState.ENDED and view.may_resume and view.label == "not running"


def test_on_this_host_a_gone_process_is_crashed_at_once() -> None:
    lease = _lease(host=HOST, pid=999_999)
    assert lease_status(lease, [], NOW, alive=lambda pid: True).state is LeaseState.RUNNING_ELSEWHERE
    view = lease_status(lease, [], NOW, alive=lambda pid: False)
    assert view.state is LeaseState.CRASHED and view.gone and view.label == f"crashed on {HOST} (pid 999999 gone)"


def test_this_process_runs_here() -> None:
    view = lease_status(_lease(host=HOST, pid=os.getpid()), [], NOW)
    assert view.state is LeaseState.RUNNING_HERE and view.label == "running here" and view.live
    # This process exists by definition: a probe is never asked about it.
    assert lease_status(_lease(host=HOST, pid=os.getpid()), [], NOW, alive=lambda pid: False).live


@pytest.mark.parametrize(
    "lease",
    [
        _lease(host="other-host", expires=NOW + 5),
        _lease(host="other-host", expires=NOW - 5),
        _lease(host=HOST, pid=os.getpid(), expires=NOW + 5),
        _lease(host=HOST, pid=os.getpid(), expires=NOW - 5),
        _lease(host=HOST, pid=999_999, expires=NOW + 5),
    ],
)
def test_lease_status_agrees_with_the_takeover_rule(lease: Lease) -> None:
    # What the picker shows as resumable is exactly what a new runner may take over.
    assert lease_status(lease, [], NOW).may_resume == is_stale(lease, now=NOW, host=HOST)


# --- a supervised agent on the memory store --------------------------------------------------


class RecordingStore(MemoryCheckpointer):
    """The memory store, keeping every live-event batch as written (one call = one transaction)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[dict[str, Any]]] = []

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        self.batches.append([dict(e) for e in events])
        await super().append_live_events(thread_id, run_id, events, keep=keep)


def gated_tool(gate: asyncio.Event, started: asyncio.Event | None = None):
    @tool
    async def wait_for_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate (or the run is aborted)."""
        if started is not None:
            started.set()
        while not gate.is_set():
            if ctx.signal.is_set():
                return "stopped early"
            ctx.report(progress=0.5, text="waiting")
            await asyncio.sleep(0.01)
        return "gate opened"

    return wait_for_gate


def provider_with_tool(final: Any = "Finished.") -> FauxProvider:
    return FauxProvider(
        [faux_reply(faux_text("Calling the tool."), faux_tool_call("wait_for_gate", {}, id="call_1")), final]
    )


async def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def status_of(store: MemoryCheckpointer, thread: str, seq: int) -> str:
    return next(c.status for c in await store.list_commands(thread) if c.seq == seq)


async def test_consecutive_text_deltas_are_joined_into_few_batches() -> None:
    store = RecordingStore()
    text = "".join(f"word{i} " for i in range(800))
    agent = Agent(FauxProvider([faux_reply(faux_text(text))], chunk_size=1), store, "t")
    sup = Supervisor(agent)
    assert await sup.prompt("Talk.") == "completed"
    rows = [row for batch in store.batches for row in batch]
    deltas = [row for row in rows if row["type"] == "text_delta"]
    assert "".join(row["d"] for row in deltas) == text
    assert len(deltas) <= len(store.batches) < len(text) // 10  # one joined row per block per batch
    assert sup.live is not None and sup.live.batches == len(store.batches) and sup.live.rows == len(rows)
    assert [r["type"] for r in rows if r["type"] != "text_delta"] == [
        "agent_start",
        "message_end",
        "message_start",
        "message_end",
        "agent_end",
    ]
    assert [r["i"] for r in rows if r["type"] in ("message_start", "message_end")] == [0, 1, 1]
    assert await store.read_live_events("t") == []  # pruned at the end


async def test_tool_progress_keeps_the_newest_update_per_batch() -> None:
    store = RecordingStore()

    @tool
    async def busy(ctx: ToolContext) -> str:
        """Report a lot of progress without pausing."""
        for i in range(1, 501):
            ctx.report(progress=i / 500, text=f"step {i}")
        await asyncio.sleep(0.06)
        return "done"

    agent = Agent(FauxProvider([faux_reply(faux_tool_call("busy", {}, id="b1")), "ok"]), store, "t", tools=[busy])
    assert await Supervisor(agent).prompt("Go.") == "completed"
    updates = [row for batch in store.batches for row in batch if row["type"] == "tool_execution_update"]
    assert 1 <= len(updates) <= 3 and updates[-1]["progress"] == 1.0 and updates[-1]["text"] == "step 500"


async def test_a_long_stream_writes_snapshots_so_a_bounded_log_can_rebuild_it() -> None:
    store = RecordingStore()
    text = "".join(f"w{i} " for i in range(300))
    gate = asyncio.Event()

    class Slow(FauxProvider):
        async def stream(self, request, signal):  # type: ignore[no-untyped-def]
            async for event in super().stream(request, signal):
                yield event
                await asyncio.sleep(0.004)  # many batches, so many rows

    agent = Agent(Slow([faux_reply(faux_text(text))], chunk_size=3), store, "t")
    sup = Supervisor(agent, keep=10, batch_interval=0.005)
    seen: list[str] = []

    async def watch() -> None:
        while not gate.is_set():
            fold = LiveFold()
            fold.apply(await store.read_live_events("t"), 1, set())  # only the newest `keep` rows exist
            if fold.partial is not None and fold.partial.text:
                seen.append(fold.partial.text)
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    assert await sup.prompt("Talk.") == "completed"
    gate.set()
    await watcher
    assert any(row["type"] == "message_snapshot" for batch in store.batches for row in batch)
    long_ones = [s for s in seen if len(s) > 200]
    assert long_ones and all(text.startswith(s) for s in long_ones)


async def test_abort_steer_and_follow_up_through_the_command_table() -> None:
    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = FauxProvider(
        [
            faux_reply(faux_text("Calling the tool."), faux_tool_call("wait_for_gate", {}, id="call_1")),
            "Steered reply.",
            "Follow-up reply.",
        ]
    )
    agent = Agent(provider, store, "t", tools=[gated_tool(gate, started)])
    sup = Supervisor(agent)
    run = asyncio.create_task(sup.prompt("Start."))
    await started.wait()
    steer = await send(store, "t", "steer", "Go left.")
    follow = await send(store, "t", "follow_up", "And then?")
    await wait_until(lambda: _both_queued(agent), "both queued with the agent")
    # Queued while the tool runs, they are still the user's to edit or cancel.
    assert [c.status for c in await store.list_commands("t")] == ["pending", "pending"]
    gate.set()
    assert await run == "completed"
    messages = (await store.load("t")).messages
    assert [(m.role, (m.metadata or {}).get("kind")) for m in messages] == [
        ("user", "prompt"),
        ("assistant", None),
        ("tool_result", None),
        ("user", "steer"),
        ("assistant", None),
        ("user", "follow_up"),
        ("assistant", None),
    ]
    assert messages[3].metadata["command_seq"] == steer.seq and messages[5].metadata["command_seq"] == follow.seq
    # The steer is read in the run's second turn, the follow-up in its third.
    assert [(c.status, c.note) for c in await store.list_commands("t")] == [
        ("applied", "delivered at turn 2"),
        ("applied", "delivered at turn 3"),
    ]


async def _both_queued(agent: Agent) -> bool:
    return bool(agent.state.pending_steers and agent.state.pending_follow_ups)


async def _queued(agent: Agent, steers: int) -> bool:
    return len(agent.state.pending_steers) == steers


async def test_an_abort_command_stops_the_run() -> None:
    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    agent = Agent(provider_with_tool(), store, "t", tools=[gated_tool(gate, started)])
    run = asyncio.create_task(Supervisor(agent).prompt("Start."))
    await started.wait()
    command = await send(store, "t", "abort")
    assert await run == "aborted"
    assert await status_of(store, "t", command.seq) == "applied"


async def test_a_steer_arriving_as_the_run_ends_stays_pending_and_wakes_nothing() -> None:
    store = MemoryCheckpointer()
    provider = FauxProvider(["Only reply."])
    agent = Agent(provider, store, "t")
    late: list[int] = []

    async def sneak_in(event) -> None:  # type: ignore[no-untyped-def]
        # Another process queues a steer just as the run ends (after the last turn boundary).
        if isinstance(event, AgentEnd):
            late.append((await store.send_command("t", "steer", "Too late?")).seq)

    agent.subscribe(sneak_in)
    assert await Supervisor(agent).prompt("Hello.") == "completed"
    command = next(c for c in await store.list_commands("t") if c.seq == late[0])
    # Never refused for the user: it stays pending and is offered once the run is over.
    assert (command.status, command.note) == ("pending", "")
    assert [c.seq for c in await undelivered(store, "t")] == late
    assert len(provider.requests) == 1 and len((await store.load("t")).messages) == 2
    assert agent.state.pending_steers == []


async def test_an_abort_left_by_an_earlier_run_does_not_abort_the_next_one() -> None:
    store = MemoryCheckpointer()
    old = await store.send_command("t", "abort")  # a runner died before reading it
    agent = Agent(FauxProvider(["Fine."]), store, "t")
    assert await Supervisor(agent).prompt("Hello.") == "completed"
    command = (await store.list_commands("t"))[0]
    assert (command.seq, command.status, command.note) == (old.seq, "refused", STALE_ABORT)


async def test_a_run_refused_its_lease_leaves_the_other_runners_commands_alone() -> None:
    store = MemoryCheckpointer()
    other = LeaseHolder(host="other-host")
    now = time.time()
    await store.acquire_lease(
        Lease("t", other.holder_id, 1, "other-host", "r0", now, now, now + 60), is_stale=lambda _l: True
    )
    await store.append_live_events("t", "r0", [{"type": "agent_start", "run_id": "r0"}])
    steer = await send(store, "t", "steer", "For the other runner.")
    with pytest.raises(RunAlreadyClaimedError):
        await Supervisor(Agent(FauxProvider(["x"]), store, "t")).prompt("Mine?")
    assert await status_of(store, "t", steer.seq) == "pending"
    assert len(await store.read_live_events("t")) == 1


def test_a_store_without_live_events_is_refused() -> None:
    class Plain:
        async def load(self, thread_id: str) -> None: ...

    agent = Agent(FauxProvider(["x"]), MemoryCheckpointer(), "t")
    with pytest.raises(TypeError, match="keeps no live events or commands"):
        Supervisor(agent, Plain())


# --- send / undelivered / discard -----------------------------------------------------------


async def test_send_refuses_a_thread_that_is_not_running() -> None:
    store = MemoryCheckpointer("alice")
    # A thread this owner has none of (missing, or another owner's) is unavailable.
    with pytest.raises(ThreadNotFoundError) as missing:
        await send(store, "t", "abort")
    assert str(missing.value) == str(thread_unavailable("t", "alice"))
    await store.append("t", [user_text("an old prompt")])
    with pytest.raises(
        ThreadNotRunningError,
        match=r"^Thread 't' is not running \(its last run ended\); send the steer as a new prompt\.$",
    ):
        await send(store, "t", "steer", "Hi")
    with pytest.raises(ThreadNotRunningError, match="follow-up as a new prompt"):
        await send(store, "t", "follow_up", "Hi")
    with pytest.raises(ThreadNotRunningError, match="nothing to abort"):
        await send(store, "t", "abort")
    with pytest.raises(CommandError, match="A steer needs some text"):
        await send(store, "t", "steer", "  ")
    with pytest.raises(ValueError):
        await send(store, "t", "restart")  # type: ignore[arg-type]
    assert await store.list_commands("t") == []


async def test_send_refuses_a_crashed_thread() -> None:
    store = MemoryCheckpointer()
    await store.claim_run("t", "r1")
    old = time.time() - 100
    await store.acquire_lease(Lease("t", "h", 1, "other-host", "r1", old, old, old + 15), is_stale=lambda _l: True)
    with pytest.raises(
        ThreadCrashedError,
        match="process 1 on other-host stopped without finishing the run; resume the thread first, then send the steer",
    ):
        await send(store, "t", "steer", "Hi")


async def test_send_rechecks_the_lease_after_queueing() -> None:
    class EndsMeanwhile(MemoryCheckpointer):
        async def send_command(self, thread_id, kind, text=""):  # type: ignore[no-untyped-def]
            command = await super().send_command(thread_id, kind, text)
            await self.release_lease(thread_id, "h")  # the run ends between check and insert
            return command

    store = EndsMeanwhile()
    now = time.time()
    await store.acquire_lease(Lease("t", "h", 1, "other-host", "r1", now, now, now + 15), is_stale=lambda _l: True)
    with pytest.raises(ThreadNotRunningError, match="as a new prompt"):
        await send(store, "t", "steer", "Hi")
    [command] = await store.list_commands("t")
    assert (command.status, command.note) == ("refused", RUN_ENDED)


async def test_undelivered_marks_a_steer_already_in_the_conversation_applied() -> None:
    store = MemoryCheckpointer()
    a = await store.send_command("t", "steer", "A")
    b = await store.send_command("t", "steer", "B")
    await store.update_command(a.seq, "delivered")
    await store.update_command(b.seq, "delivered")
    saved = user_text("A", kind="steer")
    saved.metadata["command_seq"] = a.seq
    await store.append("t", [user_text("Go"), saved])  # the runner died before marking A applied
    assert [c.seq for c in await undelivered(store, "t")] == [b.seq]
    assert await status_of(store, "t", a.seq) == "applied"


async def test_discard_refuses_while_running_and_unknown_commands() -> None:
    store = MemoryCheckpointer()
    steer = await store.send_command("t", "steer", "A")
    now = time.time()
    await store.acquire_lease(Lease("t", "h", 1, "other-host", "r1", now, now, now + 15), is_stale=lambda _l: True)
    with pytest.raises(CommandError, match="is running"):
        await discard(store, "t")
    await store.release_lease("t", "h")
    with pytest.raises(KeyError):
        await discard(store, "t", [steer.seq + 1])
    assert [c.status for c in await discard(store, "t")] == ["discarded"]


async def test_pending_steers_go_with_a_resume_between_turns() -> None:
    store = MemoryCheckpointer()
    await store.claim_run("t", "r1")
    await store.append("t", [UserMessage(content="Start.", metadata={"kind": "prompt"}, run_id="r1")])
    follow = await store.send_command("t", "follow_up", "Then summarise.")
    steer = await store.send_command("t", "steer", "Be brief.")
    provider = FauxProvider(["First answer.", "Summary."])
    agent = Agent(provider, store, "t")
    assert await Supervisor(agent).resume(include_pending=True) == "completed"
    messages = (await store.load("t")).messages
    assert [(m.role, (m.metadata or {}).get("kind")) for m in messages] == [
        ("user", "prompt"),
        ("user", "steer"),
        ("assistant", None),
        ("user", "follow_up"),
        ("assistant", None),
    ]
    assert [c.status for c in await store.list_commands("t")] == ["applied", "applied"]
    assert {m.metadata.get("command_seq") for m in messages if m.role == "user"} == {None, follow.seq, steer.seq}


async def test_one_supervisor_runs_one_run_at_a_time() -> None:
    from core.errors import AgentBusyError

    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    agent = Agent(provider_with_tool(), store, "t", tools=[gated_tool(gate, started)])
    sup = Supervisor(agent)
    run = asyncio.create_task(sup.prompt("Start."))
    await started.wait()
    with pytest.raises(AgentBusyError):
        await sup.prompt("Again.")
    gate.set()
    assert await run == "completed"
    assert [c.status for c in await store.list_commands("t")] == []


# --- "applied" only once the message is saved; settled commands stay settled --------------------


class SavesNoSteer(MemoryCheckpointer):
    """A store that cannot save a steer's message (``fail`` raises)."""

    def __init__(self, fail) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.fail = fail

    async def append(self, thread_id, messages, **fence):  # type: ignore[no-untyped-def]
        if any(isinstance(m, UserMessage) and m.metadata.get("kind") == "steer" for m in messages):
            await self.fail(self)
        await super().append(thread_id, messages, **fence)


async def disk_full(_store: MemoryCheckpointer) -> None:
    raise OSError("disk full")


async def taken_over(store: MemoryCheckpointer) -> None:
    # Another process takes the thread just before the steer is written: the fence refuses it.
    now = time.time()
    await store.acquire_lease(Lease("t", "thief", 1, "other-host", "r9", now, now, now + 60), is_stale=lambda _l: True)


async def steered_run(store: SavesNoSteer) -> tuple[Agent, int]:
    """Run a prompt whose tool waits until a steer is queued with the agent (it is delivered
    at the next turn boundary, then not saved); return the agent and the steer's seq."""
    gate, started = asyncio.Event(), asyncio.Event()
    agent = Agent(provider_with_tool("Steered."), store, "t", tools=[gated_tool(gate, started)])
    run = asyncio.create_task(Supervisor(agent).prompt("Start."))
    await asyncio.wait_for(started.wait(), 30)
    steer = await send(store, "t", "steer", "Go left.")
    await wait_until(lambda: _queued(agent, 1), "the steer queued with the agent")
    gate.set()
    assert await asyncio.wait_for(run, 30) == "failed"
    return agent, steer.seq


async def test_a_steer_whose_message_could_not_be_saved_stays_undelivered() -> None:
    store = SavesNoSteer(disk_full)
    agent, seq = await steered_run(store)
    assert agent.state.error == "Could not save a message, so the run stopped: OSError: disk full"
    assert [m.role for m in (await store.load("t")).messages] == ["user", "assistant", "tool_result"]
    assert await status_of(store, "t", seq) == "delivered"
    [offered] = await undelivered(store, "t")
    assert offered.seq == seq, "offered again, never dropped"
    # No longer pending, so an edit is queued as a new command and the old one discarded.
    from core.commands import edit

    replaced = await edit(store, offered, "Go right.")
    assert replaced.seq > seq and (replaced.status, replaced.text) == ("pending", "Go right.")
    assert [(c.seq, c.status, c.note) for c in await store.list_commands("t")] == [
        (seq, "discarded", f"replaced by #{replaced.seq}"),
        (replaced.seq, "pending", ""),
    ]


async def test_a_steer_refused_by_the_lease_fence_stays_undelivered() -> None:
    store = SavesNoSteer(taken_over)
    agent, seq = await steered_run(store)
    assert agent.state.error.startswith(
        "This run lost its lease on thread 't' (process 1 on other-host took the thread over)"
    )
    assert [m.role for m in (await store.load("t")).messages] == ["user", "assistant", "tool_result"]
    assert await status_of(store, "t", seq) == "delivered"
    assert await undelivered(store, "t") == [], "in flight while the new holder runs"
    await store.release_lease("t", "thief")
    assert [c.seq for c in await undelivered(store, "t")] == [seq]


async def test_a_steer_discarded_while_a_resume_starts_is_not_sent() -> None:
    class DiscardedFromAnotherWindow(MemoryCheckpointer):
        async def acquire_lease(self, lease, *, is_stale):  # type: ignore[no-untyped-def]
            # The resume has read its undelivered steers; the other window discards them first.
            await discard(self, "t")
            return await super().acquire_lease(lease, is_stale=is_stale)

    store = DiscardedFromAnotherWindow()
    await store.claim_run("t", "r1")
    await store.append("t", [UserMessage(content="Start.", metadata={"kind": "prompt"}, run_id="r1")])
    steer = await store.send_command("t", "steer", "Be brief.")
    provider = FauxProvider(["First answer."])
    assert await Supervisor(Agent(provider, store, "t")).resume(include_pending=True) == "completed"
    assert [m.role for m in provider.requests[0].messages] == ["user"], "the steer was not sent"
    [command] = await store.list_commands("t")
    assert (command.seq, command.status, command.note) == (steer.seq, "discarded", "discarded by the user")


async def test_discard_leaves_out_a_command_settled_meanwhile() -> None:
    class OtherWindowFirst(MemoryCheckpointer):
        async def update_command(self, seq, status, note=""):  # type: ignore[no-untyped-def]
            if status == "discarded" and note != "by the other window":
                await super().update_command(seq, "discarded", "by the other window")
            return await super().update_command(seq, status, note)

    store = OtherWindowFirst()
    steer = await store.send_command("t", "steer", "A")
    assert await discard(store, "t") == []
    [command] = await store.list_commands("t")
    assert (command.seq, command.status, command.note) == (steer.seq, "discarded", "by the other window")


async def test_a_run_that_lost_its_lease_leaves_the_new_holders_commands_and_live_log_alone() -> None:
    store = MemoryCheckpointer()
    supervisor = Supervisor(Agent(FauxProvider(["ok"]), store, "t"), store)
    supervisor._started.set()  # as after a run that started and then lost its lease
    now = time.time()
    await store.acquire_lease(
        Lease("t", "new-holder", 1, "other-host", "r2", now, now, now + 30), is_stale=lambda _l: True
    )
    await store.append_live_events("t", "r2", [{"type": "agent_start", "run_id": "r2"}])
    await store.send_command("t", "steer", "for the new run")
    await supervisor._after_run()
    assert [c.status for c in await store.list_commands("t")] == ["pending"]
    assert len(await store.read_live_events("t")) == 1

    await store.release_lease("t", "new-holder")  # once nobody holds it, tidying is ours again
    await store.send_command("t", "abort")
    await supervisor._after_run()
    # The late abort is refused; the steer stays pending for the user to send or discard.
    assert [c.status for c in await store.list_commands("t")] == ["pending", "refused"]
    assert await store.read_live_events("t") == []


async def test_an_abort_whose_runner_died_is_refused_once_the_lease_is_not_live() -> None:
    store = MemoryCheckpointer()
    now = time.time()
    await store.acquire_lease(Lease("t", "runner", 1, "other-host", "r1", now, now, now + 30), is_stale=lambda _l: True)
    abort = await send(store, "t", "abort")
    steer = await send(store, "t", "steer", "keep going")
    assert await refuse_orphaned_aborts(store, "t") == []  # the runner may still take it
    await store.acquire_lease(
        Lease("t", "runner", 1, "other-host", "r1", now - 60, now - 60, now - 30), is_stale=lambda _l: True
    )  # its heartbeat stopped: the lease expired
    (refused,) = await refuse_orphaned_aborts(store, "t")
    assert (refused.seq, refused.status, refused.note) == (abort.seq, "refused", ORPHANED_ABORT)
    statuses = {c.seq: c.status for c in await store.list_commands("t")}
    assert statuses == {abort.seq: "refused", steer.seq: "pending"}  # the steer waits for the resume
    assert await refuse_orphaned_aborts(store, "t") == []


def test_a_view_of_a_run_elsewhere_ages_without_a_new_read() -> None:
    lease = Lease("t", "h", 1, "other-host", "r1", 1000.0, 1000.0, 1015.0)
    view = lease_status(lease, (), 1001.0)
    later = view.at(1009.0)
    assert later.state is LeaseState.RUNNING_ELSEWHERE  # expiry is the store's call, not the clock's here
    assert (later.heartbeat_age, later.expires_in) == (9.0, 6.0) and "beat 9 s ago" in later.label
    # A crash's "lease expired N s ago" ages too; it stays crashed.
    crashed = lease_status(lease, (), 1020.0)
    assert crashed.at(1030.0).state is LeaseState.CRASHED
    assert crashed.at(1030.0).label == "crashed on other-host (lease expired 15 s ago)"
    ended = lease_status(None, (), 1020.0)
    assert ended.at(1030.0) is ended


# --- the durable queue: edit, cancel, kept across an abort (issue 11 item 4) ----------------


def _texts_seen(provider: FauxProvider) -> list[str]:
    return [m.text for request in provider.requests for m in request.messages if isinstance(m, UserMessage)]


async def test_an_edited_steer_is_what_the_model_sees_and_a_cancelled_one_never_arrives() -> None:
    from core.commands import cancel, edit
    from core.errors import CommandRaced

    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = provider_with_tool("Steered reply.")
    agent = Agent(provider, store, "t", tools=[gated_tool(gate, started)])
    run = asyncio.create_task(Supervisor(agent, command_poll=0.02).prompt("Start."))
    await started.wait()
    steer = await send(store, "t", "steer", "Go left.")
    dropped = await send(store, "t", "steer", "Go up.")
    # Both are with the agent, queued for the next turn boundary, and still the user's.
    await wait_until(lambda: _queued(agent, 2), "both steers queued with the agent")
    edited = await edit(store, steer, "Go right.")
    assert (edited.text, edited.status, edited.revision) == ("Go right.", "pending", steer.revision + 1)
    cancelled = await cancel(store, dropped)
    assert cancelled.status == "discarded"
    gate.set()
    assert await run == "completed"
    # Taken at the turn boundary: an edit from a window that saw the first text loses, in one sentence.
    with pytest.raises(CommandRaced, match=r"^Steer #\d+ was applied meanwhile, as first written") as raced:
        await edit(store, edited, "Go down.")
    assert raced.value.text == "Go down."  # kept, so the screen can offer it again
    seen = _texts_seen(provider)
    assert "Go right." in seen and "Go left." not in seen and "Go up." not in seen and "Go down." not in seen
    assert [(c.text, c.status, c.note) for c in await store.list_commands("t")] == [
        ("Go right.", "applied", "delivered at turn 2"),
        ("Go up.", "discarded", "cancelled by the user before delivery"),
    ]


async def test_an_edit_landing_while_the_loop_takes_the_steer_is_what_the_model_reads() -> None:
    class EditedAtTheBoundary(MemoryCheckpointer):
        """The user's edit lands between the runner's read of the steer and its claim."""

        async def update_command(self, seq, status, note="", *, expected_revision=None):  # type: ignore[no-untyped-def]
            if status == "delivered" and expected_revision is not None and not self.raced:
                self.raced = True
                [row] = [c for c in await self.list_commands("t") if c.seq == seq]
                await self.edit_command(seq, "Go right.", expected_revision=row.revision)
            return await super().update_command(seq, status, note, expected_revision=expected_revision)

    store = EditedAtTheBoundary()
    store.raced = False
    gate, started = asyncio.Event(), asyncio.Event()
    provider = provider_with_tool("Steered reply.")
    agent = Agent(provider, store, "t", tools=[gated_tool(gate, started)])
    run = asyncio.create_task(Supervisor(agent, command_poll=0.02).prompt("Start."))
    await started.wait()
    await send(store, "t", "steer", "Go left.")
    await wait_until(lambda: _queued(agent, 1), "the steer queued with the agent")
    gate.set()
    assert await run == "completed" and store.raced
    seen = _texts_seen(provider)
    assert "Go right." in seen and "Go left." not in seen
    [command] = await store.list_commands("t")
    assert (command.text, command.status, command.revision) == ("Go right.", "applied", 4)
    [steer] = [m for m in (await store.load("t")).messages if m.metadata.get("kind") == "steer"]
    assert steer.metadata["command_seq"] == command.seq and steer.text == "Go right."


async def test_a_steer_queued_before_an_abort_is_offered_edited_and_sent_with_the_next_run() -> None:
    from core.commands import edit

    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = FauxProvider(
        [faux_reply(faux_text("Calling the tool."), faux_tool_call("wait_for_gate", {}, id="call_1")), "Went on."]
    )
    agent = Agent(provider, store, "t", tools=[gated_tool(gate, started)])
    sup = Supervisor(agent)
    run = asyncio.create_task(sup.prompt("Start."))
    await started.wait()
    steer = await send(store, "t", "steer", "Focus on europe.")
    await wait_until(lambda: _queued(agent, 1), "the steer queued with the agent")
    agent.abort()
    assert await run == "aborted"
    # Not refused: the agent had it queued, never delivered, so it is offered, still pending.
    [offered] = await undelivered(store, "t")
    assert (offered.seq, offered.status, offered.note) == (steer.seq, "pending", "")
    assert agent.state.pending_steers == [], "taken back, so it cannot wake a later run unasked"
    edited = await edit(store, offered, "Focus on asia.")
    assert edited.seq == steer.seq and edited.status == "pending"
    assert [c.text for c in await undelivered(store, "t")] == ["Focus on asia."]
    assert await sup.prompt("Go on.", include_pending=True) == "completed"
    seen = _texts_seen(provider)
    assert "Focus on asia." in seen and "Focus on europe." not in seen
    assert [(c.seq, c.status) for c in await store.list_commands("t")] == [(steer.seq, "applied")]


async def test_an_edit_or_cancel_that_loses_to_another_windows_edit_says_it_was_edited() -> None:
    from core.commands import cancel, edit
    from core.errors import CommandRaced

    store = MemoryCheckpointer()
    steer = await store.send_command("t", "steer", "Go left.")
    await edit(store, steer, "Go right.")  # window A
    with pytest.raises(CommandRaced) as raced:
        await edit(store, steer, "Go up.")  # window B, as it saw the steer before A's edit
    assert (
        str(raced.value)
        == "Steer #1 was edited meanwhile, so your edit was not applied; edit it again to replace that text."
    )
    assert (raced.value.command.text, raced.value.command.status, raced.value.text) == (
        "Go right.",
        "pending",
        "Go up.",
    )
    with pytest.raises(CommandRaced) as raced:
        await cancel(store, steer)
    assert (
        str(raced.value)
        == "Steer #1 was edited meanwhile, so it was not cancelled; cancel it again to drop it as edited."
    )
    [command] = await store.list_commands("t")
    assert (command.text, command.status) == ("Go right.", "pending")


async def test_an_interrupt_sent_with_the_resume_aborts_no_tool_of_the_new_run() -> None:
    """An interrupt a crashed runner had taken (delivered, its steer never saved) is sent
    with the next run: there are no tools of its own to stop, so its steer is read and
    the tools the model calls next run, rather than being aborted by the leftover interrupt."""
    store = MemoryCheckpointer()
    command = await store.send_command("t", "interrupt", "Focus on asia.")
    await store.update_command(command.seq, "delivered")
    assert [c.seq for c in await undelivered(store, "t")] == [command.seq]

    @tool
    async def quick(ctx: ToolContext) -> str:
        """Return after a moment, or say it was stopped."""
        await asyncio.sleep(0.05)
        return "stopped" if ctx.signal.is_set() else "quick done"

    provider = FauxProvider(
        [faux_reply(faux_text("Calling the tool."), faux_tool_call("quick", {}, id="call_q")), "Finished."]
    )
    agent = Agent(provider, store, "t", tools=[quick])
    assert await Supervisor(agent).prompt("Start.", include_pending=True) == "completed"
    messages = (await store.load("t")).messages
    assert [m.text for m in messages if isinstance(m, UserMessage)] == ["Start.", "Focus on asia."]
    [result] = [m for m in messages if m.role == "tool_result"]
    assert (result.text, result.is_error) == ("quick done", False)
    assert await status_of(store, "t", command.seq) == "applied"


async def test_an_interrupt_whose_steer_was_read_aborts_no_later_tool() -> None:
    """Pressed while no tool runs (the model's reply streaming, no tool called), an
    interrupt's steer is read at the next boundary; the tools of a later turn still run."""

    @tool
    async def quick(ctx: ToolContext) -> str:
        """Return after a moment, or say it was stopped."""
        await asyncio.sleep(0.05)
        return "stopped" if ctx.signal.is_set() else "quick done"

    store = MemoryCheckpointer()
    provider = FauxProvider(
        [
            "Thinking it over.",
            faux_reply(faux_text("Calling the tool."), faux_tool_call("quick", {}, id="call_q")),
            "Finished.",
        ]
    )
    agent = Agent(provider, store, "t", tools=[quick])

    async def interrupt_on_first_reply(event) -> None:  # type: ignore[no-untyped-def]
        # Once, as the first reply (which calls no tool) starts streaming.
        first = not agent.state.pending_steers and not any(m.role == "assistant" for m in agent.state.messages)
        if isinstance(event, MessageStart) and event.message.role == "assistant" and first:
            agent.interrupt("Call the tool now.")

    agent.subscribe(interrupt_on_first_reply)
    assert await agent.prompt("Start.") == "completed"
    messages = agent.state.messages
    assert [m.text for m in messages if isinstance(m, UserMessage)] == ["Start.", "Call the tool now."]
    [result] = [m for m in messages if m.role == "tool_result"]
    assert (result.text, result.is_error) == ("quick done", False)


async def test_a_steer_the_store_could_not_claim_waits_for_the_next_turn_still_pending() -> None:
    class FailsOnce(MemoryCheckpointer):
        """The first claim of a steer fails in the store (a write error), as a busy disk would."""

        failed = False

        async def update_command(self, seq, status, note="", *, expected_revision=None):  # type: ignore[no-untyped-def]
            if status == "delivered" and not self.failed:
                self.failed = True
                raise OSError("disk busy")
            return await super().update_command(seq, status, note, expected_revision=expected_revision)

    store = FailsOnce()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = FauxProvider(
        [
            faux_reply(faux_tool_call("wait_for_gate", {}, id="call_1")),
            faux_reply(faux_tool_call("wait_for_gate", {}, id="call_2")),
            "Done.",
        ]
    )
    agent = Agent(provider, store, "t", tools=[gated_tool(gate, started)])
    run = asyncio.create_task(Supervisor(agent, command_poll=0.02).prompt("Start."))
    await started.wait()
    steer = await send(store, "t", "steer", "Go left.")
    await wait_until(lambda: _queued(agent, 1), "the steer queued with the agent")
    gate.set()
    assert await run == "completed" and store.failed
    messages = (await store.load("t")).messages
    assert [(m.role, (m.metadata or {}).get("kind")) for m in messages] == [
        ("user", "prompt"),
        ("assistant", None),
        ("tool_result", None),
        ("assistant", None),  # the first boundary could not claim it: not sent, still pending
        ("tool_result", None),
        ("user", "steer"),
        ("assistant", None),
    ]
    [command] = await store.list_commands("t")
    assert (command.seq, command.status, command.note) == (steer.seq, "applied", "delivered at turn 3")
