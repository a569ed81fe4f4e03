"""Long threads open lazily (issue 10): the newest page is shown and read, earlier pages are
read from the store as the user scrolls up, and the banner, the resume plan and the token
totals are still those of the whole thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint import codec
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolCall, ToolResultMessage, Usage, user_text
from core.recovery import ThreadState, diagnose
from tests.helpers.decodes import DecodeCount, counting_decodes
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.message_view import AssistantMessageView, ToolResultView, UserMessageView
from tui.widgets.tool_call import ToolCallView
from tui.widgets.transcript import WINDOW, Transcript


def _turns(count: int, *, start: int = 0) -> list[AnyMessage]:
    """``count`` messages: a prompt, a reply calling a tool, its result, again and again."""
    out: list[AnyMessage] = []
    for i in range(start, start + count):
        if i % 3 == 0:
            out.append(user_text(f"prompt {i}", run_id="r1"))
        elif i % 3 == 1:
            out.append(
                AssistantMessage(
                    content=[TextContent(text=f"reading {i}"), ToolCall(id=f"c{i}", name="read", arguments={"i": i})],
                    stop_reason="tool_use",
                    usage=Usage(input_tokens=100 + i, output_tokens=7),
                    run_id="r1",
                )
            )
        else:
            out.append(ToolResultMessage(tool_call_id=f"c{i - 1}", content=[TextContent(text=f"out {i}")], run_id="r1"))
    return out


async def _file(path: Path, thread_id: str, messages: list[AnyMessage], *, runs: tuple[str, ...] = ("r1",)) -> None:
    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        for run in runs:
            await store.claim_run(thread_id, run)
        for i in range(0, len(messages), 2000):
            await store.append(thread_id, messages[i : i + 2000])
    finally:
        await store.close()


async def _stored(path: Path, thread_id: str) -> Any:
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        return await store.load(thread_id)
    finally:
        await store.close()


def _loaded(app: Any) -> bool:
    return isinstance(app.screen, ThreadScreen) and app.screen.loaded


async def test_opening_a_long_thread_reads_and_mounts_only_its_newest_page(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _file(path, "long", _turns(3000))
    app = make_app(fast_session(path=path))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_text(pilot, "prompt 0")  # the picker lists it with its first prompt
        await pilot.press("enter")
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        await wait_for_text(pilot, "prompt 2997")  # the newest message, in view
        transcript = app.screen.query_one(Transcript)
        assert transcript.shown_count <= WINDOW and len(transcript.held) <= WINDOW
        follower = app.screen._follower
        assert follower is not None and len(follower.model.messages) <= WINDOW and follower.model.count == 3000
        assert f"{3000 - len(transcript.held):,} earlier messages hidden" in str(transcript.query_one("#earlier").label)


async def test_scrolling_up_pages_in_every_earlier_message_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    messages = _turns(4 * WINDOW + 7)
    await _file(path, "t", messages)
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        transcript = app.screen.query_one(Transcript)
        await wait_for(pilot, lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y)
        assert transcript.has_earlier and len(transcript.held) < len(messages)
        rounds = 0
        while transcript.has_earlier:
            rounds += 1
            assert rounds < 50, "paging in never ended"
            shown = transcript.shown_count
            transcript.scroll_to(y=0, animate=False, immediate=True)
            await wait_for(pilot, lambda shown=shown: transcript.shown_count > shown, what="an earlier page mounted")
            # The view stays where the user was reading: not at the top of what was paged in.
            await pilot.pause(0.1)
            assert transcript.scroll_y > 0 or not transcript.has_earlier
        dump = codec.encode
        assert [dump(m) for m in transcript.held] == [dump(m) for m in messages], "every message once, in order"
        assert transcript.shown_count == len(messages)
        users = [str(v.render()) for v in transcript.query(UserMessageView)]
        assert len(users) == len(range(0, len(messages), 3))
        assert all(f"prompt {i}" in users[k] for k, i in enumerate(range(0, len(messages), 3)))
        assert len(transcript.query(AssistantMessageView)) == len(range(1, len(messages), 3))
        assert not transcript.query(ToolResultView), "every result shown inside its call, none alone"
        calls = list(transcript.query(ToolCallView))
        assert [c.status for c in calls].count("ok") == len(range(2, len(messages), 3))


async def test_the_e_key_reads_earlier_pages_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    messages = [user_text(f"question {i}") for i in range(3 * WINDOW)]
    await _file(path, "t", messages, runs=())
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        transcript = app.screen.query_one(Transcript)
        assert len(transcript.held) == WINDOW
        await pilot.press("e")
        await wait_for(pilot, lambda: transcript.shown_count == 2 * WINDOW, what="a page read and mounted")
        await wait_for_text(pilot, f"question {2 * WINDOW - 1}")
        assert [m.text for m in transcript.held] == [f"question {i}" for i in range(WINDOW, 3 * WINDOW)]  # type: ignore[union-attr]


async def test_a_long_crashed_thread_shows_what_the_whole_thread_says(tmp_path: Path) -> None:
    """A call left without a result at the start, an unreadable row in the middle, a
    thousand messages after them: the banner, the plan and the totals are the whole
    thread's, though only its newest page was decoded."""
    path = tmp_path / "threads.sqlite"
    early = AssistantMessage(
        content=[ToolCall(id="early", name="deploy", arguments={"env": "prod"})], stop_reason="tool_use", run_id="r1"
    )
    head: list[AnyMessage] = [user_text("deploy it", run_id="r1"), early, user_text("go on", run_id="r1")]
    tail: list[AnyMessage] = []
    for i in range(500):
        tail.append(
            AssistantMessage(
                content=[TextContent(text=f"reply {i}")], usage=Usage(input_tokens=10, output_tokens=3), run_id="r1"
            )
        )
        tail.append(user_text(f"again {i}", run_id="r1"))
    await _file(path, "crashed", head)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO messages (thread_id, message_json, run_id) VALUES ('crashed', '{torn', 'r1')")
    db.close()
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        await store.append("crashed", tail)
    finally:
        await store.close()
    data = await _stored(path, "crashed")
    whole = diagnose(data.messages, data.runs, data.journal, problems=data.problems, pending=data.pending_request)
    assert whole.state is ThreadState.CRASHED and [d.call.id for d in whole.dangling] == ["early"]

    app = make_app(fast_session(path=path), thread_id="crashed")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        assert screen.diagnosis == whole and screen.diagnosis.repairs == whole.repairs
        assert len(screen.transcript.held) <= WINDOW, "the early call and the bad row are not in the page"
        await wait_for_text(pilot, "Row 4 could not be read")  # drawn on the next refresh
        text = screen_text(app)
        assert whole.label.split(" · ")[0] in text and "1 unreadable row" in text
        assert "5,000 in / 1,500 out" in text, "the whole thread's tokens"
        await pilot.press("r")
        await wait_for_text(pilot, "deploy (early)")  # the resume plan names the early call


