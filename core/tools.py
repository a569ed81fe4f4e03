"""Tools: what the model may call, and how one assistant message's calls are run.

Write a tool as an async function and let :func:`tool` build its schema::

    @tool
    async def read_file(path: str, ctx: ToolContext, limit: int = 200) -> str:
        \"\"\"Read a text file and return its first ``limit`` lines.\"\"\"
        ctx.report(text=f"opening {path}")
        ...

The type hints become a pydantic model (the JSON Schema the provider sees), the
docstring's first paragraph the description, and a parameter annotated
:class:`ToolContext` is injected rather than asked of the model. Subclass
:class:`AgentTool` instead when a tool needs state or a hand-written model.

:func:`execute_tool_calls` runs the calls of one assistant message, in parallel or one
after another, and emits ``tool_execution_*`` events plus each result message the moment
its tool finishes, so the agent can persist it before slower siblings end.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal, Mapping, Sequence, Union

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from core.errors import ToolDefinitionError
from core.events import AgentEvent, MessageEnd, MessageStart, ToolExecutionEnd, ToolExecutionStart, ToolExecutionUpdate
from core.messages import ContentBlock, TextContent, ToolCall, ToolResultMessage, ToolSpec, error_tool_result

Emit = Callable[[AgentEvent], Awaitable[None]]
"""Where events go: awaited once per event, never concurrently."""

OnUpdate = Callable[[Union[float, None], Union[str, None]], None]
"""Progress callback of a running tool: ``(progress fraction 0..1 or None, short text or None)``."""

ToolExecutionMode = Literal["parallel", "sequential"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class AgentToolResult:
    """What a tool returns: ``content`` (text or content blocks), tool-specific JSON ``details``,
    and ``is_error`` when the call failed in a way the model should see."""

    content: str | list[ContentBlock]
    details: Any = None
    is_error: bool = False

    def blocks(self) -> list[ContentBlock]:
        """The content as a list of blocks (a string becomes one text block)."""
        if isinstance(self.content, str):
            return [TextContent(text=self.content)] if self.content else []
        return list(self.content)


class _NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentTool:
    """A tool the model may call. Subclass it, or build one with :func:`tool`.

    ``name`` (letters, digits, ``_``, ``-``; at most 64), ``description`` and
    ``parameters`` (a pydantic model class whose JSON Schema the provider sees) describe
    it; ``idempotent`` marks tools safe to re-run after a crash (reserved for resume).
    """

    name: str = ""
    description: str = ""
    parameters: type[BaseModel] = _NoArguments
    idempotent: bool = False

    async def execute(
        self, tool_call_id: str, params: BaseModel, signal: asyncio.Event, on_update: OnUpdate
    ) -> AgentToolResult:
        """Run one call with validated ``params``.

        ``signal`` is set when the user aborts: return soon after. ``on_update(progress,
        text)`` reports progress. Raise any exception to fail the call: its message
        becomes the error result's text.
        """
        raise NotImplementedError

    @property
    def spec(self) -> ToolSpec:
        """What providers are told of this tool (built once, then cached)."""
        cached = self.__dict__.get("_spec")
        if cached is None:
            schema = self.parameters.model_json_schema()
            schema.pop("title", None)
            cached = ToolSpec(name=self.name, description=self.description, parameters=schema)
            self.__dict__["_spec"] = cached
        return cached


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Injected into a ``@tool`` function that declares a parameter of this type.

    ``signal`` is set when the user aborts the run; ``report`` sends progress.
    """

    tool_call_id: str
    signal: asyncio.Event
    on_update: OnUpdate

    def report(self, progress: float | None = None, text: str | None = None) -> None:
        """Report progress: ``progress`` a fraction 0..1 (clamped), ``text`` a short status line."""
        self.on_update(progress, text)

    @property
    def aborted(self) -> bool:
        """Whether the user asked the run to stop."""
        return self.signal.is_set()


class FunctionTool(AgentTool):
    """An :class:`AgentTool` backed by an async function; made by :func:`tool`."""

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        *,
        name: str,
        description: str,
        parameters: type[BaseModel],
        context_param: str | None,
        idempotent: bool,
    ) -> None:
        self.fn = fn
        self.name = name
        self.description = description
        self.parameters = parameters
        self.idempotent = idempotent
        self._context_param = context_param

    async def execute(
        self, tool_call_id: str, params: BaseModel, signal: asyncio.Event, on_update: OnUpdate
    ) -> AgentToolResult:
        """Call the function with the validated arguments (and the context, if it asks for one)."""
        kwargs = {field: getattr(params, field) for field in type(params).model_fields}
        if self._context_param is not None:
            kwargs[self._context_param] = ToolContext(tool_call_id, signal, on_update)
        return _as_result(await self.fn(**kwargs))

    def __repr__(self) -> str:
        return f"<tool {self.name}>"


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
) -> Any:
    """Turn an async function into a :class:`FunctionTool`; usable bare or with options.

    Every parameter needs a type hint pydantic understands (``Annotated[int,
    Field(description=...)]`` adds a description); defaults make it optional. One
    parameter may be annotated :class:`ToolContext`. The function may return a ``str``,
    an :class:`AgentToolResult`, ``None`` (empty result) or any JSON-able value (sent as
    JSON text). Raises :class:`~core.errors.ToolDefinitionError` for a sync function,
    ``*args``/``**kwargs``, positional-only or unannotated parameters, unresolvable
    hints, or an invalid name.
    """

    def build(f: Callable[..., Awaitable[Any]]) -> FunctionTool:
        tool_name = name or getattr(f, "__name__", "")
        if not inspect.iscoroutinefunction(f):
            raise ToolDefinitionError(f"Tool {tool_name!r} must be an async function (async def).")
        if not _NAME.match(tool_name):
            raise ToolDefinitionError(f"Tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'.")
        model, context_param = _parameters_model(f, tool_name)
        return FunctionTool(
            f,
            name=tool_name,
            description=description if description is not None else _first_paragraph(f),
            parameters=model,
            context_param=context_param,
            idempotent=idempotent,
        )

    return build(fn) if fn is not None else build


