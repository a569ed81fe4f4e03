"""The thread view renders stored threads: messages, tool calls, untrusted text, long threads."""

from __future__ import annotations

import base64

from textual.widgets import Button

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    user_text,
)
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.thread import ThreadScreen
from tui.widgets.tool_call import ToolCallView
from tui.widgets.transcript import WINDOW, Transcript


def _reply(*blocks: object, stop_reason: str = "stop") -> AssistantMessage:
    return AssistantMessage(
        content=list(blocks), stop_reason=stop_reason, model_id="faux-1", usage=Usage(input_tokens=10, output_tokens=5)
    )


async def _store_with(thread_id: str, *messages: object) -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    await store.append(thread_id, list(messages))  # type: ignore[arg-type]
    return store


async def test_opening_a_thread_shows_its_messages() -> None:
    store = await _store_with(
        "t1",
        user_text("Count the files in /data"),
        _reply(
            TextContent(text="Let me look."),
            ToolCall(id="c1", name="list_files", arguments={"path": "/data"}),
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id="c1", tool_name="list_files", content=[TextContent(text="a.txt\nb.txt")]),
        _reply(TextContent(text="There are **2** files.")),
    )
    app = make_app(fast_session(store))
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for_text(pilot, "Count the files")  # the picker lists it with its first prompt
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="thread loaded")
        await wait_for_text(pilot, "There are 2 files.")
        text = screen_text(app)
        assert "Count the files in /data" in text
        assert "Let me look." in text
        assert "list_files" in text and '{"path": "/data"}' in text
        assert "a.txt" in text and "b.txt" in text
        assert "completed" in text  # the status bar's run state
        assert "20 in / 10 out" in text  # token usage of both replies
        view = app.screen.query_one(ToolCallView)
        assert view.status == "ok"


async def test_untrusted_output_is_shown_literally() -> None:
    hostile = "[bold red]x[/] then \x1b[31mred\x1b[0m and \x07bell"
    store = await _store_with(
        "t1",
        user_text("[link=file:///etc/passwd]click[/link]"),
        _reply(ToolCall(id="c1", name="run", arguments={"cmd": "[b]ls[/b]"}), stop_reason="tool_use"),
        ToolResultMessage(tool_call_id="c1", tool_name="run", content=[TextContent(text=hostile)], is_error=True),
        _reply(TextContent(text="Model said [bold red]x[/] and \x1b[2J")),
    )
    app = make_app(fast_session(store), thread_id="t1")
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for_text(pilot, "then")
        text = screen_text(app)
        assert "[bold red]x[/] then ␛[31mred␛[0m and ␇bell" in text  # markup and escapes as characters
        assert "[link=file:///etc/passwd]click[/link]" in text
        assert '{"cmd": "[b]ls[/b]"}' in text
        assert "Model said [bold red]x[/] and ␛[2J" in text
        assert "\x1b" not in text and "\x07" not in text
        assert app.screen.query_one(ToolCallView).status == "error"  # shown red, as an error


async def test_long_thread_mounts_only_the_tail_and_shows_earlier_on_demand() -> None:
    messages: list[object] = []
    for i in range(600):
        messages.append(user_text(f"question {i}"))
        messages.append(_reply(TextContent(text=f"answer {i}")))
    store = await _store_with("long", *messages)
    app = make_app(fast_session(store), thread_id="long")
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        transcript = app.screen.query_one(Transcript)
        assert transcript.shown_count == WINDOW
        assert "answer 599" in screen_text(app)  # the tail is in view
        earlier = transcript.query_one("#earlier", Button)
        assert earlier.display and f"{1200 - WINDOW:,} earlier messages hidden" in str(earlier.label)
        await pilot.press("e")
        await wait_for(pilot, lambda: transcript.shown_count == 2 * WINDOW, what="earlier shown")


async def test_hostile_thread_ids_and_links_are_inert() -> None:
    hostile_id = "[bold red]id[/]\x1b[31m"
    store = await _store_with(
        hostile_id, user_text("hi"), _reply(TextContent(text="see [here](https://evil.example/x)"))
    )
    app = make_app(fast_session(store))
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for_text(pilot, "[bold red]id[/]␛[31m")  # the picker shows the id as characters
        await pilot.press("enter")
        await wait_for_text(pilot, "see here")
        assert "thread [bold red]id[/]␛[31m" in screen_text(app)  # the status bar too
        opened: list[str] = []
        app.open_url = lambda url, **_: opened.append(url)  # type: ignore[method-assign]
        from textual.widgets import Markdown

        markdown = app.screen.query(Markdown).last()
        markdown.post_message(Markdown.LinkClicked(markdown, "https://evil.example/x"))
        await wait_for(pilot, lambda: any("Link not opened" in n.message for n in app._notifications), what="notice")
        assert opened == []


async def test_a_thread_screen_closed_before_it_mounted_does_not_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Enter then q faster than screens switch: the screen is gone before its first mount."""
    from tests.helpers.tui import fast_session
    from tui.app import make_app
    from tui.screens.thread import ThreadScreen

    app = make_app(fast_session(path=tmp_path / "t.sqlite"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = ThreadScreen(app.session, "t-fast")
        app.push_screen(screen)
        app.pop_screen()  # same tick: nothing of the screen has run yet
        await pilot.pause(0.3)
        assert app.is_running and not isinstance(app.screen, ThreadScreen)


async def test_images_in_prompts_and_tool_results_are_named_with_their_size() -> None:
    # They used to be left out of the view entirely (a prompt of only an image looked raw).
    png = base64.b64encode(b"\x89PNG" + b"\x00" * 92).decode()
    call = ToolCall(id="c1", name="screenshot")
    store = await _store_with(
        "t1",
        UserMessage(content=[TextContent(text="What is in this?"), ImageContent(data=png, mime_type="image/png")]),
        _reply(call, stop_reason="tool_use"),
        ToolResultMessage(
            tool_call_id="c1", tool_name="screenshot", content=[ImageContent(data=png, mime_type="image/png")]
        ),
        _reply(TextContent(text="A blank picture.")),
    )
    app = make_app(fast_session(store), thread_id="t1")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_text(pilot, "A blank picture.")
        assert screen_text(app).count("[image image/png, 96 bytes]") == 2, screen_text(app)
