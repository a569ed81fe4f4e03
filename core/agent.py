"""The stateful agent: one thread, its runs, and everything a UI needs to show them.

The :mod:`core.loop` emits events; the agent folds each into :class:`AgentState`, has
its :class:`~core.recorder.RunRecorder` (every store write of a run, each rule in one
place) persist each finished message at ``message_end`` (one ``append`` per message, so
a crash loses nothing already finished) and journal each ``tool_execution_start``
(before the tool's work begins) and ``tool_execution_end``, and then calls the
subscribers. Before a run goes on, the thread's fingerprints are compared with this
agent's definition (:mod:`core.fingerprints`).

Every run first takes the thread's lease (:mod:`core.leases`: one runner per thread,
across processes), then reloads the history, so messages other writers added are seen
and two resumers never act on the same stale view. Dangling tool calls of a crashed run
are settled before any model call (see :meth:`Agent.plan_resume`).

    agent = Agent(provider, checkpointer, "thread-1", tools=[read_file])
    unsubscribe = agent.subscribe(print)
    outcome = await agent.prompt("Summarise README.md")   # "completed", "aborted", "failed"
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from core.approvals import Approvals, check_approvals
from core.checkpoint.base import Checkpointer, CorruptRow, JournalEntry, PendingRequest, RunRecord, ThreadMeta
from core.checkpoint.capabilities import HumanAnswers, supports
from core.errors import (
    AgentBusyError,
    EmptyMessageError,
    NothingToResumeError,
    RunError,
    UnreadableThreadError,
    WaitingForAnswerError,
    WriteFailed,
    error_sentence,
)
from core.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    HumanRequestStarted,
    Listener,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RunOutcome,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.fingerprints import (
    changes,
    check_workflow,
    definition_parts,
    fingerprints_of,
    first_input,
    first_input_error,
    input_fingerprint,
)
from core.hitl import question_id_of
from core.human_wait import EndedWaiting, HumanDesk, deadline_of
from core.leases import LeaseHolder
from core.loop import LoopConfig, run_loop
from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, UserMessage, user_text
from core.providers.base import Provider
from core.recorder import RunRecorder
from core.recovery import (
    CallPlan,
    Diagnosis,
    ResumeAction,
    ResumePlan,
    SettleChoice,
    ThreadState,
    WaitRole,
    diagnose,
    plan_call,
    plan_waiting,
    waiting_roles,
)
from core.request import RequestBuilder, blank, build_request
from core.tool_execution import call_job_key
from core.tools import AgentTool, ToolExecutionMode

_log = logging.getLogger(__name__)


OnPlan = Callable[[ResumePlan], None]
"""Told the resume plan a resume carries out, before it does (see ``Agent.resume``)."""

Claim = Callable[[list[UserMessage]], Awaitable[list[UserMessage]]]
"""Given the queued messages the loop takes now (a turn boundary, or the agent about to
stop), returns those still to deliver, in order, each possibly replaced (its text edited
meanwhile); one it leaves out is not delivered (cancelled meanwhile). See ``Agent.claim_with``."""

_STANDING: dict[ThreadState, RunOutcome] = {
    ThreadState.COMPLETED: "completed",
    ThreadState.ABORTED: "aborted",
    ThreadState.FAILED: "failed",
}
"""What :meth:`Agent.start` returns for a thread it finds already done, by its state."""


HISTORY_SLICE = 2_000
"""Messages a run's request builder reads between two turns of the event loop: at ~3 us a
message (measured), ~6 ms, so a run starting on a 100,000-message thread does not hold the
app's keys for the whole pass (~0.3 s)."""


async def _read_history(messages: list[AnyMessage]) -> RequestBuilder:
    """A new request builder that has read ``messages``, :data:`HISTORY_SLICE` at a time."""
    builder = RequestBuilder()
    for upto in range(HISTORY_SLICE, len(messages), HISTORY_SLICE):
        builder.update(messages, upto)
        await asyncio.sleep(0)
    builder.update(messages)
    return builder


def _past_deadline(pending: PendingRequest | None) -> bool:
    """Whether ``pending`` has a timeout whose deadline (:func:`core.human_wait.deadline_of`,
    as stored, so it holds across a crash) is past: a resume may then go on, the asking
    call taking its default or ending the run waiting again."""
    due = deadline_of(pending.request_json) if pending is not None else None
    return due is not None and due <= time.time()


def check_user_text(text: str, what: str = "prompt") -> None:
    """Refuse a user message that could not be sent: raises
    :class:`~core.errors.EmptyMessageError` when ``text`` is empty or only whitespace
    (:func:`core.request.blank`; the API refuses such text). ``what`` names it in the
    sentence ("prompt", "steer", "follow-up"). The one check of ``Agent.prompt``,
    ``steer``, ``follow_up`` and the headless runner."""
    if blank(text):
        raise EmptyMessageError(f"The {what} is empty; type some text to send.")


