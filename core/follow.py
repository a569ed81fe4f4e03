"""Following a thread that another process runs: its history, plus what is streaming now.

:class:`ThreadFollower` keeps a :class:`ThreadModel` of one thread up to date while a
runner (a :class:`~core.supervisor.Supervisor`, in any process) writes it:

* ``messages``: the persisted messages, the record, loaded from the store;
* ``partial`` / ``running_tools`` / ``retry``: the reply streaming now, the tools running
  now and the model call's retry wait, rebuilt from the live-event log written after the
  last persisted message;
* ``lease_view``: running here / elsewhere / crashed (:func:`core.lease_status.lease_status`);
* ``commands``: the thread's commands not settled yet (pending or delivered).

Every message appears exactly once: the live events name the index each message will
have in the thread, so a partial whose index is already loaded is dropped, and the
persisted message replaces it in the same change. Attaching later (or again) loads the
history first, then folds the live events after it.

A follower given a ``window`` (on a store with paged reads) holds only the thread's newest
messages: :meth:`ThreadFollower.start` reads one page of them and returns at once (what a
view paints first), then the follower reads the whole thread once into a
:class:`~core.outline.ThreadOutline` - the diagnosis, the totals, the count - and reports
that as an ``outlined`` change before it folds any live event; every message it reads
later goes into the outline too. Earlier history is the view's to page in from the store.

It learns of changes from the store (:class:`core.changes.StoreWatch`: its change
signals as the trigger, ``change_token`` to skip wakeups that changed nothing). Messages are
reloaded only when the live events say one was persisted (or a run started or ended, or
the lease changed hands); a change nothing explains (a writer without live events, such
as cubeloop) reloads at most once a second. When the lease expires the model turns
crashed without any write, on a timer.

:func:`watch_threads` is the picker's counterpart: the thread list, again whenever it
changed (read again only where it did, on a store with thread versions) or a lease's state did.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from core.changes import StoreWatch
from core.checkpoint.base import (
    CheckpointData,
    Command,
    CorruptRow,
    JournalEntry,
    Lease,
    PendingRequest,
    RunRecord,
    ThreadSummary,
)
from core.checkpoint.capabilities import (
    IncrementalReads,
    ListingVersions,
    LiveStore,
    PagedReads,
    ThreadVersions,
    WatchedStore,
    supports,
)
from core.checkpoint.listing import changed_threads, merge_listing
from core.lease_status import LeaseState, LeaseView, lease_status
from core.live import LiveFold, LiveRetry, LiveTool, PartialDelta, answered_ids
from core.messages import AnyMessage, AssistantMessage
from core.outline import ThreadOutline, read_outline
from core.recovery import Diagnosis, diagnose

_log = logging.getLogger(__name__)
_OPEN = ("pending", "delivered")
"""Command statuses that may still change (see ``core.checkpoint.base.Command``)."""

__all__ = [
    "LiveRetry",
    "LiveTool",
    "PartialDelta",
    "ThreadChange",
    "ThreadFollower",
    "ThreadModel",
    "ThreadsSnapshot",
    "watch_threads",
]


@dataclass(slots=True)
class ThreadModel:
    """What a follower knows of one thread; read it, never change it.

    ``messages`` (with their store ids ``message_ids``), ``runs``, ``problems`` and
    ``journal`` are as loaded. ``partial`` is the assistant reply streaming now (never a
    persisted message; ``partial_index`` is the index it will take, always
    ``>= len(messages)``); ``running_tools`` maps tool call id -> :class:`LiveTool`;
    ``retry`` is the model call's retry wait going on now (:class:`LiveRetry`, or ``None``).
    ``lease``/``lease_view`` say who runs the thread; ``commands`` are its pending and
    delivered commands in ``seq`` order. ``run_id`` is the run the live events last
    named; ``last_end`` the last ``agent_end`` seen (``run_id``, ``outcome``, ``error``).
    ``error`` is the last store error met while following (``None`` once reads work).
    ``version`` grows by one per change.

    A windowed follower's model (see the module docstring) holds only the newest messages:
    ``offset`` messages of the thread come before ``messages[0]`` and ``earlier`` rows are
    stored before the first row held (as its first page said); ``problems`` holds the
    undecodable rows among those held and what is not a row (an unreadable extra), and
    ``outline`` (``None`` until read) is the whole thread's, which :meth:`diagnosis` reads.
    """

    thread_id: str
    messages: list[AnyMessage] = field(default_factory=list)
    message_ids: list[Any] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    problems: list[CorruptRow] = field(default_factory=list)
    journal: dict[str, JournalEntry] | None = None
    pending_request: PendingRequest | None = None
    partial: AssistantMessage | None = None
    partial_index: int | None = None
    running_tools: dict[str, LiveTool] = field(default_factory=dict)
    retry: LiveRetry | None = None
    lease: Lease | None = None
    lease_view: LeaseView = field(default_factory=lambda: LeaseView(LeaseState.NONE))
    commands: list[Command] = field(default_factory=list)
    run_id: str | None = None
    last_end: dict[str, Any] | None = None
    error: str | None = None
    version: int = 0
    offset: int = 0
    earlier: int = 0
    outline: ThreadOutline | None = None
    windowed: bool = False

    @property
    def ready(self) -> bool:
        """Whether the model knows the whole thread: always, unless it is a windowed
        follower's whose outline is not read yet (its :meth:`diagnosis` would then be of the
        rows held only)."""
        return not self.windowed or self.outline is not None

    @property
    def first_row_id(self) -> Any | None:
        """The lowest row id held (a message's or an undecodable row's), ``None`` if none."""
        ids = self.message_ids[:1] + [p.row_id for p in self.problems if isinstance(p.row_id, int)][:1]
        return min(ids) if ids else None

    @property
    def count(self) -> int:
        """How many messages the thread has as read (those held and those before them)."""
        return self.offset + len(self.messages)

    @property
    def thread_problems(self) -> list[CorruptRow]:
        """Every problem of the whole thread as read: all its undecodable rows (held or not)
        and what is not a row."""
        if self.outline is None:
            return list(self.problems)
        return [*self.outline.problems, *(p for p in self.problems if not isinstance(p.row_id, int))]

    def diagnosis(self) -> Diagnosis:
        """Where the persisted thread stands (:func:`core.recovery.diagnose` of the whole
        thread: from its outline when the model holds only its newest messages)."""
        if self.outline is not None:
            others = [p for p in self.problems if not isinstance(p.row_id, int)]
            return self.outline.diagnosis(self.runs, self.journal, problems=others, pending=self.pending_request)
        return diagnose(self.messages, self.runs, self.journal, problems=self.problems, pending=self.pending_request)


@dataclass(frozen=True, slots=True)
class ThreadChange:
    """One update of a :class:`ThreadModel` (``model`` is the live model, not a copy).

    ``reset``: the messages were replaced as a whole (the first load, or history that
    changed under us): clear the transcript, then show ``added``, which then holds every
    message. Otherwise ``added`` holds the persisted messages new since the last change,
    in order. ``partial_reset``: the streaming reply began, ended or was replaced: show
    ``model.partial`` afresh (``deltas`` is then empty); otherwise ``deltas`` is the
    text appended to it, in order. ``tools``: ``running_tools`` changed. ``retry``:
    ``model.retry`` began, changed or ended. ``lease``: the
    lease record or its state changed. ``commands``: commands whose status changed
    (including ones that just became applied, refused or discarded). ``runs``: run
    records changed. ``ended``: an ``agent_end`` was seen (``run_id``, ``outcome``, ``error``).
    ``outlined``: a windowed follower read the whole thread's outline (``model.outline``;
    :meth:`ThreadModel.diagnosis` and the totals are the whole thread's from now on).
    ``pending``: ``model.pending_request`` changed (a run asked a person, or its request
    was settled), which no message, run or lease change may come with.
    """

    model: ThreadModel
    reset: bool = False
    added: tuple[AnyMessage, ...] = ()
    partial_reset: bool = False
    deltas: tuple[PartialDelta, ...] = ()
    tools: bool = False
    retry: bool = False
    lease: bool = False
    commands: tuple[Command, ...] = ()
    runs: bool = False
    ended: dict[str, Any] | None = None
    outlined: bool = False
    pending: bool = False

    @property
    def empty(self) -> bool:
        """Whether nothing changed."""
        return not (
            self.outlined
            or self.reset
            or self.added
            or self.partial_reset
            or self.deltas
            or self.tools
            or self.retry
            or self.lease
            or self.commands
            or self.runs
            or self.ended
            or self.pending
        )


Subscriber = Callable[[ThreadChange], Any | None]
"""A change callback: called with each :class:`ThreadChange`, in order; may be sync or async."""


class ThreadFollower:
    """Follow ``thread_id`` in ``store`` as other processes write it; see the module docstring.

    ``store`` keeps leases, live events and commands (a ``LiveStore``; a store without
    ``IncrementalReads`` is reloaded whole). ``signals`` whether the store's change
    signals wake the follower (see :class:`core.changes.StoreWatch`); ``step_ms`` is
    their quiet period (10 ms: a SQLite change shows within ~20 ms of its commit);
    ``poll`` the fallback check in seconds (default 1.0 with signals, 0.05 without);
    ``reload_interval`` the seconds between reloads for changes the live events do not
    explain, ``max_stale`` the seconds after which any change reloads. ``window``: hold
    only the newest messages, that many read at first (a store without
    :class:`~core.checkpoint.capabilities.PagedReads` is read whole as without it).

    Use ``async with ThreadFollower(...) as follower`` (or :meth:`start`/:meth:`stop`),
    then read ``follower.model`` and either :meth:`subscribe` or iterate :meth:`changes`.
    Errors of the store while following are logged and kept in ``model.error``; the
    follower retries on the next change or poll. :meth:`start` raises the store's errors.
    """

    def __init__(
        self,
        store: LiveStore,
        thread_id: str,
        *,
        signals: bool = True,
        step_ms: int = 10,
        poll: float | None = None,
        reload_interval: float = 1.0,
        max_stale: float = 5.0,
        window: int | None = None,
    ) -> None:
        self.store = store
        self.window = window if window is not None and supports(store, PagedReads) else None
        self.thread_id = thread_id
        self.signals = signals
        self.step_ms = step_ms
        self.poll = poll
        self.reload_interval = reload_interval
        self.max_stale = max_stale
        self.model = ThreadModel(thread_id)
        self._subscribers: tuple[Subscriber, ...] = ()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._watch: StoreWatch | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self.model = ThreadModel(self.thread_id)
        self._fold = LiveFold()
        self._after = 0
        self._answered: set[str] = set()
        self._command_top = 0  # the highest command seq seen
        self._row_ids = False  # whether message_ids are the store's row ids (incremental reads)
        self._loaded = False
        self._last_reload = 0.0
        self._reload_due = False
        self._dirty = False
        self._go = asyncio.Event()  # set: the background task may read (see start's rest_later)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, *, rest_later: bool = False) -> ThreadChange:
        """Load the thread and its live state, start following, and return the first change
        (``reset``, every message in ``added``). A windowed follower returns its first page
        instead, before anything else is read (its first published change is then
        ``outlined``); with ``rest_later`` it reads nothing more until :meth:`read_rest`
        (a view paints the page first: reading the rest meanwhile would slow the paint).
        Starting again after :meth:`stop` re-attaches from scratch. Raises the store's errors."""
        await self.stop()
        self._reset_state()
        if not rest_later:
            self._go.set()
        self._watch = StoreWatch(self.store, signals=self.signals, step_ms=self.step_ms, poll=self.poll)
        if self.window is None or not rest_later:
            await self._watch.start()  # else armed before anything but the page is read
        try:
            first = await self._first_page() if self.window is not None else await self.refresh(force=True)
        except BaseException:
            await self._watch.stop()
            raise
        self._task = asyncio.create_task(self._follow(), name=f"follow {self.thread_id}")
        return first or ThreadChange(self.model, reset=True, added=tuple(self.model.messages))

    def read_rest(self) -> None:
        """Go on after ``start(rest_later=True)``: read the rest of the thread, then follow it."""
        self._go.set()

    async def stop(self) -> None:
        """Stop following (detach); the model keeps its last state. Never raises."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()

    async def __aenter__(self) -> ThreadFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every later change; returns the function that unsubscribes.
        A callback that raises is logged and skipped."""
        self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    async def changes(self) -> AsyncIterator[ThreadChange]:
        """Iterate changes: first a ``reset`` change holding the current model (history),
        then every later change (live), until the consumer stops iterating."""
        queue: asyncio.Queue[ThreadChange] = asyncio.Queue()
        unsubscribe = self.subscribe(queue.put_nowait)
        try:
            yield ThreadChange(
                self.model,
                reset=True,
                added=tuple(self.model.messages),
                partial_reset=True,
                tools=True,
                retry=True,
                lease=True,
                commands=tuple(self.model.commands),
                runs=True,
            )
            while True:
                yield await queue.get()
        finally:
            unsubscribe()

    # --- one refresh -----------------------------------------------------------------------

    async def refresh(self, *, force: bool = False, changed: bool = True) -> ThreadChange | None:
        """Read what changed and fold it into the model; return the change (``None`` if nothing
        did) after telling the subscribers. ``force`` reloads the messages; ``changed``
        says the store's token moved (``False`` for a timer tick). Raises the store's errors."""
        async with self._lock:
            change = await self._refresh(force, changed)
        if change is not None:
            await self._publish(change)
        return change

    async def _refresh(self, force: bool, changed: bool) -> ThreadChange | None:
        store, tid, model = self.store, self.thread_id, self.model
        outlined, reset, added, runs_changed = False, False, (), False
        if self.window is not None and (force or not self._loaded):
            # Before any live event: their indices count the whole thread's messages.
            if force:
                await self._first_page()
                reset, added = True, tuple(model.messages)
            added = (*added, *await self._outline())
            outlined = runs_changed = True
        events = await store.read_live_events(tid, self._after)
        lease = await store.get_lease(tid)
        # One read, one snapshot: the open commands we know and every newer one, whatever
        # its status (one sent and settled between two looks is never pending when we look).
        old_lease, old_commands, old_pending = model.lease, model.commands, model.pending_request
        rows = await store.list_commands(tid, after=min([c.seq - 1 for c in old_commands] + [self._command_top]))
        commands = [c for c in rows if c.status in _OPEN]
        changed_commands = self._command_changes(rows, old_commands, first=not self._loaded)
        if rows:
            self._command_top = max(self._command_top, rows[-1].seq)
        if events:
            self._after = events[-1].seq
        fold = self._fold.apply(events, model.count, self._answered)

        moved = _holder(lease) != _holder(old_lease)
        explained = bool(events) or bool(changed_commands) or lease != old_lease
        now_m = time.monotonic()
        if changed:
            self._dirty = True
            if not explained:
                self._reload_due = True
        reload = force or not self._loaded or fold.reload or moved
        if self._reload_due and now_m - self._last_reload >= self.reload_interval:
            reload = True
        if self._dirty and now_m - self._last_reload >= self.max_stale:
            reload = True

        if outlined:
            self._last_reload, self._reload_due, self._dirty = now_m, False, False
        elif reload:
            reset, added, runs_changed = await self._reload(full=force or not self._loaded)
            self._last_reload, self._reload_due, self._dirty = now_m, False, False
        fold.merge(self._fold.settle(model.count, self._answered))

        view = lease_status(lease, model.runs, time.time())
        if not view.live:
            # Nobody runs it: whatever streamed last is not coming (the record is the messages).
            self._fold.clear(fold)
        lease_changed = lease != old_lease or view.state is not model.lease_view.state
        model.lease, model.lease_view = lease, view

        model.commands = commands
        model.partial, model.partial_index = self._fold.partial, self._fold.partial_index
        model.running_tools = self._fold.tools
        model.retry = self._fold.retry
        if fold.started:
            model.run_id = fold.started
        if fold.ended:
            model.last_end = fold.ended
        model.error = None

        change = ThreadChange(
            model,
            reset=reset,
            added=added,
            partial_reset=fold.partial_reset,
            deltas=() if fold.partial_reset else tuple(fold.deltas),
            tools=fold.tools,
            retry=fold.retry,
            lease=lease_changed,
            commands=changed_commands,
            runs=runs_changed,
            ended=fold.ended,
            outlined=outlined,
            pending=model.pending_request != old_pending,
        )
        if change.empty:
            return None
        model.version += 1
        return change

    async def _reload(self, *, full: bool) -> tuple[bool, tuple[AnyMessage, ...], bool]:
        """Load the thread (only its new rows, when the store can and ``full`` is false);
        return (reset, added, runs changed)."""
        model = self.model
        last = self._last_row_id()
        if self.window is not None:
            return self._extend(await self.store.load_after(self.thread_id, 0 if last is None else last))  # type: ignore[attr-defined]
        if not full and last is not None and supports(self.store, IncrementalReads):
            return self._extend(await self.store.load_after(self.thread_id, last))
        data = await self.store.load(self.thread_id)
        messages = data.messages if data else []
        self._row_ids = bool(data) and len(data.message_ids) == len(messages)
        ids = data.message_ids if self._row_ids else list(range(len(messages)))
        runs = data.runs if data else []
        runs_changed = runs != model.runs
        model.runs = runs
        model.problems = data.problems if data else []
        model.journal = data.journal if data else None
        model.pending_request = data.pending_request if data else None
        n = len(model.message_ids)
        first = not self._loaded
        self._loaded = True
        if not first and len(ids) >= n and (n == 0 or ids[n - 1] == model.message_ids[n - 1]):
            added = messages[n:]
            model.messages.extend(added)
            model.message_ids.extend(ids[n:])
            self._answered |= answered_ids(added)
            return False, tuple(added), runs_changed
        # First load, or the history is not what we had (another store, a rewritten file).
        model.messages, model.message_ids = list(messages), list(ids)
        self._answered = answered_ids(messages)
        return True, tuple(messages), runs_changed

    def _last_row_id(self) -> int | None:
        """The highest row id read so far (a message or an undecodable row); ``None`` when
        nothing was read or the store's ids are not row ids."""
        ids = self.model.message_ids[-1:] + [p.row_id for p in self.model.problems if isinstance(p.row_id, int)]
        if not ids or not self._row_ids or not all(isinstance(i, int) for i in ids):
            return None
        return max(ids)

    def _extend(self, data: CheckpointData) -> tuple[bool, tuple[AnyMessage, ...], bool]:
        """Fold an incremental read (rows after the last one read) into the model."""
        model = self.model
        runs_changed = data.runs != model.runs
        model.runs = data.runs
        # Undecodable message rows are kept; the extra's problem (not a row) is read afresh.
        kept = [p for p in model.problems if isinstance(p.row_id, int)]
        model.problems = kept + list(data.problems)
        model.journal = data.journal
        model.pending_request = data.pending_request
        model.messages.extend(data.messages)
        model.message_ids.extend(data.message_ids)
        if model.outline is not None:
            model.outline.add_rows(data.messages, data.message_ids, data.problems)  # its answered set is ours
        else:
            self._answered |= answered_ids(data.messages)
        return False, tuple(data.messages), runs_changed

    # --- a windowed follower's reads ---------------------------------------------------------

    async def _first_page(self) -> ThreadChange:
        """Hold the thread's newest ``window`` rows (nothing else is read yet); the change
        that shows them (``reset``)."""
        assert self.window is not None and supports(self.store, PagedReads)
        page = await self.store.load_page(self.thread_id, limit=self.window)
        model = self.model
        model.messages, model.message_ids, model.problems = (
            list(page.messages),
            list(page.message_ids),
            list(page.problems),
        )
        model.offset, model.earlier, model.outline, model.windowed = 0, page.earlier, None, True
        self._row_ids, self._loaded = True, False
        return ThreadChange(model, reset=True, added=tuple(model.messages))

    async def _outline(self) -> tuple[AnyMessage, ...]:
        """Read the whole thread's outline up to the last row held, then the rows written
        since (all of them, when none is held); return the messages those add to the model."""
        model, tid = self.model, self.thread_id
        last = self._last_row_id()
        upto = 0 if last is None else last  # row ids start at 1 in every store of ours
        found = await read_outline(self.store, tid, upto=upto)
        data, outline = found if found is not None else (CheckpointData(), ThreadOutline())
        model.outline, model.offset = outline, outline.count - len(model.messages)
        model.runs, model.journal, model.pending_request = data.runs, data.journal, data.pending_request
        model.problems = [p for p in model.problems if isinstance(p.row_id, int)] + list(data.problems)
        self._answered = outline.answered
        self._loaded = True
        _, added, _ = self._extend(await self.store.load_after(tid, upto))  # type: ignore[attr-defined]
        return added

    def _command_changes(self, rows: list[Command], old: list[Command], *, first: bool) -> tuple[Command, ...]:
        """Commands to report from one read (``rows``: every command above the lowest open
        one known): known open ones whose state changed, and new ones (above the highest
        seq seen), settled or not, except settled history at the first look."""
        before = {c.seq: c for c in old}
        out = []
        for c in rows:
            if c.seq in before:
                if before[c.seq] != c:
                    out.append(c)
            elif c.seq > self._command_top and (not first or c.status in _OPEN):
                out.append(c)
        return tuple(out)

    async def _publish(self, change: ThreadChange) -> None:
        for callback in self._subscribers:
            try:
                result = callback(change)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                _log.exception("a follower subscriber failed")

    # --- the background task ---------------------------------------------------------------

    async def _follow(self) -> None:
        watch = self._watch
        assert watch is not None
        failures = 0
        await self._go.wait()
        while True:
            try:
                await watch.start()  # idempotent; deferred by start(rest_later=True)
                changed = await watch.wait(self._next_tick())
                await self.refresh(changed=changed)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.model.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                _log.warning("following thread %s failed (%s); retrying", self.thread_id, self.model.error)
                await asyncio.sleep(min(0.1 * 2**failures, 2.0))

    def _next_tick(self) -> float | None:
        """Seconds until something may change without a write: a lease expiring, a process
        probe for a live lease, a deferred reload. ``None``: only a write can change anything."""
        if not self._loaded:
            return 0.0  # a windowed follower's outline is still to read
        ticks: list[float] = []
        lease, view = self.model.lease, self.model.lease_view
        if lease is not None and view.live:
            ticks.append(max(lease.expires_at - time.time(), 0.0) + 0.01)
            ticks.append(1.0)  # is its process still there? (same host: stale at once when gone)
        if self._reload_due or self._dirty:
            wait = self.reload_interval if self._reload_due else self.max_stale
            ticks.append(max(self._last_reload + wait - time.monotonic(), 0.0) + 0.01)
        return min(ticks) if ticks else None


