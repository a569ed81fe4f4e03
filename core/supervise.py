"""Supervision across processes: run an agent so others can watch and steer it through the store.

Runner side - wrap any :class:`~core.agent.Agent` in a :class:`Supervisor`::

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
  ``pending`` -> ``delivered`` (read and handed to the agent) -> ``applied`` (abort: the
  run stopped; steer/follow-up: its user message was persisted), or ``refused`` with a
  note (a steer that arrives after the run ended: "run ended; send it as a new prompt").
  A steer or follow-up whose message could not be saved stays ``delivered``: after the
  run :func:`undelivered` lists it again. A command settled meanwhile by someone else
  (discarded from another window, say) is left as it is and never handed over.

App side - :func:`send` queues a command for a thread running elsewhere and refuses in
one sentence when no live lease exists; :func:`lease_status` says whether a thread runs
here, elsewhere, or crashed; :func:`undelivered` and :func:`discard` handle steers and
follow-ups a crashed runner never delivered (``Supervisor.resume(include_pending=True)``
sends them with the resume).

Commands carry their sequence number into the conversation: a delivered steer's user
message has ``metadata["command_seq"]``, so after a crash a command can be matched with
what was persisted and is never delivered twice.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from core.agent import Agent, OnPlan
from core.changes import StoreWatch
from core.checkpoint.base import (
    Command,
    CommandKind,
    CommandStatus,
    Lease,
    RunRecord,
    check_command_kind,
    thread_unavailable,
)
from core.checkpoint.capabilities import LIVE, Commands, CommandStore, LiveStore, OwnerScoped, lacking, supports
from core.errors import AgentBusyError, CommandTransitionError, EmptyMessageError, RunError
from core.events import AgentEnd, AgentEvent, AgentStart, MessageEnd, MessageStart, RunOutcome
from core.leases import host_id, pid_alive
from core.live import BATCH_INTERVAL, KEEP, LiveLog
from core.messages import UserMessage
from core.owners import UNOWNED
from core.recovery import ResumePlan, SettleChoice

_log = logging.getLogger(__name__)

RUN_ENDED = "run ended; send it as a new prompt"
"""The note on a steer or follow-up that reached a runner after (or as) its run ended."""

ABORT_TOO_LATE = "run ended before the abort took effect"
"""The note on an abort that reached a runner whose run had already ended."""

STALE_ABORT = "sent to an earlier run that had already ended"
"""The note on an abort left pending by an earlier run, refused when the next run starts."""

ORPHANED_ABORT = "its runner stopped before taking it; nothing is running to abort"
"""The note on an abort whose runner died (its lease is no longer live) before applying it."""

# --- where a thread runs ------------------------------------------------------------------------


class LeaseState(enum.StrEnum):
    """What a thread's lease record says about it."""

    NONE = "none"
    """No lease: nobody runs the thread (or its runner released the lease when it ended)."""
    RUNNING_HERE = "running_here"
    """A live lease held by this process."""
    RUNNING_ELSEWHERE = "running_elsewhere"
    """A live lease held by another process (maybe another machine)."""
    CRASHED = "crashed"
    """The lease is stale (expired, or its holder's process on this host is gone) and its
    run never completed: the runner died. Only now may the thread be resumed."""
    ENDED = "ended"
    """The lease is stale but its run completed (the runner ended without releasing)."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """:func:`lease_status`'s verdict: ``state``, the ``lease`` it read, and at ``now``
    (unix seconds) the heartbeat's age and the seconds left until expiry (negative once
    expired). ``gone`` is true when the holder's process on this host no longer exists."""

    state: LeaseState
    lease: Lease | None = None
    heartbeat_age: float | None = None
    expires_in: float | None = None
    gone: bool = False

    @property
    def live(self) -> bool:
        """Whether someone runs the thread right now (here or elsewhere)."""
        return self.state in (LeaseState.RUNNING_HERE, LeaseState.RUNNING_ELSEWHERE)

    @property
    def may_resume(self) -> bool:
        """Whether a new run may take the thread: never while a live lease exists."""
        return not self.live

    def at(self, now: float) -> LeaseView:
        """This view of a run elsewhere, or of a crashed one, as it reads at ``now`` (unix
        seconds): the heartbeat's age and the time left (negative: since expiry) move on
        while no new heartbeat is read. The state is kept: whether the lease expired is
        decided from the store (:func:`lease_status`). Views in other states are returned
        unchanged."""
        if self.lease is None or self.state not in (LeaseState.RUNNING_ELSEWHERE, LeaseState.CRASHED):
            return self
        return replace(self, heartbeat_age=now - self.lease.heartbeat_at, expires_in=self.lease.expires_at - now)

    @property
    def label(self) -> str:
        """Short text for a list, naming the lease holder's host (cut to :data:`HOST_CHARS`):
        "running here", "running on build-7 (pid 412, beat 2 s ago)", "crashed on build-7
        (lease expired 40 s ago)", "crashed on build-7 (pid 412 gone)", else "not running".
        The host comes from the store: show it as untrusted text."""
        lease = self.lease
        if self.state is LeaseState.RUNNING_HERE:
            return "running here"
        if lease is None:
            return "not running"
        host = lease.host if len(lease.host) <= HOST_CHARS else lease.host[: HOST_CHARS - 1] + "…"
        if self.state is LeaseState.RUNNING_ELSEWHERE:
            return f"running on {host} (pid {lease.pid}, beat {_ago(self.heartbeat_age)})"
        if self.state is LeaseState.CRASHED:
            return f"crashed {self.crash_place}"
        return "not running"

    @property
    def crash_place(self) -> str:
        """Where and how a crashed lease's holder ended, to follow a crash's own words:
        "on build-7 (lease expired 40 s ago)", "on build-7 (pid 412 gone)"; empty unless
        the state is ``CRASHED``. The host is cut as in :attr:`label` and comes from the store."""
        lease = self.lease
        if self.state is not LeaseState.CRASHED or lease is None:
            return ""
        host = lease.host if len(lease.host) <= HOST_CHARS else lease.host[: HOST_CHARS - 1] + "…"
        why = f"pid {lease.pid} gone" if self.gone else f"lease expired {_ago(-(self.expires_in or 0.0))}"
        return f"on {host} ({why})"


