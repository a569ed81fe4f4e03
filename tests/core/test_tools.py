"""Tools: schema from signatures, error results, progress, parallel/sequential execution, abort."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from core.errors import ToolDefinitionError
from core.events import MessageEnd, MessageStart, ToolExecutionEnd, ToolExecutionStart, ToolExecutionUpdate
from core.messages import ToolCall, ToolResultMessage
from core.tool_execution import call_tool, execute_tool_calls
from core.tools import AgentTool, AgentToolResult, ToolContext, tool
from tests.helpers.own_loop import run_in_own_loop

WAIT = 5.0  # seconds; only ever reached when a test is about to fail


class Recorder:
    """An emit target keeping every event."""

    def __init__(self) -> None:
        self.events: list = []

    async def __call__(self, event) -> None:
        self.events.append(event)

    def kinds(self, tool_call_id: str | None = None) -> list[str]:
        return [e.type for e in self.events if tool_call_id is None or _call_id(e) == tool_call_id]


def _call_id(event) -> str | None:
    if hasattr(event, "tool_call_id"):
        return event.tool_call_id
    message = getattr(event, "message", None)
    return getattr(message, "tool_call_id", None)


def call(name: str, id: str | None = None, **args) -> ToolCall:
    return ToolCall(id=id or f"id_{name}", name=name, arguments=args)


async def run(calls, tools, *, mode="parallel", signal=None, grace=5.0, emit=None):
    emit = emit or Recorder()
    results = await asyncio.wait_for(
        execute_tool_calls(
            calls,
            {t.name: t for t in tools},
            emit,
            signal or asyncio.Event(),
            mode=mode,
            abort_grace=grace,
            run_id="run-1",
        ),
        timeout=WAIT * 2,
    )
    return results, emit


# --- @tool ----------------------------------------------------------------------------------


@tool
async def search(
    query: Annotated[str, Field(description="What to look for")],
    ctx: ToolContext,
    limit: int = 10,
    exact: bool = False,
) -> str:
    """Search the notes for a phrase.

    This second paragraph is for people, not for the model.
    """
    ctx.report(progress=0.5, text=f"searching {query}")
    return f"{query}:{limit}:{exact}"


def test_tool_schema_from_signature():
    spec = search.spec
    assert spec.name == "search"
    assert spec.description == "Search the notes for a phrase."
    props = spec.parameters["properties"]
    assert set(props) == {"query", "limit", "exact"}  # the ToolContext is injected, not asked for
    assert props["query"]["type"] == "string"
    assert props["query"]["description"] == "What to look for"
    assert props["limit"] == {"default": 10, "title": "Limit", "type": "integer"}
    assert spec.parameters["required"] == ["query"]
    assert spec.parameters["type"] == "object"
    assert spec.parameters["additionalProperties"] is False


def test_tool_options_override_name_and_description():
    @tool(name="fetch-page", description="Fetch one page.", idempotent=True)
    async def fetch(url: str) -> str:
        """Ignored."""
        return url

    assert (fetch.name, fetch.description, fetch.idempotent) == ("fetch-page", "Fetch one page.", True)
    assert fetch.spec.parameters["required"] == ["url"]


@pytest.mark.parametrize(
    "source, words",
    [
        ("def f(x: int) -> str:\n    return ''", "async def"),
        ("async def f(*items: int) -> str:\n    return ''", "plain named parameter"),
        ("async def f(x: int, /) -> str:\n    return ''", "plain named parameter"),
        ("async def f(x) -> str:\n    return ''", "needs a type hint"),
        ("async def f(a: ToolContext, b: ToolContext) -> str:\n    return ''", "more than one ToolContext"),
        ("async def f(x: 'NoSuchType') -> str:\n    return ''", "cannot be resolved"),
        ("async def f(x: asyncio.Event) -> str:\n    return ''", "JSON schema"),
    ],
)
def test_unsupported_signatures_raise(source, words):
    namespace = {"ToolContext": ToolContext, "asyncio": asyncio}
    exec(source, namespace)
    with pytest.raises(ToolDefinitionError, match=words):
        tool(namespace["f"])


def test_invalid_tool_name_raises():
    async def f(x: int) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="letters, digits"):
        tool(f, name="has space")


# --- results --------------------------------------------------------------------------------


async def test_tool_runs_and_reports_progress():
    results, emit = await run([call("search", query="cats")], [search])
    assert results[0].text == "cats:10:False"
    assert not results[0].is_error
    assert results[0].run_id == "run-1"
    updates = [e for e in emit.events if isinstance(e, ToolExecutionUpdate)]
    assert [(u.progress, u.text) for u in updates] == [(0.5, "searching cats")]
    assert emit.kinds() == [
        "tool_execution_start",
        "tool_execution_update",
        "tool_execution_end",
        "message_start",
        "message_end",
    ]
    end = next(e for e in emit.events if isinstance(e, ToolExecutionEnd))
    assert end.result is results[0] and end.is_error is False


async def test_progress_is_clamped_to_a_fraction():
    @tool
    async def eager(ctx: ToolContext) -> str:
        """Over-report."""
        ctx.report(progress=7.0)
        ctx.report(progress=-1.0, text="odd")
        ctx.report(progress=float("nan"))
        return "ok"

    _, emit = await run([call("eager")], [eager])
    updates = [(e.progress, e.text) for e in emit.events if isinstance(e, ToolExecutionUpdate)]
    assert updates == [(1.0, None), (0.0, "odd"), (None, None)]


async def test_invalid_arguments_become_an_error_result():
    results, emit = await run([call("search", limit="many")], [search])
    result = results[0]
    assert result.is_error
    assert "Invalid arguments for tool 'search'" in result.text
    assert "query" in result.text and "limit" in result.text
    assert emit.kinds()[0] == "tool_execution_start" and "message_end" in emit.kinds()


async def test_unknown_tool_becomes_an_error_result():
    results, _ = await run([call("nope")], [search])
    assert results[0].is_error
    assert results[0].text == "Unknown tool 'nope' (available: search)."


async def test_exception_becomes_an_error_result_with_its_message():
    @tool
    async def broken(path: str) -> str:
        """Always fails."""
        raise FileNotFoundError(f"No such file: {path}")

    results, _ = await run([call("broken", path="a.txt")], [broken])
    assert results[0].is_error
    assert results[0].text == "No such file: a.txt"


async def test_return_values_become_results():
    @tool
    async def structured() -> dict:
        """Return JSON."""
        return {"count": 2}

    @tool
    async def nothing() -> None:
        """Return nothing."""

    @tool
    async def explicit() -> AgentToolResult:
        """Return a full result."""
        return AgentToolResult("partial", details={"n": 1}, is_error=True)

    results, _ = await run([call("structured"), call("nothing"), call("explicit")], [structured, nothing, explicit])
    by_name = {r.tool_name: r for r in results}
    assert by_name["structured"].text == '{"count": 2}'
    assert by_name["structured"].details == {"count": 2}
    assert by_name["nothing"].content == []
    assert (by_name["explicit"].text, by_name["explicit"].details, by_name["explicit"].is_error) == (
        "partial",
        {"n": 1},
        True,
    )


async def test_subclassed_agent_tool():
    class Params(BaseModel):
        n: int

    class Double(AgentTool):
        name = "double"
        description = "Double a number."
        parameters = Params

        async def execute(self, tool_call_id, params, signal, on_update):
            on_update(1.0, None)
            return AgentToolResult(str(params.n * 2))

    results, emit = await run([call("double", n=21)], [Double()])
    assert results[0].text == "42"
    assert Double().spec.parameters["required"] == ["n"]
    assert any(isinstance(e, ToolExecutionUpdate) and e.progress == 1.0 for e in emit.events)


# --- parallel and sequential ------------------------------------------------------------------


def pair_that_needs_each_other():
    """Two tools that can only finish if both run at the same time."""
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    def make(me: str, other: str):
        @tool(name=me)
        async def t() -> str:
            """Wait for the sibling."""
            started[me].set()
            await asyncio.wait_for(started[other].wait(), WAIT)
            return f"{me} done"

        return t

    return make("a", "b"), make("b", "a")


async def test_parallel_calls_run_concurrently():
    a, b = pair_that_needs_each_other()
    results, emit = await run([call("a"), call("b")], [a, b])
    assert {r.text for r in results} == {"a done", "b done"}
    kinds = emit.kinds()
    first_end = kinds.index("tool_execution_end")
    assert kinds[:2] == ["tool_execution_start", "tool_execution_start"] and first_end == 2


async def test_sequential_calls_run_in_order():
    order: list[str] = []

    def make(name: str):
        @tool(name=name)
        async def t() -> str:
            """Record the order."""
            order.append(f"{name} start")
            await asyncio.sleep(0.01)
            order.append(f"{name} end")
            return name

        return t

    results, emit = await run([call("first"), call("second")], [make("first"), make("second")], mode="sequential")
    assert order == ["first start", "first end", "second start", "second end"]
    assert [r.text for r in results] == ["first", "second"]
    assert [(e.type, _call_id(e)) for e in emit.events if isinstance(e, (ToolExecutionStart, ToolExecutionEnd))] == [
        ("tool_execution_start", "id_first"),
        ("tool_execution_end", "id_first"),
        ("tool_execution_start", "id_second"),
        ("tool_execution_end", "id_second"),
    ]


async def test_each_result_is_emitted_as_soon_as_its_tool_finishes():
    # The slow tool only finishes once the fast sibling's result has been emitted:
    # if results were held back until the batch ends, the slow tool would time out.
    fast_result_emitted = asyncio.Event()

    @tool
    async def fast() -> str:
        """Return at once."""
        return "fast"

    @tool
    async def slow() -> str:
        """Wait for the sibling's result to be out."""
        await asyncio.wait_for(fast_result_emitted.wait(), WAIT)
        return "slow"

    recorder = Recorder()

    async def emit(event):
        await recorder(event)
        if isinstance(event, MessageEnd) and event.message.tool_call_id == "id_fast":
            fast_result_emitted.set()

    results, _ = await run([call("slow"), call("fast")], [slow, fast], emit=emit)
    assert [r.text for r in results] == ["fast", "slow"]  # finish order
    assert not any(r.is_error for r in results)
    kinds = [(e.type, _call_id(e)) for e in recorder.events]
    assert kinds.index(("message_end", "id_fast")) < kinds.index(("tool_execution_end", "id_slow"))


