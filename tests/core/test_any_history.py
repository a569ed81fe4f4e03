"""Threads whoever wrote them: calls left unanswered before a later reply, orphan results,
failed model calls retried, a pending human question. Histories are written as cubeloop
leaves them; cubeloop 0.15.3 itself checks what we persist (its per-run tool-cycle check)
and writes the pending question."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cubeloop.agent._tool_cycle import check_tool_cycle
from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite
from cubeloop.hitl.types import AskRequest, HitlRequest, Question
from cubeloop.providers import base as cubeloop_messages
from hypothesis import given, settings

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import EmptyMessageError, NothingToResumeError, WaitingForAnswerError
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage, user_text
from core.owners import UNOWNED
from core.providers.anthropic import to_api_messages
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply
from core.recovery import CrashPoint, ResumeAction, ThreadState, diagnose
from core.request import check_request
from core.tools import tool
from tests.helpers.histories import histories


def _call(call_id: str, run: str, name: str = "lookup") -> AssistantMessage:
    return AssistantMessage(
        content=[TextContent(text="Looking."), ToolCall(id=call_id, name=name, arguments={"q": "x"})],
        stop_reason="tool_use",
        run_id=run,
    )


def _reply(text: str, run: str, stop: str = "stop", error: str | None = None) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason=stop, error_message=error, run_id=run)


def _result(call_id: str, run: str) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="lookup", content=[TextContent(text="42")], run_id=run)


def _as_cubeloop(messages: list[AnyMessage]) -> list[Any]:
    kinds = {
        "user": cubeloop_messages.UserMessage,
        "assistant": cubeloop_messages.AssistantMessage,
        "tool_result": cubeloop_messages.ToolResultMessage,
    }
    return [kinds[m.role].model_validate(m.model_dump(mode="json")) for m in messages]


async def _store(messages: list[AnyMessage], *, open_runs: tuple[str, ...] = (), done_runs: tuple[str, ...] = ()):
    store = MemoryCheckpointer()
    for run in (*open_runs, *done_runs):
        await store.claim_run("t", run)
    await store.append("t", messages)
    for run in done_runs:
        await store.mark_run_complete("t", run)
    return store


# --- a call left unanswered before a later reply (cubeloop continued a mid-tool thread) ----------


def _continued() -> list[AnyMessage]:
    return [
        user_text("look it up", run_id="r0"),
        _call("c1", "r0"),  # r0 died here; cubeloop's next run went on without a result for c1
        user_text("and then?", run_id="r1"),
        _reply("Carrying on.", "r1"),
    ]


def test_an_unanswered_call_before_a_later_reply_is_diagnosed_mid_tool() -> None:
    # Settled, c1's result is sent right after c1, so the request would end with the later
    # reply: it is final, and resume waits for the user after settling.
    diagnosis = diagnose(_continued(), ())
    assert (diagnosis.crash_point, diagnosis.action) == (CrashPoint.MID_TOOL, ResumeAction.SETTLE_THEN_WAIT)
    assert [d.call.id for d in diagnosis.dangling] == ["c1"]
    assert diagnosis.detail == (
        "1 tool call has no result; 1 user message after it waits until it is settled; "
        "1 later reply went on without it."
    )
    assert diagnosis.resume_plan == (
        "Resume first settles lookup (c1): a call of an idempotent tool is re-run or its done job's result "
        "reused, and any other call is recorded as interrupted, its effects to be checked, unless you choose to "
        "re-run it; then it waits for your next message (the last reply is final, so the model is not called)."
    )


async def test_resume_settles_it_with_the_issuing_run_and_waits_without_calling_the_model() -> None:
    store = await _store(_continued(), open_runs=("r0",), done_runs=("r1",))
    model = FauxProvider(["Done now."])
    agent = Agent(model, store, "t")
    assert (await agent.plan_resume()).sentence == (
        "Resume first settles each dangling call - lookup (c1): may have started; this agent does not have that "
        "tool, so it is recorded as interrupted. Then it waits for your next message (the last reply is final, "
        "so the model is not called)."
    )
    assert await agent.resume() == "completed"

    assert model.requests == []  # the request would have ended with "Carrying on." (a prefill)
    data = await store.load("t")
    settled = data.messages[4]
    assert isinstance(settled, ToolResultMessage) and settled.tool_call_id == "c1"
    assert (settled.run_id, settled.metadata) == ("r0", {"settled": "interrupted"})
    # cubeloop checks each run's own messages for whole tool cycles before completing it.
    for run in ("r0", "r1", agent.state.run_id):
        check_tool_cycle([m for m in _as_cubeloop(data.messages) if m.run_id == run])
    assert (
        diagnose(data.messages, data.runs).label == "completed · another run wrote between 1 tool call and its result"
    )
    # The crashed run is closed once its call is settled, before the resume run completes,
    # so cubeloop's fork (completed runs up to a cutoff) keeps its prompt and call.
    order = sorted((r.completion_seq, r.run_id) for r in data.runs if r.completed)
    assert [run for _, run in order] == ["r1", "r0", agent.state.run_id]


async def test_a_new_prompt_settles_it_first_too() -> None:
    store = await _store(_continued(), open_runs=("r0",), done_runs=("r1",))
    model = FauxProvider(["Sure."])
    assert await Agent(model, store, "t").prompt("next") == "completed"
    assert check_request(model.requests[0].messages) is None
    results = [m for m in (await store.load("t")).messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.run_id) for r in results] == [("c1", "r0")]


async def test_a_call_of_a_completed_run_is_settled_under_the_run_that_settles_it() -> None:
    # A store refuses messages naming a completed run, so the settling run's id is used.
    store = await _store(_continued(), done_runs=("r0", "r1"))
    agent = Agent(FauxProvider(["Ok."]), store, "t")
    assert await agent.resume() == "completed"
    settled = next(m for m in (await store.load("t")).messages if isinstance(m, ToolResultMessage))
    assert settled.run_id == agent.state.run_id


# --- orphans and failed replies in what is sent ---------------------------------------------------


def test_an_orphan_result_is_not_sent_to_anthropic_and_is_said() -> None:
    history = [user_text("hi", run_id="r0"), _result("ghost", "r0"), _reply("Hello.", "r0")]
    assert [m["role"] for m in to_api_messages(history)] == ["user", "assistant"]
    assert all(b["type"] == "text" for m in to_api_messages(history) for b in m["content"])
    assert diagnose(history, ()).label == "completed · 1 orphan result"


async def test_the_faux_provider_refuses_a_request_the_api_would_refuse() -> None:
    import asyncio

    provider = FauxProvider(["never used"])
    bad = ModelRequest("", [user_text("hi"), _call("c1", "r0")])
    events = [e async for e in provider.stream(bad, asyncio.Event())]
    reply = events[-1].message
    assert reply.stop_reason == "error"
    assert reply.error_message == (
        "The faux provider refused the request (the API would answer 400): "
        "Tool call(s) c1 have no result at the end of the request."
    )
    assert provider.remaining == 1


# --- a failed model call is retried --------------------------------------------------------------


async def test_resume_of_a_failed_thread_retries_the_model_call_without_re_running_tools() -> None:
    runs: list[str] = []

    @tool
    async def lookup(q: str) -> str:
        """Look something up."""
        runs.append(q)
        return "42"

    history = [
        user_text("look it up", run_id="r0"),
        _call("c1", "r0"),
        _result("c1", "r0"),
        _reply("Half a rep", "r0", stop="error", error="The Anthropic API is overloaded (529)."),
    ]
    store = await _store(history, open_runs=("r0",))
    diagnosis = diagnose(history, (await store.load("t")).runs)
    assert (diagnosis.state, diagnosis.action, diagnosis.label) == (
        ThreadState.FAILED,
        ResumeAction.RETRY_MODEL_CALL,
        "failed",
    )
    assert diagnosis.detail == "The model call failed: The Anthropic API is overloaded (529)."

    model = FauxProvider(["The answer is 42."])
    agent = Agent(model, store, "t", tools=[lookup])
    assert (await agent.plan_resume()).sentence == (
        "Resume retries the failed model call with the saved conversation; the failed reply is not sent "
        "and no tool runs again."
    )
    assert await agent.resume() == "completed"
    assert runs == []
    (request,) = model.requests
    assert [m.role for m in request.messages] == ["user", "assistant", "tool_result"]
    data = await store.load("t")
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED
    assert data.messages[3].stop_reason == "error"  # the stored failed reply is kept as it was


# --- a pending human question (cubeloop's HITL) ---------------------------------------------------


def _ask_request(thread_id: str = "t") -> HitlRequest:
    return HitlRequest(
        question_id="q1",
        thread_id=thread_id,
        payload=AskRequest(questions=[Question(key="env", prompt="Deploy to which environment?")]),
        created_at=1_700_000_000.0,
    )


async def _cubeloop_file_waiting(path: Path) -> None:
    async with CubeloopSQLite(str(path)) as cl:
        await cl.claim_run("t", "r0")
        rows = [user_text("deploy it", run_id="r0"), _call("ask1", "r0", name="ask_user")]
        await cl.append("t", _as_cubeloop(rows))
        await cl.save_pending_request("t", _ask_request(), run_id="r0")


async def test_a_thread_waiting_for_an_answer_reads_so_and_is_never_settled(tmp_path: Path) -> None:
    path = tmp_path / "cubeloop.sqlite"
    await _cubeloop_file_waiting(path)
    store = await SQLiteCheckpointer.open(path, owner=UNOWNED)  # cubeloop's thread records no owner
    await store.upgrade()  # so a run could write, if it were (wrongly) allowed to
    try:
        (summary,) = await store.list_threads()
        assert summary.pending_request is not None and summary.pending_request.run_id == "r0"
        data = await store.load("t")
        assert data.pending_request == summary.pending_request
        diagnosis = diagnose(data.messages, data.runs, pending=data.pending_request)
        assert (diagnosis.state, diagnosis.label, diagnosis.action) == (
            ThreadState.WAITING,
            "waiting for an answer: Deploy to which environment?",
            ResumeAction.NONE,
        )
        assert diagnosis.detail == "The run asked: Deploy to which environment?"

        agent = Agent(FauxProvider(["never"]), store, "t")
        with pytest.raises(WaitingForAnswerError, match="waiting for an answer to 'Deploy to which environment"):
            await agent.resume()
        with pytest.raises(WaitingForAnswerError):
            await agent.prompt("hello?")
        after = await store.load("t")
        assert [m.model_dump() for m in after.messages] == [m.model_dump() for m in data.messages]
    finally:
        await store.close()
    # The pending row is cubeloop's, untouched: cubeloop still sees the same question.
    async with CubeloopSQLite(str(path)) as cl:
        assert await cl.load_pending_request("t") == _ask_request()


def test_the_question_is_read_from_each_kind_of_request() -> None:
    from core.checkpoint.base import PendingRequest

    def question(payload: dict[str, Any]) -> str:
        return PendingRequest(json.dumps({"question_id": "q", "payload": payload})).question

    assert question({"kind": "confirm", "prompt": "Delete the branch?"}) == "Delete the branch?"
    assert question({"kind": "approve", "tool_name": "rm", "tool_call_id": "c7", "args": {}}) == "approve rm (c7)?"
    assert (
        question({"kind": "ask", "questions": [{"key": "a", "prompt": "A?"}, {"key": "b", "prompt": "B?"}]})
        == "A? / B?"
    )
    assert PendingRequest("not json").question == "(a request this version cannot read)"


# --- what the plan says is what resume does -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(histories())
async def test_on_any_history_resume_calls_the_model_exactly_when_its_plan_says_so(history: list[AnyMessage]) -> None:
    store = await _store(history, open_runs=("r1", "r2"))
    model = FauxProvider(fallback=lambda request: faux_reply("ok"))
    agent = Agent(model, store, "t")
    plan = await agent.plan_resume()
    calls = plan.action in (ResumeAction.CALL_MODEL, ResumeAction.SETTLE_THEN_CALL_MODEL, ResumeAction.RETRY_MODEL_CALL)
    said = "calls the model again" in plan.sentence or "retries the failed model call" in plan.sentence
    assert said == calls, plan.sentence
    if plan.action is ResumeAction.NONE:
        with pytest.raises(NothingToResumeError):
            await agent.resume()
        return
    assert await agent.resume() == "completed", agent.state.error
    assert len(model.requests) == (1 if calls else 0)
    for request in model.requests:
        assert check_request(request.messages) is None


# --- empty prompts ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
async def test_an_empty_or_whitespace_prompt_is_refused_with_one_sentence_and_nothing_is_saved(text: str) -> None:
    store = MemoryCheckpointer()
    model = FauxProvider(["never"])
    agent = Agent(model, store, "t")
    with pytest.raises(EmptyMessageError) as refused:
        await agent.prompt(text)
    assert str(refused.value) == "The prompt is empty; type some text to send."
    assert await store.load("t") is None and model.requests == []
    assert not agent.state.is_running


# --- the words of a failed thread's plan ----------------------------------------------------------


async def test_a_failed_thread_with_dangling_calls_is_planned_in_the_words_of_what_resume_does() -> None:
    ran: list[str] = []

    @tool(idempotent=True)
    async def fetch() -> str:
        """Fetch (safe to repeat)."""
        ran.append("fetch")
        return "fetched"

    @tool
    async def send() -> str:
        """Send (not safe to repeat)."""
        ran.append("send")
        return "sent"

    history = [
        user_text("hi", run_id="r0"),
        AssistantMessage(
            content=[ToolCall(id="c1", name="fetch"), ToolCall(id="c2", name="send")],
            stop_reason="tool_use",
            run_id="r0",
        ),
        _reply("", "r0", stop="error", error="overloaded"),
    ]
    store = await _store(history, open_runs=("r0",))
    agent = Agent(FauxProvider(["Done."]), store, "t", tools=[fetch, send])
    plan = await agent.plan_resume()
    assert plan.action is ResumeAction.RETRY_MODEL_CALL
    # The diagnosis does not know the tools: it states the rule resume applies, not "interrupted".
    assert plan.diagnosis.resume_plan == (
        "Resume first settles fetch (c1), send (c2): a call of an idempotent tool is re-run or its done job's "
        "result reused, and any other call is recorded as interrupted, its effects to be checked, unless you "
        "choose to re-run it; then it retries the failed model call with the saved conversation (the failed "
        "reply is not sent, and no call that has its result runs again)."
    )
    assert plan.sentence == (
        "Resume first settles each dangling call - fetch (c1): may have started; it is idempotent, so it runs again. "
        "send (c2): may have started; it is recorded as interrupted and not run again (its effects must be checked). "
        "Then it retries the failed model call with the saved conversation (the failed reply is not sent, and no "
        "call that has its result runs again)."
    )
    assert await agent.resume() == "completed"
    assert ran == ["fetch"]


# --- settled results of calls written without a run id -----------------------------------------


async def test_a_call_without_a_run_id_is_settled_with_none_so_cubeloops_per_run_check_passes() -> None:
    history = [
        UserMessage(content=[TextContent(text="hi")]),
        AssistantMessage(content=[ToolCall(id="c1", name="lookup")], stop_reason="tool_use"),
    ]
    store = await _store(history)
    agent = Agent(FauxProvider(["Ok."]), store, "t")
    assert await agent.resume() == "completed"
    data = await store.load("t")
    settled = data.messages[2]
    assert isinstance(settled, ToolResultMessage) and settled.tool_call_id == "c1"
    assert settled.run_id is None
    assert data.messages[3].run_id == agent.state.run_id  # the reply is the resume run's
    for run in {m.run_id for m in data.messages}:
        check_tool_cycle([m for m in _as_cubeloop(data.messages) if m.run_id == run])
