"""Running one assistant message's tool calls: in parallel or one after another.

:func:`execute_tool_calls` emits ``tool_execution_start`` (awaited before the tool's
work begins, so the agent can journal it first), any ``tool_execution_update``, then
``tool_execution_end`` and the result message the moment each call finishes, so the
agent persists a result before slower siblings end.

An idempotent tool (:attr:`AgentTool.idempotent`) runs through the thread's job store
when one is given (:class:`core.jobs.Jobs`): a job already done under the call's key
returns its stored result and the tool does not run.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from core.events import MessageEnd, MessageStart, ToolExecutionEnd, ToolExecutionStart, ToolExecutionUpdate
from core.jobs import Jobs, key_for
from core.messages import ContentBlock, ToolCall, ToolResultMessage, error_tool_result
from core.steps import StepLogs
from core.tools import (
    AgentTool,
    AgentToolResult,
    Emit,
    OnUpdate,
    ToolContext,
    ToolExecutionMode,
    cap_progress_text,
)

_BLOCKS: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])


def call_job_key(tool: AgentTool, call: ToolCall) -> str | None:
    """The job key ``call`` runs under: ``None`` unless ``tool`` is idempotent and the
    arguments are valid (an invalid call never runs, so it has no job)."""
    if not tool.idempotent or call.arguments_error is not None:
        return None
    try:
        params = tool.parameters.model_validate(call.arguments)
        return key_for(tool.name, params.model_dump(mode="json"), tool.job_key_from)
    except Exception:
        return None


def result_to_json(result: AgentToolResult) -> dict[str, Any]:
    """A tool result as the JSON object a job stores: ``content`` blocks, ``details``, ``is_error``."""
    return {
        "content": [b.model_dump(mode="json") for b in result.blocks()],
        "details": json.loads(json.dumps(result.details, default=str)),
        "is_error": result.is_error,
    }


def result_from_json(value: Any) -> AgentToolResult:
    """The tool result a job stored (see :func:`result_to_json`); a value of another shape
    is returned as its JSON text, so a hand-edited store never breaks a run."""
    try:
        return AgentToolResult(
            _BLOCKS.validate_python(value["content"]),
            details=value.get("details"),
            is_error=bool(value.get("is_error")),
        )
    except Exception:
        return AgentToolResult(json.dumps(value, default=str))


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A call looked up and validated: ready to run, or already answered by ``failure``."""

    call: ToolCall
    tool: AgentTool | None = None
    params: BaseModel | None = None
    key: str | None = None
    failure: AgentToolResult | None = None


@dataclass(frozen=True, slots=True)
class _Finished:
    call: ToolCall
    result: AgentToolResult
    metadata: dict[str, Any] | None = None


