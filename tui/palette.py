"""The command palette (ctrl+p), guarded against a Textual crash.

Textual 8.2's option list reads its option-to-line map while paging (PageUp/PageDown), and
that map is empty until the list's first layout. A page key pressed within ~20 ms of
ctrl+p therefore raised ``KeyError: 0`` and ended the app (found by key mashing; also
reported against other apps, e.g. kagan-sh/kagan-legacy#31). Before that layout there is
nothing to page through, so the key is ignored.
"""

from __future__ import annotations

from textual.command import CommandList
from textual.command import CommandPalette as TextualCommandPalette

_PAGING = frozenset({"page_up", "page_down"})


class CommandPalette(TextualCommandPalette):
    """Textual's :class:`~textual.command.CommandPalette`, ignoring page keys sent to its
    list before the list has been laid out (see the module docstring)."""

    def _action_command_list(self, action: str) -> None:
        if action in _PAGING:
            commands = self.query_one(CommandList)
            if commands.option_count and not commands._index_to_line:  # not laid out yet
                return
        super()._action_command_list(action)
