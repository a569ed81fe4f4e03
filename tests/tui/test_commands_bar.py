"""The commands bar keeps one line per command at any width: the quoted text gives way
first, so a queued steer's statuses and note stay readable on an 80-column terminal."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from core.checkpoint.base import Command
from tests.helpers.tui import screen_text
from tui.widgets.commands import CommandsBar

LONG = "compare every region with the same night last year and flag anything above ten percent"


def _command(seq: int, status: str, text: str = LONG, note: str = "", kind: str = "steer") -> Command:
    return Command(seq, "t", kind, text, status, 0.0, 0.0, note)  # type: ignore[arg-type]


class BarApp(App[None]):
    def compose(self) -> ComposeResult:
        yield CommandsBar(id="bar")


@pytest.mark.parametrize("width", [40, 80, 200])
async def test_each_command_is_one_line_with_its_statuses_and_note_at_any_width(width: int) -> None:
    app = BarApp()
    async with app.run_test(size=(width, 12)) as pilot:
        bar = app.query_one(CommandsBar)
        bar.track(_command(1, "pending"))
        bar.track(_command(1, "delivered"))
        bar.track(_command(1, "applied", note="delivered at turn 2"))
        bar.track(_command(2, "pending", text="short"))
        bar.track(_command(3, "refused", text="", kind="abort", note="sent after the run ended"))
        await pilot.pause()
        lines = [line.rstrip() for line in screen_text(app).splitlines() if "#" in line]
        assert len(lines) == 3, lines
        assert all(len(line) <= width for line in lines)
        first, second, third = lines
        if width >= 80:
            assert first.endswith(": pending → delivered → applied (delivered at turn 2)"), first
            assert second.endswith("steer #2 “short”: pending"), second
            assert third.endswith("abort #3: refused (sent after the run ended)"), third
        if width == 80:
            assert "“compare" in first and "…”" in first, "the text is cut, not the statuses"
        if width == 200:
            assert f"“{LONG[:39]}…”" in first, "at most 40 characters of it"


WIDE = "比較每個地區與去年同一晚的數據並標記任何超過百分之十的異常情況請務必仔細檢查所有"


@pytest.mark.parametrize(
    ("width", "text", "note"),
    [
        (40, LONG, "delivered at turn 2"),  # the statuses alone are wider than the bar
        (80, WIDE, "delivered at turn 2"),  # wide characters take two cells each
        (80, "short", "a note\nover two lines"),  # a stored note is untrusted text
    ],
)
async def test_no_command_wraps_onto_a_second_line(width: int, text: str, note: str) -> None:
    app = BarApp()
    async with app.run_test(size=(width, 12)) as pilot:
        bar = app.query_one(CommandsBar)
        bar.track(_command(1, "pending", text=text))
        bar.track(_command(1, "delivered", text=text))
        bar.track(_command(1, "applied", text=text, note=note))
        bar.track(_command(2, "refused", text="", kind="abort", note="sent after the run ended"))
        await pilot.pause()
        lines = [line.rstrip() for line in screen_text(app).splitlines() if line.strip()]
        assert len(lines) == 2, lines
        assert "#1" in lines[0] and "#2" in lines[1], lines
        if width >= 80:
            assert lines[0].endswith(f"applied ({' '.join(note.split())})"), "the text is cut, not the statuses"
