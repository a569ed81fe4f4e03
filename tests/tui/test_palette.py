"""The command palette survives page keys pressed before its list is laid out; its screenshot is saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.command import CommandList, CommandPalette

from core.checkpoint.memory import MemoryCheckpointer
from tests.helpers.tui import fast_session, wait_for
from tui.app import make_app


async def test_page_keys_before_the_first_layout_of_the_palette_list_do_not_crash() -> None:
    # Textual 8.2's option list reads its line map before the first layout (KeyError: 0);
    # a newcomer hit it with ctrl+p then PageDown within 20 ms, and it ended the app. The
    # timing cannot be forced through key presses, so the list is put back in that state.
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.screen is app.threads_screen, what="the picker")
        await pilot.press("ctrl+p")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, CommandPalette) and app.screen.query_one(CommandList).option_count > 0,
            what="the palette's commands",
        )
        palette = app.screen
        commands = palette.query_one(CommandList)
        commands._index_to_line.clear()  # as it is before the list's first layout
        palette._action_command_list("page_down")
        palette._action_command_list("page_up")
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, CommandPalette)
        await pilot.press("down", "pagedown", "escape")  # laid out again: paging works as before
        await wait_for(pilot, lambda: app.screen is app.threads_screen, what="the palette closed")


async def test_a_screenshot_without_a_downloads_folder_lands_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Textual saves into ~/Downloads and only said "Failed to save screenshot" where there is none.
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    monkeypatch.chdir(work)
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test() as pilot:
        app.deliver_screenshot()
        await wait_for(pilot, lambda: any(work.glob("*.svg")), what="the screenshot file")
