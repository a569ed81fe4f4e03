"""Human requests in our runtime, in one process on the memory store: approvals per tool,
questions from a tool body and ``ask_user``, waiting, timeouts, detach, abort, resume.

The answers are given as anyone else gives them: through the store's exactly-once
``HumanAnswers.answer`` (the processes and the race are in test_hitl_processes.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.agent import Agent
from core.approvals import ALWAYS, NEVER, always, ask_for, describe
from core.ask_user import ask_user_tool
from core.checkpoint.capabilities import HumanAnswers, supports
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import AlreadyAnsweredError, ToolDefinitionError, WaitingForAnswerError
from core.events import HumanRequestStarted
from core.fingerprints import changes, definition_parts, fingerprints_of
from core.hitl import ApprovalAnswer, question_id_for
from core.hitl_replies import dump_answer
from core.human_wait import ANSWER_KEY
from core.messages import ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ResumeAction, ThreadState
from core.tools import ToolContext, tool
from tests.helpers.stores import PlainStore

WAIT = 10.0  # seconds; reached only by a failing test


class Effects:
    """What the tools did, in order: each entry is one run of a tool body past its question."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []


def file_tools(effects: Effects):
    @tool
    async def delete_file(path: str, ctx: ToolContext) -> str:
        """Delete a file."""
        effects.done.append(("delete_file", path))
        return f"deleted {path}"

    @tool
    async def write_file(path: str, text: str, ctx: ToolContext) -> str:
        """Write a file."""
        effects.done.append(("write_file", path))
        return f"wrote {len(text)} characters to {path}"

    @tool
    async def read_file(path: str, ctx: ToolContext) -> str:
        """Read a file."""
        effects.done.append(("read_file", path))
        return f"contents of {path}"

    @tool
    async def deploy(target: str, ctx: ToolContext) -> str:
        """Deploy, after asking."""
        if not await ctx.human.confirm(f"Deploy to {target}?"):
            return "not deployed"
        where = await ctx.human.ask_choice("Which region?", ["eu", "us"])
        effects.done.append(("deploy", f"{target}/{where}"))
        return f"deployed to {target} in {where}"

    return [delete_file, write_file, read_file, deploy]


def answer_store() -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    assert supports(store, HumanAnswers)
    return store


def agent_for(provider, store, effects, *, thread="t1", **options) -> Agent:
    tools = options.pop("tools", None) or file_tools(effects)
    return Agent(provider, store, thread, tools=tools, **options)


async def pending_of(store, thread="t1"):
    """The thread's pending request once it is stored (polled: the test is another party)."""
    async with asyncio.timeout(WAIT):
        while True:
            data = await store.load(thread)
            if data is not None and data.pending_request is not None:
                return data.pending_request
            await asyncio.sleep(0.01)


async def answer_pending(store, value, thread="t1") -> str:
    pending = await pending_of(store, thread)
    qid = json.loads(pending.request_json)["question_id"]
    await store.answer(thread, pending.run_id, qid, dump_answer(value))
    return qid


def results(store_data, call_id=None) -> list[ToolResultMessage]:
    return [
        m
        for m in store_data.messages
        if isinstance(m, ToolResultMessage) and (call_id is None or m.tool_call_id == call_id)
    ]


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def delete_script(*after):
    return FauxProvider(
        [
            faux_reply("Deleting.", faux_tool_call("delete_file", {"path": "/etc/passwd"}, id="call_del_1")),
            *(after or (faux_reply("Done."),)),
        ]
    )


