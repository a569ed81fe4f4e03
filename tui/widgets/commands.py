"""CommandsBar: the commands sent to a run in another process, and how far each got.

A command moves pending → delivered (its runner read it) → applied (it took effect), or
ends refused (with the runner's note) or discarded. The bar shows the most recent few,
each with every status seen, so the user can tell an abort that is on its way from one
that landed.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from core.checkpoint.base import Command
from tui.text import clean, one_line

SHOWN = 4
"""Commands listed at most (the most recent)."""

_STYLES = {"applied": "bold green", "refused": "bold red", "discarded": "dim", "delivered": "cyan", "pending": "yellow"}
_WORDS = {"abort": "abort", "steer": "steer", "follow_up": "follow-up"}


class CommandsBar(Static):
    """The latest commands of this thread and their statuses; hidden while there are none."""

    DEFAULT_CSS = """
    CommandsBar {
        height: auto;
        max-height: 5;
        padding: 0 1;
        background: $boost;
        display: none;
        &.-shown { display: block; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.commands: dict[int, Command] = {}
        """Every command seen, by ``seq``, in its latest state."""
        self.history: dict[int, list[str]] = {}
        """The statuses each command was seen in, in order."""

    def track(self, command: Command) -> bool:
        """Record ``command``'s current state; return whether its status is new."""
        seen = self.history.setdefault(command.seq, [])
        self.commands[command.seq] = command
        fresh = not seen or seen[-1] != command.status
        if fresh:
            seen.append(command.status)
        self._redraw()
        return fresh

    def status_of(self, seq: int) -> str | None:
        """The latest status of command ``seq``, if seen."""
        command = self.commands.get(seq)
        return command.status if command is not None else None

    def _redraw(self) -> None:
        recent = sorted(self.commands)[-SHOWN:]
        text = Text()
        for n, seq in enumerate(recent):
            command = self.commands[seq]
            if n:
                text.append("\n")
            text.append(f"{_WORDS.get(command.kind, command.kind)} #{seq}", style="bold")
            if command.text:
                text.append(f" “{one_line(command.text, 40)}”")
            text.append(": ")
            for i, status in enumerate(self.history.get(seq, [command.status])):
                if i:
                    text.append(" → ", style="dim")
                text.append(status, style=_STYLES.get(status, ""))
            if command.note:
                text.append(f" ({clean(command.note)})", style="italic")
        self.update(text)
        self.set_class(bool(recent), "-shown")
