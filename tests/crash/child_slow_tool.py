"""Child process for the SIGKILL test: runs one agent whose tool never finishes on its own.

Usage: python -m tests.crash.child_slow_tool STORE_LOCATION THREAD_ID MARKER_PATH
(a location as :mod:`tests.helpers.store_locations` reads it; the store is created if missing).
The tool writes MARKER_PATH once it has started, then sleeps until the process is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from core.agent import Agent
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
from core.tools import ToolContext, tool
from tests.helpers.store_locations import open_location


async def main(location: str, thread_id: str, marker: str) -> None:
    @tool
    async def slow_step(label: str, ctx: ToolContext) -> str:
        """Pretend to build something for a long time."""
        ctx.report(progress=0.1, text=f"building {label}")
        Path(marker).write_text(ctx.tool_call_id)
        await asyncio.sleep(3600)
        return "built"

    provider = FauxProvider(
        [
            faux_reply(faux_text("Building now."), faux_tool_call("slow_step", {"label": "app"}, id="call_slow_1")),
            faux_reply(faux_text("Done.")),
        ]
    )
    store = await open_location(location, create=True)
    agent = Agent(provider, store, thread_id, tools=[slow_step])
    await agent.prompt("Build the app, please.")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
