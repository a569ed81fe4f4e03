"""SteadyFooter: Textual's key footer, rebuilt only when the keys it shows change."""

from __future__ import annotations

from collections.abc import Hashable

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.actions import RANKS, SHORT, UNRANKED
from tui.covering import covered


class SteadyFooter(Footer):
    """A :class:`~textual.widgets.Footer` that skips rebuilding when its keys are unchanged.

    Textual's footer recomposes (a new widget per key, each styled and mounted) every time
    its screen's bindings are refreshed, which happens on every screen switch: opening and
    closing the help with ``?`` rebuilt the screen's footer each time, about 14 % of the main
    thread's time while ``?`` was pressed repeatedly (profiled with pyinstrument). The keys
    shown (key, label, action, enabled, tooltip, group) are compared first; only a change
    rebuilds.

    The comparison is made once the screen has refreshed, for every change signalled
    before it: Textual queues one rebuild per signal, and opening a thread signalled three
    while its first page mounted, three rebuilds before its first frame (~60 ms of the
    10,000-message open's ~230 ms, measured: issue 10), two of them for the same keys.
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown: Hashable | None = None
        self._due = False  # a comparison is queued for after the next refresh

    def compose(self) -> ComposeResult:
        # Each key bound to this footer's compact state starts in it: made compact
        # (FooterKey's default), then bound to a footer that is not, each was styled three
        # times instead of once (a rebuild took ~23 ms, ~8 ms so; issue 10's profile). The
        # command palette's key is not bound (Footer.compose) and stays as made.
        for widget in self._fitted(list(super().compose())):
            if isinstance(widget, FooterKey) and not widget.has_class("-command-palette"):
                widget.set_reactive(FooterKey.compact, self.compact)
            yield widget

    def _fitted(self, widgets: list[Widget]) -> list[Widget]:
        """``widgets`` (Footer.compose's) made to fit the terminal's width: when the keys do
        not fit, the shorter labels of :data:`tui.actions.SHORT` are used, then the dimmed
        keys and those of the highest :data:`tui.actions.RANKS` are left out until the rest
        fit; the help says every key. The command palette's key always stays."""
        keys = [w for w in widgets if isinstance(w, FooterKey) and not w.has_class("-command-palette")]
        room = self.app.size.width - sum(_width(w) for w in widgets if isinstance(w, FooterKey) and w not in keys)
        if sum(map(_width, keys)) <= room:
            return widgets
        ids = {active.binding.key: active.binding.id for active in self.screen.active_bindings.values()}
        for key in keys:
            short = SHORT.get(ids.get(key.key) or "")
            if short is not None:
                key.description = short
        # Kept while they fit: the enabled before the dimmed, each in rank order, then in the
        # footer's order (a dimmed key does nothing now; the help still lists it).
        kept: set[int] = set()
        used = 0
        ranked = sorted(
            range(len(keys)),
            key=lambda i: (keys[i].has_class("-disabled"), RANKS.get(ids.get(keys[i].key) or "", UNRANKED), i),
        )
        for index in ranked:
            if used + _width(keys[index]) <= room:
                kept.add(index)
                used += _width(keys[index])
        dropped = {id(key) for index, key in enumerate(keys) if index not in kept}
        return [w for w in widgets if id(w) not in dropped]

    def _keys(self, screen: Screen[object]) -> Hashable:
        """What :meth:`Footer.compose` would show for ``screen`` now."""
        shown = tuple(
            (binding.key, binding.description, binding.action, enabled, tooltip, binding.group)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show
        )
        return shown, self.show_command_palette, self.compact, self.app.size.width

    def bindings_changed(self, screen: Screen[object]) -> None:
        # Footer.bindings_changed, with the rebuild queued once and only when the keys differ.
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen or self._due:
            return
        self._due = True
        self.call_after_refresh(self._rebuild)

    def on_resize(self) -> None:
        # Which keys fit depends on the width (see _fitted).
        if self._bindings_ready and self.is_attached and not self._due:
            self._due = True
            self.call_after_refresh(self._rebuild)

    async def _rebuild(self) -> None:
        self._due = False
        if not self.is_attached:
            return
        if covered(self.screen):
            # Its bindings are signalled again when its screen is back on top (Textual's
            # stack_updates), and compared then. Pushing a thread screen rebuilt the
            # picker's footer unseen (~14 ms of the open).
            return
        keys = self._keys(self.screen)
        if keys != self._shown:
            self._shown = keys
            await self.recompose()


def _width(key: FooterKey) -> int:
    """Cells ``key`` takes in a footer that is not compact: its key and label, each padded
    by a cell on either side but for the label's left (Textual's FooterKey CSS)."""
    if not key.description:
        return cell_len(key.key_display)
    return cell_len(key.key_display) + cell_len(key.description) + 3