HOST_CHARS = 20
"""A lease holder's host is cut to this many characters in :attr:`LeaseView.label`, so a
thread's state stays one short cell of the picker at 80 columns; sentences name it whole."""


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "at an unknown time"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def lease_status(
    lease: Lease | None,
    runs: Sequence[RunRecord] = (),
    now: float | None = None,
    *,
    host: str | None = None,
    pid: int | None = None,
    alive: Callable[[int], bool] = pid_alive,
) -> LeaseView:
    """Say whether a thread runs here, elsewhere, or crashed, from its ``lease`` record.

    ``runs`` are the thread's run records (to tell a crashed run from a completed one);
    ``now`` is unix seconds (default: now); ``host`` and ``pid`` say who "here" is
    (default: :func:`core.leases.host_id` and this process); ``alive(pid)`` probes a process
    on this host.

    The rule is :func:`core.leases.is_stale`'s, the one that decides whether another
    runner may take the thread over: a lease is stale once ``expires_at <= now``, or at
    once when it was taken on this host by a process that no longer exists. A stale lease
    whose run did not complete is ``CRASHED``; a lease on another host therefore shows
    as running until it expires, even if that machine died, and even when a process of
    that pid is gone here. Pure apart from ``alive`` and reading the host id; raises only
    ``HostIdError`` (a bad ``CUBEPI_HOST_ID``).
    """
    if lease is None:
        return LeaseView(LeaseState.NONE)
    now = time.time() if now is None else now
    host = host_id() if host is None else host
    pid = os.getpid() if pid is None else pid
    age, left = now - lease.heartbeat_at, lease.expires_at - now
    same_host = lease.host == host
    if lease.expires_at > now:
        if same_host and lease.pid == pid:
            return LeaseView(LeaseState.RUNNING_HERE, lease, age, left)
        if not same_host or alive(lease.pid):
            return LeaseView(LeaseState.RUNNING_ELSEWHERE, lease, age, left)
        gone = True
    else:
        gone = same_host and not alive(lease.pid)
    run = next((r for r in runs if r.run_id == lease.run_id), None) if lease.run_id else None
    state = LeaseState.ENDED if run is not None and run.completed else LeaseState.CRASHED
    return LeaseView(state, lease, age, left, gone)


