"""The prompt sent is the text as it stood when Enter was pressed."""

from __future__ import annotations

from textual import events

from core.messages import UserMessage
from tests.helpers.tui import Db, fast_session, fill_dialog, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen


async def test_keys_typed_after_enter_do_not_join_the_prompt(db: Db) -> None:
    """A fast typist's Enter then q: the q used to be read into the prompt ("helloq"),
    because the dialog read its input box after the key events queued behind Enter."""
    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(110, 40)) as pilot:
        await fill_dialog(pilot, "n", "hello")
        # Posted together, as the driver does with keys that arrive in one read.
        for key, character in (("enter", "\r"), ("q", "q"), ("q", "q")):
            app.post_message(events.Key(key, character))
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="the thread")
        screen = app.screen
        await wait_for(
            pilot,
            lambda: screen.loaded and not screen.running and screen.transcript.shown_count > 1,
            timeout=60,
            what="the run",
        )
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert data is not None
    first = data.messages[0]
    assert isinstance(first, UserMessage) and first.text == "hello"
