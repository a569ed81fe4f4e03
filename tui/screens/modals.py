"""Modal screens: text input (prompt, steer, follow-up), confirmation, help, error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, ScreenResultType
from textual.widget import Widget
from textual.widgets import Button, Input, Static

from tui.actions import APP, PICKER, THREAD, Action, current_keymap, fill_keys, help_line, key_names, shown_key
from tui.text import literal


class OnceModal(ModalScreen[ScreenResultType]):
    """A modal that answers once.

    Keys typed fast (Enter Enter) can queue a second answer before the modal has closed;
    dismissing twice would pop the screen beneath it too, so later answers are ignored.
    """

    _answered = False

    def answer_once(self, result: ScreenResultType) -> None:
        """Dismiss with ``result`` unless this modal has already answered."""
        if self._answered:
            return
        self._answered = True
        self.dismiss(result)


MIN_BODY_ROWS = 3
"""Rows a confirmation's body keeps however short the terminal (then the buttons may not fit)."""


def fit_scroll(modal: ModalScreen[Any], dialog: Widget, scroll: Widget, *, least: int) -> None:
    """Let ``scroll``, the part of ``dialog`` that scrolls, take at most the rows the dialog
    has left within its share of ``modal`` (its ``max-height``) once its other children are
    drawn: whatever the terminal's height, the dialog's buttons stay on screen and that part
    scrolls instead (at 80x24 a fixed height cut them off). It keeps ``least`` rows however
    short the terminal (then the buttons may not fit). Call it after a refresh (the other
    children's sizes are read) and again on each resize."""
    share = dialog.styles.max_height
    most = modal.size.height if share is None else int(share.resolve(modal.size, modal.app.size))
    # Margins summed, not collapsed as the layout does: never more rows than they take.
    others = sum(
        child.outer_size.height + child.styles.margin.top + child.styles.margin.bottom
        for child in dialog.children
        if child is not scroll and child.display
    )
    rows = most - dialog.styles.gutter.height - others - scroll.styles.margin.top - scroll.styles.margin.bottom
    scroll.styles.max_height = max(least, rows)


class LineInput(Input):
    """An ``Input`` that submits the moment its Enter key is handled, in key order.

    Textual 8 runs Input's Enter binding only after the key has bubbled up unhandled, so
    keys that arrived in the same read as Enter (a fast typist's Enter then q) were
    inserted first and joined the text sent: "helloqq".
    """

    async def on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            await self.action_submit()


