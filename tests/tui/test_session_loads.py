"""How often the app's session reads a thread whole: each ``load`` decodes every message
(~70 ms at 10,000 messages, ~1.3 s at 100,000), so a prompt or a resume plan reads the
thread once, under the lease, and still sees what another process wrote just before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, UserMessage
from tests.helpers.tui import fast_session
from tui.session import Session


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[Session]:
    session = fast_session(path=tmp_path / "threads.sqlite")
    await session.open()
    try:
        yield session
    finally:
        await session.close()


def count_loads(session: Session) -> list[str]:
    """The thread ids of every whole ``load`` of the session's store from now on."""
    store = session.store
    assert store is not None
    loads: list[str] = []
    whole = store.load

    async def load(thread_id: str) -> Any:
        loads.append(thread_id)
        return await whole(thread_id)

    store.load = load  # type: ignore[method-assign]
    return loads


async def append_elsewhere(path: Path, thread_id: str, text: str) -> None:
    """A finished exchange written by another connection, as another process would."""
    other = await SQLiteCheckpointer.open(path, create=False)
    try:
        await other.append(
            thread_id,
            [
                UserMessage(content=[TextContent(text=text)], metadata={"kind": "prompt"}),
                AssistantMessage(content=[TextContent(text=f"reply to {text}")], stop_reason="stop"),
            ],
        )
    finally:
        await other.close()


async def test_a_prompt_on_a_known_thread_reads_it_whole_once_and_sees_another_processs_rows(
    session: Session, tmp_path: Path
) -> None:
    assert await session.prompt("t1", "first question") == "completed"
    await append_elsewhere(tmp_path / "threads.sqlite", "t1", "written elsewhere")
    loads = count_loads(session)

    assert await session.prompt("t1", "second question") == "completed"

    assert loads == ["t1"]  # the run's own, under the lease
    texts = [m.text for m in session.agents["t1"].state.messages if isinstance(m, UserMessage)]
    assert texts == ["first question", "written elsewhere", "second question"]


async def test_a_first_prompt_of_the_app_on_an_existing_thread_reads_it_whole_once_before_the_run(
    session: Session, tmp_path: Path
) -> None:
    await append_elsewhere(tmp_path / "threads.sqlite", "t2", "older question")
    loads = count_loads(session)
    started: list[int] = []

    await session.prompt("t2", "new question", on_start=lambda agent: started.append(len(loads)))

    assert started == [0], "the agent was loaded before its run loaded it again"
    assert loads == ["t2"]


async def test_planning_a_resume_reads_the_thread_whole_once(session: Session, tmp_path: Path) -> None:
    await append_elsewhere(tmp_path / "threads.sqlite", "t3", "a question")
    loads = count_loads(session)

    plan, pending = await session.plan_resume("t3")

    assert loads == ["t3"]
    assert plan.diagnosis is not None and pending == []
