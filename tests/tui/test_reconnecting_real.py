"""The app on a real PostgreSQL database and a real Redis store whose connection is cut
(issue 8, item 5): the picker says "reconnecting" while the server is away, clears it by
itself when it is back, and shows a thread written meanwhile without a key pressed.

The app reaches the server through :class:`tests.helpers.cut_proxy.CutProxy`, which drops
every connection and refuses new ones while cut; the test writes through its own store
straight to the server, as another program would. ``tests/tui/test_reconnecting.py`` does
the same with a fake transport (and the given-up case).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.checkpoint.locations import describe_location, open_store
from core.messages import user_text
from tests.helpers.cut_proxy import CutProxy, through
from tests.helpers.store_backends import new_location
from tests.helpers.tui import FAST, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.cli import build_session
from tui.screens.threads import ThreadsScreen

WAIT = 60.0
"""Seconds any wait may take: a liveness bound for a loaded 2-core machine."""


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
        pytest.param("redis", marks=pytest.mark.redis, id="redis"),
    ]
)
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with new_location(request.param, tmp_path, "app") as found:
        yield found


async def test_the_picker_says_reconnecting_while_the_server_is_cut_off_and_recovers_by_itself(location: str) -> None:
    direct = await open_store(location, create=True)
    proxy = CutProxy.to(location)
    via = through(location, await proxy.start())
    shown = describe_location(via)
    try:
        await direct.append("before", [user_text("written before the cut")])
        app = make_app(build_session(via, demo=True, demo_speed=FAST))
        async with app.run_test(size=(140, 30)) as pilot:
            await wait_for_text(pilot, "written before the cut", timeout=WAIT)
            assert "reconnecting" not in screen_text(app)
            await proxy.cut()
            await wait_for(
                pilot,
                lambda: f"reconnecting to {shown}" in screen_text(app),
                timeout=WAIT,
                what="the reconnecting notice",
            )
            assert isinstance(app.screen, ThreadsScreen)
            # Another program writes while the app cannot reach the server.
            await direct.append("meanwhile", [user_text("written while the app was cut off")])
            assert "written while the app was cut off" not in screen_text(app)
            await proxy.restore()
            await wait_for(
                pilot, lambda: "reconnecting" not in screen_text(app), timeout=WAIT, what="the notice cleared"
            )
            await wait_for_text(pilot, "written while the app was cut off", timeout=WAIT)
            assert app.session.store_notice == "" and isinstance(app.screen, ThreadsScreen)
            assert "written before the cut" in screen_text(app)
    finally:
        await proxy.close()
        await direct.close()
