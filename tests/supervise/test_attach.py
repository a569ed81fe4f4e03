"""Attach to a run mid-way, detach, re-attach twice: every message appears exactly once."""

from __future__ import annotations

from pathlib import Path

from core.follow import ThreadChange, ThreadFollower
from tests.helpers.supervise import until


class Session:
    """What one attachment showed: message ids in the order they appeared, and every partial."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.partials: list[tuple[int, str]] = []
        self.changes = 0

    def __call__(self, change: ThreadChange) -> None:
        model = change.model
        self.changes += 1
        if change.reset:
            self.ids = []
        self.ids.extend(model.message_ids[len(model.message_ids) - len(change.added) :])
        assert self.ids == model.message_ids, "what was shown differs from the model"
        if model.partial is not None:
            # Never a partial for a message already shown: it would appear twice.
            assert model.partial_index is not None and model.partial_index >= len(model.messages)
            self.partials.append((model.partial_index, model.partial.text))


async def attach(store, session: Session) -> ThreadFollower:
    follower = ThreadFollower(store, "t-attach")
    follower.subscribe(session)  # start() publishes the first change (the history) too
    first = await follower.start()
    assert first.reset and session.ids == follower.model.message_ids
    return follower


async def test_attach_detach_reattach_shows_every_message_once(db: Path, store, spawn) -> None:
    runner = spawn(db, "t-attach", "Work in turns.", env={"CUBEPI_TEST_TURNS": "2", "CUBEPI_TEST_PAUSE": "1"})
    sessions = [Session() for _ in range(4)]

    # 1. Attach while reply 1 is half streamed (the runner waits for resume-1).
    first = await attach(store, sessions[0])
    await until(
        first,
        lambda m: m.partial is not None and m.partial_index == 1 and len(m.partial.text) > 20,
        "half of reply 1",
        runner=runner,
    )
    assert [m.role for m in first.model.messages] == ["user"]
    runner.gate("resume-1")
    await until(first, lambda m: m.running_tools and len(m.messages) == 2, "tool 1 running", runner=runner)
    await first.stop()

    # 2. Re-attach mid-tool: the running tool comes from the live log, reply 1 from the history.
    second = await attach(store, sessions[1])
    assert len(second.model.messages) == 2 and second.model.partial is None
    assert [t.name for t in second.model.running_tools.values()] == ["work"]
    runner.gate("release-1")
    await until(
        second,
        lambda m: m.partial is not None and m.partial_index == 3 and len(m.partial.text) > 20,
        "half of reply 2",
        runner=runner,
    )
    await second.stop()

    # 3. Re-attach mid-stream of reply 2 and stay to the end.
    third = await attach(store, sessions[2])
    assert third.model.partial is not None and third.model.partial_index == 3
    runner.gate("resume-2")
    await runner.file("started-2")
    runner.gate("release-2")
    await until(
        third, lambda m: m.partial is not None and m.partial_index == 5, "the final reply streaming", runner=runner
    )
    runner.gate("resume-3")
    assert await runner.wait() == 0
    await until(third, lambda m: len(m.messages) == 6 and not m.lease_view.live and m.partial is None, "the end")
    await third.stop()

    # 4. Attach after the end: the history alone.
    fourth = await attach(store, sessions[3])
    await fourth.stop()

    data = await store.load("t-attach")
    assert [m.role for m in data.messages] == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "tool_result",
        "assistant",
    ]
    for session in sessions:
        assert len(session.ids) == len(set(session.ids)), "a message appeared twice"
        assert session.ids == data.message_ids[: len(session.ids)]
        for index, text in session.partials:
            assert data.messages[index].text.startswith(text), "a partial that is not what was persisted"
    assert sessions[2].ids == sessions[3].ids == data.message_ids
    # Each mid-way attachment began from a partial and saw it replaced by the persisted message.
    assert sessions[0].partials[0][0] == 1 and sessions[2].partials[0][0] == 3
