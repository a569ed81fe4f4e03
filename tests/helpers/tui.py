"""Helpers for the Textual tests: fast demo sessions, screen text, waiting, dialogs, the
picker, a run leased elsewhere (runner children: ``tests.helpers.supervise.Runner``).
Fixtures stay in ``tests/tui/conftest.py``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import App
from textual.pilot import Pilot

from core.checkpoint.base import Checkpointer, Lease
from core.checkpoint.memory import MemoryCheckpointer
from core.messages import user_text
from tui.cli import build_session
from tui.session import Session

FAST = 25.0
"""Demo speed for tests: tools take 0.1-0.3 s, text streams in a few hundred ms."""


def fast_session(
    store: Checkpointer | None = None,
    path: Path | None = None,
    *,
    speed: float = FAST,
    owner: str | None = None,
    **config: Any,
) -> Session:
    """A demo session on ``store`` (or the SQLite file at ``path``, opened for ``owner``:
    ``None`` the default owner, ``UNOWNED`` for cubeloop's threads) at test speed.
    ``config``: more of :func:`tui.cli.build_session`'s keywords (``tools``,
    ``make_provider``, ``alerts``, ...): a session's configuration is fixed once built."""
    return build_session(path, store=store, demo=True, demo_speed=speed, owner=owner, **config)


class Db:
    """A SQLite file the app under test uses; reads open their own short-lived store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def load(self, thread_id: str):  # type: ignore[no-untyped-def]
        """The thread as stored (``CheckpointData`` or ``None``)."""
        from core.checkpoint.sqlite import SQLiteCheckpointer

        store = await SQLiteCheckpointer.open(self.path, create=False)
        try:
            return await store.load(thread_id)
        finally:
            await store.close()

    async def list_threads(self):  # type: ignore[no-untyped-def]
        """Every thread's summary."""
        from core.checkpoint.sqlite import SQLiteCheckpointer

        store = await SQLiteCheckpointer.open(self.path, create=False)
        try:
            return await store.list_threads()
        finally:
            await store.close()


def screen_text(app: App[object]) -> str:
    """The plain text of the screen as drawn (the top screen, modal or not)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def squeezed(text: str) -> str:
    """``text`` without frames and whitespace, to find a sentence however it was wrapped."""
    return "".join(re.sub(r"[█▀▄▌▐▏▔▁│]", " ", text).split())


def squeezed_lines(text: str) -> str:
    """``text`` with each line stripped of frames and edge spaces, joined by single spaces
    (a sentence wrapped inside a dialog reads whole again)."""
    lines = (" ".join(re.sub(r"[█▀▄▌▐▏▔▁│▊▎▍▋▉]", " ", line).split()) for line in text.splitlines())
    return " ".join(line for line in lines if line)


def widget_text(root: object) -> str:
    """The text of every Static (and radio button label) under ``root``, in order, on one
    line with single spaces: what a dialog says, without the screen behind it."""
    from rich.text import Text
    from textual.widgets import RadioButton, Static

    parts: list[str] = []
    for widget in root.query("*"):  # type: ignore[attr-defined]
        if isinstance(widget, RadioButton):
            parts.append(("(•) " if widget.value else "( ) ") + str(widget.label))
        elif isinstance(widget, Static):
            content = widget.content
            parts.append(content.plain if isinstance(content, Text) else str(content))
    return " ".join(" ".join(parts).split())


async def wait_for(pilot: Pilot[object], predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Let the app run until ``predicate()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}:\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


async def wait_for_text(pilot: Pilot[object], text: str, timeout: float = 30.0) -> None:
    """Let the app run until ``text`` is on screen."""
    await wait_for(pilot, lambda: text in screen_text(pilot.app), timeout, repr(text))


async def burst(pilot: Pilot[object], key: str, count: int) -> None:
    """Press ``key`` ``count`` times as a terminal delivers a burst (a held key, fast
    typing): every key is queued before the app handles the first. ``Pilot.press`` lets
    each key's refresh and animations finish before the next, which hides what a burst
    does. Returns once the app is idle again."""
    from textual import events

    app = pilot.app
    assert app._driver is not None
    for _ in range(count):
        event = events.Key(key, key if len(key) == 1 else None)
        event.set_sender(app)
        app._driver.send_message(event)
    await pilot.pause()


async def type_text(pilot: Pilot[object], text: str) -> None:
    """Fill the modal's input with ``text`` (typing key by key is too slow for live runs)."""
    from textual.widgets import Input

    pilot.app.screen.query_one(Input).value = text
    await pilot.pause()


async def fill_dialog(pilot: Pilot[object], key: str, text: str) -> None:
    """Press ``key`` (n, s, f: a key that opens a text dialog) and fill the dialog with
    ``text``; Enter is left to the caller. Waits for the store on the first call's ``n``."""
    from tui.screens.modals import TextInputModal

    app = pilot.app
    await wait_for(pilot, lambda: app.session.store is not None, what="store open")
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what=f"the dialog of {key!r}")
    await type_text(pilot, text)


async def send_via_dialog(pilot: Pilot[object], key: str, text: str) -> None:
    """:func:`fill_dialog`, then Enter, and wait until the dialog has closed."""
    from tui.screens.modals import TextInputModal

    await fill_dialog(pilot, key, text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(pilot.app.screen, TextInputModal), what="the dialog closed")


async def open_from_picker(pilot: Pilot[object], thread_id: str) -> None:
    """Move the picker's cursor to ``thread_id`` and press Enter; wait until the thread is read."""
    from tui.screens.thread import ThreadScreen
    from tui.screens.threads import ThreadsScreen
    from tui.widgets.thread_table import ThreadTable

    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen) and bool(app.screen.rows), what="rows")
    table = app.screen.query_one(ThreadTable)
    # The table makes its rows a slice at a time after the screen got them (ThreadTable.settled).
    await wait_for(pilot, lambda: table.settled and thread_id in {r.thread_id for r in table.rows}, what="row shown")
    table.move_cursor(row=table.get_row_index(thread_id))
    await pilot.press("enter")
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ThreadScreen) and app.screen.thread_id == thread_id and app.screen.loaded,
        what=f"thread {thread_id} open",
    )


async def leased_elsewhere(
    thread_id: str = "busy", *, host: str = "far-box", heartbeat_ago: float = 0.0, expires_in: float = 120.0
) -> MemoryCheckpointer:
    """A memory store holding one thread (a user message) leased by pid 4242 on ``host``,
    whose last heartbeat was ``heartbeat_ago`` seconds ago and whose lease expires in
    ``expires_in`` seconds: a run elsewhere that no process here can probe."""
    store = MemoryCheckpointer()
    await store.append(thread_id, [user_text("work")])
    now = time.time()
    lease = Lease(thread_id, "holder", 4242, host, "r1", now - heartbeat_ago, now - heartbeat_ago, now + expires_in)
    await store.acquire_lease(lease, is_stale=lambda _l: True)
    return store


def hold_tool(session: Any, name: str) -> asyncio.Event:
    """Make the demo tool ``name`` of ``session`` (a :class:`tui.session.Session`) wait until
    the returned event is set before it does its work (then as usual): a run whose batch the
    test lets end when it chooses."""
    tool = next(t for t in session.config.tools if t.name == name)
    invoke, gate = tool.invoke, asyncio.Event()

    async def held(ctx, params):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await invoke(ctx, params)

    tool.invoke = held  # type: ignore[method-assign]
    return gate
