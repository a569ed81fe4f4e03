"""A runner in a child process, followed and commanded from this process through one SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.commands import send
from core.errors import ThreadNotRunningError
from core.follow import ThreadFollower
from core.lease_status import LeaseState
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.recovery import ThreadState
from tests.helpers.supervise import command_status, until, until_status

from .child import pause_gate, pause_points, reply_text


async def test_deltas_and_tool_progress_arrive_before_the_run_ends(db: Path, store, spawn) -> None:
    # Reply 1 pauses at 1/5, 2/5, 3/5 and 4/5 of its text until we let it go on, so the
    # follower must show each of those prefixes while the reply is unfinished, and what
    # streams between two pauses must reach it as deltas (text appended to the partial).
    pauses = 4
    runner = spawn(db, "t-live", "Do the work.", env={"CUBEPI_TEST_PAUSE": str(pauses)})
    text = reply_text(1)
    points = pause_points(text, pauses)
    follower = ThreadFollower(store, "t-live")
    changes = []
    partials: list[str] = []
    shown: list[str | None] = []  # the partial text of reply 1 after each change

    def record(change) -> None:
        changes.append(change)
        model = change.model
        if model.partial is not None and model.partial_index == 1:
            partials.append(model.partial.text)
        shown.append(model.partial.text if model.partial is not None and model.partial_index == 1 else None)

    follower.subscribe(record)
    async with follower:
        reached: list[int] = []  # the change at which each pause's prefix was shown
        for j, point in enumerate(points, 1):
            await until(
                follower,
                lambda m, prefix=text[:point]: (
                    m.partial is not None and m.partial_index == 1 and m.partial.text == prefix
                ),
                f"reply 1 streamed up to pause {j} ({point} characters)",
                runner=runner,
            )
            assert [m.role for m in follower.model.messages] == ["user"]  # nothing persisted yet
            reached.append(shown.index(text[:point]))
            runner.gate(pause_gate(1, j))
        # Between two pauses the text came as deltas on the partial already shown, never as a
        # fresh partial: at least one delta change per stretch, each stretch exactly its text.
        for j in range(1, pauses):
            stretch = changes[reached[j - 1] + 1 : reached[j] + 1]
            assert not any(c.partial_reset for c in stretch), f"the partial was replaced between pauses {j} and {j + 1}"
            assert "".join(d.text for c in stretch for d in c.deltas) == text[points[j - 1] : points[j]]
        assert len([c for c in changes if c.deltas]) >= pauses - 1
        await until(
            follower,
            lambda m: any(t.progress and t.progress > 0 and t.text for t in m.running_tools.values()),
            "tool progress",
            runner=runner,
        )
        # All of that while the run still runs: the tool waits for our gate.
        assert runner.alive() and follower.model.lease_view.state is LeaseState.RUNNING_ELSEWHERE
        assert not any(c.ended for c in changes)
        tool = next(iter(follower.model.running_tools.values()))
        assert tool.name == "work" and tool.args == {"label": "1"}

        for j in range(1, pauses + 1):
            runner.gate(pause_gate(2, j))  # the final reply streams without stopping
        runner.gate("release-1")
        assert await runner.wait() == 0
        await until(follower, lambda m: not m.lease_view.live and m.partial is None and not m.running_tools, "the end")
        await until(follower, lambda m: len(m.messages) == 4, "every message", runner=runner)

    data = await store.load("t-live")
    assert (
        [m.role for m in follower.model.messages]
        == [m.role for m in data.messages]
        == ["user", "assistant", "tool_result", "assistant"]
    )
    assert follower.model.message_ids == data.message_ids
    # What streamed was the persisted reply, growing: every partial seen is a prefix of it.
    assert partials and all(data.messages[1].text.startswith(text) for text in partials)
    assert len(max(partials, key=len)) > len(data.messages[1].text) // 2
    assert await store.read_live_events("t-live") == []  # pruned when the run ended
    out, _ = runner.output()
    assert out.splitlines()[-1] == "run completed"


async def test_abort_from_another_process_stops_the_run(db: Path, store, spawn) -> None:
    runner = spawn(db, "t-abort", "Do the work.", env={"CUBEPI_TEST_STUBBORN": "1"})
    async with ThreadFollower(store, "t-abort") as follower:
        await until(follower, lambda m: m.running_tools, "the tool to run", runner=runner)
        command = await send(store, "t-abort", "abort")
        assert command.status == "pending"
        # The tool ignores the abort until we let it, so "delivered" lasts long enough to see.
        seen = await until_status(store, "t-abort", command.seq, {"delivered"})
        runner.gate("honor-abort")
        seen += (await until_status(store, "t-abort", command.seq, {"applied", "refused"}))[1:]
        assert seen == ["pending", "delivered", "applied"] or seen == ["delivered", "applied"]
        assert await runner.wait() == 130
        await until(follower, lambda m: not m.lease_view.live, "the lease to go")
        await until(follower, lambda m: m.diagnosis().state is ThreadState.ABORTED, "an aborted thread")
    out, _ = runner.output()
    assert out.splitlines()[-1] == "run aborted"
    # Sent before the runner read it, the first status this process saw is pending.
    assert seen[0] in ("pending", "delivered")
    with pytest.raises(ThreadNotRunningError, match="nothing to abort"):
        await send(store, "t-abort", "abort")


async def test_a_steer_lands_at_the_next_turn_boundary(db: Path, store, spawn) -> None:
    runner = spawn(db, "t-steer", "Do the work.")
    async with ThreadFollower(store, "t-steer") as follower:
        await until(follower, lambda m: m.running_tools, "the tool to run", runner=runner)
        command = await send(store, "t-steer", "steer", "Use the 2024 figures.")
        await runner.file(f"queued-{command.seq}")
        # Queued with the agent, not yet in the conversation: the tool still runs, and the
        # steer is still the user's to edit or cancel.
        assert await command_status(store, "t-steer", command.seq) == "pending"
        assert not any(
            isinstance(m, UserMessage) and m.metadata.get("kind") == "steer" for m in follower.model.messages
        )
        runner.gate("release-1")
        assert await runner.wait() == 0
        assert (await until_status(store, "t-steer", command.seq, {"applied", "refused"}))[-1] == "applied"
        await until(follower, lambda m: len(m.messages) == 5, "five messages", runner=runner)

    messages = (await store.load("t-steer")).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool_result", "user", "assistant"]
    call = messages[1].tool_calls[0]
    assert isinstance(messages[2], ToolResultMessage) and messages[2].tool_call_id == call.id
    steer = messages[3]
    assert steer.metadata == {"kind": "steer", "command_seq": command.seq} and steer.text == "Use the 2024 figures."
    assert isinstance(messages[4], AssistantMessage) and "Use the 2024 figures." in messages[4].text
    out, _ = runner.output()
    assert "steer: Use the 2024 figures." in out.splitlines()

    # The run is over: a steer now is refused and never wakes a model.
    with pytest.raises(ThreadNotRunningError, match="send the steer as a new prompt"):
        await send(store, "t-steer", "steer", "One more thing.")
    assert len((await store.load("t-steer")).messages) == 5
