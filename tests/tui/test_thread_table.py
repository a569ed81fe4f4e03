"""ThreadTable, the picker's virtualised table: only the lines on screen are drawn, and an
update that names its changed threads makes and redraws only those rows. Work is counted
(rows made, lines drawn), never timed."""

from __future__ import annotations

from dataclasses import replace

from textual.app import App, ComposeResult

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, user_text
from core.recovery import diagnose
from tests.helpers.tui import fast_session, screen_text, wait_for
from tui.app import make_app
from tui.messages import ThreadsLoaded
from tui.screens.thread import ThreadScreen
from tui.session import ThreadRow
from tui.widgets.thread_table import ThreadTable

DONE = diagnose([user_text("hi"), AssistantMessage(content=[TextContent(text="ok")], stop_reason="stop")])


def _rows(count: int) -> list[ThreadRow]:
    return [
        ThreadRow(f"t{i:05d}", DONE.label, 2, 1_700_000_000.0 - i, f"prompt number {i}", DONE) for i in range(count)
    ]


class _Host(App[None]):
    def __init__(self, rows: list[ThreadRow]) -> None:
        super().__init__()
        self.initial = rows
        self.chosen: list[str] = []

    def compose(self) -> ComposeResult:
        yield ThreadTable()

    def on_mount(self) -> None:
        table = self.query_one(ThreadTable)
        table.set_rows(self.initial)
        table.focus()

    def on_thread_table_selected(self, message: ThreadTable.Selected) -> None:
        self.chosen.append(message.thread_id)


async def _shown(pilot, table: ThreadTable) -> None:  # type: ignore[no-untyped-def]
    """Until the rows given are all made and shown (they are made a slice at a time)."""
    await wait_for(pilot, lambda: table.settled, what="the rows made")
    await pilot.pause()


async def _drawn_to_the_end(count: int) -> tuple[int, int]:
    """(lines drawn, rows made) from mounting ``count`` rows to the cursor on the last one."""
    app = _Host(_rows(count))
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(ThreadTable)
        await _shown(pilot, table)
        await pilot.press("end")
        await pilot.pause()
        assert table.cursor_row == count - 1 and table.selected_thread_id == f"t{count - 1:05d}"
        assert f"t{count - 1:05d}" in screen_text(app)
        assert "t00000" not in screen_text(app)  # scrolled away
        await pilot.press("enter")
        await pilot.pause()
        assert app.chosen == [f"t{count - 1:05d}"]
        return table.rendered, table.builds


async def test_ten_thousand_rows_scroll_to_the_end_with_the_lines_of_a_screen_drawn() -> None:
    small_lines, small_made = await _drawn_to_the_end(1_000)
    large_lines, large_made = await _drawn_to_the_end(10_000)
    assert (small_made, large_made) == (1_000, 10_000)  # each row made once, never again
    # Ten times the rows, the same screens drawn: what is drawn does not grow with the list.
    assert large_lines <= 2 * small_lines, (small_lines, large_lines)
    assert large_lines < 10 * 30, large_lines  # a few screens of 30 lines, not 10,000 lines


async def test_the_cursor_moves_by_key_and_click_and_a_click_on_it_opens_the_row() -> None:
    app = _Host(_rows(200))
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(ThreadTable)
        await _shown(pilot, table)
        await pilot.press("down", "down")
        assert table.selected_thread_id == "t00002"
        await pilot.press("pagedown")
        assert table.cursor_row == 2 + 29  # a screen of rows: 30 lines less the header
        await pilot.press("home")
        assert table.cursor_row == 0
        await pilot.click(ThreadTable, offset=(3, 5))  # line 5: the header, then rows 0-3 above it
        assert table.selected_thread_id == "t00004" and not app.chosen
        await pilot.click(ThreadTable, offset=(3, 5))
        await pilot.pause()
        assert app.chosen == ["t00004"]


