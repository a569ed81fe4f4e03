"""Whole-thread diagnoses for the picker, computed once per thread version and off the fast path.

The picker lists every thread from its summary (:class:`core.checkpoint.base.ThreadSummary`:
counts and the tail from the last assistant message on), so listing costs the same at any
thread length. But what the tail cannot show — an unanswered call before the last reply
(cubeloop continued a crashed thread), an unreadable row, a row of unknown role, a
duplicate result or another run's messages between a call and its result anywhere earlier
— must still reach the picker (issue 7: "shown as such in the picker"). So each thread is
diagnosed once from its whole stored history, and that verdict is kept until the thread
changes (its :func:`version` moves). Threads whose tail alone cannot be read right (it
holds a result of a call outside it, :func:`core.recovery.tail_is_enough`) are diagnosed
at once; the rest are refined a batch at a time, within a time budget, so a first listing
of a large store is shown at once from tails and then corrected row by row.

No widgets here; the session drives it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Hashable, Sequence

from core.checkpoint.base import Checkpointer, ThreadSummary
from core.outline import read_outline
from core.recovery import Diagnosis, tail_is_enough

REFINE_BUDGET = 0.04
"""Seconds of whole-thread loading one refinement step may take before it hands the rows
back: under DESIGN.md's 50 ms bound on answering a key press, with room for one load."""


SCAN_CHUNK = 200
"""Summaries checked between two yields to the event loop while a listing's stale threads
are found (each needs ``tail_is_enough``: 25-50 µs here, so about 5-10 ms a chunk)."""


def version(summary: ThreadSummary) -> Hashable:
    """What identifies one state of a stored thread, from its summary alone.

    Stores are append-only, so the row count and the newest activity move with every
    message; runs (claims and completions), the pending human request (with whether its
    answer is stored) and the count of undecodable tail rows cover the rest of what a
    diagnosis reads."""
    pending = summary.pending_request
    asked = None if pending is None else (pending.request_json, pending.answered)
    return (summary.message_count, summary.last_activity, summary.runs, asked, len(summary.problems))


class WholeDiagnoses:
    """The cache: thread id -> (version, diagnosis of the whole stored thread)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[Hashable, Diagnosis]] = {}
        self._refined: set[str] = set()
        self._listing: Sequence[ThreadSummary] | None = None  # the listing the queue is of
        self._queue: deque[ThreadSummary] = deque()  # its stale threads still to diagnose
        self._urgent = 0  # how many at the queue's front have a tail that is not enough

    def take_refined(self) -> set[str]:
        """The thread ids diagnosed from their whole history since the last call (their rows
        may read differently now), and forget them."""
        refined, self._refined = self._refined, set()
        return refined

    def get(self, summary: ThreadSummary) -> Diagnosis | None:
        """The whole-thread diagnosis of this version of the thread, if it was made."""
        known = self._known.get(summary.thread_id)
        return known[1] if known is not None and known[0] == version(summary) else None

    async def refine(
        self, store: Checkpointer, summaries: Sequence[ThreadSummary], *, budget: float = REFINE_BUDGET
    ) -> bool:
        """Diagnose stale threads from their whole history: every one whose tail is not
        enough, then others until ``budget`` seconds are spent (at least one). Returns whether stale ones
        remain. Raises the store's errors (``StoreBusyError``, ``DatabaseGoneError``, ...).

        The stale threads of one listing are found once, when it is first given (a pass
        over it that yields to the event loop every :data:`SCAN_CHUNK` summaries), and
        later calls with the same ``summaries`` object go on from there: at 10,000 threads
        that pass took 250-500 ms (``tail_is_enough`` of each), which every step used to
        make again before loading anything (issue 10)."""
        if summaries is not self._listing:
            self._listing = summaries
            self._queue, self._urgent = await self._scan(summaries)
        queue = self._queue
        deadline = time.monotonic() + budget
        first = True  # at least one a step, however small the budget
        while queue and (first or self._urgent > 0 or time.monotonic() < deadline):
            first = False
            summary = queue.popleft()
            self._urgent = max(self._urgent - 1, 0)
            if self.get(summary) is None:  # not diagnosed through another listing meanwhile
                await self.diagnose(store, summary)
        return bool(queue)

    async def _scan(self, summaries: Sequence[ThreadSummary]) -> tuple[deque[ThreadSummary], int]:
        """The stale summaries, those whose tail is not enough first, and how many those are;
        forgets the verdicts of threads no longer listed."""
        urgent: list[ThreadSummary] = []
        rest: list[ThreadSummary] = []
        for index, summary in enumerate(summaries, 1):
            if self.get(summary) is None:
                (rest if tail_is_enough(summary.tail) else urgent).append(summary)
            if index % SCAN_CHUNK == 0:
                await asyncio.sleep(0)
        live = {s.thread_id for s in summaries}
        for gone in [t for t in self._known if t not in live]:
            del self._known[gone]
        return deque([*urgent, *rest]), len(urgent)

    def needs_whole(self, summary: ThreadSummary) -> bool:
        """Whether this version of the thread has no whole-thread diagnosis yet and its tail
        alone cannot be read right (:func:`core.recovery.tail_is_enough`): its row should
        wait for :meth:`diagnose` rather than be shown from the tail."""
        return self.get(summary) is None and not tail_is_enough(summary.tail)

    async def diagnose(self, store: Checkpointer, summary: ThreadSummary) -> None:
        """Diagnose ``summary``'s thread from its whole stored history now (kept for this
        version). Raises the store's errors."""
        # Read as an outline (skeletons, a chunk at a time): a long thread is never held.
        found = await read_outline(store, summary.thread_id)
        if found is None:
            return  # deleted between the listing and now: the next listing drops it
        data, outline = found
        # In a worker thread: concluding on a thread of 10,000 messages can hold the CPU for
        # milliseconds, which on the event loop a key press would wait for (issue 10).
        verdict = await asyncio.to_thread(
            outline.diagnosis, data.runs, data.journal, problems=data.problems, pending=data.pending_request
        )
        self._known[summary.thread_id] = (version(summary), verdict)
        self._refined.add(summary.thread_id)
