"""ThreadScreen: one thread, live, and what its keys do.

What is shown (run here or followed) is :class:`~tui.screens.thread_view.ThreadView`'s
part; this class adds the keys and the runs. A run happens in an exclusive worker of this
screen, through the session's :class:`~core.supervisor.Supervisor`, so other processes can
follow and command it. For a thread another process runs, ``a``/``s``/``f`` become
commands to that process (:func:`core.commands.send`) and ``r`` is refused until that
run ends or its lease expires. ``r`` on a crashed thread first shows the
:class:`~tui.screens.resume.ResumeModal`: every dangling call with its planned outcome,
and the user's choices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from rich.text import Text
from textual import events, on, work
from textual.worker import Worker, WorkerState

from core.agent import Agent
from core.checkpoint.base import Command
from core.errors import (
    CommandRaced,
    CubepiError,
    FingerprintMismatchError,
    RunError,
    ThreadCrashedError,
    ThreadNotRunningError,
    UnreadableThreadError,
)
from core.events import AgentEvent, MessageEnd, RunOutcome
from core.messages import UserMessage
from core.recovery import ResumeAction
from core.words import counted
from tui.actions import THREAD, Availability, bindings, bound_action, current_keymap, key_names, thread_availability
from tui.messages import CloseThread, RunFinished, RunStarted
from tui.screens.modals import ChangesModal, ConfirmModal, TextInputModal
from tui.screens.resume import ResumeDecision, ResumeModal
from tui.screens.thread_view import KIND_WORDS, ThreadView, while_attached
from tui.text import clean, literal
from tui.widgets.tool_call import ToolCallView

__all__ = ["ThreadScreen"]


class ThreadScreen(ThreadView):
    """The live view of one thread. Its keys, what each does and when each is available:
    :data:`tui.actions.THREAD` and :func:`tui.actions.thread_availability`."""

    BINDINGS = bindings(THREAD)

    _offer_when_back = False
    """Whether undelivered steers wait to be offered until the dialog on top closes."""

    _first_undelivered: Command | None = None
    """The undelivered steer or follow-up whose text a ``start_run("undelivered")`` sends as its prompt."""

    # --- running here ---------------------------------------------------------------------

    def start_run(self, kind: str, text: str | None = None) -> None:
        """Start a ``prompt`` (with ``text``), a ``resume``, or ``undelivered`` (the steers and
        follow-ups a run ended without delivering, ``text`` the first one's, offered again
        should it not be saved) unless a run is already going."""
        if self.running or (self.run_worker_ref is not None and self.run_worker_ref.is_running):
            self.notify("The agent is already running on this thread.", severity="warning")
            return
        if kind == "prompt" and text is not None:
            self.session.keep_pending_prompt(self.thread_id, text)  # saved even if the app ends first
        self.run_worker_ref = self._run(kind, text)
        self.transcript.follow_tail()

    @work(exclusive=True, exit_on_error=False, group="agent")
    async def _run(self, kind: str, text: str | None) -> None:
        unreadable = self._unreadable()
        if unreadable is not None:
            # Refuse before any question: an upgrade would be for nothing.
            self.session.drop_pending_prompt(self.thread_id)
            self.post_message(RunFinished(self.thread_id, error=str(unreadable)))
            return
        decision = ResumeDecision()
        if kind == "resume":
            asked = await self._ask_resume()
            if asked is None:
                return
            decision = asked
        if self.session.needs_upgrade:
            if not await self.app.push_screen_wait(
                ConfirmModal("Upgrade this database?", self.session.upgrade_explanation, yes="Upgrade")
            ):
                self.session.drop_pending_prompt(self.thread_id)
                self.notify("The database was left unchanged; it stays browse-only.")
                return
            try:
                await self.session.upgrade()
            except CubepiError as error:
                self.session.drop_pending_prompt(self.thread_id)
                self.post_message(RunFinished(self.thread_id, error=str(error)))
                return
            self.notify("Database upgraded; cubeloop can still read it.")
        saved = _PromptSaved()
        accept = False
        try:
            while True:
                self.workers.cancel_group(self, "follow")
                await self._stop_following()
                try:
                    outcome = await self._attempt(kind, text, decision, saved, accept)
                except FingerprintMismatchError as mismatch:
                    saved.stop()
                    if accept or self.session.ending:
                        raise
                    # Nothing ran: ask, then go on with the override, or offer the text again.
                    self.post_message(RunFinished(self.thread_id))
                    action = "resume" if kind == "resume" else "send the prompt"
                    if await self.app.push_screen_wait(ChangesModal(self.thread_id, mismatch.changes, action=action)):
                        accept, saved = True, _PromptSaved()
                        continue
                    self.notify("Nothing ran: the agent's definition changes were not accepted.", markup=False)
                    if kind == "prompt" and text:
                        self._offer_again(text, "the agent's definition changed and the changes were not accepted.")
                    return
                break
        except CubepiError as error:
            saved.stop()
            if self.session.ending:
                return  # the app is ending: the session saves the prompt itself (keep_pending_prompt)
            self.post_message(RunFinished(self.thread_id, error=str(error)))
            if kind in ("prompt", "undelivered") and text:
                self._offer_again(text, str(error))
            return
        saved.stop()
        self.post_message(RunFinished(self.thread_id, outcome=str(outcome)))
        if kind in ("prompt", "undelivered") and text and not saved.saved and not self.session.ending:
            agent = self.session.agents.get(self.thread_id)
            self._offer_again(text, (agent.state.error if agent is not None else None) or f"The run {outcome}.")

    async def _attempt(
        self, kind: str, text: str | None, decision: ResumeDecision, saved: _PromptSaved, accept: bool
    ) -> RunOutcome:
        """One try of the run ``kind`` (``accept``: go on past a changed definition, recorded)."""
        if kind == "undelivered" and self._first_undelivered is not None:
            return await self.session.send_undelivered(
                self.thread_id,
                self._first_undelivered,
                on_start=lambda agent: self._run_begins(saved.watch(agent)),
                accept_changes=accept,
            )
        if kind == "resume":
            return await self.session.resume(
                self.thread_id,
                decision.choices,
                send_pending=bool(decision.send),
                discard_seqs=decision.discard,
                on_start=self._run_begins,
                accept_changes=accept,
            )
        return await self.session.prompt(
            self.thread_id,
            text or "",
            on_start=lambda agent: self._run_begins(saved.watch(agent)),
            accept_changes=accept,
        )

    @work(exit_on_error=False, group="offer")
    async def _offer_again(self, text: str, why: str) -> None:
        """The prompt ``text`` was never saved (``why``, one sentence): offer it again, as typed."""
        hint = f"Not sent: {why} Press Enter to try again, or Escape to drop it."
        again = await self.app.push_screen_wait(TextInputModal("New prompt", hint, value=text))
        if again:
            self.start_run("prompt", again)

    def _run_begins(self, agent: Agent) -> None:
        self._subscribe(agent)
        self.post_message(RunStarted(self.thread_id))

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

    @on(RunStarted)
    @while_attached
    async def _run_started(self) -> None:
        self.running = True
        self.elsewhere = None
        self.diagnosis = None
        self.commands_bar.set_idle(False)
        if self.session.keeps_commands:
            self._watch_queue()

    @on(RunFinished)
    @while_attached
    async def _run_finished(self, message: RunFinished) -> None:
        await self._flush()
        self.running = self.session.is_running(self.thread_id)
        if message.error is not None:
            self.notify(clean(message.error), severity="error", timeout=10, markup=False)
        self.show_facts()  # a run records the definition it ran with, and any override
        if not self.running and self.session.keeps_commands and message.outcome is not None:
            self._offer_undelivered()  # only after a run that ran (not one refused before it began)
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

    # --- keys ---------------------------------------------------------------------------

    def on_key(self, event: events.Key) -> None:
        """A greyed-out key says in one sentence why it does nothing now (whatever key the
        keymap binds to its action)."""
        action = bound_action(self, event.key)
        if action is None or self.check_action(action, ()):
            return
        reason = self._why_not(action)
        if reason is not None:
            # Stopped here, the key never reaches the bindings, which would ignore it silently.
            event.stop()
            event.prevent_default()
            self.notify(reason, timeout=6, markup=False)

    def _availability(self, action: str) -> Availability:
        return thread_availability(action, self, self._key)

    def _key(self, action_id: str) -> str:
        """The keys bound now to the action ``action_id`` (after the keymap), as sentences name them."""
        return key_names(current_keymap(self.app))(action_id)

    def _queue_keys(self, which: str) -> str:
        """How to select (``which``: "it", "one"), edit and cancel a queued message, with the keys now."""
        return (
            f"{self._key('thread.queued')} selects {which}, {self._key('thread.edit_queued')} edits, "
            f"{self._key('thread.cancel_queued')} cancels"
        )

    def _why_not(self, action: str) -> str | None:
        """Why ``action`` does nothing now, in one sentence (``None``: it does something)."""
        return self._availability(action)[1]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grey out keys that make no sense now (abort when idle, resume when clean, ...), as
        :func:`tui.actions.thread_availability` rules.

        ``None`` keeps the key in the footer, dimmed, so it stays discoverable.
        """
        return self._availability(action)[0]

    def action_abort(self) -> None:
        """Abort the run: here directly (tools get their abort signal), elsewhere by a command."""
        agent = self.session.agents.get(self.thread_id)
        if agent is not None and agent.state.is_running:
            agent.abort()
            self.status_bar.run_state = "aborting"
        elif self.elsewhere is not None:
            self._send_command("abort")
        else:
            self.notify("Nothing to abort: the agent is not running on this thread.", timeout=6, markup=False)

    def action_stop_after_turn(self) -> None:
        """Stop after this turn: the running tools finish and keep their results, then the run
        ends with no further model call (here through the command table when the store keeps
        commands, as elsewhere; else on the agent directly)."""
        agent = self.session.agents.get(self.thread_id)
        here = agent is not None and agent.state.is_running
        if here and not self.session.keeps_commands:
            agent.stop_after_turn()  # type: ignore[union-attr]
            self.status_bar.run_state = "stopping after this turn"
        elif here or self.elsewhere is not None:
            self._send_command("stop")
        else:
            self.notify("Nothing to stop: the agent is not running on this thread.", timeout=6, markup=False)

    def action_interrupt(self) -> None:
        """Ask for a steer; the running tools are aborted (as abort does), then it is delivered."""
        self._send_queued("interrupt")

    def action_note(self) -> None:
        """Ask for a passive note: delivered with the next turn, never waking a finished agent."""
        self._send_queued("note")

    def action_steer(self) -> None:
        """Ask for a steering message and queue it (offers a new prompt when idle)."""
        self._send_queued("steer")

    def action_follow_up(self) -> None:
        """Ask for a follow-up message and queue it (offers a new prompt when idle)."""
        self._send_queued("follow_up")

    def action_resume(self) -> None:
        """Show the resume plan with its choices, then resume the crashed run as chosen."""
        if self.elsewhere is not None and not self.running:
            self.notify(
                f"Thread {clean(self.thread_id)!r} is {clean(self.elsewhere.label)}, so it cannot be resumed "
                f"now; abort it with {self._key('thread.abort')}, or wait until that run ends or its lease expires.",
                severity="warning",
                timeout=8,
                markup=False,
            )
            return
        reason = self._why_not("resume")
        if reason is not None:
            self.notify(reason, timeout=6, markup=False)
            return
        self.start_run("resume")

    def action_new_prompt(self) -> None:
        """Ask for a prompt and run it in this thread."""
        if self.elsewhere is not None:
            self.notify(
                f"Thread {clean(self.thread_id)!r} is {clean(self.elsewhere.label)}; steer it with "
                f"{self._key('thread.steer')}, queue a follow-up with {self._key('thread.follow_up')}, or abort it "
                f"with {self._key('thread.abort')} before sending a new prompt.",
                severity="warning",
                timeout=8,
                markup=False,
            )
            return
        unreadable = self._unreadable()
        if unreadable is not None:  # refused before anything is typed, so nothing typed is lost
            self.notify(clean(str(unreadable)), severity="warning", timeout=8, markup=False)
            return
        self._ask_prompt()

    def _unreadable(self) -> UnreadableThreadError | None:
        """Why this thread cannot be continued, when some of its stored rows are unreadable."""
        if not self._problems:
            return None
        return UnreadableThreadError.of(self.thread_id, len(self._problems), self._problems[0].row_id)

    def action_answer(self) -> None:
        """Answer the pending request in a dialog (:func:`tui.screens.answer.answer_pending`)."""
        # Imported on first use: its TextArea and SelectionList cost ~0.1 s of CPU to import
        # (python -X importtime, loaded machine), which opening a thread need not pay.
        from tui.screens.answer import answer_pending

        self.run_worker(answer_pending(self), exclusive=True, group="input", exit_on_error=False)

    def action_earlier(self) -> None:
        """Show earlier messages, or say that every message is shown already."""
        if not self.transcript.has_earlier:
            self.notify("Every message of this thread is shown already.", timeout=3, markup=False)
            return
        self.transcript.request_earlier()

    def action_tool_call(self) -> None:
        """Focus the last tool call shown, or the one before the focused one (round to the last)."""
        views = list(self.transcript.query(ToolCallView))
        if not views:
            self.notify("No tool call is shown.", timeout=3, markup=False)
            return
        focused = self.focused
        # The focus may be inside a call (its expanded output): that call counts as focused.
        owner = next((v for v in views if focused is not None and (focused is v or v in focused.ancestors)), None)
        chosen = views[(views.index(owner) if owner is not None else 0) - 1]
        chosen.focus()
        self.transcript.scroll_to_widget(chosen, animate=False)

    def action_back(self) -> None:
        """Back to the picker; a running agent keeps running."""
        self.post_message(CloseThread(self.thread_id))

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _ask_prompt(self) -> None:
        hint = f"Thread {self.thread_id}"
        dangling = self.diagnosis.dangling if self.diagnosis is not None else ()
        if dangling:
            # A prompt settles them by the defaults; r is where each can be chosen.
            hint += (
                f". First, {counted(len(dangling), 'tool call')} without a result {'is' if len(dangling) == 1 else 'are'} "
                "settled as resume would by default "
                "(an idempotent tool runs again, any other is recorded as interrupted); "
                f"Escape, then {self._key('thread.resume')}, to see and choose for each."
            )
        text = await self.app.push_screen_wait(TextInputModal("New prompt", hint))
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
        elif kind == "stop":
            self.status_bar.run_state = "stopping after this turn"
        return command

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _send_queued(self, kind: str, value: str = "", why: str = "") -> None:
        """Ask for a steer or follow-up and send or queue it. ``value`` and ``why``: the text
        of one that could not be sent, offered again as typed, and why it was not sent."""
        words = KIND_WORDS[kind]
        hint = _HINTS[kind]
        if self.elsewhere is not None and self.elsewhere.lease is not None:
            lease = self.elsewhere.lease
            hint += f" It goes to process {lease.pid} on {clean(lease.host)}, which runs the thread."
        elif not self.running:
            hint = "The agent is idle: you will be asked to send this as a new prompt."
        elif not self.session.keeps_commands:
            hint += " This database keeps no commands: it waits in this app's memory (quitting drops it)."
        if why:
            hint = f"Not sent: {why} Press Enter to try again, or Escape to drop it. {hint}"
        text = await self.app.push_screen_wait(TextInputModal(words, hint, value=value))
        if not text:
            return
        if self.session.keeps_commands and (self.running or self.elsewhere is not None):
            # Here or elsewhere alike, through the command table: kept across a quit or a crash.
            try:
                command = await self.session.send(self.thread_id, kind, text)  # type: ignore[arg-type]
            except ThreadCrashedError as error:
                self.notify(clean(error), severity="error", timeout=10, markup=False)
                return
            except ThreadNotRunningError:
                pass  # its run ended meanwhile: offer a new prompt below
            except CubepiError as error:
                self._send_queued(kind, text, str(error))  # e.g. the database stayed locked: keep the text
                return
            else:
                self._track_sent(command)
                self.notify(f"{words} #{command.seq} queued ({self._queue_keys('it')}).", markup=False)
                return
        else:
            agent = self.session.agents.get(self.thread_id)
            try:
                if agent is None:
                    raise RunError("The agent is not running.")
                {"steer": agent.steer, "follow_up": agent.follow_up, "interrupt": agent.interrupt, "note": agent.note}[
                    kind
                ](text)
            except RunError:
                pass
            else:
                self.notify(f"{words} queued in this app only: this database keeps no commands, so quitting drops it.")
                return
        question = Text("The agent is not running. Send this as a new prompt?\n\n")
        question.append_text(literal(text))
        if await self.app.push_screen_wait(ConfirmModal(f"{words}: agent idle", question, yes="Send")):
            self.start_run("prompt", text)

    # --- the queue of steers and follow-ups ---------------------------------------------

    @work(exclusive=True, exit_on_error=False, group="queue")
    async def _watch_queue(self) -> None:
        """While a run goes on here, list its commands' progress as the store has it (a run
        elsewhere is followed, and its commands with it); once more after it ended."""
        while True:
            running = self.session.is_running(self.thread_id) or self.session.runs.get(self.thread_id) is not None
            try:
                for command in await self.session.commands(self.thread_id):
                    self._command_seen(command)
            except CubepiError:
                pass  # a locked or lost database: the next look tries again
            if not running:
                return
            await asyncio.sleep(QUEUE_POLL)

    @work(exclusive=True, exit_on_error=False, group="undelivered")
    async def _offer_undelivered(self) -> None:
        """The run here ended with steers or follow-ups it never delivered: list them and
        offer to send them now (as a new run) or keep them for later; never dropped unasked."""
        try:
            found = await self.session.undelivered(self.thread_id)
        except CubepiError:
            return
        self.commands_bar.set_idle(True)
        for command in found:
            self._command_seen(command)
        if not found or self.session.ending:
            return
        if self.running:
            return
        if self.app.screen is not self:
            # A dialog is open (a steer being typed): never cut it off; ask once it closes.
            self._offer_when_back = True
            return
        question = Text(
            f"The run ended before {counted(len(found), 'steer or follow-up', 'steers and follow-ups')} "
            "reached the agent:\n\n"
        )
        for command in found:
            question.append(f"{KIND_WORDS[command.kind]} #{command.seq}: ")
            question.append_text(literal(command.text))
            question.append("\n")
        question.append(f"\nSend them now as a new run? (Or keep them: {self._queue_keys('one')}.)")
        if await self.app.push_screen_wait(ConfirmModal("Not delivered", question, yes="Send", no="Keep")):
            self._first_undelivered = found[0]
            self.start_run("undelivered", found[0].text)

    @on(events.ScreenResume)
    def _back_on_top(self) -> None:
        if self._offer_when_back:
            self._offer_when_back = False
            self._offer_undelivered()

    def action_queued(self) -> None:
        """Select the next queued steer or follow-up (round to the first)."""
        chosen = self.commands_bar.select_next()
        if chosen is None:
            self.notify("No steer or follow-up is waiting to be delivered.", timeout=4, markup=False)

    def action_edit_queued(self) -> None:
        """Edit the selected queued steer or follow-up (c selects one)."""
        chosen = self.commands_bar.chosen() or self.commands_bar.select_next()
        if chosen is None:
            self.notify("No steer or follow-up is waiting to be delivered.", timeout=4, markup=False)
            return
        self._edit_queued(chosen)

    def action_cancel_queued(self) -> None:
        """Cancel the selected queued steer or follow-up (c selects one)."""
        chosen = self.commands_bar.chosen() or self.commands_bar.select_next()
        if chosen is None:
            self.notify("No steer or follow-up is waiting to be delivered.", timeout=4, markup=False)
            return
        self._cancel_queued(chosen)

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _edit_queued(self, command: Command, value: str | None = None) -> None:
        words = KIND_WORDS[command.kind]
        hint = f"Edit {words.lower()} #{command.seq}; it is sent as edited unless the run took it at a turn boundary first."
        text = await self.app.push_screen_wait(
            TextInputModal(f"{words} #{command.seq}", hint, value=command.text if value is None else value)
        )
        if not text or text == command.text:
            return
        try:
            edited = await self.session.edit_command(command, text)
        except CommandRaced as raced:
            current: Command = raced.command  # type: ignore[assignment]
            self._command_seen(current)
            if current.status == "pending":
                # Edited from another window meanwhile, still queued: edit it again, as it
                # reads now, with the text typed here (a new steer would send both).
                self.notify(clean(raced), severity="warning", timeout=8, markup=False)
                self._edit_queued(current, raced.text)
                return
            # Nothing lost: the edit is offered again, as a new message of the same kind.
            self._send_queued(command.kind, raced.text, str(raced))
            return
        except CubepiError as error:
            self.notify(clean(error), severity="error", timeout=10, markup=False)
            return
        self._track_sent(edited)
        if edited.seq != command.seq:  # replaced (its run had ended): the old one is discarded
            self._command_seen(replace(command, status="discarded", note=f"replaced by #{edited.seq}"))
        self.commands_bar.selected = edited.seq
        self.notify(f"{words} #{edited.seq} edited.", markup=False)
        if not self.running and self.elsewhere is None:
            self._offer_undelivered()

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _cancel_queued(self, command: Command) -> None:
        try:
            cancelled = await self.session.cancel_command(command)
        except CommandRaced as raced:
            self._command_seen(raced.command)  # type: ignore[arg-type]
            self.notify(clean(raced), severity="warning", timeout=8, markup=False)
            return
        except CubepiError as error:
            self.notify(clean(error), severity="error", timeout=10, markup=False)
            return
        self._command_seen(cancelled)
        self.notify(f"{KIND_WORDS[command.kind]} #{command.seq} cancelled.", markup=False)
        if not self.running and self.elsewhere is None:
            self._offer_undelivered()


