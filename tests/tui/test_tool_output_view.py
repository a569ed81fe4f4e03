"""A tool call's output in the app: head and tail, expand (x, click), the pager (p, /, n, N,
Escape), and progress text capped for display."""

from __future__ import annotations

import asyncio
import re

from textual.widgets import Input, Static

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.tools import AgentTool, ToolContext, tool
from tests.helpers.tui import fast_session, screen_text, send_via_dialog, wait_for, wait_for_text
from tui.app import make_app
from tui.screens.pager import OutputView, PagerScreen
from tui.screens.thread import ThreadScreen
from tui.session import Session
from tui.tool_output import COLLAPSED, PROGRESS
from tui.widgets.tool_call import EXPANDED_ROWS, ToolCallView

LINES = 50_000
OUTPUT = "\n".join(f"row {i:05d} of the output" for i in range(LINES))


async def _thread_with_output(output: str) -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    await store.append(
        "t1",
        [
            user_text("List everything."),
            AssistantMessage(content=[ToolCall(id="c1", name="list_all", arguments={})], stop_reason="tool_use"),
            ToolResultMessage(tool_call_id="c1", tool_name="list_all", content=[TextContent(text=output)]),
            AssistantMessage(content=[TextContent(text="Listed.")], stop_reason="stop"),
        ],
    )
    return store


def _held_reporter(text: str, result: str, *, progress: float | None = None) -> tuple[AgentTool, asyncio.Event]:
    """A tool that reports ``text`` (and ``progress``), then returns ``result`` once the
    returned event is set: a call that stays running until the test lets it end."""
    gate = asyncio.Event()

    @tool
    async def reporter(ctx: ToolContext) -> str:
        """Report, then wait for the gate."""
        ctx.report(progress=progress, text=text)
        await gate.wait()
        return result

    return reporter, gate


def _calling(agent_tool: AgentTool, call_id: str, reply: str) -> Session:
    """A session whose model calls ``agent_tool`` once (no arguments, id ``call_id``), then says ``reply``."""
    return fast_session(
        MemoryCheckpointer(),
        tools=[agent_tool],
        make_provider=lambda: FauxProvider(
            [faux_reply(faux_tool_call(agent_tool.name, {}, id=call_id)), reply], delay=0.001
        ),
    )


async def _open(pilot, app) -> ToolCallView:  # type: ignore[no-untyped-def]
    await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="thread loaded")
    await wait_for_text(pilot, "Listed.")
    return app.screen.query_one(ToolCallView)


async def _open_pager(pilot, app) -> None:  # type: ignore[no-untyped-def]
    """Open the thread's tool call in the pager (``t`` then ``p``)."""
    await _open(pilot, app)
    await pilot.press("t", "p")
    await wait_for(pilot, lambda: isinstance(app.screen, PagerScreen), what="pager open")


def _result_text(view: ToolCallView) -> str:
    return view.query_one("#tool-result", Static).content.plain  # type: ignore[union-attr]


async def test_a_long_result_shows_head_and_tail_with_the_hidden_count() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(110, 60)) as pilot:
        view = await _open(pilot, app)
        shown = _result_text(view)
        assert "row 00000" in shown and "row 00007" in shown and "row 00008" not in shown
        assert "row 49999" in shown and "row 49992" in shown and "row 49991" not in shown
        assert f"… {LINES - 16:,} lines hidden …" in shown
        assert "50,000 lines · x: all · p: pager, searchable" in shown
        assert view.shown is not None and view.shown.lines_shown == COLLAPSED.head + COLLAPSED.tail
        assert "49,984 lines hidden" in screen_text(app)


async def test_t_focuses_the_tool_call_and_the_footer_shows_its_keys() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(110, 60)) as pilot:
        view = await _open(pilot, app)
        footer = screen_text(app).splitlines()[-1]
        assert "More" not in footer and "Pager" not in footer  # not focused: not offered
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is view, what="tool call focused")
        await pilot.pause()
        footer = screen_text(app).splitlines()[-1]
        assert "x All/less" in footer and "p Pager" in footer
        assert "a Abort" in footer  # the thread screen's keys still work beside them


