"""An answer stored and not yet applied (issue 11): a runner child asked for approval and,
unanswered within a second, ended waiting (``tests/helpers/asking_agent.py``); answered
from the app without resuming, the thread screen's status bar and the picker say so - it
is no longer "waiting for you", no longer first, and ``!`` no longer keeps it - and the
resume plan says resuming applies the answer.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, user_text
from core.recovery import ThreadState
from tests.helpers.supervise import ROOT, runner_argv
from tests.helpers.tui import fast_session, open_from_picker, screen_text, squeezed, wait_for
from tui.app import CubepiApp, make_app
from tui.screens.answer import AnswerModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.pending_request import PendingRequestPanel
from tui.widgets.status_bar import StatusBar
from tui.widgets.thread_table import ANSWERED_STYLE, STATE_STYLES, ThreadTable, state_style

TIMEOUT = 60.0
"""Seconds any wait may take (generous: a loaded 2-core machine)."""

QUESTION = "approve delete_file (call_del_1)?"
WAITING_EXIT = 3  # core.runner.EXIT_CODES["waiting"]


async def _run(db: Path, *options: str) -> int:
    """Run the asking agent's headless runner on thread "t-ask" with ``options``; its exit code."""
    argv = runner_argv(db, "t-ask", "--agent", "tests.helpers.asking_agent:make_agent", *options)
    child = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(child.communicate(), TIMEOUT)
    assert child.returncode is not None, err.decode()
    return child.returncode


async def _asked_and_ended_waiting(db: Path) -> None:
    """ "t-ask": a runner child's approval went unanswered, so its run ended waiting; then
    "t-done", a finished thread, is written later (the more recently active of the two)."""
    assert await _run(db, "Tidy /etc") == WAITING_EXIT
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        reply = AssistantMessage(content=[TextContent(text="Hello.")], stop_reason="end_turn")
        await store.append("t-done", [user_text("hi"), reply])
    finally:
        await store.close()


def _rows(app: CubepiApp) -> list[tuple[str, str]]:
    return [(row.thread_id, row.state) for row in app.threads_screen.query_one(ThreadTable).rows]


def _heading(app: CubepiApp) -> str:
    return screen_text(app).splitlines()[0]


def _status(app: CubepiApp) -> str:
    return app.screen.query_one(StatusBar).run_state


async def test_an_answer_not_yet_applied_reads_answered_in_the_status_bar_and_the_picker(shared_db: Path) -> None:
    await _asked_and_ended_waiting(shared_db)
    app = make_app(fast_session(path=shared_db))
    async with app.run_test(size=(130, 40)) as pilot:
        waiting = ("t-ask", f"waiting for you: {QUESTION}")
        await wait_for(pilot, lambda: _rows(app)[:1] == [waiting], timeout=TIMEOUT, what="t-ask waiting, first")
        assert "· 1 waiting for you" in _heading(app)
        await open_from_picker(pilot, "t-ask")
        await wait_for(pilot, lambda: _status(app) == f"waiting for an answer: {QUESTION}", timeout=TIMEOUT)

        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, AnswerModal), timeout=TIMEOUT, what="the dialog")
        await pilot.press("a")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), timeout=TIMEOUT, what="dialog closed")
        # Nobody runs the thread: the answer waits to be applied, and the screen says so.
        answered = f"answered — resume to apply: {QUESTION}"
        await wait_for(pilot, lambda: _status(app) == answered, timeout=TIMEOUT, what="the status bar answered")
        # The panel follows (its answer's text is read after the request): the same, in time.
        await wait_for(
            pilot,
            lambda: "Answered, not applied yet" in str(app.screen.query_one(PendingRequestPanel).render()),
            timeout=TIMEOUT,
            what="the panel answered",
        )
        assert "waiting for an answer" not in screen_text(app)
        await pilot.press("r")  # what resuming does, without resuming
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), timeout=TIMEOUT, what="the resume plan")
        assert squeezed("Answered: resuming applies the stored answer") in squeezed(screen_text(app))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), timeout=TIMEOUT, what="plan closed")

        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), timeout=TIMEOUT, what="the picker")
        # The most recently active first again: nothing waits for the person now.
        await wait_for(
            pilot,
            lambda: _rows(app) == [("t-done", "completed"), ("t-ask", answered)],
            timeout=TIMEOUT,
            what="the picker's row answered, not first",
        )
        assert "waiting for you" not in screen_text(app)
        [row] = [r for r in app.screen.rows if r.thread_id == "t-ask"]
        assert state_style(row) == ANSWERED_STYLE != STATE_STYLES[ThreadState.WAITING], "not coloured as waiting"
        await pilot.press("exclamation_mark")
        await wait_for(pilot, lambda: _rows(app) == [], timeout=TIMEOUT, what="nothing needing attention")
        await pilot.press("exclamation_mark")
        await wait_for(pilot, lambda: len(_rows(app)) == 2, timeout=TIMEOUT, what="every thread again")
    data = await _load(shared_db, "t-ask")
    assert data.pending_request is not None and data.pending_request.answered, "recorded, not applied"
    assert not any(m.role == "tool_result" for m in data.messages), "the tool has not run"


async def _load(db: Path, thread_id: str):  # type: ignore[no-untyped-def]
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        return await store.load(thread_id)
    finally:
        await store.close()
