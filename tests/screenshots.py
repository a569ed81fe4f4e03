"""Regenerate the README screenshots: ``python -m tests.screenshots`` (not collected by pytest).

Drives the real app (``make_app``) headlessly on a copy of cubeloop's crash-point
database with the demo agent, and saves:

* ``screenshots/picker.svg``: the thread list, one thread "running here";
* ``screenshots/thread.svg``: a live demo run, tools reporting progress;
* ``screenshots/crash.svg``: the crash banner of a thread that crashed mid-tool.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from textual.widgets import DataTable, Input

from tui.app import CubepiApp, make_app
from tui.cli import build_session
from tui.screens.modals import ConfirmModal, TextInputModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.tool_call import ToolCallView

FIXTURE = Path("/work/shared/fixtures/cubeloop_crashpoints.sqlite")
OUT = Path(__file__).resolve().parent.parent / "screenshots"
SIZE = (120, 36)


async def _until(pilot, predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"screenshot script stuck waiting for {predicate}")
        await pilot.pause(0.05)


async def _open(pilot, app: CubepiApp, thread_id: str) -> None:  # type: ignore[no-untyped-def]
    await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen) and bool(app.screen.rows))
    table = app.screen.query_one(DataTable)
    table.move_cursor(row=table.get_row_index(thread_id))
    await pilot.press("enter")
    await _until(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded)


async def main() -> None:
    """Write the three SVGs into ``screenshots/``."""
    OUT.mkdir(exist_ok=True)
    # A fixed place, so the path shown in the picker's title is the same every time.
    work = Path(tempfile.gettempdir()) / "cubepi-tui-screenshots"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    db = work / "threads.sqlite"
    shutil.copyfile(FIXTURE, db)
    try:
        app = make_app(build_session(db, demo=True, demo_speed=1.0))
        async with app.run_test(size=SIZE) as pilot:
            await _open(pilot, app, "crash-mid-tool")
            await pilot.pause(0.3)
            app.save_screenshot("crash.svg", str(OUT))
            await pilot.press("q")

            # A new thread: the first write asks to upgrade cubeloop's file.
            await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen))
            await pilot.press("n")
            await _until(pilot, lambda: isinstance(app.screen, TextInputModal))
            app.screen.query_one(Input).value = "Forecast next quarter's sales by region"
            await pilot.press("enter")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmModal))
            await pilot.press("y")
            await _until(
                pilot,
                lambda: isinstance(app.screen, ThreadScreen)
                and sum(v.status == "running" and (v.progress or 0) > 0.3 for v in app.screen.query(ToolCallView)) >= 2,
            )
            app.save_screenshot("thread.svg", str(OUT))
            await pilot.press("q")
            await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen) and any(r.running for r in app.screen.rows))
            app.screen.query_one(DataTable).move_cursor(row=0)  # the thread running here
            await pilot.pause(0.3)
            app.save_screenshot("picker.svg", str(OUT))
            await app.session.stop_runs()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote picker.svg, thread.svg, crash.svg to {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