# --- commands from the app side -----------------------------------------------------------------


class ThreadNotRunningError(RunError):
    """Raised by :func:`send` when the thread has no live lease (it finished or never ran;
    see :class:`ThreadCrashedError` for a crash); ``view`` is the :class:`LeaseView` read."""

    def __init__(self, message: str, *, view: LeaseView | None = None) -> None:
        super().__init__(message)
        self.view = view


class ThreadCrashedError(ThreadNotRunningError):
    """Raised by :func:`send` when the thread's runner crashed (a stale lease, run not completed)."""


class CommandError(RunError):
    """Raised by :func:`send` for a command that cannot be sent as given (a steer without
    text), and by :func:`discard` while a run holds the thread (its commands are in flight)."""


async def send(store: CommandStore, thread_id: str, kind: CommandKind, text: str = "") -> Command:
    """Queue ``kind`` (``"abort"``, ``"steer"`` or ``"follow_up"``) for the run of ``thread_id``
    and return the ``pending`` command; its runner's :class:`Supervisor` takes it from there.

    Raises :class:`ThreadCrashedError` when the thread's runner crashed ("resume it
    first"), :class:`ThreadNotRunningError` when no run holds a live lease (for a steer
    or follow-up the sentence says to send it as a new prompt), ``ThreadNotFoundError``
    (:func:`~core.checkpoint.base.thread_unavailable`) when the thread is missing or
    another owner's (the store sees neither, so both read the same), :class:`CommandError`
    for a steer or follow-up without text, ``ValueError`` for another ``kind``, and the
    store's errors. A run that ends between the check and the insert is caught by a
    second look at the lease: the command is then marked ``refused`` and the same error
    raised. For an agent running in this process without a Supervisor, call its methods.
    """
    check_command_kind(kind)
    if kind != "abort" and not text.strip():
        raise CommandError(f"A {_kind_words(kind)} needs some text.")
    lease = await store.get_lease(thread_id)
    view = lease_status(lease, (), time.time())
    if lease is None and await store.load(thread_id) is None:
        # Not this owner's thread, or none at all: the store's reads cannot tell which.
        raise thread_unavailable(thread_id, store.owner if supports(store, OwnerScoped) else UNOWNED)
    if not view.live:
        raise await _refusal(store, thread_id, kind, lease)
    command = await store.send_command(thread_id, kind, text)
    lease = await store.get_lease(thread_id)
    if not lease_status(lease, (), time.time()).live:
        error = await _refusal(store, thread_id, kind, lease)
        # Only if the runner did not take it meanwhile (a runner never delivers after its run ended).
        if any(c.seq == command.seq for c in await store.list_commands(thread_id, ["pending"])):
            await _settle(store, command.seq, "refused", RUN_ENDED if kind != "abort" else ABORT_TOO_LATE)
        raise error
    return command


async def _refusal(store: CommandStore, thread_id: str, kind: str, lease: Lease | None) -> ThreadNotRunningError:
    data = await store.load(thread_id) if lease is not None else None
    view = lease_status(lease, data.runs if data else (), time.time())
    if view.state is LeaseState.CRASHED:
        where = f"process {lease.pid} on {lease.host}" if lease else "its runner"
        return ThreadCrashedError(
            f"Thread {thread_id!r} is not running: {where} stopped without finishing the run; "
            f"resume the thread first{'' if kind == 'abort' else ', then send the ' + _kind_words(kind)}.",
            view=view,
        )
    if kind == "abort":
        return ThreadNotRunningError(f"Thread {thread_id!r} is not running, so there is nothing to abort.", view=view)
    return ThreadNotRunningError(
        f"Thread {thread_id!r} is not running (its last run ended); send the {_kind_words(kind)} as a new prompt.",
        view=view,
    )


