"""The picker on cubeloop's crash-point database: every thread with its diagnosis, read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, ToolResultMessage
from core.owners import UNOWNED
from core.recovery import ThreadState, diagnose
from tests.helpers.tui import (
    fast_session,
    open_from_picker,
    screen_text,
    squeezed,
    squeezed_lines,
    wait_for,
    wait_for_text,
)
from tui.app import make_app
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.thread_table import ThreadTable

# The crash-point database's crash_point -> this project's diagnosis label.
LABELS = {
    "after_user_before_assistant": "crashed at point 1 (between turns)",
    "after_tool_result_before_next_assistant": "crashed at point 2 (after tool result)",
    "mid_tool_dangling_tool_call": "crashed at point 3 (mid-tool)",
    "mid_tool_batch_partial_results": "crashed at point 3 (mid-tool)",
    "none_completed": "completed",
    "aborted_by_host": "aborted",
}


def _expected(spec: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {t["thread_id"]: (LABELS[t["crash_point"]], len(t["roles"])) for t in spec["threads"]}


async def test_picker_lists_every_fixture_thread_with_its_label_and_changes_no_byte(
    fixture_copy: Path, fixture_json: dict[str, Any]
) -> None:
    before = fixture_copy.read_bytes()
    expected = _expected(fixture_json)
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == len(expected), what="all rows")
        rows = {r.thread_id: r for r in app.threads_screen.rows}
        assert {tid: (r.state, r.message_count) for tid, r in rows.items()} == expected

        def drawn() -> bool:  # the rows change before the table is redrawn
            lines = [f" {line} " for line in screen_text(app).splitlines()]
            return all(any(f" {tid} " in line for line in lines) for tid in expected)

        await wait_for(pilot, drawn, what="every row drawn")
        text = screen_text(app)
        for thread_id, (label, _) in expected.items():
            line = next(line for line in text.splitlines() if f" {thread_id} " in f" {line} ")
            assert label in line, line
        assert squeezed("browse-only until upgraded") in squeezed(text)
        # Open every thread and come back: browsing never writes.
        for thread_id in expected:
            await open_from_picker(pilot, thread_id)
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker again")
    assert fixture_copy.read_bytes() == before
    assert not Path(f"{fixture_copy}-wal").exists()


async def test_resume_a_foreign_crashed_thread_after_agreeing_to_upgrade(fixture_copy: Path) -> None:
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED))
    async with app.run_test(size=(130, 40)) as pilot:
        await open_from_picker(pilot, "crash-mid-tool")
        await wait_for_text(pilot, "Crashed mid-tool (point 3)")
        assert "may have started" in screen_text(app)  # cubeloop keeps no tool journal
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="resume plan")
        text = screen_text(app)
        assert "may have started" in text  # cubeloop keeps no tool journal
        assert "marked interrupted, not re-run (this agent has no tool named slow_step)" in squeezed_lines(text)
        await pilot.press("y")
        await wait_for(pilot, lambda: "Upgrade this database?" in screen_text(app), what="upgrade question")
        assert "WAL" in screen_text(app) and "cubeloop can still" in screen_text(app)
        await pilot.press("y")
        await wait_for_text(pilot, "Some steps did not finish", timeout=60)
        await wait_for(pilot, lambda: not screen.running, what="run finished")
        text = screen_text(app)
        assert "interrupted: settled as an error by recovery" in text
        assert "completed" in text.splitlines()[-2]
    store = await SQLiteCheckpointer.open(fixture_copy, owner=UNOWNED)
    try:
        data = await store.load("crash-mid-tool")
    finally:
        await store.close()
    assert data is not None
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert [r.tool_call_id for r in results] == ["call_slow_1"] and results[0].is_error
    assert isinstance(data.messages[-1], AssistantMessage) and data.messages[-1].stop_reason == "stop"
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_declining_the_upgrade_leaves_the_file_alone(fixture_copy: Path) -> None:
    before = fixture_copy.read_bytes()
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED))
    async with app.run_test(size=(130, 40)) as pilot:
        await open_from_picker(pilot, "crash-after-user")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="resume plan")
        await wait_for_text(pilot, "Resume calls the model again")  # drawn after the push
        await pilot.press("y")
        await wait_for(pilot, lambda: "Upgrade this database?" in screen_text(app), what="upgrade question")
        await pilot.press("n")
        await wait_for(pilot, lambda: any("stays browse-only" in n.message for n in app._notifications), what="notice")
    assert fixture_copy.read_bytes() == before


async def test_picker_follows_changes_made_by_another_program(tmp_path: Path) -> None:
    from core.messages import user_text

    path = tmp_path / "shared.sqlite"
    app = make_app(fast_session(path=path))
    async with app.run_test(size=(130, 30)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        other = await SQLiteCheckpointer.open(path)  # a second writer, as another process would be
        try:
            await other.append("from-elsewhere", [user_text("written by another program")])
        finally:
            await other.close()
        await wait_for_text(pilot, "from-elsewhere", timeout=5)
        assert "crashed at point 1 (between turns)" in screen_text(app)


async def test_a_thread_leased_by_another_process_shows_as_running_elsewhere() -> None:
    import time

    from core.checkpoint.base import Lease, ThreadSummary
    from core.messages import user_text
    from tui.session import Session

    lease = Lease("busy", "other-holder", 4242, "build-box", "run-9", time.time(), time.time(), time.time() + 60)

    class LeasedStore(MemoryCheckpointer):
        async def list_threads(self) -> list[ThreadSummary]:
            return [ThreadSummary("busy", 1, time.time(), tail=(user_text("work"),), first_prompt="work", lease=lease)]

    session = fast_session(LeasedStore())
    assert isinstance(session, Session)
    app = make_app(session)
    async with app.run_test(size=(130, 30)) as pilot:
        await wait_for_text(pilot, "running on build-box (pid 4242, beat")


async def test_a_reload_while_the_app_exits_draws_nothing_and_raises_nothing() -> None:
    # A run that ends while the app exits still asks the picker to reload, after Textual
    # has removed its table: that used to end the exit with NoMatches (seen in CI).
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.screen is app.threads_screen, what="the picker")
        await app.threads_screen.query_one(ThreadTable).remove()
        app.threads_screen.reload()
        await wait_for(pilot, lambda: not app.threads_screen.loading_rows, what="the reload to finish")
        assert app.is_running