async def test_an_approved_call_waits_before_its_start_then_runs_once():
    store, effects = answer_store(), Effects()
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": ALWAYS})
    seen: list = []
    agent.subscribe(seen.append)
    run = asyncio.create_task(agent.prompt("Clean up"))
    pending = await pending_of(store)
    request = json.loads(pending.request_json)
    assert request["question_id"] == "call_del_1"
    assert request["payload"] == {
        "kind": "approve",
        "tool_name": "delete_file",
        "tool_call_id": "call_del_1",
        "args": {"path": "/etc/passwd"},
        "details": None,
    }
    # While it waits the journal must not say the call started, and the tool did not run.
    journal = await store.load_journal("t1")
    assert journal is None or "call_del_1" not in journal or journal["call_del_1"].started_at is None
    assert effects.done == []
    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]
    data = await store.load("t1")
    (result,) = results(data, "call_del_1")
    assert text_of(result) == "deleted /etc/passwd" and not result.is_error
    assert result.details == {"hitl": {"decision": "human_approve"}}
    assert data.pending_request is None, "the request is settled once its result is saved"
    assert await store.load_answer("t1", pending.run_id, "call_del_1") is None
    started = [e for e in seen if isinstance(e, HumanRequestStarted)]
    assert [e.tool_call_id for e in started] == ["call_del_1"] and started[
        0
    ].question == "approve delete_file (call_del_1)?"


async def test_a_denial_reaches_the_model_as_the_tools_result_and_the_tool_never_starts():
    store, effects = answer_store(), Effects()
    provider = delete_script()
    agent = agent_for(provider, store, effects, approvals={"delete_file": ALWAYS})
    run = asyncio.create_task(agent.prompt("Clean up"))
    await answer_pending(store, ApprovalAnswer(decision="deny", reason="not on prod"))
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert effects.done == []
    data = await store.load("t1")
    (result,) = results(data, "call_del_1")
    assert result.is_error and text_of(result) == "not on prod"
    assert result.details == {"hitl": {"decision": "human_deny", "reason": "not on prod"}}
    journal = await store.load_journal("t1")
    assert journal is None or "call_del_1" not in journal, "a denied call is never journaled as started"
    last_request = provider.requests[-1].messages
    sent = [m for m in last_request if isinstance(m, ToolResultMessage)]
    assert [text_of(m) for m in sent] == ["not on prod"] and sent[0].is_error


async def test_an_edit_runs_the_tool_with_the_edited_arguments():
    store, effects = answer_store(), Effects()
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": ALWAYS})
    run = asyncio.create_task(agent.prompt("Clean up"))
    await answer_pending(store, ApprovalAnswer(decision="edit", edited_args={"path": "/tmp/passwd"}))
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert effects.done == [("delete_file", "/tmp/passwd")]
    (result,) = results(await store.load("t1"), "call_del_1")
    assert text_of(result) == "deleted /tmp/passwd"
    assert result.details["hitl"] == {
        "decision": "edit",
        "original_args": {"path": "/etc/passwd"},
        "edited_args": {"path": "/tmp/passwd"},
    }


async def test_ask_for_asks_only_when_an_argument_matches_its_patterns():
    store, effects = answer_store(), Effects()
    provider = FauxProvider(
        [
            faux_reply(
                "Writing.",
                faux_tool_call("write_file", {"path": "src/app.py", "text": "x"}, id="call_w_1"),
                faux_tool_call("write_file", {"path": "prod.env", "text": "KEY=1"}, id="call_w_2"),
                faux_tool_call("read_file", {"path": "/etc/hosts"}, id="call_r_1"),
            ),
            faux_reply("Done."),
        ]
    )
    rules = {"write_file": ask_for(path=["/etc/*", "*.env"]), "read_file": NEVER}
    agent = agent_for(provider, store, effects, approvals=rules)
    run = asyncio.create_task(agent.prompt("Configure"))
    qid = await answer_pending(store, ApprovalAnswer(decision="approve"))
    assert qid == "call_w_2"
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert sorted(effects.done) == [
        ("read_file", "/etc/hosts"),
        ("write_file", "prod.env"),
        ("write_file", "src/app.py"),
    ]
    data = await store.load("t1")
    assert results(data, "call_w_1")[0].details is None  # never asked
    assert results(data, "call_w_2")[0].details == {"hitl": {"decision": "human_approve"}}


