"""The crash banner and ``r``: the resume confirmation lists what happens to every dangling
call, lets the user choose for calls of tools that are not idempotent, and resumes as chosen."""

from __future__ import annotations

import time
from pathlib import Path

from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import RadioButton

from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.demo import demo_tools
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.recovery import JOURNALED_KEY, ThreadState, diagnose
from core.tool_execution import call_job_key, result_to_json
from core.tools import AgentToolResult, tool
from tests.helpers.tui import FAST, fast_session, screen_text, squeezed_lines, wait_for, wait_for_text, widget_text
from tui.app import make_app
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.widgets.crash_banner import CrashBanner
from tui.widgets.tool_call import ToolCallView

THREAD = "t-crash"


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


def _notify_tool(sent: list[str]):  # type: ignore[no-untyped-def]
    """A tool that is not idempotent: each call tells the team once more."""

    @tool
    async def notify_team(message: str) -> str:
        """Post a message to the team channel."""
        sent.append(message)
        return f"Posted {message!r} to the team."

    return notify_team


FETCH = ToolCall(id="call_fetch", name="fetch_dataset", arguments={"name": "demo-sales", "rows": 1000, "request": 1})
TRAIN = ToolCall(id="call_train", name="train_model", arguments={"model": "baseline", "epochs": 2, "request": 1})
NOTIFY = ToolCall(id="call_notify", name="notify_team", arguments={"message": "model ready"})
STORED_TRAINING = "Trained 'baseline' for 2 epochs (stored by the crashed run)."


async def _crash_in_a_file(path: Path) -> float:
    """Write, as our agent would have, a run killed while three tool calls were in flight:

    * ``fetch_dataset`` (idempotent) started and never finished: its job is ``started``;
    * ``train_model`` (idempotent) finished its job, but the process died before its result
      message was saved: the job is ``done`` with a stored result;
    * ``notify_team`` (not idempotent) never started (no journal entry).

    Returns the unix time the two started calls started at.
    """
    tools = {t.name: t for t in demo_tools(speed=FAST)}
    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        await store.claim_run(THREAD, "run-1")
        reply = AssistantMessage(
            content=[TextContent(text="Fetching, training and telling the team."), FETCH, TRAIN, NOTIFY],
            stop_reason="tool_use",
            run_id="run-1",
            metadata={JOURNALED_KEY: True},
        )
        await store.append(THREAD, [user_text("train a model and tell the team", run_id="run-1"), reply])
        started = time.time() - 30
        for call in (FETCH, TRAIN):
            key = call_job_key(tools[call.name], call)
            assert key is not None
            await store.record_tool_event(
                THREAD, call.id, "start", tool_name=call.name, run_id="run-1", job_key=key, at=started
            )
            await store.job_begin(THREAD, key, call.id)
        train_key = call_job_key(tools["train_model"], TRAIN)
        assert train_key is not None
        await store.job_finish(THREAD, train_key, "done", result_to_json(AgentToolResult(STORED_TRAINING)))
    finally:
        await store.close()
    return started


def _session(path: Path, sent: list[str]):  # type: ignore[no-untyped-def]
    return fast_session(path=path, tools=[*demo_tools(speed=FAST), _notify_tool(sent)])


async def _open_resume_modal(pilot) -> ResumeModal:  # type: ignore[no-untyped-def]
    app = pilot.app
    await wait_for_text(pilot, "Crashed mid-tool (point 3)")
    await pilot.press("r")
    await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="resume confirmation")
    await pilot.pause(0.1)
    return app.screen


async def _results(path: Path) -> dict[str, ToolResultMessage]:
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        data = await store.load(THREAD)
    finally:
        await store.close()
    assert data is not None
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED
    return {m.tool_call_id: m for m in data.messages if isinstance(m, ToolResultMessage)}


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
        assert "r: shows what resume will do with each call and asks first" in squeezed_lines(text)
        assert app.screen.query_one(ToolCallView).status == "dangling"
        assert "crashed at point 3 (mid-tool)" in text  # the status bar


