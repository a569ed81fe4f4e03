"""FrozenParagraph: the closed lines of a long paragraph cut while it streams, one widget that
grows by whole wrapped lines and draws each line once.

:class:`~tui.widgets.live_markdown.LiveMarkdown` moves the complete wrapped lines of a long
paragraph out of the live block as the paragraph grows. Kept as one fragment widget per cut
(joined pairwise up to 24 kB), a 500 kB paragraph was still ~30 widgets in the section that
Textual lays out on every frame: each frame placed all of them and walked the spatial map of
each one (profiled in the app at 5,000 tok/s: the frame's layout took 4x longer at 480 kB
than at 30 kB). Here the lines live in ONE widget: each added piece is wrapped and turned
into strips once, at the width the lines were cut for, and a frame costs one child to place
and the visible lines to draw, whatever the paragraph's length.

Exactness: the pieces are consecutive parts of one paragraph's content, each ending at the
end of a wrapped line; joined with newlines they wrap to the same lines as the paragraph
(greedy wrap: see :mod:`tui.widgets.live_markdown`). A piece is rendered as Textual renders
the joined content (``Visual.to_strips``, the same styles and link styles), with its line
numbers shifted to where it starts in the joined content, so even the offsets Textual puts
in each segment's style (used to select text with the mouse) are the joined content's. While
text is selected in the widget it is rendered whole, as a ``MarkdownParagraph`` is.
"""

from __future__ import annotations

from markdown_it.token import Token
from textual.content import Content
from textual.geometry import Size
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import _RenderCache
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownParagraph

from tui.widgets.lean_frames import SettledSize


class _ShiftedContent(Content):
    """``content`` whose hard lines are numbered from ``first_line`` (as in a longer content
    whose line ``first_line`` it starts)."""

    def __init__(self, content: Content, first_line: int) -> None:
        super().__init__(content.plain, list(content.spans), content.cell_length, strip_control_codes=False)
        self._first_line = first_line

    def _wrap_and_format(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        lines = super()._wrap_and_format(*args, **kwargs)
        for line in lines:
            line.y += self._first_line
        return lines


class FrozenParagraph(SettledSize, MarkdownParagraph):
    """A paragraph block built by :meth:`add_lines`, drawn as ``MarkdownParagraph`` draws the
    pieces joined with newlines (see the module docstring).

    Its CSS type is ``FrozenParagraph`` and it matches every ``MarkdownParagraph`` rule. It
    grows on every cut without a second layout (:class:`~tui.widgets.lean_frames.SettledSize`)."""

    def __init__(self, markdown: Markdown, token: Token) -> None:
        self._pieces: list[Content] = []
        self._first_lines: list[int] = []  # the hard line of the joined content each piece starts
        self._joined: Content | None = Content()
        self._strips: list[Strip] = []
        self._rendered = 0  # pieces drawn into _strips
        self._drawn_for: tuple[object, ...] | None = None  # what _strips were drawn with
        self.pieces_drawn = 0
        """Pieces turned into strips so far, counting each new drawing (at a new width or
        style) again: the work counter tests compare at two paragraph lengths."""
        super().__init__(markdown, token)

    @property
    def _content(self) -> Content:  # type: ignore[override]
        """The pieces joined (made when asked for: by a text selection, never per frame)."""
        if self._joined is None:
            self._joined = Content("\n").join(self._pieces)
        return self._joined

    @_content.setter
    def _content(self, content: Content) -> None:
        # MarkdownBlock's __init__ and set_content: the content becomes the only piece.
        self._pieces, self._first_lines = [], []
        self._strips, self._rendered, self._drawn_for = [], 0, None
        if content:
            self._append(content)

    @property
    def pieces(self) -> int:
        """How many pieces were added (each once drawn)."""
        return len(self._pieces)

    def add_lines(self, content: Content) -> None:
        """Show ``content`` below the lines shown: complete wrapped lines of the paragraph,
        the next part of it (see the module docstring)."""
        self._append(content)
        self.refresh(layout=True)

    def _append(self, content: Content) -> None:
        first = 0
        if self._pieces:
            first = self._first_lines[-1] + self._pieces[-1].plain.count("\n") + 1
        self._pieces.append(content)
        self._first_lines.append(first)
        self._joined = None

    def render(self) -> Content:
        """The joined pieces (what Textual renders when it renders this widget whole)."""
        return self._content

    def _lines(self, width: int) -> list[Strip]:
        """The strips of every piece at ``width``, drawing only the pieces not drawn yet."""
        key = (width, self.visual_style, self.link_style, self.screen._selecting)
        if key != self._drawn_for:
            self._drawn_for, self._strips, self._rendered = key, [], 0
        style = self.visual_style
        for index in range(self._rendered, len(self._pieces)):
            piece = _ShiftedContent(self._pieces[index], self._first_lines[index])
            self._strips.extend(Visual.to_strips(self, piece, width, None, style))
            self.pieces_drawn += 1
        self._rendered = len(self._pieces)
        return self._strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The number of wrapped lines at ``width`` (each piece wrapped once per width)."""
        if not width:
            return 0
        return len(self._lines(width))

    def _render_content(self) -> None:
        if self.text_selection is not None:
            super()._render_content()  # the selection's lines are the joined content's: draw it whole
            return
        self._render_cache = _RenderCache(self.size, self._lines(self.size.width))
        self._dirty_regions.clear()
