"""A model call waiting to be retried (rate limited, overloaded) shows the wait in the status
bar, counting down; the wait ends with the reply, or at once with ``a``."""

from __future__ import annotations

from core.checkpoint.memory import MemoryCheckpointer
from core.providers.anthropic import AnthropicProvider
from core.providers.retry import retry_label
from tests.helpers.messages_server import MessagesServer, Status, text_stream
from tests.helpers.tui import fast_session, fill_dialog, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.status_bar import StatusBar

SIZE = (160, 40)


def _anthropic_app(server: MessagesServer, store: MemoryCheckpointer):  # type: ignore[no-untyped-def]
    session = fast_session(
        store, make_provider=lambda: AnthropicProvider("claude-test-1", api_key="k", base_url=server.base_url)
    )
    return make_app(session)


def _status(app) -> str:  # type: ignore[no-untyped-def]
    return app.screen.query_one(StatusBar).render().plain


def test_the_label_rounds_up_and_names_the_next_attempt():
    assert retry_label("rate limited", 11.2, 1, 5) == "rate limited, retrying in 12 s (attempt 2 of 5)"
    assert retry_label("overloaded", 0.0, 4, 5) == "overloaded, retrying now (attempt 5 of 5)"


async def test_a_rate_limit_wait_counts_down_and_a_aborts_it_at_once():
    store = MemoryCheckpointer()
    async with MessagesServer() as server:
        server.add(Status(429, "rate_limit_error", "Slow down.", {"retry-after": "50"}), text_stream("never sent"))
        app = _anthropic_app(server, store)
        async with app.run_test(size=SIZE) as pilot:
            await fill_dialog(pilot, "n", "summarise the sales")
            await pilot.press("enter")
            await wait_for_text(pilot, "rate limited, retrying in 50 s (attempt 2 of 5)")
            await wait_for_text(pilot, "rate limited, retrying in 49 s")  # it counts down
            screen = app.screen
            assert isinstance(screen, ThreadScreen) and screen.running
            await pilot.press("a")
            # The bound is far below the 49 s left to wait: the wait itself must end.
            await wait_for(pilot, lambda: not screen.running, timeout=30, what="the run stopped")
            await wait_for(pilot, lambda: "retrying" not in _status(app), what="the wait cleared")
            await wait_for(pilot, lambda: "aborted" in _status(app), what="aborted in the status bar")
        assert len(server.requests) == 1 and server.remaining == 1
    (summary,) = await store.list_threads()
    last = summary.tail[-1]
    assert (last.role, last.stop_reason) == ("assistant", "aborted")


async def test_a_short_wait_is_shown_then_replaced_by_the_reply():
    store = MemoryCheckpointer()
    async with MessagesServer() as server:
        server.add(
            Status(529, "overloaded_error", "Overloaded", {"retry-after": "2"}), text_stream("Sales rose by 4 %.")
        )
        app = _anthropic_app(server, store)
        async with app.run_test(size=SIZE) as pilot:
            await fill_dialog(pilot, "n", "summarise the sales")
            await pilot.press("enter")
            await wait_for(pilot, lambda: "overloaded, retrying in" in _status(app), what="the wait shown")
            await wait_for_text(pilot, "Sales rose by 4 %.")
            await wait_for(pilot, lambda: "completed" in _status(app), what="the run completed")
            assert "retrying" not in _status(app)
        assert len(server.requests) == 2
