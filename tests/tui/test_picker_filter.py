"""The picker's filter: `/` opens it, typing narrows the list by thread id, first prompt or
state (ignoring case), the heading says "N of M", Escape clears it, Enter opens the row."""

from __future__ import annotations

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.thread_table import ThreadTable


async def _store() -> MemoryCheckpointer:
    """Five threads: three about invoices (one crashed mid-tool), two about the weather."""
    store = MemoryCheckpointer()
    done = AssistantMessage(content=[TextContent(text="Done.")], stop_reason="stop")
    call = AssistantMessage(content=[ToolCall(id="c1", name="fetch", arguments={})], stop_reason="tool_use")
    await store.append("inv-1", [user_text("Check the INVOICES of March"), done])
    await store.append("inv-2", [user_text("Pay the overdue invoices"), call])
    await store.append("wx-1", [user_text("What is the weather in Oslo?"), done])
    await store.append("wx-2", [user_text("Will it rain tomorrow?"), done])
    await store.append("inv-3", [user_text("Send the invoices to accounting"), done])
    return store


def _shown(app: object) -> list[str]:
    table = app.threads_screen.query_one(ThreadTable)  # type: ignore[attr-defined]
    return [row.thread_id for row in table.rows]


def _heading(app: object) -> str:
    return screen_text(app).splitlines()[0]  # type: ignore[arg-type]


async def _type(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    for char in text:
        await pilot.press(char if char != " " else "space")


async def test_typing_narrows_the_list_and_the_heading_counts_what_is_shown() -> None:
    app = make_app(fast_session(await _store()))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="all five threads")
        assert "threads of" in _heading(app) and "· 5  in" in _heading(app)
        await pilot.press("slash")
        await _type(pilot, "invoice")  # the prompts say "INVOICES" and "invoices": case does not matter
        await wait_for(pilot, lambda: len(_shown(app)) == 3, what="the invoice threads")
        assert set(_shown(app)) == {"inv-1", "inv-2", "inv-3"}
        assert "· 3 of 5  in" in _heading(app)
        for thread_id in ("inv-1", "inv-2", "inv-3"):
            assert thread_id in screen_text(app)
        assert "wx-1" not in screen_text(app) and "Oslo" not in screen_text(app)
        await _type(pilot, "s to")  # "Send the invoices to accounting" only
        await wait_for(pilot, lambda: _shown(app) == ["inv-3"], what="one thread")
        assert "· 1 of 5  in" in _heading(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="every thread again")
        assert "· 5  in" in _heading(app) and " of 5" not in _heading(app)
        assert isinstance(app.focused, ThreadTable)  # the arrows move the cursor again


async def test_the_filter_matches_ids_and_states_and_says_when_nothing_matches() -> None:
    app = make_app(fast_session(await _store()))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="all five threads")
        await pilot.press("slash")
        await _type(pilot, "WX-")
        await wait_for(pilot, lambda: sorted(_shown(app)) == ["wx-1", "wx-2"], what="the weather threads by id")
        app.threads_screen.query_one("#threads-filter").value = ""  # type: ignore[attr-defined]
        await _type(pilot, "mid-tool")  # the state of the thread whose call has no result
        await wait_for(pilot, lambda: _shown(app) == ["inv-2"], what="the crashed thread by its state")
        assert "crashed at point 3 (mid-tool)" in screen_text(app)
        await _type(pilot, "[bold]zz")
        await wait_for(pilot, lambda: not _shown(app), what="no match")
        await wait_for_text(pilot, "No thread's id, first prompt or state holds")
        assert "[bold]zz" in screen_text(app)  # what was typed, shown literally
        assert "· 0 of 5  in" in _heading(app)


async def test_enter_in_the_filter_opens_the_row_it_selected() -> None:
    app = make_app(fast_session(await _store()))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="all five threads")
        table = app.threads_screen.query_one(ThreadTable)
        await pilot.press("end")  # the oldest thread, inv-1, which the filter leaves out
        assert table.selected_thread_id == "inv-1"
        await pilot.press("slash")
        await _type(pilot, "rain")
        await wait_for(pilot, lambda: _shown(app) == ["wx-2"], what="the one thread about rain")
        assert table.selected_thread_id == "wx-2"  # the cursor went to the match
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.thread_id == "wx-2" and app.screen.loaded,
            what="wx-2 open",
        )
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="the picker again")
        assert _shown(app) == ["wx-2"]  # the filter is kept while a thread is open
        # The arrows move the cursor while the filter has the focus; Enter opens that row.
        await pilot.press("slash")
        app.threads_screen.query_one("#threads-filter").value = "invoice"  # type: ignore[attr-defined]
        await wait_for(pilot, lambda: len(_shown(app)) == 3, what="the invoice threads")
        first = table.selected_thread_id
        assert first == _shown(app)[0]
        await pilot.press("down")
        assert table.selected_thread_id == _shown(app)[1] != first
        await pilot.press("enter")
        second = _shown(app)[1]
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.thread_id == second and app.screen.loaded,
            what=f"{second} open",
        )


async def test_enter_with_no_row_shown_says_no_thread_is_selected() -> None:
    app = make_app(fast_session(await _store()))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="all five threads")
        await pilot.press("slash")
        await _type(pilot, "zzz")
        await wait_for(pilot, lambda: not _shown(app), what="no match")
        await pilot.press("enter")  # in the filter
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="every thread again")
        notices = [n.message for n in app._notifications]  # type: ignore[attr-defined]
        assert notices == ["No thread is selected, so there is nothing to open."]
        assert isinstance(app.screen, ThreadsScreen)


async def test_enter_on_an_empty_list_says_no_thread_is_selected() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(
            pilot, lambda: app.threads_screen.rows == [] and not app.threads_screen.loading_rows, what="the empty list"
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app._notifications) == 1, what="a notice")  # type: ignore[attr-defined]
        notices = [n.message for n in app._notifications]  # type: ignore[attr-defined]
        assert notices == ["No thread is selected, so there is nothing to open."]
        assert isinstance(app.screen, ThreadsScreen)
