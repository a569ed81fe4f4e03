"""Issue 11's "must show" in the app: a run that asks for approval, answered with the keys a
person presses (Pilot), and the tool run exactly once (or never, when denied).

Two runs ask: a runner CHILD PROCESS under a Supervisor (``tests.helpers.hitl_child``
``supervised``: the app follows it through the SQLite file it shares, and the answer reaches
the child through the store), and a run inside the app itself (the panel then comes from
its ``HumanRequestStarted`` event and goes when the approved call starts). The child counts
its tool's runs in an effects file; the model's replies say what it was sent (``saw: ...``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from core.approvals import ALWAYS
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.providers.faux import FauxProvider
from core.tools import ToolContext, tool
from tests.helpers.hitl_child import CALL_ID, PROMPT, REASON, asking_reply, seen
from tests.helpers.hitl_runner import THREAD, Child, body_runs, last_reply, result_of
from tests.helpers.tui import Db, fast_session, open_from_picker, screen_text, send_via_dialog, wait_for, wait_for_text
from tui.app import CubepiApp, make_app
from tui.screens.answer import AnswerModal
from tui.screens.thread import ThreadScreen
from tui.widgets.pending_request import PendingRequestPanel

TIMEOUT = 60.0
"""Seconds any wait on the child or the run may take (generous: a loaded 2-core machine)."""

ASKING = "Waiting for you: approve a tool call?"
"""The panel's headline for an approval (tui.widgets.pending_request)."""


def _panel(app: CubepiApp) -> PendingRequestPanel:
    return app.screen.query_one(PendingRequestPanel)


def _panel_text(app: CubepiApp) -> str:
    return str(_panel(app).render())


def _notices(app: CubepiApp) -> list[str]:
    return [n.message for n in app._notifications]


def _footer_keys(app: CubepiApp) -> set[str]:
    bindings = app.screen.active_bindings.values()
    return {b.key for (_, b, enabled, _) in bindings if b.show and enabled is not False}


def _row_state(app: CubepiApp, thread_id: str) -> str:
    return next((r.state for r in app.threads_screen.rows if r.thread_id == thread_id), "")


async def _answer(pilot: Any, keys: list[str]) -> None:
    """``y`` (once the footer offers it), the dialog's ``keys``, then the send key; waits
    until the dialog closed and the answer's notice names the call."""
    app = pilot.app
    await wait_for(pilot, lambda: "y" in _footer_keys(app), timeout=TIMEOUT, what="the answer key in the footer")
    await pilot.press("y")
    await wait_for(pilot, lambda: isinstance(app.screen, AnswerModal), timeout=TIMEOUT, what="the answer dialog")
    await pilot.pause()
    assert '"path": "/etc/passwd"' in str(app.screen.query_one("#answer-request").render())
    for key in keys:
        await pilot.press("space" if key == " " else key)
    await pilot.press("ctrl+s")
    await wait_for(pilot, lambda: not isinstance(app.screen, AnswerModal), timeout=TIMEOUT, what="the dialog closed")
    await wait_for(
        pilot,
        lambda: any(f"delete_file ({CALL_ID})" in n for n in _notices(app)),
        timeout=TIMEOUT,
        what="the answer's notice",
    )


async def _stored(path: Path):  # type: ignore[no-untyped-def]
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        return await store.load(THREAD)
    finally:
        await store.close()


async def _follow_the_asking_child(pilot: Any, effects: Path) -> None:
    """Open the child's thread from the picker once it lists it waiting; check the panel
    shows the tool, its call and its arguments while the child holds the run."""
    app = pilot.app
    await wait_for(
        pilot,
        lambda: _row_state(app, THREAD) == f"waiting for you: approve delete_file ({CALL_ID})?",
        timeout=TIMEOUT,
        what="the picker's row waiting for you",
    )
    await open_from_picker(pilot, THREAD)
    assert isinstance(app.screen, ThreadScreen) and app.screen.following
    await wait_for_text(pilot, ASKING, timeout=TIMEOUT)
    shown = _panel_text(app)
    assert "delete_file" in shown and CALL_ID in shown and '"path": "/etc/passwd"' in shown
    assert "y: answer it" in shown
    await wait_for_text(pilot, "running on ", timeout=TIMEOUT)  # the child still holds it: it waits there
    assert body_runs(effects) == []


