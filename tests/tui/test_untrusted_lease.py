"""A lease record is written by whatever process holds it: its host name is untrusted text
and must reach the screen literally (no markup, no escape sequences)."""

from __future__ import annotations

from tests.helpers.tui import fast_session, leased_elsewhere, open_from_picker, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen

HOST = "b\x1b[2J[red]evil[/]\u202e"  # within HOST_CHARS: shown whole


async def test_a_hostile_lease_host_is_shown_literally_in_the_picker_and_the_status_bar() -> None:
    app = make_app(fast_session(await leased_elsewhere(host=HOST)))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for_text(pilot, "running on b␛[2J[red]evil[/]\\u202e (pid 4242")
        await open_from_picker(pilot, "busy")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.elsewhere is not None,
            what="the thread view",
        )
        status = screen_text(app).splitlines()[-2]
        assert "on b␛[2J[red]evil[/]\\u202e" in status, status
        assert "\x1b" not in screen_text(app) and "\u202e" not in screen_text(app)