_HINTS = {
    "steer": "Read by the agent before its next model call.",
    "interrupt": "The running tools are aborted (as abort does); then the agent reads this and goes on.",
    "follow_up": "Delivered when the agent has finished its current work.",
    "note": "Delivered with the next turn; it never wakes an agent that is done.",
}
"""What each kind of queued message does, said in its dialog."""

QUEUE_POLL = 0.3
"""Seconds between two looks at the command table while a run goes on here: a queued steer
shows "delivered" about this long after its runner took it (the runner itself is woken by
the store's change signals)."""


class _PromptSaved:
    """Notes whether a run's prompt was saved, from the agent's ``message_end`` events."""

    def __init__(self) -> None:
        self.saved = False
        self._unsubscribe: Callable[[], None] | None = None

    def watch(self, agent: Agent) -> Agent:
        """Start listening to ``agent`` (returned, for chaining)."""
        self._unsubscribe = agent.subscribe(self._note)
        return agent

    def _note(self, event: AgentEvent) -> None:
        if not isinstance(event, MessageEnd) or not event.persisted:
            return
        message = event.message
        if isinstance(message, UserMessage) and (message.metadata or {}).get("kind", "prompt") == "prompt":
            self.saved = True

    def stop(self) -> None:
        """Stop listening; idempotent."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