async def test_the_app_approves_a_runner_childs_request_and_its_tool_runs_once(shared_db: Path, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    app = make_app(fast_session(path=shared_db))
    child = await Child.start(str(shared_db), "supervised", effects)
    try:
        async with app.run_test(size=(130, 40)) as pilot:
            await _follow_the_asking_child(pilot, effects)
            await _answer(pilot, ["a"])
            # The child applies the answer: its tool runs, its model replies, the view follows.
            await wait_for_text(pilot, "saw: deleted /etc/passwd", timeout=TIMEOUT)
            await wait_for(pilot, lambda: not _panel(app).has_class("-shown"), timeout=TIMEOUT, what="panel gone")
        marks = await child.finish()
    finally:
        await child.stop()
    assert "outcome:completed" in marks
    (run,) = body_runs(effects)
    assert run == f"delete_file /etc/passwd pid={child.proc.pid}"  # once, in the child
    data = await _stored(shared_db)
    assert result_of(data).details == {"hitl": {"decision": "human_approve"}}
    assert last_reply(data) == "saw: deleted /etc/passwd"
    assert data.pending_request is None and all(r.completed for r in data.runs)


async def test_a_denial_with_a_reason_from_the_app_reaches_the_childs_model_and_the_tool_never_runs(
    shared_db: Path, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    app = make_app(fast_session(path=shared_db))
    child = await Child.start(str(shared_db), "supervised", effects)
    try:
        async with app.run_test(size=(130, 40)) as pilot:
            await _follow_the_asking_child(pilot, effects)
            await _answer(pilot, ["d", *REASON])
            await wait_for_text(pilot, f"saw: {REASON}", timeout=TIMEOUT)
        marks = await child.finish()
    finally:
        await child.stop()
    assert "outcome:completed" in marks
    assert body_runs(effects) == []
    data = await _stored(shared_db)
    result = result_of(data)
    assert result.is_error and result.details == {"hitl": {"decision": "human_deny", "reason": REASON}}
    assert REASON in "".join(b.text for b in result.content if b.type == "text")
    assert last_reply(data) == f"saw: {REASON}"
    assert data.pending_request is None


async def test_a_run_in_the_app_asks_the_panel_comes_from_its_event_and_goes_when_the_approved_call_starts(
    db: Db,
) -> None:
    ran: list[str] = []
    release = asyncio.Event()

    @tool
    async def delete_file(path: str, ctx: ToolContext) -> str:
        """Delete a file (here: count the run, then hold until released, so the test sees it running)."""
        ran.append(path)
        await release.wait()
        return f"deleted {path}"

    session = fast_session(
        path=db.path,
        tools=[delete_file],
        agent_options={"approvals": {"delete_file": ALWAYS}},
        make_provider=lambda: FauxProvider([asking_reply(), seen]),
    )
    app = make_app(session)
    async with app.run_test(size=(130, 40)) as pilot:
        await send_via_dialog(pilot, "n", PROMPT)
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), timeout=TIMEOUT, what="thread open")
        screen = app.screen
        assert isinstance(screen, ThreadScreen) and not screen.following
        await wait_for_text(pilot, ASKING, timeout=TIMEOUT)
        shown = _panel_text(app)
        assert "delete_file" in shown and CALL_ID in shown and '"path": "/etc/passwd"' in shown
        assert screen.running and ran == []
        await _answer(pilot, ["a"])
        # The approved call starts: the request is settled, the panel goes while the tool runs.
        await wait_for(pilot, lambda: ran == ["/etc/passwd"], timeout=TIMEOUT, what="the tool to start")
        await wait_for(pilot, lambda: not _panel(app).has_class("-shown"), timeout=TIMEOUT, what="panel gone")
        assert ASKING not in screen_text(app) and "y" not in _footer_keys(app)
        release.set()
        await wait_for_text(pilot, "saw: deleted /etc/passwd", timeout=TIMEOUT)
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="the run to end")
        thread_id = screen.thread_id
    assert ran == ["/etc/passwd"]
    store = await SQLiteCheckpointer.open(db.path, create=False)
    try:
        data = await store.load(thread_id)
    finally:
        await store.close()
    assert result_of(data).details == {"hitl": {"decision": "human_approve"}}
    assert last_reply(data) == "saw: deleted /etc/passwd"
    assert data.pending_request is None and all(r.completed for r in data.runs)


async def test_quitting_while_a_run_in_the_app_waits_keeps_its_request_for_later(db: Db) -> None:
    ran: list[str] = []

    @tool
    async def delete_file(path: str) -> str:
        """Delete a file (here: count the run)."""
        ran.append(path)
        return f"deleted {path}"

    session = fast_session(
        path=db.path,
        tools=[delete_file],
        agent_options={"approvals": {"delete_file": ALWAYS}},
        make_provider=lambda: FauxProvider([asking_reply(), seen]),
    )
    app = make_app(session)
    async with app.run_test(size=(130, 40)) as pilot:
        await send_via_dialog(pilot, "n", PROMPT)
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), timeout=TIMEOUT, what="thread open")
        thread_id = app.screen.thread_id
        await wait_for_text(pilot, ASKING, timeout=TIMEOUT)
        await app.session.stop_runs()  # what "Abort and quit" does
        assert not app.session.running_count()
    assert ran == []
    store = await SQLiteCheckpointer.open(db.path, create=False)
    try:
        data = await store.load(thread_id)
    finally:
        await store.close()
    # Detached, not aborted: the request waits for an answer from anywhere, the run stays open.
    assert data is not None and data.pending_request is not None and CALL_ID in data.pending_request.request_json
    assert not all(r.completed for r in data.runs)
