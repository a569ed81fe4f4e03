"""Issue 11 in the app: a pending human request shown in the thread view, answered in its
dialog (recorded exactly once, read back from the store), the picker's "waiting for you"
first and its needs-attention toggle, and the bell rung once per request."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from core.answers import answer
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.hitl import ApproveRequest, AskRequest, HumanRequest, Option, Question, RequestPayload, question_id_for
from core.hitl_replies import DenyReply
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.owners import UNOWNED
from tests.helpers.cubeloop_threads import run_cubeloop
from tests.helpers.tui import (
    fast_session,
    leased_elsewhere,
    open_from_picker,
    screen_text,
    wait_for,
    wait_for_text,
)
from tui.app import CubepiApp, make_app
from tui.attention import Alerts
from tui.cli import parse_args
from tui.screens.answer import AnswerModal
from tui.screens.modals import ConfirmModal
from tui.widgets.pending_request import PendingRequestPanel
from tui.widgets.thread_table import ThreadTable

APPROVAL = ApproveRequest(
    tool_name="delete_file",
    tool_call_id="call_del_1",
    args={"path": "/etc/[bold]passwd[/bold]", "note": "\x1b[31mred"},
    details={"why": "system path"},
)
TWO_QUESTIONS = AskRequest(
    questions=[
        Question(key="target", prompt="Which file?"),
        Question(
            key="env",
            prompt="Where?",
            options=[Option(label="Prod", value="prod"), Option(label="Staging", value="staging")],
        ),
    ]
)


async def _waiting(store: Any, thread_id: str, payload: RequestPayload, *, run_id: str = "run-1") -> str:
    """Make ``thread_id`` a thread whose run ``run_id`` asked ``payload`` (its call has no
    result, the pending request is stored as cubeloop stores it); returns the question id."""
    call_id = payload.tool_call_id if isinstance(payload, ApproveRequest) else "call_ask_1"
    name = payload.tool_name if isinstance(payload, ApproveRequest) else "ask_user"
    await store.claim_run(thread_id, run_id)
    asked = AssistantMessage(content=[ToolCall(id=call_id, name=name, arguments={})], stop_reason="tool_use")
    await store.append(thread_id, [user_text(f"work on {thread_id}", run_id=run_id), asked])
    qid = question_id_for(payload)
    request = HumanRequest(question_id=qid, thread_id=thread_id, payload=payload, created_at=time.time() - 125)
    await store.save_pending_request(thread_id, request.model_dump_json(), run_id=run_id)
    return qid


def _panel(app: CubepiApp) -> str:
    return str(app.screen.query_one(PendingRequestPanel).render())


def _notices(app: CubepiApp) -> list[str]:
    return [n.message for n in app._notifications]


def _footer_keys(app: CubepiApp) -> set[str]:
    screen = app.screen
    return {b.key for (_, b, enabled, _) in screen.active_bindings.values() if b.show and enabled is not False}


async def _answer_dialog(pilot: Any) -> AnswerModal:
    app = pilot.app
    await wait_for(pilot, lambda: "y" in _footer_keys(app), what="the answer key in the footer")
    await pilot.press("y")
    await wait_for(pilot, lambda: isinstance(app.screen, AnswerModal), what="the answer dialog")
    await pilot.pause()
    return app.screen  # type: ignore[return-value]


# --- the thread view ----------------------------------------------------------------------------


async def test_the_thread_view_shows_an_approval_literally_and_the_answer_key_only_while_it_waits() -> None:
    store = MemoryCheckpointer()
    await _waiting(store, "t-approve", APPROVAL)
    await store.append("t-done", [user_text("hi"), AssistantMessage(content=[TextContent(text="Hi.")])])
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t-approve")
        await wait_for_text(pilot, "Waiting for you: approve a tool call?")
        shown = _panel(app)
        assert "delete_file" in shown and "call_del_1" in shown
        # The arguments come from the model: markup and escapes are shown, never applied.
        assert '"/etc/[bold]passwd[/bold]"' in shown and '"\\u001b[31mred"' in shown and "\x1b" not in shown
        assert '{"why": "system path"}' in shown
        assert "asked 2 min ago" in shown and "y: answer it" in shown
        assert "y" in _footer_keys(app)
        assert "Crashed" not in screen_text(app)  # the banner leaves the request to the panel
        await pilot.press("q")
        await open_from_picker(pilot, "t-done")
        assert "y" not in _footer_keys(app)
        assert not app.screen.query_one(PendingRequestPanel).has_class("-shown")
        await pilot.press("y")  # greyed out: says why in one sentence
        await wait_for(
            pilot,
            lambda: "Nothing to answer: the thread is not waiting for an answer." in _notices(app),
            what="the refusal",
        )


async def test_a_cubeloop_thread_waiting_on_ask_user_is_shown_and_answered_in_the_dialog(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "ask_and_detach", "q", arg="run-ask-1")  # the real cubeloop asks, then detaches
    app = make_app(fast_session(path=db, owner=UNOWNED))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "q")
        await wait_for_text(pilot, "Waiting for you: a question")
        assert "Which file should I check?" in _panel(app) and "(free text)" in _panel(app)
        dialog = await _answer_dialog(pilot)
        await pilot.press("ctrl+s")  # nothing typed: the required question is refused in the dialog
        await pilot.pause()
        assert isinstance(app.screen, AnswerModal)
        assert "needs an answer" in str(dialog.query_one("#answer-error").render())
        for key in "src/cli.py":
            await pilot.press(key)
        await pilot.press("enter")
        # cubeloop's file opens browse-only: answering asks to upgrade it first.
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the upgrade question")
        await pilot.press("y")
        await wait_for(
            pilot,
            lambda: any("the question answered" in n for n in _notices(app)),
            what="the answer's notice",
        )
        await wait_for_text(pilot, "Answered, not applied yet")
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    try:
        pending = (await store.load("q")).pending_request
        qid = json.loads(pending.request_json)["question_id"]
        assert await store.load_answer("q", "run-ask-1", qid) == '{"target":"src/cli.py"}'
    finally:
        await store.close()


# --- the dialog ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "stored"),
    [
        (["a"], {"decision": "approve", "edited_args": None, "reason": None}),
        (["d", *"not on prod"], {"decision": "deny", "edited_args": None, "reason": "not on prod"}),
        (["d"], {"decision": "deny", "edited_args": None, "reason": None}),
    ],
    ids=["approve", "deny-with-reason", "deny"],
)
async def test_an_approval_is_answered_and_the_store_holds_exactly_that_answer(
    keys: list[str], stored: dict[str, Any]
) -> None:
    store = MemoryCheckpointer()
    qid = await _waiting(store, "t1", APPROVAL)
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t1")
        dialog = await _answer_dialog(pilot)
        assert '"/etc/[bold]passwd[/bold]"' in str(dialog.query_one("#answer-request").render())
        for key in keys:
            await pilot.press("space" if key == " " else key)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, AnswerModal), what="the dialog closed")
        await wait_for(pilot, lambda: any("delete_file (call_del_1)" in n for n in _notices(app)), what="notice")
    assert json.loads(await store.load_answer("t1", "run-1", qid) or "null") == stored


async def test_edited_arguments_must_be_a_json_object_and_are_stored_as_edited() -> None:
    store = MemoryCheckpointer()
    qid = await _waiting(store, "t1", APPROVAL)
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t1")
        dialog = await _answer_dialog(pilot)
        await pilot.press("e")
        await pilot.pause()
        area = dialog.query_one("#edited-args")
        area.text = '["not", "an object"]'  # type: ignore[attr-defined]
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, AnswerModal)
        assert "must be a JSON object" in str(dialog.query_one("#answer-error").render())
        area.text = '{"path": "/tmp/k"'  # type: ignore[attr-defined]
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "are not JSON" in str(dialog.query_one("#answer-error").render())
        area.text = '{"path": "/tmp/k"}'  # type: ignore[attr-defined]
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, AnswerModal), what="the dialog closed")
    assert json.loads(await store.load_answer("t1", "run-1", qid) or "null") == {
        "decision": "edit",
        "edited_args": {"path": "/tmp/k"},
        "reason": None,
    }


async def test_several_questions_in_one_dialog_with_an_option_picked_by_its_number() -> None:
    store = MemoryCheckpointer()
    qid = await _waiting(store, "t1", TWO_QUESTIONS)
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t1")
        await wait_for_text(pilot, "Waiting for you: 2 questions")
        assert "1. Which file?" in _panel(app) and "2. Where?" in _panel(app) and "Staging" in _panel(app)
        await _answer_dialog(pilot)
        for key in "app.py":
            await pilot.press(key)
        await pilot.press("tab")  # to the second question's options
        await pilot.press("2")  # its second option: Staging
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, AnswerModal), what="the dialog closed")
    assert json.loads(await store.load_answer("t1", "run-1", qid) or "null") == {"target": "app.py", "env": "staging"}


async def test_a_second_answer_is_refused_with_the_sentence_and_the_first_one_is_kept() -> None:
    store = MemoryCheckpointer()
    qid = await _waiting(store, "t1", APPROVAL)
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t1")
        await _answer_dialog(pilot)
        # Someone else (another terminal, `cubepi-tui answer`) answers while the dialog is open.
        first = await answer(store, "t1", DenyReply("someone else said no"))
        await pilot.press("a")
        await pilot.press("ctrl+s")
        expected = (
            f"Question {qid!r} of thread 't1' was already answered ({first.answer_json}); only the first answer counts."
        )
        await wait_for(pilot, lambda: expected in _notices(app), what="the refusal")
        await wait_for_text(pilot, "Answered, not applied yet")
        assert "someone else said no" in _panel(app)
        assert "y" in _footer_keys(app)
    assert await store.load_answer("t1", "run-1", qid) == first.answer_json


# --- the picker ----------------------------------------------------------------------------------


async def _mixed_store() -> MemoryCheckpointer:
    """Six threads, most recent last: done, crashed mid-tool, aborted, failed, and two waiting."""
    store = MemoryCheckpointer()
    done = AssistantMessage(content=[TextContent(text="Done.")], stop_reason="stop")
    call = AssistantMessage(content=[ToolCall(id="c1", name="fetch", arguments={})], stop_reason="tool_use")
    aborted = AssistantMessage(content=[TextContent(text="Half")], stop_reason="aborted")
    failed = AssistantMessage(content=[TextContent(text="")], stop_reason="error", error_message="overloaded")
    await _waiting(store, "wait-old", APPROVAL)
    await store.append("done-1", [user_text("say hi"), done])
    await store.append("crash-1", [user_text("fetch invoices"), call])
    await store.append("abort-1", [user_text("write invoices"), aborted])
    await store.append("fail-1", [user_text("plan"), failed])
    await _waiting(store, "wait-new", TWO_QUESTIONS)
    await store.append("done-2", [user_text("say bye"), done])
    return store


def _shown(app: CubepiApp) -> list[str]:
    return [row.thread_id for row in app.threads_screen.query_one(ThreadTable).rows]


def _heading(app: CubepiApp) -> str:
    return screen_text(app).splitlines()[0]


async def test_the_picker_puts_waiting_for_you_first_and_the_toggle_keeps_what_needs_attention() -> None:
    app = make_app(fast_session(await _mixed_store()))
    async with app.run_test(size=(140, 24)) as pilot:
        await wait_for(pilot, lambda: len(_shown(app)) == 7, what="every thread")
        shown = _shown(app)
        assert shown[:2] == ["wait-new", "wait-old"]  # waiting first, most recent first among them
        assert shown[2:] == ["done-2", "fail-1", "abort-1", "crash-1", "done-1"]  # the rest as listed
        states = {row.thread_id: row.state for row in app.threads_screen.rows}
        assert states["wait-new"] == "waiting for you: Which file? / Where?"
        assert states["wait-old"] == "waiting for you: approve delete_file (call_del_1)?"
        assert "· 7 · 2 waiting for you" in _heading(app)
        await pilot.press("exclamation_mark")
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="the threads needing attention")
        assert _shown(app) == ["wait-new", "wait-old", "fail-1", "abort-1", "crash-1"]
        assert "needing attention · 5 of 7" in _heading(app)
        await pilot.press("slash")
        for key in "invoices":
            await pilot.press(key)
        await wait_for(pilot, lambda: _shown(app) == ["abort-1", "crash-1"], what="the filter within the toggle")
        assert "needing attention · 2 of 7" in _heading(app)
        await pilot.press("escape")  # clears the filter; the toggle stays
        await wait_for(pilot, lambda: len(_shown(app)) == 5, what="the toggle alone")
        await pilot.press("exclamation_mark")
        await wait_for(pilot, lambda: len(_shown(app)) == 7, what="every thread again")
        assert "needing attention" not in _heading(app)


# --- the bell ------------------------------------------------------------------------------------


async def _count_bells(app: CubepiApp) -> list[float]:
    rung: list[float] = []
    app.bell = lambda: rung.append(time.monotonic())  # type: ignore[method-assign]
    return rung


@pytest.mark.parametrize("alerts", [Alerts(), Alerts(bell=False), Alerts(notices=False)], ids=str)
async def test_the_bell_rings_once_when_a_watched_thread_starts_waiting(alerts: Alerts) -> None:
    store = MemoryCheckpointer()
    await _waiting(store, "old", APPROVAL)  # already waiting when the app starts: no bell for it
    await store.append("quiet", [user_text("hi"), AssistantMessage(content=[TextContent(text="Hi.")])])
    session = fast_session(store, alerts=alerts)
    app = make_app(session)
    async with app.run_test(size=(120, 30)) as pilot:
        rung = await _count_bells(app)
        await wait_for(pilot, lambda: len(_shown(app)) == 2, what="the first listing")
        await pilot.pause(0.3)
        assert rung == []
        await _waiting(store, "new", TWO_QUESTIONS)  # another process's run asks now
        await wait_for(pilot, lambda: "new" in _shown(app), what="the new thread listed")
        await store.append("quiet", [user_text("more")])  # more listings: the same request rings no more
        await wait_for(pilot, lambda: app.threads_screen.rows[-1].message_count == 3, what="a later listing")
        await pilot.pause(0.3)
        sentence = "Thread 'new' is waiting for you: Which file? / Where?"
        assert len(rung) == (1 if alerts.bell else 0)
        assert _notices(app).count(sentence) == (1 if alerts.notices else 0)


async def test_a_run_elsewhere_that_dies_while_watched_rings_once() -> None:
    # A run elsewhere mid-tool whose heartbeat stops: once its lease expires it crashed.
    store = await leased_elsewhere("busy", host="far-box", expires_in=1.5)
    call = AssistantMessage(content=[ToolCall(id="c1", name="fetch", arguments={})], stop_reason="tool_use")
    await store.append("busy", [call])
    # Written by a program that takes no lease (cubeloop): "crashed" by its records only, no bell.
    await store.append("no-lease", [user_text("fetch"), call])
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 30)) as pilot:
        rung = await _count_bells(app)
        await wait_for(pilot, lambda: len(_shown(app)) == 2, what="the first listing")
        assert next(row for row in app.threads_screen.rows if row.thread_id == "busy").elsewhere
        await store.append("no-lease", [user_text("more", run_id="x")])  # a later listing: still no bell
        await wait_for(pilot, lambda: len(rung) == 1, timeout=15, what="the bell once the lease expired")
        await pilot.pause(1.5)  # the picker ages leases every second: no second bell
        assert len(rung) == 1
        assert [n for n in _notices(app) if n.startswith("Thread ")] == [
            next(n for n in _notices(app) if n.startswith("Thread 'busy' crashed at point 3 (mid-tool) on far-box"))
        ]


def test_the_bell_and_the_notices_can_be_switched_off_on_the_command_line() -> None:
    assert (parse_args([]).bell, parse_args([]).notices) == (True, True)
    args = parse_args(["--no-bell", "--no-notices"])
    assert (args.bell, args.notices) == (False, False)


async def test_a_run_elsewhere_that_asks_while_followed_shows_its_request_and_takes_the_answer() -> None:
    store = await leased_elsewhere("busy", host="far-box")
    call = AssistantMessage(
        content=[ToolCall(id="call_del_1", name="delete_file", arguments={})], stop_reason="tool_use"
    )
    await store.append("busy", [call])
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "busy")
        await wait_for_text(pilot, "running on far-box")
        assert "y" not in _footer_keys(app)
        # The runner (holding its lease, waiting in its process) stores its request: the
        # follower sees it although no message, run or lease changed with it.
        request = HumanRequest(question_id="call_del_1", thread_id="busy", payload=APPROVAL, created_at=time.time())
        await store.save_pending_request("busy", request.model_dump_json(), run_id="r1")
        await wait_for_text(pilot, "Waiting for you: approve a tool call?", timeout=15)
        assert "running on far-box" in screen_text(app)  # still run there: it waits in its process
        await _answer_dialog(pilot)
        await pilot.press("a")
        await pilot.press("ctrl+s")
        await wait_for_text(pilot, "Answered, not applied yet")
    assert json.loads(await store.load_answer("busy", "r1", "call_del_1") or "null")["decision"] == "approve"


async def test_an_answer_to_a_request_replaced_meanwhile_is_refused_and_the_view_shows_the_new_one() -> None:
    store = MemoryCheckpointer()
    qid = await _waiting(store, "t1", APPROVAL)
    app = make_app(fast_session(store))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "t1")
        await _answer_dialog(pilot)
        # Meanwhile the run settled that request and asked another question.
        newer = HumanRequest(question_id="q-new", thread_id="t1", payload=TWO_QUESTIONS, created_at=time.time())
        await store.save_pending_request("t1", newer.model_dump_json(), run_id="run-1")
        await pilot.press("a")
        await pilot.press("ctrl+s")
        expected = (
            f"Thread 't1' has no pending question {qid!r}; it was settled already or another question is "
            "pending now: read the thread again."
        )
        await wait_for(pilot, lambda: expected in _notices(app), what="the refusal")
        await wait_for_text(pilot, "Waiting for you: 2 questions")
    assert await store.load_answer("t1", "run-1", qid) is None
    assert await store.load_answer("t1", "run-1", "q-new") is None
