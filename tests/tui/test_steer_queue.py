"""The durable steer queue of a run in this app (issue 11 item 4): kept when the app is
SIGKILLed and sent with the resume, offered after an abort, edited or cancelled before
it is sent - and the model sees the edit, or nothing."""

from __future__ import annotations

import sys

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import UserMessage
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.screens import running_tool
from tests.helpers.tui import (
    Db,
    fast_session,
    hold_tool,
    open_from_picker,
    screen_text,
    send_via_dialog,
    squeezed_lines,
    type_text,
    wait_for,
    wait_for_text,
    widget_text,
)
from tui.app import make_app
from tui.screens.modals import ConfirmModal, TextInputModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen

TIMEOUT = 60.0
"""Seconds any wait may take (generous: a loaded 2-core machine)."""


async def _commands(db: Db, thread_id: str):  # type: ignore[no-untyped-def]
    store = await SQLiteCheckpointer.open(db.path, create=False)
    try:
        return await store.list_commands(thread_id)
    finally:
        await store.close()


def _user_texts(data) -> list[tuple[str, str | None]]:  # type: ignore[no-untyped-def]
    return [(m.text, m.metadata.get("kind")) for m in data.messages if isinstance(m, UserMessage)]


async def test_a_steer_queued_when_the_app_is_sigkilled_is_listed_after_restart_and_sent_with_the_resume(
    db: Db,
) -> None:
    marks = run_marked(
        [sys.executable, "-m", "tests.helpers.app_steer_child", str(db.path)],
        "the app with a queued steer",
        kill_at=["queued"],
        cwd=str(REPO_ROOT),
    )
    thread_id = next(m.split(":", 1)[1] for m in marks if m.startswith("thread:"))
    app = make_app(fast_session(path=db.path))
    async with app.run_test(size=(130, 44)) as pilot:
        await open_from_picker(pilot, thread_id)
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await wait_for(
            pilot,
            lambda: (
                "steer #1 “focus on europe”: pending (not delivered: the run ended)" in squeezed_lines(screen_text(app))
            ),
            timeout=TIMEOUT,
            what="the steer listed after the restart",
        )
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), timeout=TIMEOUT, what="resume plan")
        assert "steer #1 “focus on europe” (•) send with the resume ( ) discard" in widget_text(app.screen)
        await pilot.press("y")
        await wait_for_text(pilot, "Noted your steer: “focus on europe”", timeout=TIMEOUT)
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the resumed run over")
    data = await db.load(thread_id)
    steers = [m for m in data.messages if isinstance(m, UserMessage) and m.metadata.get("kind") == "steer"]
    assert [(m.text, m.metadata.get("command_seq")) for m in steers] == [("focus on europe", 1)]
    assert [(c.kind, c.status) for c in await _commands(db, thread_id)] == [("steer", "applied")]


async def _aborted_with_a_steer(pilot, app, text: str) -> ThreadScreen:  # type: ignore[no-untyped-def]
    session = app.session
    tool = next(t for t in session.config.tools if t.name == "train_model")
    invoke = tool.invoke

    async def slow(ctx, params):  # type: ignore[no-untyped-def]
        while not ctx.signal.is_set():
            await pilot.pause(0.05)
        return await invoke(ctx, params)

    tool.invoke = slow
    await send_via_dialog(pilot, "n", "build a report")
    await wait_for(pilot, lambda: running_tool(app), timeout=TIMEOUT, what="a tool running")
    screen = app.screen
    assert isinstance(screen, ThreadScreen)
    await send_via_dialog(pilot, "s", text)
    agent = session.agents[screen.thread_id]
    await wait_for(pilot, lambda: bool(agent.state.pending_steers), timeout=TIMEOUT, what="queued with the agent")
    assert screen.commands_bar.status_of(1) == "pending"
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), timeout=TIMEOUT, what="the offer")
    await wait_for_text(pilot, "The run ended before 1 steer or follow-up reached the agent")
    assert "Steer #1: " + text in screen_text(app)
    await pilot.press("n")  # keep it for now
    await wait_for(pilot, lambda: app.screen is screen, what="back to the thread")
    return screen


async def test_a_steer_queued_before_an_abort_is_offered_and_the_model_gets_it_as_edited(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=3.0))
    async with app.run_test(size=(130, 44)) as pilot:
        screen = await _aborted_with_a_steer(pilot, app, "focus on europe")
        await pilot.press("E")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the edit dialog")
        await type_text(pilot, "focus on asia")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), timeout=TIMEOUT, what="offered again")
        assert "Steer #1: focus on asia" in screen_text(app)
        await pilot.press("y")
        await wait_for_text(pilot, "focus on asia", timeout=TIMEOUT)
        await wait_for(pilot, lambda: not screen.running and screen.diagnosis is not None, timeout=TIMEOUT, what="ran")
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    texts = _user_texts(data)
    assert ("focus on asia", "prompt") in texts and not any("europe" in t for t, _ in texts)
    # Still pending, it was edited in place, then sent as the new prompt.
    assert [(c.seq, c.text, c.status) for c in await _commands(db, thread_id)] == [(1, "focus on asia", "discarded")]


