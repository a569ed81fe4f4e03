"""Issue 11 item 5's keys on the thread screen, driven by Pilot on the demo agent: stop
after this turn (A), interrupt and send now (S), a passive note (o); each in the footer
and the help, and remappable by its binding id (``App.set_keymap``)."""

from __future__ import annotations

import asyncio

from core.loop import STOPPED_TEXT
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.recovery import ThreadState, diagnose
from tests.helpers.screens import running_tool
from tests.helpers.tui import Db, fast_session, hold_tool, screen_text, send_via_dialog, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.modals import HelpScreen
from tui.screens.thread import ThreadScreen
from tui.session import Session

TIMEOUT = 60.0
"""Seconds any wait may take (generous: a loaded 2-core machine)."""


def _until_aborted(session: Session, name: str) -> None:
    """Hold the tool ``name`` until its abort signal, then let it see that signal."""
    tool = next(t for t in session.config.tools if t.name == name)
    invoke = tool.invoke

    async def held(ctx, params):  # type: ignore[no-untyped-def]
        while not ctx.signal.is_set():
            await asyncio.sleep(0.02)
        return await invoke(ctx, params)

    tool.invoke = held  # type: ignore[method-assign]


async def _running(pilot, prompt: str) -> ThreadScreen:  # type: ignore[no-untyped-def]
    app = pilot.app
    await send_via_dialog(pilot, "n", prompt)
    await wait_for(pilot, lambda: running_tool(app), timeout=TIMEOUT, what="a tool running")
    assert isinstance(app.screen, ThreadScreen)
    return app.screen


async def _commands(db: Db, thread_id: str) -> list[tuple[str, str]]:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    store = await SQLiteCheckpointer.open(db.path, create=False)
    try:
        return [(c.kind, c.status) for c in await store.list_commands(thread_id)]
    finally:
        await store.close()


async def _stops_after_the_turn(db: Db, key: str, keymap: dict[str, str] | None = None) -> None:
    session = fast_session(path=db.path, speed=3.0)
    gate = hold_tool(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(130, 44)) as pilot:
        if keymap:
            app.set_keymap(keymap)
        screen = await _running(pilot, "build a report")
        await pilot.press(key)
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "delivered", timeout=TIMEOUT, what="taken")
        gate.set()  # the tools finish their work
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run stopped")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "applied", timeout=TIMEOUT, what="applied")
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert sorted(r.tool_name for r in results) == ["fetch_dataset", "train_model"]
    assert not any(r.is_error for r in results)  # finished, results kept
    replies = [m for m in data.messages if isinstance(m, AssistantMessage)]
    assert len(replies) == 2 and not replies[-1].tool_calls  # no write_report: no further model call
    assert (replies[-1].stop_reason, replies[-1].error_message) == ("aborted", STOPPED_TEXT)
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED
    assert await _commands(db, thread_id) == [("stop", "applied")]


async def test_A_stops_after_this_turn_keeping_the_tools_results(db: Db) -> None:
    await _stops_after_the_turn(db, "A")


async def test_stop_after_this_turn_is_remappable_by_its_binding_id(db: Db) -> None:
    await _stops_after_the_turn(db, "z", {"thread.stop_after_turn": "z"})


async def test_S_aborts_the_running_tools_then_delivers_the_steer_and_goes_on(db: Db) -> None:
    session = fast_session(path=db.path, speed=3.0)
    _until_aborted(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(130, 44)) as pilot:
        screen = await _running(pilot, "build a report")
        await send_via_dialog(pilot, "S", "switch to europe")
        await wait_for_text(pilot, "Noted your steer: “switch to europe”", timeout=TIMEOUT)
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run over")
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    kinds = [(m.metadata or {}).get("kind") if isinstance(m, UserMessage) else m.role for m in data.messages]
    steer_at = kinds.index("steer")
    assert data.messages[steer_at].text == "switch to europe"  # type: ignore[union-attr]
    trained = next(m for m in data.messages if isinstance(m, ToolResultMessage) and m.tool_name == "train_model")
    assert "abort" in trained.text.lower()  # aborted as an abort does
    assert kinds[steer_at + 1] == "assistant" and diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
    assert await _commands(db, thread_id) == [("interrupt", "applied")]


async def test_o_sends_a_note_that_rides_with_the_next_turn(db: Db) -> None:
    session = fast_session(path=db.path, speed=3.0)
    gate = hold_tool(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(130, 44)) as pilot:
        screen = await _running(pilot, "build a report")
        await send_via_dialog(pilot, "o", "by the way, no rush")
        agent = session.agents[screen.thread_id]
        await wait_for(pilot, lambda: bool(agent.state.pending_notes), timeout=TIMEOUT, what="queued")
        gate.set()
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run over")
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    kinds = [(m.metadata or {}).get("kind") if isinstance(m, UserMessage) else m.role for m in data.messages]
    note_at = kinds.index("note")
    # After the tools' results, before the reply that answers them: the next turn, not a new one.
    assert kinds[note_at - 1] == "tool_result" and kinds[note_at + 1] == "assistant"
    assert kinds.count("assistant") == 3  # tools, report, summary: as without the note
    assert await _commands(db, thread_id) == [("note", "applied")]


async def test_the_three_keys_are_in_the_footer_and_the_help(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=3.0))
    async with app.run_test(size=(200, 44)) as pilot:
        screen = await _running(pilot, "build a report")
        footer = screen_text(app).splitlines()[-1]
        for words in ("A Stop after turn", "S Interrupt", "o Note"):
            assert words in footer, footer
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        text = " ".join(screen_text(app).split())  # the thread view's keys are on its first page
        assert "A stop after this turn" in text and "S interrupt and send now" in text and "o note:" in text
        await pilot.press("escape")
        await pilot.press("a")
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="aborted")
