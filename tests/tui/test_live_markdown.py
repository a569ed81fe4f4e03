"""A streamed reply renders as the stored one does, and each flush costs what the open tail
costs, not the reply (issue 10: keys waited behind frames that re-laid out the whole reply)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from core.messages import AssistantMessage, TextContent, Usage
from tests.helpers.tui import screen_text, wait_for
from tui.widgets import live_markdown
from tui.widgets.frozen_paragraph import FrozenParagraph
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.message_view import AssistantMessageView

WORDS = [
    "alpha",
    "beta",
    "**bold words**",
    "`inline code`",
    "https://example.com/a/b",
    "[a link](https://example.org/x)",
    "snake_case_name",
    "a * b",
    "*emphasis*",
    "~~struck~~",
    "gamma,",
    "delta.",
]


def prose(words: int, seed: int) -> str:
    """A paragraph of ``words`` words, with inline Markdown, and no line break."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def document(sections: int) -> str:
    """Markdown with every block kind the app shows: headings, lists, fences, quotes, rules,
    tables and long paragraphs (long enough to be cut while streaming)."""
    parts = []
    for i in range(sections):
        parts.append(
            f"## Part {i}\n\n{prose(40, i)}\n\n- first item\n- second *item*\n  continued\n\n"
            f"1. one\n2. two\n\n```python\ndef f(x):\n    return x * {i}\n```\n\n> quoted {i}\n\n"
            f"| a | b |\n|---|---|\n| {i} | x |\n\n---\n{prose(300, 100 + i)}\n\n### small\n\n"
        )
    return "".join(parts)


def reply(text: str) -> AssistantMessage:
    return AssistantMessage(
        content=[TextContent(text=text)], stop_reason="stop", model_id="faux-1", timestamp=1.7e9, usage=Usage()
    )


class _Shell(App[None]):
    def __init__(self, view: AssistantMessageView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.view


def drawn(app: App[Any]) -> list[tuple[tuple[str, Any], ...]]:
    """Every screen line as (text, style) segments; link ids are random per render, so links
    are compared by their text and look, not their id."""
    return [
        tuple((s.text, s.style.clear_meta_and_links() if s.style else None) for s in strip)
        for strip in app.screen._compositor.render_strips()
    ]


async def shown_finished(text: str, size: tuple[int, int]) -> list[tuple[tuple[str, Any], ...]]:
    """The screen of a reply built finished, as the transcript shows one read from the store."""
    app = _Shell(AssistantMessageView(reply(text)))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        return drawn(app)


async def stream(pilot: Any, view: AssistantMessageView, text: str, seed: int, flush: int = 0) -> None:
    """Feed ``text`` to the live ``view`` in random small deltas, several per flush (as the
    thread view coalesces them), letting the screen lay out between flushes."""
    rng = random.Random(seed)
    at = 0
    while at < len(text):
        at = min(len(text), at + (flush or rng.randint(1, 400)))
        await view.sync(reply(text[:at]))
        await pilot.pause()


async def shown_streamed(text: str, size: tuple[int, int], seed: int = 1) -> list[tuple[tuple[str, Any], ...]]:
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await stream(pilot, view, text, seed)
        await view.finish(reply(text))
        await pilot.pause()
        return drawn(app)


def first_difference(a: list[Any], b: list[Any]) -> str:
    for y, (x, z) in enumerate(zip(a, b, strict=False)):
        if x != z:
            return f"line {y}:\n  stored:   {''.join(t for t, _ in x)!r}\n  streamed: {''.join(t for t, _ in z)!r}"
    return f"{len(a)} lines against {len(b)}"


@pytest.mark.parametrize("section_blocks", [live_markdown.SECTION_BLOCKS, 2])
async def test_a_streamed_reply_ends_drawn_as_the_stored_one(
    monkeypatch: pytest.MonkeyPatch, section_blocks: int
) -> None:
    """Code fences, lists, tables and long paragraphs split across deltas end exactly as the
    stored reply draws, cell for cell and style for style (sections of 2 blocks put a section
    boundary between every kind of neighbour)."""
    monkeypatch.setattr(live_markdown, "SECTION_BLOCKS", section_blocks)
    text = document(6)
    size = (90, 700)
    stored = await shown_finished(text, size)
    filled = [y for y, line in enumerate(stored) if "".join(t for t, _ in line).strip()]
    assert 250 < filled[-1] < size[1] - 2  # a long reply, all of it on the screen
    streamed = await shown_streamed(text, size)
    assert streamed == stored, first_difference(stored, streamed)


async def test_a_long_paragraph_is_cut_into_fragments_that_wrap_as_the_whole() -> None:
    text = prose(1500, 7)  # ~14,000 characters, no line break: the bench's kind of reply
    size = (70, 400)
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await stream(pilot, view, text, seed=3)
        document_view = view.query_one(LiveMarkdown)
        # Cut, not re-wrapped whole: one frozen part, grown by several pieces, above a short open part.
        frozen = document_view.query(FrozenParagraph)
        assert len(frozen) == 1 and frozen.first().pieces >= 2
        assert document_view.open_chars < 2 * live_markdown.SPLIT_CHARS
        await view.finish(reply(text))
        await pilot.pause()
        streamed = drawn(app)
    assert streamed == await shown_finished(text, size)


async def test_a_cut_paragraph_that_becomes_a_heading_is_drawn_as_one() -> None:
    """A setext underline after a long paragraph makes the whole paragraph a heading: the
    cut is undone and the heading drawn as the stored reply draws it."""
    text = prose(400, 11) + "\nstill the heading\n---\n\nafter it " + prose(20, 12) + "\n"
    size = (80, 200)
    assert await shown_streamed(text, size, seed=5) == await shown_finished(text, size)


async def test_a_reference_link_defined_at_the_end_ends_drawn_as_stored() -> None:
    text = "See [the docs][ref] first.\n\n" + prose(200, 13) + "\n\n[ref]: https://example.com/docs\n"
    size = (80, 60)
    streamed = await shown_streamed(text, size, seed=8)
    assert streamed == await shown_finished(text, size)
    assert "See the docs first." in "\n".join("".join(t for t, _ in line) for line in streamed)


async def test_untrusted_text_streams_literally() -> None:
    """Markup and terminal escapes in a streamed reply show as characters, as when stored."""
    text = "Look: \x1b[31mred\x1b[0m and [bold red]markup[/] here.\n\n" + prose(300, 4) + " \x1b]0;title\x07 end"
    size = (80, 120)
    streamed = await shown_streamed(text, size)
    assert streamed == await shown_finished(text, size)
    shown = "\n".join("".join(t for t, _ in line) for line in streamed)
    assert "␛[31mred␛[0m" in shown and "[bold red]markup[/]" in shown
    assert "\x1b" not in shown


async def test_a_resized_streamed_reply_draws_as_the_stored_one_at_the_new_width() -> None:
    text = prose(900, 9) + "\n\n" + document(1)
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=(100, 300)) as pilot:
        await pilot.pause()
        await stream(pilot, view, text, seed=2)
        await view.finish(reply(text))
        await pilot.resize_terminal(70, 300)
        await wait_for(pilot, lambda: view.query_one(LiveMarkdown).size.width <= 70, what="the resize")
        await pilot.pause()
        await pilot.pause()
        streamed = drawn(app)
    assert streamed == await shown_finished(text, (70, 300))


