"""Threads run by other processes: the picker says where they run and when they crashed; a
thread view follows them live and commands them (abort, steer) through the database."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.leases import host_id
from core.messages import AssistantMessage, UserMessage
from core.recovery import ThreadState, diagnose
from tests.helpers.tui import (
    fast_session,
    fill_dialog,
    open_from_picker,
    screen_text,
    squeezed_lines,
    wait_for,
    wait_for_text,
    widget_text,
)
from tui.app import make_app
from tui.messages import ThreadsLoaded
from tui.screens.modals import ChangesModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.message_view import AssistantMessageView
from tui.widgets.tool_call import ToolCallView

TIMEOUT = 60.0
"""Seconds any wait on another process may take (generous: a loaded 2-core machine)."""

GATED = ["-m", "core.runner", "run", "--agent", "tests.supervise.child:make_agent"]
"""The runner CLI with the gated test agent: its ``work`` tool runs until ``release-1`` exists."""

T = TypeVar("T")


async def _within(awaitable: Awaitable[T], what: str) -> T:
    """``await awaitable``, failing with ``what`` after TIMEOUT seconds instead of hanging."""
    try:
        return await asyncio.wait_for(awaitable, TIMEOUT)
    except TimeoutError as exc:
        raise AssertionError(f"stuck for {TIMEOUT:.0f} s: {what}") from exc


@contextlib.asynccontextmanager
async def _app_running(app: Any, size: tuple[int, int]) -> AsyncIterator[Any]:
    """``app.run_test(size=size)`` whose start and shutdown (runs stopped, followers stopped,
    store closed) fail the test after TIMEOUT seconds instead of hanging it. Both run in this
    task (``asyncio.timeout``, not ``wait_for``'s new task): Textual's context must stay one."""
    stack = contextlib.AsyncExitStack()
    try:
        async with asyncio.timeout(TIMEOUT):
            pilot = await stack.enter_async_context(app.run_test(size=size))
    except TimeoutError as exc:
        raise AssertionError(f"stuck for {TIMEOUT:.0f} s: the app starting") from exc
    try:
        yield pilot
    finally:
        try:
            async with asyncio.timeout(TIMEOUT):
                await stack.aclose()
        except TimeoutError as exc:
            raise AssertionError(f"stuck for {TIMEOUT:.0f} s: the app shutting down") from exc


def _row(app, thread_id: str):  # type: ignore[no-untyped-def]
    return next((r for r in app.threads_screen.rows if r.thread_id == thread_id), None)


async def _load(path: Path, thread_id: str):  # type: ignore[no-untyped-def]
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        return await store.load(thread_id), await store.list_commands(thread_id), await store.get_lease(thread_id)
    finally:
        await store.close()


def _line(app, thread_id: str) -> str:  # type: ignore[no-untyped-def]
    """The picker's line of ``thread_id`` as drawn ("" when it is not on screen)."""
    return next((line for line in screen_text(app).splitlines() if thread_id in line), "")


def _thread_screen(app) -> ThreadScreen:  # type: ignore[no-untyped-def]
    assert isinstance(app.screen, ThreadScreen), type(app.screen)
    return app.screen


def _tool_running(screen: ThreadScreen) -> bool:
    return any(v.status == "running" and (v.progress or 0) > 0 and v.status_text for v in screen.query(ToolCallView))


async def test_picker_shows_a_demo_runner_elsewhere_then_crashed_once_its_process_is_killed(
    shared_db: Path, children
) -> None:
    child = children(
        "-m",
        "core.runner",
        "run",
        "--db",
        str(shared_db),
        "--thread",
        "t-away",
        "--demo",
        "--speed",
        "0.3",
        "Forecast next quarter",
    )
    app = make_app(fast_session(path=shared_db))
    async with app.run_test(size=(150, 30)) as pilot:
        where = f"running on {host_id()} (pid {child.pid}, beat"
        await wait_for_text(pilot, where, timeout=TIMEOUT)
        row = _row(app, "t-away")
        assert row is not None and row.elsewhere and not row.running
        child.kill()
        # Same host, process gone: the lease is stale at once (no need to wait for its expiry).
        await wait_for(
            pilot,
            lambda: (r := _row(app, "t-away")) is not None and r.state.startswith("crashed"),
            timeout=TIMEOUT,
            what="the row to turn crashed",
        )
        row = _row(app, "t-away")
        # The crash point first (what resuming will do), then the host it died on.
        gone = f"{row.diagnosis.label} on {host_id()} (pid {child.pid} gone)" if row is not None else ""
        assert row is not None and row.state.startswith("crashed at point") and row.state == gone
        assert not row.elsewhere
        # The row changes before the table is redrawn: wait for the drawing too.
        await wait_for(pilot, lambda: gone in _line(app, "t-away"), what="the row drawn crashed")
        assert "running on" not in _line(app, "t-away")


async def test_picker_waits_for_the_lease_of_a_runner_on_another_host_to_expire(shared_db: Path, children) -> None:
    # The child claims to run on another machine, so its pid cannot be checked from here:
    # only the lease's expiry (3 s without a heartbeat) may turn the thread crashed.
    child = children("-m", "tests.supervise.child", str(shared_db), "t-remote", "Do the work.", "far-box", "3", "0.5")
    seen: list[tuple[float, str]] = []

    def hook(message: object) -> None:
        if isinstance(message, ThreadsLoaded):
            for row in message.rows:
                if row.thread_id == "t-remote":
                    seen.append((time.time(), row.state))

    app = make_app(fast_session(path=shared_db))
    async with app.run_test(size=(150, 30), message_hook=hook) as pilot:
        await wait_for_text(pilot, f"running on far-box (pid {child.pid}, beat", timeout=TIMEOUT)
        await wait_for(pilot, lambda: (child.gates / "started-1").exists(), timeout=TIMEOUT, what="the tool to start")
        child.kill()
        killed_at = time.time()
        await wait_for(
            pilot,
            lambda: (r := _row(app, "t-remote")) is not None and r.state.startswith("crashed"),
            timeout=TIMEOUT,
            what="the row to turn crashed",
        )
        row = _row(app, "t-remote")
        assert row is not None and row.state.startswith(f"{row.diagnosis.label} on far-box (lease expired ")
        assert row.state.startswith("crashed at point")
        assert row.diagnosis.state is ThreadState.CRASHED
    _, _, lease = await _load(shared_db, "t-remote")
    assert lease is not None and lease.host == "far-box"
    crashed_at = [at for at, state in seen if state.startswith("crashed")]
    elsewhere_at = [at for at, state in seen if state.startswith("running on far-box")]
    assert elsewhere_at and crashed_at
    assert min(crashed_at) >= lease.expires_at  # never shown crashed before the lease expired
    assert lease.expires_at > killed_at - 1.0  # ...which it did after the kill, not long before


async def test_a_thread_view_follows_a_run_elsewhere_and_aborts_it(shared_db: Path, children) -> None:
    child = children(*GATED, "--db", str(shared_db), "--thread", "t-live", "Do the work.")
    app = make_app(fast_session(path=shared_db))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for_text(pilot, "running on ", timeout=TIMEOUT)
        await open_from_picker(pilot, "t-live")
        screen = _thread_screen(app)
        assert screen.following
        # Streamed text and tool progress from the other process, before its run ends.
        await wait_for_text(pilot, "Turn 1: I am working", timeout=TIMEOUT)
        await wait_for(pilot, lambda: _tool_running(screen), timeout=TIMEOUT, what="tool progress")
        assert child.proc.poll() is None and screen.elsewhere is not None
        # Drawn a moment after the widgets changed: the status bar, and the tool's own status text.
        await wait_for(pilot, lambda: "running on " in screen_text(app).splitlines()[-2], what="the status bar")
        await wait_for_text(pilot, "step")

        # `r` is refused while the other process holds a live lease.
        await pilot.press("r")
        await wait_for(
            pilot, lambda: any("cannot be resumed now" in n.message for n in app._notifications), what="refusal"
        )
        assert not isinstance(app.screen, ResumeModal)

        # Leave and come back: a new follower, every message still shown exactly once.
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await open_from_picker(pilot, "t-live")
        screen = _thread_screen(app)
        await wait_for(pilot, lambda: _tool_running(screen), timeout=TIMEOUT, what="tool progress again")
        assert len(screen.query(AssistantMessageView)) == 1
        assert len(screen.query(ToolCallView)) == 1

        await pilot.press("a")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "applied", timeout=TIMEOUT, what="applied")
        assert await child.wait() == 130
        await wait_for(
            pilot,
            lambda: screen.diagnosis is not None and screen.diagnosis.state is ThreadState.ABORTED,
            timeout=TIMEOUT,
            what="an aborted thread",
        )
        # Drawn a moment after the screen's state changed: the commands bar and the status bar.
        await wait_for(
            pilot,
            lambda: (
                "abort #1: pending" in (text := screen_text(app))
                and "applied" in text
                and "aborted" in text.splitlines()[-2]
            ),
            what="the commands bar and the status bar drawn",
        )
        assert screen.elsewhere is None and not screen.check_action("abort", ())
        data, commands, _ = await _load(shared_db, "t-live")
        assert data is not None
        shown = [v.message for v in screen.query(AssistantMessageView)]
        assert len(shown) == sum(isinstance(m, AssistantMessage) for m in data.messages)
        assert len(screen.transcript._entries) == len(data.messages)
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.ABORTED
    assert [(c.kind, c.status) for c in commands] == [("abort", "applied")]