async def test_an_update_naming_one_thread_makes_and_redraws_that_row_only() -> None:
    rows = _rows(1_000)
    app = _Host(rows)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(ThreadTable)
        await _shown(pilot, table)
        assert table.builds == 1_000
        fresh = list(rows)
        fresh[3] = replace(rows[3], message_count=3, first_prompt="prompt number 3, changed")
        fresh[500] = replace(rows[500], message_count=3)  # off screen
        drawn = table.rendered
        table.set_rows(fresh, changed=frozenset({"t00003", "t00500"}))
        await pilot.pause()
        assert table.builds == 1_002  # the two rows named, none of the 998 others
        assert table.rendered - drawn == 1  # the one changed line on screen
        assert "prompt number 3, changed" in screen_text(app)
        # The same rows again, told nothing changed: nothing is made or drawn.
        table.set_rows(list(fresh), changed=frozenset())
        await pilot.pause()
        assert table.builds == 1_002 and table.rendered - drawn == 1
        # Without names each row is compared: only the one that differs is made again.
        again = list(fresh)
        again[10] = replace(fresh[10], message_count=9)
        table.set_rows(again, changed=None)
        await _shown(pilot, table)
        assert table.builds == 1_003


async def test_a_state_that_grows_widens_its_column_and_the_prompt_gives_way() -> None:
    rows = [replace(row, first_prompt=f"{row.first_prompt} and then some") for row in _rows(50)]
    app = _Host(rows)
    # At 126 columns the long label leaves the prompt a little more than its minimum of 16.
    async with app.run_test(size=(126, 30)) as pilot:
        table = app.query_one(ThreadTable)
        await _shown(pilot, table)
        assert "prompt number 1 and then some" in screen_text(app)
        label = "running on a-very-long-host-name-for-a-build-box (pid 4242, beat 1 s ago)"
        wide = list(rows)
        wide[1] = replace(rows[1], state=label, elsewhere=True)
        table.set_rows(wide, changed={"t00001"})
        await pilot.pause()
        line = next(line for line in screen_text(app).splitlines() if "t00001" in line)
        assert label in line and "prompt number 1" in line and "…" in line  # cut to what is left
        assert "and then some" not in line
        table.set_rows(rows, changed={"t00001"})
        await pilot.pause()
        line = next(line for line in screen_text(app).splitlines() if "t00001" in line)
        assert "prompt number 1 and then some" in line and "running on" not in screen_text(app)


async def test_untrusted_text_in_a_row_is_shown_literally() -> None:
    hostile = replace(
        _rows(1)[0], thread_id="t-[bold]x[/]", first_prompt="\x1b[31mred\x1b[0m [link=x]click[/link]", state="completed"
    )
    app = _Host([hostile])
    async with app.run_test(size=(100, 10)) as pilot:
        await _shown(pilot, app.query_one(ThreadTable))
        text = screen_text(app)
        assert "t-[bold]x[/]" in text
        assert "␛[31mred␛[0m [link=x]click[/link]" in text


async def test_ten_thousand_threads_in_the_app_scroll_to_the_end_and_open_the_last() -> None:
    store = MemoryCheckpointer()
    for i in range(10_000):
        await store.append(f"t{i:05d}", [user_text(f"task {i}")])
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 10_000, timeout=120, what="10,000 rows")
        table = app.threads_screen.query_one(ThreadTable)
        await wait_for(pilot, lambda: table.settled and table.row_count == 10_000, what="10,000 rows shown")
        await pilot.press("end")
        last = table.selected_thread_id
        assert last is not None and table.cursor_row == 9_999
        await wait_for(pilot, lambda: last in screen_text(app), what="the last row drawn")
        assert "threads of" in screen_text(app) and "· 10000  in" in screen_text(app)
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.thread_id == last and app.screen.loaded,
            what="the last thread open",
        )


def test_a_newer_thread_list_that_replaces_a_queued_one_names_its_changes_too() -> None:
    rows = _rows(3)
    older = ThreadsLoaded(rows=rows, changed=frozenset({"t00000"}))
    newer = ThreadsLoaded(rows=rows, changed=frozenset({"t00001"}))
    assert older.can_replace(newer)
    assert newer.changed == {"t00000", "t00001"}
    every = ThreadsLoaded(rows=rows, changed=None)
    assert newer.can_replace(every) and every.changed is None
    after_all = ThreadsLoaded(rows=rows, changed=frozenset({"t00002"}))
    assert ThreadsLoaded(rows=rows, changed=None).can_replace(after_all) and after_all.changed is None
    assert not older.can_replace(ThreadsLoaded(error="The database is locked."))
