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
from typing import Callable

import pytest
from textual.message import Message

from core.messages import UserMessage
from core.recovery import ThreadState, diagnose
from tests.tui.conftest import Db, fast_session, type_text, wait_for
from tests.tui.test_runs import _running_tool
from tui.app import CubepiApp, make_app
from tui.messages import RunStarted
from tui.screens.modals import TextInputModal
from tui.screens.thread import ThreadScreen


def _panic(app: CubepiApp) -> None:
    app.panic("the terminal went away")


def _signal(app: CubepiApp) -> None:
    app._end_on_signal(signal.SIGTERM)  # what SIGHUP, SIGTERM and SIGINT call


async def _end_during_run(db: Db, end: Callable[[CubepiApp], None], *, at_run_start: bool) -> str:
    """Start a slow demo run, end the app with ``end`` (as the run is announced, or once a
    tool runs) and wait until the app is gone; returns the thread id."""
    app: CubepiApp

    def hook(message: Message) -> None:
        if at_run_start and isinstance(message, RunStarted):
            end(app)  # at once, before the agent has taken its lease

    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40), message_hook=hook) as pilot:
        await wait_for(pilot, lambda: app.session.store is not None, what="store open")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="prompt modal")
        await type_text(pilot, "slow job")
        # Not awaited: it waits until the screen is idle, which a shutdown begun by the
        # hook meanwhile never lets happen.
        enter = asyncio.create_task(pilot.press("enter"))
        async with asyncio.timeout(10):
            while not isinstance(app.screen, ThreadScreen):
                await asyncio.sleep(0.01)
        screen = app.screen
        if not at_run_start:
            await enter
            await wait_for(pilot, lambda: _running_tool(app), timeout=60, what="a tool running")
            end(app)
        # pilot.pause needs a live app: wait for the shutdown with the plain loop.
        async with asyncio.timeout(30):
            while app.is_running:
                await asyncio.sleep(0.05)
        enter.cancel()
    return screen.thread_id


@pytest.mark.parametrize("at_run_start", [False, True], ids=["mid-tool", "as-the-run-starts"])
@pytest.mark.parametrize("end", [_panic, _signal], ids=["panic", "signal"])
async def test_a_run_is_aborted_and_saved_however_the_app_ends(
    db: Db, end: Callable[[CubepiApp], None], at_run_start: bool
) -> None:
    thread_id = await _end_during_run(db, end, at_run_start=at_run_start)
    data = await db.load(thread_id)
    assert data is not None, "the prompt was lost: the thread was never saved"
    assert isinstance(data.messages[0], UserMessage) and data.messages[0].text == "slow job"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.ABORTED
    (summary,) = await db.list_threads()
    assert summary.lease is None, "the run's lease was left behind"
