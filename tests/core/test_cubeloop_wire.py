"""Wire fidelity with the real cubeloop (0.15.3): images, message ids, thinking signatures and
optional timestamps survive a thread passing between the two programs, in both directions.

cubeloop's threads are written by cubeloop itself in a child process
(``tests/helpers/cubeloop_child.py``); ours by our Agent on our SQLite store, then read by
cubeloop's own ``SQLiteCheckpointer`` (``tests/helpers/cubeloop_peer.py``).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from cubeloop.checkpointer.sqlite import _deserialize_message, _serialize_message  # cubeloop's own row codec
from cubeloop.providers import base as cl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.agent import Agent
from core.checkpoint import codec
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from core.owners import UNOWNED
from core.providers.anthropic import AnthropicProvider
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_thinking, faux_tool_call
from core.recovery import ThreadState, diagnose
from core.tools import AgentToolResult, tool
from tests.helpers.cubeloop_peer import CONTINUED, cubeloop_continue, cubeloop_fork, cubeloop_load, run_completed
from tests.helpers.cubeloop_threads import PIXEL_PNG, read_rows, run_cubeloop

HEX_ID = re.compile(r"^[0-9a-f]{32}$")
"""cubeloop's message id: ``uuid.uuid4().hex``."""


def anthropic_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """What our Anthropic provider would send for ``messages`` (no network)."""
    provider = AnthropicProvider(api_key="test-key-never-sent")
    return provider.request_params(ModelRequest("", messages))["messages"]


def api_images(api_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every image block of an API request, tool results' included, in order."""
    found: list[dict[str, Any]] = []
    for turn in api_messages:
        for block in turn["content"]:
            inner = block.get("content", []) if block["type"] == "tool_result" else [block]
            found.extend(b for b in inner if b["type"] == "image")
    return found


async def upgraded(db: Path) -> SQLiteCheckpointer:
    # cubeloop's threads record no owner: the unowned scope opens them.
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    await store.upgrade()  # cubeloop's file: browse-only until upgraded
    return store


@tool
async def screenshot(name: str) -> AgentToolResult:
    """Take a screenshot."""
    return AgentToolResult([ImageContent(data=PIXEL_PNG, mime_type="image/png")])


@tool(idempotent=True)
async def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


# --- images ---------------------------------------------------------------------------------


def test_either_image_shape_is_read_and_cubeloops_is_written() -> None:
    theirs = codec.decode(
        json.dumps({"role": "user", "content": [{"type": "image", "source": "QUJD", "media_type": "image/gif"}]})
    )
    ours = codec.decode(
        json.dumps({"role": "user", "content": [{"type": "image", "data": "QUJD", "mime_type": "image/gif"}]})
    )
    for message in (theirs, ours):
        assert isinstance(message, UserMessage) and isinstance(message.content, list)
        (image,) = message.content
        assert isinstance(image, ImageContent) and (image.data, image.mime_type) == ("QUJD", "image/gif")
        (written,) = json.loads(codec.encode(message))["content"]
        assert written == {
            "type": "image",
            "source": "QUJD",
            "media_type": "image/gif",
        }  # the bytes once, in cubeloop's shape
        assert codec.decode(codec.encode(message)) == message
    # A source that is not base64 text (another API's object) is not understood: kept as it was.
    odd = {"type": "url", "url": "https://example.com/a.png"}
    kept = codec.decode(json.dumps({"role": "user", "content": [{"type": "image", "source": odd}]}))
    assert json.loads(codec.encode(kept))["content"][0] == {
        "type": "image",
        "data": "",
        "source": odd,
        "media_type": "",
    }


async def test_a_cubeloop_image_reaches_the_provider_with_its_bytes(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "images", "im")
    stored = read_rows(db, "im")
    assert stored[0]["content"][1] == {
        "type": "image",
        "source": PIXEL_PNG,
        "media_type": "image/png",
    }  # cubeloop's shape

    store = await upgraded(db)
    try:
        data = await store.load("im")
        assert data is not None and not data.problems
        images = [b for m in data.messages for b in getattr(m, "content", []) if isinstance(b, ImageContent)]
        assert [(i.data, i.mime_type) for i in images] == [(PIXEL_PNG, "image/png")] * 2  # the prompt's and the tool's
        sent = api_images(anthropic_messages(data.messages))
        assert [b["source"] for b in sent] == [{"type": "base64", "media_type": "image/png", "data": PIXEL_PNG}] * 2

        provider = FauxProvider([faux_reply("Still one pixel.")])
        agent = Agent(provider, store, "im")
        assert await agent.prompt("And now?") == "completed", agent.state.error
        (request,) = provider.requests
        assert [b["source"]["data"] for b in api_images(anthropic_messages(list(request.messages)))] == [PIXEL_PNG] * 2
    finally:
        await store.close()


async def test_our_image_keeps_its_bytes_in_cubeloop(tmp_path: Path) -> None:
    sqlite_path = tmp_path / "ours.sqlite"
    store = await SQLiteCheckpointer.open(sqlite_path, create=True)
    try:
        provider = FauxProvider(
            [faux_reply(faux_tool_call("screenshot", {"name": "home"}, id="c1")), faux_reply("One pixel.")]
        )
        agent = Agent(provider, store, "ours", tools=[screenshot])
        assert await agent.prompt("Take a screenshot.") == "completed", agent.state.error
    finally:
        await store.close()

    theirs = await cubeloop_load(sqlite_path, "ours")
    result = next(m for m in theirs.messages if m.role == "tool_result")
    (image,) = result.content
    assert (image.type, image.source, image.media_type) == ("image", PIXEL_PNG, "image/png")
    run_id = await cubeloop_continue(sqlite_path, "ours")
    assert run_completed(sqlite_path, "ours", run_id)


# --- message ids ----------------------------------------------------------------------------


async def test_every_message_we_save_carries_an_id_as_cubeloop_writes_it(tmp_path: Path) -> None:
    sqlite_path = tmp_path / "ours.sqlite"
    store = await SQLiteCheckpointer.open(sqlite_path, create=True)
    try:
        provider = FauxProvider([faux_reply(faux_tool_call("read_file", {"path": "a"}, id="c1")), faux_reply("Read.")])
        agent = Agent(provider, store, "ours", tools=[read_file])
        assert await agent.prompt("Read a.") == "completed", agent.state.error
        in_memory = [m.id for m in agent.state.messages]
        first, second = await store.load("ours"), await store.load("ours")
        assert first is not None and second is not None
        assert [m.id for m in first.messages] == [m.id for m in second.messages] == in_memory  # loading is idempotent
    finally:
        await store.close()

    ids = [row["id"] for row in read_rows(sqlite_path, "ours")]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(HEX_ID.match(i) for i in ids), ids
    assert ids == in_memory
    theirs = await cubeloop_load(sqlite_path, "ours")
    assert [m.id for m in theirs.messages] == ids


async def test_a_row_without_an_id_still_has_none_after_loading(checkpointer: Any) -> None:
    # cubeloop keeps "" for rows that predate ids (its compaction hashes them); so do we.
    await checkpointer.append("old", [codec.decode(json.dumps({"role": "user", "content": "hi"}))])
    for _ in range(2):
        data = await checkpointer.load("old")
        assert data is not None and data.messages[0].id == ""


async def test_cubeloop_ids_are_read(fixture_db: Path) -> None:
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        data = await store.load("completed")
    assert data is not None
    assert [m.id for m in data.messages] == [row["id"] for row in read_rows(fixture_db, "completed")]
    assert all(HEX_ID.match(m.id) for m in data.messages)


# --- thinking signatures --------------------------------------------------------------------


def signatures(messages: list[Any]) -> list[tuple[str, str | None]]:
    return [
        (b.thinking, b.signature)
        for m in messages
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ThinkingContent)
    ]


