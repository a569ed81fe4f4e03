"""Opening a thread shows its newest messages (scrolled to the end), whatever the first ones are."""

from __future__ import annotations

from pathlib import Path

from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, Usage, user_text
from tests.helpers.tui import fast_session, screen_text, wait_for
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.message_view import UserMessageView
from tui.widgets.transcript import WINDOW, Transcript


def _reply(*blocks: object, stop_reason: str = "stop") -> AssistantMessage:
    return AssistantMessage(
        content=list(blocks), stop_reason=stop_reason, model_id="demo", usage=Usage(input_tokens=1, output_tokens=1)
    )


def _turns(count: int) -> list[object]:
    """``count`` messages: prompt, a reply calling a tool, its result, the answer, again and again."""
    messages: list[object] = []
    i = 0
    while len(messages) < count:
        i += 1
        messages += [
            user_text(f"prompt {i}"),
            _reply(
                TextContent(text=f"calling for {i}"),
                ToolCall(id=f"c{i}", name="fetch", arguments={"n": i}),
                stop_reason="tool_use",
            ),
            ToolResultMessage(tool_call_id=f"c{i}", tool_name="fetch", content=[TextContent(text=f"result {i}")]),
            _reply(TextContent(text=f"answer {i}")),
        ]
    return messages[:count]


async def test_a_long_thread_opens_scrolled_to_its_newest_message() -> None:
    store = MemoryCheckpointer()
    await store.append("long", _turns(175))  # type: ignore[arg-type]
    app = make_app(fast_session(store), thread_id="long")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        transcript = app.screen.query_one(Transcript)
        # 175 messages end with prompt 44 and its call (the reply's answer never came).
        await wait_for(pilot, lambda: "result 44" in screen_text(app), what="the newest message in view")
        await pilot.pause(0.3)  # a bounded look: late layout (Markdown blocks) must not move the view
        assert transcript.scroll_y == transcript.max_scroll_y > 0
        text = screen_text(app)
        assert "result 44" in text and "earlier message" not in text


async def test_a_huge_first_prompt_opens_on_the_reply_after_it(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    await store.append("big", [user_text("X" * 120_000), _reply(TextContent(text="the answer at the end"))])
    await store.close()
    app = make_app(fast_session(path=path), thread_id="big")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await wait_for(pilot, lambda: "the answer at the end" in screen_text(app), what="the reply in view")
        transcript = app.screen.query_one(Transcript)
        assert transcript.scroll_y == transcript.max_scroll_y > 0


async def test_a_thread_of_more_than_a_page_that_fits_the_view_shows_from_its_top(tmp_path: Path) -> None:
    """Opened on its newest page, which is pinned to the end at once (the long thread's
    case); once every earlier page is in and all of it fits, it hangs from the top as a
    short thread does, not from the bottom."""
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    await store.append("short", [user_text(f"short {i}") for i in range(WINDOW + 10)])
    await store.close()
    app = make_app(fast_session(path=path), thread_id="short")
    async with app.run_test(size=(120, 160)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        transcript = app.screen.query_one(Transcript)
        await wait_for(pilot, lambda: transcript.shown_count == WINDOW + 10, what="every message mounted")
        await pilot.pause(0.3)  # a bounded look: nothing may move it down again
        first = transcript.query(UserMessageView).first()
        assert transcript.virtual_size.height <= transcript.scrollable_content_region.height
        assert transcript.scroll_y == 0 and not transcript.is_anchored
        assert first.region.y == transcript.content_region.y + first.styles.margin.top
        assert "short 0" in screen_text(app) and "short 29" in screen_text(app)


async def test_new_messages_keep_the_view_at_the_end_unless_the_user_scrolled_up() -> None:
    store = MemoryCheckpointer()
    await store.append("long", _turns(80))  # type: ignore[arg-type]
    app = make_app(fast_session(store), thread_id="long")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        transcript = app.screen.query_one(Transcript)
        await wait_for(
            pilot,
            lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y,
            what="the view at the end",
        )
        await transcript.append_message(user_text("one more"))
        await wait_for(pilot, lambda: "one more" in screen_text(app), what="the new message followed")
        assert transcript.scroll_y == transcript.max_scroll_y
        transcript.focus()
        await pilot.press("pageup")
        await wait_for(pilot, lambda: transcript.scroll_y < transcript.max_scroll_y, what="scrolled up")
        where = transcript.scroll_y
        await transcript.append_message(user_text("and another"))
        await pilot.pause(0.2)  # a bounded look: nothing should move
        assert transcript.scroll_y == where and "and another" not in screen_text(app)


async def test_showing_earlier_messages_brings_them_into_view() -> None:
    store = MemoryCheckpointer()
    messages: list[object] = []
    for i in range(100):
        messages += [user_text(f"question {i}"), _reply(TextContent(text=f"answer {i}"))]
    await store.append("long", messages)  # type: ignore[arg-type]
    app = make_app(fast_session(store), thread_id="long")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await wait_for(pilot, lambda: "answer 99" in screen_text(app), what="the end in view")
        transcript = app.screen.query_one(Transcript)
        await pilot.press("e")
        # The window was the last WINDOW entries (questions 90-99 at 20); the WINDOW entries
        # mounted above end with the answer just before them (answer 89).
        before = 100 - WINDOW // 2 - 1
        await wait_for(pilot, lambda: transcript.shown_count == 2 * WINDOW, what="earlier mounted")
        await wait_for(pilot, lambda: f"answer {before}" in screen_text(app), what="the earlier messages in view")
        assert "answer 99" not in screen_text(app)


async def test_sending_a_prompt_while_scrolled_up_brings_the_end_back_into_view() -> None:
    """Reading older messages, then sending a prompt: the user wants to watch the answer,
    so the view goes back to the end and follows it (before, it stayed where it was)."""
    from tests.helpers.tui import fill_dialog

    store = MemoryCheckpointer()
    await store.append("long", _turns(80))  # type: ignore[arg-type]
    app = make_app(fast_session(store), thread_id="long")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        screen = app.screen
        transcript = screen.query_one(Transcript)
        await wait_for(
            pilot,
            lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y,
            what="the view at the end",
        )
        transcript.focus()
        await pilot.press("pageup", "pageup")
        await wait_for(pilot, lambda: transcript.scroll_y < transcript.max_scroll_y, what="scrolled up")
        await fill_dialog(pilot, "n", "one last question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: "one last question" in screen_text(app), timeout=60, what="the prompt in view")
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="run finished")
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, what="the answer followed")