async def test_a_parallel_batch_asks_one_call_at_a_time_before_any_call_starts():
    store, effects = answer_store(), Effects()
    provider = FauxProvider(
        [
            faux_reply(
                "Both.",
                faux_tool_call("delete_file", {"path": "a"}, id="call_a"),
                faux_tool_call("read_file", {"path": "r"}, id="call_r"),
                faux_tool_call("delete_file", {"path": "b"}, id="call_b"),
            ),
            faux_reply("Done."),
        ]
    )
    agent = agent_for(provider, store, effects, approvals={"delete_file": ALWAYS})
    run = asyncio.create_task(agent.prompt("Go"))
    assert await answer_pending(store, ApprovalAnswer(decision="approve")) == "call_a"
    async with asyncio.timeout(WAIT):
        while json.loads((await pending_of(store)).request_json)["question_id"] != "call_b":
            await asyncio.sleep(0.01)
    assert effects.done == [], "no call of the batch starts while one of them waits"
    await answer_pending(store, ApprovalAnswer(decision="deny", reason="keep b"))
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert sorted(effects.done) == [("delete_file", "a"), ("read_file", "r")]
    data = await store.load("t1")
    assert text_of(results(data, "call_b")[0]) == "keep b"
    assert data.pending_request is None


async def test_detach_ends_the_run_waiting_and_resume_applies_the_answer_once():
    store, effects = answer_store(), Effects()
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": ALWAYS})
    assert not agent.detach(), "nothing waits yet"
    run = asyncio.create_task(agent.prompt("Clean up"))
    pending = await pending_of(store)
    assert agent.detach()
    assert await asyncio.wait_for(run, WAIT) == "waiting"
    assert agent.state.last_outcome == "waiting" and not agent.state.is_running
    data = await store.load("t1")
    assert data.pending_request is not None and data.pending_request.request_json == pending.request_json
    (asking_run,) = [r for r in data.runs if r.run_id == pending.run_id]
    assert not asking_run.completed, "a waiting run stays open"
    assert await store.get_lease("t1") is None, "the lease is released"
    assert effects.done == [] and results(data) == []

    plan = await agent.plan_resume()
    assert plan.diagnosis.state is ThreadState.WAITING and plan.action is ResumeAction.NONE
    with pytest.raises(WaitingForAnswerError):
        await agent.resume()

    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    plan = await agent.plan_resume()
    assert plan.action is ResumeAction.APPLY_ANSWER
    assert plan.diagnosis.label.startswith("answered: approve delete_file")
    assert [(c.call.id, c.action, c.waited) for c in plan.calls] == [("call_del_1", "rerun", "answered")]
    assert plan.sentence.startswith("Answered: resuming applies the stored answer to the call that asked - ")
    assert "takes the stored answer" in plan.sentence
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]
    data = await store.load("t1")
    (result,) = results(data, "call_del_1")
    assert result.run_id == pending.run_id and text_of(result) == "deleted /etc/passwd"
    assert data.pending_request is None
    assert all(r.completed for r in data.runs)


async def test_a_timeout_with_a_default_records_the_default_and_says_so():
    store, effects = answer_store(), Effects()
    rules = {"delete_file": always(timeout=0.3, default="deny")}
    agent = agent_for(delete_script(), store, effects, approvals=rules)
    assert await asyncio.wait_for(agent.prompt("Clean up"), WAIT) == "completed"
    assert effects.done == []
    (result,) = results(await store.load("t1"), "call_del_1")
    assert result.is_error and text_of(result) == "no answer in 0.3 s; the default was used: deny"
    assert result.details["hitl"]["decision"] == "human_deny"


async def test_a_timeout_with_a_default_approval_runs_the_tool_and_the_result_says_so():
    store, effects = answer_store(), Effects()
    rules = {"delete_file": always(timeout=0.2, default="approve")}
    agent = agent_for(delete_script(), store, effects, approvals=rules)
    assert await asyncio.wait_for(agent.prompt("Clean up"), WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]
    (result,) = results(await store.load("t1"), "call_del_1")
    assert text_of(result) == "deleted /etc/passwd(no answer in 0.2 s; the default was used: approve)"


async def test_a_person_who_answers_before_the_deadline_beats_the_default():
    store, effects = answer_store(), Effects()
    rules = {"delete_file": always(timeout=30, default="deny")}
    agent = agent_for(delete_script(), store, effects, approvals=rules)
    run = asyncio.create_task(agent.prompt("Clean up"))
    pending = await pending_of(store)
    assert json.loads(pending.request_json)["timeout_seconds"] == 30
    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]


