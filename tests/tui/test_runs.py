"""Live runs of the demo agent driven through the keys: new thread, abort, steer, follow-up."""

from __future__ import annotations

import asyncio
import signal

import pytest

from core.follow import ThreadFollower
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.recovery import ThreadState, diagnose
from tests.helpers.screens import running_tool
from tests.helpers.tui import (
    Db,
    fast_session,
    fill_dialog,
    hold_tool,
    open_from_picker,
    screen_text,
    send_via_dialog,
    wait_for,
    wait_for_text,
)
from tui.app import CubepiApp, make_app
from tui.messages import AgentEventReceived, RunFinished
from tui.screens.modals import ConfirmModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen


def _thread_screen(app: CubepiApp) -> ThreadScreen:
    assert isinstance(app.screen, ThreadScreen), type(app.screen)
    return app.screen


async def _start_thread(pilot, prompt: str) -> ThreadScreen:  # type: ignore[no-untyped-def]
    app = pilot.app
    await send_via_dialog(pilot, "n", prompt)
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ThreadScreen) and app.screen.run_worker_ref is not None,
        what="run started",
    )
    return _thread_screen(app)


async def test_new_thread_runs_to_completion_and_events_arrive_as_messages(db: Db) -> None:
    seen: list[object] = []
    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(110, 40), message_hook=seen.append) as pilot:
        screen = await _start_thread(pilot, "summarise sales")
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="run finished")
        await wait_for_text(pilot, "Everything finished")
        text = screen_text(app)
        assert "completed" in text
        assert "write_report" in text
    events = [m.event.type for m in seen if isinstance(m, AgentEventReceived)]
    assert events[0] == "agent_start" and events[-1] == "agent_end"
    assert "tool_execution_update" in events and "message_update" in events
    finished = [m for m in seen if isinstance(m, RunFinished)]
    assert finished and finished[-1].outcome == "completed"
    (summary,) = await db.list_threads()
    assert diagnose(summary.tail, summary.runs).state is ThreadState.COMPLETED


async def test_abort_during_a_live_run(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "train something")
        await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
        await pilot.press("a")
        await wait_for(pilot, lambda: not screen.running, timeout=5, what="run stopped")
        await wait_for_text(pilot, "aborted by the user")
        text = screen_text(app)
        assert "aborted" in text.splitlines()[-2]  # the status bar
        assert not screen.check_action("abort", ())  # nothing left to abort: the key is greyed
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert data is not None
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED


async def test_steer_lands_in_the_conversation_and_follow_up_comes_after(db: Db) -> None:
    session = fast_session(path=db.path, speed=3.0)
    # Both are queued while the first tool batch is held, however slowly the keys go in.
    batch_done = hold_tool(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "build a report")
        await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
        await send_via_dialog(pilot, "s", "focus on europe")
        await send_via_dialog(pilot, "f", "add a chart")
        assert screen.running
        batch_done.set()
        await wait_for(pilot, lambda: not screen.running, timeout=30, what="run finished")
        await wait_for_text(pilot, "Following up on")
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert data is not None
    kinds = [(m.metadata or {}).get("kind") if isinstance(m, UserMessage) else m.role for m in data.messages]
    steer_at = kinds.index("steer")
    follow_at = kinds.index("follow_up")
    # The steer arrives after the first tool batch's results and before the next reply...
    assert kinds[steer_at - 1] == "tool_result" and kinds[steer_at + 1] == "assistant"
    assert "focus on europe" in data.messages[steer_at + 1].text  # type: ignore[union-attr]
    # ...the follow-up after the run's final answer, and it is answered too.
    assert follow_at > steer_at and kinds[follow_at - 1] == "assistant"
    assert isinstance(data.messages[follow_at - 1], AssistantMessage)
    assert not data.messages[follow_at - 1].tool_calls  # type: ignore[union-attr]
    assert any(isinstance(m, ToolResultMessage) for m in data.messages[follow_at:])
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_steer_when_idle_offers_a_new_prompt(db: Db) -> None:
    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "first")
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="run finished")
        await fill_dialog(pilot, "s", "second")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="offer")
        await wait_for_text(pilot, "Send this as a new prompt?")  # drawn after the push
        await pilot.press("y")
        await wait_for_text(pilot, "You asked: “second”", timeout=60)
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="second run finished")


async def test_leaving_the_view_keeps_the_run_going_and_the_picker_says_so(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=2.0))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "long job")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await wait_for_text(pilot, "running here")
        await open_from_picker(pilot, screen.thread_id)
        assert app.screen is screen and screen.running  # the same live view, still streaming
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker again")
        await wait_for(pilot, lambda: not app.session.is_running(screen.thread_id), timeout=20, what="done")
        await wait_for_text(pilot, "completed")
        assert "running here" not in screen_text(app)
        assert app.thread_screen(screen.thread_id) is None  # its screen was let go


