"""The app on a server store whose connection breaks: it says "reconnecting", clears it when
the store is back, says in one sentence when it gave up, and recovers by itself.

The store is :mod:`tests.helpers.networked`'s: a memory store behind a fake connection,
each call retried by the real ``with_reconnect`` and opened from a ``postgresql://`` URL
through the app's own CLI path (``build_session`` -> ``core.checkpoint.locations``).
"""

from __future__ import annotations

import pytest

from core.messages import user_text
from tests.helpers import networked
from tests.helpers.tui import FAST, screen_text, send_via_dialog, squeezed, wait_for, wait_for_text, widget_text
from tui.app import make_app
from tui.cli import build_session
from tui.screens.modals import ConfirmModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen, owner_heading
from tui.widgets.status_bar import StatusBar

SECRET = "hunter2"
URL = f"postgresql://ann:{SECRET}@db.example:5432/agents"
SHOWN = "postgresql://ann@db.example:5432/agents"


def _session():  # type: ignore[no-untyped-def]
    return build_session(URL, demo=True, demo_speed=FAST)


async def test_the_picker_says_reconnecting_while_the_server_is_away_and_clears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 40 retries of 0.3 s: the calls keep waiting (not giving up) for as long as the test needs.
    link = networked.install(monkeypatch, networked.Link(delays=(0.3,) * 40))
    app = make_app(_session())
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        assert f"{owner_heading(app.session.owner, 0)}  in {SHOWN}" in screen_text(app)
        link.down = True
        await wait_for(
            pilot,
            lambda: f"reconnecting to {SHOWN} (attempt 2, next in 0.3 s)…" in screen_text(app),
            what="the reconnecting notice",
        )
        assert isinstance(app.screen, ThreadsScreen)
        assert SECRET not in screen_text(app)
        link.down = False
        await wait_for(pilot, lambda: "reconnecting" not in screen_text(app), what="the notice cleared")
        assert f"{owner_heading(app.session.owner, 0)}  in {SHOWN}" in screen_text(app)
        assert app.session.store_notice == ""


async def test_a_thread_screen_shows_reconnecting_in_its_status_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    link = networked.install(monkeypatch, networked.Link(delays=(0.3,) * 40))
    app = make_app(_session())
    async with app.run_test(size=(120, 30)) as pilot:
        await send_via_dialog(pilot, "n", "summarise sales")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded and not app.screen.running,
            timeout=60,
            what="the run finished",
        )
        bar = app.screen.query_one(StatusBar)
        link.down = True
        await wait_for(pilot, lambda: f"reconnecting to {SHOWN}" in bar.store, what="the status bar notice")
        await wait_for(pilot, lambda: "reconnecting to" in screen_text(app), what="the notice drawn")
        assert SECRET not in screen_text(app)
        link.down = False
        await wait_for(pilot, lambda: bar.store == "", what="the status bar cleared")


async def test_a_connection_given_up_on_is_one_sentence_and_the_picker_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = networked.install(monkeypatch, networked.Link(delays=(0.05, 0.05, 0.05)))
    app = make_app(_session())
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        link.down = True
        lost = f"Lost the connection to {SHOWN} and could not get it back"
        await wait_for(pilot, lambda: squeezed(lost) in squeezed(screen_text(app)), what="the sentence")
        assert isinstance(app.screen, ThreadsScreen) and app.is_running  # no error screen; still running
        assert SECRET not in screen_text(app)
        link.down = False
        # Written by another program meanwhile: the picker shows it without a key pressed.
        await link.stores[0].append("from-elsewhere", [user_text("hello from elsewhere")])
        await wait_for_text(pilot, "hello from elsewhere", timeout=60)
        await wait_for(pilot, lambda: squeezed(lost) not in squeezed(screen_text(app)), what="the sentence cleared")
        assert app.session.store_notice == ""


async def test_a_browse_only_server_store_asks_in_its_own_words_before_upgrading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = networked.install(monkeypatch, networked.Link(needs_upgrade=True))
    app = make_app(_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        assert "browse-only until upgraded" in screen_text(app)
        await send_via_dialog(pilot, "n", "summarise sales")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the upgrade question")
        store = link.stores[0]
        said = widget_text(app.screen)
        assert "Upgrade this database?" in said and store.upgrade_explanation in said
        assert "WAL" not in said  # the SQLite file's words are not this store's
        await pilot.press("y")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded and not app.screen.running,
            timeout=60,
            what="the run finished",
        )
    assert not store.needs_upgrade
    (thread,) = await store.list_threads()
    assert thread.first_prompt == "summarise sales"
