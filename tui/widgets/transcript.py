"""Transcript: the thread's messages, newest at the bottom, with the live reply streaming in.

Only the last :data:`WINDOW` entries are mounted, and only the entries read are held: a
thread opens on its newest page of rows (:class:`~core.checkpoint.pages.MessagePage`) and
earlier pages are read from the store (through the ``loader`` given to :meth:`Transcript.show`)
as the user scrolls near the top, presses ``e`` or clicks "show earlier", so opening a
100,000-message thread costs what opening a short one does, in time and in memory.
Live updates touch only the reply being streamed and the tool calls that changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region, Size
from textual.layout import DockArrangeResult
from textual.widget import Widget
from textual.widgets import Button, Static

from core.checkpoint.base import CorruptRow
from core.checkpoint.pages import MessagePage
from core.errors import CubepiError
from core.messages import AnyMessage, AssistantMessage, ToolResultMessage
from core.recovery import Diagnosis
from core.words import counted
from tui.text import clean
from tui.widgets.lean_frames import BlankLines, CoarseIndex
from tui.widgets.message_view import AssistantMessageView, RawView, view_for_message
from tui.widgets.tool_call import ToolCallView

WINDOW = 20
"""Entries mounted at first, and mounted again by each "show earlier" (or scroll near the
top); also the rows a thread view reads at first and per page (:data:`PageLoader`).
Measured on the 2-core machine (issue 10), opening a thread costs ~10 ms of mounting per
entry on top of ~400 ms for the screen: 60 entries doubled the time to the first paint,
20 (a 40-line terminal's worth of a typical agent thread, and more is paged in when they
do not fill the view) add ~200 ms. Measured again later (CPU from the thread screen's push
to the frame with the last message, in the app on the benchmark's 10,000-message thread):
~315 ms, then ~150 ms once the first frame was the tail, stored tool calls mounted no
progress bar and the footer was rebuilt once; 20 entries are 14 views, 59 widgets. A page
pinned to its end now mounts only the views that surely fill the terminal before its first
frame (:func:`_screenful`; 6 of the 14 there) and the rest just after it: ~220 -> ~175 ms of
CPU from Enter on the picker to that frame drawn (stamped in the app, same minute)."""

FRAME_OUT = 0.03
"""Seconds the window's views above the first screenful wait once that frame is drawn, so
that Textual's writer thread can send it to the terminal: their mount holds the
interpreter, and the frame reached the terminal 13-38 ms after it was drawn instead of
~2 ms (stamped in the app, 10,000-message thread)."""

PAGE_IN_LINES = 3
"""Earlier entries are paged in when the top of the view comes within this many lines of
the first entry mounted (the "show earlier" line is the one above it)."""

PageLoader = Callable[[Any, int], Awaitable[MessagePage]]
"""Reads the page of rows before a row id: ``await loader(before, limit)`` (the thread
view's ``Session.load_page``)."""

Entry = AnyMessage | CorruptRow
"""One transcript row: a decoded message, or a stored row that could not be decoded."""


FILL_WAITS = 20
"""Refreshes :meth:`Transcript._fill` waits at most for the views just mounted to be laid
out before it judges whether they fill the view (a view that stays 0 rows high would
otherwise keep it waiting)."""


def _rows_at_least(view: Widget) -> int:
    """Screen rows an entry view takes at least, at any width: one of content; a reply its
    "who" line and its calls' rows (:attr:`ToolCallView.rows_at_least`). Margins are not
    counted (sibling margins collapse)."""
    if isinstance(view, AssistantMessageView):
        return 1 + sum(call.rows_at_least for call in view.tool_views.values())
    return 1


def _screenful(views: Sequence[Widget], rows: int) -> int:
    """How many of the last ``views`` surely fill ``rows`` screen rows (all of them when
    even all of them may not)."""
    total = 0
    for count, view in enumerate(reversed(views), 1):
        total += _rows_at_least(view)
        if total >= rows:
            return count
    return len(views)


@dataclass(frozen=True, slots=True)
class _Hidden:
    count: int


def _top_of(arrangement: DockArrangeResult, view: Widget) -> int | None:
    """Where ``view`` is placed in ``arrangement`` (its top row), if it is."""
    return next((p.region.y for p in arrangement.placements if p.widget is view), None)


def _same(a: Entry, b: Entry) -> bool:
    """Whether two entries are the same stored row (cheap: role, ids and text, not every field)."""
    if isinstance(a, CorruptRow) or isinstance(b, CorruptRow):
        return isinstance(a, CorruptRow) and isinstance(b, CorruptRow) and a.row_id == b.row_id
    if type(a) is not type(b):
        return False
    if isinstance(a, ToolResultMessage):
        return a.tool_call_id == b.tool_call_id  # type: ignore[union-attr]
    return getattr(a, "text", None) == getattr(b, "text", None) and a.timestamp == b.timestamp


def merge_rows(messages: Sequence[AnyMessage], ids: Sequence[Any], problems: Iterable[CorruptRow]) -> list[Entry]:
    """Messages and undecodable rows in store order (by row id when ids are comparable)."""
    problems = list(problems)
    if not problems:
        return list(messages)
    try:
        keyed: list[tuple[Any, int, Entry]] = [
            (ids[i] if i < len(ids) else float("inf"), 0, m) for i, m in enumerate(messages)
        ]
        keyed += [(p.row_id, 1, p) for p in problems]
        keyed.sort(key=lambda k: (k[0], k[1]))
        return [entry for _, _, entry in keyed]
    except TypeError:
        return [*messages, *problems]


class Transcript(BlankLines, CoarseIndex, VerticalScroll, can_focus=True):
    """The scrolling list of message views; stays pinned to the bottom while it grows.

    Its own lines are blank (its views and Textual's scrollbar widgets draw over them), so it
    draws none (:class:`~tui.widgets.lean_frames.BlankLines`), and its content growing asks for no second
    layout (:meth:`_size_updated`)."""

    DEFAULT_CSS = """
    Transcript {
        height: 1fr;
        padding: 0 1;
        scrollbar-gutter: stable;
        & > #earlier { width: 100%; height: 1; border: none; margin: 0; min-width: 0; }
        & > .empty { color: $text-muted; margin: 1 0; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._entries: list[Entry] = []
        self._first_shown = 0
        self._unread = 0  # rows stored before _entries[0], not read yet
        self._before: Any = None  # the row id the next page is read below
        self._loader: PageLoader | None = None
        self._paging = False  # a page-in is under way
        self._earlier = asyncio.Lock()  # one "show earlier" at a time: each reads below the last
        self._placing = False  # the view is being scrolled by this widget, not by the user
        # Scroll anchoring (see arrange): the entry at the top of the view, its top row in
        # the arrangement last seen and the scroll it was taken at; that arrangement; the
        # entry whose screenful above is to be revealed next; and the rows PageUps asked to
        # go above the entries mounted (gone up once more are paged in, see _spend_owed).
        self._at_top: tuple[Widget, int, int] | None = None
        self._arranged: DockArrangeResult | None = None
        self._reveal: Widget | None = None
        self._owed = 0
        self._results: dict[str, ToolResultMessage] = {}
        # The window's views above the first screenful, and the view they go above: mounted
        # once the first frame is painted (see _replace).
        self._deferred: tuple[list[Widget], Widget] | None = None
        self.tool_views: dict[str, ToolCallView] = {}
        self.live: AssistantMessageView | None = None

    def compose(self) -> ComposeResult:
        yield Button("", id="earlier", variant="default", compact=True)

    def on_mount(self) -> None:
        self._update_earlier()

    def watch_virtual_size(self) -> None:
        self._pin_when_tall()

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        # Only the content grew (a streamed reply, every frame): the layout that found it has
        # already arranged the content and scrolled an anchored view to its end, so the
        # second layout Textual's ``virtual_size`` asks for would only repeat it
        # (tui.widgets.lean_frames); its watcher is run here instead.
        grew = size == self._size and container_size == self._container_size and virtual_size != self.virtual_size
        changed = super()._size_updated(size, virtual_size, container_size, layout=layout and not grew)
        if grew:
            self._pin_when_tall()
        return changed

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value > old_value:
            self._owed = 0  # the user went down: what a PageUp still owed is void
        if new_value < old_value and new_value <= PAGE_IN_LINES and self.has_earlier and not self._placing:
            self._page_in()

    def action_page_up(self) -> None:
        """Scroll a screen up; above the first entry mounted, once earlier ones are paged in."""
        self._page_by(-self.scrollable_content_region.height)

    def action_page_down(self) -> None:
        """Scroll a screen down."""
        self._page_by(self.scrollable_content_region.height)

    def _page_by(self, rows: int) -> None:
        """Scroll ``rows`` from where the last page key left the view, at once.

        Textual's page keys scroll from ``scroll_y`` after the next refresh, animated: every
        key of a burst read the same ``scroll_y`` and asked for the same place, so 20 quick
        PageUps moved one page. Here each key starts from the last one's target, and the
        scroll is immediate, so a page-in sees the view where the keys left it."""
        if rows > 0 and self._owed:
            paid = min(rows, self._owed)
            self._owed -= paid
            rows -= paid
        target = self.scroll_target_y + rows
        if rows < 0 and (self._owed or (target < 0 and self.has_earlier)):
            # Above the entries mounted: the whole move waits for the page-in (_spend_owed).
            # Scrolled to the top at once, the page came in two steps, a frame apart.
            self._owed -= rows
            self.release_anchor()  # no longer following the tail (which voids what is owed)
            self._page_in()
            return
        self.scroll_to(y=target, animate=False, immediate=True)

    def _spend_owed(self, seen: DockArrangeResult | None = None, waits: int = 0) -> None:
        """Scroll up by what PageUps asked for above the entries that were mounted, once a
        page-in has mounted more and their layout settled (and page in again while some is
        left); ``seen``: the arrangement at the last look.

        Not spent before: a reply's tool calls fill in their output in their own mount, so
        the first layouts have them 6-7 rows high that end 18 (measured, benchmark thread),
        and a page spent then skipped the rows they grew."""
        if not self._owed or not self.is_mounted or self._paging:
            return
        if waits < FILL_WAITS and self._arranged is not seen:
            self.call_after_refresh(self._spend_owed, self._arranged, waits + 1)
            return
        owed, self._owed = self._owed, 0
        self._page_by(-owed)

    def arrange(self, size: Size, optimal: bool = False) -> DockArrangeResult:
        """Textual's arrangement, with scroll anchoring applied before it is drawn.

        Entries mounted above the view (a page-in, "show earlier", the window's deferred
        views) and views above it that grow once laid out (a Markdown body rendered after
        its mount) would push what the user reads down the screen. Here, where Textual's own
        anchor (to the end) also acts, the scroll moves by as many rows as the entry at the
        top of the view moved, so that entry stays on the same screen row in the same frame.
        A "show earlier" places the screenful above its old first entry in view instead."""
        arrangement = super().arrange(size, optimal)
        self._arranged, arranged = arrangement, self._arranged
        if self._anchored and not self._anchor_released:
            # Pinned to the end: Textual scrolls it there right after this. The entry at the
            # top there is the anchor still: a PageUp and a page-in can come before the next
            # layout, and the rows that page-in mounts must move the view too.
            self._reveal, self._owed = None, 0
            self._at_top = self._top_entry(arrangement, size, max(0, arrangement.total_region.bottom - size.height))
            return arrangement
        if arrangement is not arranged:
            self._follow_anchor(arrangement, size.height)
        if self._at_top is None or self._at_top[2] != round(self.scroll_y):
            # Taken again only once the view scrolled: the views a page-in mounts take
            # several layouts to reach their height (composed, then their calls filled in),
            # and one of them taken as the anchor meanwhile let those below it push on.
            self._at_top = self._top_entry(arrangement, size, round(self.scroll_y))
        return arrangement

    def _follow_anchor(self, arrangement: DockArrangeResult, height: int) -> None:
        """Scroll for a new ``arrangement`` so the anchor entry stays on its screen row (or
        the asked-for screenful is revealed)."""
        bottom = max(0, arrangement.total_region.bottom - height)
        reveal, self._reveal = self._reveal, None
        top = _top_of(arrangement, reveal) if reveal is not None else None
        if top is not None:
            self._set_scroll(min(bottom, max(0, top - height)))
            self._at_top = None
            return
        if self._at_top is None:
            return
        view, was, _ = self._at_top
        now = _top_of(arrangement, view)
        if now is None:
            self._at_top = None  # removed (a fresh show): nothing to keep in place
            return
        y = min(bottom, max(0, round(self.scroll_y) + now - was))
        self._set_scroll(y)
        self._at_top = view, now, y

    def _set_scroll(self, y: float) -> None:
        """Set the scroll during a layout, as Textual's anchor does: no watcher (this is no
        user scroll) and no second frame (the compositor reads it right after)."""
        self.set_reactive(VerticalScroll.scroll_y, y)
        self.set_reactive(VerticalScroll.scroll_target_y, y)
        self.vertical_scrollbar._reactive_position = y

    def _top_entry(self, arrangement: DockArrangeResult, size: Size, y: int) -> tuple[Widget, int, int] | None:
        """The first entry view in sight at the top of the view scrolled to ``y``, its top
        row and ``y`` (the "earlier" line never: entries are mounted below it)."""
        placed = arrangement.get_visible_placements(Region(0, y, max(size.width, 1), max(size.height, 1)))
        entries = [p for p in placed if p.widget.id != "earlier" and p.region.bottom > y]
        if not entries:
            return None
        first = min(entries, key=lambda p: p.region.y)
        return first.widget, first.region.y, y

    def _place(self, y: float) -> None:
        """Scroll to ``y`` for the user (after a mount), without it counting as the user
        scrolling up (which pages earlier entries in)."""
        self._placing = True
        try:
            self.scroll_to(y=y, animate=False, immediate=True)
        finally:
            self._placing = False

    def on_resize(self) -> None:
        # The view can shrink under content that fitted (a line above it appeared: the
        # thread's owner and definition, a problem, the commands bar): pin it then too,
        # or what is added next lands below the view.
        self._pin_when_tall()
        for view in self.query(ToolCallView):
            view.fit_box()  # an expanded box must still fit the view

    def _pin_when_tall(self) -> None:
        # Follow the tail only once there is more than a screenful: an anchored widget
        # bottom-aligns short content, which would leave a short thread hanging low.
        if (
            self.is_mounted
            and not self.is_anchored
            and self.virtual_size.height > self.scrollable_content_region.height
        ):
            self.anchor()

    def follow_tail(self) -> None:
        """Scroll to the newest entry and follow what is added from now on, even after the
        user scrolled up (they just sent something and want to watch the answer)."""
        self.scroll_end(animate=False, immediate=True)  # also re-engages a released anchor
        self._pin_when_tall()

    # --- loading ------------------------------------------------------------------------

    async def show(
        self, entries: list[Entry], *, unread: int = 0, before: Any = None, loader: PageLoader | None = None
    ) -> None:
        """Replace what is shown with ``entries`` (store order); mounts only the last window.

        ``entries`` may be the newest rows only: ``unread`` rows are stored before them, read
        by ``loader`` (kept from an earlier call when not given) a page at a time below row
        id ``before`` (the first of ``entries``) when they are to be shown."""
        # One frame for all of it: painted between mounts, the half-mounted view cost a
        # whole layout and render (~20 ms of the 10,000-message open, issue 10).
        with self.app.batch_update():
            await self._replace(entries, unread, before, loader)

    async def _replace(self, entries: list[Entry], unread: int, before: Any, loader: PageLoader | None) -> None:
        """:meth:`show`'s work, in one batch of updates."""
        self._deferred = None
        await self.remove_children([child for child in self.children if child.id != "earlier"])
        self._entries = list(entries)
        self._results = {m.tool_call_id: m for m in entries if isinstance(m, ToolResultMessage)}
        self._unread, self._before = unread, before
        if loader is not None:
            self._loader = loader
        self.tool_views.clear()
        self.live = None
        start = self._window_start(len(self._entries))
        if self._unread:
            # Their calls are in rows not read yet: shown with them once those are read.
            while start < len(self._entries) and isinstance(self._entries[start], ToolResultMessage):
                start += 1
        views = self._views(start, len(self._entries))
        self._first_shown = start
        if not entries:
            views = [Static("No messages yet. Press n to send the first prompt.", classes="empty")]
        later: list[Widget] = []
        if self._unread:
            # Pinned to its end, the first frame shows only the last screenful: the views above
            # it are mounted after that frame (_finish_window), out of view. Each mounted view
            # cost the first frame ~10 ms of mounting and layout (issue 10).
            cut = len(views) - _screenful(views, self.app.size.height)
            later, views = views[:cut], views[cut:]
        await self.mount_all(views)
        if later:
            self._deferred = (later, views[0])
        self._update_earlier()
        if self._unread:
            # Rows before these are paged in until the view is full (_fill), so the view
            # follows the tail from its first frame: pinned only once laid out, it painted
            # the window's top first and the tail one full layout later (~80 ms of the
            # 10,000-message open, issue 10). _fill unpins it if the thread is short after all.
            self.anchor()
        else:
            # Open on the newest messages. The scroll home must happen now: a deferred one
            # (scroll_home's default) lands after the tail was pinned and leaves the view at
            # the top. Once laid out, a tall transcript is pinned to its end.
            self.anchor(False)
            self._placing = True
            try:
                self.scroll_home(animate=False, immediate=True)
            finally:
                self._placing = False
            self.call_after_refresh(self._pin_when_tall)
        self.call_after_refresh(self._first_frame_drawn)

    def _first_frame_drawn(self) -> None:
        if self._deferred is None:
            self._fill()
        else:
            self.set_timer(FRAME_OUT, self._finish_window)

    async def _finish_window(self) -> None:
        """The first frame of a show is out: mount the window's views kept from it, then
        page in while the view is not full (:meth:`_fill`, after their layout)."""
        async with self._earlier:
            await self._mount_deferred()
        self.call_after_refresh(self._fill)

    async def _mount_deferred(self) -> None:
        """Mount the views :meth:`_replace` kept from its first frame, if any, above the
        screenful they belong above (a pinned view stays at its end meanwhile)."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred[1].parent is self:
            await self.mount_all(deferred[0], before=deferred[1])

    @property
    def has_earlier(self) -> bool:
        """Whether older entries exist that are not mounted yet ("show earlier" has work)."""
        return self._first_shown > 0 or (self._unread > 0 and self._loader is not None)

    @property
    def hidden_count(self) -> int:
        """How many entries of the thread are above the mounted ones (read or not)."""
        return self._first_shown + (self._unread if self._loader is not None else 0)

    async def show_earlier(self, *, keep_view: bool = False) -> None:
        """Mount up to :data:`WINDOW` more of the older entries above the shown ones,
        reading earlier pages first when the entries read run out. Then the screenful just
        above the old first entry is brought into view or, with ``keep_view``, what was in
        view stays where it was (a page-in while scrolling). A store error while reading is
        shown as a notice (one sentence); what is shown stays, and the next try reads again."""
        async with self._earlier:
            await self._show_earlier(keep_view)

    async def _show_earlier(self, keep_view: bool, *, at_tail: bool = False) -> bool:
        """:meth:`show_earlier`'s work; whether it mounted anything. ``at_tail``: the view
        is pinned to its end and stays there (scrolling would release the pin)."""
        await self._mount_deferred()  # what is mounted next goes above them
        await self._read_earlier()
        if self._first_shown == 0:
            self._update_earlier()
            return False
        start = self._window_start(self._first_shown)
        views = self._views(start, self._first_shown)
        self._first_shown = start
        first = next((c for c in self.children if c.id != "earlier"), None)
        if views:
            await self.mount_all(views, before=first) if first else await self.mount_all(views)
            if first is not None and not keep_view and not at_tail:
                # Placed by the next layout (arrange); released, since a view pinned to the
                # end would stay there and nothing would seem to happen. A page-in (keep_view)
                # needs nothing: scroll anchoring keeps what was in view where it was.
                self.release_anchor()
                self._reveal = first
        self._update_earlier()
        return bool(views)

    async def _read_earlier(self) -> None:
        """Read earlier pages until a window's worth of entries is read above the mounted
        ones (or the thread's start), never leaving the first read entry a tool result whose
        call may be in the rows before it."""
        while self._unread > 0 and self._loader is not None:
            enough = self._first_shown >= WINDOW
            if enough and not (
                self._window_start(self._first_shown) == 0 and isinstance(self._entries[0], ToolResultMessage)
            ):
                return
            try:
                page = await self._loader(self._before, WINDOW)
            except CubepiError as error:
                self.notify(clean(str(error)), severity="error", timeout=8, markup=False)
                return
            older = merge_rows(page.messages, page.message_ids, page.problems)
            if not older:
                self._unread = 0  # deleted meanwhile: what was read is all there is
                break
            self._entries[:0] = older
            self._first_shown += len(older)
            self._results.update((m.tool_call_id, m) for m in older if isinstance(m, ToolResultMessage))
            self._unread, self._before = page.earlier, page.first_id

    def _page_in(self, *, at_tail: bool = False) -> None:
        """Page earlier entries in while the user scrolls near the top (one at a time);
        ``at_tail``: the view is pinned to its end, which keeps it there (no scroll)."""
        if self._paging or not self.is_mounted:
            return
        self._paging = True
        self.run_worker(self._paged_in(at_tail), group="page-in")

    async def _paged_in(self, at_tail: bool) -> None:
        try:
            async with self._earlier:
                mounted = await self._show_earlier(keep_view=True, at_tail=at_tail)
        finally:
            self._paging = False
        if not mounted:
            self._owed = 0  # the thread's start is in: there is nothing above to go to
        else:
            self.call_after_refresh(self._spend_owed)
            self.call_after_refresh(self._fill)  # still short of the view's height: page on

    def _fill(self, waits: int = 0) -> None:
        """Page earlier entries in while the mounted ones do not fill the view (nothing to
        scroll means no scroll to page in on); a view that stays short (the thread's start
        is mounted) is not pinned, so it shows from the top (see :meth:`_pin_when_tall`)."""
        if not self.is_mounted or self.virtual_size.height > self.scrollable_content_region.height:
            return
        if waits < FILL_WAITS and any(
            not child.size.height for child in self.children if child.id != "earlier" and child.display
        ):
            # Not laid out yet (seen under load: a refresh came before the layout of the
            # views just mounted, so a full page read as short and the next was paged in).
            self.call_after_refresh(self._fill, waits + 1)
            return
        if self.has_earlier:
            self._page_in(at_tail=self.is_anchored)
        elif self.is_anchored:
            self.anchor(False)
            self._place(0)

    def _window_start(self, end: int) -> int:
        start = max(0, end - WINDOW)
        # Never start on a tool result: show the reply that made the call with it.
        while start > 0 and isinstance(self._entries[start], ToolResultMessage):
            start -= 1
        return start

    def _views(self, start: int, end: int) -> list[Widget]:
        views: list[Widget] = []
        for entry in self._entries[start:end]:
            if isinstance(entry, CorruptRow):
                views.append(RawView(f"row {entry.row_id} could not be read: {entry.reason}", entry.raw))
                continue
            if isinstance(entry, ToolResultMessage) and entry.tool_call_id in self.tool_views:
                continue  # shown inside its tool call
            view = view_for_message(entry)
            if isinstance(view, AssistantMessageView):
                self._adopt(view, entry)  # type: ignore[arg-type]
            views.append(view)
        return views

    def _adopt(self, view: AssistantMessageView, message: AssistantMessage) -> None:
        """Register the reply's tool call views and give each its result, if stored."""
        for call_id, tool_view in view.tool_views.items():
            self.tool_views[call_id] = tool_view
            result = self._results.get(call_id)
            if result is not None:
                tool_view.finish(result)

    def _update_earlier(self) -> None:
        found = self.query("#earlier").results(Button)
        button = next(found, None)
        if button is None:  # the screen closed before this widget's children mounted
            return
        hidden = self.hidden_count
        button.display = hidden > 0
        button.label = Text(
            f"▲ {counted(hidden, 'earlier message')} hidden: click or press e to show {min(hidden, WINDOW)} more"
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "earlier":
            event.stop()
            self.request_earlier()

    def request_earlier(self) -> None:
        """Show earlier entries (:meth:`show_earlier`) for a key or a click, in a worker.

        Each request runs: they queue on one lock and each mounts a window above the last.
        An exclusive worker cancelled the one before, so a burst of ten showed one window
        (and a cancel mid-mount could lose the entries counted as shown)."""
        self.run_worker(self.show_earlier(), group="earlier")

    # --- live updates -------------------------------------------------------------------

    async def append_message(self, message: AnyMessage) -> None:
        """Show a message that was just persisted (any role; a streamed reply ends with :meth:`end_reply`)."""
        await self._drop_empty_note()
        self._entries.append(message)
        if isinstance(message, ToolResultMessage):
            self._results[message.tool_call_id] = message
            view = self.tool_views.get(message.tool_call_id)
            if view is not None:
                view.finish(message)
                return
        view = view_for_message(message)
        if isinstance(view, AssistantMessageView):
            self._adopt(view, message)  # type: ignore[arg-type]
        await self.mount(view)

    async def sync_history(self, entries: list[Entry], *, unread: int = 0, before: Any = None) -> int:
        """Show ``entries`` (the whole thread, store order), keeping what is shown when it is a
        prefix of them: only the rest is appended. Otherwise everything is shown afresh.
        Returns how many entries were appended (all of them after a fresh show).

        With ``unread`` rows before them (``before``: the first one's row id), ``entries``
        are the thread's newest rows only: what is shown is kept when it ends with a first
        part of them, and the rest of them is appended."""
        if unread:
            kept = self._overlap(entries) if self.live is None else None
            if kept is None:
                await self.show(entries, unread=unread, before=before)
                return len(entries)
            entries = list(self._entries) + entries[kept:]
        shown = len(self._entries)
        if (
            self.live is None
            and shown <= len(entries)
            and all(_same(a, b) for a, b in zip(self._entries[-3:], entries[max(shown - 3, 0) : shown], strict=False))
        ):
            for entry in entries[shown:]:
                if isinstance(entry, CorruptRow):
                    self._entries.append(entry)
                    await self.mount(RawView(f"row {entry.row_id} could not be read: {entry.reason}", entry.raw))
                else:
                    await self.append_message(entry)
            return len(entries) - shown
        await self.show(entries)
        return len(entries)

    def _overlap(self, newest: list[Entry]) -> int | None:
        """How many of ``newest`` (a thread's newest rows) the entries held end with - the
        rest is new - or ``None`` when they do not end with a first part of them (judged, as
        :meth:`sync_history` judges a prefix, on up to three entries)."""
        held = self._entries
        for kept in range(len(newest), 0, -1):
            size = min(3, kept, len(held))
            if size and all(_same(a, b) for a, b in zip(held[-size:], newest[kept - size : kept], strict=True)):
                return kept
        return None

    async def drop_live(self) -> None:
        """Remove the streamed reply that will never be persisted (its runner is gone)."""
        if self.live is not None:
            live, self.live = self.live, None
            for call_id in live.tool_views:
                self.tool_views.pop(call_id, None)
            await live.remove()

    async def begin_reply(self, partial: AssistantMessage) -> AssistantMessageView:
        """Start showing a streamed reply."""
        await self._drop_empty_note()
        self.live = AssistantMessageView(partial, live=True)
        await self.mount(self.live)
        return self.live

    async def sync_reply(self, partial: AssistantMessage) -> None:
        """Show what the streamed reply gained since the last call."""
        if self.live is None:
            await self.begin_reply(partial)
        assert self.live is not None
        await self.live.sync(partial)
        self.tool_views.update(self.live.tool_views)

    async def end_reply(self, final: AssistantMessage) -> None:
        """The streamed reply was persisted as ``final``."""
        if self.live is None:
            await self.begin_reply(final)
        assert self.live is not None
        streamed = set(self.live.tool_views)
        await self.live.finish(final)
        for call_id in streamed - set(self.live.tool_views):
            self.tool_views.pop(call_id, None)  # a call the saved reply does not have
        self.tool_views.update(self.live.tool_views)
        self._entries.append(final)
        self.live = None

    def tool_started(self, call_id: str, started_at: float | None = None) -> None:
        """A tool began running call ``call_id``."""
        view = self.tool_views.get(call_id)
        if view is not None:
            view.start(started_at)

    def tool_progress(self, call_id: str, progress: float | None, text: str | None) -> None:
        """A running tool reported ``progress`` (0..1) and/or a status ``text``."""
        view = self.tool_views.get(call_id)
        if view is not None:
            view.report(progress, text)

    def tool_finished(self, result: ToolResultMessage) -> None:
        """A tool call ended with ``result`` (shown now; persisted right after)."""
        view = self.tool_views.get(result.tool_call_id)
        if view is not None:
            view.finish(result)

    def mark_dangling(self, diagnosis: Diagnosis) -> None:
        """Mark the calls a crashed run left without results."""
        for dangling in diagnosis.dangling:
            view = self.tool_views.get(dangling.call.id)
            if view is not None and view.status not in ("ok", "error", "interrupted", "aborted"):
                view.mark_dangling(dangling.status_words)

    async def _drop_empty_note(self) -> None:
        for note in self.query(".empty"):
            await note.remove()

    @property
    def held(self) -> tuple[Entry, ...]:
        """The entries read so far and held, mounted or not, in store order (for tests: a
        thread opened lazily holds its newest page and what was paged in since)."""
        return tuple(self._entries)

    @property
    def shown_count(self) -> int:
        """How many entries are mounted (for tests and the "earlier" button)."""
        return len(self._entries) - self._first_shown