async def test_a_link_in_a_streamed_reply_is_not_opened() -> None:
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=(80, 30)) as pilot:
        opened: list[str] = []
        app.open_url = lambda url, **_: opened.append(url)  # type: ignore[method-assign]
        await view.sync(reply("see [here](https://evil.example/x) now"))
        await pilot.pause()
        markdown = view.query_one(LiveMarkdown)
        assert "see here now" in screen_text(app)
        markdown.post_message(Markdown.LinkClicked(markdown, "https://evil.example/x"))
        await wait_for(pilot, lambda: any("Link not opened" in n.message for n in app._notifications), what="notice")
        assert opened == []


async def _work_per_flush(text: str, flush: int, at: tuple[int, int]) -> list[dict[str, float]]:
    """Stream ``text`` in flushes of ``flush`` characters, following the tail as the transcript
    does; at each length in ``at``, the work of the next 10 flushes: characters parsed, wrapped
    again, children placed again, widgets on the screen and in the document (Textual walks them
    all on each layout), and pieces of frozen lines drawn."""
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    figures: list[dict[str, float]] = []
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        app.query_one(VerticalScroll).anchor()
        sent = 0
        for length in at:
            while sent < length:
                sent += flush
                await view.sync(reply(text[:sent]))
                await pilot.pause()
            document_view = view.query_one(LiveMarkdown)
            parsed_before, open_max, children_max, widgets_max = document_view.parsed_chars, 0, 0, 0
            drawn_before, descendants_max = _pieces_drawn(document_view), 0
            for _ in range(10):
                sent += flush
                await view.sync(reply(text[:sent]))
                await pilot.pause()
                open_max = max(open_max, document_view.open_chars)
                children_max = max(children_max, document_view.placed_per_append)
                widgets_max = max(widgets_max, len(app.screen._compositor.widgets))
                descendants_max = max(descendants_max, len(list(document_view.walk_children())))
            figures.append(
                {
                    "parsed": (document_view.parsed_chars - parsed_before) / 10,
                    "open": open_max,
                    "children": children_max,
                    "widgets": widgets_max,
                    "descendants": descendants_max,
                    "drawn": (_pieces_drawn(document_view) - drawn_before) / 10,
                }
            )
    return figures


def _pieces_drawn(document: LiveMarkdown) -> int:
    return sum(frozen.pieces_drawn for frozen in document.query(FrozenParagraph))


