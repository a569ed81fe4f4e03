"""The answer dialog fits the screen (issue 11): at 80x24, whatever the request holds, its
Send and Cancel buttons are on screen - the request's part scrolls, the buttons never do -
and a short request's dialog is only as tall as it needs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from textual.containers import VerticalScroll
from textual.geometry import Region

from core.checkpoint.memory import MemoryCheckpointer
from core.hitl import (
    ApproveRequest,
    AskRequest,
    ConfirmRequest,
    HumanRequest,
    Option,
    Question,
    RequestPayload,
    question_id_for,
)
from core.messages import AssistantMessage, ToolCall, user_text
from tests.helpers.tui import fast_session, open_from_picker, screen_text, wait_for
from tui.app import CubepiApp, make_app
from tui.screens.answer import AnswerModal

LONG_ARGS = {f"file_{n:02d}": f"/srv/data/part-{n:02d}.csv" for n in range(40)}
"""Arguments whose pretty JSON is 42 lines: more than any 24-row screen holds."""

PAYLOADS: dict[str, RequestPayload] = {
    "approval": ApproveRequest(tool_name="delete_files", tool_call_id="call_del_9", args=LONG_ARGS),
    "questions": AskRequest(
        questions=[
            Question(
                key=f"q{n}",
                prompt=f"Question {n}: which target?",
                options=[Option(label=f"target {m}", value=f"t{m}") for m in range(4)],
            )
            for n in range(6)
        ]
    ),
}


async def _waiting_store(payload: RequestPayload) -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    call = ToolCall(id="call_del_9", name="delete_files", arguments={})
    await store.claim_run("t", "run-1")
    await store.append("t", [user_text("clean up", run_id="run-1"), AssistantMessage(content=[call], run_id="run-1")])
    request = HumanRequest(
        question_id=question_id_for(payload), thread_id="t", payload=payload, created_at=time.time() - 30
    )
    await store.save_pending_request("t", request.model_dump_json(), run_id="run-1")
    return store


def _inside(app: CubepiApp, selector: str) -> bool:
    region = app.screen.query_one(selector).region
    return region.area > 0 and Region(0, 0, *app.size).contains_region(region)


def _shown_rows(dialog: AnswerModal, selector: str) -> int:
    """Rows of the widget ``selector`` that the request's scroll shows."""
    return dialog.query_one(VerticalScroll).region.intersection(dialog.query_one(selector).region).height


async def _dialog(pilot: Any) -> AnswerModal:
    app = pilot.app
    await open_from_picker(pilot, "t")
    await pilot.press("y")
    await wait_for(pilot, lambda: isinstance(app.screen, AnswerModal), what="the answer dialog")
    await pilot.pause()
    return app.screen  # type: ignore[return-value]


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
async def test_at_80x24_the_send_and_cancel_buttons_are_on_screen(kind: str) -> None:
    app = make_app(fast_session(await _waiting_store(PAYLOADS[kind])))
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = await _dialog(pilot)
        assert _inside(app, "#send") and _inside(app, "#cancel"), dialog.query_one("#send").region
        assert dialog.query_one(VerticalScroll).max_scroll_y > 0, "the request scrolls instead"
        await pilot.press("ctrl+s")  # nothing chosen: the error line takes a row, the buttons stay
        said = {"approval": "Choose approve (a)", "questions": "needs an answer"}[kind]
        await wait_for(pilot, lambda: said in screen_text(app), what="the error")
        await pilot.pause()
        assert _inside(app, "#send") and _inside(app, "#cancel"), dialog.query_one("#send").region
        if kind == "approval":
            # Each field the decision shows is scrolled to; the buttons stay. (The keys d and
            # e are the dialog's while the choices have the focus; the reason field takes e.)
            for decision, field in (("deny", "#reason"), ("edit", "#edited-args")):
                await pilot.click(f"#decision-{decision}")
                await wait_for(pilot, lambda field=field: dialog.query_one(field).has_focus, what=f"{field} focused")
                await wait_for(
                    pilot,
                    lambda field=field: _shown_rows(dialog, field) >= 3,
                    what=f"{field} scrolled to",
                )
                assert _inside(app, "#send") and _inside(app, "#cancel"), dialog.query_one("#send").region


async def test_a_short_request_makes_a_dialog_no_taller_than_it_needs() -> None:
    app = make_app(fast_session(await _waiting_store(ConfirmRequest(prompt="Ship it?"))))
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = await _dialog(pilot)
        scroll = dialog.query_one(VerticalScroll)
        assert scroll.max_scroll_y == 0 and scroll.size.height == scroll.virtual_size.height
        assert dialog.query_one(".dialog").outer_size.height < 21, "not stretched to its share of the screen"
        assert _inside(app, "#send") and _inside(app, "#cancel")


@pytest.mark.parametrize("multi", [False, True])
async def test_option_labels_are_shown_exactly_as_the_agent_wrote_them(multi: bool) -> None:
    options = [
        Option(label="[b]prod[/b]", value="prod", description="[red]all[/red] users"),
        Option(label="stage\x1b[2J", value="stage"),
    ]
    question = Question(key="env", prompt="Which one?", options=options, multi_select=multi)
    app = make_app(fast_session(await _waiting_store(AskRequest(questions=[question]))))
    async with app.run_test(size=(100, 30)) as pilot:
        await _dialog(pilot)
        text = screen_text(app)  # "N  label": the dialog's lines (the panel behind has "N label (value)")
        assert "1  [b]prod[/b]" in text and "2  stage␛[2J" in text, text
        if not multi:  # a single choice's description is beside its label, literally too
            assert "1  [b]prod[/b] - [red]all[/red] users" in text, text
