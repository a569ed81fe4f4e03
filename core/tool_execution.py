"""Running one assistant message's tool calls: in parallel or one after another.

:func:`execute_tool_calls` emits ``tool_execution_start`` (awaited before the tool's
work begins, so the agent can journal it first), any ``tool_execution_update``, then
``tool_execution_end`` and the result message the moment each call finishes, so the
agent persists a result before slower siblings end.

An idempotent tool (:attr:`AgentTool.idempotent`) runs through the thread's job store
when one is given (:class:`core.jobs.Jobs`): a job already done under the call's key
returns its stored result and the tool does not run.

A call the approval policy asks about (:mod:`core.approvals`) waits for its answer
between its validation and its ``tool_execution_start`` (:meth:`_Batch.approve`, through
:class:`core.human_wait.HumanDesk`), so the journal never says "started" for a call that
waits; a tool body asks through ``ToolContext.human`` (:class:`core.human_wait.CallHuman`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from signal import SIGINT, default_int_handler, getsignal
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from core.approvals import Always, ApprovalRule, AskFor, needs_approval
from core.events import (
    HumanRequestStarted,
    MessageEnd,
    MessageStart,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.hitl import ApprovalAnswer, ApproveRequest
from core.hitl_replies import check_answer, dump_answer
from core.hitl_results import HumanOutcome, aborted_result, approval_result, policy_denial_result, with_hitl
from core.human_wait import AbortedWhileWaiting, CallHuman, EndedWaiting, HumanDesk, WaitEnded, default_note
from core.jobs import Jobs, key_for
from core.messages import ContentBlock, TextContent, ToolCall, ToolResultMessage, error_tool_result
from core.steps import StepLogs
from core.tools import (
    NOBODY,
    AgentTool,
    AgentToolResult,
    Emit,
    HumanChannel,
    OnUpdate,
    ToolContext,
    ToolExecutionMode,
    cap_progress_text,
)

_BLOCKS: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])

_log = logging.getLogger(__name__)

NO_APPROVAL_STORE = (
    "This call needs a person's approval, and this store keeps no answers to human requests, so it was not run."
)
"""The policy denial of a call that needs approval where no answer can be recorded."""


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
    """A call looked up and validated: ready to run, or already answered by ``failure``.

    After an approval: ``asked`` is the request to settle once the result is appended,
    ``hitl`` what goes into the result's ``details["hitl"]``, ``args`` the arguments it
    runs with (an edit's), ``note`` what the result says of a default used; ``quiet``
    marks a call that never starts (denied, or aborted while it waited), so its start is
    neither announced nor journaled."""

    call: ToolCall
    tool: AgentTool | None = None
    params: BaseModel | None = None
    key: str | None = None
    failure: AgentToolResult | None = None
    asked: str | None = None
    hitl: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    note: str | None = None
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class _Finished:
    call: ToolCall
    result: AgentToolResult
    metadata: dict[str, Any] | None = None
    asked: str | None = None
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class _Suspended:
    """A tool body's question ended the run as waiting (:class:`~core.human_wait.EndedWaiting`)."""

    call: ToolCall
    ended: EndedWaiting


def _blocked(outcome: HumanOutcome) -> AgentToolResult:
    return AgentToolResult(outcome.text or "", details={"hitl": outcome.hitl}, is_error=outcome.is_error)


async def call_tool(tool: AgentTool, ctx: ToolContext, params: BaseModel) -> AgentToolResult:
    """Run ``tool``'s body for one call: the one place the executor calls tool code, and
    the one rule for what that code may raise through it.

    Tool code is untrusted: it runs in the host's process (the app, ``cubepi-tui run``,
    any program running an agent), and whatever it raises must end *its call*, never the
    host. An ``Exception`` propagates to the caller, which makes it the call's error
    result (its text) and, for a job, records the job failed. Of the ``BaseException``
    subclasses that are not ``Exception`` (Python's exception hierarchy,
    https://docs.python.org/3/library/exceptions.html#exception-hierarchy), only what the
    host itself raises through the tool propagates:

    * ``asyncio.CancelledError`` while this call's task is being cancelled
      (``Task.cancelling()``): the abort's grace ran out, or the batch is torn down. One
      the tool raised or let through from something else it awaited, its own task not
      cancelled, is no abort; it becomes the call's error result.
    * :class:`~core.human_wait.WaitEnded`: the run's wait for a person ended, raised
      through the body by ``ctx.human`` (a ``BaseException`` so the body cannot swallow it).
    * ``KeyboardInterrupt`` where SIGINT's handler raises it, so it may be the user's
      Ctrl-C and must win: Python's default handler, or ``asyncio.Runner``'s on a second
      Ctrl-C (its first cancels the main task: "Handling Keyboard Interruption",
      https://docs.python.org/3/library/asyncio-runner.html#handling-keyboard-interruption).
      The app and ``cubepi-tui run`` handle SIGINT themselves (it aborts the run), so
      there a ``KeyboardInterrupt`` can only be the tool's own and is its error result.

    Anything else becomes the call's error result in one sentence, the run going on:
    ``SystemExit`` (``sys.exit()``; asyncio re-raises it and ``KeyboardInterrupt`` out of
    a task through the event loop, which would end the host at once and skip every
    save and abort on the way), ``GeneratorExit`` and a tool's own ``BaseException``
    subclasses (without this rule their task would end with no result and the batch
    would wait for it forever). ``GeneratorExit`` is asyncio's only when it closes the
    coroutine of a pending task lost to garbage collection, which the batch's reference
    to every running task rules out; here it is the tool's own. A tool can still end the
    process by other means (``os._exit``, a signal, an exception raised in a task of its
    own): those are outside what an exception rule can hold.
    """
    try:
        return await tool.invoke(ctx, params)
    except (Exception, WaitEnded):
        raise  # the caller's: an error result with the text, or the run's wait ended
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        return AgentToolResult(escaped_sentence(asyncio.CancelledError()), is_error=True)
    except KeyboardInterrupt as exc:
        if _sigint_raises():
            raise
        return AgentToolResult(escaped_sentence(exc), is_error=True)
    except BaseException as exc:
        return AgentToolResult(escaped_sentence(exc), is_error=True)


def escaped_sentence(exc: BaseException) -> str:
    """The error result text of a call whose tool raised ``exc``, a ``BaseException`` a
    tool may not end its host with (see :func:`call_tool`)."""
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else repr(exc.code)
        return (
            f"The tool called sys.exit({code}); a tool cannot end the program that runs it, "
            "so this call failed and the run goes on."
        )
    if isinstance(exc, KeyboardInterrupt):
        return (
            "The tool raised KeyboardInterrupt; only the user's Ctrl-C stops a run, "
            "so this call failed and the run goes on."
        )
    if isinstance(exc, asyncio.CancelledError):
        return (
            "The tool raised asyncio.CancelledError although nothing cancelled its call; "
            "this call failed and the run goes on."
        )
    detail = f" ({exc})" if str(exc) else ""
    return (
        f"The tool raised {type(exc).__name__}{detail}, which no tool may end the run with; "
        "this call failed and the run goes on."
    )


def _sigint_raises() -> bool:
    """Whether SIGINT's current handler raises ``KeyboardInterrupt`` (see :func:`call_tool`)."""
    handler = getsignal(SIGINT)
    if handler is default_int_handler:
        return True
    # asyncio.Runner installs functools.partial(runner._on_sigint, main_task=...).
    owner = getattr(getattr(handler, "func", None), "__self__", None)
    return isinstance(owner, asyncio.Runner)


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
        approvals: Mapping[str, ApprovalRule] | None = None,
        desk: HumanDesk | None = None,
    ) -> None:
        self.tools = tools
        self.emit = emit
        self.signal = signal
        self.grace = grace
        self.run_id = run_id
        self.jobs = jobs
        self.settling = settling
        self.steps = steps
        self.approvals = approvals or {}
        self.desk = desk
        self.queue: asyncio.Queue[ToolExecutionUpdate | HumanRequestStarted | _Finished | _Suspended] = asyncio.Queue()
        self.running: set[asyncio.Task[None]] = set()
        self.unfinished: dict[str, ToolCall] = {}  # started, result not yet emitted
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

    async def approve(self, prepared: _Prepared) -> _Prepared:
        """Ask for the approval the policy wants of ``prepared`` (if any) and wait for its
        answer, before the call is announced: the journal never says "started" for a call
        that waits. Returns the call to run (with an edit's arguments) or a quiet failure
        (denied, or aborted while waiting). Raises
        :class:`~core.human_wait.EndedWaiting` when the run ends waiting for the answer."""
        call, tool, params = prepared.call, prepared.tool, prepared.params
        if prepared.failure is not None or tool is None or params is None:
            return prepared
        rule = self.approvals.get(tool.name)
        if not needs_approval(rule, params):
            return prepared
        assert isinstance(rule, Always | AskFor)  # needs_approval is false for no rule and NEVER
        if self.desk is None or not self.desk.available:
            return _Prepared(call, failure=_blocked(policy_denial_result(NO_APPROVAL_STORE)), quiet=True)
        args = params.model_dump(mode="json")
        timeout, default = rule.timeout, rule.default
        default_json = None
        if default is not None and timeout is not None:
            # A default denial's reason is the sentence the model reads, so it says what happened.
            reason = default_note(timeout, default) if default == "deny" else None
            default_json = dump_answer(ApprovalAnswer(decision=default, reason=reason))
        try:
            answered = await self.desk.wait_for(
                ApproveRequest(tool_name=tool.name, tool_call_id=call.id, args=args),
                run_id=self.run_id,
                question_id=call.id,
                tool_call_id=call.id,
                announce=self.emit,
                timeout=timeout,
                default_json=default_json,
            )
        except AbortedWhileWaiting as exc:
            return _Prepared(call, failure=_blocked(aborted_result(exc.sentence)), quiet=True, asked=call.id)
        try:
            answer = check_answer(answered.request, answered.answer_json)
        except ValueError as exc:
            text = f"The stored answer to this approval cannot be applied ({exc}); the call was not run."
            return _Prepared(call, failure=AgentToolResult(text, is_error=True), quiet=True, asked=call.id)
        assert isinstance(answer, ApprovalAnswer)
        outcome = approval_result(answer, args)
        if not outcome.runs_tool:
            return _Prepared(call, failure=_blocked(outcome), quiet=True, asked=call.id)
        if answer.decision == "edit":
            try:
                params = tool.parameters.model_validate(answer.edited_args or {})
            except ValidationError as exc:
                failure = AgentToolResult(
                    _invalid_arguments(call.name, exc) + " (the edited arguments; the call was not run)",
                    details={"hitl": outcome.hitl},
                    is_error=True,
                )
                return _Prepared(call, failure=failure, quiet=True, asked=call.id)
            args = params.model_dump(mode="json")
        key = prepared.key
        if tool.idempotent and answer.decision == "edit":
            try:
                key = key_for(tool.name, args, tool.job_key_from)
            except Exception as exc:
                failure = AgentToolResult(f"Could not build the job key: {exc}", is_error=True)
                return _Prepared(call, failure=failure, quiet=True, asked=call.id)
        note = answered.note(answer.decision)
        return _Prepared(call, tool, params, key, hitl=outcome.hitl, args=args, asked=call.id, note=note)

    async def announce(self, prepared: _Prepared) -> None:
        call = prepared.call
        args = prepared.args if prepared.args is not None else dict(call.arguments)
        await self.emit(ToolExecutionStart(call.id, call.name, args, job_key=prepared.key))

    def start(self, prepared: _Prepared) -> None:
        call = prepared.call
        self.unfinished[call.id] = call
        task = asyncio.create_task(self._run(prepared), name=f"tool {call.name} {call.id}")
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    def _human(self, call: ToolCall) -> HumanChannel:
        if self.desk is None or not self.desk.available:
            return NOBODY

        async def announce(event: HumanRequestStarted) -> None:
            # Tool tasks never emit: the batch's coroutine does, in order (see the class docstring).
            self.queue.put_nowait(event)

        return CallHuman(self.desk, self.run_id, call.id, announce)

    async def _run(self, prepared: _Prepared) -> None:
        call, tool, params, key = prepared.call, prepared.tool, prepared.params, prepared.key
        if prepared.failure is not None or tool is None or params is None:
            failure = prepared.failure or AgentToolResult("Not runnable.", is_error=True)
            self.queue.put_nowait(_Finished(call, failure, asked=prepared.asked, quiet=prepared.quiet))
            return
        steps = self.steps.log(key, params.model_dump(mode="json"), call.id) if key and self.steps else None
        human = self._human(call)
        ctx = ToolContext(call.id, self.signal, self._updater(call), key, self.grace, steps, human)
        reused = False
        metadata: dict[str, Any] | None = None
        try:
            if key is not None and self.jobs is not None:
                result, reused = await self._run_job(tool, ctx, params, key)
            else:
                result = await call_tool(tool, ctx, params)
        except EndedWaiting as ended:
            self.queue.put_nowait(_Suspended(call, ended))
            return
        except AbortedWhileWaiting as exc:
            result = _blocked(aborted_result(exc.sentence))
            metadata = {"settled": "aborted"}
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
        notes = [prepared.note] if prepared.note else []
        notes += human.notes if isinstance(human, CallHuman) else []
        self.queue.put_nowait(_Finished(call, _told(result, prepared.hitl, notes), metadata, prepared.asked))

    async def _run_job(
        self, tool: AgentTool, ctx: ToolContext, params: BaseModel, key: str
    ) -> tuple[AgentToolResult, bool]:
        assert self.jobs is not None
        fresh: list[AgentToolResult] = []

        async def work() -> tuple[Any, bool]:
            result = await call_tool(tool, ctx, params)
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
            if isinstance(item, ToolExecutionUpdate | HumanRequestStarted):
                await self.emit(item)
            elif isinstance(item, _Suspended):
                await self.suspend(item)
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
        self.unfinished.pop(done.call.id, None)
        if not done.quiet:  # a call that never started has no end either
            await self.emit(ToolExecutionEnd(done.call.id, done.call.name, message, message.is_error))
        await publish(message, self.emit)
        if done.asked is not None:
            await self.settle(done.asked)
        return message

    async def settle(self, question_id: str) -> None:
        """Settle the approval ``question_id`` once its call's result is appended (cubeloop's
        order: a crash before leaves the request and its answer for the resume). A failure
        is logged: the agent settles what is left when the run's calls all have results."""
        if self.desk is None:
            return
        try:
            await self.desk.settle(self.run_id, question_id)
        except Exception:
            _log.warning("could not settle the human request %s", question_id, exc_info=True)

    async def suspend(self, item: _Suspended) -> None:
        """End the batch as waiting for the answer ``item``'s call asked for: the calls
        still running are cancelled and recorded as interrupted (so the asking call is the
        one the resume gives the answer to), then :class:`~core.human_wait.EndedWaiting`
        is raised; calls not started stay without result (the resume runs them)."""
        self.unfinished.pop(item.call.id, None)
        await self.stop()
        for call in list(self.unfinished.values()):
            interrupted = error_tool_result(
                call,
                f"Tool call {call.name} ({call.id}) was stopped because the run ended waiting for an answer to "
                "another call; it was not run again, and its effects must be checked.",
                run_id=self.run_id,
                settled="interrupted",
            )
            self.unfinished.pop(call.id, None)
            await publish(interrupted, self.emit)
        raise item.ended

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
    approvals: Mapping[str, ApprovalRule] | None = None,
    desk: HumanDesk | None = None,
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
    results, never raise; so does any ``BaseException`` a tool may not end its host with
    (``sys.exit()`` among them: the rule is :func:`call_tool`'s).
    When ``signal`` is set, tools are expected to return; one still running
    ``abort_grace`` seconds later is cancelled and gets an error result starting
    "aborted" (``{"settled": "aborted"}``). Calls not yet started when the abort came
    get a "Not run" error result (only its message is emitted, no ``tool_execution_*``),
    so every call has a result. Exceptions raised by ``emit`` propagate after the
    running tools are cancelled.

    Human requests (:mod:`core.human_wait`, through ``desk``; ``None``: nobody can be
    asked). A call whose tool's rule in ``approvals`` asks (:mod:`core.approvals`) waits
    for its approval after it is validated and before its start is announced, one call
    at a time (in parallel mode every approval is asked before any call starts); a denial
    becomes its error result (the reason, ``details["hitl"]``) without a start, an edit
    runs with the edited arguments, an approval merges ``details["hitl"]`` into the tool's
    own result; the request is settled once the result is emitted. A tool body asks
    through ``ToolContext.human``. Where no answer can be stored, a call that needs
    approval is denied by the policy, never run unasked. When the run ends waiting for an
    answer, :class:`~core.human_wait.EndedWaiting` propagates: results already emitted
    stay, calls still running are cancelled and recorded as interrupted, calls not
    started stay without result.
    """
    batch = _Batch(tools, emit, signal, abort_grace, run_id, jobs, settling, steps, approvals, desk)
    watcher = asyncio.create_task(batch.cancel_after_grace())
    results: list[ToolResultMessage] = []

    async def skip(call: ToolCall) -> None:
        skipped = not_run_result(call, run_id)
        await publish(skipped, emit)
        results.append(skipped)

    try:
        if mode == "parallel" and not signal.is_set():
            approved: list[_Prepared] = []
            for p in [batch.prepare(call) for call in calls]:
                approved.append(p if signal.is_set() else await batch.approve(p))
            started: list[_Prepared] = []
            for p in approved:
                if signal.is_set() and not p.quiet:
                    await skip(p.call)  # aborted while an earlier call waited: never started
                    continue
                if not p.quiet:
                    await batch.announce(p)
                started.append(p)
            for p in started:
                batch.start(p)
            return results + await batch.drain(len(started))
        for call in calls:
            if signal.is_set():
                await skip(call)
                continue
            p = await batch.approve(batch.prepare(call))
            if signal.is_set() and not p.quiet:
                await skip(call)
                continue
            if not p.quiet:
                await batch.announce(p)
            batch.start(p)
            results += await batch.drain(1)
        return results
    finally:
        watcher.cancel()
        await batch.stop()


def _told(result: AgentToolResult, hitl: dict[str, Any] | None, notes: list[str]) -> AgentToolResult:
    """``result`` with an approval's ``details["hitl"]`` merged in and each note (a default
    used) added as a last text block, so the model reads it."""
    if hitl is None and not notes:
        return result
    details = with_hitl(result.details, hitl) if hitl is not None else result.details
    blocks = result.blocks() + [TextContent(text=f"({note})") for note in notes]
    return AgentToolResult(blocks, details=details, is_error=result.is_error)


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
