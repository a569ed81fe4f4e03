"""The app on a real Redis store, opening and closing a thread again and again: each thread
screen's change watch ends with its screen, leaving no connection behind and no
"reconnecting" notice that was never a lost connection."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from core.checkpoint.redis import RedisCheckpointer
from core.messages import user_text
from tests.helpers.services import redis_prefix
from tests.helpers.store_locations import redis_location
from tests.helpers.tui import FAST, open_from_picker, screen_text, wait_for
from tui.app import make_app
from tui.cli import build_session
from tui.screens.threads import ThreadsScreen

pytestmark = pytest.mark.redis

CYCLES = 5


async def test_opening_and_closing_a_thread_leaks_no_connection_and_says_no_reconnect() -> None:
    async with redis_prefix("cycles") as (url, prefix):
        async with await RedisCheckpointer.open(url, prefix=prefix) as seed:
            await seed.append("t1", [user_text("hello")])
        app = make_app(build_session(redis_location(url, prefix), demo=True, demo_speed=FAST))
        admin = aioredis.from_url(url, socket_timeout=10)
        try:
            async with app.run_test(size=(120, 30)) as pilot:
                await wait_for(pilot, lambda: bool(app.threads_screen.rows), what="the thread listed")
                store = app.session.store
                assert isinstance(store, RedisCheckpointer)
                watches = f"{store.client_name}-changes"
                names: list[str] = []

                async def only_the_pickers() -> bool:
                    names[:] = await _connections(admin, watches)
                    return len(names) == 1  # the picker's own watch

                await _eventually(pilot, only_the_pickers)
                assert len(names) == 1, names
                for _ in range(CYCLES):
                    await open_from_picker(pilot, "t1")
                    await pilot.press("q")
                    await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="the picker again")
                # Each closed screen's watch is gone (its connection closed) before long.
                await _eventually(pilot, only_the_pickers)
                assert len(names) == 1, names
                assert app.session.store_notice == ""
                assert "reconnecting" not in screen_text(app)
        finally:
            await admin.aclose()


async def _connections(admin: aioredis.Redis, name: str) -> list[str]:
    """The connections named ``name`` (``CLIENT LIST``)."""
    return [e["name"] for e in await admin.client_list() if e.get("name") == name]


async def _eventually(pilot, check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check() and time.monotonic() < deadline:
        await pilot.pause(0.05)
