"""Sending an undelivered steer as a new run from one window, while another window edits
or cancels it: the send is a compare-and-set on the steer as shown, so a cancelled steer
never runs and an edit made elsewhere is never overwritten by the text first shown."""

from __future__ import annotations

import pytest

from core.checkpoint.memory import MemoryCheckpointer
from core.commands import cancel, edit
from core.errors import CommandRaced
from core.messages import UserMessage
from tests.helpers.tui import fast_session
from tui.session import SENT_AS_PROMPT


async def _offered(store: MemoryCheckpointer):  # type: ignore[no-untyped-def]
    session = fast_session(store)
    await session.open()
    await store.send_command("t", "steer", "focus on europe")  # left by a run that ended
    [offered] = await session.undelivered("t")
    return session, offered


async def _user_texts(store: MemoryCheckpointer) -> list[str]:
    data = await store.load("t")
    return [m.text for m in data.messages if isinstance(m, UserMessage)] if data else []


@pytest.mark.parametrize("meanwhile", ["cancelled", "edited"])
async def test_a_steer_changed_in_another_window_is_not_sent_as_first_shown(meanwhile: str) -> None:
    store = MemoryCheckpointer()
    session, offered = await _offered(store)
    if meanwhile == "cancelled":
        await cancel(store, offered)
    else:
        await edit(store, offered, "focus on asia")
    with pytest.raises(CommandRaced, match=rf"^Steer #{offered.seq} was "):
        await session.send_undelivered("t", offered)
    assert await _user_texts(store) == [], "nothing ran"
    [command] = await store.list_commands("t")
    expected = ("focus on europe", "discarded") if meanwhile == "cancelled" else ("focus on asia", "pending")
    assert (command.text, command.status) == expected


async def test_a_steer_sent_as_a_new_run_is_marked_so_and_a_retry_runs_the_prompt_again() -> None:
    store = MemoryCheckpointer()
    session, offered = await _offered(store)
    assert await session.send_undelivered("t", offered) == "completed"
    [command] = await store.list_commands("t")
    assert (command.status, command.note) == ("discarded", SENT_AS_PROMPT)
    assert await _user_texts(store) == ["focus on europe"]
    # A retry of the same send (the definition changed and the change was accepted, say).
    assert await session.send_undelivered("t", offered) == "completed"
    assert await _user_texts(store) == ["focus on europe", "focus on europe"]
