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

:func:`core.tool_execution.execute_tool_calls` runs the calls of one assistant message.
A tool declared ``idempotent`` runs as a job under a deterministic key
(:mod:`core.jobs`): the key reaches the tool as ``ToolContext.job_key``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from core.errors import ToolDefinitionError, ToolError
from core.events import AgentEvent
from core.messages import ContentBlock, TextContent, ToolSpec

if TYPE_CHECKING:
    from core.hitl import Option, Question
    from core.steps import StepLog

Emit = Callable[[AgentEvent], Awaitable[None]]
"""Where events go: awaited once per event, never concurrently."""

OnUpdate = Callable[[float | None, str | None], None]
"""Progress callback of a running tool: ``(progress fraction 0..1 or None, short text or None)``."""

ToolExecutionMode = Literal["parallel", "sequential"]

PROGRESS_TEXT_LIMIT = 4096
"""Characters of one progress text kept (:func:`cap_progress_text`). Progress is a short
status line, superseded by the next report; a tool that reports its whole output so far
(2 MB without a newline) would otherwise have every report buffered, written to the live
events and drawn whole. 4,096 characters keep the last lines of a log or the latest
frame of a redrawn progress bar with room to spare; the app shows less still
(``tui.tool_output.PROGRESS``)."""

_BOUNDARY = re.compile(r"[\r\n]+")
"""Where a frame (after ``\\r``) or a line (after ``\\n``) starts: :func:`cap_progress_text` cuts there."""


def cap_progress_text(text: str | None) -> str | None:
    """``text`` cut to at most its last :data:`PROGRESS_TEXT_LIMIT` characters, below a line
    saying how many came before (``"… 2,093,056 earlier characters cut …"``); shorter text
    and ``None`` are returned as they are. The end is kept because it is the newest output.

    The cut falls where a ``\\r`` frame or a line starts, when the kept end holds such a
    start with something after it: a display collapses frames as a terminal does (each
    ``\\r`` overwrites from column 0, ``tui.tool_output.collapse_frames``), so a frame cut in
    the middle would be drawn from column 0 and show through the frames after it (a stray
    ``]`` behind a progress bar), and the note on the same line would be overwritten. The
    note is a line of its own for the same reason. Only text with no such start (2 MB
    without a newline or ``\\r``, or one frame longer than the limit) is cut mid-frame: that
    frame is the newest, and nothing after it overwrites the note. Costs
    O(:data:`PROGRESS_TEXT_LIMIT`), whatever the length of ``text``."""
    if text is None or len(text) <= PROGRESS_TEXT_LIMIT:
        return text
    kept = text[-PROGRESS_TEXT_LIMIT:]
    boundary = _BOUNDARY.search(kept)
    if boundary is not None and boundary.end() < len(kept):
        kept = kept[boundary.end() :]
    return f"… {len(text) - len(kept):,} earlier characters cut …\n" + kept


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
    it. ``idempotent`` marks a tool whose repeated call with the same arguments does no
    more harm than one: it then runs as a job (a done job's result is reused, see
    :mod:`core.jobs`), and resume re-runs it instead of recording it as interrupted.
    ``job_key_from`` optionally builds the job key from the validated arguments (set it
    with :func:`core.jobs.idempotent`).

    Override :meth:`execute`, or :meth:`invoke` to receive the whole :class:`ToolContext`
    (including ``job_key``).
    """

    name: str = ""
    description: str = ""
    parameters: type[BaseModel] = _NoArguments
    idempotent: bool = False
    job_key_from: Callable[[Mapping[str, Any]], str] | None = None

    async def execute(
        self, tool_call_id: str, params: BaseModel, signal: asyncio.Event, on_update: OnUpdate
    ) -> AgentToolResult:
        """Run one call with validated ``params``.

        ``signal`` is set when the user aborts: return soon after. ``on_update(progress,
        text)`` reports progress. Raise any exception to fail the call: its message
        becomes the error result's text (what else a tool may raise, ``sys.exit()``
        included: :func:`core.tool_execution.call_tool`).
        """
        raise NotImplementedError

    async def invoke(self, ctx: ToolContext, params: BaseModel) -> AgentToolResult:
        """Run one call given its context; the executor calls this. By default it calls
        :meth:`execute` with the context's parts."""
        return await self.execute(ctx.tool_call_id, params, ctx.signal, ctx.on_update)

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