async def test_leaving_a_new_thread_before_it_has_loaded_still_runs_its_prompt(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # q pressed in the instant after the first prompt's Enter: its screen was let go as idle
    # (no run yet), so the prompt never ran and the picker listed no thread until quitting.
    loaded = asyncio.Event()
    start = ThreadFollower.start

    async def held_start(self: ThreadFollower, **kwargs: object) -> object:
        await loaded.wait()
        return await start(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ThreadFollower, "start", held_start)
    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(110, 40)) as pilot:
        await send_via_dialog(pilot, "n", "summarise sales")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="thread screen")
        screen = _thread_screen(app)
        assert not screen.loaded
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        loaded.set()
        await wait_for(pilot, lambda: screen.thread_id in screen_text(app), timeout=20, what="the thread listed")
        await wait_for_text(pilot, "completed", timeout=60)
    data = await db.load(screen.thread_id)
    assert data is not None
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_two_threads_run_at_once(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=2.0))
    async with app.run_test(size=(110, 40)) as pilot:
        first = await _start_thread(pilot, "first job")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        second = await _start_thread(pilot, "second job")
        assert second.thread_id != first.thread_id
        await pilot.press("q")
        await wait_for(
            pilot,
            lambda: sum(r.running for r in app.threads_screen.rows) == 2,
            what="both running here",
        )
        # The rows change before the table is redrawn: wait for the drawing too.
        await wait_for(pilot, lambda: screen_text(app).count("running here") == 2, what="both rows drawn running here")
        await wait_for(
            pilot,
            lambda: not app.session.is_running(first.thread_id) and not app.session.is_running(second.thread_id),
            timeout=30,
            what="both done",
        )
    for thread_id in (first.thread_id, second.thread_id):
        data = await db.load(thread_id)
        assert data is not None and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_quitting_with_a_live_run_asks_then_aborts_it_cleanly(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "slow job")
        await pilot.press("q")  # back to the picker; the run goes on
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await pilot.press("q")  # quit
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="quit question")
        await wait_for_text(pilot, "1 agent is running")  # drawn after the push
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, timeout=60, what="exit")
    data = await db.load(screen.thread_id)
    assert data is not None
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED


async def test_quitting_keeps_a_queued_steer_in_the_database_for_later(db: Db) -> None:
    from core.checkpoint.sqlite import SQLiteCheckpointer
    from core.commands import undelivered

    session = fast_session(path=db.path, speed=3.0)
    hold_tool(session, "train_model")  # the steer stays queued: the batch never ends
    app = make_app(session)
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "build a report")
        await wait_for(pilot, lambda: running_tool(app), what="a tool running")
        await send_via_dialog(pilot, "s", "focus on europe")
        agent = session.agents[screen.thread_id]
        await wait_for(pilot, lambda: bool(agent.state.pending_steers), what="queued with the agent")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="quit question")
        await wait_for_text(pilot, "1 agent is running")
        # Through the command table, so not dropped: the question no longer warns of it.
        assert app.session.queued_count() == 0 and "dropped" not in screen_text(app)
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, timeout=60, what="exit")
    store = await SQLiteCheckpointer.open(db.path, create=False)
    try:
        assert [c.text for c in await undelivered(store, screen.thread_id)] == ["focus on europe"]
    finally:
        await store.close()


async def test_after_a_run_here_the_view_follows_the_thread_again_showing_each_message_once(db: Db) -> None:
    from core.checkpoint.sqlite import SQLiteCheckpointer
    from core.messages import user_text
    from tui.widgets.message_view import AssistantMessageView

    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "first job")
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="run finished")
        await wait_for(pilot, lambda: screen.following, what="following again")
        data = await db.load(screen.thread_id)
        assert data is not None
        assert len(screen.transcript._entries) == len(data.messages)
        assert len(screen.query(AssistantMessageView)) == sum(isinstance(m, AssistantMessage) for m in data.messages)
        # Another program writes to the idle thread: it shows up, once.
        other = await SQLiteCheckpointer.open(db.path, create=False)
        try:
            await other.append(screen.thread_id, [user_text("a note from another program")])
        finally:
            await other.close()
        await wait_for_text(pilot, "a note from another program", timeout=60)
        assert len(screen.transcript._entries) == len(data.messages) + 1
        await wait_for(
            pilot,
            lambda: screen.diagnosis is not None and screen.diagnosis.state is ThreadState.CRASHED,
            what="an unanswered message",
        )
        assert screen_text(app).count("a note from another program") == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_sigterm_aborts_the_runs_and_exits_cleanly(db: Db, signum: int) -> None:
    """`kill PID` or `kill -INT PID` leaves the thread aborted, not crashed (in the app,
    Ctrl-C is a key; SIGINT only comes from outside)."""
    import os

    app = make_app(fast_session(path=db.path, speed=1.0))
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _start_thread(pilot, "train something")
        await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
        thread_id = screen.thread_id
        os.kill(os.getpid(), signum)
        # Generous: on a loaded 2-core machine the abort and the save can take seconds.
        await wait_for(pilot, lambda: not screen.running or app._exit, timeout=60, what="run stopped")
        await wait_for(pilot, lambda: app._exit, timeout=60, what="app exiting")
    assert app.return_code == 128 + signum  # the shell's "ended by signal N"
    data = await db.load(thread_id)
    assert data is not None
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED
