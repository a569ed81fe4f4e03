"""The picker's rows: each listed thread's row, made again only when what it is made of
changed, and which rows changed since the last ones handed out.

No widgets and no store of its own: :class:`tui.session.Session` hands it the store's
listings (``list_threads``, :func:`core.follow.watch_threads`) and says which threads
run here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.checkpoint.base import Checkpointer, ThreadSummary
from core.follow import ThreadsSnapshot
from core.lease_status import LeaseState, LeaseView
from core.recovery import Diagnosis, ThreadState, diagnose
from tui.attention import answered_label, waiting_for_you, waiting_label
from tui.whole_diagnoses import WholeDiagnoses
from tui.whole_diagnoses import version as thread_version


def state_label(diagnosis: Diagnosis, view: LeaseView | None, *, running: bool) -> str:
    """A picker row's state: "running here"; a run elsewhere's lease label naming its host
    ("running on box (pid 42, beat 1 s ago)"); a crash's point, then the host it died on
    when its lease says so ("crashed at point 3 (mid-tool) on box (lease expired 40 s ago)");
    else the diagnosis label. A thread waiting for an answer reads "waiting for you: QUESTION"
    whoever holds its run (it waits on the person: :mod:`tui.attention`); one whose answer
    is stored and that nobody runs, "answered — resume to apply: QUESTION". Host, notes and
    question come from the store: show the text literally."""
    if waiting_for_you(diagnosis):
        return waiting_label(diagnosis)
    if running:
        return "running here"
    if view is not None and view.state is LeaseState.RUNNING_ELSEWHERE:
        return view.label
    if view is not None and view.state is LeaseState.CRASHED and diagnosis.state is ThreadState.CRASHED:
        return f"{diagnosis.label} {view.crash_place}"
    return answered_label(diagnosis)


@dataclass(frozen=True, slots=True)
class ThreadRow:
    """One line of the picker: a thread's id, state, size, last activity and first prompt."""

    thread_id: str
    state: str
    message_count: int
    last_activity: float | None
    first_prompt: str
    diagnosis: Diagnosis
    running: bool = False
    """Whether an agent of this app runs it now."""
    problems: int = 0
    """Undecodable rows in the thread's tail."""
    elsewhere: bool = False
    """Whether another process holds a live lease on it (it runs there)."""
    lease: LeaseView | None = None
    """What the thread's lease says (running here / elsewhere / crashed), when it has one;
    ``state`` is its label when it names the thread's state (a run elsewhere, a crash)."""


FIRST_ROWS_BUDGET = 0.05
"""Seconds a first listing may spend making rows before the ones made are shown: the top of a
10,000-thread list paints at once and the rest follow (about 0.5-0.9 s more here)."""

FIRST_ROWS = 200
"""Rows of a first listing shown as soon as they are made, before :data:`FIRST_ROWS_BUDGET`
is spent: more than a terminal shows at once, made in about 12 ms (60 µs a row here), so
the start does not wait the whole budget for rows nobody sees yet."""

FIRST_PAINT_PAUSE = 0.05
"""Seconds the rest of a first listing waits once its first rows are handed out, so that the
screen paints them first: each of the few steps from rows to frame (message, table, header,
frame) otherwise waited for a slice of row-making, and the first rows reached the screen
85 ms after they were handed out instead of 8-42 ms (stamped in the app, 10,000 threads)."""

ROWS_SLICE = 0.01
"""Seconds of making rows between two yields to the event loop: diagnosing a tail takes
50-70 µs here (issue 10), 10,000 of them half a second, which no key press should wait for."""


@dataclass(frozen=True, slots=True)
class _Handed:
    """The last rows handed out: in order, each thread's index among them, and the listing
    they were made of (its summaries, same order; a first part of it while the rest is made)."""

    rows: list[ThreadRow]
    index: dict[str, int]
    summaries: Sequence[ThreadSummary]


