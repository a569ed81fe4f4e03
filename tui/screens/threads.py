"""ThreadsScreen: the picker. Every thread of the store's owner with its state; Enter opens one.

The header names whose threads these are and how many ("threads of alice · 12"): the store
is opened for one owner (:mod:`core.owners`) and lists only that owner's threads. When
the owner has none but the store holds threads that record no owner, the empty list says
how many and that ``--unowned`` opens them; other named owners' threads are never counted.
"""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.widgets.data_table import CellKey
from textual.worker import Worker

from core.checkpoint.base import not_deleted_sentence
from core.errors import CubepiError
from core.leases import deleted_sentence
from core.owners import UNOWNED, UNOWNED_LABEL
from core.recovery import ThreadState
from core.words import counted
from tui.messages import NewThread, OpenThread, ThreadsLoaded
from tui.screens.modals import ConfirmModal
from tui.session import Session, ThreadRow, state_label
from tui.text import clean, literal, one_line, relative_time
from tui.widgets.footer import SteadyFooter

_STATE_STYLES = {
    ThreadState.COMPLETED: "green",
    ThreadState.ABORTED: "yellow",
    ThreadState.FAILED: "red",
    ThreadState.CRASHED: "bold red",
    ThreadState.EMPTY: "dim",
    ThreadState.WAITING: "bold yellow",
}


def owner_heading(owner: str, count: int | None) -> str:
    """The picker's words for whose threads it lists: ``"threads of alice · 12"``, or
    ``"unowned threads · 3"`` for :data:`core.owners.UNOWNED`; without the count while the
    list is loading (``count`` ``None``)."""
    words = f"{UNOWNED_LABEL} threads" if owner == UNOWNED else f"threads of {owner}"
    return words if count is None else f"{words} · {count}"


def unowned_hint(count: int) -> str:
    """The empty list's line when ``count`` threads record no owner: how to open them."""
    if count == 1:
        return "1 thread has no owner: open it with --unowned"
    return f"{count} threads have no owner: open them with --unowned"


def state_text(row: ThreadRow) -> Text:
    """The picker's state cell (:func:`tui.session.state_label`), coloured."""
    if row.running:
        return Text(row.state, style="bold cyan")
    if row.elsewhere:
        return literal(row.state, style="bold magenta")  # names the lease holder's host, untrusted
    # A lease's host, the diagnosis' notes ("completed · 2 unreadable rows") and, waiting
    # for an answer, the question come from another program: untrusted, so shown literally.
    return literal(row.state, style=_STATE_STYLES.get(row.diagnosis.state, ""))


class ThreadTable(DataTable[Text | str]):
    """The picker's table: a DataTable that redraws its cells when a column's width changed.

    DataTable (Textual 8.2.8) measures columns on idle, after ``update_cell(...,
    update_width=True)``, and keeps cells drawn in between cached at the old width: a state
    column stayed as wide as a "running elsewhere" label gone since, pushing the first
    prompts off screen, until the next unrelated update.
    """

    def _update_column_widths(self, updated_cells: set[CellKey]) -> None:
        # DataTable's private measuring step, the one place widths change after update_cell;
        # re-check this override when upgrading Textual.
        before = [column.content_width for column in self.columns.values()]
        super()._update_column_widths(updated_cells)
        if [column.content_width for column in self.columns.values()] != before:
            self._clear_caches()
            self.refresh()


