"""Supervision across processes, the runner side: run an agent so others can watch and steer it through the store.

Wrap any :class:`~core.agent.Agent` in a :class:`Supervisor`::

    async with Supervisor(agent) as sup:          # store: agent.checkpointer
        outcome = await sup.prompt("Summarise README.md")

While a run lasts the supervisor (the agent itself holds the thread's lease and
heartbeats it, see :mod:`core.leases`):

* writes text and thinking deltas, tool progress and message/tool start/end markers to
  the store's bounded live-event log, batched every ``batch_interval`` seconds (one
  transaction per batch, see :class:`core.live.LiveLog`), and prunes the log when the
  run ends;
* watches the command table (the store's change signals + change token, a fallback check every
  ``command_poll`` seconds) and applies abort, steer and follow-up commands, moving each
  ``pending`` -> ``delivered`` -> ``applied`` (abort: the run stopped; steer/follow-up:
  its user message was persisted, the note naming the turn of the run that read it,
  :func:`~core.commands.turn_note`), or ``refused`` with a note (an abort that came too
  late). An abort, a stop or an interrupting steer is ``delivered`` when it is read (it
  acts at once); a steer, note or follow-up is ``delivered`` only when the loop takes it
  at a turn boundary (or when the agent would stop), so until then it can be edited or
  cancelled (:func:`~core.commands.edit`, :func:`~core.commands.cancel`) and the edit is
  what the model reads; a crash before that leaves it ``pending``. A steer or follow-up the run ended before
  delivering (an abort, a provider error, the last turn over) is never refused: it stays
  ``pending``, or ``delivered`` when the agent had it but its message was never saved, and
  after the run :func:`core.commands.undelivered` offers it again (send or discard). A command settled meanwhile by
  someone else (discarded from another window, say) is left as it is and never handed over.

The app side is :mod:`core.commands`: :func:`~core.commands.send` queues a command for a
thread running elsewhere and refuses in one sentence when no live lease exists;
:func:`~core.commands.undelivered` and :func:`~core.commands.discard` handle steers and
follow-ups a crashed runner never delivered (``Supervisor.resume(include_pending=True)``
sends them with the resume). Whether a thread runs here, elsewhere, or crashed is
:func:`core.lease_status.lease_status`.

Commands carry their sequence number into the conversation: a delivered steer's user
message has ``metadata["command_seq"]``, so after a crash a command can be matched with
what was persisted and is never delivered twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from core.agent import Agent, OnPlan
from core.changes import StoreWatch
from core.checkpoint.base import TEXTLESS_KINDS, Command, CommandStatus
from core.checkpoint.capabilities import LIVE, LiveStore, lacking
from core.commands import ABORT_TOO_LATE, discard, settle, turn_note, undelivered
from core.errors import AgentBusyError, CommandTransitionError, ConflictError, EmptyMessageError, RunError
from core.events import AgentEnd, AgentEvent, AgentStart, MessageEnd, MessageStart, RunOutcome, TurnStart
from core.lease_status import lease_status
from core.live import BATCH_INTERVAL, KEEP, LiveLog
from core.messages import UserMessage, user_text
from core.recovery import ResumePlan, SettleChoice

_log = logging.getLogger(__name__)

_CLAIMED_KINDS = frozenset({"steer", "note", "follow_up"})
"""Kinds that wait in the agent's queue still pending (editable) until the loop takes them."""

_LATER = object()
"""What :meth:`Supervisor._claimed` gives for a command to try again at the next turn boundary."""

_CLAIM_TRIES = 5
"""Compare-and-set attempts to claim one command that keeps being edited meanwhile at one
turn boundary (each edit is a person typing, so a handful is plenty; after that it waits
for the next boundary)."""

STALE_ABORT = "sent to an earlier run that had already ended"
"""The note on an abort left pending by an earlier run, refused when the next run starts."""


