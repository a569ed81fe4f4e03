"""The picker, the status bar and the banner on threads whoever wrote them: orphan results,
unknown roles, unreadable rows, another run's interleaved writes, a failed model call
(``r`` retries it) and a pending human question."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UnknownMessage, user_text
from core.owners import UNOWNED
from core.recovery import ThreadState, diagnose
from tests.helpers.tui import fast_session, open_from_picker, screen_text, squeezed, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.crash_banner import describe


def _final(text: str, run: str, stop: str = "stop", error: str | None = None) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason=stop, error_message=error, run_id=run)


def _result(call_id: str, run: str) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="lookup", content=[TextContent(text="42")], run_id=run)


EXPECTED = {
    "orphan": "completed · 1 orphan result",
    "unknown": "completed · 1 row of unknown role",
    "unreadable": "completed · 1 unreadable row",
    "interleaved": "completed · another run wrote between 1 tool call and its result",  # the late result is placed; the reply is final
    "failed": "failed",
    "waiting": "waiting for an answer: Ship it to production?",
}
"""Each thread's diagnosis label (the status bar's)."""

PICKER = {**EXPECTED, "waiting": "waiting for you: Ship it to production?"}
"""Each thread's state in the picker: a question still to answer reads "waiting for you"."""


async def _threads(path: Path) -> None:
    store = await SQLiteCheckpointer.open(path, create=True)
    try:

        async def thread(tid: str, messages: list, done: tuple[str, ...] = (), open_: tuple[str, ...] = ()) -> None:
            for run in (*done, *open_):
                await store.claim_run(tid, run)
            await store.append(tid, messages)
            for run in done:
                await store.mark_run_complete(tid, run)

        await thread("orphan", [user_text("hi", run_id="a"), _final("Hello.", "a"), _result("ghost", "a")], done=("a",))
        await thread("unknown", [user_text("hi", run_id="a"), _final("Hello.", "a")], done=("a",))
        await thread("unreadable", [user_text("hi", run_id="a"), _final("Hello.", "a")], done=("a",))
        call = AssistantMessage(content=[ToolCall(id="c1", name="lookup")], stop_reason="tool_use", run_id="r0")
        await thread(
            "interleaved",
            [
                user_text("look", run_id="r0"),
                call,
                user_text("go on", run_id="r1"),
                _final("Went on.", "r1"),
                _result("c1", "r0"),
            ],
            done=("r1",),
            open_=("r0",),
        )
        await thread(
            "failed",
            [
                user_text("hi", run_id="a"),
                _final("Half", "a", stop="error", error="The Anthropic API is overloaded (529)."),
            ],
            open_=("a",),
        )
        ask = AssistantMessage(content=[ToolCall(id="q1", name="ask_user")], stop_reason="tool_use", run_id="h")
        await thread("waiting", [user_text("ship it", run_id="h"), ask], open_=("h",))
        request = {
            "question_id": "q",
            "thread_id": "waiting",
            "payload": {"kind": "confirm", "prompt": "Ship it to production?"},
            "created_at": 1_795_954_400.0,
        }
        await store.save_pending_request("waiting", json.dumps(request), run_id="h")
    finally:
        await store.close()
    with sqlite3.connect(path) as c:  # rows another program wrote: an unknown role, an unreadable row
        c.execute(
            "INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)",
            ("unknown", UnknownMessage(role="system", run_id="a").model_dump_json(), "a"),
        )
        c.execute("INSERT INTO messages (thread_id, message_json, run_id) VALUES ('unreadable', '{not json', 'a')")


async def test_each_kind_of_history_reads_as_such_in_the_picker_and_the_status_bar(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _threads(path)
    app = make_app(fast_session(path=path))
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == len(EXPECTED), what="all rows")
        assert {r.thread_id: r.state for r in app.threads_screen.rows} == PICKER
        assert app.threads_screen.rows[0].thread_id == "waiting"  # waiting for you sorts first
        await wait_for_text(pilot, "waiting for you: Ship it to production?")
        for thread_id, label in EXPECTED.items():
            await open_from_picker(pilot, thread_id)
            status = screen_text(app).splitlines()[-2]
            assert squeezed(label) in squeezed(status), status
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker again")


