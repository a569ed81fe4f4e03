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
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from core.agent import Agent
from core.answers import Answered, answer
from core.checkpoint.base import (
    CheckpointData,
    Checkpointer,
    Command,
    CommandKind,
    PendingRequest,
    ThreadMeta,
    not_deleted_sentence,
    thread_unavailable,
)
from core.checkpoint.capabilities import (
    LIVE,
    HumanAnswers,
    LiveStore,
    OwnerScoped,
    SchemaUpgrade,
    ThreadDeletion,
    ThreadRecords,
    lacking,
    supports,
)
from core.checkpoint.pages import MessagePage
from core.checkpoint.reconnect import StoreStatus, reconnect_notice
from core.commands import cancel, discard, edit, refuse_orphaned_aborts, send, undelivered
from core.errors import CommandRaced, CommandTransitionError, ConflictError, CubepiError, UnreadableRequestError
from core.events import RunOutcome
from core.follow import ThreadFollower, ThreadsSnapshot, watch_threads
from core.hitl import parse_request
from core.hitl_replies import Reply
from core.lease_status import LeaseView, lease_status
from core.leases import delete_thread
from core.outline import ThreadOutline, read_outline
from core.owners import UNOWNED
from core.recovery import DanglingCall, Diagnosis, ResumePlan, SettleChoice
from core.supervisor import Supervisor
from tui.attention import AttentionWatch
from tui.session_config import SessionConfig
from tui.session_reads import load_page, stepped_calls
from tui.session_rows import PickerRows, RowsUpdate, ThreadRow
from tui.session_rows import state_label as state_label  # re-exported: the picker imports it from here
from tui.whole_diagnoses import WholeDiagnoses

OnStart = Callable[[Agent], None]
"""Told the thread's agent just before a run of it begins (see ``Session.prompt``)."""

SENT_AS_PROMPT = "sent as a new prompt"
"""The note on an undelivered steer or follow-up whose text became a new run's prompt."""


INPUT_POLL = 0.05
"""Seconds between two looks, while the user is at work, at whether the store changed
(a new listing is shown at once) or input has gone quiet."""


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