async def test_a_steer_sent_to_a_runner_that_then_crashed_is_sent_with_the_resume(shared_db: Path, children) -> None:
    child = children(*GATED, "--db", str(shared_db), "--thread", "t-steer", "Do the work.")
    app = make_app(fast_session(path=shared_db))
    async with app.run_test(size=(130, 44)) as pilot:
        await wait_for_text(pilot, "running on ", timeout=TIMEOUT)
        await open_from_picker(pilot, "t-steer")
        screen = _thread_screen(app)
        await wait_for(pilot, lambda: _tool_running(screen), timeout=TIMEOUT, what="tool progress")
        await fill_dialog(pilot, "s", "focus on europe")
        await wait_for_text(pilot, "It goes to process")  # drawn after the push
        await pilot.press("enter")
        # The runner queues it with its agent, but its tool never reaches a turn boundary.
        await wait_for(pilot, lambda: (child.gates / "queued-1").exists(), timeout=TIMEOUT, what="queued")
        await wait_for(
            pilot,
            lambda: "steer #1 “focus on europe”: pending" in squeezed_lines(screen_text(app)),
            what="the commands bar drawn",
        )
        assert screen.commands_bar.status_of(1) == "pending"
        child.kill()
        await wait_for_text(pilot, "Crashed mid-tool (point 3)", timeout=TIMEOUT)
        assert screen.elsewhere is None

        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="resume confirmation")
        modal = app.screen
        text = widget_text(modal)
        assert "marked interrupted, not re-run (this agent has no tool named work)" in text
        assert "steer #1 “focus on europe” (•) send with the resume ( ) discard" in text
        await pilot.press("y")
        # The gated agent wrote the thread, the demo agent resumes it: asked first, accepted.
        await wait_for(pilot, lambda: isinstance(app.screen, ChangesModal), what="the changed definition")
        assert "tool work: removed" in widget_text(app.screen)
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="back")
        await wait_for_text(pilot, "Noted your steer: “focus on europe”", timeout=TIMEOUT)
        await wait_for(
            pilot, lambda: not screen.running and screen.diagnosis is not None, timeout=TIMEOUT, what="run over"
        )
    data, commands, _ = await _load(shared_db, "t-steer")
    assert data is not None
    steers = [m for m in data.messages if isinstance(m, UserMessage) and m.metadata.get("kind") == "steer"]
    assert [(m.text, m.metadata.get("command_seq")) for m in steers] == [("focus on europe", 1)]
    assert [(c.kind, c.status) for c in commands] == [("steer", "applied")]
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


