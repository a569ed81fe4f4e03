"""Whether a screen is hidden behind an opaque screen above it in the app's stack.

Textual's ``Screen.is_current`` is also true for the screen just below the top one, opaque
or not (``App._background_screens`` always takes that screen), and such a screen is still
laid out whenever one of its widgets changes. A screen that no opaque screen covers may be
seen (through a translucent modal); one that is covered cannot, so drawing into it is work
nobody sees until it is on top again.
"""

from __future__ import annotations

from textual.screen import Screen


def covered(screen: Screen[object]) -> bool:
    """Whether a screen above ``screen`` in its app's stack has an opaque background
    (alpha 1: nothing of ``screen`` shows through). ``False`` for a screen not in the stack
    (being pushed, or already popped). Never raises."""
    stack = screen.app.screen_stack
    if screen not in stack:
        return False
    return any(above.styles.background.a == 1 for above in stack[stack.index(screen) + 1 :])
