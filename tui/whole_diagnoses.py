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

import time
from collections.abc import Hashable, Sequence

from core.checkpoint.base import Checkpointer, ThreadSummary
from core.outline import read_outline
from core.recovery import Diagnosis, tail_is_enough

REFINE_BUDGET = 0.04
"""Seconds of whole-thread loading one refinement step may take before it hands the rows
back: under DESIGN.md's 50 ms bound on answering a key press, with room for one load."""


def version(summary: ThreadSummary) -> Hashable:
    """What identifies one state of a stored thread, from its summary alone.

    Stores are append-only, so the row count and the newest activity move with every
    message; runs (claims and completions), the pending human request and the count of
    undecodable tail rows cover the rest of what a diagnosis reads."""
    pending = summary.pending_request.request_json if summary.pending_request is not None else None
    return (summary.message_count, summary.last_activity, summary.runs, pending, len(summary.problems))


class WholeDiagnoses:
    """The cache: thread id -> (version, diagnosis of the whole stored thread)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[Hashable, Diagnosis]] = {}

    def get(self, summary: ThreadSummary) -> Diagnosis | None:
        """The whole-thread diagnosis of this version of the thread, if it was made."""
        known = self._known.get(summary.thread_id)
        return known[1] if known is not None and known[0] == version(summary) else None

    def stale(self, summaries: Sequence[ThreadSummary]) -> list[ThreadSummary]:
        """The summaries without a current whole-thread diagnosis, in the given order."""
        return [s for s in summaries if self.get(s) is None]

    async def refine(
        self, store: Checkpointer, summaries: Sequence[ThreadSummary], *, budget: float = REFINE_BUDGET
    ) -> bool:
        """Diagnose stale threads from their whole history: every one whose tail is not
        enough, then others until ``budget`` seconds are spent. Returns whether stale ones
        remain. Raises the store's errors (``StoreBusyError``, ``DatabaseGoneError``, ...)."""
        stale = self.stale(summaries)
        urgent = [s for s in stale if not tail_is_enough(s.tail)]
        rest = [s for s in stale if tail_is_enough(s.tail)]
        deadline = time.monotonic() + budget
        done = 0
        for summary in [*urgent, *rest]:
            if done >= len(urgent) and time.monotonic() >= deadline:
                break
            await self._diagnose(store, summary)
            done += 1
        live = {s.thread_id for s in summaries}
        for gone in [t for t in self._known if t not in live]:
            del self._known[gone]
        return done < len(stale)

    async def _diagnose(self, store: Checkpointer, summary: ThreadSummary) -> None:
        # Read as an outline (skeletons, a chunk at a time): a long thread is never held.
        found = await read_outline(store, summary.thread_id)
        if found is None:
            return  # deleted between the listing and now: the next listing drops it
        data, outline = found
        verdict = outline.diagnosis(data.runs, data.journal, problems=data.problems, pending=data.pending_request)
        self._known[summary.thread_id] = (version(summary), verdict)