class TextInputModal(OnceModal[str | None]):
    """Ask for one line of text; dismisses with the text, or ``None`` on Escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="modal.cancel", tooltip="Close without sending")]

    def __init__(
        self, title: str, hint: str = "", *, placeholder: str = "", submit_label: str = "Send", value: str = ""
    ) -> None:
        """``value`` is the text the input starts with (a prompt offered again after a failed send)."""
        super().__init__(classes="modal")
        self._title = title
        self._hint = hint
        self._placeholder = placeholder
        self._submit_label = submit_label
        self._value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(literal(self._title, style="bold"), classes="title")
            if self._hint:
                yield Static(literal(self._hint), classes="hint")
            # Text offered again is for editing: selected, the first key typed would replace it all.
            yield LineInput(self._value, placeholder=self._placeholder, id="text", select_on_focus=False)
            with Horizontal(classes="buttons"):
                yield Button(self._submit_label, variant="primary", id="submit")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self._send(event.value)  # the text as it stood at Enter (see LineInput)

    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        """Dismiss with the entered text (ignored while empty)."""
        self._send(self.query_one("#text", Input).value)

    def _send(self, text: str) -> None:
        if text.strip():
            self.answer_once(text.strip())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        """Dismiss without text."""
        self.answer_once(None)


class ConfirmModal(OnceModal[bool]):
    """Ask a yes/no question; ``body`` is shown as given (build it from literal Text). A body
    taller than the dialog's share of the screen scrolls; the buttons stay on screen."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="modal.yes", tooltip="Agree"),
        Binding("n,escape", "answer(False)", "No", id="modal.no", tooltip="Decline"),
    ]

    DEFAULT_CSS = """
    ConfirmModal .dialog > VerticalScroll { height: auto; }
    """

    def __init__(self, title: str, body: Text | str, *, yes: str = "Yes", no: str = "No") -> None:
        super().__init__(classes="modal")
        self._title = title
        self._body = body if isinstance(body, Text) else literal(body)
        self._yes = yes
        self._no = no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(literal(self._title, style="bold"), classes="title")
            with VerticalScroll():
                yield Static(self._body, classes="body")
            with Horizontal(classes="buttons"):
                yield Button(f"{self._yes} (y)", variant="primary", id="yes")
                yield Button(f"{self._no} (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        """Let the body take the rows the dialog has left once its title and buttons are drawn
        (:func:`fit_scroll`)."""
        if self.is_attached:
            dialog = self.query_one(".dialog", Vertical)
            fit_scroll(self, dialog, dialog.query_one(VerticalScroll), least=MIN_BODY_ROWS)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.answer_once(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        """Dismiss with ``answer``."""
        self.answer_once(answer)


class ChangesModal(OnceModal[bool]):
    """A thread written by another definition of the agent: what changed, and the explicit
    override. ``a`` (or the button) accepts the changes and goes on, which records the
    override in the thread; Escape, ``c`` or ``n`` cancels and nothing runs. Dismisses with
    whether the user accepted."""

    BINDINGS = [
        Binding("a", "answer(True)", "Accept changes", id="changes.accept", tooltip="Go on; recorded in the thread"),
        Binding("c,n,escape", "answer(False)", "Cancel", id="changes.cancel", tooltip="Change nothing"),
    ]

    def __init__(self, thread_id: str, changes: Sequence[str], *, action: str = "go on") -> None:
        """``changes``: one short phrase each, as ``FingerprintMismatchError.changes`` says;
        ``action`` what accepting does ("send the prompt", "resume")."""
        super().__init__(classes="modal")
        self.thread_id = thread_id
        self.changes = tuple(changes)
        self._action = action

    def compose(self) -> ComposeResult:
        body = Text("Thread ")
        body.append_text(literal(self.thread_id, style="bold"))
        body.append(" was written by another definition of the agent:\n")
        for change in self.changes or ("(the store named no change)",):
            body.append("  • ")
            body.append_text(literal(change))
            body.append("\n")
        body.append(
            f"\nPress a to accept these changes and {self._action}: the override (who, when, what changed) "
            "is recorded in the thread. Cancel changes nothing."
        )
        with Vertical(classes="dialog"):
            yield Static(Text("The agent's definition changed", style="bold"), classes="title")
            yield Static(body, id="changes-body", classes="body")
            with Horizontal(classes="buttons"):
                yield Button("Accept changes (a)", variant="warning", id="accept")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()  # the safe answer under Enter

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.answer_once(event.button.id == "accept")

    def action_answer(self, answer: bool) -> None:
        """Dismiss with ``answer``."""
        self.answer_once(answer)


class ErrorScreen(OnceModal[None]):
    """One sentence about what went wrong; ``q`` quits, Escape goes back (unless ``fatal``)."""

    BINDINGS = [
        Binding("q", "app.quit", "Quit", id="error.quit", tooltip="Quit cubepi-tui"),
        Binding("escape,enter", "close", "Back", id="error.back", tooltip="Close this message"),
    ]

    def __init__(self, sentence: str, *, fatal: bool = False, hint: str = "") -> None:
        super().__init__(classes="modal")
        self.sentence = sentence
        """The one sentence shown (untrusted: displayed literally)."""
        self.fatal = fatal
        """Whether the app cannot go on (only q works)."""
        self._hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -error"):
            yield Static(Text("Error", style="bold"), classes="title")
            yield Static(literal(self.sentence), id="error-sentence", classes="body")
            keys = "Press q to quit." if self.fatal else "Press q to quit, or Escape to go back."
            yield Static(Text(f"{self._hint} {keys}".strip(), style="dim"), classes="hint")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "close" and self.fatal)

    def action_close(self) -> None:
        """Close the message."""
        self.answer_once(None)


HelpSection = tuple[str, tuple[tuple[str, str], ...] | str]
"""A help section: a title and either (keys, meaning) rows or a paragraph."""

_PARAGRAPHS: tuple[HelpSection, ...] = (
    (
        "Crash points (what the picker and the banner report)",
        (
            ("1  between turns", "the last user message was never answered: resume calls the model"),
            ("2  after tool result", "every call has its result, the next model call never finished"),
            (
                "3  mid-tool",
                "a tool call has no result: resume settles each call first - an idempotent tool is "
                "re-run (or its done job's stored result reused), any other call is marked interrupted "
                "unless you choose to re-run it - then calls the model",
            ),
        ),
    ),
    (
        "Running elsewhere",
        'A thread another process runs (another window, or `cubepi-tui run`) shows as "running '
        'on HOST (pid, heartbeat)". Open it to follow it live; {thread.abort}, {thread.steer} and '
        "{thread.follow_up} are sent to that "
        "process and the commands bar shows pending -> delivered -> applied, or refused with the "
        "reason. It cannot be resumed until that run ends or its lease expires; then it shows as "
        '"crashed on HOST". HOST is CUBEPI_HOST_ID where the run started, else its host name.',
    ),
    (
        "Owners",
        "The list shows only the threads of the owner the store was opened for (--owner, else "
        "CUBEPI_OWNER, else your user name); another owner's thread reads as missing. Threads that "
        "record no owner (cubeloop's, or older ones) open with --unowned. A thread written by another "
        "definition of the agent (system prompt, tools, model, workflow) says what changed before a "
        "prompt or resume: a accepts the changes (recorded in the thread), Escape cancels.",
    ),
    (
        "",
        "A browse-only database (cubeloop's) asks before it is upgraded for writing.\n"
        "Tool output is shown literally: markup and terminal escapes appear as text.",
    ),
)
"""The help's sections that are not keys (a paragraph's ``{ID}`` names that action's keys now)."""


def help_sections(keymap: Mapping[str, str]) -> tuple[HelpSection, ...]:
    """The help screen's sections, the keys named as ``keymap`` binds them now (binding id
    → keys; see :func:`tui.actions.current_keymap`)."""
    name = key_names(keymap)

    def rows(table: Sequence[Action]) -> tuple[tuple[str, str], ...]:
        return tuple(help_line(action, name) for action in table if action.help is not None)

    everywhere = (*rows(APP), (shown_key(App.COMMAND_PALETTE_BINDING), "command palette"))
    return (
        ("Threads (the picker)", rows(PICKER)),
        ("Thread view", rows(THREAD)),
        ("Everywhere", everywhere),
        *((title, fill_keys(body, name) if isinstance(body, str) else body) for title, body in _PARAGRAPHS),
    )


def help_renderable(keymap: Mapping[str, str]) -> RenderableType:
    """:func:`help_sections` laid out with hanging indents: a wrapped meaning stays in its column."""
    parts: list[RenderableType] = []
    for title, body in help_sections(keymap):
        if parts:
            parts.append(Text(""))
        if title:
            parts.append(Text(title, style="bold"))
        if isinstance(body, str):
            parts.append(Padding(Text(body), (0, 0, 0, 2 if title else 0)))
            continue
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(no_wrap=True, min_width=6)
        grid.add_column(ratio=1)
        for key, meaning in body:
            grid.add_row(Text(key), Text(meaning))
        parts.append(Padding(grid, (0, 0, 0, 2)))
    return Group(*parts)


class _LaidOutHelp:
    """:func:`help_renderable` for one keymap, laid out once per width and replayed from then on.

    Rich's table layout of the help was about a tenth of the main thread's time while ``?``
    was pressed repeatedly (profiled with pyinstrument), run afresh on every opening; the text
    changes only with the keymap, so each (keymap, width)'s lines are kept (a few widths per
    session, ~20 kB each).
    """

    _lines: ClassVar[dict[tuple[frozenset[tuple[str, str]], int], list[list[Segment]]]] = {}
    _measures: ClassVar[dict[frozenset[tuple[str, str]], Measurement]] = {}

    def __init__(self, keymap: Mapping[str, str]) -> None:
        self.keymap = frozenset(keymap.items())
        """The keymap the help names keys by (binding id, keys)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        lines = self._lines.get((self.keymap, width))
        if lines is None:
            laid_out = console.render_lines(help_renderable(dict(self.keymap)), options, pad=False)
            lines = self._lines[self.keymap, width] = laid_out
        new_line = Segment.line()
        for line in lines:
            yield from line
            yield new_line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        measure = self._measures.get(self.keymap)
        if measure is None:
            # Measured unbounded once; each caller's bound is applied below.
            wide = options.update_width(10_000)
            measure = self._measures[self.keymap] = Measurement.get(console, wide, help_renderable(dict(self.keymap)))
        return measure.clamp(max_width=options.max_width)


class HelpScreen(OnceModal[None]):
    """Keys of every screen and what the crash points mean.

    Opaque, unlike the other modals: a translucent modal re-renders the whole screen beneath
    it through Rich and tints every segment on each frame it paints (Textual's
    ``BackgroundScreen``), which was a quarter of the CPU time of opening the help (profiled
    with pyinstrument) and ran again on every stream flush while it stayed open. Its rule is
    in app.tcss (the app's CSS outranks a widget's default CSS).
    """

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close", tooltip="Close help")]

    def __init__(self) -> None:
        super().__init__(classes="modal")

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog -help"):
            yield Static(Text("cubepi-tui help", style="bold"), classes="title")
            yield Static(_LaidOutHelp(current_keymap(self.app)), id="help-body", classes="body")
            yield Static(Text("Escape closes this help.", style="dim"), classes="hint")

    def on_screen_resume(self) -> None:
        # The app keeps this screen and shows it again: each showing answers once.
        self._answered = False
        keymap = current_keymap(self.app)
        for body in self.query("#help-body").results(Static):
            shown = body.content
            if isinstance(shown, _LaidOutHelp) and shown.keymap != frozenset(keymap.items()):
                body.update(_LaidOutHelp(keymap))  # the keys were remapped since it was last shown

    def action_close(self) -> None:
        """Close the help."""
        self.answer_once(None)