def _kind_words(kind: str) -> str:
    return "follow-up" if kind == "follow_up" else kind


async def refuse_orphaned_aborts(store: CommandStore, thread_id: str) -> list[Command]:
    """Mark ``refused`` the aborts of ``thread_id`` still pending or delivered although no run
    holds its live lease (their runner died first), and return them, updated; ``[]`` while a
    run holds the lease. An abort has nothing left to stop, unlike a steer or follow-up,
    which :func:`undelivered` keeps for the resume. One settled meanwhile (the runner applied
    it, a resume refused it) is left as it is. Raises the store's errors (a browse-only store
    raises ``ReadOnlyStoreError``)."""
    if lease_status(await store.get_lease(thread_id), (), time.time()).live:
        return []
    out = []
    for c in await store.list_commands(thread_id, ["pending", "delivered"]):
        if c.kind == "abort":
            try:
                out.append(await store.update_command(c.seq, "refused", ORPHANED_ABORT))
            except CommandTransitionError:
                pass
    return out


async def undelivered(store: CommandStore, thread_id: str) -> list[Command]:
    """Steers and follow-ups that never reached the thread's conversation, in send order.

    That is: ``pending`` ones, and ``delivered`` ones whose runner stopped before their
    message was persisted. One whose message *was* persisted (the runner died before
    saying so) is marked ``applied`` here and not listed. While a run holds a live lease
    its commands are in flight: nothing is listed. Raises the store's errors.
    """
    lease = await store.get_lease(thread_id)
    if lease_status(lease, (), time.time()).live:
        return []
    commands = [c for c in await store.list_commands(thread_id, ["pending", "delivered"]) if c.kind != "abort"]
    if not commands:
        return []
    data = await store.load(thread_id)
    persisted = {
        m.metadata.get("command_seq")
        for m in (data.messages if data else ())
        if isinstance(m, UserMessage) and m.metadata and "command_seq" in m.metadata
    }
    out = []
    for c in commands:
        if c.seq in persisted:
            await _settle(store, c.seq, "applied", "found in the conversation after its runner stopped")
        else:
            out.append(c)
    return out


async def discard(store: CommandStore, thread_id: str, seqs: Sequence[int] | None = None) -> list[Command]:
    """Mark undelivered steers and follow-ups (all, or those in ``seqs``) ``discarded`` and
    return those this call discarded, updated (one settled meanwhile by someone else -
    delivered with a resume, discarded from another window - is left out). Raises
    :class:`CommandError` while a run holds the thread's live lease (its commands are in
    flight), ``KeyError`` for a seq that is not an undelivered steer or follow-up of the
    thread (nothing is discarded then), and the store's errors."""
    lease = await store.get_lease(thread_id)
    if lease_status(lease, (), time.time()).live:
        raise CommandError(
            f"Thread {thread_id!r} is running; its steers and follow-ups are on their way and cannot be discarded."
        )
    pending = {c.seq: c for c in await undelivered(store, thread_id)}
    wanted = list(pending) if seqs is None else list(seqs)
    for seq in wanted:
        if seq not in pending:
            raise KeyError(f"Command {seq} is not an undelivered steer or follow-up of thread {thread_id!r}.")
    done = [await _settle(store, seq, "discarded", "discarded by the user") for seq in wanted]
    return [c for c in done if c is not None]


async def _settle(store: Commands, seq: int, status: CommandStatus, note: str) -> Command | None:
    """Move command ``seq`` to ``status``; ``None`` when it was settled meanwhile (the store
    refused the move, nothing changed). The store's other errors propagate."""
    try:
        return await store.update_command(seq, status, note)
    except CommandTransitionError as exc:
        _log.info("command %s was not marked %s: %s", seq, status, exc)
        return None


