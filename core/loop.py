"""The agent loop: call the model, run the tools it asks for, repeat; emit everything.

The loop is stateless apart from the transcript list it is handed (and, per run, the
request builder fed from it): it appends each finished message to that list and emits events; the :class:`~core.agent.Agent` folds the
events into its state and persists each message at ``message_end``. The loop never
touches a checkpointer; idempotent tools reach the thread's job store only through
``LoopConfig.jobs``, and their step records only through ``LoopConfig.steps``.

Shape (pi-mono's ``runLoop``): an outer ``while`` for follow-ups, an inner ``while`` for
tool calls and steering; each phase is a named helper below :func:`run_loop`. A *turn*
is one model call plus the tools it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from core.approvals import ApprovalRule
from core.errors import ToolDefinitionError
from core.events import (
    AgentEnd,
    AgentStart,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RunOutcome,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallStart,
    TurnEnd,
    TurnStart,
    UsageUpdate,
)
from core.human_wait import HumanDesk
from core.jobs import Jobs
from core.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
    error_tool_result,
)
from core.partial import append_piece
from core.providers.base import ABORTED_TEXT, ModelRequest, Provider, error_reply
from core.recovery import SettleChoice, default_settlement
from core.request import RequestBuilder, Unanswered
from core.steps import StepLogs
from core.tool_execution import execute_tool_calls, publish
from core.tools import AgentTool, Emit, ToolExecutionMode


async def settle_interrupted(calls: Sequence[ToolCall], run_id: str | None) -> list[ToolResultMessage]:
    """An error result per dangling call saying it was interrupted and not run again,
    stamped with ``run_id`` (the run that issued the calls).

    Each result carries ``metadata={"settled": "interrupted"}``.
    """
    return [
        error_tool_result(
            call,
            f"Tool call {call.name} ({call.id}) was interrupted before it returned a result and was not "
            "run again; its effects must be checked before relying on them.",
            run_id=run_id,
            settled="interrupted",
        )
        for call in calls
    ]


async def _nothing() -> list[UserMessage]:
    return []


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """Everything one run of the loop needs, fixed for the run.

    ``abort_grace`` is in seconds. Callbacks (supplied by the agent; none may raise):
    ``await get_steering()`` returns (and dequeues) user messages to deliver at the next
    turn boundary; ``await get_follow_ups()`` returns messages to deliver when the agent
    would otherwise stop. Both are awaited at that moment, so a queue kept in a store is
    claimed only when its messages are really taken (:class:`~core.supervisor.Supervisor`).

    Dangling tool calls (of a crashed run) are settled before every model call: by
    default a known idempotent tool is re-run (through ``jobs``, so a done job's result
    is reused) and any other call gets an "interrupted" error result; ``settle_choices``
    (tool call id -> ``"rerun"`` / ``"interrupt"``) overrides that per call. ``jobs`` is
    the thread's job store for idempotent tools (``None``: they simply run), ``steps`` its
    step store, from which each call with a job key gets ``ToolContext.steps``
    (:mod:`core.steps`; ``None``: no step is committed). Each settled
    result carries the ``run_id`` of the run that issued its call (cubeloop checks tool
    cycles per run, ``cubeloop/agent/_tool_cycle.py``), ``None`` when its assistant
    message has none (rows written before run ids: the result joins the same group),
    unless that run is in ``completed_runs``: a store refuses messages naming a completed
    run, so such a result carries this run's id (its call and result then sit in
    different runs, which cubeloop's per-run check reports; nothing better can be
    stored). ``approvals`` (tool name -> rule, :mod:`core.approvals`) says which calls
    wait for a person's approval before they start, and ``human`` is the run's
    :class:`~core.human_wait.HumanDesk` through which they and tool bodies ask (``None``:
    nobody can be asked; a call that needs approval is then denied). Raises
    :class:`~core.errors.ToolDefinitionError` when two tools share a name.
    """

    provider: Provider
    tools: tuple[AgentTool, ...] = ()
    system_prompt: str = ""
    tool_execution: ToolExecutionMode = "parallel"
    abort_grace: float = 5.0
    run_id: str | None = None
    get_steering: Callable[[], Awaitable[list[UserMessage]]] = _nothing
    get_follow_ups: Callable[[], Awaitable[list[UserMessage]]] = _nothing
    stop_after_turn: Callable[[], bool] = bool
    """Asked after each turn's tools: true ends the run there (no further model call): after
    tool results "aborted" (the results kept), after a final reply "completed", what is
    queued left untaken either way."""
    interrupt: asyncio.Event | None = None
    """Set to abort the running (or about to run) tools only, as an abort does; the run
    goes on at the turn boundary (with the steer that came with it). Cleared per batch."""
    settle_choices: Mapping[str, SettleChoice] = field(default_factory=dict)
    jobs: Jobs | None = None
    steps: StepLogs | None = None
    completed_runs: frozenset[str] = frozenset()
    approvals: Mapping[str, ApprovalRule] = field(default_factory=dict)
    human: HumanDesk | None = None
    tools_by_name: Mapping[str, AgentTool] = field(init=False, repr=False, compare=False)
    tool_specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)

    def settle_choice(self, call: ToolCall) -> SettleChoice:
        """How the dangling ``call`` is settled: the explicit choice, else the default."""
        chosen = self.settle_choices.get(call.id)
        if chosen is not None:
            return chosen
        tool = self.tools_by_name.get(call.name)
        return default_settlement(known=tool is not None, idempotent=tool is not None and tool.idempotent)

    def __post_init__(self) -> None:
        tools = tuple(self.tools)
        by_name: dict[str, AgentTool] = {}
        for t in tools:
            if t.name in by_name:
                raise ToolDefinitionError(f"Two tools are named {t.name!r}; tool names must be unique.")
            by_name[t.name] = t
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "tools_by_name", MappingProxyType(by_name))
        object.__setattr__(self, "tool_specs", tuple(t.spec for t in tools))


async def run_loop(
    messages: list[AnyMessage],
    config: LoopConfig,
    emit: Emit,
    signal: asyncio.Event,
    prompts: Sequence[UserMessage] = (),
    *,
    builder: RequestBuilder | None = None,
) -> RunOutcome:
    """Run the agent until it stops; return how the run ended.

    ``messages`` is the transcript (history first); the loop appends every finished
    message to it, in place, just before emitting its ``message_end``. Before every
    model call, every tool call of the whole history that has no result is settled, and
    the provider is given what :class:`~core.request.RequestBuilder` builds from the
    transcript (kept for the run and fed only the new messages, so no copy and no full
    pass per call). ``prompts`` are delivered first. The model is never called when that
    request would end with an assistant message (``RequestBuilder.needs_reply``: e.g. a
    resumed thread another writer continued past its dangling calls): the last reply is
    final, so the calls are settled, outside any turn (no model call is made), and the
    run ends ``"completed"``, waiting for the user. ``builder``: one the caller already fed
    ``messages`` (:meth:`~core.request.RequestBuilder.update`), so the history is read once
    per run, not once by the caller and again here (a pass costs ~3 us a message: ~0.3 s of
    the event loop at 100,000); ``None``: a new one.
    Emits ``agent_start`` ... ``agent_end``. Setting ``signal`` aborts: the run then ends
    with an assistant message whose ``stop_reason`` is ``"aborted"``. Exceptions raised
    by ``emit`` propagate (running tools are cancelled first), and so does
    :class:`~core.human_wait.EndedWaiting` when a call's question ends the run waiting
    for its answer (no ``agent_end`` is emitted then: the agent ends the run ``"waiting"``).
    """
    keep_unstamped: set[str] = set()
    emit = _recording(messages, emit, config.run_id, keep_unstamped)
    if builder is None:
        builder = RequestBuilder()
    await emit(AgentStart(config.run_id or ""))
    pending = [*prompts, *await _poll(config.get_steering, signal)]
    has_tool_calls = True
    stopping = False
    while True:
        while has_tool_calls or pending:
            builder.update(messages)
            if not pending and not builder.needs_reply():
                await _settle_dangling(messages, builder, config, emit, signal, keep_unstamped)
                has_tool_calls = False
                break
            await emit(TurnStart())
            await _settle_dangling(messages, builder, config, emit, signal, keep_unstamped)
            for message in pending:
                await publish(message, emit)
            reply = await _stream_reply(messages, builder, config, emit, signal)
            if reply.stop_reason in ("error", "aborted"):
                await emit(TurnEnd(reply))
                return await _end(reply, config, emit)
            results = await _run_tools(reply, config, emit, signal)
            await emit(TurnEnd(reply, tuple(results)))
            has_tool_calls = bool(results)
            if config.stop_after_turn():
                if not has_tool_calls:
                    # A final reply: the run is done here. Queued steers and follow-ups are
                    # not taken (no further model call); they wait for the next run.
                    stopping = True
                    break
                # The results are kept; ending as an abort does reads "aborted" (not a crash).
                stopped = _aborted(AssistantMessage(content=[]), STOPPED_TEXT)
                await publish(stopped, emit)
                return await _end(stopped, config, emit)
            pending = await _poll(config.get_steering, signal)
        pending = [] if stopping else await _poll(config.get_follow_ups, signal)
        if not pending:
            break
    await emit(AgentEnd(config.run_id or "", "completed"))
    return "completed"


def _recording(messages: list[AnyMessage], emit: Emit, run_id: str | None, keep_unstamped: set[str]) -> Emit:
    # Every message_end goes through here, so the transcript is exactly the finished
    # messages in emission order, each tagged with the run - except the settled results
    # of calls whose assistant message has no run id (tool call ids in
    # ``keep_unstamped``): those keep ``None``, their call's group.
    async def record(event) -> None:  # type: ignore[no-untyped-def]
        if type(event) is MessageEnd:
            message = event.message
            if message.run_id is None and not (
                isinstance(message, ToolResultMessage) and message.tool_call_id in keep_unstamped
            ):
                message.run_id = run_id
            messages.append(event.message)
        await emit(event)

    return record


async def _poll(get: Callable[[], Awaitable[list[UserMessage]]], signal: asyncio.Event) -> list[UserMessage]:
    # After an abort, queued messages stay queued with the agent rather than being
    # taken and dropped.
    return [] if signal.is_set() else list(await get())


async def _settle_dangling(
    messages: list[AnyMessage],
    builder: RequestBuilder,
    config: LoopConfig,
    emit: Emit,
    signal: asyncio.Event,
    keep_unstamped: set[str],
) -> None:
    # Call by call, over the whole history: a partly answered batch only has its missing
    # calls here, and calls left unanswered before a later reply (another writer went on)
    # are settled too. Grouped by the run that issued them, so each result carries it.
    builder.update(messages)
    calls = builder.unanswered()
    if not calls:
        return
    groups: dict[str | None, list[Unanswered]] = {}
    for pending in calls:
        run_id = _issuing_run(pending, config)
        if run_id is None:
            keep_unstamped.add(pending.call.id)
        groups.setdefault(run_id, []).append(pending)
    for run_id, group in groups.items():
        interrupt = [p.call for p in group if config.settle_choice(p.call) != "rerun"]
        for result in await settle_interrupted(interrupt, run_id):
            await publish(result, emit)
        rerun = [p.call for p in group if config.settle_choice(p.call) == "rerun"]
        if rerun:
            await _execute(rerun, dataclasses.replace(config, run_id=run_id), emit, signal, settling=True)


def _issuing_run(pending: Unanswered, config: LoopConfig) -> str | None:
    run_id = pending.message.run_id
    if run_id is not None and run_id in config.completed_runs:
        return config.run_id
    return run_id


async def _stream_reply(
    messages: list[AnyMessage], builder: RequestBuilder, config: LoopConfig, emit: Emit, signal: asyncio.Event
) -> AssistantMessage:
    provider = config.provider
    partial = AssistantMessage(provider_id=provider.name, model_id=provider.model, run_id=config.run_id)
    await emit(MessageStart(partial))
    if signal.is_set():
        reply = _aborted(partial)
    else:
        builder.update(messages)
        request = ModelRequest(config.system_prompt, builder.request(), config.tool_specs)
        reply = await _consume(provider.stream(request, signal), partial, config, emit, signal)
    reply.run_id = config.run_id
    if reply.stop_reason in ("error", "aborted") and reply.tool_calls:
        # A call that will never run must not be recorded, or the thread would look mid-tool.
        reply.content = [b for b in reply.content if not isinstance(b, ToolCall)]
    await emit(MessageEnd(reply))
    return reply


async def _run_tools(
    reply: AssistantMessage, config: LoopConfig, emit: Emit, signal: asyncio.Event
) -> list[ToolResultMessage]:
    calls = reply.tool_calls
    if not calls:
        return []
    if config.interrupt is None:
        return await _execute(calls, config, emit, signal)
    tools_signal = asyncio.Event()  # the run's abort, or an interrupt of these tools only
    relay = asyncio.create_task(_set_on_either(signal, config.interrupt, tools_signal))
    try:
        return await _execute(calls, config, emit, tools_signal)
    finally:
        relay.cancel()
        config.interrupt.clear()


async def _set_on_either(a: asyncio.Event, b: asyncio.Event, out: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        out.set()
    finally:
        for w in waits:
            w.cancel()


async def _execute(
    calls: Sequence[ToolCall], config: LoopConfig, emit: Emit, signal: asyncio.Event, *, settling: bool = False
) -> list[ToolResultMessage]:
    return await execute_tool_calls(
        calls,
        config.tools_by_name,
        emit,
        signal,
        mode=config.tool_execution,
        abort_grace=config.abort_grace,
        run_id=config.run_id,
        jobs=config.jobs,
        settling=settling,
        steps=config.steps,
        approvals=config.approvals,
        desk=config.human,
    )


async def _end(reply: AssistantMessage, config: LoopConfig, emit: Emit) -> RunOutcome:
    outcome: RunOutcome = "aborted" if reply.stop_reason == "aborted" else "failed"
    error = (reply.error_message or "The model call failed.") if outcome == "failed" else None
    await emit(AgentEnd(config.run_id or "", outcome, error))
    return outcome


# --- consuming one provider stream ------------------------------------------------------------

_BUFFER = 64


@dataclass(frozen=True, slots=True)
class _Failure:
    text: str


_ABORT = _Failure(ABORTED_TEXT)


async def _consume(
    stream: AsyncIterator[StreamEvent],
    partial: AssistantMessage,
    config: LoopConfig,
    emit: Emit,
    signal: asyncio.Event,
) -> AssistantMessage:
    # The provider is read by its own task so an abort is noticed even while the
    # provider waits on the network; the watcher wakes us through the same queue.
    queue: asyncio.Queue[StreamEvent | _Failure] = asyncio.Queue(maxsize=_BUFFER)
    pump = asyncio.create_task(_pump(stream, queue))
    watcher = asyncio.create_task(_put_when_set(signal, queue))
    try:
        while True:
            item = await queue.get()
            if signal.is_set():
                return _aborted(partial)
            if isinstance(item, StreamEnd):
                return item.message
            if isinstance(item, _Failure):
                failed = error_reply(config.provider, item.text, content=partial.content)
                failed.usage = partial.usage
                return failed
            _apply_delta(partial, item)
            await emit(MessageUpdate(partial, item))
    finally:
        pump.cancel()
        watcher.cancel()
        await asyncio.gather(pump, watcher, return_exceptions=True)


async def _pump(stream: AsyncIterator[StreamEvent], queue: asyncio.Queue[StreamEvent | _Failure]) -> None:
    try:
        async for event in stream:
            await queue.put(event)
            if isinstance(event, StreamEnd):
                return
        await queue.put(_Failure("The provider ended its stream without a final message."))
    except Exception as exc:
        # Providers must not raise; if one does, the run fails with a sentence, not a traceback.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        await queue.put(_Failure(f"The provider failed unexpectedly: {reason}"))
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _put_when_set(signal: asyncio.Event, queue: asyncio.Queue[StreamEvent | _Failure]) -> None:
    await signal.wait()
    await queue.put(_ABORT)


def _aborted(partial: AssistantMessage, why: str = ABORTED_TEXT) -> AssistantMessage:
    partial.stop_reason = "aborted"
    partial.error_message = why
    return partial


STOPPED_TEXT = "Stopped after this turn, as the user asked."
"""The note of the empty reply that ends a run stopped after a turn (``stop_after_turn``)."""


def _apply_delta(message: AssistantMessage, delta: StreamEvent) -> None:
    """Apply one stream delta to the partial reply in place (no copy per delta).

    Tool call arguments are not parsed while they stream: the final message carries them.
    A usage snapshot replaces the partial's usage, so an aborted reply keeps what the
    provider reported; a retry wait changes nothing (listeners show it).
    """
    blocks = message.content
    if isinstance(delta, TextDelta):
        append_piece(message, delta.index, "text", delta.delta)
    elif isinstance(delta, ThinkingDelta):
        append_piece(message, delta.index, "thinking", delta.delta)
    elif isinstance(delta, ToolCallStart):
        blocks.append(ToolCall(id=delta.id, name=delta.name))
    elif isinstance(delta, UsageUpdate):
        message.usage = delta.usage.model_copy()