async def test_x_expands_to_the_whole_output_in_a_box_and_collapses_and_a_click_expands() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(110, 60)) as pilot:
        view = await _open(pilot, app)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is view, what="tool call focused")
        await pilot.press("x")
        await wait_for(pilot, lambda: bool(view.query(OutputView)), what="expanded")
        box = view.query_one(OutputView)
        assert view.expanded and app.focused is box  # arrow keys scroll the box
        await wait_for(pilot, lambda: box.row_count == LINES, what="box laid out")
        assert box.size.height == EXPANDED_ROWS
        assert "50,000 lines, all below (scroll inside) · x: less" in _result_text(view)
        await wait_for_text(pilot, "row 00019 of the output")
        assert "row 00020" not in screen_text(app)
        await pilot.press("end")  # the box scrolls inside: the last line, never drawn before
        await wait_for_text(pilot, "row 49999 of the output")
        assert "row 25000" not in screen_text(app)

        await pilot.press("x")  # from inside the box: it reaches the call
        await wait_for(pilot, lambda: not view.expanded and not view.query(OutputView), what="collapsed")
        assert app.focused is view
        assert f"… {LINES - 16:,} lines hidden …" in _result_text(view)

        await pilot.click(view.query_one("#tool-result"))
        await wait_for(pilot, lambda: view.expanded and bool(view.query(OutputView)), what="expanded by a click")

        await pilot.press("x", "x", "x")  # faster than a box is removed: never two at once, no crash
        await wait_for(pilot, lambda: not view.expanded, what="collapsed after three presses")
        await wait_for(pilot, lambda: not view.query(OutputView), what="box removed")
        assert app.is_running


def _box_in_sight(app, view: ToolCallView) -> bool:  # type: ignore[no-untyped-def]
    """Whether the expanded box and the call's header are wholly inside the transcript's view."""
    shown = app.screen.transcript.scrollable_content_region
    box = view.query_one(OutputView).region
    header = view.query_one("#tool-header").region
    return bool(box) and shown.y <= header.y and box.bottom <= shown.bottom


async def test_end_in_the_box_shows_the_last_line_on_a_short_terminal() -> None:
    """At 80x24 the transcript shows 21 rows: a 20-row box below the call's header, status
    and note ran below the screen, so End inside it scrolled to rows nobody could see."""
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open(pilot, app)
        await pilot.press("t", "x")
        await wait_for(pilot, lambda: bool(view.query(OutputView)), what="expanded")
        box = view.query_one(OutputView)
        await wait_for(pilot, lambda: box.row_count == LINES, what="box laid out")
        await pilot.press("end")
        await wait_for_text(pilot, "row 49999 of the output")
        await wait_for(pilot, lambda: _box_in_sight(app, view), what="the box and its header on screen")
        height = box.size.height
        assert height < EXPANDED_ROWS and "⚙ list_all" in screen_text(app)

        await pilot.resize_terminal(80, 16)  # shorter still: the box shrinks to fit again
        await wait_for(pilot, lambda: box.size.height <= height - 8, what="the box refitted")
        await pilot.press("home", "end")
        await wait_for(pilot, lambda: _box_in_sight(app, view), what="the box on screen after the resize")
        assert "row 49999 of the output" in screen_text(app)


async def test_a_short_result_offers_no_expand() -> None:
    app = make_app(fast_session(await _thread_with_output("one\ntwo")), thread_id="t1")
    async with app.run_test(size=(110, 40)) as pilot:
        view = await _open(pilot, app)
        assert _result_text(view) == "one\ntwo"
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is view, what="tool call focused")
        await pilot.press("x")
        await pilot.pause()
        assert not view.expanded
        footer = screen_text(app).splitlines()[-1]
        assert "More" not in footer and "p Pager" in footer


async def _notice_after(pilot, key: str, words: str) -> str:  # type: ignore[no-untyped-def]
    """Press ``key``; return the notice holding ``words`` it brought."""
    app = pilot.app
    app.clear_notifications()
    await pilot.press(key)
    notices = lambda: [n.message for n in app._notifications if words in n.message]  # noqa: E731
    await wait_for(pilot, lambda: bool(notices()), what=f"a notice with {words!r} after {key}")
    return notices()[0]  # type: ignore[no-any-return]