def _holder(lease: Lease | None) -> tuple[str, str | None] | None:
    return None if lease is None else (lease.holder_id, lease.run_id)


# --- the thread list ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThreadsSnapshot:
    """The thread list at ``at`` (unix seconds): summaries, most recently active first, and
    each thread's :class:`~core.lease_status.LeaseView` by thread id.

    ``changed`` names the threads whose summary differs from the previous snapshot's
    (added, changed or gone); ``None`` on the first snapshot and whenever every row should
    be treated as changed. A consumer that redraws only these rows stays cheap at 10,000
    threads (issue 10); lease views can move without a write, so compare ``views`` too."""

    threads: list[ThreadSummary]
    views: dict[str, LeaseView]
    at: float
    changed: frozenset[str] | None = None


async def watch_threads(
    store: WatchedStore,
    *,
    signals: bool = True,
    min_interval: float = 0.25,
    step_ms: int = 50,
    poll: float | None = None,
) -> AsyncIterator[ThreadsSnapshot]:
    """Yield the thread list now, then whenever it changed: after a store change (at most
    once per ``min_interval`` seconds, so a streaming runner does not make the picker re-list
    20 times a second) that changed a summary, or when a lease's state changed without a
    write (it expired, or its process on this host is gone; checked every second while a
    lease is live).

    A store with :class:`~core.checkpoint.capabilities.ThreadVersions` is listed whole once;
    after that each change reads every thread's version and the summaries of only the
    threads whose version moved, merged into the list (gone ones removed) and re-sorted
    (:func:`core.checkpoint.listing.merge_listing`), so a change costs what the changed
    threads cost, not the 10,000 others. A store without it is listed whole each time and
    compared summary by summary. Either way ``ThreadsSnapshot.changed`` names the threads
    added, changed or gone (``None`` on the first snapshot).

    ``signals``, ``step_ms`` and ``poll`` are :class:`core.changes.StoreWatch`'s. Raises
    the store's errors (the caller decides whether to retry); stops when the consumer
    stops iterating.
    """
    async with StoreWatch(store, signals=signals, step_ms=step_ms, poll=poll) as watch:
        listing = _Listing(store)
        threads = await listing.first()
        now = time.time()
        views = _views(threads, now)
        yield ThreadsSnapshot(threads, views, now)
        last = time.monotonic()
        while True:
            changed = await watch.wait(_next_expiry(views))
            ids: frozenset[str] = frozenset()
            if changed:
                delay = last + min_interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                threads, ids = await listing.again(threads)
                last = time.monotonic()
            now = time.time()
            fresh = _views(threads, now)
            moved = {k: v.state for k, v in fresh.items()} != {k: v.state for k, v in views.items()}
            views = fresh
            if ids or moved:
                yield ThreadsSnapshot(threads, views, now, ids)


