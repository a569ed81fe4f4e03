"""LiveMarkdown: a Markdown document that grows by appends, in time independent of its length.

Textual's ``Markdown.append`` re-parses from the start of the last top-level block, but it
splits the whole source into lines on every append, and a block that keeps growing (a reply
streamed without a blank line: one paragraph) is parsed, linkified and re-wrapped whole on
every frame. Profiled in the app at 5,000 tok/s that was 66-75 % of the main thread (wrapping)
plus 17 % (linkify), so a key waited behind frames that grew with the reply (issue 10).

Here only the *tail* is ever parsed again: the source from the start of the last top-level
block. Finished blocks are mounted once and never touched again (Textual caches their height
and lines). A tail that is one long paragraph is cut at *neutral points* (see
:func:`neutral_piece`): spaces where every inline construct of the text before is closed,
so the text after parses the same alone as it does after the rest. The closed text's styled
content is kept, and once it wraps to more than one line at the widget's width, its complete
lines are moved into the paragraph's *frozen part*, one
:class:`~tui.widgets.frozen_paragraph.FrozenParagraph` (a paragraph block without a bottom
margin, that draws each added line once). Word wrap is greedy (``rich._wrap.divide_line``,
which Textual's ``Content`` uses), so the frozen lines are exactly the first lines the whole
paragraph would wrap to. The live paragraph then holds less than a line of closed text plus
the open tail: parsing and wrapping per append are bounded by the cut size
(:data:`SPLIT_CHARS`), whatever the reply's length.

Layout: Textual lays out a container's children again whenever one of them changes, so the
blocks sit in two levels of sections (:data:`SECTION_BLOCKS`) whose heights are kept per
width; a cut paragraph is two widgets (its frozen part and its live block) however long it
grows, since Textual's layout also walks every widget of the screen on each frame.

Exactness: what is shown equals ``Markdown(source)`` at the same width. When a later line
turns the cut paragraph into something else (a setext heading or a table header), the first
tail block is not a paragraph any more; the paragraph is then parsed again from its start,
once. Frozen lines are cut for one width: a width change rebuilds the document once.

Not bounded yet: a growing tail block other than a top-level paragraph (one long list, quote
or code fence is re-parsed and rebuilt whole per append, as in Textual), text with no spaces
to cut at (Chinese, Japanese), and the per-frame walk over the widgets of a reply made of
thousands of blocks. A reference-style link definition (``[x]: url``) is seen only by the
blocks parsed with it while streaming (as with Textual's own appends); :meth:`LiveMarkdown.finish`
parses a reply that has one again, whole, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from markdown_it import MarkdownIt
from markdown_it.token import Token
from rich._wrap import divide_line
from textual.await_complete import AwaitComplete
from textual.content import Content
from textual.events import Mount, Resize
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownBlock, MarkdownParagraph

from tui.widgets.frozen_paragraph import FrozenParagraph
from tui.widgets.lean_frames import BlankLines, CoarseIndex, SettledSize

SECTION_BLOCKS = 32
"""Finished blocks per section (and sections per outer section): the document's children are
laid out again on every append, so finished blocks sit two levels down in sections whose
arrangement Textual keeps cached; an append then places about ``n / SECTION_BLOCKS**2`` outer
sections plus the open ones, not ``n`` blocks."""

SPLIT_CHARS = 1_500
"""Characters of open paragraph text after which the live paragraph is cut at a neutral point.

