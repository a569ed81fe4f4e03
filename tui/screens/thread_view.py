"""ThreadView: what a thread screen shows - transcript, crash banner, commands, status bar.

A thread is shown in one of two ways:

* **run here**: this app's agent runs it; the agent's listener only posts
  :class:`~tui.messages.AgentEventReceived`, a :class:`~tui.screens.local_run.LocalRun`
  draws each event and the handler here changes the view's state (running, the request
  the run waits on);
* **followed**: otherwise a :class:`~core.follow.ThreadFollower` reads the thread and
  whatever another process streams into it; its changes arrive as
  :class:`~tui.messages.FollowerChanged`, a :class:`~tui.screens.followed_run.FollowedRun`
  draws them, each persisted message exactly once, and the handler here shows who runs
  the thread, the request it waits on and the commands sent to that process, with their
  statuses in the commands bar.

This view keeps loading the thread, its diagnosis (the crash banner) and the layout.
Stream deltas and tool progress are not drawn per event: the renderers note what changed
and a timer flushes it every :data:`FLUSH_INTERVAL` seconds, so a fast stream costs at
most one append per block per tick. The keys and the runs live in
:class:`tui.screens.thread.ThreadScreen`, built on this view.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import MountError, Widget
from textual.widgets import Static

from core.agent import Agent
from core.checkpoint.base import TEXTLESS_KINDS, CheckpointData, Command, CorruptRow, PendingRequest
from core.checkpoint.pages import MessagePage
from core.errors import CubepiError
from core.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    HumanRequestStarted,
    ToolExecutionEnd,
    ToolExecutionStart,
)
from core.follow import ThreadChange, ThreadFollower
from core.lease_status import LeaseState, LeaseView
from core.messages import Usage
from core.outline import usage_of
from core.owners import owner_label
from core.recovery import Diagnosis
from core.request import repair_words
from tui.attention import answered_label
from tui.covering import covered
from tui.flush_gate import FlushGate
from tui.messages import AgentEventReceived, CloseThread, FollowerChanged, ThreadLoaded
from tui.screens.followed_run import FollowedRun
from tui.screens.local_run import LocalRun
from tui.screens.shown_run import RetryCountdown
from tui.session import Session, ThreadFacts
from tui.text import clean, clock, literal
from tui.widgets.commands import KIND_WORDS, CommandsBar
from tui.widgets.crash_banner import CrashBanner, repairs_line
from tui.widgets.footer import SteadyFooter
from tui.widgets.pending_request import PendingRequestPanel
from tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from textual.worker import Worker
from tui.widgets.transcript import WINDOW, Transcript, merge_rows

FLUSH_INTERVAL = 1 / 20
"""Seconds between redraws of streamed text and tool progress (TEXTUAL-FACTS: 20-50 ms)."""


def definition_words(facts: ThreadFacts) -> str:
    """The fingerprint state of a thread for people: ``"definition unchanged"``,
    ``"definition changed: tool read_file: parameters changed"``, ``"not recorded"`` (the
    thread records no definition), or ``"definition recorded, not compared"`` (no agent
    is configured here to compare it with)."""
    if not facts.recorded:
        return "definition not recorded"
    if not facts.compared or facts.changes is None:
        return "definition recorded, not compared (no agent here)"
    if not facts.changes:
        return "definition unchanged"
    return "definition changed: " + "; ".join(facts.changes)


def facts_line(facts: ThreadFacts) -> Text:
    """The thread view's line under the banner: owner, workflow version, definition state,
    and each override recorded (when, by whom, over what). Store text, shown literally."""
    line = Text()
    line.append("owner ", style="dim")
    line.append(clean(owner_label(facts.owner)), style="bold")
    line.append("  ·  workflow ", style="dim")
    line.append(clean(facts.workflow) if facts.workflow is not None else "none")
    line.append("  ·  ")
    changed = bool(facts.changes)
    line.append(clean(definition_words(facts)), style="bold yellow" if changed else "")
    overrides = facts.meta.overrides if facts.meta is not None else ()
    for override in overrides:
        line.append("\n  override ", style="dim")
        line.append(f"{clock(override.at)} by {clean(owner_label(override.owner))}: ")
        line.append(clean("; ".join(override.changes) or "no change named"))
    return line


class _Paged(Message):
    """The newest page of the thread was read: paint it before the rest is read."""

    def __init__(self, page: MessagePage) -> None:
        super().__init__()
        self.page = page


class _Flush(Message):
    """Time to draw the buffered stream text and tool progress (posted by the flush timer)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, _Flush)


