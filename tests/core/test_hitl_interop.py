"""A question asked by ``ask_user`` moves between cubeloop (0.15.3, the real package in a
child process) and our runtime: cubeloop's paused question is answered here and our Agent
continues it with that answer; ours, paused here, is continued by cubeloop's
``Agent.respond`` - the same question id (cubeloop's formula) and result text on both sides."""

from __future__ import annotations

import json
from pathlib import Path

from core.agent import Agent
from core.ask_user import ask_user_tool
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.hitl_replies import dump_answer
from core.messages import ToolResultMessage
from core.owners import UNOWNED
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import ResumeAction
from tests.helpers.cubeloop_threads import read_rows, run_cubeloop

QUESTIONS = {"questions": [{"key": "target", "prompt": "Which file should I check?"}]}
"""What the cubeloop child's model asks (tests/helpers/cubeloop_child.py, ask_and_detach)."""

ANSWERED = 'User answers:\n{\n  "target": "src/cli.py"\n}'


async def upgraded(db: Path) -> SQLiteCheckpointer:
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    await store.upgrade()
    return store


async def test_cubeloops_ask_user_answered_here_is_continued_by_our_agent(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "ask_and_detach", "q", arg="run-ask-1")
    store = await upgraded(db)
    try:
        data = await store.load("q")
        pending = data.pending_request
        assert pending is not None and pending.run_id == "run-ask-1"
        qid = json.loads(pending.request_json)["question_id"]
        await store.answer("q", pending.run_id, qid, dump_answer({"target": "src/cli.py"}))
        provider = FauxProvider([faux_reply("Checking src/cli.py.")])
        agent = Agent(provider, store, "q", tools=[ask_user_tool()])
        plan = await agent.plan_resume()
        assert plan.action is ResumeAction.APPLY_ANSWER
        assert [(c.call.id, c.waited) for c in plan.calls] == [("call_ask_1", "answered")]
        assert await agent.resume() == "completed", agent.state.error
        data = await store.load("q")
    finally:
        await store.close()
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert result.tool_call_id == "call_ask_1" and result.run_id == "run-ask-1"
    assert "".join(b.text for b in result.content) == ANSWERED
    assert result.details == {"hitl": {"kind": "ask", "answers": {"target": "src/cli.py"}}}
    assert data.pending_request is None
    assert [r["role"] for r in read_rows(db, "q")][-2:] == ["tool_result", "assistant"]


async def test_our_ask_user_paused_here_is_continued_by_cubeloops_respond(tmp_path: Path) -> None:
    db = tmp_path / "ours.sqlite"
    provider = FauxProvider([faux_reply("Asking.", faux_tool_call("ask_user", QUESTIONS, id="call_ask_1"))])
    async with await SQLiteCheckpointer.open(db, create=True, owner=UNOWNED) as store:
        agent = Agent(provider, store, "q", tools=[ask_user_tool()])

        def detach_when_asked(event) -> None:
            if event.type == "human_request_started":
                assert agent.detach()

        agent.subscribe(detach_when_asked)
        assert await agent.prompt("Check a file, please.") == "waiting"
    run_cubeloop(db, "respond", "q", arg="src/cli.py")
    rows = read_rows(db, "q")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "assistant"]
    assert rows[2]["details"]["hitl"]["answers"] == {"target": "src/cli.py"} and not rows[2]["is_error"]
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("q")
    assert data.pending_request is None
