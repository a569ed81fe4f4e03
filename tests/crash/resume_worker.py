"""A long-lived resumer for the two-resumers test: many trials over one pipe.

Protocol (JSON lines on stdin/stdout). ``{"trial": n, "store": location, "thread": id,
"go": fifo, "runs": file}``: open the store at ``location`` (see
:mod:`tests.helpers.store_locations`; kept open across trials), build an agent, open the
FIFO ``go`` for reading and answer ``{"prepared": n}``; then wait until every writer of the FIFO
has closed it (the parent holds the only one, so closing it releases all waiting workers
at once), call ``Agent.resume()`` and answer ``{"trial": n, "outcome": ..., "error": class
name or null, "message": ...}``. Each run of a tool body appends ``trial pid tool call_id``
to ``runs``. EOF on stdin ends the worker.

Usage: python -m tests.crash.resume_worker
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
from typing import Any

from core.agent import Agent
from core.checkpoint.base import Checkpointer
from core.providers.faux import FauxProvider, faux_reply
from core.tools import AgentTool, ToolContext, tool
from tests.helpers.store_locations import open_location

FINAL = "Recovered: every interrupted step is settled and accounted for."


def tools(trial: int, runs: str) -> list[AgentTool]:
    def ran(name: str, ctx: ToolContext) -> None:
        fd = os.open(runs, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{trial} {os.getpid()} {name} {ctx.tool_call_id}\n".encode())
        finally:
            os.close(fd)

    @tool(idempotent=True)
    async def fetch(url: str, ctx: ToolContext) -> str:
        """Fetch a page (safe to repeat)."""
        ran("fetch", ctx)
        await asyncio.sleep(0.06)
        return f"fetched {url}"

    @tool
    async def deploy(target: str, ctx: ToolContext) -> str:
        """Deploy (not safe to repeat)."""
        ran("deploy", ctx)
        await asyncio.sleep(0.06)
        return f"deployed {target}"

    return [fetch, deploy]


def send(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    stores: dict[str, Checkpointer] = {}
    send({"ready": os.getpid()})
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            req = json.loads(line)
            store = stores.get(req["store"]) or await open_location(req["store"], create=False)
            stores[req["store"]] = store
            # ~0.1 s of streaming: the winner still holds the lease when the loser asks for it.
            provider = FauxProvider(fallback=lambda _request: faux_reply(FINAL), delay=0.01)
            agent = Agent(provider, store, req["thread"], tools=tools(req["trial"], req["runs"]))
            go = os.open(req["go"], os.O_RDONLY | os.O_NONBLOCK)
            try:
                send({"prepared": req["trial"]})
                ready, _, _ = select.select([go], [], [], 60)
                assert ready and os.read(go, 1) == b"", "the start signal never came"
            finally:
                os.close(go)
            outcome, error, message = None, None, ""
            try:
                outcome = await agent.resume()
                message = agent.state.error or ""
            except Exception as exc:
                error, message = type(exc).__name__, str(exc)
            send({"trial": req["trial"], "outcome": outcome, "error": error, "message": message})
    finally:
        for store in stores.values():
            await store.close()


if __name__ == "__main__":
    asyncio.run(main())
