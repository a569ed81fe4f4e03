"""Child process: the app itself (headless, driven by Pilot) runs a thread here, queues a
steer while a tool is held, and waits to be SIGKILLed once the steer is in the store.

Usage: ``python -m tests.helpers.app_steer_child DB_PATH`` (from the repository root).
Marks: ``thread:ID`` (the new thread), then ``queued`` once the app's Supervisor has put
the steer in its agent's queue for the next turn boundary (the bar shows it still
``pending``: it is delivered only when the loop takes it): the parent kills the whole app there.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.helpers.screens import running_tool
from tests.helpers.tui import fast_session, send_via_dialog, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen

STEER = "focus on europe"


def mark(name: str) -> None:
    print(f"MARK {name}", flush=True)


async def main(db_path: str) -> None:
    session = fast_session(path=Path(db_path), speed=3.0)
    tool = next(t for t in session.config.tools if t.name == "train_model")

    async def held(ctx, params):  # type: ignore[no-untyped-def]
        await asyncio.sleep(3600)  # killed before it ends

    tool.invoke = held  # type: ignore[method-assign]
    app = make_app(session)
    async with app.run_test(size=(110, 40)) as pilot:
        await send_via_dialog(pilot, "n", "build a report")
        await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        mark(f"thread:{screen.thread_id}")
        await send_via_dialog(pilot, "s", STEER)
        agent = session.agents[screen.thread_id]
        await wait_for(pilot, lambda: bool(agent.state.pending_steers), timeout=60, what="queued with the agent")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "pending", timeout=60, what="shown pending")
        mark("queued")
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
