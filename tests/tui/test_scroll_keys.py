"""Paging through a thread: every PageUp and ``e`` of a burst counts, and entries paged in
above the view never move what the user reads (scroll anchoring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.geometry import Region
from textual.widget import Widget

from bench.fill import fill_long_thread
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import user_text
from tests.helpers.tui import burst, fast_session, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.message_view import UserMessageView
from tui.widgets.transcript import WINDOW, Transcript


async def _file(path: Path, count: int, *, lines: int = 1) -> None:
    """A thread ``t`` of ``count`` prompts, each ``lines`` lines long: views whose height is
    known at their mount, so rows can be counted exactly."""
    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        text = "\n".join(f"line {n}" for n in range(1, lines))
        await store.append("t", [user_text(f"prompt {i}\n{text}".rstrip()) for i in range(count)])
    finally:
        await store.close()


async def _opened(pilot: Any, thread_id: str = "t") -> Transcript:
    """The transcript of the thread the app opened, at its end, laid out, focused."""
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
    transcript = app.screen.query_one(Transcript)
    await wait_for(
        pilot, lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y, what="at end"
    )
    transcript.focus()
    await pilot.pause()
    return transcript


def _below(transcript: Transcript) -> float:
    """Rows of content below the view: entries mounted above do not change it, scrolling does."""
    return transcript.max_scroll_y - transcript.scroll_y


async def test_a_burst_of_page_ups_moves_a_page_per_key_in_a_short_thread(tmp_path: Path) -> None:
    """18 messages, all mounted: the tester's burst moved one page, whatever its length."""
    path = tmp_path / "threads.sqlite"
    await _file(path, 18, lines=6)
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await _opened(pilot)
        assert not transcript.has_earlier
        page = transcript.scrollable_content_region.height
        await burst(pilot, "pageup", 3)
        await pilot.wait_for_scheduled_animations()
        assert _below(transcript) == 3 * page
        await burst(pilot, "pagedown", 1)
        await pilot.wait_for_scheduled_animations()
        assert _below(transcript) == 2 * page


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_a_burst_of_page_ups_pages_history_in_and_moves_a_page_per_key(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Twenty PageUps at once on a long thread: the view ends twenty pages above the end,
    earlier pages read and mounted on the way (the keys past the top wait for them; at
    200x50 the very first one does, from the view pinned to the end)."""
    path = tmp_path / "threads.sqlite"
    await _file(path, 3000)
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=size) as pilot:
        transcript = await _opened(pilot)
        page = transcript.scrollable_content_region.height
        await burst(pilot, "pageup", 20)
        await wait_for(pilot, lambda: _below(transcript) >= 20 * page, what="twenty pages up")
        await pilot.pause(0.2)  # a bounded look: nothing may move it on
        assert _below(transcript) == 20 * page
        assert transcript.shown_count > WINDOW and transcript.has_earlier


async def test_a_burst_of_e_shows_a_window_per_key(tmp_path: Path) -> None:
    """Each ``e`` of a burst mounts another window (an exclusive worker dropped all but one)."""
    path = tmp_path / "threads.sqlite"
    await _file(path, 3000)
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await _opened(pilot)
        await burst(pilot, "e", 10)
        await wait_for(pilot, lambda: transcript.shown_count >= 11 * WINDOW, what="ten windows more")
        await pilot.pause(0.2)  # a bounded look: no other window comes
        assert transcript.shown_count == 11 * WINDOW
        assert [m.text for m in transcript.held[-11 * WINDOW :]] == [  # type: ignore[union-attr]
            f"prompt {i}" for i in range(3000 - 11 * WINDOW, 3000)
        ]
        # In view: the screenful above the first entry of the window before the last.
        first = transcript.query(UserMessageView)[WINDOW]
        assert first.region.y >= transcript.content_region.bottom - 1
        assert transcript.query(UserMessageView)[WINDOW - 1].region.y < transcript.content_region.bottom


async def test_paging_in_history_keeps_the_entry_in_view_on_its_row(tmp_path: Path) -> None:
    """The tester's case: the benchmark thread (replies with tool output laid out after
    their mount), PageUp after PageUp until one pages history in. In every frame from that
    page-in's mount on, the entry that was at the top of the view is on the same row: no
    frame shows the view pushed down, then put back."""
    path = tmp_path / "threads.sqlite"
    await fill_long_thread(path, 2000, "t")
    app = make_app(fast_session(path=path), thread_id="t")
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await _opened(pilot)
        frames: list[tuple[int, dict[Widget, Region]]] = []

        def laid_out(_screen: object) -> None:
            # Where the compositor just placed each entry (on screen or not).
            placed = {c: c.region for c in transcript.children if c.id != "earlier" and c.region.height}
            frames.append((transcript.shown_count, placed))

        app.screen.screen_layout_refresh_signal.subscribe(transcript, laid_out)
        page = transcript.scrollable_content_region.height
        shown = transcript.shown_count
        for _ in range(30):
            await pilot.pause()
            frames.clear()
            laid_out(None)  # the view as it is before the key
            scroll = transcript.scroll_y
            await pilot.press("pageup")
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            if transcript.shown_count > shown:
                break
        await wait_for(pilot, lambda: not transcript._paging, what="the page in")
        await pilot.pause(0.3)  # a bounded look at the frames after it
        before = frames[0][1]
        view_top = transcript.content_region.y
        top = min((v for v, r in before.items() if r.bottom > view_top), key=lambda v: before[v].y)
        rows = [placed[top].y for count, placed in frames if count > shown]
        # The key moves the view a page up (the rows above the mounted entries once they
        # are paged in); the frames on the way never show it further, nor back down.
        assert rows and scroll < page
        assert rows == sorted(rows) and rows[-1] == before[top].y + page, f"what was in view moved: {rows}"
