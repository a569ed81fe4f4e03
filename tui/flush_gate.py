"""FlushGate: streamed text waits, briefly, while the user is pressing keys.

A flush of a streaming reply (new text into its live view, then Textual's layout and paint
of the thread screen) costs about 25-33 ms of CPU (round-1 profile, 5,000 tok/s in the
app); a key pressed while one runs, or just after one changed the screen, waits for it and
then for its own frame. The gate lets a key's screen change go first: for
:data:`INPUT_HOLD` seconds after a key or mouse event no flush draws, and the deltas pile up
in the live model (nothing is lost: the next flush shows them all at once). So that a user
who keeps typing still sees the reply move, no hold outlasts :data:`LONGEST_HOLD` seconds
since the last drawn flush.
"""

from __future__ import annotations

import time
from collections.abc import Callable

INPUT_HOLD = 0.1
"""Seconds after an input event during which flushes wait. A key's own work here (the help
screen's push or pop, laid out and painted) takes ~20-40 ms of CPU (idle key press p95
34-38 ms, measured with ``python -m bench --only idle``), so 0.1 s covers it with room for a
loaded machine, and is short enough that the held text reads as one frame late."""

LONGEST_HOLD = 0.15
"""Seconds since the last drawn flush after which a flush draws even though input is recent.
The gate is asked on the flush timer's ticks (``FLUSH_INTERVAL``, 50 ms), so held text shows
within ``LONGEST_HOLD`` plus one tick: 200 ms at most, the bound set for it (issue 10's round 2)."""


class FlushGate:
    """Decides, at each flush tick, whether streamed text is drawn now or held.

    ``input_at`` gives the time of the last input event and ``clock`` the current time, both
    in the same monotonic seconds (``Session.input_at`` and ``time.monotonic`` in the app).
    """

    def __init__(
        self,
        input_at: Callable[[], float],
        *,
        clock: Callable[[], float] = time.monotonic,
        hold: float = INPUT_HOLD,
        longest: float = LONGEST_HOLD,
    ) -> None:
        self._input_at = input_at
        self._clock = clock
        self.hold = hold
        self.longest = longest
        self._drawn_at = float("-inf")
        self.held = 0
        """Ticks held so far (a work counter for tests)."""

    def may_draw(self) -> bool:
        """Whether this tick may draw: input is older than ``hold`` seconds, or the last drawn
        flush is ``longest`` seconds old or more. A ``True`` answer counts as a draw."""
        now = self._clock()
        if now - self._input_at() < self.hold and now - self._drawn_at < self.longest:
            self.held += 1
            return False
        self._drawn_at = now
        return True
