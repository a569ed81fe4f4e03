"""ThreadsScreen: the picker. Every thread of the store's owner with its state; Enter opens one.

The header names whose threads these are and how many ("threads of alice · 12"): the store
is opened for one owner (:mod:`core.owners`) and lists only that owner's threads. When
the owner has none but the store holds threads that record no owner, the empty list says
how many and that ``--unowned`` opens them; other named owners' threads are never counted.

Threads waiting for an answer come first and read "waiting for you" (:mod:`tui.attention`),
and the header counts them; ``!`` shows only the threads needing attention. Each listing
is also where the app learns that a thread started waiting or its runner died: the
picker tells the app (``NeedsAttention``), which rings the bell.
"""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Input, Static
from textual.worker import Worker

from core.checkpoint.base import not_deleted_sentence
from core.errors import CubepiError
from core.leases import deleted_sentence
from core.owners import UNOWNED, UNOWNED_LABEL
from core.words import counted
from tui.actions import PICKER, bindings, picker_availability
from tui.attention import WAITING_WORDS, alert_sentence, waiting_first
from tui.messages import NeedsAttention, NewThread, OpenThread, ThreadsLoaded
from tui.screens.modals import ConfirmModal
from tui.session import Session, ThreadRow, state_label
from tui.text import clean, literal
from tui.widgets.footer import SteadyFooter
from tui.widgets.thread_table import ThreadTable


def owner_heading(
    owner: str, count: int | None, shown: int | None = None, *, attention: bool = False, waiting: int = 0
) -> str:
    """The picker's words for whose threads it lists: ``"threads of alice · 12"``, or
    ``"unowned threads · 3"`` for :data:`core.owners.UNOWNED`; ``"threads of alice · 3 of
    12"`` while a filter shows ``shown`` of the ``count``; ``"threads of alice needing
    attention · 3 of 12"`` with the needs-attention toggle on (``attention``); then
    ``" · 2 waiting for you"`` when ``waiting`` threads wait for an answer; without the
    count while the list is loading (``count`` ``None``)."""
    words = f"{UNOWNED_LABEL} threads" if owner == UNOWNED else f"threads of {owner}"
    if attention:
        words += " needing attention"
    if count is None:
        return words
    words = f"{words} · {count}" if shown is None else f"{words} · {shown} of {count}"
    return f"{words} · {waiting} {WAITING_WORDS}" if waiting else words


def unowned_hint(count: int) -> str:
    """The empty list's line when ``count`` threads record no owner: how to open them."""
    if count == 1:
        return "1 thread has no owner: open it with --unowned"
    return f"{count} threads have no owner: open them with --unowned"


