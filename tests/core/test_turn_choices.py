"""Issue 11 item 5 in the agent: stop after this turn, interrupt and send now, a passive note."""

from __future__ import annotations

import asyncio

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.events import MessageUpdate
from core.loop import STOPPED_TEXT
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
from core.recovery import ThreadState, diagnose
from core.tools import ToolContext, tool


def _gated(gate: asyncio.Event, started: asyncio.Event):  # type: ignore[no-untyped-def]
    @tool
    async def wait_for_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate, or the tool is aborted."""
        started.set()
        while not gate.is_set():
            if ctx.signal.is_set():
                return "stopped early"
            await asyncio.sleep(0.01)
        return "gate opened"

    return wait_for_gate


def _calling(*later: object) -> FauxProvider:
    return FauxProvider([faux_reply(faux_text("Calling."), faux_tool_call("wait_for_gate", {}, id="c1")), *later])


def _user_texts(provider: FauxProvider, n: int) -> list[str]:
    return [m.text for m in provider.requests[n].messages if isinstance(m, UserMessage)]


async def test_stop_after_this_turn_keeps_the_tools_results_and_makes_no_further_model_call() -> None:
    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = _calling("Never asked for.")
    agent = Agent(provider, store, "t", tools=[_gated(gate, started)])
    run = asyncio.create_task(agent.prompt("Go."))
    await started.wait()
    agent.stop_after_turn()
    gate.set()  # the tool finishes its work: not aborted
    assert await run == "aborted"
    assert len(provider.requests) == 1
    data = await store.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    result = data.messages[2]
    assert isinstance(result, ToolResultMessage) and result.content[0].text == "gate opened"  # type: ignore[union-attr]
    last = data.messages[3]
    assert isinstance(last, AssistantMessage) and (last.stop_reason, last.error_message) == ("aborted", STOPPED_TEXT)
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED  # not read as a crash


@pytest.mark.parametrize("kind", ["steer", "follow_up"])
async def test_stop_after_a_turn_that_gave_the_final_reply_takes_nothing_queued(kind: str) -> None:
    store = MemoryCheckpointer()
    provider = FauxProvider(["First reply, no tools.", "Never asked for."])
    agent = Agent(provider, store, "t")

    def queue_then_stop(event: object) -> None:
        if isinstance(event, MessageUpdate) and not agent.state.pending_steers + agent.state.pending_follow_ups:
            (agent.steer if kind == "steer" else agent.follow_up)("Also this.")
            agent.stop_after_turn()

    agent.subscribe(queue_then_stop)
    assert await agent.prompt("Go.") == "completed"  # the reply was final: nothing was cut short
    assert len(provider.requests) == 1, "no further model call"
    data = await store.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant"]
    queued = agent.state.pending_steers if kind == "steer" else agent.state.pending_follow_ups
    assert [m.text for m in queued] == ["Also this."], "kept for the next run, not dropped"


async def test_a_stop_command_whose_turn_gave_the_final_reply_is_applied() -> None:
    from core.commands import send
    from core.supervisor import Supervisor

    store = MemoryCheckpointer()
    provider = FauxProvider(["First reply, no tools.", "Never asked for."])
    agent = Agent(provider, store, "t")
    sent: list[int] = []

    async def queue_then_stop(event: object) -> None:
        if isinstance(event, MessageUpdate) and not sent:
            sent.append((await send(store, "t", "steer", "Also this.")).seq)
            sent.append((await send(store, "t", "stop")).seq)
            # The runner took both: the steer queued for the next turn, the stop delivered at once.
            while not agent.state.pending_steers or "pending" in {
                c.status for c in (await store.list_commands("t"))[1:]
            }:
                await asyncio.sleep(0.01)

    agent.subscribe(queue_then_stop)
    assert await Supervisor(agent, command_poll=0.02).prompt("Go.") == "completed"
    assert len(provider.requests) == 1
    commands = {c.kind: (c.status, c.note) for c in await store.list_commands("t")}
    assert commands == {"steer": ("pending", ""), "stop": ("applied", "")}, "the steer offered again, never sent"


async def test_interrupt_aborts_the_running_tool_then_delivers_the_steer_and_goes_on() -> None:
    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = _calling("Changed course.")
    agent = Agent(provider, store, "t", tools=[_gated(gate, started)])
    run = asyncio.create_task(agent.prompt("Go."))
    await started.wait()
    agent.interrupt("Stop that; look at tests first.")
    assert await run == "completed"  # the gate never opened: the tool was aborted
    assert len(provider.requests) == 2 and _user_texts(provider, 1)[-1] == "Stop that; look at tests first."
    data = await store.load("t")
    result = next(m for m in data.messages if isinstance(m, ToolResultMessage))
    assert result.content[0].text == "stopped early"  # type: ignore[union-attr]
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "user", "assistant"]


async def test_a_note_rides_with_the_next_turn() -> None:
    store = MemoryCheckpointer()
    gate, started = asyncio.Event(), asyncio.Event()
    provider = _calling("Noted.")
    agent = Agent(provider, store, "t", tools=[_gated(gate, started)])
    run = asyncio.create_task(agent.prompt("Go."))
    await started.wait()
    agent.note("FYI: the build server is slow today.")
    gate.set()
    assert await run == "completed"
    assert _user_texts(provider, 1)[-1] == "FYI: the build server is slow today."
    assert agent.state.pending_notes == []


async def test_a_note_never_wakes_an_agent_that_is_done_and_goes_with_the_next_run() -> None:
    store = MemoryCheckpointer()
    provider = FauxProvider(["Done.", "Second answer."])
    agent = Agent(provider, store, "t")

    def note_while_streaming(event: object) -> None:
        if isinstance(event, MessageUpdate) and not agent.state.pending_notes:
            agent.note("By the way, no rush.")

    unsubscribe = agent.subscribe(note_while_streaming)
    assert await agent.prompt("Hello.") == "completed"
    unsubscribe()
    assert len(provider.requests) == 1  # the note did not start another model call
    assert [m.text for m in agent.state.pending_notes] == ["By the way, no rush."]
    assert await agent.prompt("Next.") == "completed"
    assert _user_texts(provider, 1)[-2:] == ["Next.", "By the way, no rush."]
