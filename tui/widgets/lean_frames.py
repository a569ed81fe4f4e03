"""Cheap frames for the widgets that hold a streaming reply: one layout, no own paint.

Three Textual behaviours made each frame of a streamed reply cost about twice what it needed
(profiled in the app at 5,000 tok/s, issue 10):

* **A second layout per frame.** After a layout, Textual sets each widget's new size and
  ``virtual_size``; that reactive asks for a layout again (``layout=True``), which clears the
  arrangement of every ancestor up to the transcript. So every flush was laid out twice, the
  second time re-arranging the reply's containers - and re-indexing the reply's whole height
  in each container's spatial map (one entry per 20 rows: a cost that grows with the reply)
  - only to find the sizes the first layout had just found. For a widget that never
  scrolls, the layout that set its size has already placed its children at that size;
  :class:`SettledSize` takes the size without asking again, as Textual itself does for the
  widgets a scroll exposes (``layout=False`` in ``Screen._refresh_layout``).
* **The reply's height indexed on every layout.** Each container Textual arranges again
  indexes its children in a spatial map of 100 x 20-cell squares (to find the visible ones
  when scrolling), and a child is entered in every square it covers: the reply, its
  document and its sections each hold the reply's full height, so a 480 kB reply (about
  5,000 rows) was entered some 500 times in each of five containers on every frame: the
  part of a frame that grew with the reply. :class:`CoarseIndex` indexes them in squares of
  :data:`INDEX_ROWS` rows instead.
* **Containers painted under their children.** Textual's compositor asks every visible
  widget for its lines, containers too, and a container's lines are rendered again
  whenever its size changes: the transcript, the reply, its document and its sections each
  rendered the whole viewport on every frame (2-6 ms each under load), lines the blocks
  above them then covered. :class:`BlankLines` gives those lines without rendering: a
  container with no border and no content of its own has blank lines in its background.
"""

from __future__ import annotations

from typing import cast

from rich.style import Style
from textual._spatial_map import SpatialMap
from textual.geometry import Region, Size
from textual.layout import DockArrangeResult
from textual.strip import Strip
from textual.widget import Widget

# The mixins are not Widget subclasses: Textual's CSS follows only the first DOMNode base of
# a class (``DOMNode._css_bases``), so a Widget mixin put first would cut a widget off from
# its Textual base's CSS and type name (``Vertical``'s layout, ``Markdown > ...`` rules).


class SettledSize:
    """For a widget that never scrolls (overflow hidden, Textual's default): its size, once a
    layout has found it, asks for no second layout (see the module docstring). Mix in
    before the Textual widget class."""

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        # Textual's ``is_scrollable`` means "is a container", so it cannot tell these apart:
        # the classes that mix this in are the ones known not to scroll.
        widget = cast(Widget, super())
        return widget._size_updated(size, virtual_size, container_size, layout=False)


class BlankLines:
    """A container whose own lines are blank: no border, no text, no tint, hatch or opacity
    (Textual draws scrollbars as widgets of their own). Its lines are made, not rendered,
    exactly as Textual's styles cache renders such lines: spaces in the background of the
    widget over the one beneath it. Mix in before the Textual base class."""

    def render_lines(self, crop: Region) -> list[Strip]:
        """``crop.height`` blank lines ``crop.width`` cells wide, in the widget's background
        (Textual's rendering when its styles draw something of their own after all)."""
        widget = cast(Widget, self)
        styles = widget.styles
        drawn = any(edge[0] for edge in (*styles.border, *styles.outline))
        if drawn or styles.tint.a or widget.opacity != 1 or styles.has_rule("hatch"):
            return cast(Widget, super()).render_lines(crop)
        base, background = widget.background_colors
        style = Style(bgcolor=(base + background).rich_color)
        return [Strip.blank(crop.width, style)] * crop.height


INDEX_ROWS = 1_000
"""Rows (and columns) per square of the spatial map of a :class:`CoarseIndex` container
(Textual's: 20 rows, 100 columns). A child is entered once per square it covers, so a reply
5,000 rows high is entered 5 times per container, not 250-500; a query for the viewport's
children reads one or two squares and keeps those that overlap it, as Textual does."""


class CoarseIndex:
    """For a container whose children may be thousands of rows high: their spatial map has
    squares of :data:`INDEX_ROWS` (see the module docstring). Mix in before the Textual
    widget class."""

    def arrange(self, size: Size, optimal: bool = False) -> DockArrangeResult:
        """Textual's arrangement (cached by Textual per size and children), indexed coarsely
        the first time it is made."""
        result = cast(Widget, super()).arrange(size, optimal)
        if result._spatial_map is None:
            # DockArrangeResult.spatial_map's own construction, with coarser squares.
            index: SpatialMap = SpatialMap(INDEX_ROWS, INDEX_ROWS)
            index.insert(
                (
                    placement.region.grow(placement.margin),
                    placement.offset,
                    placement.fixed,
                    placement.overlay,
                    placement,
                )
                for placement in result.placements
            )
            result._spatial_map = index
        return result