class ThreadsScreen(Screen[None]):
    """The list of threads, most recent first. Its keys, what each does and when each is
    available: :data:`tui.actions.PICKER` and :func:`tui.actions.picker_availability`."""

    BINDINGS = bindings(PICKER)

    loading_rows: reactive[bool] = reactive(False)
    """Whether a listing is awaited (the table shows a loading indicator until the first)."""

    def __init__(self, session: Session) -> None:
        super().__init__(id="threads")
        self.session = session
        self.rows: list[ThreadRow] = []
        """Every listed row, in table order (the filter shows some of them)."""
        self._reload_worker: Worker[None] | None = None
        self._listed = False  # whether a listing arrived (the header then counts the rows)
        self._count = 0  # how many threads the last listing holds (some may be still to come)
        self._empty_shown = False  # whether the empty-list text is up (counted once per showing)
        self._waiting = 0  # how many listed threads wait for an answer

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="threads-title")
        # Hidden and disabled until / opens it: a hidden Input could still take the focus
        # (Textual moved it there when the table was hidden for an empty list).
        search = Input(placeholder="filter: thread id, first prompt or state", id="threads-filter", disabled=True)
        search.display = False
        yield search
        yield ThreadTable(id="threads-table")
        yield Static("", id="threads-empty")
        yield SteadyFooter()

    def on_mount(self) -> None:
        # Until the first listing arrives (this screen's reload or the app's watcher).
        self.loading_rows = True
        # Relative times age while the screen is open; redraw them without reloading.
        self.set_interval(30, self._refresh_times)
        # So does a run elsewhere's heartbeat: no write comes when its host died.
        self.set_interval(1, self._age_leases)

    def on_screen_resume(self) -> None:
        # A store that can be watched is kept current by the app's watcher: no second read.
        if not self.session.can_watch:
            self.reload()

    def _title(self) -> Text:
        title = Text()
        title.append("cubepi-tui", style="bold")
        # Whose threads first: at 80 columns a long location wraps, the owner stays in view.
        title.append("  ")
        count = self._count if self._listed else None
        shown = self._shown_count()
        attention = self._attention_only()
        heading = owner_heading(self.session.owner, count, shown, attention=attention, waiting=self._waiting)
        title.append(clean(heading), style="bold")
        title.append("  in ", style="dim")
        title.append(clean(self.session.config.location or "memory"))
        if self.session.needs_upgrade:
            title.append("  (browse-only until upgraded)", style="yellow")
        if self.session.store_notice:
            title.append("\n")
            title.append(clean(self.session.store_notice), style="bold yellow")
        return title

    def _shown_count(self) -> int | None:
        """How many rows the filter (or the needs-attention toggle) shows, ``None`` without one."""
        for table in self.query(ThreadTable).results(ThreadTable):
            if table.narrowed:
                return table.row_count
        return None

    def _attention_only(self) -> bool:
        return any(table.attention_only for table in self.query(ThreadTable).results(ThreadTable))

    def show_title(self) -> None:
        """Draw the header again (the store's location, mode, counts and connection notice)."""
        for title in self.query("#threads-title").results(Static):
            title.update(self._title())

    # --- loading ------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the thread list again in a worker (the newest request wins)."""
        if self.session.store is None:
            return
        self.loading_rows = True
        self._reload_worker = self._load_rows()

    @work(exclusive=True, exit_on_error=False, group="threads")
    async def _load_rows(self) -> None:
        try:
            update = await self.session.listing()
        except CubepiError as error:
            self.post_message(ThreadsLoaded(error=str(error)))
            return
        self.post_message(ThreadsLoaded(rows=update.rows, changed=update.changed, listed=update.listed))

    def watch_loading_rows(self, loading: bool) -> None:
        # A run that ends while the app exits still asks for a reload, after Textual has
        # removed the table: there is nothing to show then.
        for table in self.query(ThreadTable):
            table.loading = loading and not self.rows

    @on(ThreadsLoaded)
    def _show_rows(self, message: ThreadsLoaded) -> None:
        self.loading_rows = False
        if not self.query(ThreadTable):
            return  # the app is exiting and has removed the table (see watch_loading_rows)
        if message.error is not None:
            self.notify(clean(message.error), severity="error", timeout=8, markup=False)
            return
        first = not self._listed
        self._listed = True
        listed = len(message.rows) if message.listed is None else message.listed
        count_changed = listed != self._count
        (self.rows, waiting), self._count = waiting_first(message.rows), listed
        self._alert(first, message.changed, listed)
        count_changed = count_changed or waiting != self._waiting
        self._waiting = waiting
        table = self.query_one(ThreadTable)
        table.set_rows(self.rows, message.changed)  # its Shown message redraws what counts it
        if first or count_changed:
            self.show_title()
        self._show_empty()
        table.display = bool(self.rows)
        if self.rows and self.focused is None:
            table.focus()

    def _alert(self, first: bool, changed: frozenset[str] | None, listed: int) -> None:
        """Tell the app about each listed thread that started waiting for an answer or
        crashed since the last listing (:class:`~tui.attention.AttentionWatch`)."""
        rows = self.rows if first or changed is None else [row for row in self.rows if row.thread_id in changed]
        for row in self.session.rows_to_alert(rows, complete=len(self.rows) >= listed):
            self.app.post_message(NeedsAttention(row.thread_id, alert_sentence(row)))

    def _show_empty(self) -> None:
        """The line under the table: no threads yet (and the unowned ones), or no match."""
        empty = self.query_one("#threads-empty", Static)
        table = self.query_one(ThreadTable)
        if self.rows:
            self._empty_shown = False
            empty.display = table.narrowed and not table.row_count
            if empty.display and not table.filter_text:
                empty.update(
                    "No thread needs attention (waiting for you, crashed, failed or aborted); ! shows them all."
                )
            elif empty.display:
                empty.update(
                    Text.assemble(
                        "No thread's id, first prompt or state holds ",
                        literal(self.query_one("#threads-filter", Input).value, style="bold"),
                        ".",
                    )
                )
            return
        empty.display = True
        if not self._empty_shown:
            self._empty_shown = True
            empty.update(self._empty_text(0))
            if self.session.owner != UNOWNED:
                self._count_unowned()

    def _empty_text(self, unowned: int) -> Text:
        text = Text("No threads yet. Press n to start one.")
        if unowned:
            text.append("\n")
            text.append(unowned_hint(unowned), style="bold")
        return text

    @work(exclusive=True, exit_on_error=False, group="unowned")
    async def _count_unowned(self) -> None:
        """Say on the empty list how many threads record no owner, if any (``--unowned``)."""
        try:
            count = await self.session.unowned_count()
        except CubepiError:
            return  # the hint is a courtesy; the listing itself reports store errors
        empty = self.query_one("#threads-empty", Static)
        if count and not self.rows:
            empty.update(self._empty_text(count))

    def _refresh_times(self) -> None:
        self.query_one(ThreadTable).refresh_times()

    def _age_leases(self) -> None:
        """Redraw the heartbeat and expiry ages of each row showing its lease (a thread running
        elsewhere or crashed, see ``LeaseView.at``)."""
        now = time.time()
        aged: set[str] = set()
        for index, row in enumerate(self.rows):
            if row.lease is None or row.running:
                continue
            view = row.lease.at(now)
            state = state_label(row.diagnosis, view, running=False)
            if state != row.state:
                self.rows[index] = replace(row, state=state, lease=view)
                aged.add(row.thread_id)
        if aged:
            self.query_one(ThreadTable).set_rows(self.rows, aged)

    # --- filter -------------------------------------------------------------------------

    def action_filter(self) -> None:
        """Show the filter and type into it."""
        search = self.query_one("#threads-filter", Input)
        search.disabled = False
        search.display = True
        search.focus()

    def action_attention(self) -> None:
        """Show only the threads needing attention, or every thread again (the filter text
        still applies); the title counts the rows shown."""
        table = self.query_one(ThreadTable)
        table.set_attention_only(not table.attention_only)

    def action_clear_filter(self) -> None:
        """Clear and hide the filter; every row shows again."""
        search = self.query_one("#threads-filter", Input)
        search.value = ""
        search.display = False
        search.disabled = True
        self._filter_by("")
        self.query_one(ThreadTable).focus()

    @property
    def filter_open(self) -> bool:
        """Whether the filter is shown (``/`` opened it; Escape clears and hides it)."""
        return bool(self.query_one("#threads-filter", Input).display)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Whether ``action`` is available now, as :func:`tui.actions.picker_availability` rules."""
        return picker_availability(action, self)[0]

    @on(Input.Changed, "#threads-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self._filter_by(event.value)

    @on(Input.Submitted, "#threads-filter")
    def _filter_submitted(self) -> None:
        self.action_open()

    def _filter_by(self, text: str) -> None:
        self.query_one(ThreadTable).set_filter(text)

    @on(ThreadTable.Shown)
    def _table_shown(self) -> None:
        # The rows shown changed as a whole (new rows made, or the filter): "N of M" and
        # "no match" follow them.
        self.show_title()
        if self.rows:
            self._show_empty()

    def action_cursor(self, where: str) -> None:
        """Move the table's cursor: ``up``, ``down``, ``page_up`` or ``page_down``."""
        table = self.query_one(ThreadTable)
        moves = {
            "up": table.action_cursor_up,
            "down": table.action_cursor_down,
            "page_up": table.action_page_up,
            "page_down": table.action_page_down,
        }
        moves[where]()

    # --- actions ------------------------------------------------------------------------

    @property
    def selected_thread_id(self) -> str | None:
        """The thread id under the cursor, if any."""
        tables = self.query(ThreadTable)
        return tables.first().selected_thread_id if tables else None

    @on(ThreadTable.Selected)
    def _selected(self, message: ThreadTable.Selected) -> None:
        self.post_message(OpenThread(message.thread_id))

    def action_open(self) -> None:
        """Open the thread under the cursor."""
        thread_id = self.selected_thread_id
        if thread_id is None:
            self._nothing_selected("open")
            return
        self.post_message(OpenThread(thread_id))

    def action_new_thread(self) -> None:
        """Ask for a first prompt and start a new thread with it."""
        self.post_message(NewThread())

    def action_reload(self) -> None:
        """Reload the list."""
        self.reload()

    def action_delete(self) -> None:
        """Ask, then delete the thread under the cursor (refused while a run holds it)."""
        thread_id = self.selected_thread_id
        if thread_id is None:
            self._nothing_selected("delete")
            return
        row = next((r for r in self.rows if r.thread_id == thread_id), None)
        if row is not None and (row.running or self.session.is_running(thread_id)):
            self.notify(clean(not_deleted_sentence(thread_id, here=True)), timeout=6, markup=False)
            return
        if row is not None and row.elsewhere:
            lease = row.lease.lease if row.lease is not None else None
            self.notify(clean(not_deleted_sentence(thread_id, lease)), timeout=8, markup=False)
            return
        self._delete(thread_id, row)

    def _nothing_selected(self, doing: str) -> None:
        """Say why a key that acts on the thread under the cursor did nothing: no row is
        shown (no threads, or the filter matches none)."""
        self.notify(f"No thread is selected, so there is nothing to {doing}.", timeout=4, markup=False)

    @work(exclusive=True, exit_on_error=False, group="delete")
    async def _delete(self, thread_id: str, row: ThreadRow | None) -> None:
        size = f" its {counted(row.message_count, 'message')} and" if row is not None else ""
        body = Text("Thread ")
        body.append_text(literal(thread_id, style="bold"))
        body.append(
            f",{size} everything else stored for it (runs, tool journal, jobs, steps, commands, lease) are "
            f"removed from {clean(self.session.config.location or 'this store')}. This cannot be undone."
        )
        if not await self.app.push_screen_wait(ConfirmModal("Delete this thread?", body, yes="Delete")):
            return
        try:
            await self.session.delete(thread_id)
        except CubepiError as error:
            self.notify(clean(error), severity="error", timeout=10, markup=False)
            return
        self.notify(clean(deleted_sentence(thread_id)), timeout=4, markup=False)
        self.reload()