async def test_a_run_in_the_app_can_be_followed_and_aborted_from_another_connection(shared_db: Path) -> None:
    """In-app runs go through a Supervisor: another process (here: another connection, as a
    second app window would hold) sees them stream and can abort them by command."""
    from core.commands import send
    from core.follow import ThreadFollower

    app = make_app(fast_session(path=shared_db, speed=1.0))
    async with _app_running(app, (130, 40)) as pilot:
        await fill_dialog(pilot, "n", "a long job")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.running, what="run here")
        screen = _thread_screen(app)
        other = await _within(SQLiteCheckpointer.open(shared_db, create=False), "opening another connection")
        try:
            follower = ThreadFollower(other, screen.thread_id)
            # What the follower showed, change by change (a streaming reply or a running tool
            # may come and go between two looks of the test; a change never goes unseen).
            live: list[bool] = []
            follower.subscribe(
                lambda c: (
                    live.append(c.model.lease_view.live)
                    if c.model.partial is not None or c.model.running_tools
                    else None
                )
            )
            await _within(follower.start(), "the follower starting")
            try:
                await wait_for(
                    pilot, lambda: bool(live), timeout=TIMEOUT, what="the other connection to see the run live"
                )
                assert live[0]  # ...under the app's live lease
                command = await _within(send(other, screen.thread_id, "abort"), "sending the abort")
                await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run to stop")
                listed = await _within(other.list_commands(screen.thread_id), "listing the commands")
                statuses = {c.seq: c.status for c in listed}
                assert statuses[command.seq] == "applied"
            finally:
                await _within(follower.stop(), "the follower stopping")
        finally:
            await _within(other.close(), "closing the other connection")
        await wait_for(
            pilot,
            lambda: screen.diagnosis is not None and screen.diagnosis.state is ThreadState.ABORTED,
            timeout=TIMEOUT,
            what="aborted",
        )


