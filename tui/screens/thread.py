"""ThreadScreen: one thread, live. Transcript, crash banner, commands, status bar, and the run keys.

A thread is shown in one of two ways:

* **run here**: this app's agent runs it, in an exclusive worker of this screen (through
  a :class:`~core.supervise.Supervisor`, so other processes can follow and command the
  run too); the agent's listener only posts :class:`~tui.messages.AgentEventReceived`;
* **followed**: otherwise a :class:`~core.follow.ThreadFollower` reads the thread and
  whatever another process streams into it; its changes arrive as
  :class:`~tui.messages.FollowerChanged` and a :class:`~tui.screens.following.Mirror`
  draws them. ``a``/``s``/``f`` then go to that process as commands
  (:func:`core.supervise.send`) whose statuses the commands bar shows.

Stream deltas and tool progress are not drawn per event: the handlers note what changed
and a timer flushes it every :data:`FLUSH_INTERVAL` seconds, so a fast stream costs at
most one append per block per tick.
"""

from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from core.agent import Agent
from core.checkpoint.base import CheckpointData, Command, CorruptRow
from core.errors import CubepiError, RunError, ThreadNotFoundError
from core.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.follow import ThreadFollower
from core.messages import AssistantMessage
from core.recovery import Diagnosis, ResumeAction
from core.supervise import LeaseState, LeaseView, ThreadCrashedError, ThreadNotRunningError
from tui.messages import AgentEventReceived, CloseThread, FollowerChanged, RunFinished, RunStarted, ThreadLoaded
from tui.screens.following import Mirror
from tui.screens.modals import ConfirmModal, TextInputModal
from tui.screens.resume import ResumeDecision, ResumeModal
from tui.session import UPGRADE_EXPLANATION, Session
from tui.text import clean, literal
from tui.widgets.commands import CommandsBar
from tui.widgets.crash_banner import CrashBanner
from tui.widgets.status_bar import StatusBar
from tui.widgets.transcript import Transcript, merge_rows

FLUSH_INTERVAL = 1 / 20
"""Seconds between redraws of streamed text and tool progress (TEXTUAL-FACTS: 20-50 ms)."""

_KIND_WORDS = {"steer": "Steer", "follow_up": "Follow-up", "abort": "Abort"}


