"""However the app ends, a run it started is aborted and saved, never cut off mid-write.

Two ways of ending used to lose runs. Textual ends an app abruptly (``App.panic``, e.g.
when its input thread fails) and its shutdown cancels every screen's workers: a run
owned by a screen's worker was cut off mid-tool or mid-write. And a signal (terminal
closed, ``kill``) that arrived after the thread showed "running" but before the agent had
taken its lease found no agent running yet, so nothing was aborted and the shutdown cut
the run off before its prompt was saved (seen in CI: the closed terminal left no thread).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import pytest
from textual.message import Message

from core.messages import UserMessage
from core.recovery import ThreadState, diagnose
from tests.helpers.screens import running_tool
from tests.helpers.tui import Db, fast_session, fill_dialog, wait_for
from tui.app import CubepiApp, make_app
from tui.messages import OpenThread, RunStarted
from tui.screens.thread import ThreadScreen


def _panic(app: CubepiApp) -> None:
    app.panic("the terminal went away")


def _signal(app: CubepiApp) -> None:
    app._end_on_signal(signal.SIGTERM)  # what SIGHUP, SIGTERM and SIGINT call


async def _end_during_run(db: Db, end: Callable[[CubepiApp], None], *, moment: str) -> str:
    """Start a slow demo run, end the app with ``end`` at ``moment`` and wait until the app
    is gone; returns the thread id. ``moment``: "enter" (the prompt was sent, its thread
    not loaded yet), "run-start" (the run is announced, before the agent takes its lease)
    or "mid-tool"."""
    app: CubepiApp

    def hook(message: Message) -> None:
        if moment == "run-start" and isinstance(message, RunStarted):
            end(app)  # at once
        elif moment == "enter" and isinstance(message, OpenThread):
            app.call_later(end, app)  # once the app has opened the thread's screen

    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40), message_hook=hook) as pilot:
        await fill_dialog(pilot, "n", "slow job")
        # Not awaited: it waits until the screen is idle, which a shutdown begun by the
        # hook meanwhile never lets happen.
        enter = asyncio.create_task(pilot.press("enter"))
        async with asyncio.timeout(10):
            while not isinstance(app.screen, ThreadScreen):
                await asyncio.sleep(0.01)
        screen = app.screen
        if moment == "mid-tool":
            await enter
            await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
            end(app)
        # pilot.pause needs a live app: wait for the shutdown with the plain loop.
        async with asyncio.timeout(30):
            while app.is_running:
                await asyncio.sleep(0.05)
        enter.cancel()
    return screen.thread_id


@pytest.mark.parametrize("moment", ["mid-tool", "run-start", "enter"])
@pytest.mark.parametrize("end", [_panic, _signal], ids=["panic", "signal"])
async def test_a_run_is_aborted_and_saved_however_the_app_ends(
    db: Db, end: Callable[[CubepiApp], None], moment: str
) -> None:
    thread_id = await _end_during_run(db, end, moment=moment)
    data = await db.load(thread_id)
    assert data is not None, "the prompt was lost: the thread was never saved"
    assert isinstance(data.messages[0], UserMessage) and data.messages[0].text == "slow job"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.ABORTED
    (summary,) = await db.list_threads()
    assert summary.lease is None, "the run's lease was left behind"


async def test_quitting_right_after_sending_a_prompt_asks_first_and_saves_it(db: Db) -> None:
    """``q`` pressed before the run began used to quit at once (no agent was running yet),
    status 0, and the prompt was never saved."""
    from tui.screens.modals import ConfirmModal

    app: CubepiApp

    def hook(message: Message) -> None:
        if isinstance(message, OpenThread):
            app.call_later(app.run_action, "quit")

    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40), message_hook=hook) as pilot:
        await fill_dialog(pilot, "n", "slow job")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the quit question")
        await pilot.press("y")
        async with asyncio.timeout(30):
            while app.is_running:
                await asyncio.sleep(0.05)
    assert app.return_code == 0
    (summary,) = await db.list_threads()
    data = await db.load(summary.thread_id)
    assert data is not None and data.messages[0].text == "slow job"  # type: ignore[union-attr]
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.ABORTED
