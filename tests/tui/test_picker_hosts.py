"""The picker names each leased thread's host, compactly enough for an 80-column terminal:
"running here", "running on build-7 (pid 412, beat 2 s ago)", "crashed at point 1 (between
turns) on build-7 (lease expired 40 s ago)", and a long host cut rather than the row."""

from __future__ import annotations

import os
import re
import time

import pytest

from core.checkpoint.base import Lease, RunRecord, ThreadSummary
from core.checkpoint.memory import MemoryCheckpointer
from core.lease_status import HOST_CHARS
from core.leases import HOST_ID_ENV
from core.messages import AssistantMessage, TextContent, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for
from tui.app import make_app
from tui.screens.threads import ThreadsScreen

LONG_HOST = "ip-10-0-3-17.eu-west-1.compute.internal"


def _leased_store(now: float) -> MemoryCheckpointer:
    def lease(thread: str, pid: int, host: str, beat_ago: float, expires_in: float) -> Lease:
        return Lease(thread, f"h-{thread}", pid, host, f"run-{thread}", now - 300, now - beat_ago, now + expires_in)

    def summary(thread: str, lease: Lease | None, *, done: bool = False) -> ThreadSummary:
        tail = (user_text("Forecast the revenue"),)
        if done:
            tail = (*tail, AssistantMessage(content=[TextContent(text="ok")]))
        runs = (RunRecord(f"run-{thread}", now - 300, now - 200 if done else None, 2 if done else None),)
        return ThreadSummary(
            thread, len(tail), now - 5, tail=tail, first_prompt="Forecast the revenue", lease=lease, runs=runs
        )

    rows = [
        summary("nightly", lease("nightly", 412, "build-7", 2, 60)),
        summary("weekly", lease("weekly", 977, "build-7", 55, -40)),
        summary("mine", lease("mine", os.getpid(), "desk", 1, 60)),
        summary("cloud", lease("cloud", 51, LONG_HOST, 1, 60)),
        summary("old", None, done=True),
    ]

    class Store(MemoryCheckpointer):
        async def list_threads(self) -> list[ThreadSummary]:
            return rows

    return Store()


def _line(text: str, thread: str) -> str:
    return next(line for line in text.splitlines() if f" {thread} " in line)


async def test_each_leased_thread_shows_its_host_and_lease_within_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ID_ENV, "desk")  # this app's host, as its own runs write it
    app = make_app(fast_session(_leased_store(time.time())))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadsScreen) and len(app.screen.rows) == 5 and "old" in screen_text(app),
            what="the picker",
        )
        text = screen_text(app)
        assert all(len(line) <= 80 for line in text.splitlines())
        # Whole, on the thread's own line, at 80 columns (ages read as the clock moved on since).
        assert re.search(r"running on build-7 \(pid 412, beat \d+ s ago\)", _line(text, "nightly"))
        expired = re.search(
            r"crashed at point \d \([a-z -]+\) on build-7 \(lease expired (\d+) s ago\)", _line(text, "weekly")
        )
        assert expired and int(expired[1]) >= 40
        assert "running here" in _line(text, "mine")
        assert re.search(
            rf"running on {re.escape(LONG_HOST[: HOST_CHARS - 1])}… \(pid 51, beat \d+ s ago\)", _line(text, "cloud")
        )
        assert "completed" in _line(text, "old")
        # The crash's age moves on without a reload, like a heartbeat's.
        first = int(expired[1])

        def aged() -> bool:
            now = re.search(r"lease expired (\d+) s ago", _line(screen_text(app), "weekly"))
            return now is not None and int(now[1]) >= first + 2

        await wait_for(pilot, aged, timeout=30, what="the expiry age growing")
