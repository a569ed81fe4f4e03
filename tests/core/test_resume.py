"""Resume from every crash point, above all mid-tool: each dangling call settled before any
model call (idempotent re-run or reused, others interrupted unless the user chooses), the
plan that says so, and the tool journal's words."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import NothingToResumeError, ResumeChoiceError
from core.jobs import job_key
from core.loop import LoopConfig, run_loop
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage, user_text
from core.providers.anthropic import to_api_messages
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import JOURNALED_KEY, CrashPoint, ResumeAction, ThreadState, diagnose
from core.tool_execution import result_to_json
from core.tools import AgentToolResult, ToolContext, tool
from tests.helpers.stores import PlainStore
from tests.helpers.transcripts import assert_every_call_answered

WAIT = 10.0  # seconds; reached only by a failing test
OLD = "old-run"

_providers: list[FauxProvider] = []


def provider(*script: Any) -> FauxProvider:
    """A faux provider whose every request is checked after the test (see ``_answered``)."""
    made = FauxProvider(list(script))
    _providers.append(made)
    return made


@pytest.fixture(autouse=True)
def _answered() -> Iterator[None]:
    # Whatever a test asserts, no request it made may hold a tool call without its result.
    _providers.clear()
    yield
    for made in _providers:
        assert_every_call_answered(made.requests)


class World:
    """Side effects of the tools, by tool name."""

    def __init__(self) -> None:
        self.effects: dict[str, list[Any]] = {"fetch": [], "send_email": []}


def tools_for(world: World) -> list:
    @tool(idempotent=True)
    async def fetch(url: str) -> str:
        """Download a page (idempotent)."""
        world.effects["fetch"].append(url)
        return f"contents of {url}"

    @tool
    async def send_email(to: str) -> str:
        """Send an e-mail (not idempotent: twice is two e-mails)."""
        world.effects["send_email"].append(to)
        return f"sent to {to}"

    return [fetch, send_email]


FETCH = ToolCall(id="c_fetch", name="fetch", arguments={"url": "a"})
EMAIL = ToolCall(id="c_email", name="send_email", arguments={"to": "bob"})
FETCH_KEY = job_key("fetch", {"url": "a"})


async def crashed(*calls: ToolCall, answered: tuple[str, ...] = (), store: Any = None) -> Any:
    """A thread that crashed mid-tool: prompt, one assistant message with ``calls``, and
    results only for the ids in ``answered``."""
    store = store or MemoryCheckpointer()
    await store.claim_run("t", OLD)
    messages: list = [
        user_text("do the things", run_id=OLD),
        # Written as our agent writes it: the calls are covered by the tool journal.
        AssistantMessage(
            content=[TextContent(text="On it."), *calls],
            stop_reason="tool_use",
            run_id=OLD,
            metadata={JOURNALED_KEY: True},
        ),
    ]
    messages += [
        ToolResultMessage(tool_call_id=c.id, tool_name=c.name, content=[TextContent(text=f"{c.id} done")], run_id=OLD)
        for c in calls
        if c.id in answered
    ]
    await store.append("t", messages)
    return store


def results_by_id(messages) -> dict[str, ToolResultMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolResultMessage)}


async def test_plan_for_an_idempotent_and_a_non_idempotent_dangling_call():
    store = await crashed(FETCH, EMAIL)
    agent = Agent(provider(), store, "t", tools=tools_for(World()))
    plan = await agent.plan_resume()
    assert (plan.diagnosis.crash_point, plan.action) == (CrashPoint.MID_TOOL, ResumeAction.SETTLE_THEN_CALL_MODEL)
    fetch, email = plan.calls
    assert (fetch.call, fetch.known, fetch.idempotent, fetch.job_key, fetch.job_status) == (
        FETCH,
        True,
        True,
        FETCH_KEY,
        None,
    )
    assert (fetch.action, fetch.choices) == ("rerun", ())
    assert (email.known, email.idempotent, email.job_key, email.job_status) == (True, False, None, None)
    assert (email.action, email.choices) == ("interrupt", ("interrupt", "rerun"))
    assert plan.needs_choice
    assert fetch.status_words == email.status_words == "never started"  # the store journals; nothing started
    assert "fetch (c_fetch): never started; it is idempotent, so it runs again." in plan.sentence
    assert "send_email (c_email): never started; it is recorded as interrupted" in plan.sentence
    assert agent.state.messages and not agent.state.is_running  # planning loaded the thread, ran nothing


async def test_resume_reruns_the_idempotent_call_and_interrupts_the_other():
    world = World()
    store = await crashed(FETCH, EMAIL)
    model = provider("All settled.")
    agent = Agent(model, store, "t", tools=tools_for(world))
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"

    assert world.effects == {"fetch": ["a"], "send_email": []}
    data = await store.load("t")
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
    by_id = results_by_id(data.messages)
    assert (by_id["c_fetch"].text, by_id["c_fetch"].is_error, by_id["c_fetch"].metadata) == (
        "contents of a",
        False,
        {"settled": "rerun"},
    )
    email = by_id["c_email"]
    assert email.is_error and email.metadata == {"settled": "interrupted"}
    assert "interrupted" in email.text and "not run again" in email.text and "effects must be checked" in email.text
    assert len(model.requests) == 1 and len(model.requests[0].messages) == 4  # settled before the one model call
    assert (await store.job_get("t", FETCH_KEY)).status == "done"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


async def test_a_done_job_is_reused_without_repeating_the_work():
    world = World()
    store = await crashed(FETCH, EMAIL)
    # The crash came after the job finished but before its result message was saved.
    await store.job_begin("t", FETCH_KEY, "c_fetch")
    await store.job_finish("t", FETCH_KEY, "done", result_to_json(AgentToolResult("contents of a (first run)")))
    agent = Agent(provider("ok"), store, "t", tools=tools_for(world))
    fetch, _ = (await agent.plan_resume()).calls
    assert (fetch.job_status, fetch.action, fetch.choices) == ("done", "reuse", ())
    assert "its job is done, so the stored result is reused" in fetch.words

    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert world.effects["fetch"] == []
    reused = results_by_id((await store.load("t")).messages)["c_fetch"]
    assert (reused.text, reused.is_error, reused.metadata) == (
        "contents of a (first run)",
        False,
        {"settled": "reused"},
    )


async def test_choosing_rerun_runs_a_non_idempotent_call_again():
    world = World()
    store = await crashed(FETCH, EMAIL)
    agent = Agent(provider("ok"), store, "t", tools=tools_for(world))
    assert await asyncio.wait_for(agent.resume({"c_email": "rerun"}), WAIT) == "completed"
    assert world.effects == {"fetch": ["a"], "send_email": ["bob"]}
    email = results_by_id((await store.load("t")).messages)["c_email"]
    assert (email.text, email.is_error, email.metadata) == ("sent to bob", False, {"settled": "rerun"})


async def test_choosing_interrupt_explicitly_is_the_default():
    world = World()
    store = await crashed(EMAIL)
    agent = Agent(provider("ok"), store, "t", tools=tools_for(world))
    assert await agent.resume({"c_email": "interrupt"}) == "completed"
    assert world.effects["send_email"] == []
    assert results_by_id((await store.load("t")).messages)["c_email"].metadata == {"settled": "interrupted"}


async def test_a_partly_answered_parallel_batch_is_settled_call_by_call():
    world = World()
    read = ToolCall(id="c_read", name="fetch", arguments={"url": "already"})
    store = await crashed(read, FETCH, EMAIL, answered=("c_read",))
    agent = Agent(provider("ok"), store, "t", tools=tools_for(world))
    plan = await agent.plan_resume()
    assert plan.diagnosis.answered == ("c_read",)
    assert [c.call.id for c in plan.calls] == ["c_fetch", "c_email"]

    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    data = await store.load("t")
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert sorted(r.tool_call_id for r in results) == [
        "c_email",
        "c_fetch",
        "c_read",
    ]  # one each, the answered one untouched
    by_id = results_by_id(data.messages)
    assert by_id["c_read"].metadata == {} and by_id["c_read"].text == "c_read done"
    assert (by_id["c_fetch"].metadata, by_id["c_email"].metadata) == ({"settled": "rerun"}, {"settled": "interrupted"})
    assert world.effects == {"fetch": ["a"], "send_email": []}


async def test_unknown_tools_are_interrupted_and_offer_no_choice():
    foreign = ToolCall(id="c_loop", name="cubeloop_thread", arguments={"goal": "x"})
    store = await crashed(foreign, FETCH)
    agent = Agent(provider("ok"), store, "t", tools=tools_for(World()))
    unknown, _ = (await agent.plan_resume()).calls
    assert (unknown.known, unknown.idempotent, unknown.action, unknown.choices) == (False, False, "interrupt", ())
    assert "this agent does not have that tool" in unknown.words
    with pytest.raises(ResumeChoiceError, match=r"cubeloop_thread \(c_loop\) cannot be settled with 'rerun'"):
        await agent.resume({"c_loop": "rerun"})
    assert await agent.resume() == "completed"
    assert results_by_id((await store.load("t")).messages)["c_loop"].metadata == {"settled": "interrupted"}


@pytest.mark.parametrize(
    "choices, words",
    [
        ({"c_fetch": "interrupt"}, r"fetch \(c_fetch\) cannot be settled with 'interrupt'; it offers nothing"),
        ({"c_email": "skip"}, r"cannot be settled with 'skip'; it offers 'interrupt' or 'rerun'"),
        ({"c_other": "rerun"}, r"Tool call c_other is not waiting for a result in this thread"),
    ],
)
async def test_bad_choices_are_refused_before_anything_runs(choices, words):
    world = World()
    store = await crashed(FETCH, EMAIL)
    model = provider()
    agent = Agent(model, store, "t", tools=tools_for(world))
    with pytest.raises(ResumeChoiceError, match=words):
        await agent.resume(choices)
    assert model.requests == [] and world.effects == {"fetch": [], "send_email": []}
    assert len((await store.load("t")).runs) == 1  # no run was claimed
    assert await store.get_lease("t") is None  # and the lease was released


async def test_choices_without_dangling_calls_are_refused():
    store = MemoryCheckpointer()
    await store.claim_run("t", OLD)
    await store.append("t", [user_text("never answered", run_id=OLD)])
    agent = Agent(provider(), store, "t")
    with pytest.raises(ResumeChoiceError):
        await agent.resume({"c1": "rerun"})


async def test_journal_words_started_versus_never_started():
    store = await crashed(FETCH, EMAIL)
    started = time.mktime((2026, 1, 2, 12, 3, 10, 0, 0, -1))
    await store.record_tool_event("t", "c_email", "start", tool_name="send_email", run_id=OLD, at=started)
    agent = Agent(provider(), store, "t", tools=tools_for(World()))
    fetch, email = (await agent.plan_resume()).calls
    assert fetch.status_words == "never started"
    assert email.status_words == "started 12:03:10, never finished" and email.started_at == started
    assert [d.status_words for d in agent.diagnosis().dangling] == ["never started", "started 12:03:10, never finished"]

    await store.record_tool_event("t", "c_email", "end", at=started + 4)
    _, email = (await agent.plan_resume()).calls
    assert email.status_words == "started 12:03:10, ended 12:03:14, result never saved"


async def test_a_store_without_journal_says_may_have_started():
    store = await crashed(FETCH, store=PlainStore())
    agent = Agent(provider("ok"), store, "t", tools=tools_for(World()))
    (fetch,) = (await agent.plan_resume()).calls
    assert (fetch.status_words, fetch.job_status, fetch.action) == ("may have started", None, "rerun")
    assert await agent.resume() == "completed"


async def test_a_rerun_is_journaled_again():
    store = await crashed(FETCH)
    agent = Agent(provider("ok"), store, "t", tools=tools_for(World()))
    await agent.resume()
    entry = (await store.load_journal("t"))["c_fetch"]
    assert entry.started_at is not None and entry.ended_at is not None and entry.job_key == FETCH_KEY
    assert entry.run_id == agent.state.run_id != OLD


async def test_a_new_prompt_settles_the_same_way_before_the_user_message():
    world = World()
    store = await crashed(FETCH, EMAIL)
    model = provider("Carrying on.")
    agent = Agent(model, store, "t", tools=tools_for(world))
    assert await agent.prompt("new prompt") == "completed"
    sent = model.requests[0].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool_result", "tool_result", "user"]
    assert {m.tool_call_id: m.metadata["settled"] for m in sent[2:4]} == {"c_fetch": "rerun", "c_email": "interrupted"}
    assert world.effects == {"fetch": ["a"], "send_email": []}


async def test_a_steer_is_delivered_only_after_the_dangling_calls_are_settled():
    # The loop checks for dangling calls before every model call; a steer (or any
    # queued user message) is published after the settlement, never between.
    world = World()
    history = [
        user_text("do the things", run_id=OLD),
        AssistantMessage(content=[FETCH, EMAIL], stop_reason="tool_use", run_id=OLD),
    ]
    steers = [[user_text("also check b", kind="steer")]]
    model = provider("ok")

    async def get_steering() -> list[UserMessage]:
        return steers.pop() if steers else []

    config = LoopConfig(model, tools=tuple(tools_for(world)), run_id="r", get_steering=get_steering)
    messages = list(history)

    async def emit(event) -> None:
        return None

    assert await asyncio.wait_for(run_loop(messages, config, emit, asyncio.Event()), WAIT) == "completed"
    assert [m.role for m in model.requests[0].messages] == ["user", "assistant", "tool_result", "tool_result", "user"]
    assert isinstance(model.requests[0].messages[-1], UserMessage)


async def test_a_user_message_saved_after_dangling_calls_does_not_hide_them():
    # As cubeloop, a hand edit or a crash-era writer may leave it: a user message after
    # calls that never got results. The plan lists the calls; resume answers them, and
    # the request puts their results before the user's text (asserted for every request
    # by the ``_answered`` fixture too).
    store = MemoryCheckpointer()
    await store.claim_run("t", OLD)
    await store.append(
        "t",
        [
            user_text("do the things", run_id=OLD),
            AssistantMessage(content=[TextContent(text="On it."), FETCH, EMAIL], stop_reason="tool_use", run_id=OLD),
            user_text("are you done?", kind="steer", run_id=OLD),
        ],
    )
    data = await store.load("t")
    diagnosis = diagnose(data.messages, data.runs)
    assert (diagnosis.crash_point, diagnosis.action) == (CrashPoint.MID_TOOL, ResumeAction.SETTLE_THEN_CALL_MODEL)
    assert [d.call.id for d in diagnosis.dangling] == ["c_fetch", "c_email"]

    world = World()
    model = provider("Both done.")
    agent = Agent(model, store, "t", tools=tools_for(world))
    plan = await agent.plan_resume()
    assert [(c.call.id, c.action, c.choices) for c in plan.calls] == [
        ("c_fetch", "rerun", ()),
        ("c_email", "interrupt", ("interrupt", "rerun")),
    ]
    assert await agent.resume({"c_email": "rerun"}) == "completed"
    assert world.effects == {"fetch": ["a"], "send_email": ["bob"]}

    sent = model.requests[0].messages
    # The builder sends the steer after the results (it is stored before them).
    assert [m.role for m in sent] == ["user", "assistant", "tool_result", "tool_result", "user"]
    turn = to_api_messages(sent)[2]["content"]
    assert [b["type"] for b in turn] == ["tool_result", "tool_result", "text"]
    assert {b["tool_use_id"] for b in turn[:2]} == {"c_fetch", "c_email"} and turn[2]["text"] == "are you done?"
    data = await store.load("t")
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


async def test_resume_between_turns_and_after_tool_results_calls_the_model():
    store = MemoryCheckpointer()
    await store.claim_run("t", OLD)
    await store.append("t", [user_text("unanswered", run_id=OLD)])
    model = provider("Answered.")
    agent = Agent(model, store, "t")
    plan = await agent.plan_resume()
    assert (plan.diagnosis.crash_point, plan.action, plan.calls) == (
        CrashPoint.BETWEEN_TURNS,
        ResumeAction.CALL_MODEL,
        (),
    )
    assert await agent.resume() == "completed"

    store = await crashed(FETCH, answered=("c_fetch",))
    model = provider("Next step.")
    agent = Agent(model, store, "t", tools=tools_for(World()))
    assert (await agent.plan_resume()).diagnosis.crash_point is CrashPoint.AFTER_TOOL_RESULT
    assert await agent.resume() == "completed"
    assert len(model.requests[0].messages) == 3


async def test_resume_after_a_final_reply_waits_and_then_has_nothing_to_do():
    store = MemoryCheckpointer()
    await store.claim_run("t", OLD)
    await store.append(
        "t", [user_text("hi", run_id=OLD), AssistantMessage(content=[TextContent(text="Hello.")], run_id=OLD)]
    )
    model = provider()
    agent = Agent(model, store, "t")
    plan = await agent.plan_resume()
    assert plan.action is ResumeAction.WAIT_FOR_USER and "waits for your next message" in plan.sentence
    assert await agent.resume() == "completed"
    assert (await agent.plan_resume()).action is ResumeAction.NONE
    with pytest.raises(NothingToResumeError):
        await agent.resume()
    assert model.requests == []


async def test_a_crash_while_an_idempotent_tool_ran_resumes_without_doing_the_work_twice():
    # A real run: the idempotent tool finishes its work (job done), then the process
    # "dies" before the result message is saved (the store refuses it).
    done_work: list[str] = []

    @tool(idempotent=True)
    async def build(target: str, ctx: ToolContext) -> str:
        """Build a target."""
        done_work.append(target)
        return f"built {target} under {ctx.job_key}"

    class DiesBeforeTheResult(MemoryCheckpointer):
        dead = True

        async def append(self, thread_id, messages, **fence):
            if self.dead and any(isinstance(m, ToolResultMessage) for m in messages):
                raise OSError("killed")
            await super().append(thread_id, messages, **fence)

    store = DiesBeforeTheResult()
    first = Agent(
        provider(faux_reply(faux_tool_call("build", {"target": "app"}, id="c_build")), "never"),
        store,
        "t",
        tools=[build],
    )
    assert await first.prompt("build it") == "failed"
    store.dead = False

    second = Agent(provider("Built."), store, "t", tools=[build])
    (call,) = (await second.plan_resume()).calls
    assert (call.action, call.job_status) == ("reuse", "done")
    assert call.status_words.startswith("started ") and "result never saved" in call.status_words
    assert await second.resume() == "completed"
    assert done_work == ["app"]
    result = results_by_id((await store.load("t")).messages)["c_build"]
    assert (
        result.metadata == {"settled": "reused"}
        and result.text == f"built app under {job_key('build', {'target': 'app'})}"
    )