async def test_the_confirmation_shows_each_call_and_by_default_interrupts_the_non_idempotent_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "threads.sqlite"
    started = await _crash_in_a_file(path)
    at = time.strftime("%H:%M:%S", time.localtime(started))
    sent: list[str] = []
    app = make_app(_session(path, sent), thread_id=THREAD)
    async with app.run_test(size=(120, 50)) as pilot:
        modal = await _open_resume_modal(pilot)
        text = widget_text(modal)
        # Each call: where it stopped, and what resume will do with it.
        assert (
            f'fetch_dataset call_fetch {{"name": "demo-sales", "rows": 1000, "request": 1}} started {at}, never finished → re-run (idempotent; job not done)'
            in text
        )
        assert (
            f'train_model call_train {{"model": "baseline", "epochs": 2, "request": 1}} started {at}, never finished → already done — stored result reused'
            in text
        )
        assert (
            'notify_team call_notify {"message": "model ready"} never started (•) marked interrupted, not re-run ( ) re-run anyway'
            in text
        )
        assert modal.decision().choices == {"call_notify": "interrupt"}  # the default
        await pilot.press("y")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await wait_for(pilot, lambda: not screen.running and screen.diagnosis is not None, timeout=20, what="run over")
        await wait_for_text(pilot, "Some steps did not finish")
        views = {v.call_id: v for v in screen.query(ToolCallView)}
        assert views["call_fetch"].status == "ok" and views["call_fetch"].settled == "rerun"
        assert views["call_train"].status == "ok" and views["call_train"].settled == "reused"
        assert views["call_notify"].status == "interrupted"
        shown = squeezed_lines(screen_text(app))
        assert "re-run by resume" in shown and "reused by resume" in shown
        assert "interrupted: settled as an error by recovery" in shown
    results = await _results(path)
    assert results["call_fetch"].metadata["settled"] == "rerun" and not results["call_fetch"].is_error
    assert "Fetched 1,000 rows" in results["call_fetch"].text
    assert results["call_train"].metadata["settled"] == "reused" and results["call_train"].text == STORED_TRAINING
    assert results["call_notify"].metadata["settled"] == "interrupted" and results["call_notify"].is_error
    assert sent == []  # the team was not told a second time


async def test_choosing_re_run_runs_the_non_idempotent_call_again(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _crash_in_a_file(path)
    sent: list[str] = []
    app = make_app(_session(path, sent), thread_id=THREAD)
    async with app.run_test(size=(120, 50)) as pilot:
        modal = await _open_resume_modal(pilot)
        await pilot.click("#choice-2 #rerun")
        await wait_for(pilot, lambda: modal.query_one("#choice-2 #rerun", RadioButton).value, what="re-run chosen")
        assert modal.decision().choices == {"call_notify": "rerun"}
        await pilot.press("y")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        await wait_for(pilot, lambda: not screen.running and screen.diagnosis is not None, timeout=20, what="run over")
        await wait_for_text(pilot, "Everything finished")
        views = {v.call_id: v for v in screen.query(ToolCallView)}
        assert views["call_notify"].status == "ok" and views["call_notify"].settled == "rerun"
    results = await _results(path)
    assert results["call_notify"].metadata["settled"] == "rerun" and not results["call_notify"].is_error
    assert results["call_notify"].text == "Posted 'model ready' to the team."
    assert results["call_fetch"].metadata["settled"] == "rerun"
    assert results["call_train"].metadata["settled"] == "reused"
    assert sent == ["model ready"]


async def test_at_80x24_the_confirmations_buttons_are_on_screen_and_the_calls_scroll(tmp_path: Path) -> None:
    # The calls' part had a fixed most of 30 rows: at 80x24 it pushed Resume and Cancel below
    # the dialog's edge, and the last call's outcome out of reach.
    path = tmp_path / "threads.sqlite"
    await _crash_in_a_file(path)
    app = make_app(_session(path, []), thread_id=THREAD)
    async with app.run_test(size=(80, 24)) as pilot:
        modal = await _open_resume_modal(pilot)
        await pilot.pause()
        screen_region = Region(0, 0, *app.size)
        for button in ("#resume", "#cancel"):
            region = modal.query_one(button).region
            assert region.area > 0 and screen_region.contains_region(region), (button, region, screen_text(app))
        assert modal.query_one("#resume-body", VerticalScroll).max_scroll_y > 0, "the calls scroll instead"


async def test_resume_of_a_foreign_tool_call_records_it_interrupted_and_finishes() -> None:
    store = await _crashed_mid_tool()
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(110, 40)) as pilot:
        modal = await _open_resume_modal(pilot)
        text = widget_text(modal)
        assert (
            'slow_step call_slow_1 {"seconds": 30} may have started → marked interrupted, not re-run (this agent has no tool named slow_step)'
            in text
        )
        await pilot.press("y")
        screen = app.screen_stack[-1]
        assert isinstance(screen, ThreadScreen)
        await wait_for_text(pilot, "Some steps did not finish", timeout=60)
        await wait_for(pilot, lambda: not screen.running, what="run finished")
        await wait_for(pilot, lambda: screen.diagnosis is not None, what="diagnosis")
        text = screen_text(app)
        assert "interrupted: settled as an error by recovery" in text
        assert not screen.query_one(CrashBanner).has_class("-crashed")
        assert "completed" in text.splitlines()[-2]
    data = await store.load("t")
    assert data is not None
    settled = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert settled[0].tool_call_id == "call_slow_1" and settled[0].is_error
    assert settled[0].metadata.get("settled") == "interrupted"
    assert isinstance(data.messages[-1], AssistantMessage) and data.messages[-1].stop_reason == "stop"
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_cancelling_the_confirmation_changes_nothing() -> None:
    store = await _crashed_mid_tool()
    before = (await store.load("t")).messages  # type: ignore[union-attr]
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(110, 40)) as pilot:
        await _open_resume_modal(pilot)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="back")
        await pilot.pause(0.2)
        assert "Crashed mid-tool (point 3)" in screen_text(app)
    after = (await store.load("t")).messages  # type: ignore[union-attr]
    assert len(after) == len(before)