class _Batch:
    """The running calls of one batch and the queue through which they report.

    Tool tasks never call ``emit`` themselves: they push updates and results on one
    queue, and the batch's own coroutine emits them in order, so listeners are never
    called concurrently and a finished result is emitted at once.
    """

    def __init__(
        self,
        tools: Mapping[str, AgentTool],
        emit: Emit,
        signal: asyncio.Event,
        grace: float,
        run_id: str | None,
        jobs: Jobs | None,
        settling: bool,
        steps: StepLogs | None = None,
    ) -> None:
        self.tools = tools
        self.emit = emit
        self.signal = signal
        self.grace = grace
        self.run_id = run_id
        self.jobs = jobs
        self.settling = settling
        self.steps = steps
        self.queue: asyncio.Queue[ToolExecutionUpdate | _Finished] = asyncio.Queue()
        self.running: set[asyncio.Task[None]] = set()
        self.grace_over = False

    def prepare(self, call: ToolCall) -> _Prepared:
        if call.arguments_error is not None:
            return _Prepared(call, failure=AgentToolResult(unreadable_arguments_text(call), is_error=True))
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return _Prepared(
                call, failure=AgentToolResult(f"Unknown tool {call.name!r} (available: {known}).", is_error=True)
            )
        try:
            params = tool.parameters.model_validate(call.arguments)
        except ValidationError as exc:
            return _Prepared(call, failure=AgentToolResult(_invalid_arguments(call.name, exc), is_error=True))
        key = None
        if tool.idempotent:
            try:
                key = key_for(tool.name, params.model_dump(mode="json"), tool.job_key_from)
            except Exception as exc:
                return _Prepared(call, failure=AgentToolResult(f"Could not build the job key: {exc}", is_error=True))
        return _Prepared(call, tool, params, key)

    async def announce(self, prepared: _Prepared) -> None:
        call = prepared.call
        await self.emit(ToolExecutionStart(call.id, call.name, dict(call.arguments), job_key=prepared.key))

    def start(self, prepared: _Prepared) -> None:
        call = prepared.call
        task = asyncio.create_task(self._run(prepared), name=f"tool {call.name} {call.id}")
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, prepared: _Prepared) -> None:
        call, tool, params, key = prepared.call, prepared.tool, prepared.params, prepared.key
        if prepared.failure is not None or tool is None or params is None:
            self.queue.put_nowait(_Finished(call, prepared.failure or AgentToolResult("Not runnable.", is_error=True)))
            return
        steps = self.steps.log(key, params.model_dump(mode="json"), call.id) if key and self.steps else None
        ctx = ToolContext(call.id, self.signal, self._updater(call), key, self.grace, steps)
        reused = False
        metadata: dict[str, Any] | None = None
        try:
            if key is not None and self.jobs is not None:
                result, reused = await self._run_job(tool, ctx, params, key)
            else:
                result = await tool.invoke(ctx, params)
        except asyncio.CancelledError:
            if not self.grace_over:
                raise
            if key is not None and self.jobs is not None:
                await self.jobs.fail(key, "cancelled: the tool did not stop after the abort")
            result = AgentToolResult(
                f"aborted: the tool did not stop within {self.grace:g} s of the abort and was cancelled; "
                "its effects must be checked.",
                is_error=True,
            )
            metadata = {"settled": "aborted"}
        except Exception as exc:
            result = AgentToolResult(str(exc) or type(exc).__name__, is_error=True)
        if metadata is None:
            if self.settling:
                metadata = {"settled": "reused" if reused else "rerun"}
            elif reused:
                metadata = {"job": "reused"}
        self.queue.put_nowait(_Finished(call, result, metadata))

    async def _run_job(
        self, tool: AgentTool, ctx: ToolContext, params: BaseModel, key: str
    ) -> tuple[AgentToolResult, bool]:
        assert self.jobs is not None
        fresh: list[AgentToolResult] = []

        async def work() -> tuple[Any, bool]:
            result = await tool.invoke(ctx, params)
            fresh.append(result)
            # A result produced while the run was being aborted may be a tool's
            # "stopped early" answer rather than the real work: never reuse it.
            return result_to_json(result), not result.is_error and not ctx.signal.is_set()

        outcome = await self.jobs.run(key, work, tool_call_id=ctx.tool_call_id)
        if outcome.reused:
            return result_from_json(outcome.value), True
        return fresh[0], False

    def _updater(self, call: ToolCall) -> OnUpdate:
        def on_update(progress: float | None = None, text: str | None = None) -> None:
            if progress is not None:
                progress = min(1.0, max(0.0, progress)) if math.isfinite(progress) else None
            # Capped here, where every progress event is made, so no reader (live events,
            # the agent's state, the app) ever holds more than PROGRESS_TEXT_LIMIT of it.
            self.queue.put_nowait(ToolExecutionUpdate(call.id, call.name, progress, cap_progress_text(text)))

        return on_update

    async def drain(self, count: int) -> list[ToolResultMessage]:
        """Emit updates and results until ``count`` calls have finished; results in finish order."""
        results: list[ToolResultMessage] = []
        while len(results) < count:
            item = await self.queue.get()
            if isinstance(item, ToolExecutionUpdate):
                await self.emit(item)
            else:
                results.append(await self.finish(item))
        return results

    async def finish(self, done: _Finished) -> ToolResultMessage:
        message = ToolResultMessage(
            tool_call_id=done.call.id,
            tool_name=done.call.name,
            content=done.result.blocks(),
            details=done.result.details,
            is_error=done.result.is_error,
            run_id=self.run_id,
            metadata=done.metadata or {},
        )
        await self.emit(ToolExecutionEnd(done.call.id, done.call.name, message, message.is_error))
        await publish(message, self.emit)
        return message

    async def cancel_after_grace(self) -> None:
        await self.signal.wait()
        await asyncio.sleep(self.grace)
        self.grace_over = True
        for task in list(self.running):
            task.cancel()

    async def stop(self) -> None:
        """Cancel whatever still runs (the batch itself is being torn down)."""
        for task in list(self.running):
            task.cancel()
        if self.running:
            await asyncio.gather(*self.running, return_exceptions=True)


