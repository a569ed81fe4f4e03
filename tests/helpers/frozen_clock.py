"""A wall clock held still, for screens that must look the same on every run (the README's
screenshots and their snapshot tests).

:data:`CLOCK` is the instant every process of a scene reads from ``time.time()``: message
timestamps ("12:13:20"), lease heartbeats and expiries, "running since", token counts
(the demo model counts serialised messages, timestamps included). It is the clock the
cubeloop children use (``tests/helpers/cubeloop_threads.py``), so a scene mixing their
threads with ours shows one time. Rows' ``created_at`` still come from SQLite's own clock
(``julianday('now')``): they are later than :data:`CLOCK` on any machine whose clock is
right, so the picker's relative times read "just now" everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers.cubeloop_threads import DEFAULT_CLOCK

CLOCK = DEFAULT_CLOCK
"""Unix seconds every scene's processes read as "now": 2026-11-29 12:13:20 UTC."""


@contextmanager
def frozen_clock(at: float = CLOCK) -> Iterator[None]:
    """Within the block, ``time.time()`` returns ``at`` in this process (every module calls
    it as ``time.time``, so one assignment reaches them all); restored on exit. Monotonic
    clocks (asyncio's, Textual's timers) keep running."""
    real = time.time
    time.time = lambda: at  # type: ignore[assignment]
    try:
        yield
    finally:
        time.time = real  # type: ignore[assignment]
