"""FlushGate: streamed text is held while input is recent, never longer than its bound."""

from __future__ import annotations

import itertools

from core.checkpoint.memory import MemoryCheckpointer
from core.events import MessageStart, MessageUpdate, TextDelta
from core.messages import AssistantMessage, TextContent, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.flush_gate import FlushGate
from tui.messages import AgentEventReceived
from tui.screens.modals import HelpScreen
from tui.screens.thread import ThreadScreen
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.transcript import Transcript


class Clock:
    """A settable monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_draws_every_tick_without_input() -> None:
    clock = Clock()
    gate = FlushGate(lambda: float("-inf"), clock=clock, hold=0.1, longest=0.2)
    drawn = []
    for _ in range(10):
        drawn.append(gate.may_draw())
        clock.now += 0.05
    assert drawn == [True] * 10
    assert gate.held == 0


def test_holds_after_input_then_draws_once_quiet() -> None:
    clock = Clock()
    input_at = [float("-inf")]
    gate = FlushGate(lambda: input_at[0], clock=clock, hold=0.1, longest=0.2)
    assert gate.may_draw()  # drawn at 100.0
    clock.now = 100.05
    input_at[0] = 100.05  # a key
    assert not gate.may_draw()  # 0 s after the key
    clock.now = 100.1
    assert not gate.may_draw()  # 0.05 s after the key
    clock.now = 100.15
    assert gate.may_draw()  # 0.1 s after the key: the held text shows
    assert gate.held == 2


def test_keys_that_keep_coming_never_hold_past_the_bound() -> None:
    clock = Clock()
    input_at = [float("-inf")]
    gate = FlushGate(lambda: input_at[0], clock=clock, hold=0.1, longest=0.15)
    drawn_at = []
    for tick in range(40):  # 2 s of 50 ms ticks, a key just before every tick
        clock.now = 100.0 + tick * 0.05
        input_at[0] = clock.now - 0.01
        if gate.may_draw():
            drawn_at.append(clock.now)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(drawn_at)]
    assert drawn_at[0] == 100.0
    # A tick draws once ``longest`` has passed: at most one tick interval later than it.
    assert gaps and all(gap <= 0.15 + 0.05 for gap in gaps)
    assert gate.held == 40 - len(drawn_at) > 0


async def test_a_key_holds_the_streamed_text_until_the_gate_lets_it_through() -> None:
    """In the app: after a key press the thread screen's flush ticks draw nothing (the text
    waits in the partial reply), and the held text shows in full once the hold ends."""
    store = MemoryCheckpointer()
    await store.append("t", [user_text("hello")])
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        gate = screen._flush_gate
        gate.hold = gate.longest = 3600.0  # held for as long as the test looks
        before = app.session.input_at()
        await pilot.press("down")
        assert app.session.input_at() > before
        partial = AssistantMessage(content=[TextContent(text="")], model_id="demo")
        screen.post_message(AgentEventReceived("t", MessageStart(partial)))
        for piece in ("streamed ", "while ", "a key was pressed"):
            partial.content[0].text += piece
            screen.post_message(AgentEventReceived("t", MessageUpdate(partial, TextDelta(0, piece))))
        await wait_for(pilot, lambda: gate.held >= 3, what="three flush ticks held")
        assert "streamed" not in screen_text(app)
        assert screen.query_one(Transcript).live is None  # no widget was touched
        gate.hold = 0.0
        await wait_for_text(pilot, "streamed while a key was pressed")


def test_covered_ticks_count_as_drawn() -> None:
    """Ticks under an opaque screen draw nothing and reset the longest-hold clock, so a key
    that uncovers the view (Escape on the help) still gets its frame first."""
    clock = Clock()
    input_at = [float("-inf")]
    gate = FlushGate(lambda: input_at[0], clock=clock, hold=0.1, longest=0.15)
    assert gate.may_draw()  # drawn at 100.0
    for tick in range(1, 11):  # half a second under the help
        clock.now = 100.0 + tick * 0.05
        gate.covered()
    input_at[0] = clock.now = 100.52  # Escape: the view is back on top
    assert not gate.may_draw()  # without the covered ticks, 0.52 s since a draw would draw now
    clock.now = 100.62
    assert gate.may_draw()  # 0.1 s after the key
    assert gate.held == 11


async def test_no_flush_draws_under_the_help_and_the_held_text_shows_once_it_closes() -> None:
    """In the app: while the (opaque) help covers a streaming thread, its flush ticks touch no
    widget of it (so Textual does not lay the hidden screen out under the help); once the help
    closes, the text streamed meanwhile shows in full."""
    store = MemoryCheckpointer()
    await store.append("t", [user_text("hello")])
    app = make_app(fast_session(store), thread_id="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        screen = app.screen
        assert isinstance(screen, ThreadScreen)
        gate = screen._flush_gate
        partial = AssistantMessage(content=[TextContent(text="")], model_id="demo")
        screen.post_message(AgentEventReceived("t", MessageStart(partial)))
        transcript = screen.query_one(Transcript)
        await wait_for(pilot, lambda: transcript.live is not None, what="the live reply drawn")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help shown")
        held = gate.held
        for piece in ("streamed ", "under ", "the help"):
            partial.content[0].text += piece
            screen.post_message(AgentEventReceived("t", MessageUpdate(partial, TextDelta(0, piece))))
        await wait_for(pilot, lambda: gate.held >= held + 3, what="three flush ticks under the help")
        live = transcript.live
        assert live is not None
        assert "streamed" not in live.query_one(LiveMarkdown).source  # the covered reply was not touched
        await pilot.press("escape")
        await wait_for_text(pilot, "streamed under the help")


def test_an_expensive_frame_spaces_the_next_draw_within_the_bound() -> None:
    """After a frame that cost c seconds, the next draw waits c / share seconds, at most
    ``longest``; a cheap frame leaves every tick free to draw."""
    clock = Clock()
    gate = FlushGate(lambda: float("-inf"), clock=clock, hold=0.1, longest=0.15, share=1 / 3)
    assert gate.may_draw()  # at 100.0
    gate.frame_cost(0.04)  # the next draw keeps 0.12 s from it
    clock.now = 100.05
    assert not gate.may_draw()
    clock.now = 100.1
    assert not gate.may_draw()
    clock.now = 100.15
    assert gate.may_draw()
    gate.frame_cost(1.0)  # capped at longest
    clock.now = 100.29
    assert not gate.may_draw()
    clock.now = 100.31
    assert gate.may_draw()
    gate.frame_cost(0.005)  # 15 ms: the next 50 ms tick draws
    clock.now = 100.36
    assert gate.may_draw()
    assert gate.held == 3
