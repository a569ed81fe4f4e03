"""Tool output holding undecodable bytes (lone surrogates) is stored, shown escaped, and read back exact.

Text decoded with ``errors="surrogateescape"`` (what ``os.fsdecode`` and a subprocess's
output often are) keeps each undecodable byte as a lone surrogate such as ``'\\udcff'``,
which UTF-8 cannot encode. Such a tool result used to make every append fail, so an
idempotent tool's thread was stuck for good: its job was done, and resume and every new
prompt tried to append the same unencodable result again.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from core.agent import Agent
from core.checkpoint import codec
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.jobs import job_key
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.providers.anthropic import AnthropicProvider
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.runner import plain
from core.tool_execution import call_job_key, result_to_json
from core.tools import AgentToolResult, tool
from tests.helpers.messages_server import MessagesServer, text_stream
from tui.text import clean

WAIT = 30.0  # seconds; a liveness bound, reached only by a failing test
RAW = b"name: caf\xe9 \xff\xfe end"
TEXT = RAW.decode("utf-8", "surrogateescape")  # 'name: caf\udce9 \udcff\udcfe end'


@tool(idempotent=True)
async def read_name() -> str:
    """Return a file name as the file system gave it (undecodable bytes kept as surrogates)."""
    return TEXT


def _agent(store: SQLiteCheckpointer, script: list) -> Agent:
    return Agent(FauxProvider(script), store, "t1", tools=[read_name])


async def test_a_result_with_lone_surrogates_is_saved_and_the_run_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path)
    try:
        agent = _agent(store, [faux_reply("Reading.", faux_tool_call("read_name", {})), faux_reply("Done.")])
        assert await asyncio.wait_for(agent.prompt("read the name"), WAIT) == "completed"
        # The thread is not stuck: a new prompt in it runs too.
        agent2 = _agent(store, [faux_reply("Again.")])
        await agent2.load()
        assert await asyncio.wait_for(agent2.prompt("and again"), WAIT) == "completed"
    finally:
        await store.close()

    # Reopened from disk: the exact original str comes back.
    store = await SQLiteCheckpointer.open(path, create=False)
    try:
        data = await store.load("t1")
    finally:
        await store.close()
    assert data is not None and not data.problems
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert [r.text for r in results] == [TEXT]
    assert results[0].text.encode("utf-8", "surrogateescape") == RAW
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant", "user", "assistant"]

    # Stored as valid UTF-8 JSON (the surrogates as JSON escapes, as cubeloop writes them).
    with sqlite3.connect(path) as db:
        rows = [r[0] for r in db.execute("SELECT message_json FROM messages ORDER BY id")]
    raw = rows[2].encode("utf-8") if isinstance(rows[2], str) else rows[2]
    raw.decode("utf-8")  # strict: raises on anything but valid UTF-8
    assert "\\udcff" in raw.decode() and json.loads(raw)["content"][0]["text"] == TEXT


async def test_a_thread_left_stuck_by_such_a_result_resumes(tmp_path: Path) -> None:
    # What the old code left: the job done with the result, the result never appended.
    store = await SQLiteCheckpointer.open(tmp_path / "threads.sqlite")
    try:
        call = ToolCall(id="call-1", name="read_name", arguments={})
        await store.claim_run("t1", "r1")
        await store.append(
            "t1",
            [
                user_text("read the name", run_id="r1"),
                AssistantMessage(content=[call], stop_reason="tool_use", run_id="r1"),
            ],
        )
        key = call_job_key(read_name, call)
        assert key is not None
        await store.job_begin("t1", key, call.id)
        await store.job_finish("t1", key, "done", result_to_json(AgentToolResult(TEXT)))

        agent = _agent(store, [faux_reply("Done.")])
        await agent.load()
        assert await asyncio.wait_for(agent.resume(), WAIT) == "completed"
        data = await store.load("t1")
    finally:
        await store.close()
    assert data is not None
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.text) for r in results] == [("call-1", TEXT)]


async def test_an_idempotent_tool_runs_as_a_job_when_its_arguments_hold_lone_surrogates(tmp_path: Path) -> None:
    seen: list[str] = []

    @tool(idempotent=True)
    async def stat_file(path: str) -> str:
        """Stat a file by the name the file system gave (undecodable bytes kept as surrogates)."""
        seen.append(path)
        return f"size of {path}: 3"

    store = await SQLiteCheckpointer.open(tmp_path / "threads.sqlite")
    try:
        script = [faux_reply(faux_tool_call("stat_file", {"path": TEXT}, id="c1")), faux_reply("Done.")]
        agent = Agent(FauxProvider(script), store, "t1", tools=[stat_file])
        assert await asyncio.wait_for(agent.prompt("stat it"), WAIT) == "completed"
        data = await store.load("t1")
        assert data is not None
        (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
        assert (result.is_error, result.text) == (False, f"size of {TEXT}: 3") and seen == [TEXT]
        # The call read back from the store has the same key, so a resume finds the done job.
        (stored,) = next(m for m in data.messages if isinstance(m, AssistantMessage)).tool_calls
        key = call_job_key(stat_file, stored)
        assert key is not None and key == job_key("stat_file", {"path": TEXT})
        job = await store.job_get("t1", key)
        assert job is not None and job.status == "done" and job.tool_call_id == "c1"
    finally:
        await store.close()


def test_the_codec_round_trips_lone_surrogates_and_keeps_other_text_readable() -> None:
    message = ToolResultMessage(tool_call_id="c1", tool_name="t", content=[{"type": "text", "text": "é " + TEXT}])
    text = codec.encode(message)
    text.encode("utf-8")  # strict
    assert "é" in text  # only the surrogates are escaped, not all non-ASCII text
    assert codec.decode(text).text == "é " + TEXT
    assert codec.decode(text.encode()).text == "é " + TEXT
    plain = ToolResultMessage(tool_call_id="c2", tool_name="t", content=[{"type": "text", "text": "ok"}])
    messages, ids, problems = codec.decode_rows(enumerate([codec.encode(plain), text]), "t", str)
    assert ([m.text for m in messages], ids, problems) == (["ok", "é " + TEXT], [0, 1], [])


def test_a_cubeloop_row_with_a_lone_surrogate_escape_reads_exact() -> None:
    # cubeloop stores json.dumps(message.model_dump()): lone surrogates become \\udcXX escapes.
    row = json.dumps(
        {
            "role": "tool_result",
            "tool_call_id": "c1",
            "tool_name": "t",
            "content": [{"type": "text", "text": TEXT}],
            "is_error": False,
        }
    )
    assert codec.decode(row).text == TEXT


def test_lone_surrogates_are_shown_escaped() -> None:
    shown = clean(TEXT)
    assert shown == "name: caf\\udce9 \\udcff\\udcfe end"
    shown.encode("utf-8")  # a terminal can print it


def test_the_runner_prints_lone_surrogates_escaped() -> None:
    assert plain(TEXT) == "name: caf\\udce9 \\udcff\\udcfe end"


async def test_a_result_with_lone_surrogates_reaches_the_anthropic_api_escaped() -> None:
    # The SDK encodes the request body as strict UTF-8, so a lone surrogate in the history
    # used to fail every later model call of the thread ("The Anthropic stream failed").
    call = ToolCall(id="c1", name="read_name")
    history = [
        user_text("Which file?"),
        AssistantMessage(content=[call], stop_reason="tool_use"),
        ToolResultMessage(tool_call_id="c1", tool_name="read_name", content=[TextContent(text=TEXT)]),
    ]
    async with MessagesServer() as server:
        server.add(text_stream("It is café."))
        provider = AnthropicProvider("claude-test-1", api_key="k", base_url=server.base_url, max_retries=0)
        events = [e async for e in provider.stream(ModelRequest("", history), asyncio.Event())]
    final = events[-1].message
    assert final.stop_reason == "stop", final.error_message
    sent = server.requests[0].body["messages"][-1]["content"][0]["content"][0]["text"]
    assert sent == "name: caf\\udce9 \\udcff\\udcfe end"
    assert history[-1].content[0].text == TEXT  # the stored message is not rewritten


@tool
async def list_names() -> AgentToolResult:
    """Return file names as keys of the details (undecodable bytes kept as surrogates)."""
    return AgentToolResult("2 names", details={TEXT: {"size": 3}, "plain": [TEXT]})


async def test_a_result_whose_details_have_lone_surrogates_in_keys_is_saved_and_read_back(tmp_path: Path) -> None:
    # Even model_dump(mode="json") fails on such a key, so the result could not be saved
    # and the thread was stuck for good.
    path = tmp_path / "threads.sqlite"
    async with await SQLiteCheckpointer.open(path) as store:
        agent = Agent(
            FauxProvider([faux_reply("Listing.", faux_tool_call("list_names", {})), faux_reply("Done.")]),
            store,
            "t1",
            tools=[list_names],
        )
        assert await asyncio.wait_for(agent.prompt("list the names"), WAIT) == "completed"
    async with await SQLiteCheckpointer.open(path, create=False) as store:
        data = await store.load("t1")
    assert data is not None and not data.problems
    result = next(m for m in data.messages if isinstance(m, ToolResultMessage))
    assert result.details == {TEXT: {"size": 3}, "plain": [TEXT]}


def test_the_codec_never_mistakes_text_for_its_marker() -> None:
    # The marker is chosen per message and never one the message already holds.
    message = ToolResultMessage(
        tool_call_id="c1", content=[TextContent(text="@@cubepi-surrogate-x:dcff " + TEXT)], details={TEXT: 1}
    )
    back = codec.decode(codec.encode(message))
    assert back.content[0].text == message.content[0].text and back.details == {TEXT: 1}
