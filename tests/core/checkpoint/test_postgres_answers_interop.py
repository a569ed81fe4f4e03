"""Answers on Postgres with cubeloop 0.15.3's own ``PostgresCheckpointer`` and ``Agent`` on the
same database: a cubeloop approval answered here is read by cubeloop and continued by its
Agent; the request's run of none is the empty run for both.

In process (cubeloop has no Postgres child scenario); the Agent's pieces are the child's
(``tests/helpers/cubeloop_child.py``: the delete_file tool, the approval policy, the model
that quotes the last tool result).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cubeloop import Agent as CubeloopAgent
from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
from cubeloop.hitl import ApprovalPolicyMiddleware, CheckpointedChannel
from cubeloop.hitl.types import ConfirmRequest, HitlRequest
from cubeloop.providers import FauxProvider as CubeloopFaux
from cubeloop.providers import base as cl
from cubeloop.providers.faux import faux_tool_call

from core.answers import answer
from core.checkpoint.postgres import PostgresCheckpointer
from core.errors import AlreadyAnsweredError
from core.hitl_replies import DenyReply, YesNoReply
from core.owners import UNOWNED
from tests.helpers import cubeloop_child as child
from tests.helpers.pg import make_cubeloop_schema
from tests.helpers.services import postgres_database

pytestmark = pytest.mark.postgres


def _agent(store: Any, thread_id: str, run_id: str | None, responses: list[Any]) -> tuple[Any, Any]:
    provider = CubeloopFaux(provider_id="faux")
    provider.set_responses(responses)
    channel = CheckpointedChannel(checkpointer=store, thread_id=thread_id, run_id=run_id)
    agent = CubeloopAgent(
        model=provider.model("faux-1"),
        system_prompt=child.SYSTEM,
        tools=[child.delete_file],
        middleware=[ApprovalPolicyMiddleware(channel, child.approval_policy)],
        checkpointer=store,
        thread_id=thread_id,
        channel=channel,
    )
    return agent, channel


async def test_a_cubeloop_approval_denied_here_is_continued_by_cubeloops_agent() -> None:
    async with postgres_database("answers") as url:
        await make_cubeloop_schema(url)
        async with CubeloopPostgres(url) as theirs:
            call = faux_tool_call("delete_file", {"path": "/etc/k"}, id="call_del_1")
            agent, _ = _agent(theirs, "k", "run-k", [child.reply(child.text("Deleting."), call)])

            async def detach(event: Any, signal: Any = None) -> None:
                if event.type == "hitl_request":
                    await agent.detach()

            agent.subscribe(detach)
            await agent.prompt("Clean up /etc/k.", run_id="run-k")
            assert (await theirs.load_pending("k"))[1] == "run-k"  # type: ignore[index]

        store = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        try:
            await store.upgrade()
            done = await answer(store, "k", DenyReply("not on prod"))
            assert done.run_id == "run-k" and done.request.question_id == "call_del_1"
            with pytest.raises(AlreadyAnsweredError):
                await answer(store, "k", DenyReply("changed my mind"))
        finally:
            await store.close()

        async with CubeloopPostgres(url) as theirs:
            pending, run_id = await theirs.load_pending("k")  # type: ignore[misc]
            stored = await theirs.load_hitl_answer("k", pending.question_id, run_id=run_id)
            assert stored == {"decision": "deny", "edited_args": None, "reason": "not on prod"}
            agent, _ = _agent(theirs, "k", run_id, [child.echo_last_result])
            await agent.respond(question_id=pending.question_id, answer=stored)
            data = await theirs.load("k")
            assert await theirs.load_pending("k") is None
            assert await theirs.load_hitl_answer("k", "call_del_1", run_id="run-k") is None
        assert data is not None
        roles = [m.role for m in data.messages]
        assert roles == ["user", "assistant", "tool_result", "assistant"]
        result, last = data.messages[2], data.messages[3]
        assert isinstance(result, cl.ToolResultMessage) and result.is_error
        assert result.details == {"hitl": {"decision": "human_deny", "reason": "not on prod"}}
        assert [b.text for b in last.content if isinstance(b, cl.TextContent)] == ["The tool said: not on prod"]


async def test_a_request_of_no_run_is_answered_under_the_empty_run_for_both() -> None:
    async with postgres_database("answers") as url:
        await make_cubeloop_schema(url)
        request = HitlRequest(
            question_id="q1", thread_id="c", payload=ConfirmRequest(prompt="Ship it?"), created_at=1.7e9
        )
        async with CubeloopPostgres(url) as theirs:
            await theirs.save_pending_request("c", request, run_id=None)
        store = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        try:
            await store.upgrade()
            await answer(store, "c", YesNoReply(True))
            assert json.loads(await store.load_answer("c", None, "q1")) is True
        finally:
            await store.close()
        async with CubeloopPostgres(url) as theirs:
            assert await theirs.load_hitl_answer("c", "q1", run_id=None) is True
            # What cubeloop's resume does once the answer is applied (loop.py:350-358); its
            # clear_pending_request_if_matches never matches a run of none (``run_id = NULL``).
            await theirs.save_pending_request("c", None)
            await theirs.clear_hitl_answers("c", run_id=None)
        store = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        try:
            assert await store.settle_request("c", None, "q1") is False, "cubeloop settled it first"
            assert await store.load_answer("c", None, "q1") is None
        finally:
            await store.close()
