"""Appearance, compared with accepted SVG snapshots (``pytest --snapshot-update`` after looking)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from core.owners import UNOWNED
from tests.helpers.cubeloop_threads import run_cubeloop
from tests.helpers.tui import fast_session, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Messages show local clock times; pin the zone so the snapshot is the same everywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_crash_banner_of_a_cubeloop_thread(snap_compare: Any, fixture_copy: Path, utc: None) -> None:
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED), thread_id="multi-tool-partial")

    async def opened(pilot: Pilot[Any]) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(110, 32), run_before=opened)


def test_a_cubeloop_thread_waiting_for_an_answer(snap_compare: Any, tmp_path: Path, utc: None) -> None:
    # Written by the real cubeloop: its run asked a human question (HITL) and detached.
    db = tmp_path / "asked.sqlite"
    run_cubeloop(db, "ask_and_detach", "which-file", arg="run-ask-1")
    app = make_app(fast_session(path=db, owner=UNOWNED), thread_id="which-file")

    async def opened(pilot: Pilot[Any]) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(110, 24), run_before=opened)
