"""FlushGate: streamed text waits, briefly, while the user is pressing keys.

A flush of a streaming reply (new text into its live view, then Textual's layout and paint
of the thread screen) costs about 25-33 ms of CPU (round-1 profile, 5,000 tok/s in the
app); a key pressed while one runs, or just after one changed the screen, waits for it and
then for its own frame. The gate lets a key's screen change go first: for
:data:`INPUT_HOLD` seconds after a key or mouse event no flush draws, and the deltas pile up
in the live model (nothing is lost: the next flush shows them all at once). So that a user
who keeps typing still sees the reply move, no hold outlasts :data:`LONGEST_HOLD` seconds
since the last drawn flush.

While an opaque screen covers the thread (the help), ticks draw nothing at all and count as
drawn (:meth:`FlushGate.covered`): nothing stale is on screen then. Drawing there was the
largest waste while keys were pressed during a stream (profiled, 5,000 tok/s in the app, 30 s:
the covered thread screen was laid out 128 times under the help, 4.6 s of CPU, and each
layout repainted the help above it), and when the help closes the thread is only repainted,
not laid out again, with the key's frame still going first.
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


FRAME_SHARE = 1 / 3
"""The largest share of the main thread's CPU the stream's frames may take. After a drawn
flush whose frame (the flush, then Textual's layout and paint of it) cost ``c`` seconds of
CPU, the next flush waits until ``c / FRAME_SHARE`` seconds after it, at most ``longest``.
A frame of a long reply cost 25-33 ms on a quiet machine and ~55 ms under load (profiled,
5,000 tok/s in the app); at one per 50 ms tick the main thread was then busy 50-100 % of
the time, so nearly every key waited behind one. A third keeps most keys clear of a frame
while the text still moves several times a second; held text still shows within
``longest`` plus one tick."""


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
        share: float = FRAME_SHARE,
    ) -> None:
        self._input_at = input_at
        self._clock = clock
        self.hold = hold
        self.longest = longest
        self.share = share
        self._spacing = 0.0  # seconds the next draw keeps from the last one (frame_cost)
        self._drawn_at = float("-inf")
        self.held = 0
        """Ticks held so far (a work counter for tests)."""

    def may_draw(self) -> bool:
        """Whether this tick may draw: the last drawn flush is at least the spacing its
        frame's cost asks for old (:meth:`frame_cost`), and input is older than ``hold``
        seconds or that flush is ``longest`` seconds old or more. A ``True`` answer counts
        as a draw."""
        now = self._clock()
        since = now - self._drawn_at
        if since < self._spacing or (now - self._input_at() < self.hold and since < self.longest):
            self.held += 1
            return False
        self._drawn_at = now
        return True

    def frame_cost(self, seconds: float) -> None:
        """Report the CPU ``seconds`` the last drawn flush's frame cost: the next draw keeps
        ``seconds / share`` seconds from it, never more than ``longest`` (see
        :data:`FRAME_SHARE`)."""
        self._spacing = min(self.longest, max(0.0, seconds) / self.share)

    def covered(self) -> None:
        """A tick while an opaque screen hides the view: nothing is drawn, and nothing shown
        is stale, so it counts as a draw for ``longest``. Once the view is uncovered by a key
        (Escape on the help), the key's frame thus goes first and held text shows within
        ``hold`` of that key (or ``longest`` of the last covered tick)."""
        self._drawn_at = self._clock()
        self.held += 1