class Session:
    """Everything the screens drive: the store, the provider and the live agents.

    ``config`` (:class:`tui.session_config.SessionConfig`) is what the session was started
    with and never changes. Everything else is runtime state, read through properties and
    changed only by the session's own verbs (a screen never assigns a session field).
    """

    def __init__(self, config: SessionConfig) -> None:
        self._config = config
        self._store_open: Checkpointer | None = None
        self._provider: Any = None
        self._provider_error: str | None = None
        self._agents: dict[str, Agent] = {}
        # The Supervisor of each thread run here, so other processes can follow and command it.
        self._supervisors: dict[str, Supervisor] = {}
        # Followers of threads shown here (stopped before the store closes).
        self._followers: set[ThreadFollower] = set()
        # The task of each run started here, by thread id. The session owns it, not the screen
        # that asked: an app that ends abruptly (Textual's ``panic`` when the terminal's input
        # fails) cancels every screen worker, which would cut a run off mid-tool or mid-write;
        # close() aborts these and waits until each has saved its end.
        self._runs: dict[str, asyncio.Task[RunOutcome]] = {}
        # Prompts the user sent whose run has not begun yet, by thread id (keep_pending_prompt).
        self._pending_prompts: dict[str, str] = {}
        self._on_busy: Callable[[int], None] | None = None
        self._on_status: Callable[[], None] | None = None
        self._store_notice = ""
        self._ending = False
        self._whole = WholeDiagnoses()
        # Which threads were alerted about already (one alert per request or crashed run).
        self._attention = AttentionWatch()
        # The provider's one build (prepare_provider), once asked for.
        self._provider_built: asyncio.Future[None] | None = None
        self._rows = PickerRows(self._whole, self.is_running)
        # When the user last pressed a key or used the mouse (``time.monotonic``).
        self._input_at = float("-inf")

    # --- runtime state, read-only -------------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        """What the session was started with (frozen, and never replaced)."""
        return self._config

    @property
    def store(self) -> Checkpointer | None:
        """The open store; ``None`` until :meth:`open` opened it."""
        return self._store_open

    @property
    def provider_error(self) -> str | None:
        """The sentence of the provider's failed build (runs are refused with it); ``None``
        while none failed."""
        return self._provider_error

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agent of each thread that has one here, by thread id (a read-only view;
        :meth:`agent` creates them)."""
        return MappingProxyType(self._agents)

    @property
    def runs(self) -> Mapping[str, asyncio.Task[RunOutcome]]:
        """The task of each run started here and not yet ended, by thread id (a read-only
        view; the session owns the runs: :meth:`prompt`, :meth:`resume`, :meth:`close`)."""
        return MappingProxyType(self._runs)

    @property
    def followers(self) -> frozenset[ThreadFollower]:
        """The followers made by :meth:`follower` and not yet released or closed."""
        return frozenset(self._followers)

    @property
    def store_notice(self) -> str:
        """What is wrong with the connection to the store now, in a few words ("reconnecting to
        postgresql://host/db (attempt 3, next in 0.8 s)…", or the sentence of the last
        ``StoreConnectionError``); empty while it is fine (:meth:`set_store_notice`)."""
        return self._store_notice

    @property
    def ending(self) -> bool:
        """Whether the app is ending (:meth:`stop_runs` was called), so no new run starts."""
        return self._ending

    @property
    def whole(self) -> WholeDiagnoses:
        """Each listed thread's diagnosis from its whole stored history, per version (the picker's rows)."""
        return self._whole

    # --- verbs of the app and the screens -----------------------------------------------

    def report_to(
        self, *, on_busy: Callable[[int], None] | None = None, on_status: Callable[[], None] | None = None
    ) -> None:
        """Set who is told about the store: ``on_busy(attempt)`` each time the database was
        locked and a call is retried, ``on_status()`` each time :attr:`store_notice` changed
        (the app redraws where it shows it). ``None`` tells no one. Replaces earlier ones."""
        self._on_busy = on_busy
        self._on_status = on_status

    def keep_pending_prompt(self, thread_id: str, text: str) -> None:
        """Keep ``text``, a prompt the user sent to ``thread_id`` whose run has not begun yet
        (its screen is still loading the thread): should the app end first, :meth:`stop_runs`
        starts that run and aborts it, so the prompt is saved and the thread reads "aborted"
        rather than vanishing. Replaces a prompt kept for the thread before; :meth:`prompt`
        takes it back as the run starts."""
        self._pending_prompts[thread_id] = text

    def drop_pending_prompt(self, thread_id: str) -> None:
        """Forget the prompt kept for ``thread_id`` (:meth:`keep_pending_prompt`): its run will
        not start (refused, or the user said no). Nothing happens when none is kept."""
        self._pending_prompts.pop(thread_id, None)

    def rows_to_alert(self, rows: Iterable[ThreadRow], *, complete: bool) -> list[ThreadRow]:
        """Note ``rows`` (a listing's, or the changed ones among them) as seen, and return
        those that just started waiting for an answer or crashed, to alert about once each
        (:meth:`tui.attention.AttentionWatch.rows_seen`; ``complete``: the listing holds every
        thread). Changes which threads count as alerted already; raises nothing."""
        return self._attention.rows_seen(rows, complete=complete)

    def note_input(self) -> None:
        """The user pressed a key or used the mouse (the app says so for each input event):
        whole-thread refinement of the picker's rows (:meth:`watch_rows`) waits until
        ``config.input_quiet`` seconds pass without input, so that keys never share the CPU with it."""
        self._input_at = time.monotonic()

    def input_at(self) -> float:
        """When the user last pressed a key or used the mouse (``time.monotonic`` seconds;
        ``-inf`` before any input)."""
        return self._input_at

    def input_is_quiet(self) -> bool:
        """Whether ``config.input_quiet`` seconds passed since the last input (:meth:`note_input`)."""
        return time.monotonic() - self._input_at >= self._config.input_quiet

    def report_busy(self, attempt: int) -> None:
        """Pass a "database is locked, retrying" notice on to ``on_busy`` (:meth:`report_to`;
        the app shows it)."""
        if self._on_busy is not None:
            self._on_busy(attempt)

    def report_status(self, status: StoreStatus) -> None:
        """A server store's ``on_status``: keep "reconnecting …" in :attr:`store_notice` while a
        call waits to retry, clear it once one got through, and tell ``on_status`` (:meth:`report_to`)."""
        self.set_store_notice(reconnect_notice(self._config.location, status) if status.reconnecting else "")

    def set_store_notice(self, notice: str) -> None:
        """Set :attr:`store_notice` to ``notice`` and tell ``on_status`` (:meth:`report_to`)
        when it changed. Raises what ``on_status`` raises."""
        if notice == self._store_notice:
            return
        self._store_notice = notice
        if self._on_status is not None:
            self._on_status()

    async def open(self) -> None:
        """Open the store. The provider is built apart, when first needed or asked for
        (:meth:`prepare_provider`), so browsing never waits for it.

        Raises the store's ``CubepiError`` (one sentence) when the database cannot be opened.
        """
        self._store_open = await self._config.open_store()

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
            self._provider = await asyncio.to_thread(self._config.make_provider)
        except CubepiError as error:
            self._provider_error = str(error)

    @property
    def owner(self) -> str:
        """The owner whose threads this session shows: the open store's
        (:data:`core.owners.UNOWNED` for the unowned scope, and for a store that keeps no
        owners); before it opened, ``config.opens_for`` (``UNOWNED`` when that is not known)."""
        if self.store is not None:
            return self.store.owner if supports(self.store, OwnerScoped) else UNOWNED
        return UNOWNED if self._config.opens_for is None else self._config.opens_for

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
        starting = {thread_id for thread_id, task in self._runs.items() if not task.done()} | set(self._pending_prompts)
        running = {thread_id for thread_id, agent in self._agents.items() if agent.state.is_running}
        return len(starting | running)

    def queued_count(self) -> int:
        """How many steers and follow-ups the agents here hold in memory only, not yet
        delivered: those of a store that keeps no commands (quitting drops them; with a
        command table they are kept in the store, :attr:`keeps_commands`, and count 0)."""
        if self.keeps_commands:
            return 0
        return sum(len(a.state.pending_steers) + len(a.state.pending_follow_ups) for a in self._agents.values())

    async def stop_runs(self, timeout: float = 8.0) -> None:
        """End every live run and wait (up to ``timeout`` seconds) until each has ended.

        A run whose call waits for a person's answer is detached (``Agent.detach``): it
        ends **waiting**, its request kept for an answer from anywhere and a later resume.
        Every other run is aborted, which ends it cleanly: its last message is saved and its
        lease released, so the thread reads "aborted" rather than "crashed" next time. This
        is asked again while waiting: a run still taking its lease or loading its thread is
        not yet running, and an abort before it runs would be a no-op (``Agent.abort``).
        """
        self._ending = True
        self._start_pending_prompts()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            live = [task for task in self._runs.values() if not task.done()]
            running = [agent for agent in self._agents.values() if agent.state.is_running]
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
        """Start the run of every prompt still waiting for its screen (:meth:`keep_pending_prompt`),
        to be aborted at once; not on a browse-only store, which the user has not agreed to
        have written."""
        pending, self._pending_prompts = self._pending_prompts, {}
        # A provider not built yet is built by the run itself (``agent``); one that failed runs nothing.
        if self.store is None or self._provider_error is not None or self.needs_upgrade:
            return
        for thread_id, text in pending.items():
            task = self._runs.get(thread_id)
            if task is None or task.done():
                self._start(thread_id, self._prompt(thread_id, text, None))

    async def close(self) -> None:
        """Stop live runs and followers, then close the store (never under a run that still writes).

        A run that ignored its abort for ``stop_runs``' timeout is cancelled (its thread
        then reads "crashed", and resuming settles what it left)."""
        await self.stop_runs()
        stuck = list(self._runs.values())
        for task in stuck:
            task.cancel()
        if stuck:
            await asyncio.wait(stuck)  # their errors are theirs; this close goes on
        for follower in list(self._followers):
            await follower.stop()
        self._followers.clear()
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
        await self._whole.refine(store, summaries)
        now = time.time()
        views = {s.thread_id: lease_status(s.lease, s.runs, now) for s in summaries}
        return await self._rows.update(store, summaries, views, None)

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
                candidates = self._rows.candidates(item, views, changed, self._agents)
                views = item.views
                async for update in self._rows.updates(store, item.threads, views, candidates):
                    yield update
                # Correct rows from whole threads, a budget at a time, until the store changes,
                # while the user is not at work (see SessionConfig.input_quiet).
                more = True
                while more and snapshots.empty():
                    if not self.input_is_quiet():
                        await asyncio.sleep(INPUT_POLL)
                        continue
                    more = await self._whole.refine(store, item.threads)
                    refined = self._whole.take_refined()
                    update = await self._rows.refresh(store, item.threads, views, refined | set(self._agents))
                    if update is not None:
                        yield update
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    def follower(self, thread_id: str, *, window: int | None = None) -> ThreadFollower:
        """A follower of ``thread_id`` (not started); stopped by :meth:`close` at the latest.
        ``window``: hold only the newest messages, that many read first (see
        :class:`core.follow.ThreadFollower`). Raises ``CubepiError`` for a store without live
        runs (see :attr:`can_watch`)."""
        follower = ThreadFollower(self._live(), thread_id, window=window)
        self._followers.add(follower)
        return follower

    async def release(self, follower: ThreadFollower) -> None:
        """Stop ``follower`` and forget it."""
        self._followers.discard(follower)
        await follower.stop()

    async def load_page(self, thread_id: str, *, before: Any = None, limit: int) -> MessagePage:
        """:func:`tui.session_reads.load_page` of the open store: the thread's newest ``limit``
        rows below row id ``before`` (``None``: its newest), with how many come before them.
        Raises ``CubepiError`` while the store is not open, and the store's errors."""
        return await load_page(self._store(), thread_id, before=before, limit=limit)

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
        ("step 2 of 8 committed at 17:00:43"): :func:`tui.session_reads.stepped_calls` with
        this app's tools, so a tool this app lacks shows none, as in the resume plan. Empty
        on a browse-only store. Raises ``CubepiError`` while the store is not open, and the
        store's errors."""
        if self.needs_upgrade:
            return {}
        return await stepped_calls(self._store(), self._config.tools, thread_id, dangling)

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
        if fingerprints is None or self._provider is None:
            return facts
        agent = self._agents.get(thread_id)
        if agent is None:
            # Comparing reads only the thread's record: no load needed (agent() loads it before a run).
            agent = self._agents[thread_id] = self._new_agent(thread_id)
        return replace(facts, changes=tuple(await agent.definition_changes()), compared=True)

    async def delete(self, thread_id: str) -> None:
        """Delete ``thread_id`` and everything stored for it (:func:`core.leases.delete_thread`).

        Raises ``CubepiError`` (one sentence, :func:`core.checkpoint.base.not_deleted_sentence`)
        while this app runs it or the app is ending, and the store's errors:
        ``ThreadNotFoundError`` for a thread missing or another owner's,
        ``RunAlreadyClaimedError`` (the same sentence's form for another process) while
        another process's run holds its lease, ``ReadOnlyStoreError`` on a browse-only store."""
        store = self._store()
        if self.runs_here(thread_id):
            raise CubepiError(not_deleted_sentence(thread_id, here=True))
        if not supports(store, ThreadDeletion):
            raise CubepiError(f"{self._config.location or 'This database'} cannot delete threads.")
        await delete_thread(store, thread_id)
        self._agents.pop(thread_id, None)
        self._supervisors.pop(thread_id, None)

    def is_running(self, thread_id: str) -> bool:
        """Whether an agent of this app is running ``thread_id`` now."""
        agent = self._agents.get(thread_id)
        return agent is not None and agent.state.is_running

    def runs_here(self, thread_id: str) -> bool:
        """Whether this app runs ``thread_id`` or is about to: its agent runs, its run is still
        taking the lease, or a prompt sent to it waits for its screen to load the thread
        (:meth:`keep_pending_prompt`)."""
        return self.is_running(thread_id) or thread_id in self._pending_prompts or thread_id in self._runs

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

    async def agent(self, thread_id: str, *, load: bool = True) -> Agent:
        """The agent of ``thread_id``, created on first use, with the thread loaded fresh
        (another process may have written since) unless it is running.

        ``load=False`` skips that load, for a caller whose next call loads the thread itself
        (``Agent.prompt``, ``resume`` and ``plan_resume`` reload it under the lease): a load
        decodes every message of the thread (measured: ~70 ms at 10,000 messages, ~1.3 s
        at 100,000), so loading twice made a prompt wait twice as long before its run.
        Raises ``CubepiError`` with ``provider_error`` when no provider could be built.
        """
        agent = self._agents.get(thread_id)
        if agent is None:
            await self.prepare_provider()
            agent = self._agents[thread_id] = self._new_agent(thread_id)
        elif agent.state.is_running:
            return agent
        if load:
            await agent.load()
        return agent

    def _new_agent(self, thread_id: str) -> Agent:
        """A new agent of ``thread_id`` (not loaded). Raises ``CubepiError`` with
        ``provider_error`` when no provider could be built."""
        if self._provider is None:
            raise CubepiError(self._provider_error or "No model provider is configured.")
        return Agent(
            self._provider,
            self._store(),
            thread_id,
            tools=tuple(self._config.tools),
            system_prompt=self._config.system_prompt,
            **self._config.agent_options,
        )

    async def supervisor(self, thread_id: str, *, load: bool = True) -> Supervisor | None:
        """The Supervisor that runs ``thread_id`` here, so other processes can follow and
        command the run; ``None`` for a store that keeps no live events (the agent runs alone).
        ``load``: as for :meth:`agent`."""
        agent = await self.agent(thread_id, load=load)
        sup = self._supervisors.get(thread_id)
        if sup is None and self.can_watch:
            try:
                sup = self._supervisors[thread_id] = Supervisor(agent, self._live())
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
        (screens subscribe to its events there). The run is the session's (see :attr:`runs`).
        Raises ``CubepiError`` once the app is ending (:attr:`ending`), and
        ``FingerprintMismatchError`` (nothing ran) when the thread was written by another
        definition of the agent, unless ``accept_changes`` (then the override is recorded).
        ``include_pending``: the thread's undelivered steers and follow-ups go with the run."""
        self._pending_prompts.pop(thread_id, None)
        if self._ending:
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
        """The thread's agent and Supervisor, after telling ``on_start``; the agent is not
        loaded here: the run it starts loads the thread under the lease."""
        sup = await self.supervisor(thread_id, load=False)
        agent = self._agents[thread_id]
        if on_start is not None:
            on_start(agent)
        return agent, sup

    async def _owned(self, thread_id: str, run: Coroutine[Any, Any, RunOutcome]) -> RunOutcome:
        """Run ``run`` in a task of the session's own (see :attr:`runs`) and return its outcome.

        Cancelling the caller leaves the run going; :meth:`stop_runs` ends it. Raises what
        ``run`` raises."""
        return await asyncio.shield(self._start(thread_id, run))

    def _start(self, thread_id: str, run: Coroutine[Any, Any, RunOutcome]) -> asyncio.Task[RunOutcome]:
        """Start ``run`` as the session's task for ``thread_id`` (kept in :attr:`runs` until it ends)."""
        task = asyncio.create_task(run, name=f"run of thread {thread_id}")
        self._runs[thread_id] = task

        def forget(done: asyncio.Task[RunOutcome]) -> None:
            if self._runs.get(thread_id) is done:
                del self._runs[thread_id]
            if not done.cancelled():
                done.exception()  # retrieved: a caller cancelled meanwhile never will

        task.add_done_callback(forget)
        return task

    async def plan_resume(self, thread_id: str) -> tuple[ResumePlan, list[Command]]:
        """What resuming ``thread_id`` would do, and the steers and follow-ups its crashed
        runner never delivered (empty while a run holds the thread). Raises ``CubepiError``."""
        agent = await self.agent(thread_id, load=False)
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
        if self._ending:
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
            raise CubepiError(f"{self._config.location or 'This database'} keeps no answers to human requests.")
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
        :meth:`prompt` raises, and ``CommandRaced`` (nothing run) when ``first`` was edited or
        settled meanwhile, in another window say: a cancelled one is never sent, and an edit
        made there is never overwritten by the text shown here."""
        store = self._live()
        try:
            await store.update_command(first.seq, "discarded", SENT_AS_PROMPT, expected_revision=first.revision)
        except (CommandTransitionError, ConflictError):
            current = next((c for c in await store.list_commands(thread_id) if c.seq == first.seq), first)
            if not (current.status == "discarded" and current.note == SENT_AS_PROMPT and current.text == first.text):
                words = first.kind.replace("_", "-").capitalize()
                change = "edited" if current.status == "pending" else current.status
                raise CommandRaced(
                    f"{words} #{first.seq} was {change} meanwhile, so it was not sent; nothing ran.",
                    command=current,
                    text=first.text,
                ) from None
            # Else a retry of this send: the steer is marked sent already; run the prompt.
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
                f"{self._config.location or 'This database'} keeps no leases, live events or commands, "
                "so its runs cannot be followed or commanded."
            )
        return store  # type: ignore[return-value]  # checked part by part by can_watch
