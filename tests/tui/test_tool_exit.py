"""A tool that calls ``sys.exit(0)`` fails its own call: the app stays up and shows the
error, and the thread is saved completed (``core.tool_execution.call_tool``)."""

from __future__ import annotations

import sys

from core.messages import ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ThreadState, diagnose
from core.tools import tool
from tests.helpers.tui import Db, fast_session, screen_text, send_via_dialog, squeezed, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen


@tool
async def leave() -> str:
    """Leave the program, as a script would."""
    sys.exit(0)


async def test_a_tool_calling_sys_exit_leaves_the_app_running_with_its_error_shown(db: Db) -> None:
    # Before: the SystemExit left the event loop, the app ended (status 0, screen cleared)
    # and the thread read "crashed at point 3 (mid-tool)".
    session = fast_session(
        path=db.path,
        tools=[leave],
        make_provider=lambda: FauxProvider([faux_reply(faux_tool_call("leave", {}, id="q1")), "Carrying on."]),
    )
    app = make_app(session)
    async with app.run_test(size=(110, 40)) as pilot:
        await send_via_dialog(pilot, "n", "Leave.")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="thread open")
        await wait_for_text(pilot, "Carrying on.")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await wait_for(pilot, lambda: not screen.running, what="run ended")
        assert squeezed("The tool called sys.exit(0)") in squeezed(screen_text(app))
        assert app.is_running
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert data is not None
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert [r.is_error for r in results] == [True]
    assert results[0].text.startswith("The tool called sys.exit(0); a tool cannot end the program")
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