async def test_a_retry_wait_elsewhere_counts_down_in_the_status_bar_then_the_reply_shows(
    shared_db: Path, children
) -> None:
    from tests.helpers import retrying_agent
    from tui.widgets.status_bar import StatusBar

    child = children(
        "-m",
        "core.runner",
        "run",
        "--agent",
        "tests.helpers.retrying_agent:make_agent",
        "--db",
        str(shared_db),
        "--thread",
        "t-wait",
        "Summarise the sales",
    )
    app = make_app(fast_session(path=shared_db))

    def status() -> str:
        return app.screen.query_one(StatusBar).render().plain

    def left() -> int | None:
        """The seconds the status bar says the wait has left (``None``: no wait shown)."""
        words = status().partition("rate limited, retrying in ")[2].partition(" s (attempt 2 of 5)")
        return int(words[0]) if words[1] else None

    async with _app_running(app, (160, 40)) as pilot:
        await wait_for_text(pilot, "running on ", timeout=TIMEOUT)
        await open_from_picker(pilot, "t-wait")
        screen = _thread_screen(app)
        assert screen.following
        await wait_for(pilot, lambda: "running on " in status(), timeout=TIMEOUT, what="the run elsewhere")
        assert "retrying" not in status()
        # The wait begins while the view follows the run...
        child.gate(retrying_agent.FAILED)
        await wait_for(pilot, lambda: left() is not None, timeout=TIMEOUT, what="the wait in the status bar")
        first = left()
        assert first is not None and first <= retrying_agent.WAIT_SECONDS
        await wait_for(pilot, lambda: (n := left()) is not None and n < first, what="the countdown")
        before = left()
        assert before is not None
        # ...and a view opened during the wait shows it too, counted from the runner's clock.
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await open_from_picker(pilot, "t-wait")
        screen = _thread_screen(app)
        await wait_for(pilot, lambda: left() is not None, timeout=TIMEOUT, what="the wait again")
        again = left()
        assert again is not None and again <= before  # not the whole wait afresh
        child.gate(retrying_agent.DONE)
        await wait_for_text(pilot, retrying_agent.REPLY, timeout=TIMEOUT)
        assert await child.wait() == 0
        await wait_for(pilot, lambda: "completed" in status(), timeout=TIMEOUT, what="the run completed")
        assert "retrying" not in status()
