"""Child process that writes one thread with this project's Agent on our SQLite store, and is
SIGKILLed by its parent at a known mark (see ``tests/helpers/children.py``).

Usage: ``python -m tests.helpers.our_child DB_PATH SCENARIO THREAD_ID`` (from the repository root)

Scenarios: ``mid_tool`` - the model calls ``read_file`` (idempotent) and ``slow_step`` (not
idempotent), in parallel; ``slow_step`` prints ``MARK tool_started:slow_step`` once
``read_file``'s body has run, and both wait to be killed, so neither result is saved (a
finished result is saved at once: were ``read_file`` to return, the kill would race its save).
"""

from __future__ import annotations

import asyncio
import sys

from core.agent import Agent
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
from core.tools import AgentTool, ToolContext, tool

PROMPT = "Build the app, please."


def mark(name: str) -> None:
    print(f"MARK {name}", flush=True)


def our_tools(read_done: asyncio.Event | None = None) -> list[AgentTool]:
    """``read_file`` (idempotent) and ``slow_step`` (not). With ``read_done`` (the child's
    run): ``read_file`` sets it and sleeps for an hour; ``slow_step`` waits for it, marks, and
    sleeps for an hour. Without: both return at once."""

    @tool(idempotent=True)
    async def read_file(path: str, ctx: ToolContext) -> str:
        """Read a file."""
        if read_done is not None:
            read_done.set()
            await asyncio.sleep(3600)
        return f"contents of {path}"

    @tool
    async def slow_step(label: str, ctx: ToolContext) -> str:
        """A long step, not safe to repeat."""
        if read_done is not None:
            await read_done.wait()
            mark("tool_started:slow_step")
            await asyncio.sleep(3600)
        return f"{label} done"

    return [read_file, slow_step]


async def main(db_path: str, scenario: str, thread_id: str) -> None:
    if scenario != "mid_tool":
        raise SystemExit(f"unknown scenario {scenario!r}")
    provider = FauxProvider(
        [
            faux_reply(
                faux_text("Reading, then building."),
                faux_tool_call("read_file", {"path": "src/app.py"}, id="call_read_1"),
                faux_tool_call("slow_step", {"label": "app"}, id="call_slow_1"),
            ),
            faux_reply(faux_text("Done.")),
        ]
    )
    store = await SQLiteCheckpointer.open(db_path, create=True)
    agent = Agent(provider, store, thread_id, tools=our_tools(asyncio.Event()))
    await agent.prompt(PROMPT)
    mark("done")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
