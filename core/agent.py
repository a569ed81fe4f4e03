"""The stateful agent: one thread, its runs, and everything a UI needs to show them.

The :mod:`core.loop` emits events; the agent folds each into :class:`AgentState`,
persists each finished message at ``message_end`` (one ``append`` per message, so a
crash loses nothing already finished), and then calls the subscribers. The history is
reloaded from the checkpointer at the start of every run, so messages other writers
added are seen.

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
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from core.checkpoint.base import Checkpointer, CorruptRow, RunRecord
from core.errors import (
    AgentBusyError,
    CubepiError,
    NothingToResumeError,
    RunError,
    UnreadableThreadError,
)
from core.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    Listener,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RunOutcome,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.loop import LoopConfig, run_loop
from core.messages import AnyMessage, AssistantMessage, UserMessage, user_text
from core.providers.base import Provider
from core.recovery import Diagnosis, ResumeAction, diagnose
from core.tools import AgentTool, ToolExecutionMode

_log = logging.getLogger(__name__)


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
    ``streaming_message``: the partial assistant reply while it streams, else ``None``.
    ``running_tools``: tool call id -> :class:`RunningTool` for calls in flight.
    ``run_id``: the current (or last) run. ``last_outcome``/``error``: how the last run
    ended and, when it failed, the one-sentence reason. ``pending_steers`` /
    ``pending_follow_ups``: queued user messages not yet delivered.
    """

    messages: list[AnyMessage] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    problems: list[CorruptRow] = field(default_factory=list)
    streaming_message: AssistantMessage | None = None
    running_tools: dict[str, RunningTool] = field(default_factory=dict)
    is_running: bool = False
    run_id: str | None = None
    last_outcome: RunOutcome | None = None
    error: str | None = None
    pending_steers: list[UserMessage] = field(default_factory=list)
    pending_follow_ups: list[UserMessage] = field(default_factory=list)


class _PersistFailed(Exception):
    """Saving a finished message failed; the run must end failed."""


