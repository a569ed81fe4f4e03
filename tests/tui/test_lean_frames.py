"""A frame of a streaming reply is laid out once, indexes the reply in a number of squares
that does not grow with it, and its containers' blank lines are the ones Textual renders
(tui.widgets.lean_frames; issue 10: keys waited behind frames)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rich.segment import Segment
from textual import _compositor
from textual._spatial_map import SpatialMap
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from core.messages import AssistantMessage, TextContent, Usage, user_text
from tui.widgets.frozen_paragraph import FrozenParagraph
from tui.widgets.lean_frames import BlankLines
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.transcript import Transcript

TEXT = "".join(f"w{i % 97:02d} " for i in range(100_000))
"""The bench's reply: words without a line break (400 kB)."""


def _reply(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], model_id="paced-1", timestamp=1.7e9, usage=Usage())


class _Thread(App[None]):
    def compose(self) -> ComposeResult:
        yield Transcript()


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts full layouts (``Compositor.reflow``) and spatial-map entries (a child entered
    in one square) from here on."""
    counts = {"layouts": 0, "entries": 0}
    reflow = _compositor.Compositor.reflow
    squares = SpatialMap._region_to_grid_coordinates

    def counted_reflow(self: Any, *args: Any) -> Any:
        counts["layouts"] += 1
        return reflow(self, *args)

    def counted_squares(self: Any, region: Region) -> list[tuple[int, int]]:
        found = list(squares(self, region))
        counts["entries"] += len(found)
        return found

    monkeypatch.setattr(_compositor.Compositor, "reflow", counted_reflow)
    monkeypatch.setattr(SpatialMap, "_region_to_grid_coordinates", counted_squares)
    yield counts


async def _stream(pilot: Any, transcript: Transcript, sent: int, upto: int, flush: int) -> int:
    while sent < upto:
        sent += flush
        await transcript.sync_reply(_reply(TEXT[:sent]))
        await pilot.pause()
    return sent


async def test_a_flush_is_laid_out_once_and_indexes_as_much_at_any_reply_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4,000 characters a flush (5,000 tok/s at five flushes a second), the view pinned to the
    end: ten flushes at 40 kB and ten at 360 kB take one full layout each (Textual asked for
    a second one per flush), and the children they enter in spatial-map squares stay few
    (with Textual's 20-row squares that count grew with the reply's height, ~1,500 entries a
    flush at 360 kB; here ~50, from ~25 at 40 kB)."""
    flush = 4_000
    app = _Thread()
    figures: list[dict[str, int]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        transcript = app.query_one(Transcript)
        await transcript.show([user_text(f"prompt {i}") for i in range(10)])
        await pilot.pause()
        sent = 0
        for length in (40_000, 360_000):
            sent = await _stream(pilot, transcript, sent, length, flush)
            with _counting(monkeypatch) as counts:
                sent = await _stream(pilot, transcript, sent, sent + 10 * flush, flush)
                figures.append(dict(counts))
            monkeypatch.undo()
        assert transcript.scroll_y == transcript.max_scroll_y > 2_500  # pinned, the reply ~3,000 rows
        rows = transcript.virtual_size.height
    short, long = figures
    assert 10 <= short["layouts"] <= 11 and 10 <= long["layouts"] <= 11, figures
    # Textual's 20-row squares: the reply entered rows / 20 times (and more) in each of the
    # five containers that hold it, on every flush. Coarse squares: a few per container.
    assert long["entries"] / 10 < rows / 20, (figures, rows)
    assert long["entries"] <= 3 * short["entries"], figures


def _cells(strips: list[Strip]) -> list[list[tuple[str, Any]]]:
    """Each line as (text, style) runs, neighbours of one style joined (how a line is cut
    into segments does not show)."""
    return [[(s.text, s.style) for s in Segment.simplify(strip)] for strip in strips]


@pytest.mark.parametrize("width", [120, 60])
async def test_the_blank_lines_of_a_reply_s_containers_are_the_ones_textual_renders(width: int) -> None:
    """Every :class:`BlankLines` widget on a screen showing a streamed reply (the transcript
    with its padding, the reply, its document and sections) gives, for its whole region, the
    lines Textual's own styles cache renders for it: same text, same styles."""
    app = _Thread()
    async with app.run_test(size=(width, 40)) as pilot:
        transcript = app.query_one(Transcript)
        await transcript.show([user_text("a prompt")])
        await transcript.sync_reply(_reply(TEXT[:4_000]))
        await pilot.pause()  # laid out: the next flush cuts the paragraph at this width
        await transcript.sync_reply(_reply(TEXT[:12_000]))
        await pilot.pause()
        await transcript.sync_reply(_reply(TEXT[:12_000] + "\n\n## a heading\n\n- an item\n\nmore"))
        await pilot.pause()
        await pilot.pause()
        checked: set[str] = set()
        for widget in app.screen.walk_children(Widget):
            if not isinstance(widget, BlankLines) or not widget.size.area:
                continue
            region = Region(0, 0, *widget.size)
            ours = _cells(widget.render_lines(region))
            textual = _cells(widget._styles_cache.render_widget(widget, region))
            assert ours == textual, type(widget).__name__
            checked.add(type(widget).__name__)
        assert checked == {"Transcript", "AssistantMessageView", "LiveMarkdown", "_Section"}
        assert app.query(FrozenParagraph) and app.query(LiveMarkdown)
