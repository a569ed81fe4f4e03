"""ThreadTable: the picker's list of threads, drawn a screen at a time.

A Line API widget (:class:`textual.scroll_view.ScrollView` + ``render_line``): the rows are a
Python list and only the lines on screen are rendered, so showing, updating or filtering
10,000 threads costs a pass over a list, never 10,000 widgets or cells (issue 10: Textual's
DataTable took 1.1 s to add 10,000 rows on the main thread, and measured its columns again
after every change).

Columns as the picker had them: thread, state (coloured: :func:`state_style`), msgs, last
activity (:func:`tui.text.relative_time`, aged on :meth:`ThreadTable.refresh_times`) and the
first prompt, which takes the width left (at least :data:`PROMPT_MIN` cells). The header line
stays on top while the rows scroll. Everything shown comes from the store and is untrusted:
it goes through :func:`tui.text.clean` / :func:`tui.text.literal` and is never parsed as markup.

A filter (:meth:`ThreadTable.set_filter`) keeps the rows whose id, first prompt or state
holds the text (case-insensitive), and the needs-attention toggle
(:meth:`ThreadTable.set_attention_only`) only the rows :func:`tui.attention.needs_attention`
keeps; both apply together. The cursor is an index into the rows shown. The order is the
one given (the picker puts the threads waiting for you first: :func:`tui.attention.waiting_first`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from core.recovery import ThreadState
from tui.attention import answer_to_apply, needs_attention, waiting_for_you
from tui.session import ThreadRow
from tui.text import clean, one_line, relative_time

STATE_STYLES = {
    ThreadState.COMPLETED: "green",
    ThreadState.ABORTED: "yellow",
    ThreadState.FAILED: "red",
    ThreadState.CRASHED: "bold red",
    ThreadState.EMPTY: "dim",
    ThreadState.WAITING: "bold yellow",
}
"""The colour of a state cell by the diagnosis' state (a run here is bold cyan, one
elsewhere bold magenta: :func:`state_style`)."""

ANSWERED_STYLE = "bold green"
"""The state cell of a thread whose answer is stored, not yet applied: the person's part is
done (as the status bar's "answered", :mod:`tui.widgets.status_bar`), not waiting's yellow."""

HEADINGS = ("thread", "state", "msgs", "last activity", "first prompt")
"""The column headings, left to right."""

PROMPT_MIN = 16
"""Cells the first prompt keeps however long the other columns are (the table then scrolls
sideways)."""

PROMPT_CHARS = 1_000
"""Characters of a first prompt kept for showing and filtering: wider than any terminal, and
a 2 MB prompt is not cleaned whole for every listing."""

PADDING = 1
"""Blank cells on each side of every cell (DataTable's ``cell_padding``)."""

BUILD_SLICE = 0.005
"""Seconds of making rows between two turns of the event loop: 10,000 rows took 38 ms on an
idle core and 300 ms on this loaded machine (issue 10), which no key press should wait for."""


def state_style(row: ThreadRow) -> str:
    """The colour of the row's state cell (:func:`tui.session.state_label`): bold cyan for a
    run here, bold magenta for a run elsewhere, else by the diagnosis (:data:`STATE_STYLES`).
    The text itself (a lease's host, the diagnosis' notes, a question asked) comes from
    another program: it is drawn cleaned, as a plain Text. A thread waiting for you is
    coloured as waiting whoever holds its run (:func:`tui.attention.waiting_for_you`); one
    answered, no run applying it yet, :data:`ANSWERED_STYLE`."""
    if waiting_for_you(row.diagnosis):
        return STATE_STYLES[ThreadState.WAITING]
    if row.running:
        return "bold cyan"
    if row.elsewhere:
        return "bold magenta"
    if answer_to_apply(row.diagnosis):
        return ANSWERED_STYLE
    return STATE_STYLES.get(row.diagnosis.state, "")


class _Cells:
    """One row made ready to draw and to filter, once per version of the row: the cleaned
    text of its cells (the rich Text of a line is made only when the line is drawn). What
    every row needs at once (its id and state, to measure the columns) is made here; the
    first prompt and the filter's text when first asked for: at 10,000 rows a frozen
    dataclass of everything cost 13 µs a row, 157 ms for the list. Compared and hashed by
    identity: the line cache's key."""

    __slots__ = (
        "_attention",
        "_haystack",
        "_prompt",
        "msgs",
        "row",
        "state",
        "state_width",
        "style",
        "thread",
        "thread_width",
    )

    def __init__(self, row: ThreadRow) -> None:
        self.row = row
        self.thread = clean(row.thread_id)
        self.state = clean(row.state)
        self.style = state_style(row)
        self.msgs = str(row.message_count)
        self.thread_width = cell_len(self.thread)
        self._attention: bool | None = None
        self.state_width = cell_len(self.state)
        self._prompt: str | None = None
        self._haystack: str | None = None

    @property
    def prompt(self) -> str:
        """The first prompt on one line, cleaned (its first :data:`PROMPT_CHARS` characters)."""
        if self._prompt is None:
            self._prompt = one_line(self.row.first_prompt[:PROMPT_CHARS], PROMPT_CHARS)
        return self._prompt

    @property
    def attention(self) -> bool:
        """Whether the row needs attention (:func:`tui.attention.needs_attention`): asked for
        only while the needs-attention toggle is on."""
        if self._attention is None:
            self._attention = needs_attention(self.row)
        return self._attention

    @property
    def haystack(self) -> str:
        """The id, first prompt and state as shown, case-folded: what the filter searches."""
        if self._haystack is None:
            self._haystack = f"{self.thread}\n{self.prompt}\n{self.state}".casefold()
        return self._haystack


@dataclass(slots=True)
class _Target:
    """Rows given to :meth:`ThreadTable.set_rows` and being made, a slice at a time."""

    rows: list[ThreadRow]
    changed: Collection[str] | None
    before: _Target | None = None
    """The target this one took over from: what it made is used again (``spare``)."""
    made: list[_Cells] = field(default_factory=list)
    spare: dict[str, _Cells] = field(default_factory=dict)

    def __post_init__(self) -> None:
        before = self.before
        if before is not None:
            # What either call named may differ from the rows shown.
            if before.changed is None or self.changed is None:
                self.changed = None
            else:
                self.changed = {*before.changed, *self.changed}
            self.spare = {**before.spare, **{c.row.thread_id: c for c in before.made}}
            self.before = None


@dataclass(slots=True)
class _Widths:
    """How many rows have each width of thread id, state and message count, so the widest
    is known after a few rows changed without measuring all the others again."""

    thread: Counter[int]
    state: Counter[int]
    msgs: Counter[int]

    @classmethod
    def of(cls, rows: Sequence[_Cells]) -> _Widths:
        return cls(
            Counter(map(attrgetter("thread_width"), rows)),
            Counter(map(attrgetter("state_width"), rows)),
            Counter(map(len, map(attrgetter("msgs"), rows))),
        )

    def replace(self, before: _Cells, after: _Cells) -> None:
        for counter, old, new in (
            (self.thread, before.thread_width, after.thread_width),
            (self.state, before.state_width, after.state_width),
            (self.msgs, len(before.msgs), len(after.msgs)),  # digits: one cell each
        ):
            counter[old] -= 1
            if not counter[old]:
                del counter[old]
            counter[new] += 1

    def widths(self) -> tuple[int, int, int, int]:
        """The widths of the columns before the first prompt: each column's widest cell or heading."""
        return (
            max(len(HEADINGS[0]), *self.thread, 0),
            max(len(HEADINGS[1]), *self.state, 0),
            max(len(HEADINGS[2]), *self.msgs, 0),
            len(HEADINGS[3]),  # "last activity" is wider than any relative time ("2024-01-31")
        )


class ThreadTable(ScrollView, can_focus=True):
    """The picker's table of threads: rows from :meth:`set_rows`, a cursor, a filter.

    | Key | Action |
    | :- | :- |
    | enter | open the thread under the cursor (:class:`Selected`) |
    | up / down, page up / page down | move the cursor |
    | home / end | first / last row |

    A click moves the cursor; a click on the row under the cursor opens it.
    ``builds`` counts the rows made ready to draw since the table was created (each row
    once per version of it: a change that names one thread builds one row); ``rendered``
    counts the lines drawn. Both exist so that tests can count work, not time it.
    """

    COMPONENT_CLASSES = {
        "thread-table--header",
        "thread-table--cursor",
        "thread-table--hover",
        "thread-table--even-row",
        "thread-table--odd-row",
    }

    # The look of Textual's DataTable (8.2.8), which the picker used before.
    DEFAULT_CSS = """
    ThreadTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .thread-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .thread-table--header {
                background-tint: $foreground 5%;
            }
        }
        &:dark > .thread-table--even-row {
            background: $surface-darken-1 40%;
        }
        & > .thread-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        &:ansi > .thread-table--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
        & > .thread-table--even-row {
            background: $surface-lighten-1 50%;
        }
        & > .thread-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        & > .thread-table--hover {
            background: $block-hover-background;
        }
    }
    """

    BINDINGS = [
        Binding("enter", "select", "Open", show=False),
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home,ctrl+home", "first", "First", show=False),
        Binding("end,ctrl+end", "last", "Last", show=False),
    ]

    class Selected(Message):
        """The user chose ``thread_id`` (Enter, or a click on the row under the cursor)."""

        def __init__(self, table: ThreadTable, thread_id: str) -> None:
            super().__init__()
            self.table = table
            self.thread_id = thread_id

        @property
        def control(self) -> ThreadTable:
            """The table the thread was chosen in."""
            return self.table

    class Shown(Message):
        """The rows shown changed as a whole: new rows, or the filter (``row_count`` and
        ``total_count`` may differ from before)."""

        def __init__(self, table: ThreadTable) -> None:
            super().__init__()
            self.table = table

        @property
        def control(self) -> ThreadTable:
            """The table whose rows changed."""
            return self.table

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._all: list[_Cells] = []  # every row, in the session's order
        self._by_id: dict[str, _Cells] = {}
        self._position: dict[str, int] = {}  # thread id -> index in _all
        self._counts = _Widths.of([])
        self._target: _Target | None = None  # rows being made, to show once all are
        self._build_scheduled = False
        self._shown: list[_Cells] = []  # the rows the filter keeps, in order
        self._index: dict[str, int] = {}  # thread id -> index in _shown
        self._filter = ""
        self._attention_only = False
        self._widths = (len(HEADINGS[0]), len(HEADINGS[1]), len(HEADINGS[2]), len(HEADINGS[3]))
        self._lines: LRUCache[tuple[object, ...], Strip] = LRUCache(256)
        self._tick = 0  # moves when relative times are redrawn
        self.cursor_row = 0
        """The index of the row under the cursor among the rows shown."""
        self.hover_row: int | None = None
        """The row under the mouse, if any."""
        self.builds = 0
        self.rendered = 0

    # --- rows ---------------------------------------------------------------------------

    @property
    def rows(self) -> list[ThreadRow]:
        """The rows shown (the filter's), in order."""
        return [cells.row for cells in self._shown]

    @property
    def row_count(self) -> int:
        """How many rows are shown (the filter's)."""
        return len(self._shown)

    @property
    def total_count(self) -> int:
        """How many rows the table holds, shown or filtered out."""
        return len(self._all)

    def set_rows(self, rows: Sequence[ThreadRow], changed: Collection[str] | None = None) -> None:
        """Show ``rows`` (most recent first), keeping the cursor on its thread when still shown.

        ``changed`` names the threads whose row may differ from the one held (added,
        changed or gone): only those are made ready again. When each of them is still where
        it was and no thread came or went, the others are not looked at (their rows stay
        where they are) and only the changed lines are redrawn: an update naming 20 of
        10,000 threads costs 20 rows. ``None``: any may differ; each row is then compared
        with the one held (the session hands out the same row object for a thread that did
        not change, so this is a pass of identity checks).

        Otherwise the new rows are made a slice of :data:`BUILD_SLICE` seconds at a time,
        between which keys are handled, and shown once all are made (:attr:`settled`); a
        newer call meanwhile takes over, keeping what was made."""
        if self._target is None and changed is not None and self._in_place(rows, changed):
            return
        self._target = _Target(list(rows), changed, self._target)
        if not self._build_scheduled:
            self._build_step()

    @property
    def settled(self) -> bool:
        """Whether the rows last given are all shown (none still being made)."""
        return self._target is None

    def _build_step(self) -> None:
        """Make the target's rows for one slice; show them once all are made."""
        self._build_scheduled = False
        target = self._target
        if target is None:
            return
        deadline = time.monotonic() + BUILD_SLICE
        rows, made = target.rows, target.made
        while len(made) < len(rows):
            row = rows[len(made)]
            cells = self._by_id.get(row.thread_id) or target.spare.get(row.thread_id)
            if cells is None or (
                cells.row is not row
                and (target.changed is None or row.thread_id in target.changed)
                and cells.row != row
            ):
                cells = self._build(row)
            made.append(cells)
            if len(made) % 64 == 0 and time.monotonic() >= deadline:
                self._build_scheduled = True
                self.call_later(self._build_step)
                return
        self._target = None
        if len(made) == len(self._all) and all(a is b for a, b in zip(made, self._all, strict=True)):
            return  # nothing to show anew
        selected = self.selected_thread_id
        self._all = made
        self._by_id = {cells.row.thread_id: cells for cells in made}
        self._counts = _Widths.of(made)
        self._widths = self._counts.widths()
        self._apply(selected)

    def _in_place(self, rows: Sequence[ThreadRow], changed: Collection[str]) -> bool:
        """Put the rows of the ``changed`` threads where they are, when each of them is still
        at its index and no thread came or went; redraw what that needs. Returns whether it could."""
        if len(rows) != len(self._all):
            return False
        at: list[tuple[int, ThreadRow]] = []
        for thread_id in changed:
            cells = self._by_id.get(thread_id)
            index = self._position.get(thread_id)
            if cells is None or index is None or rows[index].thread_id != thread_id:
                return False
            if rows[index] is not cells.row and rows[index] != cells.row:
                at.append((index, rows[index]))
        redraw: list[str] = []
        refilter = False
        for index, row in at:
            before = self._all[index]
            cells = self._build(row)
            self._all[index] = self._by_id[row.thread_id] = cells
            self._counts.replace(before, cells)
            if self.narrowed and self._keeps(before) != self._keeps(cells):
                refilter = True
            elif row.thread_id in self._index:
                self._shown[self._index[row.thread_id]] = cells
            redraw.append(row.thread_id)
        widths = self._counts.widths()
        if refilter or widths != self._widths:
            self._widths = widths
            self._apply(self.selected_thread_id)
        else:
            self._redraw_rows(redraw)
        return True

    def _build(self, row: ThreadRow) -> _Cells:
        self.builds += 1
        return _Cells(row)

    def _keeps(self, cells: _Cells) -> bool:
        if self._attention_only and not cells.attention:
            return False
        return not self._filter or self._filter in cells.haystack

    # --- filter -------------------------------------------------------------------------

    @property
    def filter_text(self) -> str:
        """The text rows must hold (in their id, first prompt or state) to be shown; ``""``: all."""
        return self._filter

    @property
    def attention_only(self) -> bool:
        """Whether only the rows that need attention are shown (:func:`tui.attention.needs_attention`)."""
        return self._attention_only

    @property
    def narrowed(self) -> bool:
        """Whether some rows may be left out: a filter text, or the needs-attention toggle."""
        return bool(self._filter) or self._attention_only

    def set_attention_only(self, only: bool) -> None:
        """Show only the rows that need attention (waiting for you, crashed, failed,
        aborted: :func:`tui.attention.needs_attention`), or every row again; the filter text
        applies as well. The cursor stays on its thread when it is still shown."""
        if only == self._attention_only:
            return
        selected = self.selected_thread_id
        self._attention_only = only
        self._apply(selected)

    def set_filter(self, text: str) -> None:
        """Show only the rows whose id, first prompt or state holds ``text`` (ignoring case);
        ``""`` shows every row. The cursor stays on its thread when it is still shown, else
        goes to the first row shown."""
        needle = text.casefold()
        if needle == self._filter:
            return
        selected = self.selected_thread_id
        self._filter = needle
        self._apply(selected)

    def _apply(self, selected: str | None) -> None:
        """Recompute the rows shown and redraw everything."""
        self._position = {c.row.thread_id: i for i, c in enumerate(self._all)}
        self._shown = [c for c in self._all if self._keeps(c)] if self.narrowed else list(self._all)
        self._index = {c.row.thread_id: i for i, c in enumerate(self._shown)}
        if selected is not None and selected in self._index:
            self.cursor_row = self._index[selected]
        elif selected is not None and self.narrowed:
            self.cursor_row = 0  # its thread filtered out: the best match, at the top
        self.cursor_row = max(0, min(self.cursor_row, len(self._shown) - 1))
        self._lines.clear()
        self._resize_virtual()
        self._scroll_cursor_into_view()
        self.refresh()
        self.post_message(self.Shown(self))

    # --- geometry -----------------------------------------------------------------------

    def _prompt_width(self) -> int:
        """What is left of the width for the first prompt (at least :data:`PROMPT_MIN` cells)."""
        fixed = sum(self._widths) + 2 * PADDING * len(HEADINGS)
        return max(PROMPT_MIN, self.scrollable_content_region.width - fixed)

    def _resize_virtual(self) -> None:
        width = sum(self._widths) + self._prompt_width() + 2 * PADDING * len(HEADINGS)
        self.virtual_size = Size(width, len(self._shown) + 1)  # the header is line 0

    def on_resize(self, _event: events.Resize) -> None:
        self._lines.clear()
        self._resize_virtual()
        self._scroll_cursor_into_view()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._lines.clear()

    def refresh_times(self) -> None:
        """Redraw the last-activity cells: relative times age while the screen is open."""
        self._tick += 1
        self._lines.clear()
        self.refresh()

    # --- cursor -------------------------------------------------------------------------

    @property
    def selected_thread_id(self) -> str | None:
        """The thread id under the cursor, if any row is shown."""
        if not self._shown:
            return None
        return self._shown[min(self.cursor_row, len(self._shown) - 1)].row.thread_id

    def get_row_index(self, thread_id: str) -> int:
        """The index of ``thread_id`` among the rows shown. Raises ``KeyError`` when it is
        not shown (not listed, or filtered out)."""
        return self._index[thread_id]

    def move_cursor(self, *, row: int) -> None:
        """Put the cursor on the ``row``-th row shown (clamped to the rows) and scroll to it."""
        if not self._shown:
            self.cursor_row = 0
            return
        row = max(0, min(row, len(self._shown) - 1))
        if row != self.cursor_row:
            before, self.cursor_row = self.cursor_row, row
            self._redraw_indices((before, row))
        self._scroll_cursor_into_view()

    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def action_cursor_up(self) -> None:
        """Move the cursor one row up."""
        self.move_cursor(row=self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        """Move the cursor one row down."""
        self.move_cursor(row=self.cursor_row + 1)

    def action_page_up(self) -> None:
        """Move the cursor one screen up."""
        self.move_cursor(row=self.cursor_row - self._page())

    def action_page_down(self) -> None:
        """Move the cursor one screen down."""
        self.move_cursor(row=self.cursor_row + self._page())

    def action_first(self) -> None:
        """Move the cursor to the first row."""
        self.move_cursor(row=0)

    def action_last(self) -> None:
        """Move the cursor to the last row."""
        self.move_cursor(row=len(self._shown) - 1)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Enter (``select``) is the table's only while a row is shown; with none it goes on
        to the screen's own binding, which says why nothing opens."""
        return self.selected_thread_id is not None if action == "select" else True

    def action_select(self) -> None:
        """Open the thread under the cursor (posts :class:`Selected`)."""
        thread_id = self.selected_thread_id
        if thread_id is not None:
            self.post_message(self.Selected(self, thread_id))

    def _scroll_cursor_into_view(self) -> None:
        """Scroll so that the cursor's row is on screen below the header."""
        height = self.scrollable_content_region.height
        if height <= 1 or not self._shown:
            return
        line = self.cursor_row + 1  # the header is line 0
        top = round(self.scroll_y)
        if line - top < 1:
            self.scroll_to(y=line - 1, animate=False, immediate=True)
        elif line - top > height - 1:
            self.scroll_to(y=line - height + 1, animate=False, immediate=True)

    # --- mouse --------------------------------------------------------------------------

    def _row_at(self, event: events.MouseEvent) -> int | None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return None
        index = offset.y - 1 + round(self.scroll_y)
        return index if 0 <= index < len(self._shown) else None

    def on_click(self, event: events.Click) -> None:
        index = self._row_at(event)
        if index is None:
            return
        event.stop()
        if index == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(row=index)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        index = self._row_at(event)
        if index != self.hover_row:
            before, self.hover_row = self.hover_row, index
            self._redraw_indices((before, index))

    def on_leave(self, _event: events.Leave) -> None:
        if self.hover_row is not None:
            before, self.hover_row = self.hover_row, None
            self._redraw_indices((before,))

    # --- drawing ------------------------------------------------------------------------

    def _redraw_rows(self, thread_ids: Collection[str]) -> None:
        self._redraw_indices(tuple(self._index[t] for t in thread_ids if t in self._index))

    def _redraw_indices(self, indices: Sequence[int | None]) -> None:
        """Redraw the lines of these rows (the ones on screen; the rest draw when scrolled to)."""
        top = round(self.scroll_y)
        height = self.scrollable_content_region.height
        for index in indices:
            if index is not None and 1 <= index + 1 - top < height:
                self.refresh_line(index + 1)  # the header is line 0

    def render_line(self, y: int) -> Strip:
        self.rendered += 1
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            return self._header(scroll_x, width)
        index = y - 1 + scroll_y
        base = self.rich_style
        if index >= len(self._shown):
            return Strip.blank(width, base)
        cells = self._shown[index]
        prompt_width = self._prompt_width()
        key = (
            cells,
            index % 2,
            index == self.cursor_row,
            index == self.hover_row,
            self.has_focus,
            self._widths,
            prompt_width,
            scroll_x,
            width,
            self._tick,
        )
        strip = self._lines.get(key)
        if strip is None:
            strip = self._lines[key] = self._row_strip(cells, index, prompt_width, base).crop_extend(
                scroll_x, scroll_x + width, base
            )
        return strip

    def _header(self, scroll_x: int, width: int) -> Strip:
        style = self.get_component_rich_style("thread-table--header")
        texts = [Text(heading) for heading in HEADINGS]
        return self._strip(texts, self._prompt_width(), style, Style()).crop_extend(
            scroll_x, scroll_x + width, self.rich_style
        )

    def _row_strip(self, cells: _Cells, index: int, prompt_width: int, base: Style) -> Strip:
        parity = "thread-table--odd-row" if index % 2 else "thread-table--even-row"
        style = base + self.get_component_rich_style(parity)
        over = Style()
        if index == self.hover_row:
            style += self.get_component_rich_style("thread-table--hover")
        if index == self.cursor_row:
            # The cursor's colours win over the cells' own (a state's colour), as DataTable's did.
            cursor = self.get_component_rich_style("thread-table--cursor")
            style += cursor
            over = Style.from_color(cursor.color, cursor.bgcolor)
        texts = [
            Text(cells.thread, style="bold"),
            Text(cells.state, style=cells.style),
            Text(cells.msgs, justify="right"),
            Text(relative_time(cells.row.last_activity, time.time())),
            Text(cells.prompt),
        ]
        return self._strip(texts, prompt_width, style, over)

    def _strip(self, texts: Sequence[Text], prompt_width: int, style: Style, over: Style) -> Strip:
        """One line of cells, each cut or padded to its column's width, in ``style``, with
        ``over`` laid over the cells' own styles."""
        line = Text(no_wrap=True, end="")
        pad = " " * PADDING
        for text, width in zip(texts, (*self._widths, prompt_width), strict=True):
            if text.justify == "right" and text.cell_len < width:
                text.pad_left(width - text.cell_len)
            text.truncate(width, overflow="ellipsis", pad=True)
            line.append(pad)
            line.append_text(text)
            line.append(pad)
        # Text.render draws spans only: the line's style goes under every cell's own, and
        # ``over`` on top of them.
        line.stylize_before(style)
        if over:
            line.stylize(over)
        return Strip(line.render(self.app.console))