class _Flush(Message):
    """Time to draw the buffered stream text and tool progress (posted by the flush timer)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, _Flush)


class ThreadScreen(Screen[None]):
    """The live view of one thread.

    | Key | Action |
    | :- | :- |
    | a | abort the run (here, or by command in another process) |
    | s | steer the run |
    | f | queue a follow-up |
    | r | resume a crashed thread (shows the plan and the choices) |
    | n | new prompt |
    | e | show earlier messages |
    | q | back to the threads |
    """

    BINDINGS = [
        Binding("a", "abort", "Abort", id="thread.abort", tooltip="Abort the running agent"),
        Binding("s", "steer", "Steer", id="thread.steer", tooltip="Send a message the agent reads before its next model call"),
        Binding("f", "follow_up", "Follow-up", id="thread.follow_up", tooltip="Queue a message for after the current work"),
        Binding("r", "resume", "Resume", id="thread.resume", tooltip="Resume the crashed run (shows the plan first)"),
        Binding("n", "new_prompt", "Prompt", id="thread.prompt", tooltip="Send a new prompt in this thread"),
        Binding("e", "earlier", "Earlier", id="thread.earlier", tooltip="Show earlier messages", show=False),
        Binding("q", "back", "Back", id="thread.back", tooltip="Back to the thread list (runs keep going)"),
    ]

    running: reactive[bool] = reactive(False, bindings=True)
    """Whether this app's agent is running the thread (enables abort, disables resume)."""

    elsewhere: reactive[LeaseView | None] = reactive(None, bindings=True)
    """The live lease of another process that runs the thread (``None``: nobody else runs it)."""

    diagnosis: reactive[Diagnosis | None] = reactive(None, bindings=True)
    """What the store says of the thread when no run is live; drives the banner and ``r``."""

    loaded: reactive[bool] = reactive(False, bindings=True)
    """Whether the thread was read; no key acts before."""

    def __init__(self, session: Session, thread_id: str, *, prompt: str | None = None, new: bool = False) -> None:
        super().__init__()
        self.session = session
        self.thread_id = thread_id
        self._first_prompt = prompt
        self._new = new
        self._unsubscribe: Callable[[], None] | None = None
        self._partial: AssistantMessage | None = None  # the live reply, redrawn on the next flush
        self._progress: dict[str, tuple[float | None, str | None]] = {}
        self._problems: list[CorruptRow] = []
        self._follower: ThreadFollower | None = None
        self._mirror: Mirror | None = None
        self._sent: set[int] = set()  # seqs of the commands sent from this view
        self.run_worker_ref: Worker[None] | None = None
        """The worker of the current run (compared by identity in state changes)."""

    def compose(self) -> ComposeResult:
        yield CrashBanner(id="banner")
        yield Static("", id="thread-problems")
        yield Transcript(id="transcript")
        yield CommandsBar(id="commands")
        yield StatusBar(id="status")
        yield Footer()

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
        self.status_bar.thread_id = self.thread_id
        self.status_bar.model = self.session.model
        self.status_bar.run_state = "loading"
        self.query_one("#thread-problems").display = False
        self.set_interval(FLUSH_INTERVAL, self._request_flush, name="flush")
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
        try:
            data, diagnosis = await self.session.load(self.thread_id, must_exist=not self._new)
        except CubepiError as error:
            self.post_message(ThreadLoaded(self.thread_id, error=str(error)))
            return
        self.post_message(ThreadLoaded(self.thread_id, data=data, diagnosis=diagnosis))

    async def _start_following(self, *, first: bool = False) -> None:
        """Follow the thread: its history, then what any process writes into it.

        The first attach posts ``ThreadLoaded``; a later one (after a run here) posts the
        follower's first change, which shows only the messages the transcript lacks.
        """
        if self._follower is not None:
            return
        follower = self.session.follower(self.thread_id)
        try:
            change = await follower.start()
        except CubepiError as error:
            await self.session.release(follower)
            if first:
                self.post_message(ThreadLoaded(self.thread_id, error=str(error)))
            else:
                self.notify(clean(error), severity="error", markup=False)
            return
        model = change.model
        if first and not self._new and not (model.messages or model.problems or model.runs or model.lease):
            await self.session.release(follower)
            where = self.session.location or "this database"
            error = ThreadNotFoundError(f"There is no thread {self.thread_id!r} in {where}.")
            self.post_message(ThreadLoaded(self.thread_id, error=str(error)))
            return
        # No await from here on: the follower cannot publish before we listen.
        self._follower = follower
        thread_id = self.thread_id
        follower.subscribe(lambda c: self.post_message(FollowerChanged(thread_id, c)))
        messages = list(change.added)
        if first:
            data = CheckpointData(
                messages=messages,
                runs=list(model.runs),
                problems=list(model.problems),
                message_ids=list(model.message_ids[: len(messages)]),
                journal=model.journal,
            )
            self.post_message(ThreadLoaded(thread_id, data=data, diagnosis=model.diagnosis(), lease=model.lease_view))
        else:
            self._mirror = Mirror(self.transcript, model, 0)
            self.post_message(FollowerChanged(thread_id, change))

    async def _stop_following(self, *, drop_live: bool = True) -> None:
        """Stop following (a run here starts, or the view closes)."""
        follower, self._follower, self._mirror = self._follower, None, None
        if follower is not None:
            await self.session.release(follower)
            if drop_live:
                await self.transcript.drop_live()

    @work(exclusive=True, exit_on_error=False, group="follow")
    async def _follow_again(self) -> None:
        await self._start_following()

    @on(ThreadLoaded)
    async def _show_thread(self, message: ThreadLoaded) -> None:
        if message.error is not None or message.data is None:
            self.post_message(CloseThread(self.thread_id, error=message.error or "The thread could not be read."))
            return
        data = message.data
        await self.transcript.show(merge_rows(data.messages, data.message_ids, data.problems))
        self.status_bar.set_usage(data.messages)
        self._problems = list(data.problems)
        if data.problems:
            first = data.problems[0]
            more = f" ({len(data.problems) - 1} more)" if len(data.problems) > 1 else ""
            line = literal(f"⚠ Row {first.row_id} could not be read: {first.reason}{more}")
            problems = self.query_one("#thread-problems", Static)
            problems.update(line)
            problems.display = True
        agent = self.session.agents.get(self.thread_id)
        if agent is not None:
            self._subscribe(agent)
        if self._follower is not None:
            self._mirror = Mirror(self.transcript, self._follower.model, len(data.messages))
        self.running = self.session.is_running(self.thread_id)
        if not self.running:
            self._show_lease(message.lease, message.diagnosis)
        self.loaded = True
        if self._first_prompt is not None:
            prompt, self._first_prompt = self._first_prompt, None
            self.start_run("prompt", prompt)

    def _show_lease(self, view: LeaseView | None, diagnosis: Diagnosis | None) -> None:
        """Show who runs the thread: another process (its lease), or nobody (the diagnosis)."""
        if view is not None and view.state is LeaseState.RUNNING_ELSEWHERE:
            self.elsewhere = view
            self.diagnosis = None
            self.status_bar.run_state = view.label
        else:
            self.elsewhere = None
            self.diagnosis = diagnosis

    def watch_diagnosis(self, diagnosis: Diagnosis | None) -> None:
        self.query_one(CrashBanner).diagnosis = diagnosis
        if diagnosis is not None:
            self.status_bar.run_state = diagnosis.label
            self.transcript.mark_dangling(diagnosis)

    def watch_running(self, running: bool) -> None:
        if running:
            self.status_bar.run_state = "running"

    # --- following another process --------------------------------------------------------

    @on(FollowerChanged)
    async def _follower_changed(self, message: FollowerChanged) -> None:
        change = message.change
        if self._mirror is None or self._follower is None or change.model is not self._follower.model:
            return  # from a follower that was detached since
        await self._mirror.apply(change)
        if change.reset:
            self.status_bar.set_usage(change.added)
        else:
            for m in change.added:
                if isinstance(m, AssistantMessage):
                    self.status_bar.add_usage(m.usage)
        for command in change.commands:
            self._command_seen(command)
        if change.reset or change.lease or change.added or change.runs or change.ended:
            model = change.model
            live = model.lease_view.live
            self._show_lease(model.lease_view, None if live else model.diagnosis())

    def _command_seen(self, command: Command) -> None:
        if not self.commands_bar.track(command) or command.seq not in self._sent:
            return
        words = _KIND_WORDS.get(command.kind, command.kind)
        if command.status == "refused":
            note = f": {clean(command.note)}" if command.note else ""
            self.notify(f"{words} #{command.seq} was refused{note}.", severity="warning", timeout=8, markup=False)
        elif command.status == "applied":
            self.notify(f"{words} #{command.seq} applied.", timeout=4, markup=False)

    def _track_sent(self, command: Command) -> None:
        self._sent.add(command.seq)
        self.commands_bar.track(command)

    # --- running here ---------------------------------------------------------------------

    def start_run(self, kind: str, text: str | None = None) -> None:
        """Start a ``prompt`` (with ``text``) or a ``resume`` unless one is already running."""
        if self.running or (self.run_worker_ref is not None and self.run_worker_ref.is_running):
            self.notify("The agent is already running on this thread.", severity="warning")
            return
        self.run_worker_ref = self._run(kind, text)

    @work(exclusive=True, exit_on_error=False, group="agent")
    async def _run(self, kind: str, text: str | None) -> None:
        if self._problems:
            # Refuse before any question: an upgrade would be for nothing.
            first = self._problems[0]
            self.post_message(
                RunFinished(
                    self.thread_id,
                    error=f"Thread {self.thread_id!r} has {len(self._problems)} unreadable row(s) "
                    f"(first: row {first.row_id}); it can be read but not continued.",
                )
            )
            return
        decision = ResumeDecision()
        if kind == "resume":
            asked = await self._ask_resume()
            if asked is None:
                return
            decision = asked
        if self.session.needs_upgrade:
            if not await self.app.push_screen_wait(
                ConfirmModal("Upgrade this database?", UPGRADE_EXPLANATION, yes="Upgrade")
            ):
                self.notify("The database was left unchanged; it stays browse-only.")
                return
            try:
                await self.session.upgrade()
            except CubepiError as error:
                self.post_message(RunFinished(self.thread_id, error=str(error)))
                return
            self.notify("Database upgraded; cubeloop can still read it.")
        try:
            await self._stop_following()
            agent = await self.session.agent(self.thread_id)
            self._subscribe(agent)
            self.post_message(RunStarted(self.thread_id))
            if kind == "resume":
                outcome = await self.session.resume(
                    self.thread_id, decision.choices, send_pending=bool(decision.send), discard_seqs=decision.discard
                )
            else:
                outcome = await self.session.prompt(self.thread_id, text or "")
        except CubepiError as error:
            self.post_message(RunFinished(self.thread_id, error=str(error)))
            return
        self.post_message(RunFinished(self.thread_id, outcome=str(outcome)))

    async def _ask_resume(self) -> ResumeDecision | None:
        """Plan the resume, show the plan with its choices, and return what the user chose."""
        try:
            plan, pending = await self.session.plan_resume(self.thread_id)
        except CubepiError as error:
            self.notify(clean(error), severity="error", timeout=10, markup=False)
            return None
        if plan.action is ResumeAction.NONE:
            self.notify(clean(plan.sentence), markup=False)
            self.diagnosis = plan.diagnosis
            return None
        return await self.app.push_screen_wait(ResumeModal(plan, pending))

    def _subscribe(self, agent: Agent) -> None:
        if self._unsubscribe is None:
            thread_id = self.thread_id

            def listener(event: AgentEvent) -> None:
                self.post_message(AgentEventReceived(thread_id, event))

            self._unsubscribe = agent.subscribe(listener)

    @on(RunStarted)
    def _run_started(self) -> None:
        self.running = True
        self.elsewhere = None
        self.diagnosis = None

    @on(RunFinished)
    async def _run_finished(self, message: RunFinished) -> None:
        await self._flush()
        self.running = self.session.is_running(self.thread_id)
        if message.error is not None:
            self.notify(clean(message.error), severity="error", timeout=10, markup=False)
        if not self.running:
            if self.session.can_watch and self in self.app.screen_stack:
                self._follow_again()
            else:
                self._refresh_diagnosis()

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.notify(
                clean(f"Unexpected error: {type(error).__name__}: {error}"), severity="error", timeout=15, markup=False
            )
            if event.worker is self.run_worker_ref:
                self.running = self.session.is_running(self.thread_id)
                self._refresh_diagnosis()

    @work(exclusive=True, exit_on_error=False, group="load")
    async def _refresh_diagnosis(self) -> None:
        try:
            _, diagnosis = await self.session.load(self.thread_id, must_exist=False)
        except CubepiError as error:
            self.notify(clean(str(error)), severity="error", markup=False)
            return
        if not self.session.is_running(self.thread_id):
            self.diagnosis = diagnosis

    # --- agent events -------------------------------------------------------------------

    @on(AgentEventReceived)
    async def _agent_event(self, message: AgentEventReceived) -> None:
        event = message.event
        transcript = self.transcript
        if isinstance(event, MessageUpdate):
            self._partial = event.message
        elif isinstance(event, ToolExecutionUpdate):
            self._progress[event.tool_call_id] = (event.progress, event.text)
        elif isinstance(event, MessageStart):
            if isinstance(event.message, AssistantMessage):
                self._partial = event.message
        elif isinstance(event, MessageEnd):
            await self._flush()
            if isinstance(event.message, AssistantMessage):
                self._partial = None
                await transcript.end_reply(event.message)
                self.status_bar.add_usage(event.message.usage)
            else:
                await transcript.append_message(event.message)
        elif isinstance(event, ToolExecutionStart):
            await self._flush()
            transcript.tool_started(event.tool_call_id)
        elif isinstance(event, ToolExecutionEnd):
            self._progress.pop(event.tool_call_id, None)
            transcript.tool_finished(event.result)
        elif isinstance(event, AgentStart):
            self.running = True
            self.diagnosis = None
        elif isinstance(event, AgentEnd):
            await self._flush()
            self.status_bar.run_state = event.outcome
            if event.error:
                self.notify(clean(event.error), severity="error", timeout=10, markup=False)

    def _request_flush(self) -> None:
        # Timer callbacks run in the timer's own task; drawing must happen in this
        # screen's message queue, in order with the agent events, so post a message.
        if self._partial is not None or self._progress or (self._mirror is not None and self._mirror.dirty):
            self.post_message(_Flush())

    @on(_Flush)
    async def _flush(self) -> None:
        """Draw what the stream and the tools reported since the last flush."""
        if not self.is_mounted:
            return
        if self._partial is not None:
            await self.transcript.sync_reply(self._partial)
        if self._progress:
            progress, self._progress = self._progress, {}
            for call_id, (fraction, text) in progress.items():
                self.transcript.tool_progress(call_id, fraction, text)
        if self._mirror is not None:
            await self._mirror.flush()

    # --- keys ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grey out keys that make no sense now (abort when idle, resume when clean, ...).

        ``None`` keeps the key in the footer, dimmed, so it stays discoverable.
        """
        if action in ("abort", "steer", "follow_up", "resume", "new_prompt") and not self.loaded:
            return None
        if action == "abort":
            return True if self.running or self.elsewhere is not None else None
        if action == "resume":
            # Enabled while another process runs it, to say why it cannot be resumed now.
            resumable = self.diagnosis is not None and self.diagnosis.resumable
            return True if not self.running and (resumable or self.elsewhere is not None) else None
        if action == "new_prompt":
            return None if self.running else True
        return True

    def action_abort(self) -> None:
        """Abort the run: here directly (tools get their abort signal), elsewhere by a command."""
        agent = self.session.agents.get(self.thread_id)
        if agent is not None and agent.state.is_running:
            agent.abort()
            self.status_bar.run_state = "aborting"
        elif self.elsewhere is not None:
            self._send_command("abort")

    def action_steer(self) -> None:
        """Ask for a steering message and queue it (offers a new prompt when idle)."""
        self._send_queued("steer")

    def action_follow_up(self) -> None:
        """Ask for a follow-up message and queue it (offers a new prompt when idle)."""
        self._send_queued("follow_up")

    def action_resume(self) -> None:
        """Show the resume plan with its choices, then resume the crashed run as chosen."""
        if self.running:
            return
        if self.elsewhere is not None:
            self.notify(
                f"Thread {clean(self.thread_id)!r} is {self.elsewhere.label}, so it cannot be resumed "
                "now; abort it with a, or wait until that run ends or its lease expires.",
                severity="warning",
                timeout=8,
                markup=False,
            )
            return
        if self.diagnosis is None or not self.diagnosis.resumable:
            return
        self.start_run("resume")

    def action_new_prompt(self) -> None:
        """Ask for a prompt and run it in this thread."""
        if self.elsewhere is not None:
            self.notify(
                f"Thread {clean(self.thread_id)!r} is {self.elsewhere.label}; steer it with s, queue a "
                "follow-up with f, or abort it with a before sending a new prompt.",
                severity="warning",
                timeout=8,
                markup=False,
            )
            return
        self._ask_prompt()

    def action_earlier(self) -> None:
        """Show earlier messages."""
        self.run_worker(self.transcript.show_earlier(), exclusive=True, group="earlier")

    def action_back(self) -> None:
        """Back to the picker; a running agent keeps running."""
        self.post_message(CloseThread(self.thread_id))

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _ask_prompt(self) -> None:
        text = await self.app.push_screen_wait(TextInputModal("New prompt", f"Thread {self.thread_id}"))
        if text:
            self.start_run("prompt", text)

    @work(exit_on_error=False, group="command")
    async def _send_command(self, kind: str, text: str = "") -> Command | None:
        """Send ``kind`` to the process running the thread; notify in one sentence if refused."""
        try:
            command = await self.session.send(self.thread_id, kind, text)  # type: ignore[arg-type]
        except CubepiError as error:
            self.notify(clean(error), severity="error", timeout=10, markup=False)
            return None
        self._track_sent(command)
        if kind == "abort":
            self.status_bar.run_state = "aborting (abort sent)"
        return command

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _send_queued(self, kind: str) -> None:
        words = _KIND_WORDS[kind]
        if kind == "steer":
            hint = "Read by the agent before its next model call."
        else:
            hint = "Delivered when the agent has finished its current work."
        if self.elsewhere is not None and self.elsewhere.lease is not None:
            lease = self.elsewhere.lease
            hint += f" It goes to process {lease.pid} on {clean(lease.host)}, which runs the thread."
        elif not self.running:
            hint = "The agent is idle: you will be asked to send this as a new prompt."
        text = await self.app.push_screen_wait(TextInputModal(words, hint))
        if not text:
            return
        if self.elsewhere is not None and not self.running:
            try:
                command = await self.session.send(self.thread_id, kind, text)  # type: ignore[arg-type]
            except ThreadCrashedError as error:
                self.notify(clean(error), severity="error", timeout=10, markup=False)
                return
            except ThreadNotRunningError:
                pass  # its run ended meanwhile: offer a new prompt below
            except CubepiError as error:
                self.notify(clean(error), severity="error", timeout=10, markup=False)
                return
            else:
                self._track_sent(command)
                self.notify(f"{words} #{command.seq} sent.", markup=False)
                return
        else:
            agent = self.session.agents.get(self.thread_id)
            try:
                if agent is None:
                    raise RunError("The agent is not running.")
                (agent.steer if kind == "steer" else agent.follow_up)(text)
            except RunError:
                pass
            else:
                self.notify(f"{words} queued.")
                return
        question = Text("The agent is not running. Send this as a new prompt?\n\n")
        question.append_text(literal(text))
        if await self.app.push_screen_wait(ConfirmModal(f"{words}: agent idle", question, yes="Send")):
            self.start_run("prompt", text)
