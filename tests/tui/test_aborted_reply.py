"""A reply that ends without the tool calls it was streaming (aborted while the model wrote
their arguments) shows as saved: the cards of those calls go, here and when followed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from textual.app import App, ComposeResult
from textual.widgets import Markdown

from core.events import StreamEvent, TextDelta, ToolCallDelta, ToolCallStart
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.providers.base import ModelRequest
from tests.helpers.tui import Db, fast_session, fill_dialog, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.message_view import AssistantMessageView
from tui.widgets.tool_call import ToolCallView
from tui.widgets.transcript import Transcript


class StuckInArguments:
    """A model that says a few words, starts a ``fetch_dataset`` call, writes part of its
    arguments and then never goes on (until the run is aborted)."""

    name = "stuck"
    model = "stuck-1"

    def __init__(self) -> None:
        self.writing = asyncio.Event()
        """Set once the call's arguments are half written."""

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        """Stream up to the middle of the call's arguments, then wait for ever."""
        yield TextDelta(0, "Fetching the data.")
        yield ToolCallStart(1, "call_x", "fetch_dataset")
        yield ToolCallDelta(1, '{"name": "sal')
        self.writing.set()
        await asyncio.Event().wait()


def _cards(app: App[object]) -> list[ToolCallView]:
    return list(app.screen.query(ToolCallView))


async def test_aborting_while_the_model_writes_arguments_leaves_no_tool_card(db: Db) -> None:
    model = StuckInArguments()
    session = fast_session(path=db.path, make_provider=lambda: model)
    app = make_app(session)
    async with app.run_test(size=(110, 40)) as pilot:
        await fill_dialog(pilot, "n", "fetch the data")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(v.status == "streaming" for v in _cards(app)), what="the call streaming")
        await wait_for_text(pilot, "model is writing the arguments")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await pilot.press("a")
        await wait_for(pilot, lambda: not screen.running, what="run stopped")
        await wait_for_text(pilot, "aborted by the user")
        await wait_for(pilot, lambda: not _cards(app), what="the call's card gone")
        text = screen_text(app)
        assert "fetch_dataset" not in text and "model is writing the arguments" not in text
        assert "Fetching the data." in text  # the text that was saved stays
        assert screen.transcript.tool_views == {}
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert data is not None
    reply = data.messages[-1]
    assert isinstance(reply, AssistantMessage) and reply.stop_reason == "aborted" and not reply.tool_calls


async def test_a_followed_run_aborted_while_the_model_writes_arguments_leaves_no_tool_card(db: Db) -> None:
    # Another session (its own store connection, as another window would have) runs the thread.
    model = StuckInArguments()
    runner = fast_session(path=db.path, make_provider=lambda: model)
    await runner.open()
    run = asyncio.create_task(runner.prompt("t", "fetch the data"))
    try:
        await asyncio.wait_for(model.writing.wait(), 10)
        app = make_app(fast_session(path=db.path), thread_id="t")
        async with app.run_test(size=(110, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
            screen = app.screen
            assert isinstance(screen, ThreadScreen) and screen.following
            await wait_for(pilot, lambda: bool(_cards(app)), what="the streamed call's card")
            runner.agents["t"].abort()
            assert await asyncio.wait_for(run, 10) == "aborted"
            await wait_for_text(pilot, "aborted by the user")
            await wait_for(pilot, lambda: not _cards(app), what="the call's card gone")
            assert "fetch_dataset" not in screen_text(app)
            assert screen.transcript.tool_views == {}
    finally:
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await runner.close()


class _TranscriptApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Transcript()


async def test_a_saved_reply_unlike_the_streamed_one_is_shown_as_saved() -> None:
    app = _TranscriptApp()
    async with app.run_test(size=(100, 30)) as pilot:
        transcript = app.query_one(Transcript)
        await transcript.show([user_text("go")])
        streamed = AssistantMessage(content=[ToolCall(id="a", name="first"), TextContent(text="between")])
        await transcript.sync_reply(streamed)
        await pilot.pause()
        # The saved reply has other blocks in another order: it is shown as saved.
        saved = AssistantMessage(
            content=[TextContent(text="only text"), ToolCall(id="b", name="second", arguments={"x": 1})],
            stop_reason="tool_use",
        )
        await transcript.end_reply(saved)
        await wait_for(
            pilot,
            lambda: "only text" in screen_text(app) and '{"x": 1}' in screen_text(app),
            what="the saved reply drawn",
        )
        text = screen_text(app)
        assert "first" not in text and "between" not in text
        assert "second" in text
        assert set(transcript.tool_views) == {"b"}
        (view,) = app.query(AssistantMessageView)
        # The text block is a Markdown view (streamed in, so the live kind), then the call.
        kinds = list(view.children)[1:]
        assert len(kinds) == 2 and isinstance(kinds[0], Markdown) and isinstance(kinds[1], ToolCallView)
