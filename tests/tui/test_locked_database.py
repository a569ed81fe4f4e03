"""The app under a write lock another process holds: it waits, and never loses a typed prompt.

It used to give up after about 11 s and show an error, and the prompt the user had typed
was gone. Each lock here is held by a real second process (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.recovery import ThreadState, diagnose
from tests.helpers.locks import LockHolder
from tests.helpers.tui import Db, fast_session, fill_dialog, open_from_picker, send_via_dialog, wait_for
from tui.app import make_app
from tui.screens.modals import TextInputModal
from tui.screens.thread import ThreadScreen

HELD = 14.0
"""Seconds of the lock in the first test: longer than the old ~11 s, within the 60 s budget."""


async def _created(path: Path) -> None:
    store = await SQLiteCheckpointer.open(path)
    await store.close()


async def _thread_of(db: Db, text: str):  # type: ignore[no-untyped-def]
    rows = [t for t in await db.list_threads() if t.first_prompt == text]
    assert len(rows) == 1, rows
    data = await db.load(rows[0].thread_id)
    assert data is not None
    return data


def _running_or_done(app) -> bool:  # type: ignore[no-untyped-def]
    screen = app.screen
    return isinstance(screen, ThreadScreen) and screen.run_worker_ref is not None


async def test_a_prompt_sent_under_a_long_lock_waits_and_runs(db: Db) -> None:
    await _created(db.path)
    holder = LockHolder(db.path, HELD).start()
    try:
        app = make_app(fast_session(path=db.path))
        async with app.run_test(size=(110, 40)) as pilot:
            await send_via_dialog(pilot, "n", "summarise sales")
            await wait_for(pilot, lambda: _running_or_done(app), what="the run started")
            screen = app.screen
            assert isinstance(screen, ThreadScreen)
            await wait_for(
                pilot,
                lambda: screen.run_worker_ref is not None and screen.run_worker_ref.is_finished and not screen.running,
                timeout=HELD + 60,
                what="the run finished",
            )
            assert not isinstance(app.screen, TextInputModal)  # nothing to offer again: it went through
        assert holder.wait() == 0
    finally:
        holder.stop()
    data = await _thread_of(db, "summarise sales")
    assert data.messages[0].text == "summarise sales"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


async def test_a_prompt_that_could_not_be_sent_is_offered_again_as_typed(db: Db) -> None:
    await _created(db.path)
    # A short budget, so the send fails for good while the lock is still held.
    store = await SQLiteCheckpointer.open(db.path, busy_timeout=0.2, lock_wait=1.5)
    holder = LockHolder(db.path, 120.0).start()
    try:
        app = make_app(fast_session(store=store))
        async with app.run_test(size=(110, 40)) as pilot:
            await send_via_dialog(pilot, "n", "summarise sales")

            def offered() -> bool:
                screen = app.screen
                return isinstance(screen, TextInputModal) and screen.query_one(Input).value == "summarise sales"

            await wait_for(pilot, offered, timeout=60, what="the prompt offered again")
            holder.stop()  # the lock goes away; Enter sends the same text again
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, TextInputModal), what="the dialog closed")
            screen = app.screen
            assert isinstance(screen, ThreadScreen)
            await wait_for(
                pilot,
                lambda: screen.run_worker_ref is not None and screen.run_worker_ref.is_finished and not screen.running,
                timeout=60,
                what="the run finished",
            )
    finally:
        holder.stop()
        await store.close()
    data = await _thread_of(db, "summarise sales")
    assert [m.text for m in data.messages if m.role == "user"] == ["summarise sales"]
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


GATED = ["-m", "core.runner", "run", "--agent", "tests.supervise.child:make_agent"]
"""The runner CLI with the gated test agent: its ``work`` tool runs until ``release-1`` exists."""


async def test_a_steer_for_a_run_elsewhere_that_could_not_be_sent_is_offered_again(shared_db: Path, children) -> None:
    child = children(*GATED, "--db", str(shared_db), "--thread", "t-steer", "Do the work.")
    store = await SQLiteCheckpointer.open(shared_db, busy_timeout=0.2, lock_wait=1.5)
    holder = LockHolder(shared_db, 120.0)
    try:
        app = make_app(fast_session(store=store))
        async with app.run_test(size=(130, 44)) as pilot:
            await open_from_picker(pilot, "t-steer")
            screen = app.screen
            assert isinstance(screen, ThreadScreen)
            await wait_for(
                pilot,
                lambda: screen.elsewhere is not None and (child.gates / "started-1").exists(),
                timeout=60,
                what="the runner's tool running",
            )
            holder.start()
            await fill_dialog(pilot, "s", "focus on europe")
            await pilot.press("enter")

            def offered() -> bool:
                top = app.screen
                return isinstance(top, TextInputModal) and top.query_one(Input).value == "focus on europe"

            await wait_for(pilot, offered, timeout=60, what="the steer offered again")
            holder.stop()
            await pilot.press("enter")
            await wait_for(
                pilot,
                lambda: (child.gates / "queued-1").exists(),
                timeout=60,
                what="the steer queued with the runner's agent",
            )
            child.gate("release-1")
            assert await child.wait() == 0
    finally:
        holder.stop()
        await store.close()
    data = await Db(shared_db).load("t-steer")
    assert data is not None
    steers = [m.text for m in data.messages if m.role == "user" and m.metadata.get("kind") == "steer"]
    assert steers == ["focus on europe"]