async def test_a_timeout_without_a_default_ends_the_run_waiting():
    store, effects = answer_store(), Effects()
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": always(timeout=0.2)})
    assert await asyncio.wait_for(agent.prompt("Clean up"), WAIT) == "waiting"
    assert "No answer in 0.2 s and no default" in (agent.state.error or "")
    data = await store.load("t1")
    assert data.pending_request is not None and effects.done == []
    # Answered late: the answer still applies on resume, and only once.
    pending = data.pending_request
    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    with pytest.raises(AlreadyAnsweredError):
        await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="deny")))
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]


async def test_abort_while_waiting_ends_the_call_aborted_and_clears_the_request():
    store, effects = answer_store(), Effects()
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": ALWAYS})
    run = asyncio.create_task(agent.prompt("Clean up"))
    await pending_of(store)
    agent.abort()
    assert await asyncio.wait_for(run, WAIT) == "aborted"
    assert effects.done == []
    data = await store.load("t1")
    (result,) = results(data, "call_del_1")
    assert result.is_error and text_of(result).startswith("aborted: ")
    assert result.details["hitl"]["decision"] == "aborted"
    assert data.pending_request is None


async def test_a_tool_body_asks_and_takes_the_answers_and_the_question_ids_are_cubeloops():
    store, effects = answer_store(), Effects()
    provider = FauxProvider(
        [faux_reply("Deploying.", faux_tool_call("deploy", {"target": "prod"}, id="call_dep")), faux_reply("Done.")]
    )
    agent = agent_for(provider, store, effects)
    run = asyncio.create_task(agent.prompt("Ship it"))
    pending = await pending_of(store)
    request = json.loads(pending.request_json)
    assert request["payload"] == {"kind": "confirm", "prompt": "Deploy to prod?", "details": None}
    from core.hitl import ConfirmRequest

    assert request["question_id"] == question_id_for(ConfirmRequest(prompt="Deploy to prod?"))
    await store.answer("t1", pending.run_id, request["question_id"], "true")
    async with asyncio.timeout(WAIT):
        while json.loads((await pending_of(store)).request_json)["payload"]["kind"] != "ask":
            await asyncio.sleep(0.01)
    await answer_pending(store, {ANSWER_KEY: "eu"})
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert effects.done == [("deploy", "prod/eu")]
    data = await store.load("t1")
    assert text_of(results(data, "call_dep")[0]) == "deployed to prod in eu"
    assert data.pending_request is None


async def test_ask_user_gives_cubeloops_result_text():
    store, effects = answer_store(), Effects()
    questions = [
        {"key": "target", "prompt": "Which file?"},
        {"key": "env", "prompt": "Where?", "options": [{"label": "Prod", "value": "prod"}]},
    ]
    provider = FauxProvider(
        [
            faux_reply("Asking.", faux_tool_call("ask_user", {"questions": questions}, id="call_ask")),
            faux_reply("Thanks."),
        ]
    )
    agent = agent_for(provider, store, effects, tools=[ask_user_tool()])
    run = asyncio.create_task(agent.prompt("Check something"))
    await answer_pending(store, {"target": "src/cli.py", "env": "prod"})
    assert await asyncio.wait_for(run, WAIT) == "completed"
    (result,) = results(await store.load("t1"), "call_ask")
    assert text_of(result) == 'User answers:\n{\n  "target": "src/cli.py",\n  "env": "prod"\n}'
    assert result.details == {"hitl": {"kind": "ask", "answers": {"target": "src/cli.py", "env": "prod"}}}


async def test_a_body_question_detached_then_answered_is_taken_by_the_rerun_body():
    store, effects = answer_store(), Effects()
    provider = FauxProvider(
        [faux_reply("Deploying.", faux_tool_call("deploy", {"target": "prod"}, id="call_dep")), faux_reply("Done.")]
    )
    agent = agent_for(provider, store, effects)
    run = asyncio.create_task(agent.prompt("Ship it"))
    pending = await pending_of(store)
    assert agent.detach()
    assert await asyncio.wait_for(run, WAIT) == "waiting"
    qid = json.loads(pending.request_json)["question_id"]
    await store.answer("t1", pending.run_id, qid, "false")
    plan = await agent.plan_resume()
    assert [(c.call.id, c.waited) for c in plan.calls] == [("call_dep", "answered")]
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert effects.done == []
    assert text_of(results(await store.load("t1"), "call_dep")[0]) == "not deployed"