async def test_qa9_the_confirmation_shows_a_stepped_calls_last_committed_step(tmp_path: Path) -> None:
    """QA (issue 9, must have 4): after a crash mid-tool the resume plan shows "step 4 of 8
    committed at 12:03:10" for a stepped tool. ``CallPlan.step_words`` says it, but the
    confirmation the app shows on ``r`` prints only the journal's words."""
    from core.demo import DEMO_WORKFLOW
    from core.fingerprints import canonical_sha256

    path = tmp_path / "threads.sqlite"
    await _crash_in_a_file(path)
    tools = {t.name: t for t in demo_tools(speed=FAST)}
    key = call_job_key(tools["fetch_dataset"], FETCH)
    assert key is not None
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        record = await store.step_begin(
            THREAD,
            key,
            input_fingerprint=canonical_sha256(dict(FETCH.arguments)),
            workflow=DEMO_WORKFLOW,
            total_steps=8,
            tool_call_id=FETCH.id,
        )
        for step in range(1, 5):
            record = await store.step_commit(
                THREAD, key, expected_revision=record.revision, workflow=DEMO_WORKFLOW, next_step=step, data=step
            )
    finally:
        await store.close()
    clock = time.strftime("%H:%M:%S", time.localtime(record.updated_at))
    app = make_app(_session(path, []), thread_id=THREAD)
    async with app.run_test(size=(120, 50)) as pilot:
        modal = await _open_resume_modal(pilot)
        (fetch,) = [c for c in modal.plan.calls if c.call.id == FETCH.id]
        assert fetch.step_words == f"step 4 of 8 committed at {clock}"  # the plan knows it
        assert f"step 4 of 8 committed at {clock}" in widget_text(modal)  # the app must show it


async def _fetch_committed_steps(path: Path, done: int, total: int) -> str:
    """Commit ``done`` of ``total`` steps of the crashed ``fetch_dataset`` call in the file, as
    the stepped tool would have before the crash; returns the clock time of the last commit."""
    from core.demo import DEMO_WORKFLOW
    from core.fingerprints import canonical_sha256

    tools = {t.name: t for t in demo_tools(speed=FAST)}
    key = call_job_key(tools["fetch_dataset"], FETCH)
    assert key is not None
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        record = await store.step_begin(
            THREAD,
            key,
            input_fingerprint=canonical_sha256(dict(FETCH.arguments)),
            workflow=DEMO_WORKFLOW,
            total_steps=total,
            tool_call_id=FETCH.id,
        )
        for step in range(1, done + 1):
            record = await store.step_commit(
                THREAD, key, expected_revision=record.revision, workflow=DEMO_WORKFLOW, next_step=step, data=step
            )
    finally:
        await store.close()
    return time.strftime("%H:%M:%S", time.localtime(record.updated_at))


async def test_the_crash_banner_and_the_confirmation_say_how_far_a_stepped_call_got(tmp_path: Path) -> None:
    """Where the banner describes a dangling call of a stepped tool it names the last
    committed step, in the plan's words; the confirmation says the re-run continues after it."""
    path = tmp_path / "threads.sqlite"
    await _crash_in_a_file(path)
    clock = await _fetch_committed_steps(path, 2, 8)
    app = make_app(_session(path, []), thread_id=THREAD)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for_text(pilot, f"step 2 of 8 committed at {clock}")
        lines = [line for line in screen_text(app).splitlines() if "•" in line]  # the banner's calls
        (fetch_line,) = [line for line in lines if "fetch_dataset" in line]
        assert f"never finished; step 2 of 8 committed at {clock}" in fetch_line
        # Only the stepped call has a step: the others read as before.
        (train_line,) = [line for line in lines if "train_model" in line]
        assert "committed" not in train_line and "never finished" in train_line
        modal = await _open_resume_modal(pilot)
        text = squeezed_lines(widget_text(modal))
        assert f"never finished; step 2 of 8 committed at {clock}" in text
        assert "re-run (idempotent; job not done), continuing after step 2" in text