async def test_a_steer_cancelled_before_it_is_sent_never_reaches_the_model(db: Db) -> None:
    app = make_app(fast_session(path=db.path, speed=3.0))
    async with app.run_test(size=(130, 44)) as pilot:
        screen = await _aborted_with_a_steer(pilot, app, "focus on europe")
        await pilot.press("c")
        await wait_for(pilot, lambda: "▶ steer #1" in screen_text(app), what="selected")
        await pilot.press("D")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "discarded", what="cancelled")
        await send_via_dialog(pilot, "n", "just summarise")
        await wait_for(pilot, lambda: not screen.running and screen.diagnosis is not None, timeout=TIMEOUT, what="ran")
        assert not isinstance(app.screen, ConfirmModal)  # nothing left to offer
        thread_id = screen.thread_id
    data = await db.load(thread_id)
    assert not any("europe" in t for t, _ in _user_texts(data))
    [command] = await _commands(db, thread_id)
    assert (command.status, command.note) == ("discarded", "cancelled by the user before delivery")


async def test_a_steer_edited_and_another_cancelled_while_the_run_goes_on(db: Db) -> None:
    """Queued with the running agent, a steer is still the user's until the next turn
    boundary: E edits it (the model reads the edit), D cancels another (the model reads nothing)."""
    session = fast_session(path=db.path, speed=3.0)
    gate = hold_tool(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(130, 44)) as pilot:
        await send_via_dialog(pilot, "n", "build a report")
        await wait_for(pilot, lambda: running_tool(app), timeout=TIMEOUT, what="a tool running")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await send_via_dialog(pilot, "s", "focus on europe")
        await send_via_dialog(pilot, "s", "and skip the charts")
        agent = session.agents[screen.thread_id]
        await wait_for(pilot, lambda: len(agent.state.pending_steers) == 2, timeout=TIMEOUT, what="both queued")
        await pilot.press("c")
        await wait_for(pilot, lambda: "▶ steer #1" in screen_text(app), what="the first selected")
        await pilot.press("E")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the edit dialog")
        app.screen.query_one("Input").value = ""  # type: ignore[attr-defined]
        await type_text(pilot, "focus on asia")
        await pilot.press("enter")
        await wait_for(pilot, lambda: "“focus on asia”: pending" in screen_text(app), what="the edit listed")
        await pilot.press("c")
        await wait_for(pilot, lambda: "▶ steer #2" in screen_text(app), what="the second selected")
        await pilot.press("D")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(2) == "discarded", what="cancelled")
        assert screen.running, "all while the run goes on"
        gate.set()
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "applied", timeout=TIMEOUT, what="applied")
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run over")
        thread_id = screen.thread_id
    texts = _user_texts(await db.load(thread_id))
    assert ("focus on asia", "steer") in texts
    assert not any("europe" in t or "charts" in t for t, _ in texts)
    assert [(c.seq, c.text, c.status) for c in await _commands(db, thread_id)] == [
        (1, "focus on asia", "applied"),
        (2, "and skip the charts", "discarded"),
    ]


async def test_an_edit_that_loses_to_another_windows_edit_is_offered_again_on_the_same_steer(db: Db) -> None:
    """Two windows edit one queued steer: the later edit loses (its revision is stale) and
    is offered again as an edit of that steer as it reads now, never as a second steer."""
    from core.commands import edit

    session = fast_session(path=db.path, speed=3.0)
    gate = hold_tool(session, "train_model")
    app = make_app(session)
    async with app.run_test(size=(130, 44)) as pilot:
        await send_via_dialog(pilot, "n", "build a report")
        await wait_for(pilot, lambda: running_tool(app), timeout=TIMEOUT, what="a tool running")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await send_via_dialog(pilot, "s", "focus on europe")
        agent = session.agents[screen.thread_id]
        await wait_for(pilot, lambda: len(agent.state.pending_steers) == 1, timeout=TIMEOUT, what="queued")
        await pilot.press("E")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the edit dialog")
        # Meanwhile another window edits the same steer.
        [seen] = await _commands(db, screen.thread_id)
        other = await SQLiteCheckpointer.open(db.path, create=False)
        try:
            await edit(other, seen, "focus on africa")
        finally:
            await other.close()
        app.screen.query_one("Input").value = ""  # type: ignore[attr-defined]
        await type_text(pilot, "focus on asia")
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, TextInputModal) and app.screen.query_one("Input").value == "focus on asia",  # type: ignore[attr-defined]
            what="the edit offered again",
        )
        assert "Steer #1" in screen_text(app)
        assert any("Steer #1 was edited meanwhile" in n.message for n in app._notifications)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "“focus on asia”: pending" in screen_text(app), what="the edit listed")
        gate.set()
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "applied", timeout=TIMEOUT, what="applied")
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run over")
        thread_id = screen.thread_id
    texts = _user_texts(await db.load(thread_id))
    assert ("focus on asia", "steer") in texts
    assert not any("europe" in t or "africa" in t for t, _ in texts)
    assert [(c.seq, c.text, c.status) for c in await _commands(db, thread_id)] == [(1, "focus on asia", "applied")]