class Agent:
    """Runs one thread: ``prompt``, ``resume``, ``abort``, ``steer``, ``follow_up``, ``subscribe``.

    ``tools`` are offered to the model; ``tool_execution`` is ``"parallel"`` or
    ``"sequential"``; ``abort_grace`` is the seconds a tool may keep running after an
    abort before it is cancelled. Raises ``ToolDefinitionError`` if two tools share a name.
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
    ) -> None:
        self.provider = provider
        self.checkpointer = checkpointer
        self.thread_id = thread_id
        self._config = LoopConfig(
            provider,
            tuple(tools),
            system_prompt,
            tool_execution,
            abort_grace,
            get_steering=self._take_steers,
            get_follow_ups=self._take_follow_ups,
        )
        self._state = AgentState()
        self._listeners: tuple[Listener, ...] = ()
        self._signal = asyncio.Event()

    @property
    def state(self) -> AgentState:
        """The live state (see :class:`AgentState`)."""
        return self._state

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
        return diagnose(self._state.messages, self._state.runs)

    async def load(self) -> None:
        """Load the thread's messages, runs and problems into ``state``.

        Undecodable rows do not raise here (they land in ``state.problems``). Raises
        ``AgentBusyError`` during a run, and whatever the checkpointer raises.
        """
        if self._state.is_running:
            raise AgentBusyError("This agent is running; load the thread after the run ends.")
        await self._load()

    async def prompt(self, text: str) -> RunOutcome:
        """Start a run with the user message ``text`` and return how it ended.

        Reloads the thread first, claims a new run, settles any dangling tool call of a
        crashed run, then runs the loop. Raises ``AgentBusyError`` if a run is in
        progress, ``UnreadableThreadError`` if the thread has undecodable rows, and the
        checkpointer's errors from loading or claiming. Failures during the run do not
        raise: they end the run ``"failed"`` with ``state.error`` set.
        """
        async with self._exclusive():
            await self._load_runnable()
            run_id = await self._claim()
            return await self._run(run_id, [user_text(text, kind="prompt", run_id=run_id)])

    async def resume(self) -> RunOutcome:
        """Continue a crashed thread as :func:`core.recovery.diagnose` plans it.

        Call model / settle then call model: a new run re-calls the model (dangling calls
        first get interrupted error results). Wait for user: the old run is marked
        complete and ``"completed"`` is returned. Raises ``NothingToResumeError`` when the
        thread is clean, plus the errors of :meth:`prompt`.
        """
        async with self._exclusive():
            await self._load_runnable()
            plan = diagnose(self._state.messages, self._state.runs)
            if plan.action is ResumeAction.NONE:
                raise NothingToResumeError(
                    f"Nothing to resume: the thread is {plan.label}; send a new message to continue."
                )
            if plan.action is ResumeAction.WAIT_FOR_USER:
                last = next(m for m in reversed(self._state.messages) if isinstance(m, AssistantMessage))
                if last.run_id:
                    await self._mark_complete(last.run_id)
                self._state.last_outcome, self._state.error = "completed", None
                return "completed"
            return await self._run(await self._claim(), [])

    def abort(self) -> None:
        """Ask the current run to stop; idempotent, and a no-op when idle.

        Streaming stops at once; running tools see their signal and are cancelled after
        ``abort_grace`` seconds. The run ends ``"aborted"``.
        """
        if self._state.is_running:
            self._signal.set()

    def steer(self, text: str) -> None:
        """Queue ``text`` for delivery at the next turn boundary (after the running tools,
        before the next model call). Raises ``RunError`` when no run is in progress.

        A steer still queued when the run is aborted stays queued for the next run."""
        self._require_run()
        self._state.pending_steers.append(user_text(text, kind="steer"))

    def follow_up(self, text: str) -> None:
        """Queue ``text`` for delivery when the agent would otherwise stop. Raises
        ``RunError`` when no run is in progress; stays queued for the next run after an abort."""
        self._require_run()
        self._state.pending_follow_ups.append(user_text(text, kind="follow_up"))

    # --- running ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        state = self._state
        if state.is_running:
            raise AgentBusyError("This agent is already running; wait for the run to end or abort it.")
        state.is_running = True
        self._signal = asyncio.Event()
        try:
            yield
        finally:
            state.is_running = False
            state.streaming_message = None
            state.running_tools.clear()

    async def _load(self) -> None:
        data = await self.checkpointer.load(self.thread_id)
        state = self._state
        state.messages = data.messages if data else []
        state.runs = data.runs if data else []
        state.problems = data.problems if data else []

    async def _load_runnable(self) -> None:
        await self._load()
        problems = self._state.problems
        if problems:
            raise UnreadableThreadError(
                f"Thread {self.thread_id!r} has {len(problems)} unreadable row(s) "
                f"(first: row {problems[0].row_id}); it can be read but not continued."
            )

    async def _claim(self) -> str:
        run_id = uuid.uuid4().hex
        await self.checkpointer.claim_run(self.thread_id, run_id)
        self._state.runs.append(RunRecord(run_id, time.time()))
        self._state.run_id = run_id
        return run_id

    async def _mark_complete(self, run_id: str) -> None:
        await self.checkpointer.mark_run_complete(self.thread_id, run_id)
        runs = self._state.runs
        for i, run in enumerate(runs):
            if run.run_id == run_id and not run.completed:
                runs[i] = dataclasses.replace(run, completed_at=time.time())

    async def _run(self, run_id: str, prompts: list[UserMessage]) -> RunOutcome:
        config = dataclasses.replace(self._config, run_id=run_id)
        self._state.error = None
        try:
            await run_loop(self._state.messages, config, self._on_event, self._signal, prompts)
        except _PersistFailed as exc:
            await self._publish(AgentEnd(run_id, "failed", str(exc)))
        except asyncio.CancelledError:
            await self._publish(AgentEnd(run_id, "interrupted", "The run was cancelled."))
            raise
        except Exception as exc:
            _log.exception("run %s of thread %s failed", run_id, self.thread_id)
            await self._publish(AgentEnd(run_id, "failed", f"Internal error: {_sentence(exc)}"))
        return self._state.last_outcome or "failed"

    def _require_run(self) -> None:
        if not self._state.is_running:
            raise RunError("No run is in progress; send it as a new prompt.")

    def _take_steers(self) -> list[UserMessage]:
        taken, self._state.pending_steers = self._state.pending_steers, []
        return self._stamped(taken)

    def _take_follow_ups(self) -> list[UserMessage]:
        taken, self._state.pending_follow_ups = self._state.pending_follow_ups, []
        return self._stamped(taken)

    def _stamped(self, messages: list[UserMessage]) -> list[UserMessage]:
        # Queued messages belong to the run that delivers them.
        for m in messages:
            m.run_id = self._state.run_id
        return messages

    # --- folding events -----------------------------------------------------------------------

    async def _on_event(self, event: AgentEvent) -> None:
        """Fold ``event`` into state, persist what must be persisted, then tell listeners.

        Raises ``_PersistFailed`` (after the listeners ran) when a message could not be saved.
        """
        failure: Exception | None = None
        state = self._state
        if isinstance(event, MessageUpdate):
            pass
        elif isinstance(event, MessageEnd):
            if isinstance(event.message, AssistantMessage):
                state.streaming_message = None
            try:
                await self.checkpointer.append(self.thread_id, [event.message])
            except Exception as exc:
                failure = exc
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
            state.running_tools[event.tool_call_id] = RunningTool(
                event.tool_call_id, event.tool_name, event.args, time.time()
            )
        elif isinstance(event, ToolExecutionEnd):
            state.running_tools.pop(event.tool_call_id, None)
        elif isinstance(event, AgentStart):
            state.run_id = event.run_id
        elif isinstance(event, AgentEnd):
            event = await self._close_run(event)
            await self._publish(event)
            return
        await self._deliver(event)
        if failure is not None:
            raise _PersistFailed(f"Could not save a message, so the run stopped: {_sentence(failure)}") from failure

    async def _close_run(self, event: AgentEnd) -> AgentEnd:
        # Only a clean end completes the run; an aborted or failed run stays open so the
        # thread diagnoses as such.
        if event.outcome != "completed":
            return event
        try:
            await self._mark_complete(event.run_id)
        except Exception as exc:
            return AgentEnd(event.run_id, "failed", f"Could not mark the run complete: {_sentence(exc)}")
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


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, CubepiError) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
