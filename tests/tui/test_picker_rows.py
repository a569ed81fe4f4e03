"""The picker's rows: the list is read once at start, then only changed threads are made
again and named (``RowsUpdate.changed``); the provider is built after the first listing;
whole-thread refinement looks at a listing once. Work is counted, never timed."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from core.checkpoint.base import ThreadSummary
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import MissingApiKeyError
from core.messages import AssistantMessage, TextContent, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui import whole_diagnoses
from tui.app import make_app
from tui.screens.modals import ErrorScreen
from tui.session_rows import FIRST_ROWS, RowsUpdate


def _done(text: str = "ok") -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason="stop")


class CountingStore(MemoryCheckpointer):
    """A memory store that counts its listings."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0

    async def list_threads(self) -> list[ThreadSummary]:
        self.listings += 1
        return await super().list_threads()


async def _store(count: int) -> CountingStore:
    store = CountingStore()
    for i in range(count):
        await store.append(f"t{i}", [user_text(f"task {i}"), _done()])
    return store


async def _next(updates, timeout: float = 10.0) -> RowsUpdate:  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(updates.__anext__(), timeout)


async def test_watch_rows_names_only_the_thread_that_changed_and_keeps_the_other_rows() -> None:
    store = await _store(5)
    session = fast_session(store)
    await session.open()
    updates = session.watch_rows()
    try:
        first = await _next(updates)
        assert first.changed == {f"t{i}" for i in range(5)} and len(first.rows) == 5
        await store.append("t2", [user_text("and again"), _done("again")])
        update = await _next(updates)
        # Whole-thread refinement read these threads as their tails did: no update named them.
        assert update.changed == {"t2"}
        assert update.rows[0].thread_id == "t2" and update.rows[0].message_count == 4
        before = {row.thread_id: row for row in first.rows}
        assert all(row is before[row.thread_id] for row in update.rows if row.thread_id != "t2")
        await store.delete_thread("t4")
        update = await _next(updates)
        assert update.changed == {"t4"} and "t4" not in {row.thread_id for row in update.rows}
    finally:
        await updates.aclose()
        await session.close()


async def test_the_app_reads_the_list_once_at_start() -> None:
    store = await _store(3)
    app = make_app(fast_session(store))
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 3, what="three rows")
        await wait_for_text(pilot, "t1")
        await pilot.pause(0.5)  # any second listing at start would have come by now
        assert store.listings == 1


async def test_the_provider_is_built_after_the_first_listing_and_its_error_is_still_said() -> None:
    store = await _store(2)
    order: list[str] = []
    listed = store.list_threads

    async def list_threads() -> list[ThreadSummary]:
        order.append("listing")
        return await listed()

    def make_provider() -> object:
        order.append("provider")
        raise MissingApiKeyError("No Anthropic API key: set ANTHROPIC_API_KEY or pass api_key.")

    store.list_threads = list_threads  # type: ignore[method-assign]
    session = fast_session(store, make_provider=make_provider)
    app = make_app(session)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="the provider's error")
        assert order[:2] == ["listing", "provider"] and order.count("provider") == 1
        assert "No Anthropic API key" in screen_text(app)
        assert "browse threads, but not run them" in screen_text(app)
        assert len(app.threads_screen.rows) == 2


async def test_refinement_looks_at_a_listing_once_however_many_steps_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _store(30)
    summaries = await store.list_threads()
    looked: list[str] = []
    enough = whole_diagnoses.tail_is_enough

    def counted(tail):  # type: ignore[no-untyped-def]
        looked.append("tail")
        return enough(tail)

    monkeypatch.setattr(whole_diagnoses, "tail_is_enough", counted)
    whole = whole_diagnoses.WholeDiagnoses()
    steps = 0
    while await whole.refine(store, summaries, budget=0.0):  # one thread per step
        steps += 1
    assert steps == 29 and len(whole.take_refined()) == 30
    assert len(looked) == 30  # each tail looked at once, not once per step
    assert not await whole.refine(store, summaries)  # nothing left: no more work
    assert len(looked) == 30


async def test_refinement_waits_while_the_user_is_at_work_and_changes_still_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await _store(5)
    session = fast_session(store, input_quiet=3600.0)  # input came "just now" for the whole test, until quiet
    steps: list[int] = []
    refine = session.whole.refine

    async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        steps.append(1)
        return await refine(*args, **kwargs)

    session.whole.refine = counted  # type: ignore[method-assign]
    session.note_input()
    await session.open()
    updates = session.watch_rows()
    try:
        first = await _next(updates)
        assert len(first.rows) == 5
        await store.append("t2", [user_text("and again"), _done("again")])
        update = await _next(updates)  # a change elsewhere is shown while input is recent
        assert update.changed == {"t2"}
        assert steps == []  # and no thread was read whole meanwhile
        # The configuration is fixed once built, so the hour of quiet is made to have passed.
        monkeypatch.setattr(session, "input_is_quiet", lambda: True)
        more = asyncio.ensure_future(_next(updates))
        for _ in range(200):
            if steps:
                break
            await asyncio.sleep(0.05)
        assert steps  # quiet input: refinement went on
        more.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await more
    finally:
        await updates.aclose()
        await session.close()


async def test_a_key_in_the_app_tells_the_session_that_input_is_not_quiet() -> None:
    session = fast_session(await _store(3), input_quiet=3600.0)
    app = make_app(session)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 3, what="three rows")
        assert session.input_is_quiet()
        await pilot.press("down")
        assert not session.input_is_quiet()


async def test_a_long_first_listing_shows_its_first_rows_before_the_rest() -> None:
    store = await _store(FIRST_ROWS + 50)
    session = fast_session(store)
    await session.open()
    updates = session.watch_rows()
    try:
        top = await _next(updates)
        assert len(top.rows) == FIRST_ROWS and top.listed == FIRST_ROWS + 50
        whole = await _next(updates)
        assert len(whole.rows) == FIRST_ROWS + 50
        assert whole.rows[:FIRST_ROWS] == top.rows  # the top first, then every row, in order
        assert whole.changed == {row.thread_id for row in whole.rows[FIRST_ROWS:]}
    finally:
        await updates.aclose()
        await session.close()
