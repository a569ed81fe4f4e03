"""Modals answer once: fast repeated keys never pop the screen beneath them."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

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
