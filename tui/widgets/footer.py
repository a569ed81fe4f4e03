"""SteadyFooter: Textual's key footer, rebuilt only when the keys it shows change."""

from __future__ import annotations

from collections.abc import Hashable

from textual.screen import Screen
from textual.widgets import Footer


class SteadyFooter(Footer):
    """A :class:`~textual.widgets.Footer` that skips rebuilding when its keys are unchanged.

    Textual's footer recomposes (a new widget per key, each styled and mounted) every time
    its screen's bindings are refreshed, which happens on every screen switch: opening and
    closing the help with ``?`` rebuilt the screen's footer each time, about 14 % of the main
    thread's time while ``?`` was pressed repeatedly (profiled with pyinstrument). The keys
    shown (key, label, action, enabled, tooltip, group) are compared first; only a change
    rebuilds.
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown: Hashable | None = None

    def _keys(self, screen: Screen[object]) -> Hashable:
        """What :meth:`Footer.compose` would show for ``screen`` now."""
        shown = tuple(
            (binding.key, binding.description, binding.action, enabled, tooltip, binding.group)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show
        )
        return shown, self.show_command_palette, self.compact

    def bindings_changed(self, screen: Screen[object]) -> None:
        if self._bindings_ready and self.is_attached and screen is self.screen and screen.app.app_focus:
            keys = self._keys(screen)
            if keys == self._shown:
                return
            self._shown = keys
        super().bindings_changed(screen)