@dataclass(frozen=True, slots=True)
class RowsUpdate:
    """One thread list for the picker: ``rows``, most recently active first, and ``changed``,
    the threads whose row differs from the previous update this session handed out (added,
    changed or gone; the rows of the others are the same objects). ``None``: treat every
    row as changed."""

    rows: list[ThreadRow]
    changed: frozenset[str] | None = None
    listed: int | None = None
    """How many threads the store listed: more than ``len(rows)`` while the first rows of a
    large first listing are shown before the rest are made; ``None``: ``len(rows)``."""


class PickerRows:
    """The rows of the picker, kept between listings.

    ``whole`` holds the threads' whole-history diagnoses (a row reads from one when made);
    ``is_running(thread_id)`` says whether an agent of this app runs the thread now.
    """

    def __init__(self, whole: WholeDiagnoses, is_running: Callable[[str], bool]) -> None:
        self._whole = whole
        self._is_running = is_running
        # Each listed thread's row and what it was made of (_row_key): kept while that holds.
        self._kept_rows: dict[str, tuple[tuple[object, ...], ThreadRow]] = {}
        # The last rows handed out (what ``RowsUpdate.changed`` is against).
        self._handed = _Handed([], {}, ())

    @staticmethod
    def candidates(
        snapshot: ThreadsSnapshot,
        before: Mapping[str, LeaseView],
        changed: frozenset[str] | None,
        here: Iterable[str],
    ) -> set[str] | None:
        """The threads whose row may differ from the one kept: those ``changed`` names, those
        whose lease view moved since ``before``, and those of ``here`` (the threads with an
        agent in this app: running here is this process's knowledge, not the store's).
        ``None`` when ``changed`` is."""
        if changed is None:
            return None
        moved = {t for t, view in snapshot.views.items() if before.get(t) != view}
        return set(changed) | moved | set(here)

    async def updates(
        self,
        store: Checkpointer,
        summaries: Sequence[ThreadSummary],
        views: Mapping[str, LeaseView],
        candidates: set[str] | None,
    ) -> AsyncIterator[RowsUpdate]:
        """The rows of ``summaries``, made again only for ``candidates`` (``None``: each is
        checked against what it showed) and the threads not seen before, with the threads
        whose row differs from the last rows handed out (added, changed or gone). A row
        whose tail cannot be read right alone is made after its whole thread is diagnosed
        (``WholeDiagnoses.needs_whole``), so no row is ever shown from a misleading tail.

        Yields once; a first listing that takes longer than :data:`FIRST_ROWS_BUDGET`, or
        more than :data:`FIRST_ROWS` rows, to turn into rows yields the rows made by then
        first (the top of the list, what the screen shows first), then all of them."""
        first = not self._handed.rows
        deadline = time.monotonic() + FIRST_ROWS_BUDGET
        pause = time.monotonic() + ROWS_SLICE
        rows: list[ThreadRow] = []
        kept = self._kept_rows
        for summary in summaries:
            hit = kept.get(summary.thread_id)
            if hit is not None and candidates is not None and summary.thread_id not in candidates:
                rows.append(hit[1])
                continue
            rows.append(await self._row_for(store, summary, views.get(summary.thread_id), hit))
            if first and len(rows) < len(summaries) and (len(rows) >= FIRST_ROWS or time.monotonic() >= deadline):
                first = False
                yield self._hand_out(list(rows), summaries)
                await asyncio.sleep(FIRST_PAINT_PAUSE)
                pause = time.monotonic() + ROWS_SLICE
            elif time.monotonic() >= pause:
                await asyncio.sleep(0)  # a key press waits for one slice at most, not 10,000 rows
                pause = time.monotonic() + ROWS_SLICE
        yield self._hand_out(rows, summaries)

    async def update(
        self,
        store: Checkpointer,
        summaries: Sequence[ThreadSummary],
        views: Mapping[str, LeaseView],
        candidates: set[str] | None,
    ) -> RowsUpdate:
        """:meth:`updates`' last update: every row."""
        updates = [update async for update in self.updates(store, summaries, views, candidates)]
        return updates[-1]

    async def refresh(
        self,
        store: Checkpointer,
        summaries: Sequence[ThreadSummary],
        views: Mapping[str, LeaseView],
        thread_ids: set[str],
    ) -> RowsUpdate | None:
        """The last rows handed out with those of ``thread_ids`` made again (the listing
        ``summaries`` unchanged, its rows refined): work for those threads only, not for
        the whole list. ``None`` when no row differs."""
        handed = self._handed
        if handed.summaries is not summaries or len(handed.rows) != len(summaries):
            update = await self.update(store, summaries, views, thread_ids)
            return update if update.changed else None
        rows = list(handed.rows)
        changed: set[str] = set()
        for thread_id in thread_ids:
            index = handed.index.get(thread_id)
            if index is None:
                continue
            summary = summaries[index]
            row = await self._row_for(store, summary, views.get(thread_id), self._kept_rows.get(thread_id))
            if row is not rows[index]:
                rows[index] = row
                changed.add(thread_id)
        if not changed:
            return None
        self._handed = _Handed(rows, handed.index, summaries)
        return RowsUpdate(rows, frozenset(changed), len(summaries))

    async def _row_for(
        self,
        store: Checkpointer,
        summary: ThreadSummary,
        view: LeaseView | None,
        hit: tuple[tuple[object, ...], ThreadRow] | None,
    ) -> ThreadRow:
        """The thread's row: the one kept (``hit``) while what it is made of holds, else a
        new one. A row whose tail cannot be read right alone is made after its whole thread
        is diagnosed (``WholeDiagnoses.needs_whole``), so no row is shown from a misleading
        tail. Raises the store's errors."""
        key = self._row_key(summary, view)
        if hit is not None and hit[0] == key:
            return hit[1]
        if self._whole.needs_whole(summary):
            await self._whole.diagnose(store, summary)
            key = self._row_key(summary, view)
        row = self._row(summary, view)
        if hit is not None and hit[1] == row:
            row = hit[1]  # the same row (a whole thread that reads as its tail): not a change
        self._kept_rows[summary.thread_id] = (key, row)
        return row

    def _hand_out(self, rows: list[ThreadRow], summaries: Sequence[ThreadSummary]) -> RowsUpdate:
        """``rows`` (of ``summaries``, or their first part) as the update handed out now,
        naming what differs from the last one handed out."""
        before = self._handed
        index = {row.thread_id: i for i, row in enumerate(rows)}
        gone = before.index.keys() - index.keys()
        if len(rows) == len(summaries):  # a first part of a listing leaves out rows still to be made, not gone
            for thread_id in gone:
                self._kept_rows.pop(thread_id, None)
        old = before.rows
        moved = {row.thread_id for row in rows if (at := before.index.get(row.thread_id)) is None or old[at] is not row}
        self._handed = _Handed(rows, index, summaries)
        return RowsUpdate(rows, frozenset(moved | gone), len(summaries))

    def _row_key(self, summary: ThreadSummary, view: LeaseView | None) -> tuple[object, ...]:
        """What a thread's row is made of: its stored version, first prompt, lease view,
        whether it runs here and its whole-thread diagnosis (if made)."""
        return (
            thread_version(summary),
            summary.first_prompt,
            view,
            self._is_running(summary.thread_id),
            self._whole.get(summary),
        )

    def _row(self, summary: ThreadSummary, view: LeaseView | None) -> ThreadRow:
        diagnosis = self._whole.get(summary) or diagnose(
            summary.tail, summary.runs, problems=summary.problems, pending=summary.pending_request, tail_only=True
        )
        running = self._is_running(summary.thread_id) or (view is not None and view.state is LeaseState.RUNNING_HERE)
        elsewhere = not running and view is not None and view.state is LeaseState.RUNNING_ELSEWHERE
        return ThreadRow(
            thread_id=summary.thread_id,
            state=state_label(diagnosis, view, running=running),
            message_count=summary.message_count,
            last_activity=summary.last_activity,
            first_prompt=summary.first_prompt,
            diagnosis=diagnosis,
            running=running,
            problems=len(summary.problems),
            elsewhere=elsewhere,
            lease=view if view is not None and view.lease is not None else None,
        )