async def test_x_and_p_say_why_they_do_nothing() -> None:
    """On a running call and on a short result they did nothing, silently."""
    slow, gate = _held_reporter("half way", "one\ntwo", progress=0.5)
    app = make_app(_calling(slow, "s1", "Slow done."))
    async with app.run_test(size=(110, 30)) as pilot:
        await send_via_dialog(pilot, "n", "Go slow.")
        await wait_for_text(pilot, "half way")
        view = app.screen.query_one(ToolCallView)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is view, what="the running call focused")
        running = "yet: the tool is still running, and its output comes with its result."
        assert await _notice_after(pilot, "x", "Nothing to expand") == f"Nothing to expand {running}"
        assert await _notice_after(pilot, "p", "Nothing to open") == f"Nothing to open in the pager {running}"
        assert not view.expanded and isinstance(app.screen, ThreadScreen)
        gate.set()
        await wait_for_text(pilot, "Slow done.")
        notice = await _notice_after(pilot, "x", "Nothing more")
        assert notice == "Nothing more to show: the whole output is shown already (p opens the pager)."
        assert not view.expanded
        await pilot.press("p")  # the pager still opens
        await wait_for(pilot, lambda: isinstance(app.screen, PagerScreen), what="pager open")


async def test_the_pager_opens_searches_steps_and_closes() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(100, 30)) as pilot:
        view = await _open(pilot, app)
        await pilot.press("t", "p")
        await wait_for(pilot, lambda: isinstance(app.screen, PagerScreen), what="pager open")
        pager = app.screen
        assert isinstance(pager, PagerScreen)
        await wait_for_text(pilot, "row 00000 of the output")
        await wait_for(pilot, lambda: pager.view.loaded, what="output read")
        await wait_for_text(pilot, "lines 1–27 of 50,000")  # 30 rows: title, status and footer take 3
        footer = screen_text(app).splitlines()[-1]
        assert "/ Search" in footer and "n Next" in footer and "N Previous" in footer and "Close" in footer

        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.focused, Input), what="search box")
        await pilot.press(*"ROW 0499")  # a capital: case-sensitive, so nothing matches
        await pilot.press("enter")
        await wait_for_text(pilot, "not found: ROW 0499")

        await pilot.press("slash")
        pager.search_box.value = ""
        await pilot.press(*"row 0499")  # lower case: case-insensitive; rows 04990-04999 match
        await pilot.press("enter")
        output = pager.query_one(OutputView)
        await wait_for(pilot, lambda: output.current is not None, what="a match")
        assert output.current == (4990, 0, 8)
        await wait_for_text(pilot, "row 04990 of the output")
        assert "10 matches for row 0499" in screen_text(app)
        assert "match at line 4,991" in screen_text(app)

        await pilot.press("n")
        await wait_for(pilot, lambda: output.current == (4991, 0, 8), what="next match")
        await pilot.press("N")
        await wait_for(pilot, lambda: output.current == (4990, 0, 8), what="previous match")
        await pilot.press("N")  # before the first: round to the last
        await wait_for(pilot, lambda: output.current == (4999, 0, 8), what="went round")
        await pilot.press("n")  # after the last: round to the first
        await wait_for(pilot, lambda: output.current == (4990, 0, 8), what="round to the first")
        await pilot.press("end", "n")  # from the bottom, n still finds the next after the current match
        await wait_for(pilot, lambda: output.current == (4991, 0, 8), what="next after the current")
        await wait_for_text(pilot, "row 04991 of the output")  # scrolled back to it

        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="pager closed")
        assert app.screen.query_one(ToolCallView) is view


def _pager_status(app) -> str:  # type: ignore[no-untyped-def]
    return app.screen.query_one("#pager-status", Static).content.plain  # type: ignore[no-any-return]


def _range_on_screen(app, pattern: str) -> str:  # type: ignore[no-untyped-def]
    """ "lines A–B" of the lines numbered by ``pattern`` (a regex, group 1 the 0-based number) on screen."""
    numbers = [int(m.group(1)) for m in re.finditer(pattern, screen_text(app))]
    return f"lines {min(numbers) + 1:,}–{max(numbers) + 1:,} "