async def test_our_thinking_signature_survives_cubeloop_continuing_and_forking_the_thread(tmp_path: Path) -> None:
    sqlite_path = tmp_path / "ours.sqlite"
    store = await SQLiteCheckpointer.open(sqlite_path, create=True)
    try:
        provider = FauxProvider(
            [
                faux_reply(
                    faux_thinking("Read a first.", signature="sig-Read-a"),
                    faux_tool_call("read_file", {"path": "a"}, id="c1"),
                ),
                faux_reply("Read."),
            ]
        )
        agent = Agent(provider, store, "ours", tools=[read_file])
        assert await agent.prompt("Read a.") == "completed", agent.state.error
        our_run = agent.state.run_id
    finally:
        await store.close()
    assert our_run is not None

    continued = await cubeloop_continue(sqlite_path, "ours")
    assert run_completed(sqlite_path, "ours", continued)
    await cubeloop_fork(sqlite_path, "ours", "ours-fork", after_run_id=our_run)

    async with await SQLiteCheckpointer.open(sqlite_path, create=False) as store:
        original = await store.load("ours")
    # cubeloop's fork is a thread of cubeloop's: it records no owner.
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=UNOWNED) as store:
        fork = await store.load("ours-fork")
    assert original is not None and fork is not None and not original.problems and not fork.problems
    assert signatures(original.messages) == signatures(fork.messages) == [("Read a first.", "sig-Read-a")]
    assert original.messages[-1].text == CONTINUED  # type: ignore[union-attr]
    sent = [b for turn in anthropic_messages(original.messages) for b in turn["content"] if b["type"] == "thinking"]
    assert sent == [{"type": "thinking", "thinking": "Read a first.", "signature": "sig-Read-a"}]


async def test_cubeloop_thinking_is_kept_here_and_there(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "two_runs", "tr")
    store = await upgraded(db)
    try:
        data = await store.load("tr")
        assert data is not None and signatures(data.messages) == [("Read the file first.", None)]
        provider = FauxProvider([faux_reply("Nothing else.")])
        agent = Agent(provider, store, "tr", tools=[read_file])
        assert await agent.prompt("Anything else?") == "completed", agent.state.error
        # Unsigned thinking cannot be verified by the API: it is not sent (and not dropped from the thread).
        (request,) = provider.requests
        assert not [
            b for t in anthropic_messages(list(request.messages)) for b in t["content"] if "thinking" in b["type"]
        ]
    finally:
        await store.close()
    theirs = await cubeloop_load(db, "tr")
    thinking = [b.thinking for m in theirs.messages if m.role == "assistant" for b in m.content if b.type == "thinking"]
    assert thinking == ["Read the file first."]