The cost of one append is proportional to this (one parse of the open text, one wrap of the
live paragraph); 1,500 characters parse and wrap in about a millisecond here. Smaller cuts
add more, smaller pieces to the frozen part (each drawn once)."""

_RISKY = re.compile(r"[`\[\]<>~\\]")
"""Characters that, left over as literal text in a piece, could still pair with text after it:
an unmatched backtick opens a code span, brackets a link, ``<`` an autolink or HTML, ``~~``
strikethrough, ``\\`` an escape. A piece with any of them left over is not cut (safe: the
paragraph just waits for a later neutral point)."""

_FLANKING = re.compile(r"(?<=\S)[*_]|[*_](?=\S)")
"""An emphasis delimiter next to a non-space: it may open or close emphasis with a later one.
Delimiters between spaces (``a * b``) never do (CommonMark: neither left- nor right-flanking);
intraword underscores (``snake_case``) are accepted separately."""

_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:", re.MULTILINE)
"""A link reference definition (CommonMark 4.7): it applies to the whole document."""

_INTRAWORD_UNDERSCORE = re.compile(r"(?<=[^\W_])_+(?=[^\W_])")

_INLINE_TYPES = frozenset(
    {
        "text",
        "softbreak",
        "hardbreak",
        "code_inline",
        "em_open",
        "em_close",
        "strong_open",
        "strong_close",
        "s_open",
        "s_close",
        "link_open",
        "link_close",
        "image",
    }
)
"""Inline tokens a neutral piece may hold: the ones ``MarkdownBlock._token_to_content`` draws."""


def _leftover_delimiter(text: str) -> bool:
    """Whether literal ``text`` (a text token of a parsed piece) holds a delimiter that could
    still pair with one after the piece."""
    if _RISKY.search(text):
        return True
    return _FLANKING.search(_INTRAWORD_UNDERSCORE.sub("", text)) is not None


def neutral_piece(tokens: list[Token]) -> bool:
    """Whether ``tokens`` (a piece of paragraph source, parsed alone, that ends with a space
    before a letter) is one paragraph whose inline constructs are all closed.

    Then (CommonMark's delimiter algorithm matches each closer with the nearest opener before
    it, and code spans, links and autolinks are matched forwards from their opener) the
    piece's inline parse is the same as in the whole paragraph, and the text after it starts
    fresh: no opener is left for it to close."""
    if len(tokens) != 3 or [t.type for t in tokens] != ["paragraph_open", "inline", "paragraph_close"]:
        return False
    if tokens[0].level != 0:
        return False
    for child in tokens[1].children or ():
        if child.type not in _INLINE_TYPES:
            return False
        if child.type == "text" and _leftover_delimiter(child.content):
            return False
    return True


def _cut_candidates(text: str, limit: int) -> Iterable[int]:
    """Offsets ``s`` in ``text`` (latest first, at most ``limit``) where a paragraph may be cut:
    after a single space that follows a non-space, before a letter (so the text after cannot
    start a list, heading, quote or code block)."""
    found = 0
    s = len(text) - 1
    while s > 1 and found < limit:
        s = text.rfind(" ", 0, s)
        if s <= 0:
            return
        cut = s + 1
        if cut < len(text) and text[cut].isalpha() and not text[s - 1].isspace():
            found += 1
            yield cut
        s -= 1


def _wrap_breaks(plain: str, width: int) -> list[int]:
    """Offsets in ``plain`` where Textual's ``Content`` wrap (``divide_line`` per hard line,
    ``fold`` overflow) starts a new line after a space or a newline (never inside a word)."""
    breaks: list[int] = []
    offset = 0
    lines = plain.split("\n")
    for index, line in enumerate(lines):
        breaks.extend(offset + b for b in divide_line(line, width, fold=True) if line[b - 1].isspace())
        offset += len(line) + 1
        if index < len(lines) - 1:
            breaks.append(offset)
    return breaks


class _Section(SettledSize, BlankLines, CoarseIndex, Widget):
    """Finished blocks (or inner sections) of a :class:`LiveMarkdown`, laid out as the document
    lays out its own children (one layout per frame, nothing drawn of its own:
    :mod:`tui.widgets.lean_frames`)."""

    DEFAULT_CSS = """
    _Section { width: 1fr; height: auto; layout: vertical; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._height: tuple[tuple[int, int, int], int] | None = None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The height of the blocks at ``width``, computed once per width and set of children.

        Textual keys a child's box model and a container's arrangement by the size of the
        parent, and the document's height changes on every append: without this, every
        section laid out all its blocks again on every frame (profiled: about half the main
        thread once a reply had a few hundred blocks). The blocks' heights (all ``auto``)
        do not depend on the parent's height; a block that changes bumps ``_layout_updates``.
        """
        key = (width, self._nodes._updates, self._layout_updates)
        if self._height is not None and self._height[0] == key:
            return self._height[1]
        height = super().get_content_height(container, viewport, width)
        self._height = (key, height)
        return height


class LiveMarkdown(SettledSize, BlankLines, CoarseIndex, Markdown):
    """A :class:`~textual.widgets.Markdown` fed by :meth:`write`, costing per append what the
    open tail costs, not the document; see the module docstring. Its frames cost one layout
    and nothing drawn of its own (:mod:`tui.widgets.lean_frames`).

    Renders exactly as ``Markdown(source)`` does (same blocks, styles, CSS and link events).
    Blocks live in sections (:data:`SECTION_BLOCKS`); Textual's vertical layout
    collapses the margins of neighbours to the larger one but adds those of neighbours in two
    sections, so a section only ends where one of the two margins is 0 (before a paragraph,
    whose top margin is 0, or after a block whose bottom margin is 0).
    """

    DEFAULT_CSS = """
    LiveMarkdown _Section > MarkdownParagraph { margin: 0 0 1 0; }
    LiveMarkdown _Section > FrozenParagraph { margin: 0; }
    """
    # The first rule is Textual's ``Markdown > MarkdownParagraph`` for paragraphs in sections.

    def __init__(self, markdown: str = "", *, open_links: bool = True) -> None:
        super().__init__(None, open_links=open_links)
        self._parts: list[str] = []
        self._source: str | None = ""
        self._initial = markdown
        self._reset_state()
        self.parsed_chars = 0
        """Characters parsed so far (tail re-parses and piece checks): the work counter tests
        compare at two reply lengths."""
        self.blocks_mounted = 0
        """Block widgets mounted so far (finished blocks, frozen parts, live tails)."""

    def _reset_state(self) -> None:
        self._tail = ""  # source from the start of the last top-level block, or from the last cut
        self._tail_line = 0  # source lines before the tail's first line
        self._live: list[MarkdownBlock] = []  # mounted blocks of the tail (last in the open section)
        self._pending = Content()  # closed text of the cut paragraph not yet frozen
        self._cut_source: list[str] = []  # source of the cut paragraph before the tail
        self._frozen: FrozenParagraph | None = None  # the frozen part of the cut paragraph
        self._laid_out_width = 0  # the width frozen lines were cut for (0: none yet)
        self._probe: MarkdownBlock | None = None  # a frozen part, to see the width change
        self._outer: _Section | None = None  # the open outer section
        self._inner: _Section | None = None  # the open inner section (in the outer one)
        self._last_finished: MarkdownBlock | None = None

    @property
    def source(self) -> str:
        """The Markdown written so far."""
        if self._source is None:
            self._source = "".join(self._parts)
            self._parts = [self._source]
        return self._source

    @property
    def open_chars(self) -> int:
        """Characters of text in the open (re-rendered) blocks: what one append wraps again."""
        return sum(len(block._content.plain) for block in self._live)

    @property
    def placed_per_append(self) -> int:
        """Children Textual places again after an append: the document's, the open outer
        section's and the open inner section's (the closed sections keep their layout)."""
        return sum(len(node.children) for node in (self, self._outer, self._inner) if node is not None)

    async def _on_mount(self, event: Mount) -> None:
        # Markdown's own handler (next in the MRO) would replace the document with its initial
        # text once mounted, after writes may have begun; Widget's only shows scrollbars for
        # overflow "scroll", which a Markdown document does not use.
        event.prevent_default()
        initial, self._initial = self._initial, ""
        if initial:
            await self.write(initial)

    def update(self, markdown: str) -> AwaitComplete:
        """Replace the document with ``markdown``."""

        async def replace() -> None:
            async with self.lock:
                await self._replace(markdown)

        return AwaitComplete(replace())

    def append(self, markdown: str) -> AwaitComplete:
        """Append ``markdown`` (what :class:`~textual.widgets.markdown.MarkdownStream` calls)."""
        return AwaitComplete(self.write(markdown))

    async def write(self, markdown: str) -> None:
        """Append ``markdown`` to the document and show it."""
        if not markdown:
            return
        async with self.lock:
            await self._write(markdown)

    async def finish(self) -> None:
        """The document is complete: parse it again whole when it defines a link reference,
        which blocks parsed before the definition did not see."""
        async with self.lock:
            if _REFERENCE_DEFINITION.search(self.source):
                await self._replace(self.source)

    async def _write(self, markdown: str) -> None:
        self._parts.append(markdown)
        self._source = None
        self._tail += markdown
        await self._render_tail()

    async def _replace(self, markdown: str) -> None:
        await self.remove_children()
        self._parts, self._source = [], ""
        self._reset_state()
        await self._write(markdown)

    def _parser(self) -> MarkdownIt:
        return MarkdownIt("gfm-like") if self._parser_factory is None else self._parser_factory()

    async def _render_tail(self) -> None:
        """Parse the tail; move the blocks it finished into sections; show its open block;
        cut it when it is a long paragraph."""
        parser = self._parser()
        while True:
            tokens = parser.parse(self._tail)
            self.parsed_chars += len(self._tail)
            if self._cut_source and not (tokens and tokens[0].type == "paragraph_open" and tokens[0].level == 0):
                await self._uncut()  # a later line made the cut paragraph a heading or a table
                continue
            blocks = list(self._parse_markdown(tokens))
            for block in blocks:
                start, end = block.source_range
                block.source_range = (start + self._tail_line, end + self._tail_line)
            if self._cut_source and blocks and isinstance(blocks[0], MarkdownParagraph):
                blocks[0].set_content(self._pending + blocks[0]._content)
            last_start = next((t.map[0] for t in reversed(tokens) if t.map is not None and t.level == 0), 0)
            if last_start > 0:
                # Every block before the last top-level one is finished.
                open_start = last_start + self._tail_line
                finished = [b for b in blocks if b.source_range[0] < open_start]
                opened = blocks[len(finished) :]
                with self.app.batch_update():
                    for widget in self._live:
                        await widget.remove()
                    self._live = []
                    await self._finish(finished)
                    await self._show(opened)
                self._tail = "".join(self._tail.splitlines(keepends=True)[last_start:])
                self._tail_line = open_start
                self._end_cut()
            else:
                await self._show(blocks)
            if not (
                len(self._tail) > SPLIT_CHARS
                and len(self._live) == 1
                and isinstance(self._live[0], MarkdownParagraph)
                and tokens
                and tokens[0].type == "paragraph_open"
            ):
                return
            if not await self._cut(parser):
                return

    async def _show(self, blocks: list[MarkdownBlock]) -> None:
        """Show ``blocks`` in place of the tail's mounted blocks (a paragraph updated in place),
        at the end of the open section, so the margins between them and the finished blocks
        collapse as in one document."""
        old = self._live
        if old and blocks and type(old[0]) is type(blocks[0]) and isinstance(blocks[0], MarkdownParagraph):
            content = blocks[0]._content
            if old[0]._content.plain != content.plain or old[0]._content.spans != content.spans:
                old[0].set_content(content)
            old[0]._copy_context(blocks[0])
            kept, old, blocks = [old[0]], old[1:], blocks[1:]
        else:
            kept = []
        with self.app.batch_update():
            for widget in old:
                await widget.remove()
            if blocks:
                if self._inner is None:
                    await self._open_section()
                assert self._inner is not None
                await self._inner.mount_all(blocks)
                self.blocks_mounted += len(blocks)
        self._live = kept + blocks

    async def _finish(self, blocks: list[MarkdownBlock]) -> None:
        """Mount finished ``blocks`` after the finished ones (before the live tail). A new
        section is opened only while no block is live (the live blocks must stay last); a
        frozen part made under a live paragraph joins the open section, full or not (a cut
        paragraph has one)."""
        run: list[MarkdownBlock] = []
        for block in blocks:
            if self._inner is None or (
                not self._live and self._finished_in_inner() + len(run) >= SECTION_BLOCKS and self._may_end(block, run)
            ):
                await self._mount_run(run)
                run = []
                await self._open_section()
            run.append(block)
        await self._mount_run(run)

    def _finished_in_inner(self) -> int:
        assert self._inner is not None
        return len(self._inner.children) - sum(1 for widget in self._live if widget.parent is self._inner)

    def _may_end(self, block: MarkdownBlock, run: list[MarkdownBlock]) -> bool:
        """Whether a section may end before ``block`` without changing the gap above it."""
        previous = run[-1] if run else self._last_finished
        if isinstance(block, MarkdownParagraph):
            return True  # top margin 0 (Textual's rule, repeated for sections in DEFAULT_CSS)
        return previous is not None and previous.is_mounted and previous.styles.margin.bottom == 0

    async def _mount_run(self, run: list[MarkdownBlock]) -> None:
        if run:
            assert self._inner is not None
            if not self._inner.is_attached:  # never seen since sections open only with no live block
                await self._open_section()
            live = [widget for widget in self._live if widget.parent is self._inner]
            await self._inner.mount_all(run, before=live[0] if live else None)
            self.blocks_mounted += len(run)
            self._last_finished = run[-1]

    async def _open_section(self) -> None:
        """Start a new inner section (and a new outer one when the open one is full)."""
        if self._outer is None or len(self._outer.children) >= SECTION_BLOCKS:
            self._outer = _Section()
            await self.mount(self._outer)
        self._inner = _Section()
        await self._outer.mount(self._inner)

    async def _cut(self, parser: MarkdownIt) -> bool:
        """Cut the live paragraph at its latest neutral point and freeze its complete lines.
        Returns whether the tail was cut (it is then rendered again, shorter)."""
        tail = self._tail
        for cut in _cut_candidates(tail, 3):
            piece = tail[:cut]
            tokens = parser.parse(piece)
            self.parsed_chars += len(piece)
            if not neutral_piece(tokens):
                continue
            closed = next(iter(self._parse_markdown(tokens)))
            self._pending = self._pending + closed._content + " "
            self._cut_source.append(piece)
            self._tail = tail[cut:]
            self._tail_line += piece.count("\n")
            await self._freeze_lines(tokens[0])
            return True
        return False

    async def _freeze_lines(self, token: Token) -> None:
        """Move the complete wrapped lines of the closed text into the frozen part above the live
        paragraph (when the live paragraph has been laid out, so its width is known)."""
        # The size the live block was last laid out at (``region`` would make Textual place
        # every widget of the screen when the block is scrolled out of view).
        width = self._live[0]._size.width or self._laid_out_width
        if width <= 0 or "\t" in self._pending.plain:
            return  # not laid out yet (or tabs, which Content expands before wrapping): later
        if self._laid_out_width and width != self._laid_out_width:
            return  # a resize is under way: on_resize rebuilds
        breaks = _wrap_breaks(self._pending.plain, width)
        if not breaks:
            return
        split = breaks[-1]
        lines = self._pending[:split].rstrip()
        self._pending = self._pending[split:]
        self._laid_out_width = width
        if self._frozen is not None and self._frozen.is_attached:
            self._frozen.add_lines(lines)
            return
        frozen = FrozenParagraph(self, token)
        frozen.add_class("-fragment")
        frozen.add_lines(lines)
        self._frozen = self._probe = frozen
        await self._finish([frozen])

    def _end_cut(self) -> None:
        """The cut paragraph ended: its frozen part and last part stay as they are."""
        self._cut_source, self._frozen = [], None
        self._pending = Content()

    async def _uncut(self) -> None:
        """Parse the cut paragraph again from its start (it turned out not to be a paragraph)."""
        self._tail = "".join(self._cut_source) + self._tail
        self._tail_line -= sum(piece.count("\n") for piece in self._cut_source)
        if self._frozen is not None:
            await self._frozen.remove()
        self._last_finished = None  # may have been the frozen part: end no section after it
        self._end_cut()

    async def on_resize(self, event: Resize) -> None:
        # Frozen parts hold lines wrapped for one width: at another, show the document afresh.
        if not self._laid_out_width:
            return  # no line was ever frozen
        probe = self._probe
        if probe is None or not probe.is_attached:
            probe = next(iter(self.query(".-fragment").results(MarkdownBlock)), None)
        if probe is not None and probe._size.width not in (0, self._laid_out_width):
            async with self.lock:
                await self._replace(self.source)
