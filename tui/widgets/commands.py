"""CommandsBar: the thread's queued steers, follow-ups and aborts, and how far each got.

A command moves pending → delivered (its run took it: a steer, note or follow-up at a turn
boundary, an abort, stop or interrupt as soon as it was read) → applied (it took effect),
or ends refused (with the runner's note) or discarded. The bar shows the most recent few,
each with every status seen, so the user can tell an abort that is on its way from one
that landed; it lists the commands of a run in this app and of one elsewhere alike (both
go through the store's command table). One queued command can be selected (the thread
screen's keys edit or cancel it); once the run is over, the steers and follow-ups it never
delivered say so, until the user sends or discards them.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from core.checkpoint.base import TEXTLESS_KINDS, Command
from tui.text import one_line

SHOWN = 4
"""Commands listed at most (the most recent)."""

TEXT_CHARS = 40
"""Characters of a command's text shown at most (fewer when the line would not fit)."""

_TEXT_AT_LEAST = 6
"""Below this many characters of room the text is left out (a stub says nothing)."""

_STYLES = {"applied": "bold green", "refused": "bold red", "discarded": "dim", "delivered": "cyan", "pending": "yellow"}
KIND_WORDS = {
    "steer": "Steer",
    "follow_up": "Follow-up",
    "abort": "Abort",
    "stop": "Stop after this turn",
    "interrupt": "Interrupt and steer",
    "note": "Note",
}
"""A command's kind for people."""


class CommandsBar(Static):
    """The latest commands of this thread and their statuses; hidden while there are none."""

    DEFAULT_CSS = """
    CommandsBar {
        height: auto;
        max-height: 5;
        padding: 0 1;
        background: $boost;
        display: none;
        text-wrap: nowrap;
        text-overflow: ellipsis;
        &.-shown { display: block; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.commands: dict[int, Command] = {}
        """Every command seen, by ``seq``, in its latest state."""
        self.history: dict[int, list[str]] = {}
        """The statuses each command was seen in, in order."""
        self.selected: int | None = None
        """The ``seq`` of the command the edit and cancel keys act on, if any."""
        self.idle = False
        """Whether no run goes on: its undelivered steers and follow-ups wait for the user."""

    def track(self, command: Command) -> bool:
        """Record ``command``'s current state; return whether its status is new."""
        seen = self.history.setdefault(command.seq, [])
        self.commands[command.seq] = command
        fresh = not seen or seen[-1] != command.status
        if fresh:
            seen.append(command.status)
        self._redraw()
        return fresh

    def editable(self) -> list[Command]:
        """The steers and follow-ups the user may still edit or cancel, in send order: the
        pending ones, and while idle the delivered ones (their run ended before saving them)."""
        open_ = ("pending", "delivered") if self.idle else ("pending",)
        return [c for _, c in sorted(self.commands.items()) if c.kind not in TEXTLESS_KINDS and c.status in open_]

    def select_next(self) -> Command | None:
        """Select the next editable command (round to the first); ``None`` when there is none."""
        found = self.editable()
        if not found:
            self.selected = None
        else:
            later = [c for c in found if self.selected is None or c.seq > self.selected]
            self.selected = (later or found)[0].seq
        self._redraw()
        return self.chosen()

    def chosen(self) -> Command | None:
        """The selected command as last seen, while it is still editable."""
        return next((c for c in self.editable() if c.seq == self.selected), None)

    def set_idle(self, idle: bool) -> None:
        """Say whether a run goes on (see :attr:`idle`)."""
        if idle != self.idle:
            self.idle = idle
            self._redraw()

    def status_of(self, seq: int) -> str | None:
        """The latest status of command ``seq``, if seen."""
        command = self.commands.get(seq)
        return command.status if command is not None else None

    def _redraw(self) -> None:
        editable = self.editable()
        # The queue first: every command still the user's, then the latest others.
        waiting = [c.seq for c in editable]
        recent = sorted(set(waiting[-SHOWN:]) | set(sorted(self.commands)[-max(SHOWN - len(waiting), 0) :]))
        if len(waiting) >= SHOWN:
            recent = waiting[-SHOWN:]
        # One line per command, never wrapped: the quoted text gives way first, so the
        # statuses and the note stay readable on a narrow terminal.
        width = self.content_size.width or TEXT_CHARS * 3
        text = Text(no_wrap=True, overflow="ellipsis")
        for n, seq in enumerate(recent):
            command = self.commands[seq]
            if n:
                text.append("\n")
            head = Text("▶ " if seq == self.selected and command in editable else "  ")
            head.append(f"{KIND_WORDS.get(command.kind, command.kind).lower()} #{seq}", style="bold")
            tail = Text(": ")
            for i, status in enumerate(self.history.get(seq, [command.status])):
                if i:
                    tail.append(" → ", style="dim")
                tail.append(status, style=_STYLES.get(status, ""))
            if command.note:
                tail.append(f" ({one_line(command.note, len(command.note))})", style="italic")
            if self.idle and command in editable:
                tail.append(" (not delivered: the run ended)", style="italic")
            room = min(TEXT_CHARS, width - head.cell_len - tail.cell_len - 3)
            text.append_text(head)
            if command.text and room >= _TEXT_AT_LEAST:
                # Cut by cells, not characters: a wide character (CJK, emoji) takes two.
                quoted = Text(one_line(command.text, room))
                quoted.truncate(room, overflow="ellipsis")
                text.append(f" “{quoted.plain}”")
            text.append_text(tail)
        self.update(text)
        self.set_class(bool(recent), "-shown")

    def on_resize(self) -> None:
        self._redraw()