class Supervisor:
    """Runs one :class:`~core.agent.Agent` so other processes can follow and command it.

    ``store`` is the agent's store (default ``agent.checkpointer``; another connection to
    the same database also works) and must declare the capabilities in
    :data:`core.checkpoint.capabilities.LIVE` (leases, live events, commands, change
    notification). ``signals`` whether the store's change signals wake the command
    watch (see :class:`core.changes.StoreWatch`). ``batch_interval`` (seconds) paces
    live-event writes, ``keep`` bounds the thread's live-event log, ``command_poll``
    (seconds) is the fallback check for commands when a signal is missed (default 1.0;
    0.05 without signals), ``watch_step_ms`` the signals' quiet period (an abort lands in
    about twice that). Raises ``TypeError`` for a store that lacks one of them.

    ``prompt`` and ``resume`` return the run's outcome like the agent's methods and raise
    the same errors (``AgentBusyError`` also while this supervisor runs one already); ``live`` (the :class:`~core.live.LiveLog` of the last run) counts
    the batches and rows written.
    """

    def __init__(
        self,
        agent: Agent,
        store: LiveStore | None = None,
        *,
        signals: bool = True,
        batch_interval: float = BATCH_INTERVAL,
        keep: int = KEEP,
        command_poll: float | None = None,
        watch_step_ms: int = 50,
    ) -> None:
        chosen = agent.checkpointer if store is None else store
        missing = lacking(chosen, LIVE)
        if missing:
            raise TypeError(
                f"{type(chosen).__name__} keeps no live events or commands, so its runs cannot be supervised "
                f"(it does not declare {', '.join(c.__name__ for c in missing)} of core.checkpoint.capabilities)."
            )
        self.agent = agent
        self.store: LiveStore = chosen  # type: ignore[assignment]  # checked part by part just above
        self.thread_id = agent.thread_id
        self.signals = signals
        self.batch_interval = batch_interval
        self.keep = keep
        self.command_poll = command_poll
        self.watch_step_ms = watch_step_ms
        self.live: LiveLog | None = None
        self._active = False
        self._lock = asyncio.Lock()  # serialises command handling with the end of a run
        self._reset()

    def _reset(self) -> None:
        self._baseline = 0
        self._started = asyncio.Event()
        self._ending = False
        self._seen: set[int] = set()
        self._aborts: list[tuple[int, str]] = []  # (seq, kind) of aborts and stops delivered
        # command seq -> its user message with the agent: queued (the command still pending,
        # claimed when the loop takes it) or in flight (delivered, applied once saved)
        self._queued: dict[int, UserMessage] = {}
        self._inflight: dict[int, UserMessage] = {}
        self._carry: list[Command] = []
        self._turns = 0  # turns begun in this run: an applied steer's note names its turn

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Nothing to release between runs (the store belongs to the caller); here for ``async with``."""

    # --- runs ------------------------------------------------------------------------------

    async def prompt(self, text: str, *, include_pending: bool = False, accept_changes: bool = False) -> RunOutcome:
        """Run the agent on the user message ``text``, supervised; see ``Agent.prompt``
        (``accept_changes`` as there: go on past a changed agent definition, recorded).

        With ``include_pending``, :func:`~core.commands.undelivered` steers and follow-ups are sent with
        the run (steers right after the prompt, follow-ups when the agent would stop)."""
        return await self._supervised(lambda: self.agent.prompt(text, accept_changes=accept_changes), include_pending)

    async def start(
        self,
        text: str,
        *,
        include_pending: bool = False,
        accept_changes: bool = False,
        on_plan: OnPlan | None = None,
    ) -> RunOutcome:
        """Create the thread with the first input ``text``, idempotently, supervised; see
        ``Agent.start`` (its errors too; ``on_plan`` as there); ``include_pending`` as for :meth:`prompt`."""
        return await self._supervised(
            lambda: self.agent.start(text, accept_changes=accept_changes, on_plan=on_plan), include_pending
        )

    async def resume(
        self,
        choices: Mapping[str, SettleChoice] | None = None,
        *,
        include_pending: bool = False,
        accept_changes: bool = False,
        on_plan: OnPlan | None = None,
    ) -> RunOutcome:
        """Resume a crashed thread, supervised; see ``Agent.resume`` (``accept_changes`` and
        ``on_plan``, told the plan before it is carried out, as there).

        With ``include_pending``, steers and follow-ups the crashed runner never delivered
        become steers and follow-ups of the resumed run (after dangling calls are
        settled, before the model is called). If the plan is to wait for the user (no run
        starts) they stay undelivered; send them as a new prompt."""
        return await self._supervised(
            lambda: self.agent.resume(choices, accept_changes=accept_changes, on_plan=on_plan), include_pending
        )

    async def plan_resume(self) -> ResumePlan:
        """What :meth:`resume` would do; see ``Agent.plan_resume``."""
        return await self.agent.plan_resume()

    async def pending(self) -> list[Command]:
        """:func:`~core.commands.undelivered` for this thread."""
        return await undelivered(self.store, self.thread_id)

    async def discard(self, seqs: Sequence[int] | None = None) -> list[Command]:
        """:func:`core.commands.discard` for this thread."""
        return await discard(self.store, self.thread_id, seqs)

    def abort(self) -> None:
        """Abort the run in progress from this process (a no-op when idle)."""
        self.agent.abort()

    async def _supervised(self, run: Callable[[], Awaitable[RunOutcome]], include_pending: bool) -> RunOutcome:
        if self._active:
            raise AgentBusyError("This supervisor is already running the agent; wait for the run to end or abort it.")
        self._active = True
        try:
            return await self._supervised_run(run, include_pending)
        finally:
            self._active = False

    async def _supervised_run(self, run: Callable[[], Awaitable[RunOutcome]], include_pending: bool) -> RunOutcome:
        self._reset()
        existing = await self.store.list_commands(self.thread_id)
        # Commands sent before this run belong to earlier runs: only newer ones are ours.
        self._baseline = max((c.seq for c in existing), default=0)
        if include_pending:
            self._carry = await undelivered(self.store, self.thread_id)
        live = self.live = LiveLog(self.store, self.thread_id, interval=self.batch_interval, keep=self.keep)
        unsubscribe = self.agent.subscribe(self._on_event)
        unclaim = self.agent.claim_with(self._claim)
        watcher = asyncio.create_task(self._watch_commands(), name=f"commands {self.thread_id}")
        try:
            return await run()
        finally:
            unclaim()
            unsubscribe()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await live.close()
            if self._started.is_set():
                # Only a run that held the lease may touch the thread's commands and log:
                # a refused start (another runner holds it) leaves them to that runner.
                await self._after_run()

    async def _after_run(self) -> None:
        try:
            lease = await self.store.get_lease(self.thread_id)
            if (
                lease is not None
                and lease.holder_id != self.agent.holder.holder_id
                and lease_status(lease, (), time.time()).live
            ):
                # This run lost its lease and another runner holds the thread now: the
                # pending commands and the live log are that runner's, not ours to settle.
                return
            async with self._lock:
                self._ending = True
                # The lease is released by now, so `send` refuses anything newer. An abort
                # that slipped in before is answered here; a steer or follow-up stays
                # pending for the user to send or discard (`undelivered`).
                for c in await self.store.list_commands(self.thread_id, ["pending"]):
                    if c.seq > self._baseline and c.seq not in self._seen and c.kind in TEXTLESS_KINDS:
                        await self._update(c.seq, "refused", ABORT_TOO_LATE)
            await self.store.prune_live_events(self.thread_id)
        except Exception:
            _log.warning("could not tidy up after the run of thread %s", self.thread_id, exc_info=True)

    # --- the agent's events ----------------------------------------------------------------

    async def _on_event(self, event: AgentEvent) -> None:
        live = self.live
        if live is None:
            return
        messages = self.agent.state.messages
        if isinstance(event, AgentStart):
            live.start()
            live.add(event, 0)
            self._started.set()
            await self._on_start()
            return
        if isinstance(event, TurnStart):
            self._turns += 1
        if isinstance(event, MessageStart):
            live.add(event, len(messages))
        elif isinstance(event, MessageEnd):
            # The loop appended the message to the state before emitting this.
            live.add(event, len(messages) - 1)
            seq = event.message.metadata.get("command_seq") if isinstance(event.message, UserMessage) else None
            if seq in self._inflight:
                del self._inflight[seq]
                if event.persisted:
                    await self._update(seq, "applied", turn_note(self._turns))
                else:
                    # Not saved (the run fails or lost its lease): it stays delivered, so
                    # `undelivered` offers it again once the run is over.
                    _log.warning("the message of command %s was not saved; it stays undelivered", seq)
        elif isinstance(event, AgentEnd):
            live.add(event, len(messages))
            await live.flush()
            await self._on_end(event.outcome)
        else:
            live.add(event, len(messages))

    async def _on_start(self) -> None:
        async with self._lock:
            for c in await self.store.list_commands(self.thread_id, ["pending", "delivered"]):
                if c.seq <= self._baseline and c.kind in TEXTLESS_KINDS:
                    await self._update(c.seq, "refused", STALE_ABORT)
            for c in self._carry:
                self._seen.add(c.seq)
                await self._hand_over(c)
            self._carry = []

    async def _on_end(self, outcome: RunOutcome) -> None:
        async with self._lock:
            self._ending = True
            for seq, kind in self._aborts:
                # An abort ends the run "aborted"; a stop after the turn too, or "completed"
                # when that turn gave the final reply (no further model call either way).
                if outcome == "aborted" or (kind == "stop" and outcome == "completed"):
                    await self._update(seq, "applied")
                else:
                    await self._update(seq, "refused", f"{ABORT_TOO_LATE} (it {outcome})")
            self._aborts = []
            state = self.agent.state
            for message in [*self._queued.values(), *self._inflight.values()]:
                # Never delivered: take it back so it cannot wake a later run unasked. It stays
                # `pending` (or `delivered` with no message saved), so `undelivered` offers it again.
                state.pending_steers[:] = [m for m in state.pending_steers if m is not message]
                state.pending_follow_ups[:] = [m for m in state.pending_follow_ups if m is not message]
                state.pending_notes[:] = [m for m in state.pending_notes if m is not message]
            self._queued.clear()
            self._inflight.clear()

    # --- commands --------------------------------------------------------------------------

    async def _watch_commands(self) -> None:
        await self._started.wait()
        poll = self.command_poll
        watch = StoreWatch(self.store, signals=self.signals, step_ms=self.watch_step_ms, poll=poll)
        try:
            async with watch:
                await self._check_commands()
                while not self._ending:
                    if await watch.wait():
                        await self._check_commands()
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("the command watch of thread %s stopped", self.thread_id)

    async def _check_commands(self) -> None:
        async with self._lock:
            if self._ending:
                return
            for c in await self.store.list_commands(self.thread_id, ["pending"]):
                if c.seq <= self._baseline or c.seq in self._seen:
                    continue
                self._seen.add(c.seq)
                await self._hand_over(c)

    async def _hand_over(self, c: Command) -> None:
        """Give one command to the agent (lock held). An abort, a stop or an interrupting
        steer acts at once, so it is marked delivered before the agent sees it; a steer,
        note or follow-up waits in the agent's queue still ``pending`` (editable and
        cancellable) until the loop takes it (:meth:`_claim`). "Applied" (written when its
        message is saved) always comes after "delivered"; a command settled meanwhile
        (discarded from another window) is not handed over."""
        if self._ending or not self.agent.state.is_running:
            if c.kind in TEXTLESS_KINDS:
                await self._update(c.seq, "refused", ABORT_TOO_LATE)
            return  # a steer or follow-up stays pending for the user (`undelivered`)
        if c.kind in _CLAIMED_KINDS:
            self._queue(c)
            return
        if not await self._update(c.seq, "delivered"):
            return
        if self._ending:  # the run ended while the update was written
            if c.kind in TEXTLESS_KINDS:
                await self._update(c.seq, "refused", ABORT_TOO_LATE)
            return  # delivered with no message saved: `undelivered` offers it again
        agent = self.agent
        if c.kind in TEXTLESS_KINDS:
            self._aborts.append((c.seq, c.kind))
            (agent.abort if c.kind == "abort" else agent.stop_after_turn)()
            return
        try:
            agent.interrupt(c.text)
        except EmptyMessageError as exc:
            await self._update(c.seq, "refused", str(exc))
            return
        except RunError:
            return  # the run ended first: delivered with no message saved, offered again
        message = agent.state.pending_steers[-1]
        message.metadata["command_seq"] = c.seq
        self._inflight[c.seq] = message

    def _queue(self, c: Command) -> None:
        """Put a steer, note or follow-up in the agent's queue, its command left as it is."""
        agent = self.agent
        try:
            if c.kind == "steer":
                agent.steer(c.text)
                message = agent.state.pending_steers[-1]
            elif c.kind == "note":
                agent.note(c.text)
                message = agent.state.pending_notes[-1]
            else:
                agent.follow_up(c.text)
                message = agent.state.pending_follow_ups[-1]
        except (EmptyMessageError, RunError):
            # Empty (the store refuses those at `send`) or the run just ended: it stays
            # with the user (`undelivered`), never refused for them.
            return
        message.metadata["command_seq"] = c.seq
        self._queued[c.seq] = message
        _log.debug(
            "command %s (%s) queued with the agent for its next turn", c.seq, c.kind, extra={"command_seq": c.seq}
        )

    async def _claim(self, taken: list[UserMessage]) -> list[UserMessage]:
        """The agent's :data:`~core.agent.Claim`: mark each queued command among ``taken``
        delivered now, by compare-and-set at its revision as stored, with its text as
        stored (an edit made while it waited wins); one discarded meanwhile is dropped.
        One that cannot be claimed now (the store failed, or it kept being edited) goes
        back to the agent's queue for the next boundary, still pending: never delivered
        while its row says otherwise, never lost (logged)."""
        async with self._lock:
            if not any(m.metadata.get("command_seq") in self._queued for m in taken):
                return taken
            try:
                rows = {c.seq: c for c in await self.store.list_commands(self.thread_id, ["pending", "delivered"])}
            except Exception:
                _log.warning("could not read the commands of thread %s; they wait for the next turn", self.thread_id)
                rows = None
            kept: list[UserMessage] = []
            for message in taken:
                seq = message.metadata.get("command_seq")
                if seq not in self._queued:
                    kept.append(message)
                    continue
                claimed = _LATER if rows is None else await self._claimed(rows.get(seq), message)
                if claimed is _LATER:
                    self._requeue(message)
                    continue
                del self._queued[seq]
                if isinstance(claimed, UserMessage):
                    self._inflight[seq] = claimed
                    kept.append(claimed)
            return kept

    def _requeue(self, message: UserMessage) -> None:
        """Put a queued command's message back in the agent's queue (it stays in ``_queued``)."""
        state = self.agent.state
        queue = {"steer": state.pending_steers, "note": state.pending_notes}.get(
            message.metadata.get("kind", ""), state.pending_follow_ups
        )
        queue.append(message)

    async def _claimed(self, row: Command | None, message: UserMessage) -> UserMessage | object | None:
        """``message`` as its command ``row`` now reads, marked delivered; ``None`` when the
        command is no longer the agent's to take (discarded, or edited and then discarded);
        :data:`_LATER` when it cannot be claimed now (see :meth:`_claim`)."""
        for _ in range(_CLAIM_TRIES):
            if row is None:
                return None
            try:
                row = await self.store.update_command(row.seq, "delivered", expected_revision=row.revision)
                if row.text == message.text:
                    return message
                edited = user_text(row.text, kind=message.metadata.get("kind", row.kind))
                edited.metadata.update({**message.metadata, "kind": edited.metadata["kind"]})
                edited.run_id = message.run_id
                return edited
            except (CommandTransitionError, ConflictError):
                try:
                    current = await self.store.list_commands(self.thread_id, ["pending", "delivered"])
                except Exception:
                    break
                row = next((c for c in current if c.seq == row.seq), None)
            except Exception:
                _log.warning("could not mark command %s delivered", row.seq, exc_info=True)
                break
        _log.warning(
            "command %s could not be claimed at this turn; it waits for the next", message.metadata.get("command_seq")
        )
        return _LATER

    async def _update(self, seq: int, status: CommandStatus, note: str = "") -> bool:
        """Move a command to ``status``; False only when it was settled meanwhile (the
        store refused the move). Other store errors are logged: the run goes on."""
        try:
            return await settle(self.store, seq, status, note) is not None
        except Exception:
            _log.warning("could not mark command %s %s", seq, status, exc_info=True)
            return True
