"""How the Postgres store opens a database: created, refused, browse-only (never changing it),
upgraded through the ordered migrations; and what it does with a row it cannot decode."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from core.checkpoint import postgres_schema
from core.checkpoint.postgres import PostgresCheckpointer
from core.errors import DatabaseOpenError, ReadOnlyStoreError, SchemaError
from core.messages import user_text
from core.owners import UNOWNED
from tests.helpers.pg import make_cubeloop_schema, new_store
from tests.helpers.services import postgres_database

pytestmark = pytest.mark.postgres


async def _sql(url: str, *statements: str) -> list[Any]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        out = []
        for statement in statements:
            out.append(await conn.fetch(statement))
        return out
    finally:
        await conn.close()


async def _fingerprint(url: str) -> dict[str, Any]:
    """Every table's rows (as text, sorted), every relation, trigger and function: what browsing must not change."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        tables = [r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        rows = {
            t: await conn.fetchval(
                f"SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM \"{t}\" AS x"
            )
            for t in tables
        }
        catalog = [
            tuple(r)
            for r in await conn.fetch(
                "SELECT relname, relkind FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1"
            )
        ]
        triggers = sorted(r[0] for r in await conn.fetch("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"))
        functions = sorted(
            r[0] for r in await conn.fetch("SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        )
    finally:
        await conn.close()
    return {"rows": rows, "catalog": catalog, "triggers": triggers, "functions": functions}


async def _cubeloop_db_with_a_thread(url: str) -> None:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
    from cubeloop.providers.base import TextContent, UserMessage

    await make_cubeloop_schema(url)
    async with CubeloopPostgres(url) as theirs:
        await theirs.claim_run("t", "r1")
        await theirs.append("t", [UserMessage(content=[TextContent(text="hello")], run_id="r1")])
        await theirs.save_extra("t", {"k": 1})


async def test_browsing_a_cubeloop_database_never_changes_it() -> None:
    async with postgres_database("browse") as url:
        await _cubeloop_db_with_a_thread(url)
        before = await _fingerprint(url)
        # create=True: still never written; cubeloop's threads are the unowned scope's
        store = await PostgresCheckpointer.open(url, create=True, owner=UNOWNED)
        try:
            assert store.needs_upgrade and store.read_only and store.schema_version is None
            assert (await store.load("t")).messages[0].text == "hello"  # type: ignore[union-attr]
            assert [s.thread_id for s in await store.list_threads()] == ["t"]
            token = await store.change_token()
            assert await store.change_token() == token
            assert await store.load_journal("t") is None and await store.job_get("t", "k") is None
            assert await store.list_leases() == {} and await store.read_live_events("t") == []
            writes = [
                store.append("t", [user_text("no")]),
                store.save_extra("t", {"k": 2}),
                store.claim_run("t", "r2"),
                store.mark_run_complete("t", "r1"),
                store.save_pending_request("t", '{"question_id": "q"}'),
                store.record_tool_event("t", "c1", "start"),
                store.job_begin("t", "k"),
                store.send_command("t", "abort"),
                store.append_live_events("t", None, [{"type": "x"}]),
            ]
            for write in writes:
                with pytest.raises(ReadOnlyStoreError) as error:
                    await write
                assert str(error.value).endswith("is open for browsing only; upgrade it before writing to it.")
            stop = asyncio.Event()
            stop.set()
            assert [s async for s in store.change_signals(stop)] == []
        finally:
            await store.close()
        assert await _fingerprint(url) == before


async def test_browse_token_sees_cubeloops_writes() -> None:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres

    async with postgres_database("browse") as url:
        await _cubeloop_db_with_a_thread(url)
        async with await PostgresCheckpointer.open(url) as store:
            tokens = [await store.change_token()]
            async with CubeloopPostgres(url) as theirs:
                for write in (
                    lambda: theirs.save_extra("t", {"k": 2}),
                    lambda: theirs.mark_run_complete("t", "r1"),
                    lambda: theirs.claim_run("t", "r2"),
                    lambda: theirs.save_hitl_answer("t", "q1", {"ok": True}, run_id="r2"),
                ):
                    await write()
                    tokens.append(await store.change_token())
                    assert tokens[-1] != tokens[-2]


async def test_upgrade_adds_our_tables_in_one_go_and_keeps_cubeloops_rows() -> None:
    async with postgres_database("upgrade") as url:
        await _cubeloop_db_with_a_thread(url)
        before = (await _fingerprint(url))["rows"]
        async with await PostgresCheckpointer.open(url, owner=UNOWNED) as store:  # cubeloop's thread is unowned
            await store.upgrade()
            await store.upgrade()  # a no-op once done
            assert not store.needs_upgrade and store.schema_version == len(postgres_schema.MIGRATIONS)
            after = (await _fingerprint(url))["rows"]
            assert {t: after[t] for t in before} == before, "no row of cubeloop's changed"
            assert {t for t in after if t not in before} == {t for t in after if t.startswith("cubepi_tui_")}
            await store.append("t", [user_text("after")])
        async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as store:
            assert not store.read_only
            assert [m.text for m in (await store.load("t")).messages] == ["hello", "after"]  # type: ignore[union-attr]


async def test_an_older_schema_of_ours_is_browsed_until_the_next_migration_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    async def next_adds_a_table(conn: Any) -> None:
        await conn.execute("CREATE TABLE cubepi_tui_test_v2 (x INTEGER)")

    store = await new_store("older")
    try:
        await store.append("t", [user_text("kept")])
        await store.record_tool_event("t", "c1", "start", tool_name="read", at=1.0)
        url = store._url
        current = len(postgres_schema.MIGRATIONS)
        monkeypatch.setattr(postgres_schema, "MIGRATIONS", [*postgres_schema.MIGRATIONS, next_adds_a_table])
        async with await PostgresCheckpointer.open(url, create=False) as older:
            assert (older.needs_upgrade, older.read_only, older.schema_version) == (True, True, current)
            assert (await older.load("t")).messages[0].text == "kept"  # type: ignore[union-attr]
            assert list(await older.load_journal("t")) == ["c1"]  # type: ignore[arg-type]
            with pytest.raises(ReadOnlyStoreError):
                await older.append("t", [user_text("no")])
            await older.upgrade()
            assert (older.needs_upgrade, older.schema_version) == (False, current + 1)
            await older.append("t", [user_text("now")])
        (found,) = await _sql(url, "SELECT count(*) FROM cubepi_tui_test_v2")
        assert found[0][0] == 0
        assert [m.text for m in (await store.load("t")).messages] == ["kept", "now"]  # type: ignore[union-attr]
    finally:
        await store.close()


async def _cubeloop_appends(url: str, text: str) -> None:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
    from cubeloop.providers.base import TextContent, UserMessage

    async with CubeloopPostgres(url) as theirs:
        await theirs.append("t", [UserMessage(content=[TextContent(text=text)])])


async def test_a_version_1_store_of_ours_upgrades_to_the_write_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    first = postgres_schema.MIGRATIONS[:1]
    async with postgres_database("v1") as url:
        with monkeypatch.context() as patched:
            patched.setattr(postgres_schema, "MIGRATIONS", first)
            await (await PostgresCheckpointer.open(url, create=True)).close()
        await _cubeloop_appends(url, "from v1")  # v1's triggers count it
        (functions,) = await _sql(url, "SELECT count(*) FROM pg_proc WHERE proname = 'cubepi_tui_append'")
        assert functions[0][0] == 0
        # cubeloop wrote "t" first: unowned
        async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as store:
            assert (store.needs_upgrade, store.schema_version) == (True, 1)
            await store.upgrade()
            assert (store.needs_upgrade, store.schema_version) == (False, len(postgres_schema.MIGRATIONS))
            await store.append("t", [user_text("after")])
            await store.save_extra("t", {"k": 1})
            data = await store.load("t")
            assert [m.text for m in data.messages] == ["from v1", "after"]  # type: ignore[union-attr]
            assert data.message_ids == [1, 2] and data.extra == {"k": 1}  # type: ignore[union-attr]
            (threads,) = await _sql(url, "SELECT n, last_seq FROM cubepi_tui_thread_stats WHERE thread_id = 't'")
            assert tuple(threads[0]) == (2, 2)


async def test_refusals_are_one_sentence() -> None:
    async with postgres_database("refuse") as url:
        with pytest.raises(DatabaseOpenError) as empty:
            await PostgresCheckpointer.open(url, create=False)
        assert str(empty.value).endswith("holds no agent threads (no cubeloop tables).")
        assert await _fingerprint(url) == {"rows": {}, "catalog": [], "triggers": [], "functions": []}

        await (await PostgresCheckpointer.open(url)).close()
        await _sql(url, "UPDATE cubepi_tui_schema SET version = 99")
        with pytest.raises(SchemaError) as newer:
            await PostgresCheckpointer.open(url)
        assert (
            f"written by a newer cubepi-tui (schema version 99, this one knows up to {len(postgres_schema.MIGRATIONS)})"
            in str(newer.value)
        )

        await _sql(url, "UPDATE cubepi_tui_schema SET version = 1", "UPDATE cubepi_schema_version SET version = 4")
        with pytest.raises(SchemaError) as theirs:
            await PostgresCheckpointer.open(url)
        assert "holds cubeloop's schema version 4, from an older cubeloop" in str(theirs.value)


async def test_an_unreachable_server_is_one_sentence_without_the_password() -> None:
    with pytest.raises(DatabaseOpenError) as error:
        await PostgresCheckpointer.open("postgresql://me:s3cret@127.0.0.1:1/threads")
    assert str(error.value) == (
        "Cannot open the PostgreSQL database postgresql://me@127.0.0.1:1/threads: the server cannot be reached."
    )
    async with postgres_database("where") as url:
        missing = url.rsplit("/", 1)[0] + "/no_such_database_here"
        with pytest.raises(DatabaseOpenError) as gone:
            await PostgresCheckpointer.open(missing)
        assert str(gone.value).endswith("that database does not exist on the server.")


async def test_an_undecodable_row_is_reported_and_kept() -> None:
    store = await new_store("corrupt")
    try:
        await store.append("t", [user_text("before")])
        await _sql(
            store._url,
            "INSERT INTO cubepi_messages (thread_id, seq, role, payload) VALUES ('t', 2, 'user', '\\xc1'::bytea)",
        )
        await store.append("t", [user_text("after")])
        data = await store.load("t")
        assert [m.text for m in data.messages] == ["before", "after"] and data.message_ids == [1, 3]  # type: ignore[union-attr]
        (problem,) = data.problems  # type: ignore[union-attr]
        assert problem.row_id == 2 and problem.raw == "c1" and "not msgpack" in problem.reason
        (summary,) = await store.list_threads()
        assert summary.message_count == 3
        (raw,) = await _sql(store._url, "SELECT payload FROM cubepi_messages WHERE seq = 2")
        assert raw[0][0] == b"\xc1"
    finally:
        await store.close()


async def test_text_jsonb_cannot_hold_round_trips_exactly() -> None:
    from core.messages import TextContent, ToolResultMessage

    odd = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")  # lone surrogates, no strict UTF-8 form
    result = ToolResultMessage(
        tool_call_id="c1", tool_name="read", content=[TextContent(text=odd)], metadata={"path": odd, "nul": "a\x00b"}
    )
    store = await new_store("odd")
    try:
        await store.append("t", [result])
        (loaded,) = (await store.load("t")).messages  # type: ignore[union-attr]
        assert loaded.model_dump() == result.model_dump()
        (column,) = await _sql(store._url, "SELECT metadata::text FROM cubepi_messages")
        assert json.loads(column[0][0]) == {"nul": "a\ufffdb", "path": "caf\ufffd \ufffd"}  # what JSONB can hold
    finally:
        await store.close()
