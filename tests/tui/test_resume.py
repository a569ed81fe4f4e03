"""The crash banner and ``r``: a crashed thread shows where it stopped, and resumes to completion."""

from __future__ import annotations

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.recovery import ThreadState, diagnose
from tests.tui.conftest import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.modals import ConfirmModal
from tui.screens.thread import ThreadScreen
from tui.widgets.crash_banner import CrashBanner
from tui.widgets.tool_call import ToolCallView


async def _crashed_mid_tool() -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    await store.claim_run("t", "run-1")
    call = ToolCall(id="call_slow_1", name="slow_step", arguments={"seconds": 30})
    await store.append(
        "t",
        [
            user_text("do the slow thing", run_id="run-1"),
            AssistantMessage(content=[TextContent(text="Starting."), call], stop_reason="tool_use", run_id="run-1"),
        ],
    )
    return store


async def test_crash_banner_names_the_point_the_dangling_call_and_the_plan() -> None:
    app = make_app(fast_session(await _crashed_mid_tool()), thread_id="t")
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for_text(pilot, "Crashed mid-tool (point 3)")
        text = screen_text(app)
        assert "slow_step  call_slow_1" in text and '{"seconds": 30}' in text
        screen = app.screen
        assert isinstance(screen, ThreadScreen) and screen.diagnosis is not None
        (dangling,) = screen.diagnosis.dangling
        assert f"— {dangling.status_words}" in text  # "may have started" / "never started" / "started ..."
        assert "Resume first records slow_step (call_slow_1) as interrupted" in text
        assert app.screen.query_one(ToolCallView).status == "dangling"
        assert "crashed at point 3 (mid-tool)" in text  # the status bar


async def test_resume_settles_the_dangling_call_and_finishes() -> None:
    store = await _crashed_mid_tool()
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for_text(pilot, "Crashed mid-tool (point 3)")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="resume plan")
        assert "Resume first records slow_step (call_slow_1) as interrupted" in screen_text(app)
        await pilot.press("y")
        screen = app.screen_stack[-1]
        assert isinstance(screen, ThreadScreen)
        await wait_for_text(pilot, "Some steps did not finish", timeout=15)
        await wait_for(pilot, lambda: not screen.running, what="run finished")
        text = screen_text(app)
        assert "interrupted: settled as an error by recovery" in text
        assert not screen.query_one(CrashBanner).display or not screen.query_one(CrashBanner).has_class("-crashed")
        assert "completed" in text.splitlines()[-2]
    data = await store.load("t")
    assert data is not None
    settled = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert settled[0].tool_call_id == "call_slow_1" and settled[0].is_error
    assert settled[0].metadata.get("settled") == "interrupted"
    assert isinstance(data.messages[-1], AssistantMessage) and data.messages[-1].stop_reason == "stop"
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_declining_the_resume_plan_changes_nothing() -> None:
    store = await _crashed_mid_tool()
    before = (await store.load("t")).messages  # type: ignore[union-attr]
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for_text(pilot, "Crashed mid-tool (point 3)")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="resume plan")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="back")
        await pilot.pause(0.2)
        assert "Crashed mid-tool (point 3)" in screen_text(app)
    after = (await store.load("t")).messages  # type: ignore[union-attr]
    assert len(after) == len(before)
