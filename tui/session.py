"""Session: the app's runtime side, with no widgets in it.

One store, one provider, and one :class:`core.agent.Agent` per thread that has run in
this app. Screens get the session in their constructor and call it from workers; every
method that touches the store is a coroutine and never blocks the event loop itself.
Errors a user can meet come out as :class:`core.errors.CubepiError` whose text is one
sentence, ready for the screen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.agent import Agent
from core.answers import Answered, answer
from core.checkpoint.base import (
    CheckpointData,
    Checkpointer,
    Command,
    CommandKind,
    CorruptRow,
    PendingRequest,
    ThreadMeta,
    ThreadSummary,
    not_deleted_sentence,
    thread_unavailable,
)
from core.checkpoint.capabilities import (
    LIVE,
    HumanAnswers,
    LiveStore,
    OwnerScoped,
    PagedReads,
    SchemaUpgrade,
    ThreadDeletion,
    ThreadRecords,
    ToolSteps,
    lacking,
    supports,
)
from core.checkpoint.pages import MessagePage
from core.checkpoint.reconnect import StoreStatus, reconnect_notice
from core.commands import cancel, discard, edit, refuse_orphaned_aborts, send, settle, undelivered
from core.errors import CubepiError, UnreadableRequestError
from core.events import RunOutcome
from core.follow import ThreadFollower, ThreadsSnapshot, watch_threads
from core.hitl import Reply, parse_request
from core.lease_status import LeaseState, LeaseView, lease_status
from core.leases import delete_thread
from core.messages import AnyMessage
from core.outline import ThreadOutline, read_outline
from core.owners import UNOWNED
from core.recovery import DanglingCall, Diagnosis, ResumePlan, SettleChoice, ThreadState, diagnose, step_words
from core.supervisor import Supervisor
from core.tool_execution import call_job_key
from tui.attention import Alerts, AttentionWatch, answered_label, waiting_for_you, waiting_label
from tui.whole_diagnoses import WholeDiagnoses
from tui.whole_diagnoses import version as thread_version

StoreOpener = Callable[[], Awaitable[Checkpointer]]
"""Opens the database; raises ``DatabaseOpenError`` with one sentence when it cannot."""

OnStart = Callable[[Agent], None]
"""Told the thread's agent just before a run of it begins (see ``Session.prompt``)."""

SENT_AS_PROMPT = "sent as a new prompt"
"""The note on an undelivered steer or follow-up whose text became a new run's prompt."""

ProviderFactory = Callable[[], Any]
"""Builds the model provider; may raise ``MissingApiKeyError`` (then runs are disabled)."""


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


INPUT_QUIET = 0.5
"""Seconds without a key or mouse event (:meth:`Session.note_input`) before the picker's
rows are refined from whole threads again: that refinement reads thread after thread in
the store's thread (at 10,000 threads 4-7 s of one core after the first listing, 365-740 µs
a thread here by load), and a key handled meanwhile shares the GIL with it: the help key's p95 was
53-130 ms then, 17-30 ms once it was done (issue 10). Half a second: a pause in typing."""

INPUT_POLL = 0.05
"""Seconds between two looks, while the user is at work, at whether the store changed
(a new listing is shown at once) or input has gone quiet."""


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


@dataclass(frozen=True, slots=True)
class ThreadFacts:
    """What the thread view says of a thread beside its messages: whose it is, which
    workflow version and agent definition wrote it, and the overrides recorded.

    ``owner`` is :data:`core.owners.UNOWNED` for a thread that records none; ``workflow``
    ``None`` when none was given; ``changes`` what differs between the definition recorded
    and this app's agent (empty: unchanged), ``None`` when the thread recorded no
    definition yet (cubeloop's, an older one, or one never run) or no agent is configured
    here (``compared`` false) to compare it with.
    """

    owner: str
    workflow: str | None = None
    changes: tuple[str, ...] | None = None
    recorded: bool = False
    """Whether the thread records its agent's definition (fingerprints)."""
    compared: bool = False
    """Whether ``changes`` was compared with this app's agent (a provider is configured)."""
    meta: ThreadMeta | None = None
    """The thread's record as stored (its overrides among it), ``None`` when it keeps none."""