async def _search(pilot, query: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press("slash")
    await wait_for(pilot, lambda: isinstance(pilot.app.focused, Input), what="search box")
    pilot.app.screen.search_box.value = query
    await pilot.press("enter")
    await wait_for(pilot, lambda: not pilot.app.screen.search_box.display, what="search box closed")


async def test_the_pager_says_the_lines_shown_after_a_search() -> None:
    """The search box docked below the view made it shorter; hidden again on Enter, the view
    grew back but the range kept its old bottom ("lines 11–27 of 43" with 21 rows shown)
    until the next key."""
    output = "\n".join(f"[red]row {i}[/red] text" for i in range(43))
    app = make_app(fast_session(await _thread_with_output(output)), thread_id="t1")
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_pager(pilot, app)
        await wait_for(pilot, lambda: app.screen.view.loaded, what="output read")  # type: ignore[attr-defined]
        row = r"\[red\]row (\d+)\["
        await wait_for(pilot, lambda: _range_on_screen(app, row) == "lines 1–21 ", what="21 rows shown")
        for query in ("row 30", "text"):  # one far below the top, then one on the top line
            await _search(pilot, query)
            await wait_for(pilot, lambda: app.screen.view.current is not None, what=f"a match for {query}")  # type: ignore[attr-defined]
            await wait_for(
                pilot,
                lambda: _pager_status(app).startswith(_range_on_screen(app, row)),
                what=f"the range shown after searching {query!r}",
            )


async def test_the_pager_says_which_rows_of_a_wrapped_line_are_shown() -> None:
    blob = "x" * 200_000
    app = make_app(fast_session(await _thread_with_output(blob)), thread_id="t1")
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_pager(pilot, app)
        pager = app.screen
        assert isinstance(pager, PagerScreen)
        await wait_for(pilot, lambda: pager.view.loaded, what="output read")
        rows = pager.view.row_count
        await wait_for(pilot, lambda: _pager_status(app) == f"line 1 of 1, rows 1–21 of {rows:,}", what="top rows")
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: _pager_status(app) == f"line 1 of 1, rows 22–42 of {rows:,}", what="next page")
        await pilot.press("end")
        await wait_for(
            pilot, lambda: _pager_status(app) == f"line 1 of 1, rows {rows - 20:,}–{rows:,} of {rows:,}", what="end"
        )


async def test_the_search_box_says_it_is_smart_case() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_pager(pilot, app)
        await pilot.press("slash")
        await wait_for_text(pilot, "any case, unless you type a capital")
        await pilot.press("escape")
        await _search(pilot, "ROW 0499")
        await wait_for_text(pilot, "not found: ROW 0499 (case-sensitive: it has a capital)")


async def test_escape_in_the_search_box_closes_only_the_box() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_pager(pilot, app)
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.focused, Input), what="search box")
        await pilot.press("n")  # typed into the box, not "next match"
        assert app.screen.search_box.value == "n"  # type: ignore[attr-defined]
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, PagerScreen) and not app.screen.search_box.display
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="pager closed")


async def test_the_pager_scrolls_to_the_end_of_50000_lines() -> None:
    app = make_app(fast_session(await _thread_with_output(OUTPUT)), thread_id="t1")
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_pager(pilot, app)
        await wait_for(pilot, lambda: app.screen.view.loaded, what="output read")  # type: ignore[attr-defined]
        await pilot.press("end")
        await wait_for_text(pilot, "row 49999 of the output")
        assert "of 50,000" in screen_text(app) and "row 00000" not in screen_text(app)


async def test_the_pager_wraps_a_line_of_2_mb_and_shows_it_literally() -> None:
    blob = "\x1b[31m" + "x" * (2 * 1024 * 1024) + "[b]END[/b]"
    app = make_app(fast_session(await _thread_with_output(blob)), thread_id="t1")
    async with app.run_test(size=(100, 30)) as pilot:
        view = await _open(pilot, app)
        assert "characters hidden" in _result_text(view)
        await pilot.press("t", "p")
        await wait_for(pilot, lambda: isinstance(app.screen, PagerScreen), what="pager open")
        await wait_for_text(pilot, "␛[31mxxx")
        output = app.screen.query_one(OutputView)
        await wait_for(pilot, lambda: output.loaded, what="output read")
        assert output.row_count >= len(blob) // output.wrap_width
        await pilot.press("end")
        await wait_for_text(pilot, "[b]END[/b]")
        assert "\x1b" not in screen_text(app)


