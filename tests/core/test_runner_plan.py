"""``cubepi-tui run --resume`` says what it will do before it does it: the resume plan's
sentence, with a stepped tool's last committed step, as the app's confirmation shows it."""

from __future__ import annotations

import io
import time
from pathlib import Path

from core.checkpoint.locations import open_store
from core.demo import DEMO_WORKFLOW, demo_tools
from core.fingerprints import canonical_sha256, definition_parts, fingerprints_of
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.recovery import JOURNALED_KEY
from core.runner import run_headless
from core.tool_execution import call_job_key

THREAD = "t-stepped"
FETCH = ToolCall(id="call_fetch", name="fetch_dataset", arguments={"name": "demo-sales", "rows": 1000, "request": 1})


async def _crashed_after_two_of_eight_steps(path: Path) -> tuple[str, str, str]:
    """A run of the demo agent killed while ``fetch_dataset`` ran, after it committed 2 of its
    8 steps. Returns the call's job key and the clock times of its start and last commit."""
    (fetch,) = [t for t in demo_tools() if t.name == "fetch_dataset"]
    key = call_job_key(fetch, FETCH)
    assert key is not None
    store = await open_store(path, create=True, owner="alice")
    try:
        await store.claim_run(THREAD, "run-1")
        reply = AssistantMessage(
            content=[TextContent(text="Fetching."), FETCH],
            stop_reason="tool_use",
            run_id="run-1",
            metadata={JOURNALED_KEY: True},
        )
        await store.append(THREAD, [user_text("fetch the sales data", run_id="run-1"), reply])
        started = time.time() - 5
        await store.record_tool_event(
            THREAD, FETCH.id, "start", tool_name=FETCH.name, run_id="run-1", job_key=key, at=started
        )
        await store.job_begin(THREAD, key, FETCH.id)
        record = await store.step_begin(
            THREAD,
            key,
            input_fingerprint=canonical_sha256(dict(FETCH.arguments)),
            workflow=DEMO_WORKFLOW,
            total_steps=8,
            tool_call_id=FETCH.id,
        )
        for step in (1, 2):
            record = await store.step_commit(
                THREAD, key, expected_revision=record.revision, workflow=DEMO_WORKFLOW, next_step=step, data=step
            )
    finally:
        await store.close()

    def clock(at: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(at))

    return key, clock(started), clock(record.updated_at)


async def test_resume_prints_the_plan_with_the_last_committed_step_before_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    key, started, committed = await _crashed_after_two_of_eight_steps(path)
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless(path, THREAD, resume=True, demo=True, speed=50, owner="alice", out=out, err=err)
    assert status == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "plan: Resume first settles each dangling call - fetch_dataset (call_fetch): "
        f"started {started}, never finished; step 2 of 8 committed at {committed}; "
        "it is idempotent, so it runs again, continuing after step 2. Then it calls the model again."
    ), lines
    assert lines[1].startswith("tool fetch_dataset returned: Fetched 1,000 rows") and lines[-1] == "run completed"
    # It did what it said: steps 3 to 8 ran, once each, after the two committed ones.
    store = await open_store(path, create=False, owner="alice")
    try:
        record = await store.step_get(THREAD, key)
    finally:
        await store.close()
    assert record is not None and (record.next_step, record.revision, record.data) == (8, 8, 8)


async def test_a_resume_refused_for_a_changed_definition_prints_no_plan(tmp_path: Path) -> None:
    """The plan is said only for the resume that goes on: refused (the thread was written by
    another definition of the agent) the runner prints its one sentence and no plan; accepted,
    the plan comes first."""
    path = tmp_path / "threads.sqlite"
    await _crashed_after_two_of_eight_steps(path)
    store = await open_store(path, create=False, owner="alice")
    try:
        other = fingerprints_of(definition_parts("Another prompt.", [], "demo"), None, "fetch the sales data")
        await store.save_fingerprints(THREAD, other, expected_revision=0)
    finally:
        await store.close()
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless(path, THREAD, resume=True, demo=True, speed=50, owner="alice", out=out, err=err)
    assert status == 2 and out.getvalue() == ""
    (sentence,) = err.getvalue().splitlines()
    assert sentence.startswith("Thread 't-stepped' was written by another definition of the agent: system prompt")
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless(
        path, THREAD, resume=True, demo=True, speed=50, owner="alice", accept_changes=True, out=out, err=err
    )
    assert status == 0, err.getvalue()
    assert out.getvalue().startswith("plan: Resume first settles each dangling call - fetch_dataset (call_fetch): ")