@dataclass
class Session:
    """Everything the screens drive: the store, the provider and the live agents.

    ``location`` names the database for messages ("~/.local/share/.../threads.sqlite").
    ``tools`` and ``system_prompt`` are given to every Agent; ``model`` is shown in the
    status bar. ``agent_options`` are passed to ``Agent`` as keywords (e.g. abort_grace).
    """

    open_store: StoreOpener
    make_provider: ProviderFactory
    location: str = ""
    model: str = ""
    tools: Sequence[Any] = ()
    system_prompt: str = ""
    agent_options: dict[str, Any] = field(default_factory=dict)
    store: Checkpointer | None = None
    provider: Any = None
    provider_error: str | None = None
    agents: dict[str, Agent] = field(default_factory=dict)
    supervisors: dict[str, Supervisor] = field(default_factory=dict)
    """The Supervisor of each thread run here, so other processes can follow and command it."""
    followers: set[ThreadFollower] = field(default_factory=set)
    """Followers of threads shown here (stopped before the store closes)."""
    runs: dict[str, asyncio.Task[RunOutcome]] = field(default_factory=dict)
    """The task of each run started here, by thread id. The session owns it, not the screen
    that asked: an app that ends abruptly (Textual's ``panic`` when the terminal's input
    fails) cancels every screen worker, which would cut a run off mid-tool or mid-write;
    :meth:`close` aborts these and waits until each has saved its end."""
    pending_prompts: dict[str, str] = field(default_factory=dict)
    """Prompts the user sent whose run has not begun yet (its screen is still loading the
    thread), by thread id. Should the app end first, :meth:`stop_runs` starts each one and
    aborts it, so the prompt is saved and its thread reads "aborted" rather than vanishing."""
    on_busy: Callable[[int], None] | None = None
    """Told the attempt number each time the database was locked and a call is retried."""
    on_status: Callable[[], None] | None = None
    """Told each time ``store_notice`` changed (the app redraws where it shows it)."""
    store_notice: str = ""
    """What is wrong with the connection to the store now, in a few words ("reconnecting to
    postgresql://host/db (attempt 3, next in 0.8 s)…", or the sentence of the last
    ``StoreConnectionError``); empty while it is fine."""
    ending: bool = False
    """Set by :meth:`stop_runs`: the app is ending, so no new run starts."""
    whole: WholeDiagnoses = field(default_factory=WholeDiagnoses)
    """Each listed thread's diagnosis from its whole stored history, per version (the picker's rows)."""
    alerts: Alerts = field(default_factory=Alerts)
    """Whether the bell rings and a notice shows when a thread starts waiting for an answer
    or crashes (``--no-bell``, ``--no-notices``)."""
    attention: AttentionWatch = field(default_factory=AttentionWatch)
    """Which threads were alerted about already (one alert per request or crashed run)."""
    opens_for: str | None = None
    """The owner ``open_store`` opens the store for, so the screens can name it before the
    store is open (``None``: not known until then); :attr:`owner` is the store's own word."""
    _provider_built: asyncio.Future[None] | None = field(default=None, init=False, repr=False)
    """The provider's one build (:meth:`prepare_provider`), once asked for."""
    _kept_rows: dict[str, tuple[tuple[object, ...], ThreadRow]] = field(default_factory=dict, init=False, repr=False)
    """Each listed thread's row and what it was made of (:meth:`_row_key`): kept while that holds."""
    _handed: _Handed = field(default_factory=lambda: _Handed([], {}, ()), init=False, repr=False)
    """The last rows handed out (what ``RowsUpdate.changed`` is against)."""
    input_quiet: float = INPUT_QUIET
    """Seconds after the last input (:meth:`note_input`) before whole-thread refinement goes on."""
    _input_at: float = field(default=float("-inf"), init=False, repr=False)
    """When the user last pressed a key or used the mouse (``time.monotonic``)."""

    def note_input(self) -> None:
        """The user pressed a key or used the mouse (the app says so for each input event):
        whole-thread refinement of the picker's rows (:meth:`watch_rows`) waits until
        ``input_quiet`` seconds pass without input, so that keys never share the CPU with it."""
        self._input_at = time.monotonic()

    def input_at(self) -> float:
        """When the user last pressed a key or used the mouse (``time.monotonic`` seconds;
        ``-inf`` before any input)."""
        return self._input_at

    def input_is_quiet(self) -> bool:
        """Whether ``input_quiet`` seconds passed since the last input (:meth:`note_input`)."""
        return time.monotonic() - self._input_at >= self.input_quiet

    def report_busy(self, attempt: int) -> None:
        """Pass a "database is locked, retrying" notice on to ``on_busy`` (the app shows it)."""
        if self.on_busy is not None:
            self.on_busy(attempt)

    def report_status(self, status: StoreStatus) -> None:
        """A server store's ``on_status``: keep "reconnecting …" in ``store_notice`` while a
        call waits to retry, clear it once one got through, and tell ``on_status``."""
        self.set_store_notice(reconnect_notice(self.location, status) if status.reconnecting else "")

    def set_store_notice(self, notice: str) -> None:
        """Set ``store_notice`` and tell ``on_status`` when it changed."""
        if notice == self.store_notice:
            return
        self.store_notice = notice
        if self.on_status is not None:
            self.on_status()

    async def open(self) -> None:
        """Open the store. The provider is built apart, when first needed or asked for
        (:meth:`prepare_provider`), so browsing never waits for it.

        Raises the store's ``CubepiError`` (one sentence) when the database cannot be opened.
        """
        self.store = await self.open_store()

    async def prepare_provider(self) -> None:
        """Build the provider, once (a later call waits for the first build), in a worker
        thread: importing the Anthropic SDK took 3.8-5.3 s on this 2-core machine under load
        (``python -X importtime``, issue 10), which on the event loop would freeze the app.
        A provider that cannot be built does not raise: ``provider_error`` keeps its
        sentence and runs are refused with it, while browsing still works."""
        if self._provider_built is None:
            self._provider_built = asyncio.ensure_future(self._build_provider())
        await asyncio.shield(self._provider_built)

    async def _build_provider(self) -> None:
        try:
            self.provider = await asyncio.to_thread(self.make_provider)
        except CubepiError as error:
            self.provider_error = str(error)

    @property
    def owner(self) -> str:
        """The owner whose threads this session shows: the open store's
        (:data:`core.owners.UNOWNED` for the unowned scope, and for a store that keeps no
        owners); before it opened, ``opens_for`` (``UNOWNED`` when that is not known)."""
        if self.store is not None:
            return self.store.owner if supports(self.store, OwnerScoped) else UNOWNED
        return UNOWNED if self.opens_for is None else self.opens_for

    async def unowned_count(self) -> int:
        """How many threads of the store record no owner (``--unowned`` opens them); 0 when
        this session shows those already, or the store keeps no owners. Never counts another
        named owner's threads. Raises the store's errors."""
        store = self._store()
        if self.owner == UNOWNED or not supports(store, OwnerScoped):
            return 0
        return await store.unowned_count()

    def running_count(self) -> int:
        """How many threads this app is running now (counting runs still taking their lease
        and prompts whose run is about to start)."""
        starting = {thread_id for thread_id, task in self.runs.items() if not task.done()} | set(self.pending_prompts)
        running = {thread_id for thread_id, agent in self.agents.items() if agent.state.is_running}
        return len(starting | running)

    def queued_count(self) -> int:
        """How many steers and follow-ups the agents here hold in memory only, not yet
        delivered: those of a store that keeps no commands (quitting drops them; with a
        command table they are kept in the store, :attr:`keeps_commands`, and count 0)."""
        if self.keeps_commands:
            return 0
        return sum(len(a.state.pending_steers) + len(a.state.pending_follow_ups) for a in self.agents.values())

    async def stop_runs(self, timeout: float = 8.0) -> None:
        """End every live run and wait (up to ``timeout`` seconds) until each has ended.

        A run whose call waits for a person's answer is detached (``Agent.detach``): it
        ends **waiting**, its request kept for an answer from anywhere and a later resume.
        Every other run is aborted, which ends it cleanly: its last message is saved and its
        lease released, so the thread reads "aborted" rather than "crashed" next time. This
        is asked again while waiting: a run still taking its lease or loading its thread is
        not yet running, and an abort before it runs would be a no-op (``Agent.abort``).
        """
        self.ending = True
        self._start_pending_prompts()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            live = [task for task in self.runs.values() if not task.done()]
            running = [agent for agent in self.agents.values() if agent.state.is_running]
            if not live and not running:
                return
            for agent in running:
                if not agent.detach():
                    agent.abort()
            if live:
                await asyncio.wait(live, timeout=0.05)
            else:
                await asyncio.sleep(0.05)

    def _start_pending_prompts(self) -> None:
        """Start the run of every prompt still waiting for its screen (``pending_prompts``),
        to be aborted at once; not on a browse-only store, which the user has not agreed to
        have written."""
        pending, self.pending_prompts = self.pending_prompts, {}
        # A provider not built yet is built by the run itself (``agent``); one that failed runs nothing.
        if self.store is None or self.provider_error is not None or self.needs_upgrade:
            return
        for thread_id, text in pending.items():
            task = self.runs.get(thread_id)
            if task is None or task.done():
                self._start(thread_id, self._prompt(thread_id, text, None))

    async def close(self) -> None:
        """Stop live runs and followers, then close the store (never under a run that still writes).

        A run that ignored its abort for ``stop_runs``' timeout is cancelled (its thread
        then reads "crashed", and resuming settles what it left)."""
        await self.stop_runs()
        stuck = list(self.runs.values())
        for task in stuck:
            task.cancel()
        if stuck:
            await asyncio.wait(stuck)  # their errors are theirs; this close goes on
        for follower in list(self.followers):
            await follower.stop()
        self.followers.clear()
        if self.store is not None:
            await self.store.close()

    # --- browsing -----------------------------------------------------------------------

    async def rows(self) -> list[ThreadRow]:
        """Every thread in the store, most recently active first, with its state
        (:meth:`listing`'s rows)."""
        return (await self.listing()).rows

    async def listing(self) -> RowsUpdate:
        """Every thread in the store, most recently active first, with its state, and which
        threads changed since the last rows this session handed out (:class:`RowsUpdate`).

        One read of the store (``list_threads``). A state reads from the whole stored
        thread where that has been diagnosed (see :mod:`tui.whole_diagnoses`); this call
        refines within one time budget and :meth:`watch_rows` goes on refining the rest.
        Raises the store's errors."""
        store = self._store()
        summaries = await store.list_threads()
        await self.whole.refine(store, summaries)
        now = time.time()
        views = {s.thread_id: lease_status(s.lease, s.runs, now) for s in summaries}
        return await self._update(store, summaries, views, None)

    @property
    def can_watch(self) -> bool:
        """Whether the store can be followed and commanded: it declares the capabilities of
        :data:`core.checkpoint.capabilities.LIVE` (leases, live events, commands, change notification)."""
        return self.store is not None and not lacking(self.store, LIVE)

    async def watch_rows(self) -> AsyncIterator[RowsUpdate]:
        """The thread list now, then again whenever another program (or a run here) changed
        the store or a lease's state moved (:func:`core.follow.watch_threads`), each time
        with the threads that changed (:class:`RowsUpdate`); then, a budget at a time and
        only while input is quiet (:meth:`note_input`), the rows whose state the whole
        stored thread corrects (:mod:`tui.whole_diagnoses`).

        The list is read once per change: the first update is the first listing, shown
        from the threads' tails before any whole thread is read. Only rows of threads
        the snapshot names as changed (``ThreadsSnapshot.changed``; ``None``: all), whose
        lease view moved, that run here or that were just refined are made again. Raises
        the store's errors, and ``CubepiError`` for a store without live runs (see
        :attr:`can_watch`)."""
        store = self._live()
        snapshots: asyncio.Queue[ThreadsSnapshot | BaseException] = asyncio.Queue()

        async def listen() -> None:
            try:
                async for snapshot in watch_threads(store):
                    snapshots.put_nowait(snapshot)
            except Exception as error:  # handed to the consumer, which raises it
                snapshots.put_nowait(error)

        listener = asyncio.create_task(listen())
        views: dict[str, LeaseView] = {}
        try:
            while True:
                item = await snapshots.get()
                changed = item.changed if isinstance(item, ThreadsSnapshot) else None
                while not snapshots.empty():  # only the newest listing matters, with every change named
                    item = snapshots.get_nowait()
                    if isinstance(item, ThreadsSnapshot):
                        changed = None if changed is None or item.changed is None else changed | item.changed
                if isinstance(item, BaseException):
                    raise item
                candidates = self._candidates(item, views, changed)
                views = item.views
                async for update in self._updates(store, item.threads, views, candidates):
                    yield update
                # Correct rows from whole threads, a budget at a time, until the store changes,
                # while the user is not at work (see INPUT_QUIET).
                more = True
                while more and snapshots.empty():
                    if not self.input_is_quiet():
                        await asyncio.sleep(INPUT_POLL)
                        continue
                    more = await self.whole.refine(store, item.threads)
                    refined = self.whole.take_refined()
                    update = await self._refresh(store, item.threads, views, refined | set(self.agents))
                    if update is not None:
                        yield update
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    def _candidates(
        self, snapshot: ThreadsSnapshot, before: Mapping[str, LeaseView], changed: frozenset[str] | None
    ) -> set[str] | None:
        """The threads whose row may differ from the one kept: those ``changed`` names, those
        whose lease view moved since ``before``, and those with an agent here (running
        here is this process's knowledge, not the store's). ``None`` when ``changed`` is."""
        if changed is None:
            return None
        moved = {t for t, view in snapshot.views.items() if before.get(t) != view}
        return set(changed) | moved | set(self.agents)

    async def _updates(
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

    async def _update(
        self,
        store: Checkpointer,
        summaries: Sequence[ThreadSummary],
        views: Mapping[str, LeaseView],
        candidates: set[str] | None,
    ) -> RowsUpdate:
        """:meth:`_updates`' last update: every row."""
        updates = [update async for update in self._updates(store, summaries, views, candidates)]
        return updates[-1]

    async def _refresh(
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
            update = await self._update(store, summaries, views, thread_ids)
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
        if self.whole.needs_whole(summary):
            await self.whole.diagnose(store, summary)
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
            self.is_running(summary.thread_id),
            self.whole.get(summary),
        )

    def _row(self, summary: ThreadSummary, view: LeaseView | None) -> ThreadRow:
        diagnosis = self.whole.get(summary) or diagnose(
            summary.tail, summary.runs, problems=summary.problems, pending=summary.pending_request, tail_only=True
        )
        running = self.is_running(summary.thread_id) or (view is not None and view.state is LeaseState.RUNNING_HERE)
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

    def follower(self, thread_id: str, *, window: int | None = None) -> ThreadFollower:
        """A follower of ``thread_id`` (not started); stopped by :meth:`close` at the latest.
        ``window``: hold only the newest messages, that many read first (see
        :class:`core.follow.ThreadFollower`). Raises ``CubepiError`` for a store without live
        runs (see :attr:`can_watch`)."""
        follower = ThreadFollower(self._live(), thread_id, window=window)
        self.followers.add(follower)
        return follower

    async def release(self, follower: ThreadFollower) -> None:
        """Stop ``follower`` and forget it."""
        self.followers.discard(follower)
        await follower.stop()

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """The thread's newest ``limit`` rows below row id ``before`` (``None``: its newest),
        decoded, with how many rows come before them (:class:`~core.checkpoint.pages.MessagePage`;
        empty for a missing thread). A store without paged reads is loaded whole and cut.
        Raises the store's errors."""
        store = self._store()
        if supports(store, PagedReads):
            return await store.load_page(thread_id, before=before, limit=limit)
        data = await store.load(thread_id)
        if data is None:
            return MessagePage()
        rows = _stored_rows(data)
        if before is not None:
            rows = [r for r in rows if r[0] < before]
        kept = rows[-limit:]
        return MessagePage(
            [m for _, m in kept if not isinstance(m, CorruptRow)],
            [i for i, m in kept if not isinstance(m, CorruptRow)],
            [m for _, m in kept if isinstance(m, CorruptRow)],
            len(rows) - len(kept),
        )

    async def outline(
        self, thread_id: str, *, must_exist: bool = True
    ) -> tuple[CheckpointData, ThreadOutline, Diagnosis]:
        """The thread read whole once without holding its messages: its other data (runs,
        journal, pending request; ``messages`` empty, ``problems`` every problem of the
        thread), its :class:`~core.outline.ThreadOutline` (totals, count) and its diagnosis.

        Raises ``ThreadNotFoundError`` (:meth:`unavailable`) for an id this owner has no
        thread of when ``must_exist``; otherwise such an id reads as an empty thread (a new one).
        """
        found = await read_outline(self._store(), thread_id)
        if found is None:
            if must_exist:
                raise self.unavailable(thread_id)
            found = CheckpointData(), ThreadOutline()
        data, outline = found
        diagnosis = outline.diagnosis(data.runs, data.journal, problems=data.problems, pending=data.pending_request)
        data.problems = [*outline.problems, *data.problems]
        return data, outline, diagnosis

    async def step_words(self, thread_id: str, dangling: Sequence[DanglingCall]) -> dict[str, str]:
        """Tool call id -> how far each of the ``dangling`` calls of a stepped tool got
        ("step 2 of 8 committed at 17:00:43", :func:`core.recovery.step_words`), for the
        calls that committed a step. A call's step record is found as the resume plan finds
        it (``Agent.plan_resume``): under the call's job key for this app's tool of that
        name, so a tool this app lacks (or that is not idempotent) shows none, as in the plan.
        Empty for a store that keeps no steps or is browse-only. Raises the store's errors."""
        store = self._store()
        if not dangling or not supports(store, ToolSteps) or self.needs_upgrade:
            return {}
        tools = {t.name: t for t in self.tools}
        found: dict[str, str] = {}
        for call in dangling:
            tool = tools.get(call.call.name)
            key = call_job_key(tool, call.call) if tool is not None else None
            record = await store.step_get(thread_id, key) if key is not None else None
            words = step_words(record) if record is not None else ""
            if words:
                found[call.call.id] = words
        return found

    def unavailable(self, thread_id: str) -> CubepiError:
        """The error for ``thread_id`` missing or another owner's, as this session's owner
        sees it (:func:`core.checkpoint.base.thread_unavailable`: one sentence for both)."""
        return thread_unavailable(thread_id, self.owner)

    async def facts(self, thread_id: str) -> ThreadFacts:
        """The owner, workflow version and definition state of ``thread_id`` (:class:`ThreadFacts`).

        The definition is compared with this app's agent (``Agent.definition_changes``)
        when a provider is configured; a thread running here is not reloaded for it.
        Raises the store's errors."""
        store = self._store()
        meta = await store.load_meta(thread_id) if supports(store, ThreadRecords) else None
        fingerprints = meta.fingerprints if meta is not None else None
        facts = ThreadFacts(
            owner=meta.owner if meta is not None else self.owner,
            workflow=fingerprints.workflow if fingerprints is not None else None,
            recorded=fingerprints is not None,
            meta=meta,
        )
        if fingerprints is not None:
            await self.prepare_provider()
        if fingerprints is None or self.provider is None:
            return facts
        agent = self.agents.get(thread_id)
        if agent is None:
            # Comparing reads only the thread's record: no load needed (agent() loads it before a run).
            agent = self.agents[thread_id] = self._new_agent(thread_id)
        return replace(facts, changes=tuple(await agent.definition_changes()), compared=True)

    async def delete(self, thread_id: str) -> None:
        """Delete ``thread_id`` and everything stored for it (:func:`core.leases.delete_thread`).

        Raises ``CubepiError`` (one sentence, :func:`core.checkpoint.base.not_deleted_sentence`)
        while this app runs it or the app is ending, and the store's errors:
        ``ThreadNotFoundError`` for a thread missing or another owner's,
        ``RunAlreadyClaimedError`` (the same sentence's form for another process) while
        another process's run holds its lease, ``ReadOnlyStoreError`` on a browse-only store."""
        store = self._store()
        if self.is_running(thread_id) or thread_id in self.pending_prompts or thread_id in self.runs:
            raise CubepiError(not_deleted_sentence(thread_id, here=True))
        if not supports(store, ThreadDeletion):
            raise CubepiError(f"{self.location or 'This database'} cannot delete threads.")
        await delete_thread(store, thread_id)
        self.agents.pop(thread_id, None)
        self.supervisors.pop(thread_id, None)

    def is_running(self, thread_id: str) -> bool:
        """Whether an agent of this app is running ``thread_id`` now."""
        agent = self.agents.get(thread_id)
        return agent is not None and agent.state.is_running

    @property
    def needs_upgrade(self) -> bool:
        """Whether the store is browse-only until the user agrees to upgrade it."""
        return supports(self.store, SchemaUpgrade) and bool(self.store.needs_upgrade)

    async def upgrade(self) -> None:
        """Upgrade a browse-only store (after the user agreed)."""
        if supports(self.store, SchemaUpgrade):
            await self.store.upgrade()

    @property
    def upgrade_explanation(self) -> str:
        """What upgrading this store does, ending with the question (the store's own words:
        ``SchemaUpgrade.upgrade_explanation``); empty for a store that is never upgraded."""
        return self.store.upgrade_explanation if supports(self.store, SchemaUpgrade) else ""

    # --- running ------------------------------------------------------------------------

    async def agent(self, thread_id: str) -> Agent:
        """The agent of ``thread_id``, created and loaded on first use.

        Raises ``CubepiError`` with ``provider_error`` when no provider could be built.
        """
        agent = self.agents.get(thread_id)
        if agent is not None:
            if not agent.state.is_running:
                await agent.load()  # another process may have written since
            return agent
        await self.prepare_provider()
        agent = self._new_agent(thread_id)
        await agent.load()
        self.agents[thread_id] = agent
        return agent

    def _new_agent(self, thread_id: str) -> Agent:
        """A new agent of ``thread_id`` (not loaded). Raises ``CubepiError`` with
        ``provider_error`` when no provider could be built."""
        if self.provider is None:
            raise CubepiError(self.provider_error or "No model provider is configured.")
        return Agent(
            self.provider,
            self._store(),
            thread_id,
            tools=tuple(self.tools),
            system_prompt=self.system_prompt,
            **self.agent_options,
        )

    async def supervisor(self, thread_id: str) -> Supervisor | None:
        """The Supervisor that runs ``thread_id`` here, so other processes can follow and
        command the run; ``None`` for a store that keeps no live events (the agent runs alone)."""
        agent = await self.agent(thread_id)
        sup = self.supervisors.get(thread_id)
        if sup is None and self.can_watch:
            try:
                sup = self.supervisors[thread_id] = Supervisor(agent, self._live())
            except TypeError:
                return None
        return sup

    async def prompt(
        self,
        thread_id: str,
        text: str,
        *,
        on_start: OnStart | None = None,
        accept_changes: bool = False,
        include_pending: bool = False,
    ) -> RunOutcome:
        """Run ``thread_id`` on the prompt ``text`` (supervised when the store allows); see ``Agent.prompt``.

        ``on_start(agent)`` is called once the agent is loaded, just before the run begins
        (screens subscribe to its events there). The run is the session's (see ``runs``).
        Raises ``CubepiError`` once the app is ending (``ending``), and
        ``FingerprintMismatchError`` (nothing ran) when the thread was written by another
        definition of the agent, unless ``accept_changes`` (then the override is recorded).
        ``include_pending``: the thread's undelivered steers and follow-ups go with the run."""
        self.pending_prompts.pop(thread_id, None)
        if self.ending:
            raise CubepiError("cubepi-tui is quitting, so no new run was started.")
        return await self._owned(thread_id, self._prompt(thread_id, text, on_start, accept_changes, include_pending))

    async def _prompt(
        self,
        thread_id: str,
        text: str,
        on_start: OnStart | None,
        accept_changes: bool = False,
        include_pending: bool = False,
    ) -> RunOutcome:
        agent, sup = await self._begin(thread_id, on_start)
        if sup is not None:
            return await sup.prompt(text, accept_changes=accept_changes, include_pending=include_pending)
        return await agent.prompt(text, accept_changes=accept_changes)

    async def _begin(self, thread_id: str, on_start: OnStart | None) -> tuple[Agent, Supervisor | None]:
        """The thread's agent (loaded) and Supervisor, after telling ``on_start``."""
        sup = await self.supervisor(thread_id)
        agent = self.agents[thread_id]
        if on_start is not None:
            on_start(agent)
        return agent, sup

    async def _owned(self, thread_id: str, run: Coroutine[Any, Any, RunOutcome]) -> RunOutcome:
        """Run ``run`` in a task of the session's own (see ``runs``) and return its outcome.

        Cancelling the caller leaves the run going; :meth:`stop_runs` ends it. Raises what
        ``run`` raises."""
        return await asyncio.shield(self._start(thread_id, run))

    def _start(self, thread_id: str, run: Coroutine[Any, Any, RunOutcome]) -> asyncio.Task[RunOutcome]:
        """Start ``run`` as the session's task for ``thread_id`` (kept in ``runs`` until it ends)."""
        task = asyncio.create_task(run, name=f"run of thread {thread_id}")
        self.runs[thread_id] = task

        def forget(done: asyncio.Task[RunOutcome]) -> None:
            if self.runs.get(thread_id) is done:
                del self.runs[thread_id]
            if not done.cancelled():
                done.exception()  # retrieved: a caller cancelled meanwhile never will

        task.add_done_callback(forget)
        return task

    async def plan_resume(self, thread_id: str) -> tuple[ResumePlan, list[Command]]:
        """What resuming ``thread_id`` would do, and the steers and follow-ups its crashed
        runner never delivered (empty while a run holds the thread). Raises ``CubepiError``."""
        agent = await self.agent(thread_id)
        plan = await agent.plan_resume()
        pending = await undelivered(self._live(), thread_id) if self.can_watch else []
        return plan, pending

    async def resume(
        self,
        thread_id: str,
        choices: Mapping[str, SettleChoice] | None = None,
        *,
        send_pending: bool = False,
        discard_seqs: Sequence[int] = (),
        on_start: OnStart | None = None,
        accept_changes: bool = False,
    ) -> RunOutcome:
        """Resume the crashed ``thread_id`` with the user's ``choices`` for dangling calls.

        Undelivered steers and follow-ups in ``discard_seqs`` are discarded first; with
        ``send_pending`` the others are delivered with the resumed run. ``on_start`` and
        ``accept_changes`` are as for :meth:`prompt`. Raises what ``Agent.resume`` raises
        (one sentence each; ``FingerprintMismatchError`` too), ``ThreadNotFoundError``
        (:meth:`unavailable`) for a thread missing or another owner's, and ``CubepiError``
        once the app is ending.
        """
        if self.ending:
            raise CubepiError("cubepi-tui is quitting, so the resume was not started.")
        if await self._store().load(thread_id) is None:
            # Said before any write (a lease would record the thread), as the runner does.
            raise self.unavailable(thread_id)
        return await self._owned(
            thread_id, self._resume(thread_id, choices, send_pending, discard_seqs, on_start, accept_changes)
        )

    async def _resume(
        self,
        thread_id: str,
        choices: Mapping[str, SettleChoice] | None,
        send_pending: bool,
        discard_seqs: Sequence[int],
        on_start: OnStart | None,
        accept_changes: bool,
    ) -> RunOutcome:
        for seq in discard_seqs:
            with contextlib.suppress(KeyError):  # delivered or discarded meanwhile: nothing to do
                await discard(self._live(), thread_id, [seq])
        agent, sup = await self._begin(thread_id, on_start)
        if sup is not None:
            return await sup.resume(choices, include_pending=send_pending, accept_changes=accept_changes)
        return await agent.resume(choices, accept_changes=accept_changes)

    # --- answering a pending human request -------------------------------------------------

    async def answer(self, thread_id: str, reply: Reply, *, question_id: str) -> Answered:
        """Record ``reply`` as the one answer to ``question_id``, the pending request of
        ``thread_id`` (:func:`core.answers.answer`), and return what was recorded; the run
        that asked applies it, in any process. Raises ``StaleAnswerError`` (the request was
        settled or changed), ``AlreadyAnsweredError`` (someone answered first; the sentence
        shows that answer), ``NotWaitingError``, ``AnswerMismatchError``,
        ``ReadOnlyStoreError`` on a browse-only store, ``CubepiError`` for a store that keeps
        no answers, and the store's errors, one sentence each; nothing is written then."""
        store = self._store()
        if not supports(store, HumanAnswers):
            raise CubepiError(f"{self.location or 'This database'} keeps no answers to human requests.")
        return await answer(store, thread_id, reply, question_id=question_id)

    async def stored_answer(self, thread_id: str, pending: PendingRequest) -> str | None:
        """The answer JSON stored for ``pending`` (recorded, not yet applied by its run),
        ``None`` when there is none, the store keeps no answers or the request cannot be
        read. Raises the store's errors."""
        store = self._store()
        if not supports(store, HumanAnswers):
            return None
        try:
            request = parse_request(pending.request_json)
        except UnreadableRequestError:
            return None
        return await store.load_answer(thread_id, pending.run_id, request.question_id)

    async def refuse_orphaned_aborts(self, thread_id: str) -> list[Command]:
        """Refuse the aborts a dead runner never took (:func:`core.commands.refuse_orphaned_aborts`);
        ``[]`` on a browse-only store, which is never written. Raises the store's errors."""
        if not self.can_watch or self.needs_upgrade:
            return []
        return await refuse_orphaned_aborts(self._live(), thread_id)

    async def send(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """Queue a command for the run of ``thread_id``, here (the app's own Supervisor takes it)
        or in another process (:func:`core.commands.send`).

        Raises ``ThreadCrashedError`` / ``ThreadNotRunningError`` / ``CommandError`` (one sentence each),
        ``CubepiError`` for a store without live runs (see :attr:`can_watch`).
        """
        return await send(self._live(), thread_id, kind, text)

    @property
    def keeps_commands(self) -> bool:
        """Whether steers and follow-ups go through the store's command table (durable: kept
        across a quit or a crash, editable until delivered) rather than only this process's
        memory (a store that keeps no commands: a quit drops them)."""
        return self.can_watch and not self.needs_upgrade

    async def commands(self, thread_id: str) -> list[Command]:
        """Every command of ``thread_id`` in send order (``[]`` for a store that keeps none).
        Raises the store's errors."""
        return await self._live().list_commands(thread_id) if self.can_watch else []

    async def edit_command(self, command: Command, text: str) -> Command:
        """:func:`core.commands.edit`: ``CommandRaced`` when its runner got there first."""
        return await edit(self._live(), command, text)

    async def cancel_command(self, command: Command) -> Command:
        """:func:`core.commands.cancel`: ``CommandRaced`` when its runner got there first."""
        return await cancel(self._live(), command)

    async def undelivered(self, thread_id: str) -> list[Command]:
        """:func:`core.commands.undelivered` (``[]`` for a store that keeps no commands)."""
        return await undelivered(self._live(), thread_id) if self.keeps_commands else []

    async def send_undelivered(
        self, thread_id: str, first: Command, *, on_start: OnStart | None = None, accept_changes: bool = False
    ) -> RunOutcome:
        """Send the steers and follow-ups a run ended without delivering (an abort, a provider
        error, the last turn over) as a new run: ``first`` (one of :meth:`undelivered`) is
        marked discarded ("sent as a new prompt") and its text is the run's prompt; the
        others go with it (``Supervisor.prompt(include_pending=True)``: steers first,
        follow-ups after). Called again for the same ``first`` (a retry, e.g. after the
        agent's changed definition was accepted) it only runs the prompt. Raises what
        :meth:`prompt` raises."""
        await settle(self._live(), first.seq, "discarded", SENT_AS_PROMPT)  # None: a retry, done already
        return await self.prompt(
            thread_id, first.text, on_start=on_start, accept_changes=accept_changes, include_pending=True
        )

    def _store(self) -> Checkpointer:
        if self.store is None:
            raise CubepiError("The database is not open.")
        return self.store

    def _live(self) -> LiveStore:
        """The store, for following and commanding runs; raises ``CubepiError`` when it is
        not open or keeps no live runs (see :attr:`can_watch`; the screens ask first)."""
        store = self._store()
        if not self.can_watch:
            raise CubepiError(
                f"{self.location or 'This database'} keeps no leases, live events or commands, "
                "so its runs cannot be followed or commanded."
            )
        return store  # type: ignore[return-value]  # checked part by part by can_watch


def _stored_rows(data: CheckpointData) -> list[tuple[Any, AnyMessage | CorruptRow]]:
    """``(row id, message or undecodable row)`` of a whole load, in row order (a problem that
    is not a row, such as an unreadable extra, is left out)."""
    rows: list[tuple[Any, AnyMessage | CorruptRow]] = list(zip(data.message_ids, data.messages, strict=False))
    rows += [(p.row_id, p) for p in data.problems if isinstance(p.row_id, int)]
    rows.sort(key=lambda r: r[0])
    return rows
