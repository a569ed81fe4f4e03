"""Layout details: the help's hanging indents, the picker's first-prompt column."""

from __future__ import annotations

import re
import time

from core.checkpoint.base import Lease, ThreadSummary
from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.modals import HelpScreen
from tui.screens.threads import ThreadsScreen


def _column_of(line: str, words: str) -> int:
    return line.index(words)


async def test_a_wrapped_help_entry_keeps_its_indent() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    # 80 columns, so entries wrap; tall enough for the whole help, so its crash points show.
    async with app.run_test(size=(80, 90)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await wait_for_text(pilot, "3  mid-tool")
        lines = screen_text(app).splitlines()
        start = next(i for i, line in enumerate(lines) if "3  mid-tool" in line)
        column = _column_of(lines[start], "a tool call")
        entry = []
        for line in lines[start + 1 :]:
            inner = re.sub(r"[█▀▄▌▐▅▃▂▆▇]", " ", line)
            if not inner.strip():
                break
            entry.append(inner)
        assert len(entry) >= 2, lines[start : start + 6]  # the entry wraps at this width
        for inner in entry:
            assert len(inner) - len(inner.lstrip()) == column, (column, inner)


PROMPT = "Forecast the revenue of every region for Q3"


async def test_the_first_prompt_takes_the_width_a_run_elsewhere_no_longer_needs() -> None:
    lease = Lease(
        "multi-tool-partial-parallel-injected",
        "holder",
        4242,
        "build-box",
        "r9",
        time.time(),
        time.time(),
        time.time() + 600,
    )
    ids = ("multi-tool-partial-parallel-injected", "nightly-report")

    class Store(MemoryCheckpointer):
        leased = True

        async def list_threads(self) -> list[ThreadSummary]:
            now = time.time()
            return [
                ThreadSummary(
                    ids[0],
                    2,
                    now,
                    tail=(user_text("hi"), AssistantMessage(content=[TextContent(text="ok")])),
                    first_prompt="hi",
                    lease=lease if self.leased else None,
                ),
                ThreadSummary(
                    ids[1],
                    2,
                    now - 60,
                    tail=(user_text(PROMPT), AssistantMessage(content=[TextContent(text="ok")])),
                    first_prompt=PROMPT,
                ),
            ]

    store = Store()
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "running on build-box (pid 4242")
        picker = app.screen
        assert isinstance(picker, ThreadsScreen)
        assert PROMPT not in screen_text(app)  # no room while the long state label is shown
        store.leased = False
        picker.reload()
        await wait_for(pilot, lambda: "running on" not in screen_text(app), what="the run ended")
        await wait_for_text(pilot, PROMPT)  # 43 characters fit in the free width at 120 columns