async def test_the_thread_view_says_what_is_sent_and_shows_the_question_and_the_error(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _threads(path)
    app = make_app(fast_session(path=path))
    async with app.run_test(size=(160, 40)) as pilot:
        await open_from_picker(pilot, "orphan")
        await wait_for_text(
            pilot,
            "Sent to the model: 1 orphan tool result left out of what is sent (the stored messages are unchanged).",
        )
        await pilot.press("q")
        await open_from_picker(pilot, "waiting")
        await wait_for_text(pilot, "Waiting for you: yes or no?")
        await wait_for_text(pilot, "Ship it to production?")
        assert "Crashed" not in screen_text(app)
        await pilot.press("r")
        await wait_for(
            pilot,
            lambda: any(
                n.message == "Nothing to resume: the thread is waiting for an answer to 'Ship it to production?'; "
                "press y to answer it."
                for n in app._notifications
            ),
            what="the refusal",
        )
        await pilot.press("q")
        await open_from_picker(pilot, "failed")
        await wait_for_text(
            pilot, "The last model call failed  The model call failed: The Anthropic API is overloaded (529)."
        )
        assert "Crashed" not in screen_text(app)


async def test_r_on_a_failed_thread_retries_the_model_call_and_the_thread_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    await _threads(path)
    app = make_app(fast_session(path=path), thread_id="failed")
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="resume confirmation")
        assert squeezed("Resume retries the failed model call") in squeezed(screen_text(app))
        await pilot.press("y")
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, ThreadScreen)
                and not app.screen.running
                and app.screen.diagnosis is not None
                and app.screen.diagnosis.state is ThreadState.COMPLETED
            ),
            what="the retried run completed",
        )
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        data = await store.load("failed")
    finally:
        await store.close()
    # The failed reply is kept as stored; the retry's reply follows it (no new prompt), and
    # the thread went on from there (the demo agent's tools ran, then its final reply).
    assert [m.role for m in data.messages[:3]] == ["user", "assistant", "assistant"]
    assert data.messages[1].stop_reason == "error"
    assert data.messages[2].run_id != "a" and data.messages[-1].stop_reason == "stop"
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_the_picker_reads_what_lies_before_the_tail(tmp_path: Path) -> None:
    # The picker lists threads from their tails (the last assistant message on), yet a
    # dangling call before a later reply, or bad rows earlier in the thread, must show too.
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        for run in ("r0", "r1"):
            await store.claim_run("earlier-call", run)
        call = AssistantMessage(content=[ToolCall(id="c1", name="lookup")], stop_reason="tool_use", run_id="r0")
        await store.append("earlier-call", [user_text("look", run_id="r0"), call])
        await store.append("earlier-call", [user_text("go on", run_id="r1"), _final("Went on.", "r1")])
        await store.mark_run_complete("earlier-call", "r1")
        await store.claim_run("earlier-rows", "a")
        await store.append("earlier-rows", [user_text("hi", run_id="a"), _final("Hello.", "a")])
    finally:
        await store.close()
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO messages (thread_id, message_json, run_id) VALUES ('earlier-rows', '{not json', 'a')")
        c.execute(
            "INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)",
            ("earlier-rows", UnknownMessage(role="system", run_id="a").model_dump_json(), "a"),
        )
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        await store.append("earlier-rows", [user_text("again", run_id="a"), _final("Hello again.", "a")])
        await store.mark_run_complete("earlier-rows", "a")
    finally:
        await store.close()

    app = make_app(fast_session(path=path))
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 2, what="both rows")
        _, _, whole = await app.session.outline("earlier-call")
        assert whole.state is ThreadState.CRASHED
        await wait_for(
            pilot,
            lambda: (
                {r.thread_id: r.state for r in app.threads_screen.rows}
                == {"earlier-call": whole.label, "earlier-rows": "completed · 1 unreadable row · 1 row of unknown role"}
            ),
            what="the rows as the whole threads read",
        )


async def test_n_on_a_thread_with_unreadable_rows_refuses_before_anything_is_typed(tmp_path: Path) -> None:
    # It used to ask for the prompt, then refuse it and drop what was typed.
    path = tmp_path / "threads.sqlite"
    await _threads(path)
    app = make_app(fast_session(path=path), thread_id="unreadable")
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.press("n")
        await wait_for(
            pilot,
            lambda: any(
                "it can be read but not continued: start a new thread" in n.message for n in app._notifications
            ),
            what="the refusal",
        )
        await pilot.pause(0.3)
        assert isinstance(app.screen, ThreadScreen), "a prompt was asked for although it would be refused"


async def test_a_new_prompt_on_a_mid_tool_thread_says_how_its_calls_are_settled_first(fixture_copy: Path) -> None:
    # A prompt settles a crashed run's calls by the defaults, which used to happen unannounced.
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED), thread_id="crash-mid-tool")
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.press("n")
        expected = squeezed(
            "First, 1 tool call without a result is settled as resume would by default (an idempotent tool "
            "runs again, any other is recorded as interrupted); Escape, then r, to see and choose for each."
        )
        await wait_for(pilot, lambda: expected in squeezed(screen_text(app)), what="the hint")


def test_the_banner_of_a_thread_another_writer_continued_says_resume_settles_then_waits() -> None:
    # The call c1 was left unanswered before a later, final reply: settled, it would leave
    # that reply last in what is sent, so resume does not call the model.
    call = AssistantMessage(content=[ToolCall(id="c1", name="lookup")], stop_reason="tool_use", run_id="r0")
    history = [user_text("look", run_id="r0"), call, user_text("go on", run_id="r1"), _final("Went on.", "r1")]
    text = describe(diagnose(history)).plain
    assert text.startswith("Crashed mid-tool (point 3)")
    assert "r: shows what resume will do with each call and asks first. Resume first settles lookup (c1)" in text
    assert text.endswith("then it waits for your next message (the last reply is final, so the model is not called).")
    assert "model is called again" not in text and "calls the model" not in text