@dataclass(slots=True)
class RunningTool:
    """A tool call in flight: ``progress`` is a fraction 0..1 (or ``None``), ``text`` its last
    status line, ``started_at`` unix seconds."""

    tool_call_id: str
    name: str
    args: dict[str, Any]
    started_at: float
    progress: float | None = None
    text: str | None = None


@dataclass(slots=True)
class AgentState:
    """What the agent knows; read it, never change it.

    ``messages``: the thread's finished messages in order (persisted at ``message_end``).
    ``runs``: the thread's run records; ``problems``: rows that could not be decoded.
    ``journal``: the tool journal by tool call id (``None`` when the store keeps none).
    ``pending_request``: the human request the thread waits on (cubeloop's HITL), if any
    (set as loaded, and when a call of the run asks); ``pending_answer``: its answer JSON
    when one is stored (loaded with it: resuming applies it).
    ``streaming_message``: the partial assistant reply while it streams, else ``None``.
    ``running_tools``: tool call id -> :class:`RunningTool` for calls in flight.
    ``run_id``: the current (or last) run. ``last_outcome``/``error``: how the last run
    ended and, when it failed, the one-sentence reason. ``pending_steers`` /
    ``pending_follow_ups``: queued user messages not yet delivered. ``meta``: the thread's
    owner and fingerprints record (``None`` when the store keeps none, or before the
    thread has one). ``ran``: whether the last ``prompt``/``resume``/``start`` ran (false
    when ``start`` found the thread already done, or it was refused).
    """

    messages: list[AnyMessage] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    problems: list[CorruptRow] = field(default_factory=list)
    journal: dict[str, JournalEntry] | None = None
    pending_request: PendingRequest | None = None
    pending_answer: str | None = None
    streaming_message: AssistantMessage | None = None
    running_tools: dict[str, RunningTool] = field(default_factory=dict)
    is_running: bool = False
    run_id: str | None = None
    last_outcome: RunOutcome | None = None
    error: str | None = None
    pending_steers: list[UserMessage] = field(default_factory=list)
    pending_follow_ups: list[UserMessage] = field(default_factory=list)
    pending_notes: list[UserMessage] = field(default_factory=list)
    """Passive notes (:meth:`Agent.note`) waiting for a turn that comes anyway."""
    meta: ThreadMeta | None = None
    ran: bool = False


