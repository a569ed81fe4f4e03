"""An abort sent to a runner that dies before taking it ends refused, not pending for good."""

from __future__ import annotations

from core.commands import ORPHANED_ABORT
from tests.helpers.tui import fast_session, leased_elsewhere, open_from_picker, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen


async def test_an_abort_a_dead_runner_never_took_is_shown_refused_once_its_lease_expires() -> None:
    # A runner on another host that stopped heartbeating: its lease runs out in 3 s.
    store = await leased_elsewhere(expires_in=3)
    await store.claim_run("busy", "r1")
    app = make_app(fast_session(store))
    async with app.run_test(size=(130, 30)) as pilot:
        await wait_for_text(pilot, "running on ")
        await open_from_picker(pilot, "busy")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.elsewhere is not None,
            what="the thread followed",
        )
        screen = app.screen
        await pilot.press("a")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "pending", what="the abort sent")
        await wait_for(pilot, lambda: screen.commands_bar.status_of(1) == "refused", timeout=30, what="refused")
        assert "crashed" in screen_text(app).splitlines()[-2]
    (command,) = await store.list_commands("busy")
    assert (command.status, command.note) == ("refused", ORPHANED_ABORT)