# --- the runner side ----------------------------------------------------------------------------


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
        self._aborts: list[int] = []
        self._inflight: dict[int, UserMessage] = {}  # command seq -> the queued user message
        self._carry: list[Command] = []

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

        With ``include_pending``, :func:`undelivered` steers and follow-ups are sent with
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
        """:func:`undelivered` for this thread."""
        return await undelivered(self.store, self.thread_id)

    async def discard(self, seqs: Sequence[int] | None = None) -> list[Command]:
        """:func:`discard` for this thread."""
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
        watcher = asyncio.create_task(self._watch_commands(), name=f"commands {self.thread_id}")
        try:
            return await run()
        finally:
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
                # The lease is released by now, so `send` refuses anything newer; what
                # slipped in before is answered here rather than left pending.
                for c in await self.store.list_commands(self.thread_id, ["pending"]):
                    if c.seq > self._baseline and c.seq not in self._seen:
                        await self._update(c.seq, "refused", ABORT_TOO_LATE if c.kind == "abort" else RUN_ENDED)
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
        if isinstance(event, MessageStart):
            live.add(event, len(messages))
        elif isinstance(event, MessageEnd):
            # The loop appended the message to the state before emitting this.
            live.add(event, len(messages) - 1)
            seq = event.message.metadata.get("command_seq") if isinstance(event.message, UserMessage) else None
            if seq in self._inflight:
                del self._inflight[seq]
                if event.persisted:
                    await self._update(seq, "applied")
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
                if c.seq <= self._baseline and c.kind == "abort":
                    await self._update(c.seq, "refused", STALE_ABORT)
            for c in self._carry:
                self._seen.add(c.seq)
                await self._hand_over(c)
            self._carry = []

    async def _on_end(self, outcome: RunOutcome) -> None:
        async with self._lock:
            self._ending = True
            for seq in self._aborts:
                if outcome == "aborted":
                    await self._update(seq, "applied")
                else:
                    await self._update(seq, "refused", f"{ABORT_TOO_LATE} (it {outcome})")
            self._aborts = []
            state = self.agent.state
            for seq, message in list(self._inflight.items()):
                # Never delivered: take it back so it cannot wake a later run unasked.
                state.pending_steers[:] = [m for m in state.pending_steers if m is not message]
                state.pending_follow_ups[:] = [m for m in state.pending_follow_ups if m is not message]
                await self._update(seq, "refused", RUN_ENDED)
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
        """Give one command to the agent (lock held). Delivered is written before the agent
        sees it, so "applied" (written when its message is saved) always comes later; a
        command settled meanwhile (discarded from another window) is not handed over."""
        if self._ending or not self.agent.state.is_running:
            await self._update(c.seq, "refused", ABORT_TOO_LATE if c.kind == "abort" else RUN_ENDED)
            return
        if not await self._update(c.seq, "delivered"):
            return
        if self._ending:  # the run ended while the update was written
            await self._update(c.seq, "refused", ABORT_TOO_LATE if c.kind == "abort" else RUN_ENDED)
            return
        agent = self.agent
        if c.kind == "abort":
            self._aborts.append(c.seq)
            agent.abort()
            return
        try:
            if c.kind == "steer":
                agent.steer(c.text)
                message = agent.state.pending_steers[-1]
            else:
                agent.follow_up(c.text)
                message = agent.state.pending_follow_ups[-1]
        except EmptyMessageError as exc:
            await self._update(c.seq, "refused", str(exc))
            return
        except RunError:
            await self._update(c.seq, "refused", RUN_ENDED)
            return
        message.metadata["command_seq"] = c.seq
        self._inflight[c.seq] = message

    async def _update(self, seq: int, status: CommandStatus, note: str = "") -> bool:
        """Move a command to ``status``; False only when it was settled meanwhile (the
        store refused the move). Other store errors are logged: the run goes on."""
        try:
            return await _settle(self.store, seq, status, note) is not None
        except Exception:
            _log.warning("could not mark command %s %s", seq, status, exc_info=True)
            return True