async def test_totals_grow_with_each_message_read_later(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    messages = _turns(3 * WINDOW)
    await _file(path, "t", messages)
    total_in = sum(m.usage.input_tokens for m in messages if isinstance(m, AssistantMessage) and m.usage)
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        await wait_for_text(pilot, f"{total_in:,} in / {7 * WINDOW:,} out")
        store = await SQLiteCheckpointer.open(path, create=False)
        try:
            await store.append(
                "t",
                [AssistantMessage(content=[TextContent(text="late")], usage=Usage(input_tokens=1, output_tokens=1))],
            )
        finally:
            await store.close()
        await wait_for_text(pilot, f"{total_in + 1:,} in / {7 * WINDOW + 1:,} out")


@pytest.fixture
def decodes() -> Iterator[DecodeCount]:
    """Counts the messages decoded whole (:func:`tests.helpers.decodes.counting_decodes`)."""
    with counting_decodes() as count:
        yield count


async def test_messages_decoded_on_open_do_not_grow_with_the_thread(tmp_path: Path, decodes: DecodeCount) -> None:
    counts = {}
    for size in (1000, 10_000):
        path = tmp_path / f"t{size}.sqlite"
        await _file(path, "t", _turns(size))
        decodes.rows = 0
        app = make_app(fast_session(path=path), thread_id="t")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda app=app: _loaded(app), timeout=120, what="loaded")
            counts[size] = decodes.rows
            assert app.screen._follower.model.count == size  # type: ignore[attr-defined]
    assert counts[1000] > 0, "the page itself is decoded"
    assert counts[10_000] <= 2 * counts[1000], counts


