"""Layout details: the help's hanging indents, the picker's first-prompt column."""

from __future__ import annotations

import re

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import user_text
from tests.tui.conftest import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.modals import HelpScreen
from tui.screens.threads import ThreadsScreen


def _column_of(line: str, words: str) -> int:
    return line.index(words)


async def test_a_wrapped_help_entry_keeps_its_indent() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(80, 60)) as pilot:
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