async def test_progress_text_is_capped_for_display_while_the_tool_runs() -> None:
    gate = asyncio.Event()
    frames = "".join(f"\rprogress {i:5d}/10000" for i in range(1, 10_001))
    log = "\n".join(f"log line {i}" for i in range(50_000))
    blob = "y" * (2 * 1024 * 1024)

    @tool
    async def flood(ctx: ToolContext) -> str:
        """Report floods of progress text, then wait for the gate."""
        for text in (blob, log, frames):
            ctx.report(progress=0.5, text=text)
            await asyncio.sleep(0.2)
        await gate.wait()
        return "flooded"

    app = make_app(_calling(flood, "f1", "All done."))
    async with app.run_test(size=(110, 40)) as pilot:
        await send_via_dialog(pilot, "n", "Flood it.")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen), what="thread open")
        await wait_for_text(pilot, "progress 10000/10000")
        view = app.screen.query_one(ToolCallView)
        status = view.query_one("#tool-status", Static).content.plain  # type: ignore[union-attr]
        assert "progress 10000/10000" in status and "␍" not in status and "progress  9999" not in status
        assert len(view.status_text) < 4200  # capped at the source (core.tools.PROGRESS_TEXT_LIMIT)
        assert len(status) < PROGRESS.budget + 200
        gate.set()
        await wait_for_text(pilot, "All done.")


async def test_a_long_progress_log_shows_its_last_lines() -> None:
    chatty, gate = _held_reporter("\n".join(f"log line {i}" for i in range(50_000)), "done")
    app = make_app(_calling(chatty, "c1", "Finished."))
    async with app.run_test(size=(110, 40)) as pilot:
        await send_via_dialog(pilot, "n", "Talk.")
        await wait_for_text(pilot, "log line 49999")
        status = app.screen.query_one(ToolCallView).query_one("#tool-status", Static).content.plain  # type: ignore[union-attr]
        assert "log line 49997" in status and "log line 49996" not in status and "lines hidden" in status
        gate.set()
        await wait_for_text(pilot, "Finished.")


async def test_t_steps_back_through_the_tool_calls_even_from_an_expanded_box() -> None:
    store = MemoryCheckpointer()
    await store.append(
        "t1",
        [
            user_text("Two calls."),
            AssistantMessage(
                content=[ToolCall(id="c1", name="first", arguments={}), ToolCall(id="c2", name="second", arguments={})],
                stop_reason="tool_use",
            ),
            ToolResultMessage(tool_call_id="c1", tool_name="first", content=[TextContent(text="one")]),
            ToolResultMessage(tool_call_id="c2", tool_name="second", content=[TextContent(text=OUTPUT)]),
            AssistantMessage(content=[TextContent(text="Listed.")], stop_reason="stop"),
        ],
    )
    app = make_app(fast_session(store), thread_id="t1")
    async with app.run_test(size=(110, 60)) as pilot:
        await _open(pilot, app)
        first, second = app.screen.query(ToolCallView)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is second, what="the last call")
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is first, what="the one before")
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is second, what="round to the last")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.focused, OutputView), what="the box focused")
        await pilot.press("t")
        await wait_for(pilot, lambda: app.focused is first, what="the one before the expanded call")


async def test_a_call_gets_its_progress_bar_when_it_runs_and_a_stored_one_never() -> None:
    """A stored call never runs, so it mounts no bar; a running one shows the fraction
    reported, then an indeterminate bar once it reports none."""
    from textual.app import App, ComposeResult
    from textual.widgets import ProgressBar

    stored = ToolCallView(ToolCall(id="c1", name="read", arguments={}), status="unanswered")
    live = ToolCallView(ToolCall(id="c2", name="fetch", arguments={"n": 1}))

    class Calls(App[None]):
        def compose(self) -> ComposeResult:
            yield stored
            yield live

    async with Calls().run_test(size=(80, 20)) as pilot:
        stored.finish(ToolResultMessage(tool_call_id="c1", tool_name="read", content=[TextContent(text="out")]))
        await pilot.pause()
        assert not stored.query(ProgressBar) and not live.query(ProgressBar)
        live.report(0.5, "half way")
        await wait_for(pilot, lambda: "50%" in screen_text(pilot.app), what="the bar at 50%")
        bar = live.query_one(ProgressBar)
        assert bar.display and bar.percentage == 0.5 and live.status == "running"
        assert [child.id for child in live.children] == ["tool-header", "tool-progress", "tool-status", "tool-result"]
        live.progress = None
        await pilot.pause()
        assert bar.total is None  # indeterminate
        live.finish(ToolResultMessage(tool_call_id="c2", tool_name="fetch", content=[TextContent(text="done it")]))
        await wait_for(pilot, lambda: "done it" in screen_text(pilot.app), what="the result")
        assert not bar.display and "50%" not in screen_text(pilot.app)