# --- optional fields ------------------------------------------------------------------------


async def test_a_cubeloop_steer_saved_without_a_timestamp_is_read(tmp_path: Path) -> None:
    db = tmp_path / "cubeloop.sqlite"
    run_cubeloop(db, "steer", "st")
    rows = read_rows(db, "st")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool_result", "user", "assistant"]
    assert rows[3]["timestamp"] is None  # the host built the steer without one
    async with await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED) as store:
        data = await store.load("st")
    assert data is not None and not data.problems
    steer = data.messages[3]
    assert isinstance(steer, UserMessage) and steer.text == "Run the tests first." and steer.timestamp is None
    assert isinstance(data.messages[2], ToolResultMessage)
    assert diagnose(data.messages, data.runs).state is ThreadState.COMPLETED


# --- any message, both ways (property) ------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_b64 = st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode())
_mime = st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_text, kids, max_size=3),
    max_leaves=6,
)
_args = st.dictionaries(_text, _json, max_size=3)
_ids = st.one_of(st.none(), st.text("0123456789abcdef", min_size=32, max_size=32))


def view(message: Any) -> tuple[Any, ...]:
    """What both programs must agree on, from either program's message object."""
    blocks = []
    for b in message.content:
        if b.type == "text":
            blocks.append(("text", b.text))
        elif b.type == "image":
            blocks.append(
                (
                    "image",
                    getattr(b, "data", None) or getattr(b, "source", ""),
                    getattr(b, "mime_type", None) or getattr(b, "media_type", ""),
                )
            )
        elif b.type == "thinking":
            blocks.append(("thinking", b.thinking))
        elif b.type == "tool_call":
            blocks.append(("tool_call", b.id, b.name, b.arguments))
    extra = (message.tool_call_id, message.tool_name, message.is_error) if message.role == "tool_result" else ()
    stop = (message.stop_reason,) if message.role == "assistant" else ()
    return (message.role, message.id, message.run_id, message.metadata, tuple(blocks), *extra, *stop)


def ours_strategy() -> st.SearchStrategy[Any]:
    image = st.builds(ImageContent, data=_b64, mime_type=_mime)
    text = st.builds(TextContent, text=_text)
    thinking = st.builds(ThinkingContent, thinking=_text, signature=st.none() | _text)
    call = st.builds(ToolCall, id=_text, name=_text, arguments=_args)
    common = {"run_id": _ids, "id": _ids.map(lambda i: i or ""), "metadata": st.dictionaries(_text, _json, max_size=2)}
    return st.one_of(
        st.builds(UserMessage, content=st.lists(text | image, max_size=3), **common),
        st.builds(
            AssistantMessage,
            content=st.lists(text | thinking | call, max_size=3),
            stop_reason=st.sampled_from(["stop", "tool_use", "length", "aborted", "error"]),
            **common,
        ),
        st.builds(
            ToolResultMessage,
            tool_call_id=_text,
            tool_name=_text,
            content=st.lists(text | image, max_size=3),
            is_error=st.booleans(),
            **common,
        ),
    )


def theirs_strategy() -> st.SearchStrategy[Any]:
    image = st.builds(cl.ImageContent, source=_b64, media_type=_mime)
    text = st.builds(cl.TextContent, text=_text)
    thinking = st.builds(cl.ThinkingContent, thinking=_text)
    call = st.builds(cl.ToolCall, id=_text, name=_text, arguments=_args)
    common = {
        "run_id": _ids,
        "id": _ids.map(lambda i: i or ""),
        "metadata": st.dictionaries(_text, _json, max_size=2),
        "timestamp": st.none() | st.floats(0, 4e9),
    }
    return st.one_of(
        st.builds(cl.UserMessage, content=st.lists(text | image, max_size=3), **common),
        st.builds(
            cl.AssistantMessage,
            content=st.lists(text | thinking | call, max_size=3),
            stop_reason=st.sampled_from(["stop", "tool_use", "length", "aborted", "error"]),
            **common,
        ),
        st.builds(
            cl.ToolResultMessage,
            tool_call_id=_text,
            tool_name=_text,
            content=st.lists(text | image, max_size=3),
            is_error=st.booleans(),
            **common,
        ),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ours_strategy())
def test_any_message_we_write_reads_the_same_in_cubeloop(message: Any) -> None:
    theirs = _deserialize_message(json.loads(codec.encode(message)))
    assert view(theirs) == view(message)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(theirs_strategy())
def test_any_message_cubeloop_writes_reads_the_same_here(message: Any) -> None:
    ours = codec.decode(_serialize_message(message))
    assert view(ours) == view(message)
    assert ours.timestamp == message.timestamp