async def publish(message: Any, emit: Emit) -> None:
    """Emit a finished message as ``message_start`` then ``message_end``."""
    await emit(MessageStart(message))
    await emit(MessageEnd(message))


def not_run_result(call: ToolCall, run_id: str | None) -> ToolResultMessage:
    """The error result of a call skipped because the run was aborted before it started."""
    return error_tool_result(
        call, "Not run: the run was aborted before this tool started.", run_id=run_id, settled="not_run"
    )


async def execute_tool_calls(
    calls: Sequence[ToolCall],
    tools: Mapping[str, AgentTool],
    emit: Emit,
    signal: asyncio.Event,
    *,
    mode: ToolExecutionMode = "parallel",
    abort_grace: float = 5.0,
    run_id: str | None = None,
    jobs: Jobs | None = None,
    settling: bool = False,
    steps: StepLogs | None = None,
) -> list[ToolResultMessage]:
    """Run the tool ``calls`` of one assistant message and return one result per call.

    ``parallel`` starts every call at once; ``sequential`` runs them in order. For each
    call that runs: ``tool_execution_start`` (carrying the job key of an idempotent
    tool; every start of the batch is emitted, and so awaited, before any tool body
    runs), any ``tool_execution_update``, ``tool_execution_end``, then the result as
    ``message_start``/``message_end``, emitted the moment that call finishes. Results
    are returned in the order they finished.

    ``jobs``: the thread's job store; an idempotent tool then runs as a job (a done job
    returns its stored result without running; result metadata ``{"job": "reused"}``).
    ``steps``: the thread's step store; a call with a job key then gets its
    ``ToolContext.steps`` from it (:mod:`core.steps`).
    ``settling``: the calls are dangling calls of a crashed run being re-run; each
    result carries ``{"settled": "rerun"}``, or ``{"settled": "reused"}`` for a done job.

    Unknown tools, invalid arguments, arguments that could not be read
    (``ToolCall.arguments_error``: the tool is never called) and exceptions become error
    results, never raise.
    When ``signal`` is set, tools are expected to return; one still running
    ``abort_grace`` seconds later is cancelled and gets an error result starting
    "aborted" (``{"settled": "aborted"}``). Calls not yet started when the abort came
    get a "Not run" error result (only its message is emitted, no ``tool_execution_*``),
    so every call has a result. Exceptions raised by ``emit`` propagate after the
    running tools are cancelled.
    """
    batch = _Batch(tools, emit, signal, abort_grace, run_id, jobs, settling, steps)
    watcher = asyncio.create_task(batch.cancel_after_grace())
    results: list[ToolResultMessage] = []
    try:
        if mode == "parallel" and not signal.is_set():
            prepared = [batch.prepare(call) for call in calls]
            for p in prepared:
                await batch.announce(p)
            for p in prepared:
                batch.start(p)
            return await batch.drain(len(calls))
        for call in calls:
            if signal.is_set():
                skipped = not_run_result(call, run_id)
                await publish(skipped, emit)
                results.append(skipped)
                continue
            p = batch.prepare(call)
            await batch.announce(p)
            batch.start(p)
            results += await batch.drain(1)
        return results
    finally:
        watcher.cancel()
        await batch.stop()


def unreadable_arguments_text(call: ToolCall) -> str:
    """The error result text of a call whose arguments could not be read
    (``call.arguments_error`` is set): the call was not run, and the model is asked to
    make it again: a reply cut off at its limit is not used as it is (Anthropic's
    stop-reasons page answers ``max_tokens`` with "Raise max_tokens or continue the
    response", https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons),
    and a call with incomplete arguments must not run with defaults nobody gave."""
    return (
        f"The arguments of tool call {call.name!r} ({call.id}) could not be read ({call.arguments_error}); "
        "it was not run. Make the call again with complete arguments."
    )


def _invalid_arguments(name: str, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()[:5]
    )
    return f"Invalid arguments for tool {name!r}: {problems}."