async def test_a_page_that_does_not_fill_the_view_pages_more_in(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _file(path, "t", [user_text(f"short {i}") for i in range(10 * WINDOW)], runs=())
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(120, 160)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        transcript = app.screen.query_one(Transcript)
        await wait_for(
            pilot,
            lambda: transcript.virtual_size.height > transcript.scrollable_content_region.height,
            what="the view filled",
        )
        assert WINDOW < transcript.shown_count < 10 * WINDOW, "more than one page, not the whole thread"
        assert [m.text for m in transcript.held] == [
            f"short {i}" for i in range(10 * WINDOW - len(transcript.held), 10 * WINDOW)
        ]  # type: ignore[union-attr]


async def test_a_store_error_while_paging_in_is_one_sentence_and_loses_nothing() -> None:
    from core.checkpoint.memory import MemoryCheckpointer
    from core.errors import StoreBusyError

    class Flaky(MemoryCheckpointer):
        fail = False

        async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> Any:
            if self.fail and before is not None:
                self.fail = False
                raise StoreBusyError("The database is busy; try again.")
            return await super().load_page(thread_id, before=before, limit=limit)

    store = Flaky()
    await store.append("t", [user_text(f"line {i}") for i in range(3 * WINDOW)])
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        transcript = app.screen.query_one(Transcript)
        store.fail = True
        await pilot.press("e")
        await wait_for(
            pilot, lambda: any("The database is busy" in n.message for n in app._notifications), what="the notice"
        )
        assert transcript.shown_count == WINDOW and transcript.has_earlier
        await pilot.press("e")
        await wait_for(pilot, lambda: transcript.shown_count == 2 * WINDOW, what="the page read on the next try")
        assert [m.text for m in transcript.held] == [f"line {i}" for i in range(WINDOW, 3 * WINDOW)]  # type: ignore[union-attr]


def _long_outputs(count: int) -> list[AnyMessage]:
    """:func:`_turns` with 12-line tool outputs: a screenful is a few turns, not a window."""
    out = _turns(count)
    for i, message in enumerate(out):
        if isinstance(message, ToolResultMessage):
            lines = "\n".join(f"line {n} of {message.tool_call_id}" for n in range(12))
            out[i] = ToolResultMessage(
                tool_call_id=message.tool_call_id, content=[TextContent(text=lines)], run_id="r1"
            )
    return out


async def test_a_page_shows_its_tail_first_and_mounts_its_whole_window_after(tmp_path: Path) -> None:
    """The views above the first screenful are mounted after the first frame: in the end
    every entry of the page is mounted, in store order, each call at least as tall as its
    estimate, and the tail is what is in view."""
    path = tmp_path / "threads.sqlite"
    messages = _long_outputs(3 * WINDOW)
    await _file(path, "long", messages)
    app = make_app(fast_session(path=path), thread_id="long")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: _loaded(app), what="loaded")
        transcript = app.screen.query_one(Transcript)
        page = list(transcript.held)
        calls = [c.id for m in page if isinstance(m, AssistantMessage) for c in m.content if isinstance(c, ToolCall)]
        await wait_for(
            pilot, lambda: [v.call_id for v in transcript.query(ToolCallView)] == calls, what="the whole window mounted"
        )
        assert transcript.shown_count == len(page) == WINDOW
        assert [v.call_id for v in transcript.query(ToolCallView)] == calls
        assert len(transcript.query(UserMessageView)) == sum(m.role == "user" for m in page)  # type: ignore[union-attr]
        # A view mounted last is measured on the next layout: wait for it, then compare.
        await wait_for(
            pilot, lambda: all(v.outer_size.height for v in transcript.query(ToolCallView)), what="the views laid out"
        )
        for view in transcript.query(ToolCallView):
            assert view.outer_size.height >= view.rows_at_least
        await wait_for_text(pilot, "line 11 of c58")  # the newest call's output ends the view
        assert "prompt 57" in screen_text(app)
