"""A greyed-out key of the thread view, pressed anyway, says in one sentence why it does nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from textual.app import App

from core.checkpoint.memory import MemoryCheckpointer
from core.events import StreamEvent, TextDelta
from core.messages import AssistantMessage, TextContent, user_text
from core.providers.base import ModelRequest
from tests.helpers.tui import fast_session, fill_dialog, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen


def _notices(app: App[object]) -> list[str]:
    return [n.message for n in app._notifications]  # type: ignore[attr-defined]


async def _press_and_hear(pilot, key: str, words: str) -> str:  # type: ignore[no-untyped-def]
    """Press ``key``; return the notice containing ``words`` it brought."""
    app = pilot.app
    await pilot.press(key)
    await wait_for(pilot, lambda: any(words in n for n in _notices(app)), what=f"a notice with {words!r} after {key}")
    (notice,) = [n for n in _notices(app) if words in n]
    app.clear_notifications()
    return notice


async def test_r_and_a_on_a_completed_thread_say_why_they_do_nothing() -> None:
    store = MemoryCheckpointer()
    await store.append(
        "done", [user_text("hi"), AssistantMessage(content=[TextContent(text="hello")], stop_reason="stop")]
    )
    app = make_app(fast_session(store), thread_id="done")
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        assert not screen.check_action("resume", ()) and not screen.check_action("abort", ())  # still greyed
        notice = await _press_and_hear(pilot, "r", "Nothing to resume")
        assert notice == "Nothing to resume: the thread completed; press n to send a new prompt."
        notice = await _press_and_hear(pilot, "a", "Nothing to abort")
        assert notice == "Nothing to abort: the agent is not running on this thread."
        assert app.screen is screen  # nothing else happened


async def test_r_on_an_aborted_thread_says_why_it_does_nothing() -> None:
    store = MemoryCheckpointer()
    await store.append(
        "stopped", [user_text("hi"), AssistantMessage(content=[TextContent(text="hel")], stop_reason="aborted")]
    )
    app = make_app(fast_session(store), thread_id="stopped")
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        notice = await _press_and_hear(pilot, "r", "Nothing to resume")
        assert notice == "Nothing to resume: the run was aborted and saved; press n to send a new prompt."


class _Slow:
    """A model that writes a word and then waits until the run is aborted."""

    name = "slow"
    model = "slow-1"

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """One word, then silence."""
        yield TextDelta(0, "Thinking")
        await asyncio.Event().wait()


async def test_r_and_n_while_a_run_here_is_going_say_why_they_do_nothing() -> None:
    session = fast_session(MemoryCheckpointer(), make_provider=lambda: _Slow())
    app = make_app(session)
    async with app.run_test(size=(110, 30)) as pilot:
        await fill_dialog(pilot, "n", "go")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.running, what="running")
        screen = app.screen
        notice = await _press_and_hear(pilot, "r", "Nothing to resume")
        assert notice == "Nothing to resume: the agent is running this thread now."
        notice = await _press_and_hear(pilot, "n", "The agent is running")
        assert "steer it with s" in notice
        assert app.screen is screen  # no prompt dialog opened
        await pilot.press("a")
        await wait_for(pilot, lambda: not screen.running, what="run aborted")


async def test_e_with_every_message_shown_says_so() -> None:
    store = MemoryCheckpointer()
    await store.append(
        "short", [user_text("hi"), AssistantMessage(content=[TextContent(text="hello")], stop_reason="stop")]
    )
    app = make_app(fast_session(store), thread_id="short")
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        notice = await _press_and_hear(pilot, "e", "shown already")
        assert notice == "Every message of this thread is shown already."