async def test_a_store_that_keeps_no_answers_denies_a_call_that_needs_approval():
    store, effects = PlainStore(), Effects()  # cubeloop-compatible: no HumanAnswers
    agent = agent_for(delete_script(), store, effects, approvals={"delete_file": ALWAYS})
    assert await asyncio.wait_for(agent.prompt("Clean up"), WAIT) == "completed"
    assert effects.done == []
    (result,) = results(await store.load("t1"), "call_del_1")
    assert result.is_error and "keeps no answers" in text_of(result)
    assert result.details["hitl"]["decision"] == "policy_deny"


def test_approvals_are_checked_against_the_tools_and_fingerprinted_in_words():
    effects = Effects()
    with pytest.raises(ToolDefinitionError, match="delete_flie"):
        agent_for(FauxProvider(), answer_store(), effects, approvals={"delete_flie": ALWAYS})
    with pytest.raises(ToolDefinitionError, match="no argument 'file'"):
        agent_for(FauxProvider(), answer_store(), effects, approvals={"delete_file": ask_for(file="*")})
    with pytest.raises(ValueError, match="needs a timeout"):
        always(default="deny")
    assert describe(ask_for(path=["/etc/*", "*.env"])) == "ask for path matching /etc/* or *.env"
    assert describe(always(timeout=60, default="deny")) == "always; wait 60 s, then deny"
    tools = [t.spec for t in file_tools(effects)]
    plain = definition_parts("", tools, "m")
    assert definition_parts("", tools, "m", {"read_file": NEVER}) == plain, "NEVER is what leaving it out means"
    asking = definition_parts("", tools, "m", {"delete_file": ALWAYS})
    assert asking["approval:delete_file"] == "always"
    found = changes(fingerprints_of(asking, None, None), fingerprints_of(plain, None, None))
    assert found == ("approval delete_file: always -> none",)


async def test_a_prompt_to_a_thread_whose_answer_is_stored_applies_the_answer_first():
    store, effects = answer_store(), Effects()
    agent = agent_for(
        delete_script(faux_reply("Done."), faux_reply("Next.")), store, effects, approvals={"delete_file": ALWAYS}
    )
    run = asyncio.create_task(agent.prompt("Clean up"))
    pending = await pending_of(store)
    agent.detach()
    assert await asyncio.wait_for(run, WAIT) == "waiting"
    with pytest.raises(WaitingForAnswerError):
        await agent.prompt("And then?")
    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    assert await asyncio.wait_for(agent.prompt("And then?"), WAIT) == "completed"
    assert effects.done == [("delete_file", "/etc/passwd")]
    data = await store.load("t1")
    roles = [m.role for m in data.messages]
    assert roles == ["user", "assistant", "tool_result", "user", "assistant"], roles
    assert data.pending_request is None


def _pending(qid: str, run: str, kind: str = "approve"):
    from core.checkpoint.base import PendingRequest
    from core.hitl import ApproveRequest, AskRequest, HumanRequest, Question

    payload = (
        ApproveRequest(tool_name="t", tool_call_id=qid, args={})
        if kind == "approve"
        else AskRequest(questions=[Question(key="k", prompt="p")])
    )
    return PendingRequest(
        HumanRequest(question_id=qid, thread_id="t1", payload=payload, created_at=1.0).model_dump_json(), run
    )