async def test_the_work_of_a_flush_does_not_grow_with_a_long_paragraph() -> None:
    """The bench's reply: 5,000 tokens/s of words without a line break, 1,000 characters a
    flush (20 flushes/s). The characters parsed and wrapped again per flush, the children
    placed again, and the widgets on the screen are the same at 30 kB into the reply as at
    120 kB (within 2x), and so are the widgets of the document (the long paragraph's frozen
    lines are one widget) and the frozen lines drawn (each piece once, not the paragraph)."""
    text = " ".join(f"w{i % 97:02d}" for i in range(40_000))
    short, long = await _work_per_flush(text, 1_000, (30_000, 120_000))
    assert long["descendants"] == short["descendants"], (short, long)
    assert 0 < long["drawn"] <= 2, (short, long)  # a cut per 1,500 characters: under one piece a flush
    for figure in ("parsed", "open", "children", "widgets", "drawn"):
        assert long[figure] <= 2 * max(short[figure], 1), (figure, short, long)
    assert short["parsed"] < 10_000  # far below the reply's length: only the tail is parsed


async def test_the_parsing_and_placing_of_a_flush_do_not_grow_with_many_blocks() -> None:
    """Headings, lists, fences, tables and paragraphs: what is parsed, wrapped and placed
    again per flush stays within 2x from 10 kB to 40 kB. (Each finished block stays a widget,
    which Textual's layout still visits on every frame.)"""
    short, long = await _work_per_flush(document(15), 1_000, (10_000, 40_000))
    for figure in ("parsed", "open", "children"):
        assert long[figure] <= 2 * max(short[figure], 1), (figure, short, long)
    assert short["parsed"] < 10_000


async def test_a_crlf_split_across_deltas_streams_as_the_stored_newline() -> None:
    """``clean`` turns ``\\r\\n`` into a newline but a lone ``\\r`` into ``␍``: a delta ending in
    ``\\r`` waits for the next one, so the split pair shows as the stored reply shows it."""
    text = "first line\r\nsecond line\r\n\r\nlast, with a lone \r here"
    view = AssistantMessageView(reply(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=(80, 20)) as pilot:
        for end in (11, 12, 25, 27, len(text)):  # cuts between each \r and its \n
            await view.sync(reply(text[:end]))
            await pilot.pause()
        await view.finish(reply(text))
        await pilot.pause()
        streamed = drawn(app)
    assert streamed == await shown_finished(text, (80, 20))
    shown = "\n".join("".join(t for t, _ in line) for line in streamed)
    assert "first line second line" in shown and "␍" in shown and shown.count("␍") == 1


async def test_streamed_thinking_shows_when_expanded() -> None:
    from core.messages import ThinkingContent
    from tui.widgets.message_view import ThinkingView

    def thinking(text: str) -> AssistantMessage:
        return AssistantMessage(content=[ThinkingContent(thinking=text)], timestamp=1.7e9)

    view = AssistantMessageView(thinking(""), live=True)
    app = _Shell(view)
    async with app.run_test(size=(80, 20)) as pilot:
        await view.sync(thinking("step one \x1b[2J"))
        await view.sync(thinking("step one \x1b[2J then step two"))
        await pilot.pause()
        assert "step two" not in screen_text(app)  # collapsed
        view.query_one(ThinkingView).collapsed = False
        await wait_for(pilot, lambda: "step one ␛[2J then step two" in screen_text(app), what="the reasoning")
        await view.sync(thinking("step one \x1b[2J then step two and three"))
        await wait_for(pilot, lambda: "and three" in screen_text(app), what="more reasoning")


async def test_frozen_lines_draw_as_the_joined_paragraph_down_to_the_selection_offsets() -> None:
    """A :class:`FrozenParagraph` grown piece by piece draws every line as a paragraph of the
    joined pieces does: text, styles, links, and the (x, y) offsets Textual puts in each
    segment for selecting text with the mouse (the pieces' line numbers are shifted)."""
    from markdown_it.token import Token
    from textual.content import Content
    from textual.geometry import Region
    from textual.widgets._markdown import MarkdownParagraph

    pieces = [
        Content.from_markup(f"[b]piece {i}[/b] " + "word " * (7 * i + 3) + "[link='https://example.com']a link[/]")
        for i in range(6)
    ]
    pieces[3] = pieces[3] + "\nafter a hard break " + "more " * 9

    class _Both(App[None]):
        def compose(self) -> ComposeResult:
            yield Markdown()

    app = _Both()
    async with app.run_test(size=(50, 120)) as pilot:
        document = app.query_one(Markdown)
        token = Token("paragraph_open", "p", 1)
        frozen, whole = FrozenParagraph(document, token), MarkdownParagraph(document, token)
        whole.set_content(Content("\n").join(pieces))
        await document.mount_all([frozen, whole])
        for piece in pieces:
            frozen.add_lines(piece)
            await pilot.pause()
        assert frozen.size == whole.size and frozen.size.height >= 15

        def lines(block: MarkdownParagraph) -> list[list[tuple[str, Any, Any]]]:
            region = Region(0, 0, *block.size)
            return [
                [
                    (
                        s.text,
                        s.style.clear_meta_and_links() if s.style else None,
                        s.style and s.style.meta.get("offset"),
                    )
                    for s in strip
                ]
                for strip in block.render_lines(region)
            ]

        assert lines(frozen) == lines(whole)
        assert frozen.pieces_drawn == len(pieces)  # each piece drawn once, none again
