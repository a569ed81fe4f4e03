"""ToolCallView: one tool call, its live progress, and then its result.

A result shows its first and last lines (:data:`tui.tool_output.COLLAPSED`) with the
number hidden between. Focused (click it, ``t``, or Tab to it), ``x`` expands it: the
whole output in a box of at most :data:`EXPANDED_ROWS` rows that scrolls inside (again:
back to head and tail), and ``p`` opens it in the pager
(:class:`~tui.screens.pager.PagerScreen`), with search; a click on the result does what
``x`` does. Both draw only the rows on screen (:class:`~tui.screens.pager.OutputView`), so
they cost the same for 50,000 lines as for 50. Progress text shows its last lines
(:data:`~tui.tool_output.PROGRESS`).
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import ScrollableContainer
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import ProgressBar, Static

from core.messages import ToolCall, ToolResultMessage
from tui.actions import TOOL, Availability, bindings, bound_action, current_keymap, key_names, tool_availability
from tui.screens.pager import OutputView, PagerScreen
from tui.text import clean, clock, content_text, short_json
from tui.tool_output import COLLAPSED, MARK_STYLE, PROGRESS, Excerpt, count_lines, excerpt

EXPANDED_ROWS = 20
"""Screen rows of an expanded result's box at most; the box scrolls for the rest (and the
pager shows it full screen). 20 rows keep the call's neighbours in view on a 40-row terminal;
a shorter one gets a shorter box (:meth:`ToolCallView.fit_box`)."""


def settled_as(result: ToolResultMessage) -> str | None:
    """``"interrupted"`` (recorded by recovery) or ``"aborted"`` (cancelled after an abort), else ``None``."""
    settled = (result.metadata or {}).get("settled")
    return settled if settled in ("interrupted", "aborted") else None


SETTLED_NOTES = {
    "rerun": "↻ re-run by resume: the crashed run left it without a result",
    "reused": "♻ reused by resume: its job was already done, so the stored result was used (not run again)",
    "not_run": "not run: the run was aborted before this tool started",
    "job-reused": "♻ reused: an identical call's job was already done, so its stored result was used",
}
"""The note under a call whose result says how it was settled (``metadata["settled"]`` or ``{"job": "reused"}``)."""


def settled_note(result: ToolResultMessage) -> str | None:
    """What :data:`SETTLED_NOTES` says of ``result``, or ``None`` for an ordinary result."""
    metadata = result.metadata or {}
    settled = metadata.get("settled")
    if settled in SETTLED_NOTES:
        return SETTLED_NOTES[settled]
    if metadata.get("job") == "reused":
        return SETTLED_NOTES["job-reused"]
    return None


class ToolCallView(Widget, can_focus=True):
    """A tool call: name, id and arguments; a progress bar while it runs; its result after.

    ``status`` moves ``streaming`` (arguments still arriving) → ``pending`` → ``running``
    → ``ok`` | ``error`` | ``interrupted`` (settled by recovery) | ``aborted`` (cancelled
    after an abort); ``dangling`` marks a call of a crashed run that has no result and
    ``unanswered`` a stored call whose result is missing for another reason (an unreadable row).

    | Key (focused) | Action |
    | :- | :- |
    | x | the whole result in a box that scrolls inside; again: head and tail |
    | p | the whole result in the pager, searchable |
    """

    BINDINGS = bindings(TOOL)  # named in the thread's help, remappable by id

    DEFAULT_CSS = """
    ToolCallView {
        height: auto;
        margin: 0 0 1 2;
        padding: 0 1;
        border-left: outer $accent 50%;
        &:focus, &:focus-within { background: $boost; border-left: thick $accent; }
        .tool-full { margin: 0 0 1 0; }
        &.-ok { border-left: outer $success 60%; }
        &.-rerun { border-left: outer $secondary; }
        &.-reused { border-left: outer $success 30%; }
        &.-error, &.-interrupted, &.-aborted { border-left: outer $error; }
        &.-dangling { border-left: outer $warning; }
        #tool-header { height: auto; }
        #tool-progress { height: 1; display: none; }
        &.-running #tool-progress { display: block; }
        #tool-status { height: auto; color: $text-muted; }
        #tool-result { height: auto; display: none; }
        &.-ok #tool-result, &.-error #tool-result, &.-interrupted #tool-result, &.-aborted #tool-result {
            display: block;
        }
        &.-error #tool-result, &.-interrupted #tool-result, &.-aborted #tool-result { color: $text-error; }
    }
    """

    status: reactive[str] = reactive("pending")
    """Lifecycle state: streaming, pending, unanswered, running, ok, error, interrupted, aborted, dangling."""

    progress: reactive[float | None] = reactive(None)
    """Fraction done (0..1) the tool last reported, or ``None`` if it reports none."""

    status_text: reactive[str] = reactive("")
    """The tool's last short status text (untrusted, shown literally)."""

    expanded: reactive[bool] = reactive(False)
    """Whether the result shows whole, in a box that scrolls inside, rather than
    :data:`~tui.tool_output.COLLAPSED` (``x`` toggles it)."""

    settled: reactive[str] = reactive("")
    """How the result came about when it is not an ordinary run: ``rerun`` or ``reused`` (by
    resume), ``interrupted`` / ``aborted`` (see ``status``), ``not_run``, ``job-reused``; else ""."""

    def __init__(self, call: ToolCall, *, status: str = "pending", note: str = "") -> None:
        super().__init__(id=None)
        self.call_id = call.id
        self.tool_name = call.name
        self.arguments: dict[str, Any] = dict(call.arguments)
        self.started_at: float | None = None
        self._result: ToolResultMessage | None = None
        self._body = ""  # the result as text, raw (untrusted): what the pager shows
        self._shown: Excerpt | None = None  # what the result view shows of it now
        self._offered = (False, False)  # whether p and x are offered (see check_action)
        self._box: OutputView | None = None  # the whole result, while expanded
        self._showing_box = False  # a scroll to show the box waits for the next layout
        self._note = note
        self._ready = False  # children exist (set in on_mount, before is_mounted turns true)
        self._bar: ProgressBar | None = None  # made when the call first runs (see _progress_bar)
        self.set_reactive(ToolCallView.status, status)

    def compose(self) -> ComposeResult:
        yield Static(self._header(), id="tool-header")
        yield Static(id="tool-status")
        yield Static(id="tool-result")

    def on_mount(self) -> None:
        self._ready = True
        self._apply_status()

    # --- public API -------------------------------------------------------------------

    def set_arguments(self, arguments: dict[str, Any]) -> None:
        """Show the call's final arguments (they stream in pieces while the model writes them)."""
        self.arguments = dict(arguments)
        if self._ready:
            self.query_one("#tool-header", Static).update(self._header())
        if self.status == "streaming":
            self.status = "pending"

    def start(self, started_at: float | None = None) -> None:
        """Mark the call running (the tool began)."""
        self.started_at = started_at or time.time()
        self.status = "running"

    def report(self, progress: float | None, text: str | None) -> None:
        """Show the latest progress fraction and status text the tool reported."""
        if progress is not None:
            self.progress = max(0.0, min(1.0, progress))
        if text is not None:
            self.status_text = text
        if self.status in ("pending", "streaming", "unanswered"):
            self.status = "running"

    def finish(self, result: ToolResultMessage) -> None:
        """Show ``result`` and mark the call settled (ok, error or interrupted)."""
        self._result = result
        body = content_text(result.content)
        if not body and result.details is not None:
            body = short_json(result.details, 2000)
        self._body = body
        self._shown = None
        metadata = result.metadata or {}
        self.settled = str(metadata.get("settled") or ("job-reused" if metadata.get("job") == "reused" else ""))
        settled = settled_as(result)
        if settled is not None:
            self.status = settled
        else:
            self.status = "error" if result.is_error else "ok"
        if self._ready:
            self._apply_status()

    def mark_dangling(self, note: str) -> None:
        """Mark a call of a crashed run that has no result; ``note`` says whether it started."""
        self._note = note
        self.status = "dangling"

    @property
    def rows_at_least(self) -> int:
        """Screen rows this call takes at least, at any width, before it is mounted: its
        header's row and, once it has a result and is collapsed, one per line of the excerpt
        shown (wrapping only adds rows; margins and the status line are not counted)."""
        rows = 1
        if self._result is not None and self._body and not self.expanded:
            rows += self._excerpt().text.plain.count("\n") + 1
        return rows

    @property
    def output(self) -> str:
        """The result's whole text, raw (untrusted; "" before the result)."""
        return self._body

    @property
    def shown(self) -> Excerpt | None:
        """What the result view shows of :attr:`output` now (``None`` before the result)."""
        return self._shown

    # --- keys ---------------------------------------------------------------------------

    def _availability(self, action: str) -> Availability:
        return tool_availability(action, self, key_names(current_keymap(self.app)))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide x and p from the footer until there is a result worth expanding or paging,
        as :func:`tui.actions.tool_availability` rules."""
        return self._availability(action)[0]

    def on_key(self, event: events.Key) -> None:
        """x or p (whatever keys the keymap binds to them) pressed while they do nothing
        says in one sentence why, as the thread's keys do."""
        action = bound_action(self.screen, event.key, self)
        if action is None or self.check_action(action, ()):
            return
        reason = self._availability(action)[1]
        if reason is not None:
            # Stopped here, the key never reaches the bindings, which would ignore it silently.
            event.stop()
            event.prevent_default()
            self.notify(reason, timeout=6, markup=False)

    def action_expand(self) -> None:
        """Show more of the result, or (expanded already) less."""
        if self.check_action("expand", ()):
            self.expanded = not self.expanded

    def action_pager(self) -> None:
        """Open the whole result in the pager."""
        if self.check_action("pager", ()):
            self.app.push_screen(PagerScreen(f"{self.tool_name}  {self.call_id}", self._body))

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.id == "tool-result":
            self.action_expand()

    def watch_expanded(self, expanded: bool) -> None:
        if not self._ready or self._result is None:
            return
        box, self._box = self._box, None
        if box is not None:
            if box.has_focus:
                self.focus()
            # Removed, not hidden: a collapsed call keeps no copy of its lines. No id: a
            # box being removed may still be there when x mounts the next one.
            box.remove()
        if expanded:
            self._box = OutputView(self._body, classes="tool-full", max_rows=EXPANDED_ROWS)
            self.mount(self._box, after=self.query_one("#tool-result"))
            if self.has_focus:
                self._box.focus()  # arrow keys scroll it; x and p still reach this view
        self._render_result()
        if expanded:
            # The rows above the box (the note just rendered) are measured in the next layout.
            self.call_after_refresh(self.fit_box)

    def fit_box(self) -> None:
        """Make the expanded box short enough to show whole on screen below the call's
        header, status and note (at most :data:`EXPANDED_ROWS` rows): a box running below
        the screen scrolls inside to its end while its last rows stay out of sight. Called
        on expanding and whenever the transcript's view changes size; nothing when collapsed."""
        box, view = self._box, self._scroller()
        if box is None or view is None or not box.is_attached:
            return
        above = 0
        for child in self.children:
            if child is box:
                break
            if child.display:
                above += child.outer_size.height
        box.limit_rows(max(3, min(EXPANDED_ROWS, view.scrollable_content_region.height - above)))
        if box.has_focus:
            self._keep_box_in_sight()

    def on_output_view_moved(self) -> None:
        # The focused box grew (its lines read) or scrolled: keep it in sight, or End inside
        # it scrolls to rows below the screen.
        if self._box is not None and self._box.has_focus:
            self._keep_box_in_sight()

    def _scroller(self) -> ScrollableContainer | None:
        """The view this call scrolls in (the transcript), if any."""
        return next((a for a in self.ancestors if isinstance(a, ScrollableContainer)), None)

    def _keep_box_in_sight(self) -> None:
        # Once per layout: the regions it reads are those of the last layout, so a second
        # scroll before the next one would move the view twice.
        if not self._showing_box:
            self._showing_box = True
            self.call_after_refresh(self._show_box)

    def _show_box(self) -> None:
        """Scroll the transcript the least that shows the whole box, and the header above
        it too when both fit (:meth:`fit_box` makes them fit)."""
        self._showing_box = False
        box, view = self._box, self._scroller()
        if box is None or view is None or not box.is_attached or not box.region:
            return
        shown = view.scrollable_content_region
        at_least = box.region.bottom - shown.bottom  # scroll down this far to see its last row
        at_most = self.query_one("#tool-header").region.y - shown.y  # and no further, to see the header
        if at_least > at_most:
            at_most = box.region.y - shown.y  # the header does not fit too: the box's first row
        by = at_least if at_least > 0 else min(at_most, 0)
        if by:
            view.scroll_to(y=view.scroll_y + by, animate=False, immediate=True)

    # --- rendering ----------------------------------------------------------------------

    def _header(self) -> Text:
        header = Text()
        header.append("⚙ ", style="bold")
        header.append(clean(self.tool_name), style="bold")
        header.append(f"  {clean(self.call_id)}", style="dim")
        header.append("  ")
        header.append(short_json(self.arguments, 300))
        return header

    def watch_status(self) -> None:
        self._apply_status()

    def watch_progress(self, progress: float | None) -> None:
        if self._bar is not None:
            self._bar.update(total=1.0 if progress is not None else None, progress=progress or 0.0)

    def _progress_bar(self) -> ProgressBar:
        """The progress bar, made (under the header) the first time the call runs: a stored
        call never runs, and a bar is four widgets to mount, style and lay out - measured on
        a 10,000-message thread's first page, 18 of the 77 widgets mounted (issue 10)."""
        if self._bar is None:
            self._bar = ProgressBar(total=1.0, show_eta=False, id="tool-progress")
            self.mount(self._bar, after=self.query_one("#tool-header"))
        return self._bar

    def watch_status_text(self) -> None:
        self._update_status_line()

    def watch_settled(self) -> None:
        self._apply_status()

    def _apply_status(self) -> None:
        if not self._ready:
            return
        for name in (
            "streaming",
            "pending",
            "unanswered",
            "running",
            "ok",
            "error",
            "interrupted",
            "aborted",
            "dangling",
        ):
            self.set_class(self.status == name, f"-{name}")
        for name in ("rerun", "reused"):
            self.set_class(self.settled == name, f"-{name}")
        if self.status == "running" and self.is_attached:  # a removed call mounts nothing more
            progress = self.progress
            self._progress_bar().update(total=1.0 if progress is not None else None, progress=progress or 0.0)
        self._update_status_line()
        if self._result is not None:
            self._render_result()

    def _update_status_line(self) -> None:
        if not self._ready:
            return
        words = {
            "streaming": "model is writing the arguments…",
            "pending": "waiting to run",
            "unanswered": "no result stored",
            "running": f"running since {clock(self.started_at)}" if self.started_at else "running",
            "ok": "done",
            "error": "failed",
            "interrupted": "interrupted: settled as an error by recovery; check its effects",
            "aborted": "aborted: cancelled after the abort; check its effects",
            "dangling": f"no result: {self._note}" if self._note else "no result",
        }[self.status]
        line = Text()
        line.append(words, style="italic")
        note = self._result and settled_note(self._result)
        if note and self.status not in ("interrupted", "aborted"):
            line.append(" — ")
            line.append(note, style="bold italic")
        if self.status == "running" and self.status_text:
            line.append(" — ")
            line.append_text(excerpt(self.status_text, PROGRESS).text)
        self.query_one("#tool-status", Static).update(line)

    def _excerpt(self) -> Excerpt:
        """What the collapsed result shows: made once per result (a status change redraws
        the same excerpt)."""
        if self._shown is None:
            self._shown = excerpt(self._body, COLLAPSED)
        return self._shown

    def _render_result(self) -> None:
        assert self._result is not None
        shown = self._excerpt()
        if self.expanded:
            text = Text(f"{count_lines(shown.lines)}, all below (scroll inside) · x: less · p: pager, searchable")
            text.stylize(MARK_STYLE)
        else:
            text = shown.text.copy()
            if not shown.complete:
                text.append(f"\n{count_lines(shown.lines)} · x: all · p: pager, searchable", style=MARK_STYLE)
        self.query_one("#tool-result", Static).update(text)
        offered = (self.check_action("pager", ()) is True, self.check_action("expand", ()) is True)
        if offered != self._offered:
            self._offered = offered
            # The footer shows these keys only while this call has focus (a focus change
            # refreshes it anyway), and recomposing it costs tens of ms: not for every result.
            if self.has_focus_within:
                self.refresh_bindings()