class Agent:
    """Runs one thread: ``prompt``, ``start``, ``resume``, ``abort``, ``steer``, ``follow_up``, ``subscribe``.

    ``tools`` are offered to the model; ``tool_execution`` is ``"parallel"`` or
    ``"sequential"``; ``abort_grace`` is the seconds a tool may keep running after an
    abort before it is cancelled.

    Run exclusivity (when the store implements ``SupervisedStore``): ``holder`` is who
    this agent is to other processes (default: a new :class:`~core.leases.LeaseHolder`,
    so each agent is its own holder); ``lease_ttl`` is how many seconds the lease stays
    valid without a heartbeat, ``heartbeat_interval`` how many seconds pass between
    heartbeats. Every write of a leased run is fenced by ``holder`` (the store refuses it
    once another holder has the thread or the lease expired, see
    ``core.checkpoint.base``); a run whose lease is lost, seen by the heartbeat or by
    such a refusal, stops and ends ``"failed"`` saying so. Stores without that protocol
    (cubeloop-compatible ones) run without lease, journal, job store or tool steps. Every
    store write the agent makes goes through its :class:`~core.recorder.RunRecorder`.

    Fingerprints (:mod:`core.fingerprints`): ``workflow`` is a version the user gives the
    agent's workflow (``None``: none). The first run of a thread records the fingerprints of
    its first input and of this definition (the system prompt, each tool's name and
    parameter schema, the provider's model id, ``workflow``); each later run compares them
    first and refuses with :class:`~core.errors.FingerprintMismatchError` when they differ,
    unless given ``accept_changes=True`` (the override is then recorded in the thread). A
    thread that recorded none (cubeloop's, or older) records them at its next run. The
    first input is never overridden: :meth:`start` with another one is refused.

    Human requests (:mod:`core.human_wait`): ``approvals`` maps a tool name to its
    approval rule (:mod:`core.approvals`: ``ALWAYS``, ``NEVER``, ``ask_for(arg=[globs])``;
    unlisted tools never ask), fingerprinted with the definition. A call that asks waits
    between its validation and its journaled start; a tool body asks through
    ``ToolContext.human``; the built-in :func:`core.ask_user.ask_user_tool` lets the model
    ask. The request is persisted before the run waits; the run waits (its lease kept by
    the heartbeat) until answered, aborted, detached (:meth:`detach`) or past its
    deadline, and then ends ``"waiting"`` when it has no answer to apply. Resuming a
    thread whose answer is stored applies it (:meth:`resume`). A store that keeps no
    answers (cubeloop's) cannot be asked: a call that needs approval is denied there.

    Raises ``ToolDefinitionError`` if two tools share a name or ``approvals`` names a tool
    or an argument the agent does not have, ``ValueError`` unless
    ``0 < heartbeat_interval < lease_ttl``, and ``ValueError`` (one sentence,
    :func:`core.fingerprints.check_workflow`) for a ``workflow`` that is empty, too long or
    holds a control character.
    """

    def __init__(
        self,
        provider: Provider,
        checkpointer: Checkpointer,
        thread_id: str,
        *,
        tools: Sequence[AgentTool] = (),
        system_prompt: str = "",
        tool_execution: ToolExecutionMode = "parallel",
        abort_grace: float = 5.0,
        holder: LeaseHolder | None = None,
        lease_ttl: float = 15.0,
        heartbeat_interval: float = 2.0,
        workflow: str | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        if not 0 < heartbeat_interval < lease_ttl:
            raise ValueError(
                f"heartbeat_interval ({heartbeat_interval:g} s) must be positive and shorter than lease_ttl ({lease_ttl:g} s)."
            )
        if workflow is not None:
            check_workflow(workflow)
        self.provider = provider
        self.checkpointer = checkpointer
        self.thread_id = thread_id
        self.holder = holder or LeaseHolder()
        self.lease_ttl = lease_ttl
        self.heartbeat_interval = heartbeat_interval
        self.workflow = workflow
        self._recorder = RunRecorder(
            checkpointer, thread_id, self.holder, lease_ttl=lease_ttl, heartbeat_interval=heartbeat_interval
        )
        self._settling: set[str] = set()  # crashed runs whose calls this run settles
        self._desk: HumanDesk | None = None  # the current run's human requests
        self._asking: str | None = None  # the tool call whose request state.pending_request is
        rules = check_approvals(approvals or {}, {t.name: t.parameters for t in tools})
        self._config = LoopConfig(
            provider,
            tuple(tools),
            system_prompt,
            tool_execution,
            abort_grace,
            get_steering=self._take_steers,
            get_follow_ups=self._take_follow_ups,
            stop_after_turn=lambda: self._stop_after_turn,
            jobs=self._recorder.jobs,
            steps=self._recorder.steps,
            approvals=rules,
        )
        self._parts = definition_parts(system_prompt, self._config.tool_specs, provider.model, rules)
        self._state = AgentState()
        self._listeners: tuple[Listener, ...] = ()
        self._signal = asyncio.Event()
        self._interrupt = asyncio.Event()
        self._stop_after_turn = False
        self._turn_coming = False  # a model call follows the next steering poll anyway
        self._queue_claim: Claim | None = None

    @property
    def state(self) -> AgentState:
        """The live state (see :class:`AgentState`)."""
        return self._state

    def claim_with(self, claim: Claim) -> Callable[[], None]:
        """Have ``claim`` decide, at the moment the loop takes queued steers, notes and
        follow-ups, which of them are delivered (a queue kept in a store marks them taken
        there then, so they stay editable until that moment; :class:`~core.supervisor.Supervisor`).
        One claim at a time: a second replaces the first. Returns a function that removes
        it (safe to call twice). ``claim`` must not raise; what it raises ends the run as
        failed."""
        self._queue_claim = claim

        def release() -> None:
            if self._queue_claim is claim:
                self._queue_claim = None

        return release

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` (sync or async) with every event, in order, after it is folded
        and persisted. Returns a function that unsubscribes (safe to call twice).

        A listener that raises is logged and skipped; it never stops the run.
        """
        self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

        return unsubscribe

    def diagnosis(self) -> Diagnosis:
        """Where the loaded thread stands (see :func:`core.recovery.diagnose`)."""
        state = self._state
        return diagnose(
            state.messages,
            state.runs,
            state.journal,
            problems=state.problems,
            pending=state.pending_request,
            answer_stored=state.pending_answer is not None,
            deadline_passed=_past_deadline(state.pending_request),
        )

    async def load(self) -> None:
        """Load the thread's messages, runs and problems into ``state``.

        Undecodable rows do not raise here (they land in ``state.problems``). Raises
        ``AgentBusyError`` during a run, and whatever the checkpointer raises.
        """
        if self._state.is_running:
            raise AgentBusyError("This agent is running; load the thread after the run ends.")
        await self._load()

    async def definition_changes(self) -> tuple[str, ...]:
        """What differs between the fingerprints the thread recorded and this agent's
        definition (:func:`core.fingerprints.changes`: "tool grep: added", "model: a -> b",
        ...), so the app can show it before running; ``()`` when nothing differs or the
        thread recorded none (or the store keeps none). Reads the thread's record fresh
        (``state.meta``); the first input is not compared (see :meth:`start`). Raises the
        store's errors."""
        meta = await self._recorder.load_meta()
        self._state.meta = meta
        stored = meta.fingerprints if meta is not None else None
        if stored is None:
            return ()
        return changes(stored, fingerprints_of(self._parts, self.workflow, None))

    async def prompt(self, text: str, *, accept_changes: bool = False) -> RunOutcome:
        """Start a run with the user message ``text`` and return how it ended.

        Takes the thread's lease, reloads the thread, compares its fingerprints with this
        agent's (see the class docstring: the first prompt of a new thread records them),
        claims a new run, then runs the loop; any dangling tool call of a crashed run is
        settled first (idempotent tools re-run, others recorded as interrupted). Raises
        ``FingerprintMismatchError`` (its ``changes`` say what differs; nothing ran) when
        the thread was written by another definition of the agent, unless
        ``accept_changes`` (then the new fingerprints are recorded with an override naming
        the changes, the store's owner and the time), ``ConflictError`` when another
        writer recorded fingerprints meanwhile, ``AgentBusyError`` if this agent
        is running, ``RunAlreadyClaimedError`` if another holder runs the thread,
        ``UnreadableThreadError`` if the thread has undecodable rows,
        ``WaitingForAnswerError`` if it waits for a human answer (cubeloop's pending
        request, left as it is), ``EmptyMessageError`` (nothing taken or loaded) if
        ``text`` is empty or only whitespace, ``LeaseLostError``
        if the lease was lost before the run was claimed, and the checkpointer's errors
        from loading or claiming. Failures during the run do not raise: they end the run
        ``"failed"`` with ``state.error`` set.
        """
        check_user_text(text)
        async with self._exclusive(), self._leased() as run_id:
            await self._load_runnable()
            return await self._prompted(run_id, text, accept_changes)

    async def start(self, text: str, *, accept_changes: bool = False, on_plan: OnPlan | None = None) -> RunOutcome:
        """Run the thread for the first input ``text``, idempotently: the lesson's "create
        run with input" (the same id with the same input is the same run).

        A new thread (no messages): as :meth:`prompt`. The same first input: resume when
        the thread is resumable (as :meth:`resume` with the default plan; ``on_plan`` as
        there), else return without running (``state.ran`` false) the thread's outcome as
        it stands: ``"completed"``, or ``"aborted"`` / ``"failed"`` for a thread that ended
        so. Another first input than the thread's first user message: always
        :class:`~core.errors.FirstInputChangedError` (:func:`core.fingerprints.first_input_error`),
        nothing run or written, with ``accept_changes`` too - a thread id names one job, so
        another input is started as another thread; ``accept_changes`` goes on past a
        changed definition of the agent only. Raises the errors of :meth:`prompt` and
        :meth:`resume`.
        """
        check_user_text(text)
        async with self._exclusive(), self._leased() as run_id:
            await self._load_runnable()
            first = first_input(self._state.messages)
            if first is None:
                return await self._prompted(run_id, text, accept_changes)
            if input_fingerprint(first) != input_fingerprint(text):
                raise first_input_error(self.thread_id)
            plan = await self._plan()
            if plan.action is ResumeAction.NONE:
                state = self._state
                state.last_outcome = _STANDING.get(plan.diagnosis.state, "completed")
                state.error = None
                return state.last_outcome
            return await self._resumed(run_id, plan, {}, accept_changes, on_plan)

    async def _prompted(self, run_id: str, text: str, accept_changes: bool) -> RunOutcome:
        """The body of :meth:`prompt` under the lease, the thread reloaded (a thread without
        messages records ``text`` as its first input)."""
        await self._admit(text if not self._state.messages else None, accept_changes)
        # A stored answer is applied before the prompt is answered, as a resume applies it.
        plan = await self._plan() if self._state.pending_request is not None else None
        settle = plan.settlement({}) if plan is not None and plan.action is ResumeAction.APPLY_ANSWER else None
        await self._claim(run_id)
        return await self._run(run_id, [user_text(text, kind="prompt", run_id=run_id)], settle)

    async def _admit(self, offered: str | None, accept_changes: bool) -> None:
        """Compare the thread's fingerprints with this agent's before anything runs (see
        :meth:`core.recorder.RunRecorder.admit`; ``offered``: the first input of a thread
        without messages); ``state.meta`` is then the record as stored."""
        state = self._state
        state.meta = await self._recorder.admit(
            state.meta,
            state.messages,
            fingerprints_of(self._parts, self.workflow, None),
            offered=offered,
            accept_changes=accept_changes,
        )

    async def plan_resume(self) -> ResumePlan:
        """Reload the thread and say what :meth:`resume` would do, without doing it.

        The plan holds the diagnosis (with the tool journal's "never started" / "started
        HH:MM:SS, never finished") and one :class:`~core.recovery.CallPlan` per dangling
        call: re-run (idempotent tool, job not done), reuse (job done: its stored result
        is used, the work is not repeated) or interrupt (unknown tool, or a tool that is
        not idempotent - the user may choose ``"rerun"`` for the latter). A clean thread
        gives a plan whose ``action`` is ``NONE``. Raises ``AgentBusyError`` during a
        run, and the checkpointer's errors.
        """
        if self._state.is_running:
            raise AgentBusyError("This agent is running; plan a resume after the run ends.")
        await self._load()
        return await self._plan()

    async def resume(
        self,
        choices: Mapping[str, SettleChoice] | None = None,
        *,
        accept_changes: bool = False,
        on_plan: OnPlan | None = None,
    ) -> RunOutcome:
        """Continue a crashed thread exactly as :meth:`plan_resume` plans it.

        ``choices`` maps tool call id -> ``"rerun"`` or ``"interrupt"`` for dangling calls
        that offer a choice (known tools that are not idempotent); other calls follow
        the plan. The lease is taken and the thread reloaded first, and the plan is made
        from that fresh view. Call model / settle then call model: a new run settles
        each dangling call (results carry ``metadata["settled"]`` = ``"rerun"``,
        ``"reused"`` or ``"interrupted"``, and the ``run_id`` of the run that issued the
        call), then calls the model. Settle then wait: the same settling, then the run
        ends ``"completed"`` without a model call (what would be sent ends with a final
        reply). Retry (a failed thread): a new run settles any dangling call the same
        way and calls the model again with the saved history, the failed reply left out
        of what is sent, no answered call run again. Wait for user: the old run is
        marked complete and ``"completed"`` is returned.

        A dangling call of a stepped tool (:mod:`core.steps`) that re-runs continues after
        its last committed step. The thread's fingerprints are compared before anything is
        settled, as :meth:`prompt` does (``accept_changes`` likewise). ``on_plan(plan)`` is
        called once with the plan this resume carries out (made under the lease, after the
        checks, before anything is written for it), so a caller can say what happens
        (the runner prints :attr:`~core.recovery.ResumePlan.sentence`).

        Raises ``NothingToResumeError`` when the thread is clean, ``ResumeChoiceError``
        when a choice names a call that is not dangling or does not offer that choice,
        plus the errors of :meth:`prompt`.
        """
        async with self._exclusive(), self._leased() as run_id:
            await self._load_runnable()
            plan = await self._plan()
            if plan.action is ResumeAction.NONE:
                raise NothingToResumeError(
                    f"Nothing to resume: the thread is {plan.diagnosis.label}; send a new message to continue."
                )
            return await self._resumed(run_id, plan, choices or {}, accept_changes, on_plan)

    async def _resumed(
        self,
        run_id: str,
        plan: ResumePlan,
        choices: Mapping[str, SettleChoice],
        accept_changes: bool,
        on_plan: OnPlan | None = None,
    ) -> RunOutcome:
        """The body of :meth:`resume` under the lease, for a ``plan`` that has work to do."""
        settle = plan.settlement(choices)
        await self._admit(None, accept_changes)
        if on_plan is not None:
            on_plan(plan)
        if plan.action is ResumeAction.WAIT_FOR_USER:
            await self._close_final_reply()
            self._state.last_outcome, self._state.error, self._state.ran = "completed", None, True
            return "completed"
        await self._claim(run_id)
        outcome = await self._run(run_id, [], settle)
        if plan.action is ResumeAction.SETTLE_THEN_WAIT and outcome == "completed" and not self._recorder.fenced:
            await self._close_final_reply()
        return outcome

    def abort(self) -> None:
        """Ask the current run to stop; idempotent, and a no-op when idle.

        Streaming stops at once; running tools see their signal and are cancelled after
        ``abort_grace`` seconds. The run ends ``"aborted"``.
        """
        if self._state.is_running:
            self._signal.set()

    def detach(self) -> bool:
        """End the current run as **waiting for an answer** if a call of it waits for one
        now: the run ends ``"waiting"`` (left open, its request pending, its lease
        released, results already saved kept; calls still running are recorded as
        interrupted), to be continued by :meth:`resume` once answered, in this process or
        another. Returns whether it did; ``False`` (nothing changes) when no call waits."""
        return self._desk.detach() if self._desk is not None else False

    def stop_after_turn(self) -> None:
        """Let the running tools finish and keep their results, then end the run without
        another model call (it reads "aborted"); a no-op when idle. Raises nothing."""
        if self._state.is_running:
            self._stop_after_turn = True

    def interrupt(self, text: str) -> None:
        """Steer now: abort the running tools as :meth:`abort` does (their results say so),
        then deliver ``text`` at that turn boundary and go on. Raises as :meth:`steer`."""
        self.steer(text)
        self._interrupt.set()

    def note(self, text: str) -> None:
        """Queue ``text`` as a passive note: delivered with the next turn, but it never wakes
        an agent that is done (then it waits for the next run). Raises as :meth:`steer`."""
        check_user_text(text, "note")
        self._require_run()
        self._state.pending_notes.append(user_text(text, kind="note"))

    def steer(self, text: str) -> None:
        """Queue ``text`` for delivery at the next turn boundary (after the running tools,
        before the next model call). Raises ``RunError`` when no run is in progress.

        A steer still queued when the run is aborted stays queued for the next run.
        Raises ``EmptyMessageError`` when ``text`` is empty or only whitespace."""
        check_user_text(text, "steer")
        self._require_run()
        self._state.pending_steers.append(user_text(text, kind="steer"))

    def follow_up(self, text: str) -> None:
        """Queue ``text`` for delivery when the agent would otherwise stop. Raises
        ``RunError`` when no run is in progress (``EmptyMessageError`` when ``text`` is
        empty or only whitespace); stays queued for the next run after an abort."""
        check_user_text(text, "follow-up")
        self._require_run()
        self._state.pending_follow_ups.append(user_text(text, kind="follow_up"))

    # --- running ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        state = self._state
        if state.is_running:
            raise AgentBusyError("This agent is already running; wait for the run to end or abort it.")
        state.is_running = True
        state.ran = False
        self._signal = asyncio.Event()
        self._interrupt.clear()
        self._stop_after_turn = False
        try:
            yield
        finally:
            state.is_running = False
            state.streaming_message = None
            state.running_tools.clear()

    @contextlib.asynccontextmanager
    async def _leased(self) -> AsyncIterator[str]:
        """Hold the thread's lease (heartbeating) for one run; yields the new run id."""
        run_id = uuid.uuid4().hex
        async with self._recorder.leased(run_id, on_lost=self._signal.set):
            yield run_id

    async def _load(self) -> None:
        data = await self.checkpointer.load(self.thread_id)
        state = self._state
        state.messages = data.messages if data else []
        state.runs = data.runs if data else []
        state.problems = data.problems if data else []
        state.journal = data.journal if data else ({} if self._recorder.journaled else None)
        state.pending_request = data.pending_request if data else None
        state.pending_answer = await self._stored_answer(state.pending_request)
        # A thread with nothing else stored may still have its record: fingerprints saved
        # by a run that died before its first message was (what _admit compares and sets).
        state.meta = data.meta if data else await self._recorder.load_meta()

    async def _stored_answer(self, pending: PendingRequest | None) -> str | None:
        """The answer JSON stored for ``pending``, ``None`` when none is (or the store keeps none)."""
        store = self.checkpointer
        question_id = question_id_of(pending.request_json) if pending is not None else None
        if pending is None or question_id is None or not supports(store, HumanAnswers):
            return None
        return await store.load_answer(self.thread_id, pending.run_id, question_id)

    async def _plan(self) -> ResumePlan:
        diagnosis = self.diagnosis()
        tools = self._config.tools_by_name
        roles: dict[str, WaitRole] = {}
        if diagnosis.action is ResumeAction.APPLY_ANSWER and diagnosis.pending is not None:
            issuers = {u.call.id: u.message.run_id for u in build_request(self._state.messages).unanswered}
            roles = waiting_roles(diagnosis.pending, diagnosis.dangling, issuers)
        calls: list[CallPlan] = []
        for dangling in diagnosis.dangling:
            tool = tools.get(dangling.call.name)
            key = call_job_key(tool, dangling.call) if tool is not None else None
            job = await self._recorder.job(key) if key is not None else None
            step = await self._recorder.step(key) if key is not None else None
            planned = plan_call(
                dangling,
                known=tool is not None,
                idempotent=tool is not None and tool.idempotent,
                job_key=key,
                job_status=job.status if job is not None else None,
                step=step,
            )
            role = roles.get(dangling.call.id)
            calls.append(plan_waiting(planned, role) if role is not None and tool is not None else planned)
        return ResumePlan(diagnosis, tuple(calls))

    async def _load_runnable(self) -> None:
        await self._load()
        problems = self._state.problems
        if problems:
            raise UnreadableThreadError.of(self.thread_id, len(problems), problems[0].row_id)
        pending = self._state.pending_request
        if pending is not None and self._state.pending_answer is None and not _past_deadline(pending):
            # Without its answer (and before its deadline) the question's call must not be settled.
            raise WaitingForAnswerError(
                f"Thread {self.thread_id!r} is waiting for an answer to {pending.question!r}; answer it (in the app, "
                "with cubepi-tui answer, or in the program that asked), then resume the thread to apply it."
            )

    async def _claim(self, run_id: str) -> None:
        await self._recorder.claim(run_id)
        self._state.runs.append(RunRecord(run_id, time.time()))
        self._state.run_id = run_id
        self._state.ran = True

    async def _close_final_reply(self) -> None:
        """Mark complete the open run of the last reply, which is final (nothing for the
        model to answer after it). A run of this thread's records only: a run id no claim
        names (a hand-made row) has nothing to complete."""
        last = next((m for m in reversed(self._state.messages) if isinstance(m, AssistantMessage)), None)
        run_id = last.run_id if last is not None else None
        if run_id and any(r.run_id == run_id and not r.completed for r in self._state.runs):
            await self._mark_complete(run_id)

    async def _mark_complete(self, run_id: str) -> None:
        await self._recorder.complete(run_id)
        runs = self._state.runs
        for i, run in enumerate(runs):
            if run.run_id == run_id and not run.completed:
                runs[i] = dataclasses.replace(run, completed_at=time.time())

    async def _run(
        self, run_id: str, prompts: list[UserMessage], settle: Mapping[str, SettleChoice] | None = None
    ) -> RunOutcome:
        completed = frozenset(r.run_id for r in self._state.runs if r.completed)
        config = dataclasses.replace(
            self._config,
            run_id=run_id,
            settle_choices=dict(settle or {}),
            completed_runs=completed,
            interrupt=self._interrupt,
        )
        desk = None
        if supports(self.checkpointer, HumanAnswers):
            desk = HumanDesk(
                self.checkpointer,
                self.thread_id,
                fence=self._recorder.fence,
                signal=self._signal,
                known=self._state.pending_request,
                on_write_error=self._recorder.stopped_by,
            )
            config = dataclasses.replace(config, human=desk)
        self._desk = desk
        self._turn_coming = bool(prompts)
        builder = await _read_history(self._state.messages)
        self._settling = self._crashed_runs(completed, builder)
        self._state.error = None
        try:
            await run_loop(self._state.messages, config, self._on_event, self._signal, prompts, builder=builder)
        except EndedWaiting as ended:
            # The run stays open with its request pending: resuming once answered goes on.
            # A run that lost its lease meanwhile ended failed, whatever it waited for.
            lost = self._recorder.lost
            await self._publish(
                AgentEnd(run_id, "failed", lost) if lost else AgentEnd(run_id, "waiting", ended.sentence)
            )
        except WriteFailed as exc:
            await self._publish(AgentEnd(run_id, "failed", str(exc)))
        except asyncio.CancelledError:
            await self._publish(AgentEnd(run_id, "interrupted", "The run was cancelled."))
            raise
        except Exception as exc:
            _log.exception("run %s of thread %s failed", run_id, self.thread_id)
            await self._publish(AgentEnd(run_id, "failed", f"Internal error: {error_sentence(exc)}"))
        finally:
            self._desk = None
        await self._close_settled()  # when the run ended before its agent_end (a failed save)
        if self._recorder.fenced:
            # Show what the store holds, not the messages this run could no longer save.
            with contextlib.suppress(Exception):
                await self._load()
        return self._state.last_outcome or "failed"

    def _crashed_runs(self, completed: frozenset[str], history: RequestBuilder) -> set[str]:
        """Claimed, open runs whose calls wait for results: this run settles them, under
        their own run ids (see ``LoopConfig``). ``history``: the run's request builder, fed
        the thread's messages."""
        claimed = {r.run_id for r in self._state.runs}
        issuers = {u.message.run_id for u in history.unanswered()}
        return {r for r in issuers if r is not None and r in claimed and r not in completed}

    async def _close_settled(self) -> None:
        """Mark complete each crashed run whose calls all have results now (before this
        run completes, so they keep their order of completion).

        Its messages are then whole tool cycles, and cubeloop copies only completed runs'
        messages into a fork (``SQLiteCheckpointer.fork``: ``completion_seq <= cutoff``):
        left open, a fork of the thread would lose that run's prompt and calls. A run
        that lost its lease writes nothing more; a failure here is logged, not raised
        (the thread itself is whole either way).
        """
        crashed, self._settling = self._settling, set()
        if not crashed or self._recorder.fenced:
            return
        still = {u.message.run_id for u in build_request(self._state.messages).unanswered}
        for run_id in sorted(crashed - still):
            try:
                await self._settle_left_request(run_id)
                await self._mark_complete(run_id)
            except Exception as exc:
                _log.warning("could not close settled run %s of thread %s: %s", run_id, self.thread_id, exc)

    async def _settle_left_request(self, run_id: str) -> None:
        """Settle the thread's pending request if run ``run_id`` asked it: every call of
        that run has its result now (e.g. the asking call was settled as an ordinary
        dangling call), so nothing will apply its answer any more."""
        pending = self._state.pending_request
        store = self.checkpointer
        if pending is None or (pending.run_id or None) != run_id or not supports(store, HumanAnswers):
            return
        question_id = question_id_of(pending.request_json) or ""
        await store.settle_request(self.thread_id, pending.run_id, question_id, **self._recorder.fence())
        self._state.pending_request = self._state.pending_answer = None

    def _require_run(self) -> None:
        if not self._state.is_running:
            raise RunError("No run is in progress; send it as a new prompt.")

    async def _take_steers(self) -> list[UserMessage]:
        taken, self._state.pending_steers = self._state.pending_steers, []
        # An interrupt's steer is among those taken now: it has done its work (or found no
        # tool running), so it must not abort the tools of a later turn.
        self._interrupt.clear()
        taken = await self._claimed(taken)
        # Notes ride along only when a model call comes anyway: a prompt, a steer, or tool
        # results to answer; never alone, so they never wake an agent that is done.
        coming, self._turn_coming = self._turn_coming, False
        messages = self._state.messages
        if taken or coming or (messages and isinstance(messages[-1], ToolResultMessage)):
            taken = [*taken, *await self._take_notes()]
        return self._stamped(taken)

    async def _take_follow_ups(self) -> list[UserMessage]:
        taken, self._state.pending_follow_ups = self._state.pending_follow_ups, []
        taken = await self._claimed(taken)
        if taken:
            taken = [*taken, *await self._take_notes()]
        return self._stamped(taken)

    async def _take_notes(self) -> list[UserMessage]:
        taken, self._state.pending_notes = self._state.pending_notes, []
        return await self._claimed(taken)

    async def _claimed(self, taken: list[UserMessage]) -> list[UserMessage]:
        # Claimed after the decision to take and before the notes' decision, so a steer
        # cancelled meanwhile never lets a note wake an agent that is done.
        claim = self._queue_claim
        return await claim(taken) if taken and claim is not None else taken

    def _stamped(self, messages: list[UserMessage]) -> list[UserMessage]:
        # Queued messages belong to the run that delivers them.
        for m in messages:
            m.run_id = self._state.run_id
        return messages

    # --- folding events -----------------------------------------------------------------------

    async def _on_event(self, event: AgentEvent) -> None:
        """Fold ``event`` into state, persist what must be persisted, then tell listeners.

        Listeners get a ``MessageEnd`` with ``persisted=False`` when its message was not
        saved. Raises :class:`~core.errors.WriteFailed` when a message could not be saved (after the
        listeners ran) or a tool start could not be journaled (before: that tool never
        runs); a write refused because the lease is gone also records the loss.
        """
        failure: Exception | None = None
        state = self._state
        if isinstance(event, MessageUpdate):
            pass
        elif isinstance(event, HumanRequestStarted):
            state.pending_request = PendingRequest(event.request_json, event.run_id, event.created_at)
            state.pending_answer = None
            self._asking = event.tool_call_id
        elif isinstance(event, MessageEnd):
            if isinstance(event.message, AssistantMessage):
                state.streaming_message = None
            elif isinstance(event.message, ToolResultMessage) and event.message.tool_call_id == self._asking:
                # The asking call has its result: its request was answered (or aborted) and settled.
                state.pending_request = state.pending_answer = None
                self._asking = None
            saved, failure = await self._recorder.append(event.message)
            if not saved:
                event = dataclasses.replace(event, persisted=False)
        elif isinstance(event, MessageStart):
            if isinstance(event.message, AssistantMessage):
                state.streaming_message = event.message
        elif isinstance(event, ToolExecutionUpdate):
            running = state.running_tools.get(event.tool_call_id)
            if running is not None:
                if event.progress is not None:
                    running.progress = event.progress
                if event.text is not None:
                    running.text = event.text
        elif isinstance(event, ToolExecutionStart):
            now = time.time()
            # Awaited before the tool's work begins (the executor awaits this event), so
            # a crash during the work always finds the start in the journal. When it
            # cannot be written the tool must not run: listeners never hear of it.
            error = await self._journal_event(event.tool_call_id, "start", event.tool_name, event.job_key, now)
            if error is not None:
                raise self._recorder.stopped_by(
                    f"Could not journal the start of tool call {event.tool_name} ({event.tool_call_id}), so it did "
                    "not run and the run stopped",
                    error,
                ) from error
            state.running_tools[event.tool_call_id] = RunningTool(event.tool_call_id, event.tool_name, event.args, now)
        elif isinstance(event, ToolExecutionEnd):
            state.running_tools.pop(event.tool_call_id, None)
            # The result message itself is the record that matters; a lost end only
            # makes a later diagnosis less precise, so it never fails the run.
            error = await self._journal_event(event.tool_call_id, "end", event.tool_name, None, time.time())
            if error is not None:
                _log.warning("could not journal the end of tool call %s", event.tool_call_id, exc_info=error)
        elif isinstance(event, AgentStart):
            state.run_id = event.run_id
        elif isinstance(event, AgentEnd):
            event = await self._close_run(event)
            await self._publish(event)
            return
        await self._deliver(event)
        if failure is not None:
            raise self._recorder.stopped_by("Could not save a message, so the run stopped", failure) from failure

    async def _journal_event(
        self, tool_call_id: str, phase: Literal["start", "end"], tool_name: str, job_key: str | None, at: float
    ) -> Exception | None:
        """Record one journal entry (state, and the store through the recorder); return the
        store's error, if any."""
        journal = self._state.journal
        if journal is not None:
            old = journal.get(tool_call_id) or JournalEntry(tool_call_id, tool_name, self._state.run_id)
            journal[tool_call_id] = (
                dataclasses.replace(old, started_at=at, ended_at=None, job_key=job_key or old.job_key)
                if phase == "start"
                else dataclasses.replace(old, ended_at=at)
            )
        return await self._recorder.journal(
            tool_call_id, phase, tool_name=tool_name, run_id=self._state.run_id, job_key=job_key, at=at
        )

    async def _close_run(self, event: AgentEnd) -> AgentEnd:
        # Only a clean end completes the run; an aborted or failed run stays open so the
        # thread diagnoses as such. A run that lost its lease ends failed, saying so.
        lost = self._recorder.lost
        if lost is not None:
            return AgentEnd(event.run_id, "failed", lost)
        await self._close_settled()
        if event.outcome != "completed":
            return event
        try:
            await self._mark_complete(event.run_id)
        except Exception as exc:
            return AgentEnd(
                event.run_id, "failed", str(self._recorder.stopped_by("Could not mark the run complete", exc))
            )
        return event

    async def _publish(self, end: AgentEnd) -> None:
        self._state.last_outcome = end.outcome
        self._state.error = end.error
        await self._deliver(end)

    async def _deliver(self, event: AgentEvent) -> None:
        for listener in self._listeners:
            try:
                result = listener(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                _log.exception("listener %r failed on %s", listener, event.type)
