"""A tool call whose arguments could not be read (a reply cut off at its output limit mid
call, input that is not JSON) is never run: not in the run that received it, not by a
resume of a crash right after it. The model gets an error result and can try again."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.providers.anthropic import AnthropicProvider
from core.providers.anthropic_stream import CUT_OFF
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import JOURNALED_KEY
from core.tools import tool
from tests.helpers.messages_server import (
    MessagesServer,
    Stream,
    message_end,
    message_start,
    text_stream,
    tool_use_block,
)

WAIT = 30.0  # seconds; reached only by a failing test


def deploy_tool(calls: list[dict], *, idempotent: bool = False):
    @tool(idempotent=idempotent)
    async def deploy(env: str = "prod", dry_run: bool = False) -> str:
        """Deploy the service (the defaults deploy to production for real)."""
        calls.append({"env": env, "dry_run": dry_run})
        return f"deployed to {env} (dry_run={dry_run})"

    return deploy


def results(messages) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


async def test_a_call_cut_off_at_the_output_limit_is_not_run_over_real_http(tmp_path: Path):
    calls: list[dict] = []
    async with MessagesServer() as server:
        server.add(
            Stream(
                [
                    message_start(),
                    *tool_use_block(0, "toolu_1", "deploy", ['{"env": "staging", "dry_r']),
                    *message_end("max_tokens"),
                ]
            ),
            text_stream("I will send it again."),
        )
        provider = AnthropicProvider("claude-test-1", api_key="k", base_url=server.base_url, max_retries=0)
        async with await SQLiteCheckpointer.open(tmp_path / "t.sqlite") as store:
            agent = Agent(provider, store, "t", tools=[deploy_tool(calls)])
            assert await asyncio.wait_for(agent.prompt("deploy to staging, dry run"), WAIT) == "completed"
            assert calls == []  # never deploy(env="prod", dry_run=False)
            (result,) = results(agent.state.messages)
            assert result.is_error and result.tool_call_id == "toolu_1"
            assert result.text == (
                "The arguments of tool call 'deploy' (toolu_1) could not be read "
                "(the reply was cut off at the output limit); it was not run. "
                "Make the call again with complete arguments."
            )
            # The model was told, in the next request, as an error result of that call.
            sent = server.requests[1].body["messages"][-1]["content"][0]
            assert (sent["type"], sent["tool_use_id"], sent["is_error"]) == ("tool_result", "toolu_1", True)
            assert "could not be read" in sent["content"][0]["text"]
            stored = (await store.load("t")).messages
            (cut,) = next(m for m in stored if isinstance(m, AssistantMessage)).tool_calls
            assert (cut.arguments, cut.arguments_error) == ({}, CUT_OFF)


async def test_the_loop_never_runs_a_call_marked_unreadable_and_runs_its_readable_sibling():
    calls: list[dict] = []
    model = FauxProvider(
        [
            faux_reply(
                faux_tool_call("deploy", {"env": "staging", "dry_run": True}, id="c_ok"),
                faux_tool_call("deploy", id="c_bad", arguments_error="they were not valid JSON: Expecting value"),
            ),
            faux_reply("Retrying the second one."),
        ]
    )
    store = MemoryCheckpointer()
    agent = Agent(model, store, "t", tools=[deploy_tool(calls, idempotent=True)])
    assert await asyncio.wait_for(agent.prompt("deploy twice"), WAIT) == "completed"
    assert calls == [{"env": "staging", "dry_run": True}]
    by_id = {r.tool_call_id: r for r in results(agent.state.messages)}
    assert (by_id["c_ok"].is_error, by_id["c_ok"].text) == (False, "deployed to staging (dry_run=True)")
    assert by_id["c_bad"].is_error and "(they were not valid JSON: Expecting value); it was not run" in (
        by_id["c_bad"].text
    )
    # The idempotent tool made one job, for the readable call only.
    (job_key,) = {e.job_key for e in (await store.load("t")).journal.values() if e.job_key}
    assert job_key and (await store.job_get("t", job_key)).status == "done"


@pytest.mark.parametrize("idempotent, choices", [(True, {}), (False, {"c_cut": "rerun"})])
async def test_a_resume_after_a_crash_does_not_run_the_unreadable_call_either(tmp_path: Path, idempotent, choices):
    # An idempotent tool's dangling call is re-run by default, another one when the user chooses.
    calls: list[dict] = []
    cut = ToolCall(id="c_cut", name="deploy", arguments_error=CUT_OFF)
    reply = AssistantMessage(
        content=[TextContent(text="Deploying."), cut],
        stop_reason="length",
        run_id="old-run",
        metadata={JOURNALED_KEY: True},
    )
    async with await SQLiteCheckpointer.open(tmp_path / "t.sqlite") as store:
        await store.claim_run("t", "old-run")
        await store.append("t", [user_text("deploy to staging", run_id="old-run"), reply])  # then the crash
    with sqlite3.connect(tmp_path / "t.sqlite") as db:
        rows = [json.loads(text) for (text,) in db.execute("SELECT message_json FROM messages ORDER BY id")]
    assert rows[1]["content"][1]["arguments_error"] == CUT_OFF  # the stored row keeps the mark
    async with await SQLiteCheckpointer.open(tmp_path / "t.sqlite") as store:
        agent = Agent(FauxProvider(["Trying again."]), store, "t", tools=[deploy_tool(calls, idempotent=idempotent)])
        assert await asyncio.wait_for(agent.resume(choices), WAIT) == "completed"
        assert calls == []
        (result,) = results((await store.load("t")).messages)
    assert result.is_error and "could not be read (the reply was cut off at the output limit)" in result.text
