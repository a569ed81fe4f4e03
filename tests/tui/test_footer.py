"""SteadyFooter: rebuilt once per change of the keys it shows, never for a screen covered by another."""

from __future__ import annotations

from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Static

from tests.helpers.tui import screen_text, wait_for
from tui.widgets.footer import SteadyFooter


class CountingFooter(SteadyFooter):
    """Counts its rebuilds."""

    def __init__(self) -> None:
        super().__init__()
        self.rebuilds = 0

    async def recompose(self) -> None:
        self.rebuilds += 1
        await super().recompose()


class KeysScreen(Screen[None]):
    """Shows ``z Zap`` in its footer while ``zap`` is on."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("z", "zap", "Zap"), Binding("y", "yell", "Yell")]

    def __init__(self) -> None:
        super().__init__()
        self.zap = True
        self.footer = CountingFooter()

    def compose(self) -> ComposeResult:
        yield Static("keys")
        yield self.footer

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.zap if action == "zap" else True


class Plain(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Static("on top")


class Keys(App[None]):
    def on_mount(self) -> None:
        self.push_screen(KeysScreen())


def _footer_line(app: App[object]) -> str:
    return screen_text(app).splitlines()[-1]


async def test_signals_before_a_refresh_rebuild_once_and_only_for_changed_keys() -> None:
    app = Keys()
    async with app.run_test(size=(60, 10)) as pilot:
        screen = app.screen
        assert isinstance(screen, KeysScreen)
        await wait_for(pilot, lambda: "Zap" in _footer_line(app), what="the keys shown")
        await pilot.pause()
        assert screen.footer.rebuilds == 1  # opening signals several times, for the same keys
        built = screen.footer.rebuilds
        for _ in range(3):
            screen.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert screen.footer.rebuilds == built  # the same keys: nothing rebuilt
        screen.zap = False
        for _ in range(3):
            screen.refresh_bindings()
        await wait_for(pilot, lambda: "Zap" not in _footer_line(app), what="the key gone")
        await pilot.pause()
        assert screen.footer.rebuilds == built + 1
        assert "Yell" in _footer_line(app)


async def test_a_covered_screens_footer_is_rebuilt_when_it_is_back_on_top() -> None:
    app = Keys()
    async with app.run_test(size=(60, 10)) as pilot:
        screen = app.screen
        assert isinstance(screen, KeysScreen)
        await wait_for(pilot, lambda: "Zap" in _footer_line(app), what="the keys shown")
        await app.push_screen(Plain())
        await wait_for(pilot, lambda: "on top" in screen_text(app), what="the other screen")
        built = screen.footer.rebuilds
        screen.zap = False
        screen.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert screen.footer.rebuilds == built  # unseen: not rebuilt
        app.pop_screen()
        await wait_for(pilot, lambda: "Yell" in _footer_line(app), what="the keys screen again")
        await wait_for(pilot, lambda: "Zap" not in _footer_line(app), what="its keys as they are now")
        assert screen.footer.rebuilds == built + 1


async def test_its_keys_are_made_as_textuals_footer_makes_them() -> None:
    """Same keys, same compact state and classes (so the same look) as Textual's Footer."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    class PlainFooterScreen(KeysScreen):
        def compose(self) -> ComposeResult:
            yield Static("keys")
            yield Footer()

    class PlainKeys(App[None]):
        def on_mount(self) -> None:
            self.push_screen(PlainFooterScreen())

    made = []
    for app in (Keys(), PlainKeys()):
        async with app.run_test(size=(60, 10)) as pilot:
            await wait_for(pilot, lambda app=app: "Zap" in _footer_line(app), what="the keys shown")
            await pilot.pause(0.1)
            keys = [(k.key, k.compact, sorted(k.classes)) for k in app.screen.query(FooterKey)]
            made.append((keys, _footer_line(app)))
    assert made[0] == made[1]
    assert ("ctrl+p", True, ["-command-palette", "-compact"]) in made[0][0]