def test_waiting_roles_follow_the_journal_and_never_guess():
    from core.messages import ToolCall
    from core.recovery import DanglingCall, waiting_roles

    def dangling(call_id: str, started: bool) -> DanglingCall:
        return DanglingCall(ToolCall(id=call_id, name="t"), journaled=True, started_at=5.0 if started else None)

    issuers = {"a": "R", "b": "R", "c": "R", "x": "other"}
    # An approval: the asking call and the rest of its batch never started; all run now.
    roles = waiting_roles(
        _pending("a", "R"), [dangling("a", False), dangling("b", False), dangling("x", False)], issuers
    )
    assert roles == {"a": "answered", "b": "not_started"}, "a call of another run is not this answer's"
    # An approved call the journal shows started ran already: an ordinary dangling call.
    assert waiting_roles(_pending("a", "R"), [dangling("a", True)], issuers) == {}
    # A body's question: the one started call of the run asked it...
    body = _pending("h.0", "R", "ask")
    assert waiting_roles(body, [dangling("a", True), dangling("b", False)], issuers) == {
        "a": "answered",
        "b": "not_started",
    }
    # ...but with two started calls nobody can tell which: none is chosen.
    assert waiting_roles(body, [dangling("a", True), dangling("c", True)], issuers) == {}
    # A writer without a journal (cubeloop): its one dangling call of that run, as its respond() does.
    unjournaled = DanglingCall(ToolCall(id="a", name="t"))
    assert waiting_roles(_pending("a", "R"), [unjournaled], issuers) == {"a": "answered"}
    assert waiting_roles(body, [unjournaled, DanglingCall(ToolCall(id="b", name="t"))], issuers) == {}


def test_an_answered_thread_is_diagnosed_as_such_and_its_plan_says_what_resume_does():
    from core.messages import AssistantMessage, ToolCall, user_text
    from core.recovery import diagnose

    messages = [
        user_text("go", run_id="R"),
        AssistantMessage(
            content=[ToolCall(id="a", name="delete_file", arguments={})], stop_reason="tool_use", run_id="R"
        ),
    ]
    waiting = diagnose(messages, pending=_pending("a", "R"))
    assert waiting.state is ThreadState.WAITING and waiting.action is ResumeAction.NONE and waiting.dangling == ()
    assert waiting.label.startswith("waiting for an answer: approve t (a)?")
    answered = diagnose(messages, pending=_pending("a", "R"), answer_stored=True)
    assert answered.action is ResumeAction.APPLY_ANSWER and [d.call.id for d in answered.dangling] == ["a"]
    assert answered.label.startswith("answered: approve t (a)?")
    assert answered.resume_plan.startswith("Answered: resuming applies the stored answer")
    due = diagnose(messages, pending=_pending("a", "R"), deadline_passed=True)
    assert due.action is ResumeAction.APPLY_ANSWER and due.label.startswith("waiting for an answer")
    assert "deadline passed" in due.detail


def test_without_answer_stored_the_diagnosis_takes_what_the_store_read_with_the_request():
    from dataclasses import replace

    from core.messages import AssistantMessage, ToolCall, user_text
    from core.recovery import diagnose

    messages = [
        user_text("go", run_id="R"),
        AssistantMessage(content=[ToolCall(id="a", name="t", arguments={})], stop_reason="tool_use", run_id="R"),
    ]
    read_answered = replace(_pending("a", "R"), answered=True)
    assert diagnose(messages, pending=read_answered) == diagnose(messages, pending=read_answered, answer_stored=True)
    assert diagnose(messages, pending=read_answered).action is ResumeAction.APPLY_ANSWER
    assert diagnose(messages, pending=_pending("a", "R")).action is ResumeAction.NONE
    # A caller that knows better (the agent, from the answer it loaded) says so, and is believed.
    told = diagnose(messages, pending=read_answered, answer_stored=False)
    assert told.state is ThreadState.WAITING and told.action is ResumeAction.NONE and not told.answer_stored


async def test_a_body_question_with_a_timeout_takes_its_default_and_the_result_says_so():
    store, effects = answer_store(), Effects()

    @tool
    async def branch(ctx: ToolContext) -> str:
        """Pick a branch."""
        return "using " + await ctx.human.ask_text("Which branch?", timeout=0.2, default="main")

    provider = FauxProvider([faux_reply("Asking.", faux_tool_call("branch", {}, id="call_b")), faux_reply("Done.")])
    agent = agent_for(provider, store, effects, tools=[branch])
    assert await asyncio.wait_for(agent.prompt("Go"), WAIT) == "completed"
    (result,) = results(await store.load("t1"), "call_b")
    assert text_of(result) == "using main(no answer in 0.2 s; the default was used: main)"
    assert (await store.load("t1")).pending_request is None


