"""What drawing a run takes, run here or followed: where it is drawn, and its retry wait.

Two renderers draw a thread's run on its screen, one job each:
:class:`~tui.screens.local_run.LocalRun` a run of this process, from its agent's events,
and :class:`~tui.screens.followed_run.FollowedRun` a run of another process, from a
follower's changes. Both draw into a :class:`RunSurface` (the thread screen) and show a
model call's retry wait on that screen's one :class:`RetryCountdown`, so a thread followed
and then run here never counts down two waits at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from core.providers.retry import retry_label

if TYPE_CHECKING:
    from textual.timer import Timer

    from core.events import RetryWait
    from tui.widgets.status_bar import StatusBar
    from tui.widgets.transcript import Transcript

RETRY_TICK = 0.25
"""Seconds between two redraws of a retry wait's countdown (its label counts whole seconds)."""


class RunSurface(Protocol):
    """Where a run is drawn: a thread screen's transcript and status bar.

    Both are looked up at each use: once the app ends they are gone, and the lookup raises
    :class:`~textual.css.query.NoMatches` (which :func:`tui.screens.thread_view.while_attached`
    expects).
    """

    @property
    def transcript(self) -> Transcript:
        """The message list."""
        ...

    @property
    def status_bar(self) -> StatusBar:
        """The one-line status."""
        ...


class RetryCountdown:
    """A model call's retry wait in ``surface``'s status bar, counting down each second.

    One per screen, shared by the run here and the run followed: showing a wait replaces
    the one shown.
    """

    def __init__(self, surface: RunSurface) -> None:
        self._surface = surface
        self._shown: tuple[RetryWait, float] | None = None  # the wait, and its end (monotonic s)
        self._timer: Timer | None = None

    @property
    def shown(self) -> bool:
        """Whether a wait is shown now."""
        return self._shown is not None

    def show(self, wait: RetryWait, left: float | None = None) -> None:
        """Show ``wait``, counting down from ``left`` seconds (default: all of
        ``wait.seconds``; a negative ``left`` shows "retrying now")."""
        self._stop()
        self._shown = (wait, time.monotonic() + (wait.seconds if left is None else left))
        bar = self._surface.status_bar
        self._count_down(bar)
        # The bar's own timer: it stops with the bar, so it never draws into a screen that is gone.
        self._timer = bar.set_interval(RETRY_TICK, lambda: self._count_down(bar), name="retry countdown")

    def clear(self) -> None:
        """Show no wait (the next attempt streams, or the run ended)."""
        self._stop()
        self._shown = None
        self._surface.status_bar.retry = ""

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _count_down(self, bar: StatusBar) -> None:
        if self._shown is None or not bar.is_attached:
            return
        wait, until = self._shown
        bar.retry = retry_label(wait.reason, until - time.monotonic(), wait.attempt, wait.max_attempts)