_Handler = TypeVar("_Handler", bound=Callable[..., Awaitable[None]])


def while_attached(handler: _Handler) -> _Handler:
    """Skip ``handler`` once the app is ending, and let it stop there.

    A run outlives an app that is ending (the session aborts it and waits until it is
    saved) and keeps reporting, as may a follower; but from ``App.exit`` on Textual
    refuses every mount (``MountError``) and removes widgets a query then misses
    (``NoMatches``). There is nothing left to draw then.
    """

    @functools.wraps(handler)
    async def guarded(self: Widget, *args: Any) -> None:
        if not self.is_attached:
            return
        try:
            await handler(self, *args)
        except (MountError, NoMatches):
            if self.is_attached:
                raise

    return guarded  # type: ignore[return-value]


class ThreadView(Screen[None]):
    """The live view of one thread, run here or followed; see the module docstring."""

    running: reactive[bool] = reactive(False, bindings=True)
    """Whether this app's agent is running the thread (enables abort, disables resume)."""

    elsewhere: reactive[LeaseView | None] = reactive(None, bindings=True)
    """The live lease of another process that runs the thread (``None``: nobody else runs it)."""

    diagnosis: reactive[Diagnosis | None] = reactive(None, bindings=True)
    """What the store says of the thread when no run is live; drives the banner and ``r``."""

    loaded: reactive[bool] = reactive(False, bindings=True)
    """Whether the thread was read; no key acts before."""

    pending: reactive[PendingRequest | None] = reactive(None, bindings=True)
    """The human request the thread waits on (from the diagnosis, or from the follower while
    another process runs it); drives the request panel and the answer key."""

    def __init__(self, session: Session, thread_id: str, *, prompt: str | None = None, new: bool = False) -> None:
        super().__init__()
        self.session = session
        self._flush_gate = FlushGate(session.input_at)
        self.thread_id = thread_id
        self._first_prompt = prompt
        if prompt is not None:
            session.keep_pending_prompt(thread_id, prompt)  # saved even if the app ends first
        self._new = new
        self._unsubscribe: Callable[[], None] | None = None
        self._countdown = RetryCountdown(self)
        self._local = LocalRun(self, self._countdown, self._flush)
        self._followed: FollowedRun | None = None  # draws the follower's changes, once the thread is shown
        self._problems: list[CorruptRow] = []
        self._paged = False  # the first page was painted before the whole thread was read
        self._painted = asyncio.Event()  # set once that page is on screen (or there is none)
        self._follower: ThreadFollower | None = None
        self._sent: set[int] = set()  # seqs of the commands sent from this view
        self._asking_call: str | None = None  # the call of this run whose request the panel shows
        self.run_worker_ref: Worker[None] | None = None
        """The worker of the current run (compared by identity in state changes)."""
        self.facts: ThreadFacts | None = None
        """The thread's owner, workflow and definition state as last read (``None`` before)."""

    def compose(self) -> ComposeResult:
        yield CrashBanner(id="banner")
        yield PendingRequestPanel(id="pending-request")
        yield Static("", id="thread-problems")
        yield Static("", id="thread-repairs")
        yield Static("", id="thread-facts")
        yield Transcript(id="transcript")
        yield CommandsBar(id="commands")
        yield StatusBar(id="status")
        yield SteadyFooter()

    @property
    def transcript(self) -> Transcript:
        """The message list."""
        return self.query_one(Transcript)

    @property
    def status_bar(self) -> StatusBar:
        """The one-line status."""
        return self.query_one(StatusBar)

    @property
    def commands_bar(self) -> CommandsBar:
        """The commands sent to another process's run, with their statuses."""
        return self.query_one(CommandsBar)

    @property
    def following(self) -> bool:
        """Whether a follower shows the thread now (it is not run here)."""
        return self._follower is not None

    def on_mount(self) -> None:
        if not self.query(StatusBar):
            # Closed again before its first mount ran (keys typed faster than screens switch).
            return
        self.status_bar.thread_id = self.thread_id
        self.status_bar.model = self.session.config.model
        self.status_bar.store = self.session.store_notice  # a reconnect under way when it opened
        self.status_bar.run_state = "loading"
        self.query_one("#thread-problems").display = False
        self.query_one("#thread-repairs").display = False
        self.set_interval(FLUSH_INTERVAL, self._request_flush, name="flush")
        # A run elsewhere whose host died writes nothing more: age its heartbeat here.
        self.set_interval(1, self._age_lease, name="lease age")
        self._load()

    async def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        await self._stop_following(drop_live=False)

    # --- loading ------------------------------------------------------------------------

    @work(exclusive=True, exit_on_error=False, group="load")
    async def _load(self) -> None:
        if self.session.can_watch and not self.session.is_running(self.thread_id):
            await self._start_following(first=True)
            return
        # The newest page is painted first; the whole thread is read once after it, for the
        # diagnosis and the totals, without holding its messages (issue 10).
        try:
            page = await self.session.load_page(self.thread_id, limit=WINDOW)
            if page.rows:
                self.post_message(_Paged(page))
                await self._painted.wait()  # reading the rest meanwhile would slow the paint
            data, outline, diagnosis = await self.session.outline(self.thread_id, must_exist=not self._new)
        except CubepiError as error:
            self.post_message(ThreadLoaded(self.thread_id, error=str(error)))
            return
        self.post_message(ThreadLoaded(self.thread_id, data=data, diagnosis=diagnosis, totals=outline.totals))

    async def _start_following(self, *, first: bool = False) -> None:
        """Follow the thread: its history, then what any process writes into it.

        The follower holds only the thread's newest :data:`WINDOW` messages and reads the
        rest once, for its outline (:class:`core.follow.ThreadFollower`'s ``window``). The
        first attach paints that page at once (``_Paged``), and the follower's ``outlined``
        change finishes loading (:meth:`_outlined`); a store without paged reads is read
        whole and posts ``ThreadLoaded``. A later attach (after a run here) posts the
        follower's first change, which shows only the messages the transcript lacks.
        """
        if self._follower is not None:
            return
        follower = self.session.follower(self.thread_id, window=WINDOW)
        try:
            change = await follower.start(rest_later=first)
        except CubepiError as error:
            await self.session.release(follower)
            if first:
                self.post_message(ThreadLoaded(self.thread_id, error=str(error)))
            else:
                self.notify(clean(error), severity="error", markup=False)
            return
        model = change.model
        if not first and (self.running or self.session.is_running(self.thread_id)):
            await self.session.release(follower)  # a run here started meanwhile: its events show it
            return
        windowed = follower.window is not None
        if (
            first
            and not windowed
            and not self._new
            and not (model.messages or model.problems or model.runs or model.lease)
        ):
            await self.session.release(follower)
            self.post_message(ThreadLoaded(self.thread_id, error=str(self.session.unavailable(self.thread_id))))
            return
        # No await from here on: the follower cannot publish before we listen.
        self._follower = follower
        thread_id = self.thread_id
        follower.subscribe(lambda c: self.post_message(FollowerChanged(thread_id, c)))
        messages = list(change.added)
        ids = list(model.message_ids[: len(messages)])
        if first and windowed:
            if messages or model.problems:
                self.post_message(_Paged(MessagePage(messages, ids, list(model.problems), model.earlier)))
            else:
                follower.read_rest()
        elif first:
            follower.read_rest()
            data = CheckpointData(
                messages=messages,
                runs=list(model.runs),
                problems=list(model.problems),
                message_ids=ids,
                journal=model.journal,
            )
            self.post_message(ThreadLoaded(thread_id, data=data, diagnosis=model.diagnosis(), lease=model.lease_view))
        else:
            self._followed = FollowedRun(self, self._countdown, model, 0)
            self.post_message(FollowerChanged(thread_id, change))

    async def _stop_following(self, *, drop_live: bool = True) -> None:
        """Stop following (a run here starts, or the view closes)."""
        follower, self._follower, self._followed = self._follower, None, None
        if follower is not None:
            await self.session.release(follower)
            if drop_live:
                await self.transcript.drop_live()
                self._countdown.clear()

    @work(exclusive=True, exit_on_error=False, group="follow")
    async def _follow_again(self) -> None:
        await self._start_following()

    def _read_page(self, before: Any, limit: int) -> Awaitable[MessagePage]:
        """The transcript's :data:`~tui.widgets.transcript.PageLoader`: earlier rows, from the store."""
        return self.session.load_page(self.thread_id, before=before, limit=limit)

    @on(_Paged)
    @while_attached
    async def _show_page(self, message: _Paged) -> None:
        page = message.page
        entries = merge_rows(page.messages, page.message_ids, page.problems)
        await self.transcript.show(entries, unread=page.earlier, before=page.first_id, loader=self._read_page)
        self._paged = True
        self.call_after_refresh(self._read_rest)

    def _read_rest(self) -> None:
        """The first page is on screen: the rest of the thread may be read now."""
        self._painted.set()
        if self._follower is not None:
            self._follower.read_rest()

    @on(ThreadLoaded)
    @while_attached
    async def _show_thread(self, message: ThreadLoaded) -> None:
        if message.error is not None or message.data is None:
            self.post_message(CloseThread(self.thread_id, error=message.error or "The thread could not be read."))
            return
        data = message.data
        if not self._paged:
            entries = merge_rows(data.messages, data.message_ids, data.problems)
            await self.transcript.show(entries, loader=self._read_page)
        if self._follower is not None:
            self._followed = FollowedRun(self, self._countdown, self._follower.model, len(data.messages))
            self._followed.show_retry()
        totals = message.totals if message.totals is not None else usage_of(data.messages)
        await self._thread_ready(data.problems, totals, message.diagnosis, message.lease)

    async def _outlined(self, change: ThreadChange) -> None:
        """A windowed follower's first outline: the whole thread is read, so finish loading
        (what ``ThreadLoaded`` does for a thread read whole)."""
        model = change.model
        if not self._new and not (model.count or model.thread_problems or model.runs or model.lease):
            follower, self._follower = self._follower, None
            if follower is not None:
                await self.session.release(follower)
            self.post_message(CloseThread(self.thread_id, error=str(self.session.unavailable(self.thread_id))))
            return
        if not self._paged:
            await self.transcript.show([], loader=self._read_page)
        self._followed = FollowedRun(self, self._countdown, model, 0)  # apply() counts what is shown
        await self._followed.apply(change)
        self._followed.show_retry()  # whatever the change says: the view attaches now
        for command in change.commands:
            self._command_seen(command)
        live = model.lease_view.live
        totals = model.outline.totals if model.outline is not None else usage_of(model.messages)
        await self._thread_ready(model.thread_problems, totals, None if live else model.diagnosis(), model.lease_view)

    async def _thread_ready(
        self, problems: list[CorruptRow], totals: Usage, diagnosis: Diagnosis | None, lease: LeaseView | None
    ) -> None:
        """The whole thread is read: show its totals, problems and state; keys act from now on."""
        self.status_bar.set_totals(totals)
        self._problems = list(problems)
        if problems:
            first = problems[0]
            more = f" ({len(problems) - 1} more)" if len(problems) > 1 else ""
            line = literal(f"⚠ Row {first.row_id} could not be read: {first.reason}{more}")
            shown = self.query_one("#thread-problems", Static)
            shown.update(line)
            shown.display = True
        agent = self.session.agents.get(self.thread_id)
        if agent is not None:
            self._subscribe(agent)
        self.running = self.session.is_running(self.thread_id)
        if not self.running:
            self._show_lease(lease, diagnosis)
        if self._follower is not None:
            self.pending = self._follower.model.pending_request  # also while another process runs it
        self.loaded = True
        self.show_facts()
        if self._first_prompt is not None:
            prompt, self._first_prompt = self._first_prompt, None
            self.start_run("prompt", prompt)

    def show_facts(self) -> None:
        """Read the thread's owner, workflow and definition state again and show them."""
        self._load_facts()

    @work(exclusive=True, exit_on_error=False, group="facts")
    async def _load_facts(self) -> None:
        try:
            facts = await self.session.facts(self.thread_id)
        except CubepiError as error:
            self.facts = None
            self._draw_facts(literal(f"owner and definition unknown: {error}", style="dim"))
            return
        self.facts = facts
        self._draw_facts(facts_line(facts))

    def _draw_facts(self, line: Text) -> None:
        if not self.is_attached:
            return
        for widget in self.query("#thread-facts").results(Static):
            widget.update(line)

    def _show_lease(self, view: LeaseView | None, diagnosis: Diagnosis | None) -> None:
        """Show who runs the thread: another process (its lease), or nobody (the diagnosis)."""
        if view is not None and view.state is LeaseState.RUNNING_ELSEWHERE:
            self.elsewhere = view
            self.diagnosis = None
            self.status_bar.run_state = view.label
        else:
            self.elsewhere = None
            self.diagnosis = diagnosis
        # Nobody runs it: its undelivered steers and follow-ups are the user's to send or discard.
        self.commands_bar.set_idle(self.elsewhere is None and not self.running)

    def _age_lease(self) -> None:
        """Redraw the heartbeat age of the run elsewhere while the status bar shows it."""
        before = self.elsewhere
        if before is None:
            return
        view = before.at(time.time())
        # Without watchers: the state is unchanged, so the keys are too.
        self.set_reactive(ThreadView.elsewhere, view)
        if self.status_bar.run_state == before.label:  # not replaced by "aborting (abort sent)"
            self.status_bar.run_state = view.label

    def watch_diagnosis(self, diagnosis: Diagnosis | None) -> None:
        if not self.is_attached:
            return  # the app is ending (see while_attached): its widgets may be gone
        if diagnosis is not None:
            self.pending = diagnosis.pending
        elif self._follower is None:
            self.pending = None  # a run here: it has not asked (yet)
        self.query_one(CrashBanner).diagnosis = diagnosis
        repairs = self.query_one("#thread-repairs", Static)
        words = repair_words(diagnosis.repairs) if diagnosis is not None else []
        repairs.display = bool(words)
        repairs.update(repairs_line(words))
        if diagnosis is not None:
            self.status_bar.run_state = answered_label(diagnosis)
            self.transcript.mark_dangling(diagnosis)
        self.query_one(CrashBanner).steps = {}
        if diagnosis is not None and diagnosis.dangling:
            self._load_steps(diagnosis)

    def watch_pending(self, pending: PendingRequest | None) -> None:
        if not self.is_attached:
            return
        for panel in self.query(PendingRequestPanel).results(PendingRequestPanel):
            panel.pending = pending
            panel.answer_json = None
        if pending is not None:
            self._load_answer(pending)

    def reload_pending(self) -> None:
        """Read the pending request and its stored answer again (after an answer was sent
        or refused): the follower keeps the request current while following."""
        if self.pending is not None:
            self._load_answer(self.pending)
        if self._follower is None and not self.running:
            self._refresh_diagnosis()

    @work(exclusive=True, exit_on_error=False, group="answer-state")
    async def _load_answer(self, pending: PendingRequest) -> None:
        """Show whether ``pending`` has an answer stored already (not yet applied)."""
        try:
            answer_json = await self.session.stored_answer(self.thread_id, pending)
        except CubepiError:
            return  # the panel still shows the request; answering says what is wrong
        if self.is_attached and self.pending == pending:
            for panel in self.query(PendingRequestPanel).results(PendingRequestPanel):
                panel.answer_json = answer_json

    @work(exclusive=True, exit_on_error=False, group="steps")
    async def _load_steps(self, diagnosis: Diagnosis) -> None:
        """Show in the banner how far each dangling call of a stepped tool got."""
        try:
            steps = await self.session.step_words(self.thread_id, diagnosis.dangling)
        except CubepiError:
            return  # the banner still says where each call stopped; the plan (r) says the rest
        if self.is_attached and self.diagnosis == diagnosis:
            for banner in self.query(CrashBanner).results(CrashBanner):
                banner.steps = steps

    def watch_running(self, running: bool) -> None:
        if running and self.is_attached:
            self.status_bar.run_state = "running"

    # --- following another process --------------------------------------------------------

    @on(FollowerChanged)
    @while_attached
    async def _follower_changed(self, message: FollowerChanged) -> None:
        change = message.change
        if self._follower is None or change.model is not self._follower.model:
            return  # from a follower that was detached since
        if self._followed is None:
            if change.outlined and not self.loaded:
                await self._outlined(change)
            return  # else from before ThreadLoaded made the renderer (it shows the same messages)
        model = change.model
        await self._followed.apply(change)
        if change.outlined:
            self._problems = model.thread_problems
        for command in change.commands:
            self._command_seen(command)
        self.pending = model.pending_request
        if model.ready and (
            change.reset or change.lease or change.added or change.runs or change.ended or change.pending
        ):
            live = model.lease_view.live
            self._show_lease(model.lease_view, None if live else model.diagnosis())
        if change.ended or change.runs:
            # A run records the definition (or an override) before it starts: read it again
            # when a run is claimed and when one ends.
            self.show_facts()
        if not change.model.lease_view.live and any(c.kind in TEXTLESS_KINDS for c in change.model.commands):
            self._refuse_orphaned_aborts()  # the follower then reports them refused

    @work(exclusive=True, exit_on_error=False, group="orphans")
    async def _refuse_orphaned_aborts(self) -> None:
        try:
            await self.session.refuse_orphaned_aborts(self.thread_id)
        except CubepiError:
            pass  # a locked or browse-only database: the abort just stays shown as sent

    def _command_seen(self, command: Command) -> None:
        if not self.commands_bar.track(command) or command.seq not in self._sent:
            return
        words = KIND_WORDS.get(command.kind, command.kind)
        if command.status == "refused":
            note = f": {clean(command.note)}" if command.note else ""
            self.notify(f"{words} #{command.seq} was refused{note}.", severity="warning", timeout=8, markup=False)
        elif command.status == "applied":
            self.notify(f"{words} #{command.seq} applied.", timeout=4, markup=False)

    def _track_sent(self, command: Command) -> None:
        self._sent.add(command.seq)
        self.commands_bar.track(command)

    def _subscribe(self, agent: Agent) -> None:
        if self._unsubscribe is None:
            thread_id = self.thread_id

            def listener(event: AgentEvent) -> None:
                self.post_message(AgentEventReceived(thread_id, event))

            self._unsubscribe = agent.subscribe(listener)

    @work(exclusive=True, exit_on_error=False, group="load")
    async def _refresh_diagnosis(self) -> None:
        try:
            _, _, diagnosis = await self.session.outline(self.thread_id, must_exist=False)
        except CubepiError as error:
            self.notify(clean(str(error)), severity="error", markup=False)
            return
        if not self.session.is_running(self.thread_id):
            self.diagnosis = diagnosis

    # --- agent events -------------------------------------------------------------------

    @on(AgentEventReceived)
    @while_attached
    async def _agent_event(self, message: AgentEventReceived) -> None:
        await self._show_event(message.event)

    async def _show_event(self, event: AgentEvent) -> None:
        """Draw one event of the run here, and change what it changes of the view's state."""
        await self._local.apply(event)
        if isinstance(event, HumanRequestStarted):
            # The request is stored before this event: the panel shows what the store holds.
            self._asking_call = event.tool_call_id
            self.pending = PendingRequest(event.request_json, event.run_id, event.created_at)
        elif isinstance(event, ToolExecutionStart | ToolExecutionEnd):
            self._answered(event.tool_call_id)
        elif isinstance(event, AgentStart):
            self.running = True
            self.diagnosis = None
            # The run recorded the thread's definition (a new thread's first one) before it
            # started: the owner line says so now, not only once the run is over.
            self.show_facts()
        elif isinstance(event, AgentEnd) and event.error:
            self.notify(clean(event.error), severity="error", timeout=10, markup=False)

    def _answered(self, tool_call_id: str) -> None:
        # An approved call starts, a denied one ends, a question asked by a running tool
        # ends with its call: the request that call asked is then settled.
        if self._follower is None and tool_call_id == self._asking_call:
            self._asking_call = None
            self.pending = None

    def _on_timer_update(self) -> None:
        # Textual's screen update (layout, then paint) also runs for the screen just below
        # the top one, opaque or not (``Screen.is_current``): under the help, a change made
        # just before ``?`` laid this hidden screen out and repainted the help above it
        # (profiled, 5,000 tok/s: one 10-35 ms layout per showing of the help, in front of
        # its Escape). Hidden, the pending update keeps its flags and runs when the screen
        # is back on top (its resume refreshes it); after-refresh callbacks still run now,
        # as Textual runs them for screens it does not draw.
        if covered(self):
            self._update_timer.pause()
            if self._callbacks:
                self.call_next(self._invoke_and_clear_callbacks)
            return
        super()._on_timer_update()

    def _request_flush(self) -> None:
        # Timer callbacks run in the timer's own task; drawing must happen in this
        # screen's message queue, in order with the agent events, so post a message.
        if not (self._local.dirty or (self._followed is not None and self._followed.dirty)):
            return
        if covered(self):
            # Unseen: drawing would lay this screen out under the help (tui.flush_gate).
            self._flush_gate.covered()
        elif self._flush_gate.may_draw():  # a key's own frame goes first (tui.flush_gate)
            self.post_message(_Flush())

    def _frame_drawn(self, started: float) -> None:
        self._flush_gate.frame_cost(time.thread_time() - started)

    @on(_Flush)
    @while_attached
    async def _flush(self) -> None:
        """Draw what the stream and the tools reported since the last flush."""
        if not self.is_mounted:
            return
        # The frame's cost spaces the next flush (tui.flush_gate.FRAME_SHARE): this
        # thread's CPU from here until Textual has laid out and painted what it changed.
        self.call_after_refresh(self._frame_drawn, time.thread_time())
        await self._local.flush()
        if self._followed is not None:
            await self._followed.flush()