# --- abort --------------------------------------------------------------------------------------


@tool
async def obedient(ctx: ToolContext) -> str:
    """Work until told to stop."""
    ctx.report(text="working")
    await ctx.signal.wait()
    return "stopped early: abort signal received"


@tool
async def stubborn() -> str:
    """Ignore the abort signal."""
    await asyncio.sleep(60)
    return "never"


async def abort_when_started(signal: asyncio.Event, recorder: Recorder, started: int):
    async def emit(event):
        await recorder(event)
        if isinstance(event, ToolExecutionUpdate) or (
            isinstance(event, ToolExecutionStart) and recorder.kinds().count("tool_execution_start") >= started
        ):
            asyncio.get_running_loop().call_soon(signal.set)

    return emit


async def test_abort_tool_that_honours_the_signal_returns_promptly():
    signal, recorder = asyncio.Event(), Recorder()
    emit = await abort_when_started(signal, recorder, 1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    results, _ = await run([call("obedient")], [obedient], signal=signal, grace=30.0, emit=emit)
    assert loop.time() - began < 10.0  # far below the 30 s grace: it was not cancelled
    assert results[0].text == "stopped early: abort signal received"
    assert not results[0].is_error


async def test_abort_cancels_a_tool_that_ignores_the_signal_after_the_grace():
    signal, recorder = asyncio.Event(), Recorder()
    emit = await abort_when_started(signal, recorder, 2)
    results, _ = await run(
        [call("stubborn"), call("obedient")], [stubborn, obedient], signal=signal, grace=0.05, emit=emit
    )
    by_name = {r.tool_name: r for r in results}
    assert by_name["obedient"].text.startswith("stopped early")
    cancelled = by_name["stubborn"]
    assert cancelled.is_error
    assert cancelled.text.startswith("aborted")
    assert cancelled.metadata == {"settled": "aborted"}
    # the cooperative sibling's result came out before the stubborn one was cancelled
    assert [r.tool_name for r in results] == ["obedient", "stubborn"]


async def test_sequential_abort_gives_unstarted_calls_a_not_run_result():
    signal, recorder = asyncio.Event(), Recorder()
    emit = await abort_when_started(signal, recorder, 1)
    results, _ = await run(
        [call("obedient"), call("search", query="x")], [obedient, search], mode="sequential", signal=signal, emit=emit
    )
    assert [r.tool_name for r in results] == ["obedient", "search"]
    skipped = results[1]
    assert skipped.is_error and skipped.text.startswith("Not run")
    assert skipped.metadata == {"settled": "not_run"}
    # the skipped call never started: it has a result message but no execution events
    assert recorder.kinds("id_search") == ["message_start", "message_end"]
    assert all(isinstance(r, ToolResultMessage) for r in results)


async def test_parallel_batch_after_abort_runs_nothing():
    signal = asyncio.Event()
    signal.set()
    results, emit = await run([call("search", query="x"), call("obedient")], [search, obedient], signal=signal)
    assert all(r.is_error and r.text.startswith("Not run") for r in results)
    assert not any(isinstance(e, ToolExecutionStart) for e in emit.events)
    assert [type(e) for e in emit.events] == [MessageStart, MessageEnd, MessageStart, MessageEnd]


# --- what a tool may raise through its host (core.tool_execution.call_tool) ---------------------


class ToolsOwnEnd(BaseException):
    """A tool's own BaseException subclass."""


def raiser(name: str, make) -> AgentTool:  # type: ignore[no-untyped-def]
    """A tool named ``name`` whose body raises ``make()`` (a fresh exception per call)."""

    async def body() -> str:
        raise make()

    body.__doc__ = f"Raise what {name} raises."
    return tool(body, name=name)


async def leaks_a_cancellation() -> str:
    """Await a future something else cancelled: its CancelledError is no abort of this call."""
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future
    return "never"


@tool
async def exit_zero() -> str:
    """Call sys.exit(0), as a script would."""
    sys.exit(0)


@pytest.fixture
def host_handles_sigint():  # type: ignore[no-untyped-def]
    """SIGINT handled by the host itself, as the app and ``cubepi-tui run`` do: a
    KeyboardInterrupt can then only come from code."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGINT, previous)


def test_sys_exit_0_in_a_tool_is_its_error_result_and_the_siblings_finish():
    results, recorder = run_in_own_loop(run([call("exit_zero"), call("search", query="x")], [exit_zero, search]))
    by_name = {r.tool_name: r for r in results}
    assert by_name["exit_zero"].is_error
    assert by_name["exit_zero"].text == (
        "The tool called sys.exit(0); a tool cannot end the program that runs it, "
        "so this call failed and the run goes on."
    )
    assert not by_name["search"].is_error and by_name["search"].text == "x:10:False"
    assert recorder.kinds("id_exit_zero") == [
        "tool_execution_start",
        "tool_execution_end",
        "message_start",
        "message_end",
    ]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_raise_system_exit_with_a_message_is_the_calls_error_result(mode):
    quits = raiser("quits", lambda: SystemExit("x"))
    results, _ = run_in_own_loop(run([call("quits"), call("search", query="y")], [quits, search], mode=mode))
    assert [r.is_error for r in results if r.tool_name == "quits"] == [True]
    assert results[0].text.startswith("The tool called sys.exit('x'); a tool cannot end the program")
    assert {r.tool_name for r in results} == {"quits", "search"}


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (GeneratorExit, "The tool raised GeneratorExit, which no tool may end the run with;"),
        (lambda: ToolsOwnEnd("bye"), "The tool raised ToolsOwnEnd (bye), which no tool may end the run with;"),
    ],
)
def test_other_base_exceptions_of_a_tool_are_its_error_result(make, text):
    # Before: the tool's task ended with no result and the batch waited for it for ever.
    ending = raiser("ending", make)
    results, _ = run_in_own_loop(run([call("ending")], [ending]))
    assert results[0].is_error and results[0].text.startswith(text), results[0].text


def test_a_cancellation_the_tool_let_through_is_its_error_not_an_abort():
    leaky = tool(leaks_a_cancellation, name="leaky")
    results, _ = run_in_own_loop(run([call("leaky")], [leaky]))
    assert results[0].is_error
    assert results[0].text.startswith("The tool raised asyncio.CancelledError although nothing cancelled its call")
    assert results[0].metadata == {}  # not settled as aborted


def test_keyboard_interrupt_from_a_tool_is_its_error_where_the_host_handles_sigint(host_handles_sigint):
    interrupts = raiser("interrupts", KeyboardInterrupt)
    results, _ = run_in_own_loop(run([call("interrupts")], [interrupts]))
    assert results[0].is_error
    assert results[0].text == (
        "The tool raised KeyboardInterrupt; only the user's Ctrl-C stops a run, so this call failed and the run goes on."
    )


def _context() -> ToolContext:
    return ToolContext("c1", asyncio.Event(), lambda progress, text: None)


def test_keyboard_interrupt_propagates_where_sigint_raises_it():
    # Python's default handler: the KeyboardInterrupt may be the user's Ctrl-C, which must win.
    # Driven by hand (no event loop), so the interrupt never reaches pytest's own loop.
    interrupts = raiser("interrupts", KeyboardInterrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        body = call_tool(interrupts, _context(), interrupts.parameters())
        with pytest.raises(KeyboardInterrupt):
            body.send(None)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_propagates_under_asyncio_runners_sigint_handler():
    # asyncio.Runner's handler raises KeyboardInterrupt on a second Ctrl-C (its first cancels the main task).
    interrupts = raiser("interrupts", KeyboardInterrupt)

    async def outcome() -> str:
        try:
            await call_tool(interrupts, _context(), interrupts.parameters())
        except KeyboardInterrupt:
            return "propagated"
        return "swallowed"

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Runner installs its own only over this
    try:
        with asyncio.Runner() as runner:
            assert runner.run(outcome()) == "propagated"
    finally:
        signal.signal(signal.SIGINT, previous)