class _Listing:
    """How :func:`watch_threads` reads the list: whole first, then only what changed
    (``ThreadVersions``), or whole each time and compared."""

    def __init__(self, store: WatchedStore) -> None:
        self.store = store
        self.versions: dict[str, Hashable] | None = None

    async def first(self) -> list[ThreadSummary]:
        """The whole list. A store with ``ListingVersions`` gives it with its versions in one
        read; otherwise the versions are read first, so a write landing between the two
        reads is seen again by the next :meth:`again` (its version moved since)."""
        if supports(self.store, ListingVersions):
            threads, self.versions = await self.store.list_threads_and_versions()
            return threads
        if supports(self.store, ThreadVersions):
            self.versions = await self.store.thread_versions()
        return await self.store.list_threads()

    async def again(self, threads: list[ThreadSummary]) -> tuple[list[ThreadSummary], frozenset[str]]:
        """The list after a change, and the ids of the threads added, changed or gone."""
        store = self.store
        before = {s.thread_id: s for s in threads}
        if self.versions is not None and supports(store, ThreadVersions):
            versions = await store.thread_versions()
            moved, gone = changed_threads(self.versions, versions)
            summaries = await store.summaries(moved) if moved else []
            vanished = moved - {s.thread_id for s in summaries}  # gone between the two reads
            for tid in vanished:
                versions.pop(tid, None)
            self.versions = versions
            gone = (gone | vanished) & before.keys()
            fresh = merge_listing(threads, summaries, gone)
            # A version also moves for writes no summary shows (a fingerprints record).
            ids = {s.thread_id for s in summaries if before.get(s.thread_id) != s} | gone
            return fresh, frozenset(ids)
        fresh = await store.list_threads()
        after = {s.thread_id: s for s in fresh}
        ids = {tid for tid, s in after.items() if before.get(tid) != s} | (before.keys() - after.keys())
        return fresh, frozenset(ids)


def _views(threads: list[ThreadSummary], now: float) -> dict[str, LeaseView]:
    return {t.thread_id: lease_status(t.lease, t.runs, now) for t in threads}


def _next_expiry(views: dict[str, LeaseView]) -> float | None:
    live = [v.expires_in for v in views.values() if v.live and v.expires_in is not None]
    if not live:
        return None
    return min(1.0, max(min(live), 0.0) + 0.01)