class ThreadsScreen(Screen[None]):
    """The list of threads, most recent first.

    | Key | Action |
    | :- | :- |
    | enter | open the thread |
    | n | new thread |
    | D | delete the thread (asks first) |
    | r | reload |
    | q | quit |
    """

    BINDINGS = [
        Binding("enter", "open", "Open", id="threads.open", tooltip="Open the selected thread"),
        Binding("n", "new_thread", "New thread", id="threads.new", tooltip="Start a new thread with a prompt"),
        Binding("D", "delete", "Delete", id="threads.delete", tooltip="Delete the selected thread (asks first)"),
        Binding("r", "reload", "Reload", id="threads.reload", tooltip="Read the thread list again"),
        Binding("q", "app.quit", "Quit", id="threads.quit", tooltip="Quit cubepi-tui"),
    ]

    loading_rows: reactive[bool] = reactive(False)
    """Whether a reload is in flight (the table shows a loading indicator)."""

    def __init__(self, session: Session) -> None:
        super().__init__(id="threads")
        self.session = session
        self.rows: list[ThreadRow] = []
        """The rows on screen, in table order."""
        self._reload_worker: Worker[None] | None = None
        self._prompt_cut = 0  # the width the first prompts were last cut to
        self._listed = False  # whether a listing arrived (the header then counts the rows)
        self._empty_shown = False  # whether the empty-list text is up (counted once per showing)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="threads-title")
        table = ThreadTable(id="threads-table", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("", id="threads-empty")
        yield SteadyFooter()

    def on_mount(self) -> None:
        self._add_columns()
        # Relative times age while the screen is open; redraw them without reloading.
        self.set_interval(30, self._refresh_times)
        # So does a run elsewhere's heartbeat: no write comes when its host died.
        self.set_interval(1, self._age_leases)

    def on_screen_resume(self) -> None:
        self.reload()

    def _title(self) -> Text:
        title = Text()
        title.append("cubepi-tui", style="bold")
        # Whose threads first: at 80 columns a long location wraps, the owner stays in view.
        title.append("  ")
        title.append(clean(owner_heading(self.session.owner, len(self.rows) if self._listed else None)), style="bold")
        title.append("  in ", style="dim")
        title.append(clean(self.session.location or "memory"))
        if self.session.needs_upgrade:
            title.append("  (browse-only until upgraded)", style="yellow")
        if self.session.store_notice:
            title.append("\n")
            title.append(clean(self.session.store_notice), style="bold yellow")
        return title

    def show_title(self) -> None:
        """Draw the header again (the store's location, mode and connection notice)."""
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
            rows = await self.session.rows()
        except CubepiError as error:
            self.post_message(ThreadsLoaded(error=str(error)))
            return
        self.post_message(ThreadsLoaded(rows=rows))

    def watch_loading_rows(self, loading: bool) -> None:
        # A run that ends while the app exits still asks for a reload, after Textual has
        # removed the table: there is nothing to show then.
        for table in self.query(DataTable):
            table.loading = loading and not self.rows

    @on(ThreadsLoaded)
    def _show_rows(self, message: ThreadsLoaded) -> None:
        self.loading_rows = False
        if not self.query(DataTable):
            return  # the app is exiting and has removed the table (see watch_loading_rows)
        if message.error is not None:
            self.notify(clean(message.error), severity="error", timeout=8, markup=False)
            return
        first = not self._listed
        self._listed = True
        if message.rows and message.rows == self.rows and self.query_one(DataTable).row_count == len(self.rows):
            if first:
                self.query_one("#threads-title", Static).update(self._title())
            return  # a snapshot that changed nothing shown (the table keeps its cursor and scroll)
        selected = self.selected_thread_id
        old, self.rows = self.rows, message.rows
        self.query_one("#threads-title", Static).update(self._title())
        table = self.query_one(DataTable)
        if [r.thread_id for r in old] == [r.thread_id for r in self.rows] and table.row_count == len(self.rows):
            self._update_cells(old)  # same threads in the same order: the cursor and scroll stay put
        else:
            self._fill_table(selected)
        empty = self.query_one("#threads-empty", Static)
        empty.display = not message.rows
        if message.rows:
            empty.update("")
            self._empty_shown = False
        elif not self._empty_shown:
            self._empty_shown = True
            empty.update(self._empty_text(0))
            if self.session.owner != UNOWNED:
                self._count_unowned()
        table = self.query_one(DataTable)
        table.display = bool(message.rows)
        if message.rows and self.focused is None:
            table.focus()

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

    def _add_columns(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("thread", key="thread")
        table.add_column("state", key="state")
        table.add_column("msgs", key="msgs")
        table.add_column("last activity", key="last")
        table.add_column("first prompt", key="prompt")

    def _fill_table(self, selected: str | None = None) -> None:
        """Show ``self.rows``, keeping the cursor on ``selected`` when it is still listed."""
        table = self.query_one(DataTable)
        # Columns too: a cleared table keeps each column's widest cell so far, so a long
        # label gone since (a run elsewhere) would keep its width and push the prompts off.
        table.clear(columns=True)
        self._add_columns()
        prompt_width = self._prompt_cut = self._prompt_width()
        for row in self.rows:
            table.add_row(
                Text(clean(row.thread_id), style="bold"),
                state_text(row),
                Text(str(row.message_count), justify="right"),
                Text(relative_time(row.last_activity)),
                Text(one_line(row.first_prompt, prompt_width)),
                key=row.thread_id,
            )
        if selected is not None and selected in {r.thread_id for r in self.rows}:
            table.move_cursor(row=table.get_row_index(selected))

    def _update_cells(self, old: list[ThreadRow]) -> None:
        """Redraw the cells of rows that changed (a heartbeat, a new message)."""
        table = self.query_one(DataTable)
        width = self._prompt_width()
        for before, row in zip(old, self.rows, strict=False):
            if before == row:
                continue
            key = row.thread_id
            table.update_cell(key, "state", state_text(row), update_width=True)
            table.update_cell(key, "msgs", Text(str(row.message_count), justify="right"))
            table.update_cell(key, "last", Text(relative_time(row.last_activity)))
            table.update_cell(key, "prompt", Text(one_line(row.first_prompt, width)), update_width=True)
        self._fit_prompts()

    def _fit_prompts(self) -> None:
        """Cut every first prompt again when the width left for them changed (a long state
        label came or went), so they use the free width without overflowing it."""
        width = self._prompt_width()
        if width == self._prompt_cut:
            return
        self._prompt_cut = width
        table = self.query_one(DataTable)
        for row in self.rows:
            table.update_cell(row.thread_id, "prompt", Text(one_line(row.first_prompt, width)), update_width=True)

    def _prompt_width(self) -> int:
        """What is left of the screen's width for the first prompt (at least 16 characters)."""
        if not self.rows:
            return 16
        fixed = max(len(clean(r.thread_id)) for r in self.rows) + max(len(state_text(r)) for r in self.rows)
        fixed += len("msgs") + len("last activity")
        return max(16, self.size.width - fixed - 2 * 5 - 2)  # cell padding, scrollbar

    def on_resize(self) -> None:
        if self.rows:
            self._fill_table(self.selected_thread_id)

    def _refresh_times(self) -> None:
        table = self.query_one(DataTable)
        for row in self.rows:
            table.update_cell(row.thread_id, "last", Text(relative_time(row.last_activity)))

    def _age_leases(self) -> None:
        """Redraw the heartbeat and expiry ages of each row showing its lease (a thread running
        elsewhere or crashed, see ``LeaseView.at``)."""
        table = self.query_one(DataTable)
        for index, row in enumerate(self.rows):
            if row.lease is None or row.running:
                continue
            view = row.lease.at(time.time())
            state = state_label(row.diagnosis, view, running=False)
            if state == row.state:
                continue
            self.rows[index] = row = replace(row, state=state, lease=view)
            table.update_cell(row.thread_id, "state", state_text(row), update_width=True)
        self._fit_prompts()

    @property
    def selected_thread_id(self) -> str | None:
        """The thread id under the cursor, if any."""
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None or table.cursor_row >= len(self.rows):
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return key

    # --- actions ------------------------------------------------------------------------

    @on(DataTable.RowSelected)
    def action_open(self) -> None:
        """Open the thread under the cursor."""
        thread_id = self.selected_thread_id
        if thread_id is not None:
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
            self.notify("No thread is selected, so there is nothing to delete.", timeout=4, markup=False)
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

    @work(exclusive=True, exit_on_error=False, group="delete")
    async def _delete(self, thread_id: str, row: ThreadRow | None) -> None:
        size = f" its {counted(row.message_count, 'message')} and" if row is not None else ""
        body = Text("Thread ")
        body.append_text(literal(thread_id, style="bold"))
        body.append(
            f",{size} everything else stored for it (runs, tool journal, jobs, steps, commands, lease) are "
            f"removed from {clean(self.session.location or 'this store')}. This cannot be undone."
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
