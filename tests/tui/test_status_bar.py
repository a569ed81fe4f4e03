"""The thread screen's status bar fits its line: on a narrow terminal it gives way (narrower
separators, then no model, then no token counts) instead of cutting a count short."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tests.helpers.tui import screen_text
from tui.widgets.status_bar import StatusBar


class _Bar(App[None]):
    def compose(self) -> ComposeResult:
        yield StatusBar()


def _line(app: App[None]) -> str:
    return screen_text(app).splitlines()[0].strip()


async def _shown(width: int, *, model: str = "demo", state: str = "completed") -> str:
    app = _Bar()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.thread_id, bar.run_state, bar.model = "quarterly-review", state, model
        bar.input_tokens, bar.output_tokens = 2049, 458
        await pilot.pause()
        return _line(app)


async def test_at_80_columns_the_token_counts_are_shown_whole() -> None:
    assert await _shown(120) == "thread quarterly-review  ·  completed  ·  model demo  ·  tokens 2,049 in / 458 out"
    assert await _shown(80) == "thread quarterly-review · completed · model demo · tokens 2,049 in / 458 out"


async def test_a_long_model_gives_way_to_the_tokens_and_a_long_state_to_nothing() -> None:
    model = "claude-sonnet-4-5-20250929"
    assert await _shown(80, model=model) == "thread quarterly-review · completed · tokens 2,049 in / 458 out"
    assert await _shown(140, model=model) == (
        f"thread quarterly-review  ·  completed  ·  model {model}  ·  tokens 2,049 in / 458 out"
    )
    state = "waiting for an answer: approve delete_file (call_del_1)?"
    shown = await _shown(80, state=state)
    assert shown.startswith(f"thread quarterly-review · {state[:40]}") and shown.endswith("…")
    assert "tokens" not in shown and len(shown) == 78


async def test_the_bar_fits_again_when_the_terminal_narrows() -> None:
    app = _Bar()
    async with app.run_test(size=(120, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.thread_id, bar.run_state, bar.model = "quarterly-review", "completed", "demo"
        bar.input_tokens, bar.output_tokens = 52, 134
        await pilot.pause()
        assert "  ·  tokens 52 in / 134 out" in _line(app)
        await pilot.resize_terminal(70, 3)
        await pilot.pause()
        assert _line(app) == "thread quarterly-review · completed · tokens 52 in / 134 out"
