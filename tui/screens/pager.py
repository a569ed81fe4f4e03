"""PagerScreen: the whole output of one tool call, wrapped to the screen, searchable.

| Key | Action |
| :- | :- |
| / | search, smart case (Enter finds the first match from the top of the screen) |
| n / N | next / previous match (wraps around the ends) |
| ↑ ↓ PgUp PgDn Home End | scroll |
| Escape, q | close the search box, else the pager |

The output may be 50,000 lines or 2 MB without a newline. :class:`OutputView` is a Line
API widget (Textual's ``ScrollView``): it keeps the lines as strings (``\\r`` frames
collapsed and cleaned once, by :func:`tui.tool_output.output_chunks`, a chunk at a time
between which the event loop runs), an index of where each screen row starts (rebuilt
when the width changes), and draws only the rows on screen, so drawing and scrolling
cost the same at any length; a search reads the lines once.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from array import array
from bisect import bisect_right

from rich.cells import cell_len, get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from tui.text import literal
from tui.tool_output import output_chunks

__all__ = ["MATCH_COUNT_LIMIT", "OutputView", "PagerScreen"]

READ_LAYOUT_INTERVAL = 0.1
"""Seconds between layouts while the output is read: a new virtual size lays out the whole
screen (the transcript, for an expanded call), which costs more than reading a chunk, so
the rows read meanwhile are drawn when it next comes (and when reading ends)."""

MATCH_COUNT_LIMIT = 10_000
"""Matches counted for the status line; beyond it the count reads "10,000+" (counting every
"e" of 2 MB would cost more than it tells)."""


def _row_starts(line: str, width: int) -> list[int]:
    """Where each screen row of ``line`` starts (character offsets) when wrapped at ``width`` cells."""
    if len(line) <= width and (line.isascii() or cell_len(line) <= width):
        return [0]
    if line.isascii():
        return list(range(0, len(line), width))
    starts = [0]
    column = 0
    for index, char in enumerate(line):
        cells = get_character_cell_size(char)
        if column + cells > width and column:
            starts.append(index)
            column = 0
        column += cells
    return starts


class Rows:
    """Where the screen rows of some lines start, wrapped at one width: per row its line
    and its first character (``line``, ``start``), per line its first row (``first``)."""

    def __init__(self) -> None:
        self.line = array("q")
        self.start = array("q")
        self.first = array("q")

    def __len__(self) -> int:
        return len(self.line)

    def add(self, lines: list[str], number: int, width: int) -> None:
        """Append the rows of ``lines``, the lines numbered ``number`` on. Lines that fit a
        row (most of a log) are added in bulk: 50,000 short lines cost a few array
        operations, not a Python loop each."""
        if max(map(len, lines), default=0) <= width and all(map(str.isascii, lines)):
            special: list[int] = []  # the common case, found at C speed
        else:
            special = [i for i, line in enumerate(lines) if len(line) > width or not line.isascii()]
        done = 0  # lines before this one are added
        for index in [*special, len(lines)]:
            if index > done:  # lines done..index-1 fit one row each
                self.first.extend(range(len(self.line), len(self.line) + index - done))
                self.line.extend(range(number + done, number + index))
                self.start.frombytes(bytes(8 * (index - done)))
            if index == len(lines):
                break
            starts = _row_starts(lines[index], width)
            self.first.append(len(self.line))
            self.line.extend(itertools.repeat(number + index, len(starts)))
            self.start.extend(starts)
            done = index + 1

    def end(self, row: int, line: str) -> int:
        """Where ``row`` (a row of ``line``) ends: the next row's start, or the line's end."""
        if row + 1 < len(self.line) and self.line[row + 1] == self.line[row]:
            return self.start[row + 1]
        return len(line)


class OutputView(ScrollView, can_focus=True):
    """A tool's output drawn a screen row at a time, wrapped at the view's width, with the
    matches of :attr:`pattern` highlighted (:attr:`current` the strongest).

    ``raw`` is the untrusted output: once mounted the view reads it a chunk at a time
    (:func:`tui.tool_output.output_chunks`: frames collapsed, cleaned), yielding to the
    event loop between chunks, and shows what it has read so far; :attr:`loaded` tells
    when all is read. Rows are character ranges of a line: a row never splits a character,
    a wide character that does not fit moves to the next row.
    """

    COMPONENT_CLASSES = {"output-view--match", "output-view--current"}

    DEFAULT_CSS = """
    OutputView {
        overflow-x: hidden;
        scrollbar-gutter: stable;
        & > .output-view--match { background: $warning 35%; }
        & > .output-view--current { background: $accent; color: $text; text-style: bold; }
    }
    """

    class Moved(Message):
        """The view scrolled, re-wrapped or read more: what it shows changed."""

    def __init__(
        self, raw: str, *, id: str | None = None, classes: str | None = None, max_rows: int | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.max_rows = max_rows
        """When set, the view is as tall as its rows, up to this many (then it scrolls)."""
        self.lines: list[str] = []
        """The lines read so far, cleaned."""
        self.pattern: re.Pattern[str] | None = None
        self.current: tuple[int, int, int] | None = None
        """The current match: (line, start, end) in characters."""
        self._raw = raw
        self._done = asyncio.Event()
        self._rows = Rows()
        self._wrapped_at = 0

    @property
    def loaded(self) -> bool:
        """Whether the whole output has been read."""
        return self._done.is_set()

    async def wait_loaded(self) -> None:
        """Return once the whole output has been read."""
        await self._done.wait()

    def on_mount(self) -> None:
        self.run_worker(self._read(), name="read output", group="read", exit_on_error=False)

    async def _read(self) -> None:
        shown_at = 0.0  # when the rows read so far were last laid out
        try:
            for lines in output_chunks(self._raw):
                number = len(self.lines)
                self.lines.extend(lines)
                if self._wrapped_at:
                    self._rows.add(lines, number, self._wrapped_at)
                    now = time.monotonic()
                    if now - shown_at >= READ_LAYOUT_INTERVAL:
                        self._laid_out()
                        shown_at = now
                await asyncio.sleep(0)  # let keys and frames through between chunks
        finally:
            self._raw = ""  # the caller keeps the output; this view needs only its lines
            self._done.set()
            if self._wrapped_at:
                self._laid_out()
            else:
                self.post_message(self.Moved())

    # --- layout -------------------------------------------------------------------------------

    @property
    def wrap_width(self) -> int:
        """Cells a row holds: the view's width less its scrollbar gutter."""
        return max(self.scrollable_content_region.width, 1)

    @property
    def row_count(self) -> int:
        """Screen rows of the lines read so far, at the current width."""
        return len(self._rows)

    def on_resize(self) -> None:
        # Also the first layout: the width is known only from then on.
        self._wrap()
        # Taller or shorter (the search box docked below it, then hidden) shows other rows
        # even when the width, so the wrapping, stayed: whoever says which rows must hear it.
        self.post_message(self.Moved())

    def _wrap(self) -> None:
        if self.scrollable_content_region.width <= 0:
            return  # not laid out yet: wrapping at one cell would make a row per character
        width = self.wrap_width
        if width == self._wrapped_at:
            return
        top = self.top_position()
        rows = Rows()
        rows.add(self.lines, 0, width)
        self._rows, self._wrapped_at = rows, width
        self._laid_out()
        if top is not None:
            self.scroll_to(y=self.row_of(*top), animate=False, immediate=True)

    def _laid_out(self) -> None:
        """The rows changed (more lines, another width): size, height and redraw follow."""
        self.virtual_size = Size(self._wrapped_at, len(self._rows))
        self._fit_height()
        self.refresh()
        self.post_message(self.Moved())

    def limit_rows(self, max_rows: int) -> None:
        """Make the view at most ``max_rows`` tall from now on (see :attr:`max_rows`)."""
        if max_rows != self.max_rows:
            self.max_rows = max_rows
            self._fit_height()

    def _fit_height(self) -> None:
        if self.max_rows is not None:
            self.styles.height = max(1, min(len(self._rows), self.max_rows))

    def row_of(self, line: int, column: int) -> int:
        """The screen row showing character ``column`` of ``line`` (0 when there are no lines)."""
        rows = self._rows
        if line >= len(rows.first):
            return 0
        first = rows.first[line]
        last = rows.first[line + 1] if line + 1 < len(rows.first) else len(rows)
        return max(first, bisect_right(rows.start, column, first, last) - 1)

    def top_position(self) -> tuple[int, int] | None:
        """(line, character) at the top of the view, or ``None`` before the first wrap."""
        rows = self._rows
        if not len(rows):
            return None
        row = min(round(self.scroll_y), len(rows) - 1)
        return rows.line[row], rows.start[row]

    def shown_rows(self) -> tuple[int, int]:
        """The first and last screen row (0-based) on screen; (0, -1) when empty."""
        rows = self._rows
        if not len(rows):
            return 0, -1
        top = min(round(self.scroll_y), len(rows) - 1)
        return top, min(top + max(self.scrollable_content_region.height, 1), len(rows)) - 1

    def shown_lines(self) -> tuple[int, int]:
        """The first and last line (0-based) with a row on screen; (0, -1) when empty."""
        top, bottom = self.shown_rows()
        if bottom < 0:
            return 0, -1
        return self._rows.line[top], self._rows.line[bottom]

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Moved())

    def show_match(self, match: tuple[int, int, int]) -> None:
        """Make ``match`` current and scroll it to the middle of the view, unless it is on screen."""
        self.current = match
        row = self.row_of(match[0], match[1])
        top = round(self.scroll_y)
        height = max(self.scrollable_content_region.height, 1)
        if not top <= row < top + height:
            self.scroll_to(y=max(row - height // 2, 0), animate=False, immediate=True)
        self.refresh()
        self.post_message(self.Moved())

    # --- drawing ------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.wrap_width
        base = self.rich_style
        row = self.scroll_offset.y + y
        rows = self._rows
        if row >= len(rows):
            return Strip.blank(width, base)
        number = rows.line[row]
        line = self.lines[number]
        start = rows.start[row]
        end = rows.end(row, line)
        return Strip(self._segments(number, line, start, end, base)).adjust_cell_length(width, base)

    def _segments(self, number: int, line: str, start: int, end: int, base: Style) -> list[Segment]:
        if self.pattern is None or start == end:
            return [Segment(line[start:end], base)]
        match_style = base + self.get_component_rich_style("output-view--match", partial=True)
        current_style = base + self.get_component_rich_style("output-view--current", partial=True)
        reach = max(len(self.pattern.pattern), 1)  # an escaped literal: at most this many characters
        segments: list[Segment] = []
        at = start
        for found in self.pattern.finditer(line, max(start - reach, 0), min(end + reach, len(line))):
            left, right = max(found.start(), start), min(found.end(), end)
            if right <= left:
                continue
            if left > at:
                segments.append(Segment(line[at:left], base))
            is_current = self.current is not None and self.current[:2] == (number, found.start())
            segments.append(Segment(line[left:right], current_style if is_current else match_style))
            at = right
        if at < end:
            segments.append(Segment(line[at:end], base))
        return segments

    # --- searching ----------------------------------------------------------------------------

    def find(self, line: int, column: int, *, forward: bool = True) -> tuple[tuple[int, int, int] | None, bool]:
        """The first match of :attr:`pattern` starting after (``forward``) or before ``column``
        of ``line``, going round the ends; and whether it went round. ``(None, False)`` when
        nothing matches. Reads each line at most once (plus ``line`` twice)."""
        if self.pattern is None or not self.lines:
            return None, False
        count = len(self.lines)
        line = min(max(line, 0), count - 1)
        for step in range(count + 1):
            number = (line + step) % count if forward else (line - step) % count
            text = self.lines[number]
            if forward:
                found = self.pattern.search(text, column + 1 if step == 0 else 0)
                if found and step == count and found.start() > column:
                    found = None
            else:
                found = None
                limit = column if step == 0 else len(text) + 1
                for candidate in self.pattern.finditer(text):
                    if candidate.start() >= limit:
                        break
                    found = candidate
                if found and step == count and found.start() < column:
                    found = None
            if found:
                wrapped = number < line if forward else number > line
                if step == count:
                    wrapped = True
                return (number, found.start(), found.end()), wrapped
        return None, False

    def count_matches(self) -> int:
        """Matches of :attr:`pattern` in the whole text, counted up to :data:`MATCH_COUNT_LIMIT` + 1."""
        if self.pattern is None:
            return 0
        pattern = self.pattern
        found = itertools.chain.from_iterable(pattern.finditer(line) for line in self.lines)
        return sum(1 for _ in itertools.islice(found, MATCH_COUNT_LIMIT + 1))


SEARCH_HINT = "Find: any case, unless you type a capital (Enter searches, Escape cancels)"
"""The search box's placeholder: it says the smart case of :func:`search_pattern`."""


def search_pattern(query: str) -> re.Pattern[str]:
    """``query`` as a literal pattern: case-insensitive unless it holds a capital ("smart
    case", as in less and vim), so ``error`` finds ``Error`` and ``Error`` finds only it."""
    flags = 0 if any(char.isupper() for char in query) else re.IGNORECASE
    return re.compile(re.escape(query), flags)


class PagerScreen(Screen[None]):
    """The whole ``raw`` output of a tool call (``title`` names the call), searchable.

    ``raw`` is untrusted: its ``\\r`` frames are collapsed and every line cleaned
    (:func:`tui.tool_output.output_chunks`) before anything is drawn. See the module for the keys.
    """

    BINDINGS = [
        Binding("slash", "search", "Search", id="pager.search", tooltip="Find text in the output"),
        Binding("n", "next", "Next", id="pager.next", tooltip="The next match"),
        Binding("N", "previous", "Previous", id="pager.previous", tooltip="The previous match"),
        Binding("escape,q", "close", "Close", id="pager.close", tooltip="Close the search box, else the pager"),
    ]

    DEFAULT_CSS = """
    PagerScreen {
        #pager-title { height: 1; background: $panel; padding: 0 1; }
        #pager-view { height: 1fr; padding: 0 1; }
        #pager-search { dock: bottom; display: none; margin-bottom: 2; }
        #pager-status { height: 1; color: $text-muted; padding: 0 1; }
    }
    """

    def __init__(self, title: str, raw: str) -> None:
        super().__init__()
        self._title = title
        self.view = OutputView(raw, id="pager-view")
        self._said = ""

    def compose(self) -> ComposeResult:
        yield Static(literal(self._title, style="bold"), id="pager-title")
        yield self.view
        yield Input(placeholder=SEARCH_HINT, id="pager-search")
        yield Static(id="pager-status")
        yield Footer()

    def on_mount(self) -> None:
        self.view.focus()

    @property
    def search_box(self) -> Input:
        """The search input (shown by ``/``)."""
        return self.query_one("#pager-search", Input)

    # --- keys ---------------------------------------------------------------------------------

    def action_search(self) -> None:
        """Show the search box."""
        box = self.search_box
        box.display = True
        box.focus()

    def action_close(self) -> None:
        """Close the search box if it is open, else the pager."""
        box = self.search_box
        if box.display:
            box.display = False
            self.view.focus()
            return
        self.dismiss(None)

    async def action_next(self) -> None:
        """Go to the next match."""
        await self._step(forward=True)

    async def action_previous(self) -> None:
        """Go to the previous match."""
        await self._step(forward=False)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        query = event.value
        self.search_box.display = False
        self.view.focus()
        if not self.view.loaded:
            self._said = f"reading the output to search for {query}…"
            self._show_status()
            await self.view.wait_loaded()  # a search covers the whole output
        if not query:
            self.view.pattern, self.view.current = None, None
            self._said = ""
            self.view.refresh()
            self._show_status()
            return
        self.view.pattern, self.view.current = search_pattern(query), None
        top = self.view.top_position() or (0, 0)
        found, _ = self.view.find(top[0], top[1] - 1)
        if found is None:
            capital = self.view.pattern.flags & re.IGNORECASE == 0
            self._said = f"not found: {query}" + (" (case-sensitive: it has a capital)" if capital else "")
            self.view.refresh()
            self._show_status()
            return
        count = self.view.count_matches()
        many = f"{MATCH_COUNT_LIMIT:,}+" if count > MATCH_COUNT_LIMIT else f"{count:,}"
        self._said = f"{many} {'match' if count == 1 else 'matches'} for {query}"
        self.view.show_match(found)

    async def _step(self, *, forward: bool) -> None:
        view = self.view
        if view.pattern is None:
            self.notify("Press / to search first.", timeout=3)
            return
        await view.wait_loaded()
        if view.current is not None:
            line, column = view.current[0], view.current[1]
        else:
            top = view.top_position() or (0, 0)
            line, column = top[0], top[1] - 1 if forward else top[1]
        found, wrapped = view.find(line, column, forward=forward)
        if found is None:
            return
        if wrapped:
            self.notify("Search went round to the " + ("top." if forward else "bottom."), timeout=2)
        view.show_match(found)

    # --- status -------------------------------------------------------------------------------

    def on_output_view_moved(self) -> None:
        self._show_status()

    def _show_status(self) -> None:
        view = self.view
        first, last = view.shown_lines()
        count = len(view.lines)
        if last >= 0:
            status = Text(
                f"line {first + 1:,} of {count:,}"
                if first == last
                else f"lines {first + 1:,}–{last + 1:,} of {count:,}"
            )
            if view.row_count > count:
                # Lines wrap: a 2 MB line is "line 1 of 1" wherever one is in it, so say the rows too.
                top, bottom = view.shown_rows()
                status.append(f", rows {top + 1:,}–{bottom + 1:,} of {view.row_count:,}")
        else:
            status = Text("no output" if view.loaded else "reading…")
        if not view.loaded and count:
            status.append(" so far (reading…)")
        if view.current is not None:
            status.append(f" · match at line {view.current[0] + 1:,}")
        if self._said:
            status.append(" · ")
            status.append_text(literal(self._said))
        self.query_one("#pager-status", Static).update(status)