async def test_a_run_waiting_longer_than_its_lease_keeps_the_lease_by_heartbeat():
    store, effects = answer_store(), Effects()
    agent = agent_for(
        delete_script(), store, effects, approvals={"delete_file": ALWAYS}, lease_ttl=0.4, heartbeat_interval=0.1
    )
    run = asyncio.create_task(agent.prompt("Clean up"))
    pending = await pending_of(store)
    await asyncio.sleep(1.0)  # more than twice the lease's time to live
    lease = await store.get_lease("t1")
    assert lease is not None and lease.holder_id == agent.holder.holder_id
    await store.answer("t1", pending.run_id, "call_del_1", dump_answer(ApprovalAnswer(decision="approve")))
    assert await asyncio.wait_for(run, WAIT) == "completed", agent.state.error
    assert effects.done == [("delete_file", "/etc/passwd")]


async def test_a_parallel_batch_detached_mid_approvals_resumes_with_every_stored_answer_and_no_second_question():
    store, effects = answer_store(), Effects()
    provider = FauxProvider(
        [
            faux_reply(
                "Both.",
                faux_tool_call("delete_file", {"path": "a"}, id="call_a"),
                faux_tool_call("read_file", {"path": "r"}, id="call_r"),
                faux_tool_call("delete_file", {"path": "b"}, id="call_b"),
            ),
            faux_reply("Done."),
        ]
    )
    agent = agent_for(provider, store, effects, approvals={"delete_file": ALWAYS})
    asked: list[str] = []
    agent.subscribe(lambda e: asked.append(e.question_id) if isinstance(e, HumanRequestStarted) else None)
    run = asyncio.create_task(agent.prompt("Go"))
    await answer_pending(store, ApprovalAnswer(decision="approve"))  # call_a
    async with asyncio.timeout(WAIT):
        while json.loads((await pending_of(store)).request_json)["question_id"] != "call_b":
            await asyncio.sleep(0.01)
    assert agent.detach()
    assert await asyncio.wait_for(run, WAIT) == "waiting"
    assert effects.done == [] and results(await store.load("t1")) == []
    await answer_pending(store, ApprovalAnswer(decision="deny", reason="keep b"))
    plan = await agent.plan_resume()
    assert [(c.call.id, c.waited) for c in plan.calls] == [
        ("call_a", "not_started"),
        ("call_r", "not_started"),
        ("call_b", "answered"),
    ]
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert asked == ["call_a", "call_b"], "call_a's stored approval applied without asking again"
    assert sorted(effects.done) == [("delete_file", "a"), ("read_file", "r")]
    data = await store.load("t1")
    assert text_of(results(data, "call_b")[0]) == "keep b"
    assert data.pending_request is None and all(r.completed for r in data.runs)


async def test_detaching_a_body_question_interrupts_the_running_siblings_so_the_resume_knows_the_asker():
    store, effects = answer_store(), Effects()
    release = asyncio.Event()

    @tool
    async def build(ctx: ToolContext) -> str:
        """A long build."""
        effects.done.append(("build", "started"))
        await release.wait()
        return "built"

    provider = FauxProvider(
        [
            faux_reply(
                "Both.",
                faux_tool_call("deploy", {"target": "prod"}, id="call_dep"),
                faux_tool_call("build", {}, id="call_build"),
            ),
            faux_reply("Done."),
        ]
    )
    agent = agent_for(provider, store, effects, tools=[*file_tools(effects), build])
    run = asyncio.create_task(agent.prompt("Ship it"))
    pending = await pending_of(store)
    assert agent.detach()
    assert await asyncio.wait_for(run, WAIT) == "waiting"
    data = await store.load("t1")
    (interrupted,) = results(data)
    assert interrupted.tool_call_id == "call_build" and interrupted.metadata.get("settled") == "interrupted"
    assert "ended waiting for an answer" in text_of(interrupted)
    await store.answer("t1", pending.run_id, json.loads(pending.request_json)["question_id"], "false")
    plan = await agent.plan_resume()
    assert [(c.call.id, c.waited) for c in plan.calls] == [("call_dep", "answered")]
    assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
    assert effects.done == [("build", "started")], "the build ran once, the deploy was declined"
    assert text_of(results(await store.load("t1"), "call_dep")[0]) == "not deployed"
