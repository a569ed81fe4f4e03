"""Our Postgres store and cubeloop 0.15.3's own ``PostgresCheckpointer`` on one real server:
each reads what the other wrote, and a database either creates opens in the other."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest
from cubeloop.checkpointer.exceptions import RunAlreadyCompletedError as CubeloopRunCompleted
from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
from cubeloop.hitl.types import ConfirmRequest, HitlRequest
from cubeloop.providers import base as cl

from core.checkpoint import codec, postgres_schema
from core.checkpoint.postgres import PostgresCheckpointer
from core.errors import ReadOnlyStoreError
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.owners import UNOWNED
from tests.helpers.pg import make_cubeloop_schema
from tests.helpers.services import postgres_database

pytestmark = pytest.mark.postgres


def _cubeloop_thread() -> list[Any]:
    return [
        cl.UserMessage(content=[cl.TextContent(text="Inspect the repo.")], run_id="r1", metadata={"from": "cli"}),
        cl.AssistantMessage(
            content=[cl.TextContent(text="Looking."), cl.ToolCall(id="c1", name="read", arguments={"path": "a.py"})],
            stop_reason="tool_use",
            run_id="r1",
            model_id="m-1",
            tokens_in=12,
        ),
        cl.ToolResultMessage(
            tool_call_id="c1",
            tool_name="read",
            content=[cl.TextContent(text="print(1)")],
            details={"n": 1},
            run_id="r1",
        ),
        cl.AssistantMessage(content=[cl.TextContent(text="It prints 1.")], run_id="r1"),
    ]


def _ours(messages: list[Any]) -> list[dict[str, Any]]:
    """cubeloop messages as our codec reads their wire form."""
    return [codec.decode(json.dumps(m.model_dump(mode="json"))).model_dump(mode="json") for m in messages]


def _request(thread: str) -> HitlRequest:
    return HitlRequest(question_id="q1", thread_id=thread, payload=ConfirmRequest(prompt="Ship it?"), created_at=1.7e9)


async def test_cubeloop_threads_read_here_browse_only_then_after_upgrade() -> None:
    async with postgres_database("interop") as url:
        await make_cubeloop_schema(url)
        written = _cubeloop_thread()
        async with CubeloopPostgres(url) as theirs:
            await theirs.claim_run("t", "r1")
            await theirs.append("t", written)
            await theirs.mark_run_complete("t", "r1")
            await theirs.save_extra("t", {"title": "repo", "n": 1})
            await theirs.save_pending_request("asks", _request("asks"), run_id="r2")

        async def check(store: PostgresCheckpointer) -> None:
            data = await store.load("t")
            assert data is not None and data.problems == []
            assert [m.model_dump(mode="json") for m in data.messages] == _ours(written)
            assert data.message_ids == [1, 2, 3, 4]
            assert data.extra == {"title": "repo", "n": 1}
            assert [(r.run_id, r.completed, r.completion_seq) for r in data.runs] == [("r1", True, 1)]
            asks = await store.load("asks")
            assert asks is not None and asks.pending_request is not None
            assert asks.pending_request.question == "Ship it?" and asks.pending_request.run_id == "r2"
            assert asks.pending_request.created_at == 1.7e9
            by_id = {s.thread_id: s for s in await store.list_threads()}
            assert set(by_id) == {"t", "asks"}
            assert by_id["t"].message_count == 4 and by_id["t"].first_prompt == "Inspect the repo."
            assert [m.role for m in by_id["t"].tail] == ["assistant"]
            assert by_id["asks"].pending_request == asks.pending_request

        store = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)  # cubeloop's threads: unowned
        try:
            assert (store.needs_upgrade, store.read_only, store.schema_version) == (True, True, None)
            await check(store)
            assert (await store.load("t")).journal is None  # type: ignore[union-attr]
            assert await store.get_lease("t") is None and await store.list_commands("t") == []
            with pytest.raises(ReadOnlyStoreError):
                await store.append("t", [user_text("no")])
            await store.upgrade()
            assert (store.needs_upgrade, store.read_only, store.schema_version) == (
                False,
                False,
                len(postgres_schema.MIGRATIONS),
            )
            await check(store)
            assert (await store.load("t")).journal == {}  # type: ignore[union-attr]

            # cubeloop keeps writing once our tables (and their triggers) are there.
            token = await store.change_token()
            async with CubeloopPostgres(url) as theirs:
                await theirs.append("t", [cl.UserMessage(content=[cl.TextContent(text="And now?")])])
            assert await store.change_token() != token
            (summary,) = [s for s in await store.list_threads() if s.thread_id == "t"]
            assert summary.message_count == 5 and [m.role for m in summary.tail] == ["assistant", "user"]
        finally:
            await store.close()


async def test_threads_written_here_load_in_cubeloop_unchanged() -> None:
    async with postgres_database("interop") as url:
        mine = [
            user_text("Inspect the repo.", run_id="r1"),
            AssistantMessage(
                content=[TextContent(text="Looking."), ToolCall(id="c1", name="read", arguments={"path": "a.py"})],
                stop_reason="tool_use",
                run_id="r1",
            ),
            ToolResultMessage(tool_call_id="c1", tool_name="read", content=[TextContent(text="print(1)")], run_id="r1"),
            AssistantMessage(content=[TextContent(text="It prints 1.")], run_id="r1"),
        ]
        async with await PostgresCheckpointer.open(url, create=True) as store:
            await store.claim_run("t", "r1")
            await store.append("t", mine)
            await store.mark_run_complete("t", "r1")
            await store.save_extra("t", {"title": "repo"})
            await store.save_pending_request("t", _request("t").model_dump_json(), run_id="r2")

        async with CubeloopPostgres(url) as theirs:  # its _verify_schema passes on our database
            data = await theirs.load("t")
            assert data is not None and data.extra == {"title": "repo"}
            kinds = {"user": cl.UserMessage, "assistant": cl.AssistantMessage, "tool_result": cl.ToolResultMessage}
            expected = [kinds[m.role].model_validate(m.model_dump(mode="json")).model_dump() for m in mine]
            assert [m.model_dump() for m in data.messages] == expected
            assert [m.model_dump() for m in await theirs.snapshot("t", after_run_id="r1")] == expected
            pending = await theirs.load_pending("t")
            assert pending is not None and pending == (_request("t"), "r2")
            with pytest.raises(CubeloopRunCompleted):
                await theirs.claim_run("t", "r1")  # our completion is cubeloop's
            await theirs.append("t", [cl.UserMessage(content=[cl.TextContent(text="More.")])])
            # cubeloop's own rows and ours interleave in one seq order
        async with await PostgresCheckpointer.open(url, create=False) as store:
            again = await store.load("t")
            assert again is not None and again.message_ids == [1, 2, 3, 4, 5]
            assert [m.text for m in again.messages if m.role == "user"] == ["Inspect the repo.", "More."]  # type: ignore[union-attr]


async def _catalog(url: str) -> dict[str, Any]:
    """cubeloop's part of the catalog: columns, constraints, indexes, partitions, version rows."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name LIKE 'cubepi%' AND table_name NOT LIKE 'cubepi_tui%'"
            " ORDER BY 1, 2"
        )
        constraints = await conn.fetch(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text NOT LIKE 'cubepi_tui%'"
            " AND contype <> 't'"  # our change triggers are constraint triggers; compared apart below
            " ORDER BY 1, 2"
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            " AND tablename NOT LIKE 'cubepi_tui%' ORDER BY 1, 2"
        )
        partitions = await conn.fetch(
            "SELECT inhparent::regclass::text, inhrelid::regclass::text, pg_get_expr(c.relpartbound, c.oid)"
            " FROM pg_inherits JOIN pg_class AS c ON c.oid = inhrelid ORDER BY 1, 2"
        )
        versions = await conn.fetch("SELECT version FROM cubepi_schema_version")
    finally:
        await conn.close()
    return {
        "columns": [tuple(r) for r in columns],
        "constraints": [tuple(r) for r in constraints],
        "indexes": [tuple(r) for r in indexes],
        "partitions": [tuple(r) for r in partitions],
        "versions": [tuple(r) for r in versions],
    }


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return {r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    finally:
        await conn.close()


async def test_a_database_created_here_has_cubeloops_schema_exactly() -> None:
    async with postgres_database("ours") as ours_url, postgres_database("theirs") as theirs_url:
        await (await PostgresCheckpointer.open(ours_url, create=True)).close()
        await make_cubeloop_schema(theirs_url)
        ours, theirs = await _catalog(ours_url), await _catalog(theirs_url)
        assert ours == theirs
        # Beside cubeloop's schema only our own objects: tables and triggers named cubepi_tui_*.
        assert await _tables(ours_url) - await _tables(theirs_url) == {
            t for t in await _tables(ours_url) if t.startswith("cubepi_tui_")
        }
        conn = await asyncpg.connect(ours_url, timeout=10)
        try:
            triggers = {r[0] for r in await conn.fetch("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")}
        finally:
            await conn.close()
        assert triggers == {"cubepi_tui_bump", "cubepi_tui_count_messages", "cubepi_tui_record_thread"}
        assert len([p for p in ours["partitions"] if p[0] == "cubepi_messages"]) == 64
        assert ours["versions"] == [(5,)]


async def test_both_programs_append_to_one_thread_at_once() -> None:
    import asyncio

    async with postgres_database("both") as url:
        # A thread both programs write is unowned (cubeloop records no owner), whoever is first.
        async with await PostgresCheckpointer.open(url, create=True, owner=UNOWNED) as store:
            async with CubeloopPostgres(url) as theirs:

                async def cubeloop_writes() -> None:
                    for i in range(30):
                        await theirs.append("t", [cl.UserMessage(content=[cl.TextContent(text=f"cl-{i}")])])

                async def our_writes() -> None:
                    for i in range(30):
                        await store.append("t", [user_text(f"us-{i}"), user_text(f"us-{i}b")])

                started = time.monotonic()
                await asyncio.gather(cubeloop_writes(), our_writes())
                assert time.monotonic() - started < 120
            data = await store.load("t")
        texts = [m.text for m in data.messages]  # type: ignore[union-attr]
        assert data.message_ids == list(range(1, 91))  # type: ignore[union-attr]
        assert [t for t in texts if t.startswith("cl-")] == [f"cl-{i}" for i in range(30)]
        ours = [t for t in texts if t.startswith("us-")]
        assert ours == [x for i in range(30) for x in (f"us-{i}", f"us-{i}b")]
        # a batch of ours is never split by cubeloop's rows
        assert all(texts[texts.index(f"us-{i}") + 1] == f"us-{i}b" for i in range(30))
