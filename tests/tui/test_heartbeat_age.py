"""The heartbeat age of a run elsewhere counts up while no heartbeat comes (its host died,
say), in the picker and in the thread view's status bar."""

from __future__ import annotations

import re

from tests.helpers.tui import fast_session, leased_elsewhere, open_from_picker, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen

AGE = re.compile(r"running on far-box \(pid 4242, beat (\d+) s ago\)")


def _ages(text: str) -> list[int]:
    return [int(age) for age in AGE.findall(text)]


async def test_the_picker_counts_the_heartbeat_age_up() -> None:
    app = make_app(fast_session(await leased_elsewhere(heartbeat_ago=3)))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for(pilot, lambda: bool(_ages(screen_text(app))), what="the running-elsewhere label")
        first = _ages(screen_text(app))[0]
        assert first >= 3
        await wait_for(pilot, lambda: _ages(screen_text(app))[0] >= first + 2, timeout=5, what="the age growing")


async def test_the_status_bar_counts_the_heartbeat_age_up() -> None:
    app = make_app(fast_session(await leased_elsewhere(heartbeat_ago=3)))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for_text(pilot, "running on far-box")
        await open_from_picker(pilot, "busy")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await wait_for(pilot, lambda: screen.elsewhere is not None, what="the lease shown")

        def status_age() -> int | None:
            ages = _ages(screen_text(app).splitlines()[-2])
            return ages[0] if ages else None

        first = status_age()
        assert first is not None and first >= 3
        await wait_for(pilot, lambda: (status_age() or 0) >= first + 2, timeout=5, what="the age growing")
        # What r says of it is as current as the status bar.
        assert _ages(screen.elsewhere.label) and _ages(screen.elsewhere.label)[0] >= first + 2
        await pilot.press("r")
        await wait_for(
            pilot, lambda: any("cannot be resumed" in n.message for n in app._notifications), what="the notice"
        )
        (notice,) = [n.message for n in app._notifications if "cannot be resumed" in n.message]
        assert _ages(notice)[0] >= first + 2, notice
