"""Questions about the app's screens that several Textual test modules ask."""

from __future__ import annotations

from tui.app import CubepiApp
from tui.screens.thread import ThreadScreen
from tui.widgets.tool_call import ToolCallView


def running_tool(app: CubepiApp) -> bool:
    """Whether the thread screen on top shows a tool call running."""
    return isinstance(app.screen, ThreadScreen) and any(v.status == "running" for v in app.screen.query(ToolCallView))
