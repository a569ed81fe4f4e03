"""Regenerate the README screenshots: ``python -m tests.screenshots`` (not collected by pytest).

Drives the real app (``make_app``) headlessly on cubeloop's crash-point database (written
anew by the real cubeloop, see ``tests/helpers/cubeloop_threads.py``) with the demo agent, plus a headless runner (``cubepi-tui run --demo``) in a
child process, and saves:

* ``screenshots/crash.svg``: the crash banner of a cubeloop thread that crashed mid-tool;
* ``screenshots/waiting.svg``: a cubeloop thread whose run asked a human question (HITL);
* ``screenshots/thread.svg``: a live demo run in the app, tools reporting progress;
* ``screenshots/picker.svg``: the thread list, one thread "running here", one running on
  host ``build-7`` (the runner's ``CUBEPI_HOST_ID``), one crashed on ``build-3``;
* ``screenshots/elsewhere.svg``: the thread the child process runs, followed live, with a
  steer sent to it (the commands bar shows how far it got);
* ``screenshots/resume.svg``: the resume confirmation of a thread killed with three tool
  calls in flight (one re-run, one reused, one to choose for);
* ``screenshots/owners.svg``: at 80x24, the thread list of owner ``alice`` ("threads of
  alice · 3") on a store that also holds bob's and unowned threads;
* ``screenshots/changes.svg``: at 80x24, the dialog a new prompt on that thread shows
  (what changed; ``a`` accepts, Escape cancels);
* ``screenshots/owner-line.svg``: at 80x24, one of alice's threads whose workflow version
  changed from 1 to 2 and was accepted: the owner line with the override recorded.

cubeloop's threads record no owner, so the first six are taken in the unowned scope
(``--unowned``), as a user opening a cubeloop database sees them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from textual.widgets import Input

from core.agent import Agent
from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.demo import SYSTEM_PROMPT, demo_provider, demo_tools
from core.leases import HOST_ID_ENV
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.owners import UNOWNED
from core.recovery import JOURNALED_KEY
from core.tool_execution import call_job_key, result_to_json
from core.tools import AgentToolResult, tool
from tests.helpers.cubeloop_threads import make_crashpoint_db, run_cubeloop
from tui.app import CubepiApp, make_app
from tui.cli import build_session
from tui.screens.modals import ChangesModal, ConfirmModal, TextInputModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.thread_table import ThreadTable
from tui.widgets.tool_call import ToolCallView

OUT = Path(__file__).resolve().parent.parent / "screenshots"
ROOT = Path(__file__).resolve().parent.parent
SIZE = (120, 36)
SMALL = (80, 24)


async def _until(pilot, predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"screenshot script stuck waiting for {predicate}")
        await pilot.pause(0.05)


async def _open(pilot, app: CubepiApp, thread_id: str) -> None:  # type: ignore[no-untyped-def]
    await _until(
        pilot, lambda: isinstance(app.screen, ThreadsScreen) and thread_id in {r.thread_id for r in app.screen.rows}
    )
    table = app.screen.query_one(ThreadTable)
    table.move_cursor(row=table.get_row_index(thread_id))
    await pilot.press("enter")
    await _until(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded)


@tool
async def notify_team(message: str) -> str:
    """Post a message to the team channel (not idempotent: each call posts again)."""
    return f"Posted {message!r} to the team."


async def _write_killed_run(db: Path) -> None:
    """A thread whose runner was killed with three calls in flight (as our agent writes it)."""
    tools = {t.name: t for t in demo_tools()}
    fetch = ToolCall(
        id="call_fetch", name="fetch_dataset", arguments={"name": "demo-sales", "rows": 50_000, "request": 1}
    )
    train = ToolCall(id="call_train", name="train_model", arguments={"model": "baseline", "epochs": 5, "request": 1})
    post = ToolCall(id="call_post", name="notify_team", arguments={"message": "baseline trained"})
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    try:
        await store.claim_run("killed-mid-tool", "run-1")
        reply = AssistantMessage(
            content=[
                TextContent(text="Fetching and training in parallel; I will tell the team when done."),
                fetch,
                train,
                post,
            ],
            stop_reason="tool_use",
            run_id="run-1",
            model_id="demo",
            metadata={JOURNALED_KEY: True},
        )
        await store.append("killed-mid-tool", [user_text("Train a baseline and tell the team", run_id="run-1"), reply])
        for call in (fetch, train):
            key = call_job_key(tools[call.name], call)
            assert key is not None
            await store.record_tool_event(
                "killed-mid-tool",
                call.id,
                "start",
                tool_name=call.name,
                run_id="run-1",
                job_key=key,
                at=time.time() - 120,
            )
            await store.job_begin("killed-mid-tool", key, call.id)
        train_key = call_job_key(tools["train_model"], train)
        assert train_key is not None
        result = AgentToolResult("Trained 'baseline' for 5 epochs; validation accuracy 0.87, loss 0.31.")
        await store.job_finish("killed-mid-tool", train_key, "done", result_to_json(result))
    finally:
        await store.close()


async def _write_crashed_elsewhere(db: Path) -> None:
    """A thread whose runner on host ``build-3`` stopped mid-tool 40 s ago (its lease expired)."""
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    try:
        await store.claim_run("weekly-digest", "run-w1")
        call = ToolCall(id="call_fetch", name="fetch_dataset", arguments={"name": "tickets", "rows": 900})
        reply = AssistantMessage(
            content=[TextContent(text="Fetching this week's tickets."), call],
            stop_reason="tool_use",
            run_id="run-w1",
            model_id="demo",
        )
        await store.append("weekly-digest", [user_text("Summarise this week's tickets", run_id="run-w1"), reply])
        now = time.time()
        lease = Lease("weekly-digest", uuid.uuid4().hex, 31337, "build-3", "run-w1", now - 300, now - 55, now - 40)
        await store.acquire_lease(lease, is_stale=lambda _current: True)
    finally:
        await store.close()


async def main() -> None:
    """Write the nine SVGs into ``screenshots/``."""
    OUT.mkdir(exist_ok=True)
    # A fixed place, so the path shown in the picker's title is the same every time.
    work = Path(tempfile.gettempdir()) / "cubepi-tui-screenshots"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    db = work / "threads.sqlite"
    make_crashpoint_db(db)  # written by the real cubeloop, as the tests do
    run_cubeloop(db, "ask_and_detach", "which-file", arg="run-ask-1")
    runner: subprocess.Popen[bytes] | None = None
    try:
        session = build_session(db, demo=True, demo_speed=1.0, owner=UNOWNED)
        session.tools = [*session.tools, notify_team]
        app = make_app(session)
        async with app.run_test(size=SIZE) as pilot:
            await _open(pilot, app, "crash-mid-tool")
            await pilot.pause(0.3)
            app.save_screenshot("crash.svg", str(OUT))
            await pilot.press("q")

            await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen))
            await _open(pilot, app, "which-file")
            await pilot.pause(0.3)
            app.save_screenshot("waiting.svg", str(OUT))
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
                lambda: (
                    isinstance(app.screen, ThreadScreen)
                    and sum(v.status == "running" and (v.progress or 0) > 0.3 for v in app.screen.query(ToolCallView))
                    >= 2
                ),
            )
            app.save_screenshot("thread.svg", str(OUT))
            await pilot.press("q")

            # A headless runner in another process ("on host build-7"), on the same (now upgraded) file.
            await _write_crashed_elsewhere(db)
            runner = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tui.cli",
                    "run",
                    "--db",
                    str(db),
                    "--thread",
                    "nightly-report",
                    "--unowned",
                    "--demo",
                    "--speed",
                    "0.5",
                    "Write the nightly sales report",
                ],
                cwd=ROOT,
                env={**os.environ, HOST_ID_ENV: "build-7"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await _until(
                pilot,
                lambda: (
                    isinstance(app.screen, ThreadsScreen)
                    and any(r.elsewhere for r in app.screen.rows)
                    and any(r.running for r in app.screen.rows)
                ),
            )
            app.screen.query_one(ThreadTable).move_cursor(row=0)
            await pilot.pause(0.3)
            app.save_screenshot("picker.svg", str(OUT))

            await _open(pilot, app, "nightly-report")
            screen = app.screen
            assert isinstance(screen, ThreadScreen)
            await _until(
                pilot,
                lambda: any(v.status == "running" and (v.progress or 0) > 0.2 for v in screen.query(ToolCallView)),
                timeout=60,
            )
            await pilot.press("s")
            await _until(pilot, lambda: isinstance(app.screen, TextInputModal))
            app.screen.query_one(Input).value = "Compare with the same night last year"
            await pilot.press("enter")
            await _until(pilot, lambda: screen.commands_bar.status_of(1) == "delivered")
            await pilot.pause(0.5)
            app.save_screenshot("elsewhere.svg", str(OUT))
            await pilot.press("a")  # abort the other process's run
            await _until(pilot, lambda: runner is not None and runner.poll() is not None, timeout=30)
            await pilot.press("q")

            await _write_killed_run(db)
            await _open(pilot, app, "killed-mid-tool")
            await pilot.press("r")
            await _until(pilot, lambda: isinstance(app.screen, ResumeModal))
            await pilot.pause(0.3)
            app.save_screenshot("resume.svg", str(OUT))
            await pilot.press("n")
            await app.session.stop_runs()
        await _owners(work / "owners.sqlite")
    finally:
        if runner is not None and runner.poll() is None:
            os.kill(runner.pid, signal.SIGKILL)
            runner.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(
        "wrote crash.svg, waiting.svg, thread.svg, picker.svg, elsewhere.svg, resume.svg, owners.svg, "
        f"changes.svg, owner-line.svg to {OUT}"
    )


async def _demo_thread(db: Path, owner: str, thread_id: str, prompt: str, workflow: str | None = None) -> None:
    """One demo run of ``thread_id`` by ``owner`` (at speed 50), as the app would write it."""
    store = await SQLiteCheckpointer.open(db, create=True, owner=owner)
    try:
        agent = Agent(
            demo_provider(speed=50),
            store,
            thread_id,
            tools=demo_tools(speed=50),
            system_prompt=SYSTEM_PROMPT,
            workflow=workflow,
        )
        assert await agent.prompt(prompt) == "completed", agent.state.error
    finally:
        await store.close()


async def _owners(db: Path) -> None:
    """owners.svg and owner-line.svg: alice's view of a store shared with bob and old threads."""
    await _demo_thread(db, "alice", "sales-forecast", "Forecast next quarter's sales by region", "2")
    await _demo_thread(db, "bob", "bobs-budget", "Draft next year's budget", "2")
    await _demo_thread(db, UNOWNED, "old-notes", "Summarise the meeting notes")
    await _demo_thread(db, "alice", "churn-report", "Why did churn rise in March?", "2")
    await _demo_thread(db, "alice", "quarterly-review", "Review the quarter's numbers", "1")
    app = make_app(build_session(db, demo=True, demo_speed=50, owner="alice", workflow="2"))
    async with app.run_test(size=SMALL) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen) and len(app.screen.rows) == 3)
        await pilot.pause(0.3)
        app.save_screenshot("owners.svg", str(OUT))
        # Workflow 1 -> 2: the new prompt asks, a accepts and records the override.
        await _open(pilot, app, "quarterly-review")
        await pilot.press("n")
        await _until(pilot, lambda: isinstance(app.screen, TextInputModal))
        app.screen.query_one(Input).value = "And compared with last year?"
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, ChangesModal))
        await pilot.pause(0.2)
        app.save_screenshot("changes.svg", str(OUT))
        await pilot.press("a")
        await _until(
            pilot,
            lambda: (
                isinstance(app.screen, ThreadScreen)
                and not app.screen.running
                and app.screen.facts is not None
                and bool(app.screen.facts.meta and app.screen.facts.meta.overrides)
            ),
            timeout=60,
        )
        await pilot.pause(0.3)
        app.save_screenshot("owner-line.svg", str(OUT))
        await app.session.stop_runs()


if __name__ == "__main__":
    asyncio.run(main())