class HumanChannel:
    """How a running tool asks a person (``ToolContext.human``); cubeloop's HITL channel.

    Each call persists the question as the thread's pending request (cubeloop's wire
    format, :mod:`core.hitl`), waits for the one answer recorded in the store (from the
    app, ``cubepi-tui answer`` or another process), and returns it:

    * ``await ctx.human.confirm("Delete 3 files?")`` -> ``bool``;
    * ``await ctx.human.ask_text("Which branch?")`` -> ``str``;
    * ``await ctx.human.ask_choice("Where?", ["staging", "prod"], multi=False)`` -> the
      chosen value (a ``list[str]`` with ``multi=True``);
    * ``await ctx.human.ask([Question(...), ...])`` -> ``{key: str | list[str]}``.

    ``timeout`` is seconds counted from when the question was persisted (so a crash does
    not restart it); at the deadline ``default`` is recorded as the answer (a person who
    answered first wins) and the tool's result says so ("no answer in 60 s; the default
    was used: ..."); without a default, or without a timeout when the run is detached
    (``Agent.detach()``), the run ends **waiting for an answer**. An abort while waiting
    ends the call with an error result starting "aborted:".

    **A resume re-runs the tool body from the top**: ask before any side effect. The run
    that ended waiting is continued by resuming once the question is answered; the body
    is entered again and the same question, asked again in the same order, gets the
    stored answer at once. Once a body has its answer the question is settled, so a
    crash after that point leaves an ordinary interrupted call, never a second run of
    what followed the question.

    This base class is what a tool gets where no person can be asked (a store that
    keeps no answers, a tool called outside a run): every method raises
    :class:`~core.errors.ToolError` saying so, which becomes the call's error result.
    """

    async def confirm(self, prompt: str, *, timeout: float | None = None, default: bool | None = None) -> bool:
        """Ask yes or no; see the class docstring."""
        raise ToolError(NO_HUMAN)

    async def ask_text(self, prompt: str, *, timeout: float | None = None, default: str | None = None) -> str:
        """Ask for free text; see the class docstring."""
        raise ToolError(NO_HUMAN)

    async def ask_choice(
        self,
        prompt: str,
        options: typing.Sequence[str | Option],
        *,
        multi: bool = False,
        timeout: float | None = None,
        default: str | typing.Sequence[str] | None = None,
    ) -> str | list[str]:
        """Ask for one of ``options`` (or several with ``multi``); see the class docstring."""
        raise ToolError(NO_HUMAN)

    async def ask(
        self,
        questions: typing.Sequence[Question],
        *,
        timeout: float | None = None,
        default: Mapping[str, str | list[str]] | None = None,
    ) -> dict[str, str | list[str]]:
        """Ask several questions at once (cubeloop's ``ask``); see the class docstring."""
        raise ToolError(NO_HUMAN)


NO_HUMAN = (
    "No person can be asked here: this store keeps no answers to human requests "
    "(open a database of this project's, not a cubeloop file), or the tool runs outside an agent's run."
)
"""The error text of :class:`HumanChannel`'s methods where nobody can be asked."""

NOBODY = HumanChannel()
"""The channel of a tool where no person can be asked."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Injected into a ``@tool`` function that declares a parameter of this type.

    ``signal`` is set when the user aborts the run; ``report`` sends progress.
    ``job_key`` is the call's job key when the tool is idempotent (else ``None``): pass
    it to any external system as *its* idempotency key, so a side effect made just before
    a crash is not made twice when resume re-runs the call (see :mod:`core.jobs`).
    ``abort_grace`` is the seconds the tool has, once ``signal`` is set, before the
    executor cancels it (the agent's ``abort_grace``); :func:`core.processes.run_process`
    times its SIGTERM-then-SIGKILL of a child's process group by it.
    ``steps`` is the call's step log (:mod:`core.steps`): a long idempotent tool commits
    its progress there, so a re-run after a crash continues from its last committed step;
    ``None`` when the store keeps no steps or the call has no job key (not idempotent).
    ``human`` asks a person and waits for the answer (:class:`HumanChannel`: read its
    note on resume, which re-runs the body from the top).
    """

    tool_call_id: str
    signal: asyncio.Event
    on_update: OnUpdate
    job_key: str | None = None
    abort_grace: float = 5.0
    steps: StepLog | None = None
    human: HumanChannel = NOBODY

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
        """Call the function with the validated arguments (and a context without job key)."""
        return await self.invoke(ToolContext(tool_call_id, signal, on_update), params)

    async def invoke(self, ctx: ToolContext, params: BaseModel) -> AgentToolResult:
        """Call the function with the validated arguments (and ``ctx``, if it asks for one)."""
        kwargs = {field: getattr(params, field) for field in type(params).model_fields}
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
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
