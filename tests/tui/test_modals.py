"""Modals answer once: fast repeated keys never pop the screen beneath them."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Static

import tui
from tui.screens.modals import ConfirmModal, TextInputModal


class _Harness(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.answers: list[object] = []

    def compose(self) -> ComposeResult:
        yield Static("base screen")


async def test_enter_twice_in_a_text_input_answers_once() -> None:
    app = _Harness()
    async with app.run_test() as pilot:
        modal = TextInputModal("Steer")
        app.push_screen(modal, app.answers.append)
        await pilot.pause()
        await pilot.press("h", "i")
        # Two submits in one tick: what a terminal delivers for a fast "Enter Enter".
        modal.submit()
        modal.submit()
        await pilot.pause()
        assert app.answers == ["hi"]
        assert len(app.screen_stack) == 1 and app.screen is app.screen_stack[0]


async def test_yes_then_no_quickly_answers_once() -> None:
    app = _Harness()
    async with app.run_test() as pilot:
        modal = ConfirmModal("Resume?", "plan")
        app.push_screen(modal, app.answers.append)
        await pilot.pause()
        modal.action_answer(True)
        modal.action_answer(False)
        await pilot.pause()
        assert app.answers == [True]
        assert len(app.screen_stack) == 1


async def test_text_offered_again_is_kept_when_the_user_types_on() -> None:
    # The offered text used to start selected, so the first key typed replaced all of it.
    app = _Harness()
    async with app.run_test() as pilot:
        app.push_screen(TextInputModal("New prompt", value="ignore the question, do X"), app.answers.append)
        await pilot.pause()
        await pilot.press("space", "n", "o", "w", "enter")
        await pilot.pause()
    assert app.answers == ["ignore the question, do X now"]


class _Styled(_Harness):
    CSS_PATH = str(Path(tui.__file__).parent / "app.tcss")  # the app's dialogs, as it draws them


async def test_at_80x24_a_long_confirmation_scrolls_and_keeps_its_buttons_on_screen() -> None:
    # "Not delivered" lists every steer and follow-up a run ended without delivering: past
    # six of them at 80x24 the body pushed Send and Keep below the dialog's edge.
    body = "The run ended before 12 follow-ups reached the agent:\n\n" + "\n".join(
        f"Follow-up #{n}: item {n}" for n in range(1, 13)
    )
    app = _Styled()
    async with app.run_test(size=(80, 24)) as pilot:
        modal = ConfirmModal("Not delivered", body + "\n\nSend them now as a new run?", yes="Send", no="Keep")
        app.push_screen(modal, app.answers.append)
        await pilot.pause()
        await pilot.pause()
        for button in ("#yes", "#no"):
            region = modal.query_one(button).region
            assert region.area > 0 and Region(0, 0, *app.size).contains_region(region), (button, region)
        assert modal.query_one(VerticalScroll).max_scroll_y > 0, "the body scrolls instead"
        await pilot.press("y")
        await pilot.pause()
    assert app.answers == [True]