def _parameters_model(fn: Callable[..., Any], tool_name: str) -> tuple[type[BaseModel], str | None]:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"Tool {tool_name!r} has a type hint that cannot be resolved ({exc}).") from None
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ToolDefinitionError(
                f"Tool {tool_name!r}: parameter {param.name!r} must be a plain named parameter "
                "(no *args, **kwargs or positional-only)."
            )
        hint = hints.get(param.name)
        if hint is None:
            raise ToolDefinitionError(f"Tool {tool_name!r}: parameter {param.name!r} needs a type hint.")
        if hint is ToolContext:
            if context_param is not None:
                raise ToolDefinitionError(f"Tool {tool_name!r} declares more than one ToolContext parameter.")
            context_param = param.name
            continue
        fields[param.name] = (hint, ... if param.default is param.empty else param.default)
    model_name = "".join(part.title() for part in tool_name.replace("-", "_").split("_")) + "Arguments"
    try:
        model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
        model.model_json_schema()
    except Exception as exc:
        raise ToolDefinitionError(f"Tool {tool_name!r}: its parameters cannot become a JSON schema ({exc}).") from None
    return model, context_param


def _first_paragraph(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _as_result(value: Any) -> AgentToolResult:
    if isinstance(value, AgentToolResult):
        return value
    if value is None:
        return AgentToolResult("")
    if isinstance(value, str):
        return AgentToolResult(value)
    return AgentToolResult(json.dumps(value, default=str), details=value)


# --- executing one assistant message's calls --------------------------------------------------


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
    ) -> None:
        self.tools = tools
        self.emit = emit
        self.signal = signal
        self.grace = grace
        self.run_id = run_id
        self.queue: asyncio.Queue[ToolExecutionUpdate | _Finished] = asyncio.Queue()
        self.running: set[asyncio.Task[None]] = set()
        self.grace_over = False

    def start(self, call: ToolCall) -> None:
        task = asyncio.create_task(self._run(call), name=f"tool {call.name} {call.id}")
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, call: ToolCall) -> None:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            self.queue.put_nowait(_Finished(call, AgentToolResult(f"Unknown tool {call.name!r} (available: {known}).", is_error=True)))
            return
        try:
            params = tool.parameters.model_validate(call.arguments)
        except ValidationError as exc:
            self.queue.put_nowait(_Finished(call, AgentToolResult(_invalid_arguments(call.name, exc), is_error=True)))
            return
        metadata = None
        try:
            result = await tool.execute(call.id, params, self.signal, self._updater(call))
        except asyncio.CancelledError:
            if not self.grace_over:
                raise
            result = AgentToolResult(
                f"aborted: the tool did not stop within {self.grace:g} s of the abort and was cancelled; "
                "its effects must be checked.",
                is_error=True,
            )
            metadata = {"settled": "aborted"}
        except Exception as exc:
            result = AgentToolResult(str(exc) or type(exc).__name__, is_error=True)
        self.queue.put_nowait(_Finished(call, result, metadata))

    def _updater(self, call: ToolCall) -> OnUpdate:
        def on_update(progress: float | None = None, text: str | None = None) -> None:
            if progress is not None:
                progress = min(1.0, max(0.0, progress)) if math.isfinite(progress) else None
            self.queue.put_nowait(ToolExecutionUpdate(call.id, call.name, progress, text))

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
) -> list[ToolResultMessage]:
    """Run the tool ``calls`` of one assistant message and return one result per call.

    ``parallel`` starts every call at once; ``sequential`` runs them in order. For each
    call that runs: ``tool_execution_start``, any ``tool_execution_update``,
    ``tool_execution_end``, then the result as ``message_start``/``message_end``, emitted
    the moment that call finishes. Results are returned in the order they finished.

    Unknown tools, invalid arguments and exceptions become error results, never raise.
    When ``signal`` is set, tools are expected to return; one still running
    ``abort_grace`` seconds later is cancelled and gets an error result starting
    "aborted". Calls not yet started when the abort came get a "Not run" error result
    (only its message is emitted, no ``tool_execution_*``), so every call has a result.
    """
    batch = _Batch(tools, emit, signal, abort_grace, run_id)
    watcher = asyncio.create_task(batch.cancel_after_grace())
    results: list[ToolResultMessage] = []
    try:
        if mode == "parallel" and not signal.is_set():
            for call in calls:
                await emit(ToolExecutionStart(call.id, call.name, dict(call.arguments)))
            for call in calls:
                batch.start(call)
            return await batch.drain(len(calls))
        for call in calls:
            if signal.is_set():
                skipped = not_run_result(call, run_id)
                await publish(skipped, emit)
                results.append(skipped)
                continue
            await emit(ToolExecutionStart(call.id, call.name, dict(call.arguments)))
            batch.start(call)
            results += await batch.drain(1)
        return results
    finally:
        watcher.cancel()
        await batch.stop()


def _invalid_arguments(name: str, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()[:5]
    )
    return f"Invalid arguments for tool {name!r}: {problems}."
