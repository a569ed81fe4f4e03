"""Owners and revisions on the Postgres store, where the server matters: migrating a store of
our previous schema (v2) and one made by cubeloop (their threads become unowned), a crash
injected between a compare-and-set UPDATE and its COMMIT (an exception, and a SIGKILLed
child whose open transaction the server rolls back), 100 concurrent compare-and-set writers,
and the thread listing's fixed number of queries whatever the number of threads and owners.

The shared contract of owners (every backend) is ``test_contract_owners.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import asyncpg
import pytest

from core.checkpoint import postgres_rows, postgres_schema
from core.checkpoint.base import Fingerprints, Lease, StepRecord, decode_thread_meta, thread_unavailable
from core.checkpoint.postgres import PostgresCheckpointer
from core.errors import ConflictError, ReadOnlyStoreError, ThreadNotFoundError
from core.messages import user_text
from core.owners import OWNER_ENV, UNOWNED
from tests.helpers import pg_crash_child as child
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.pg import make_cubeloop_schema, new_store
from tests.helpers.services import postgres_database

pytestmark = pytest.mark.postgres

WAIT = 60.0
"""Seconds a wait for the server may take (a liveness bound, reached only by a failing test)."""


async def _sql(url: str, statement: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetch(statement, *args)
    finally:
        await conn.close()


# --- migration ---------------------------------------------------------------------------------


async def _write_as_v2(url: str) -> None:
    """Thread "t" as the previous version wrote it: through v2's own write functions in the
    database (append, save_extra, a tool event, live events) and its rows of leases, jobs and
    commands (v2 has no revision columns), all for a thread that records no owner."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        encoded = [postgres_rows.encode_message(m) for m in (user_text("from v2", run_id="r1"),)]
        now = time.time()
        await conn.execute(
            "SELECT cubepi_tui_append($1, 't', $2, NULL, $3::text[], $4::text[], $5::bytea[], $6::text[])",
            uuid.uuid4().hex,
            now,
            *([r[i] for r in encoded] for i in range(4)),
        )
        await conn.execute("SELECT cubepi_tui_save_extra($1, 't', $2, '{\"k\": 1}')", uuid.uuid4().hex, now)
        await conn.execute(
            "SELECT cubepi_tui_tool_event($1, 't', $2, NULL, 'c1', 'start', 'read', 'r1', NULL, $2)",
            uuid.uuid4().hex,
            now,
        )
        await conn.execute("SELECT cubepi_tui_live_events($1, 't', $2, 'r1', ARRAY['{\"type\":\"x\"}'], 10)", "w", now)
        await conn.execute(
            "INSERT INTO cubepi_tui_leases VALUES ('t', 'h1', 1, 'host', 'r1', $1, $1, $2)", now, now + 3600
        )
        await conn.execute("INSERT INTO cubepi_tui_jobs (thread_id, key, status) VALUES ('t', 'job:a', 'started')")
        await conn.execute(
            "INSERT INTO cubepi_tui_commands (thread_id, kind, text, status, created_at, updated_at)"
            " VALUES ('t', 'steer', 'go', 'pending', $1, $1)",
            now,
        )
    finally:
        await conn.close()


async def test_a_store_of_the_previous_version_migrates_its_threads_as_unowned(monkeypatch: pytest.MonkeyPatch) -> None:
    async with postgres_database("v2") as url:
        with monkeypatch.context() as patched:
            patched.setattr(postgres_schema, "MIGRATIONS", postgres_schema.MIGRATIONS[:2])
            await (await PostgresCheckpointer.open(url, create=True)).close()
        await _write_as_v2(url)

        unowned = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        ann = await PostgresCheckpointer.open(url, create=False, owner="ann")
        try:
            for store in (unowned, ann):
                assert (store.needs_upgrade, store.read_only, store.schema_version) == (True, True, 2)
            # Browse-only, scoped: the unowned scope reads the old thread, a named owner nothing.
            data = await unowned.load("t")
            assert data is not None and [m.text for m in data.messages] == ["from v2"]  # type: ignore[union-attr]
            assert (data.extra, data.extra_revision, data.meta) == ({"k": 1}, 0, None)
            assert [s.thread_id for s in await unowned.list_threads()] == ["t"]
            assert list(await unowned.load_journal("t") or {}) == ["c1"]
            assert (await unowned.job_get("t", "job:a")).revision == 1  # type: ignore[union-attr]
            assert (await unowned.get_lease("t")).revision == 1  # type: ignore[union-attr]
            assert [c.revision for c in await unowned.list_commands("t")] == [1]
            assert await unowned.load_meta("t") == decode_thread_meta("t", None, None, 0, None, None)
            assert await unowned.step_get("t", "k") is None and await unowned.list_steps("t") == []
            assert await unowned.unowned_count() == 1 == await ann.unowned_count()
            assert await ann.load("t") is None and await ann.list_threads() == []
            assert await ann.load_journal("t") == {} and await ann.job_get("t", "job:a") is None
            assert await ann.get_lease("t") is None and await ann.list_leases() == {}
            assert await ann.list_commands("t") == [] and await ann.read_live_events("t") == []
            assert await ann.load_meta("t") is None
            with pytest.raises(ReadOnlyStoreError):
                await unowned.append("t", [user_text("no")])

            await unowned.upgrade()
            assert (unowned.needs_upgrade, unowned.schema_version) == (False, len(postgres_schema.MIGRATIONS))
            await unowned.append("t", [user_text("after")])
            assert await unowned.save_extra("t", {"k": 2}, expected_revision=0) == 1
            meta = await unowned.save_fingerprints("t", Fingerprints("i", "a", {}), expected_revision=0)
            assert (meta.owner, meta.revision, meta.created_at) == (UNOWNED, 1, None)  # existed before its record
            (command,) = await unowned.list_commands("t")
            assert (await unowned.update_command(command.seq, "delivered", expected_revision=1)).revision == 2
            assert await unowned.renew_lease("t", "h1", time.time(), time.time() + 60)
            assert (await unowned.get_lease("t")).revision == 2  # type: ignore[union-attr]
            await unowned.job_finish("t", "job:a", "done", 1)
            assert (await unowned.job_get("t", "job:a")).revision == 2  # type: ignore[union-attr]
            data = await unowned.load("t")
            assert [m.text for m in data.messages] == ["from v2", "after"]  # type: ignore[union-attr]
            assert (data.extra, data.extra_revision) == ({"k": 2}, 1)  # type: ignore[union-attr]

            # A named owner still cannot see or write the unowned thread, and says so as for a missing one.
            async with await PostgresCheckpointer.open(url, create=False, owner="ann") as ann_now:
                assert await ann_now.load("t") is None and await ann_now.list_threads() == []
                with pytest.raises(ThreadNotFoundError) as refused:
                    await ann_now.append("t", [user_text("no")])
                assert str(refused.value) == str(thread_unavailable("t", "ann"))
                await ann_now.append("mine", [user_text("ann's")])
                assert [s.thread_id for s in await ann_now.list_threads()] == ["mine"]
            assert [s.thread_id for s in await unowned.list_threads()] == ["t"]
        finally:
            await ann.close()
            await unowned.close()


async def test_a_v2_thread_with_rows_only_in_our_tables_is_not_taken_by_a_named_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A v2 database's thread whose rows are all ours (its journal and live events through
    v2's write functions, an expired lease, a finished job, a pending command; no thread row
    of cubeloop's) exists: after the upgrade it is the unowned scope's, and each named
    owner's write to it is refused with the sentence of a foreign thread and writes nothing."""
    async with postgres_database("v2-ours") as url:
        with monkeypatch.context() as patched:
            patched.setattr(postgres_schema, "MIGRATIONS", postgres_schema.MIGRATIONS[:2])
            await (await PostgresCheckpointer.open(url, create=True)).close()
        now = time.time()
        conn = await asyncpg.connect(url, timeout=10)
        try:
            await conn.execute(
                "SELECT cubepi_tui_tool_event($1, 'left', $2, NULL, 'c1', 'end', 'read', NULL, 'k1', $2)",
                uuid.uuid4().hex,
                now,
            )
            await conn.execute("SELECT cubepi_tui_live_events($1, 'left', $2, NULL, ARRAY['{}'], 10)", "w1", now)
            await conn.execute(
                "INSERT INTO cubepi_tui_leases VALUES ('left', 'h1', 1, 'host', NULL, $1, $1, $2)", now, now - 1
            )
            await conn.execute(
                "INSERT INTO cubepi_tui_jobs (thread_id, key, status, result) VALUES ('left', 'k1', 'done', '42')"
            )
            await conn.execute(
                "INSERT INTO cubepi_tui_commands (thread_id, kind, text, status, created_at, updated_at)"
                " VALUES ('left', 'steer', 'go', 'pending', $1, $1)",
                now,
            )
        finally:
            await conn.close()
        async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as unowned:
            await unowned.upgrade()
        tables = [*postgres_schema.OUR_DATA_TABLES, postgres_schema.STEPS, "cubepi_threads", "cubepi_messages"]

        async def everything() -> dict[str, list[Any]]:
            return {t: [tuple(r) for r in await _sql(url, f"SELECT * FROM {t} ORDER BY 1, 2")] for t in tables}

        kept = await everything()
        writes = {
            "append": lambda s: s.append("left", [user_text("mine now?")]),
            "save_extra": lambda s: s.save_extra("left", {"title": "mine"}),
            "claim_run": lambda s: s.claim_run("left", "r9"),
            "record_tool_event": lambda s: s.record_tool_event("left", "c1", "start"),
            "job_begin": lambda s: s.job_begin("left", "k1"),
            "acquire_lease": lambda s: s.acquire_lease(
                Lease("left", "thief", 1, "box", None, now, now, now + 60), is_stale=lambda _: True
            ),
            "append_live_events": lambda s: s.append_live_events("left", None, [{"type": "x"}]),
            "send_command": lambda s: s.send_command("left", "abort"),
            "save_fingerprints": lambda s: s.save_fingerprints("left", Fingerprints("i", "a", {}), expected_revision=0),
            "step_begin": lambda s: s.step_begin("left", "k1", input_fingerprint="f", workflow="w"),
        }
        async with await PostgresCheckpointer.open(url, create=False, owner="ann") as ann:
            for name, write in writes.items():
                with pytest.raises(ThreadNotFoundError) as refused:
                    await write(ann)
                assert str(refused.value) == str(thread_unavailable("left", "ann")), name
            assert await ann.load_meta("left") is None and await ann.list_commands("left") == []
        assert await everything() == kept, "a refused write wrote something"
        owners = await _sql(url, f"SELECT owner FROM {postgres_schema.RECORDS} WHERE thread_id = 'left'")
        assert [tuple(r) for r in owners] in ([], [(None,)]), "the leftover thread was given an owner"
        async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as unowned:
            assert [c.text for c in await unowned.list_commands("left")] == ["go"]
            assert (await unowned.job_get("left", "k1")).status == "done"  # type: ignore[union-attr]


async def test_a_cubeloop_store_migrates_with_its_threads_unowned_and_cubeloop_keeps_working() -> None:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
    from cubeloop.providers.base import TextContent, UserMessage

    async with postgres_database("cl") as url:
        await make_cubeloop_schema(url)
        async with CubeloopPostgres(url) as theirs:
            await theirs.claim_run("t", "r1")
            await theirs.append("t", [UserMessage(content=[TextContent(text="from cubeloop")], run_id="r1")])
            await theirs.save_extra("t", {"k": 1})
        unowned = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        ann = await PostgresCheckpointer.open(url, create=False, owner="ann")
        try:
            assert (unowned.needs_upgrade, unowned.schema_version) == (True, None)
            data = await unowned.load("t")
            assert data is not None and [m.text for m in data.messages] == ["from cubeloop"]  # type: ignore[union-attr]
            assert [(r.run_id, r.revision) for r in data.runs] == [("r1", 1)]
            assert await unowned.load_meta("t") == decode_thread_meta("t", None, None, 0, None, None)
            assert await ann.load("t") is None and await ann.list_threads() == [] and await ann.load_meta("t") is None
            assert await ann.unowned_count() == 1

            await unowned.upgrade()
            await unowned.append("t", [user_text("ours, unowned", run_id="r1")])
            await unowned.mark_run_complete("t", "r1")
            assert await unowned.save_extra("t", {"ours": True}, expected_revision=0) == 1
            with pytest.raises(ConflictError) as stale:
                await unowned.save_extra("t", {"late": True}, expected_revision=0)
            assert (stale.value.expected, stale.value.actual) == (0, 1)
            async with await PostgresCheckpointer.open(url, create=False, owner="ann") as ann_now:
                with pytest.raises(ThreadNotFoundError):
                    await ann_now.save_extra("t", {"no": 1})
                await ann_now.append("mine", [user_text("ann's")])
                assert [s.thread_id for s in await ann_now.list_threads()] == ["mine"]
            data = await unowned.load("t")
            assert [(r.run_id, r.revision) for r in data.runs] == [("r1", 2)]  # type: ignore[union-attr]
            assert [s.thread_id for s in await unowned.list_threads()] == ["t"]

            async with CubeloopPostgres(url) as theirs:  # the migrated store, every thread
                loaded = await theirs.load("t")
                assert loaded is not None and loaded.extra == {"k": 1, "ours": True}
                assert [m.content[0].text for m in loaded.messages] == ["from cubeloop", "ours, unowned"]
                assert [m.content[0].text for m in (await theirs.load("mine")).messages] == ["ann's"]  # type: ignore[union-attr]
                await theirs.append("t", [UserMessage(content=[TextContent(text="cubeloop again")])])
                await theirs.save_extra("t", {"k": 3})
            data = await unowned.load("t")
            assert [m.text for m in data.messages][-1] == "cubeloop again"  # type: ignore[union-attr]
            assert data.extra == {"k": 3, "ours": True} and data.extra_revision == 1  # type: ignore[union-attr]
        finally:
            await ann.close()
            await unowned.close()


async def test_a_v3_database_lists_alike_before_and_after_v4_gives_every_thread_a_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A v3 database holds ann's thread (with its record) and one cubeloop wrote (none).
    Browsed, each scope lists its own; the upgrade to v4 gives cubeloop's thread a record
    without owner and leaves ann's as it was; afterwards a thread cubeloop starts gets one
    by trigger, so it is the unowned scope's and ann can neither see nor take it."""
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
    from cubeloop.providers.base import TextContent, UserMessage

    async with postgres_database("v3") as url:
        with monkeypatch.context() as patched:
            patched.setattr(postgres_schema, "MIGRATIONS", postgres_schema.MIGRATIONS[:3])
            async with await PostgresCheckpointer.open(url, create=True, owner="ann") as ann:
                await ann.append("a1", [user_text("ann's, at v3")])
        async with CubeloopPostgres(url) as theirs:
            await theirs.append("c1", [UserMessage(content=[TextContent(text="cubeloop's")])])
        records = f"SELECT thread_id, owner, created_at FROM {postgres_schema.RECORDS} ORDER BY 1"
        ann_record = [tuple(r) for r in await _sql(url, records)]
        assert [r[:2] for r in ann_record] == [("a1", "ann")]

        async def listings() -> tuple[list[str], list[str], int]:
            async with (
                await PostgresCheckpointer.open(url, create=False, owner="ann") as ann,
                await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as unowned,
            ):
                return (
                    sorted(s.thread_id for s in await ann.list_threads()),
                    sorted(s.thread_id for s in await unowned.list_threads()),
                    await ann.unowned_count(),
                )

        assert await listings() == (["a1"], ["c1"], 1)  # browsed at v3
        async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as unowned:
            assert unowned.needs_upgrade
            await unowned.upgrade()
            assert unowned.schema_version == 4
        assert [tuple(r) for r in await _sql(url, records)] == [*ann_record, ("c1", None, None)]
        assert await listings() == (["a1"], ["c1"], 1)

        async with CubeloopPostgres(url) as theirs:
            await theirs.append("c2", [UserMessage(content=[TextContent(text="cubeloop's, after v4")])])
            await theirs.append("a1", [UserMessage(content=[TextContent(text="cubeloop in ann's thread")])])
        assert [tuple(r) for r in await _sql(url, records)] == [*ann_record, ("c1", None, None), ("c2", None, None)]
        assert await listings() == (["a1"], ["c1", "c2"], 2)
        async with await PostgresCheckpointer.open(url, create=False, owner="ann") as ann:
            with pytest.raises(ThreadNotFoundError) as refused:
                await ann.append("c2", [user_text("mine?")])
            assert str(refused.value) == str(thread_unavailable("c2", "ann"))


# --- a crash between the UPDATE and the COMMIT -------------------------------------------------


async def _stepped(store: PostgresCheckpointer) -> StepRecord:
    """Step record ``job:crash`` of thread "t" with one committed step (revision 1)."""
    await store.step_begin("t", child.STEP_KEY, input_fingerprint="f", workflow=child.WORKFLOW, total_steps=3)
    return await store.step_commit(
        "t", child.STEP_KEY, expected_revision=0, workflow=child.WORKFLOW, next_step=1, data={"normalized": "hi"}
    )


class Injected(RuntimeError):
    """The crash the seam raises."""


async def test_an_exception_before_commit_leaves_the_step_and_the_extra_as_they_were() -> None:
    store = await new_store("inject")
    seen: list[tuple[str, Any, Any]] = []
    try:
        before = await _stepped(store)
        assert await store.save_extra("t", {"k": 1}, expected_revision=0) == 1
        extra_before = await store.load("t")

        async def crash(what: str, conn: Any) -> None:
            # Inside the transaction the UPDATE is made; outside it, not yet.
            inside = (
                await conn.fetchval("SELECT revision FROM cubepi_tui_steps WHERE key = $1", child.STEP_KEY)
                if what == "step commit"
                else await conn.fetchval("SELECT extra_revision FROM cubepi_tui_thread_records WHERE thread_id = 't'")
            )
            (outside,) = await _sql(
                store._url,
                "SELECT (SELECT revision FROM cubepi_tui_steps WHERE key = $1),"
                " (SELECT extra_revision FROM cubepi_tui_thread_records WHERE thread_id = 't')",
                child.STEP_KEY,
            )
            seen.append((what, inside, tuple(outside)))
            raise Injected("crash before commit")

        store._before_commit = crash
        with pytest.raises(Injected):
            await store.step_commit(
                "t", child.STEP_KEY, expected_revision=1, workflow=child.WORKFLOW, next_step=2, data={"lost": 1}
            )
        with pytest.raises(Injected):
            await store.save_extra("t", {"lost": 1}, expected_revision=1)
        assert seen == [("step commit", 2, (1, 1)), ("save", 2, (1, 1))]
        store._before_commit = None

        assert await store.step_get("t", child.STEP_KEY) == before  # exactly: data, step, revision, time
        after = await store.load("t")
        assert (after.extra, after.extra_revision) == (extra_before.extra, 1)  # type: ignore[union-attr]
        # The next compare-and-set with the old expected revision goes through.
        again = await store.step_commit(
            "t", child.STEP_KEY, expected_revision=1, workflow=child.WORKFLOW, next_step=2, data={"words": 2}
        )
        assert (again.revision, again.next_step, again.data) == (2, 2, {"words": 2})
        assert await store.save_extra("t", {"k": 2}, expected_revision=1) == 2
    finally:
        await store.close()


async def _backend_gone(url: str, pid: int) -> None:
    """Wait until server process ``pid`` has ended (it rolls back its open transaction on the
    way out), then check it holds no lock any more."""
    deadline = time.monotonic() + WAIT
    while await _sql(url, "SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid):
        assert time.monotonic() < deadline, f"server process {pid} still there {WAIT:.0f} s after its client died"
        await asyncio.sleep(0.05)
    assert await _sql(url, "SELECT 1 FROM pg_locks WHERE pid = $1", pid) == []


@pytest.mark.parametrize("what", ["step", "extra"])
async def test_a_child_killed_between_update_and_commit_leaves_the_earlier_state(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OWNER_ENV, "crash-owner")
    store = await new_store("kill", owner="crash-owner")
    try:
        step_before = await _stepped(store)
        assert await store.save_extra("t", {"k": 1}, expected_revision=0) == 1
        data_before = await store.load("t")
        expected = 1
        marks = await asyncio.to_thread(
            run_marked,
            [sys.executable, "-m", "tests.helpers.pg_crash_child", store._url, "t", what, str(expected)],
            f"the {what} writer",
            kill_at=["before-commit"],
            cwd=str(REPO_ROOT),
        )
        (pid,) = [int(m.split("-", 1)[1]) for m in marks if m.startswith("backend-")]
        assert "done" not in marks
        # The killed client's transaction was open on the server with the UPDATE made; the
        # server sees the connection drop, rolls it back and ends the process.
        await _backend_gone(store._url, pid)

        async with await PostgresCheckpointer.open(store._url, create=False, owner="crash-owner") as reopened:
            assert not reopened.read_only
            assert await reopened.step_get("t", child.STEP_KEY) == step_before
            data = await reopened.load("t")
            assert data is not None and data_before is not None
            assert (data.extra, data.extra_revision, data.meta) == (data_before.extra, 1, data_before.meta)
            assert data.message_ids == data_before.message_ids
            # The next compare-and-set with the old expected revision goes through (no lock left).
            if what == "step":
                done = await reopened.step_commit(
                    "t",
                    child.STEP_KEY,
                    expected_revision=expected,
                    workflow=child.WORKFLOW,
                    next_step=2,
                    data="words=2",
                )
                assert (done.revision, done.data) == (2, "words=2")
            else:
                assert await reopened.save_extra("t", {"k": 2}, expected_revision=expected) == 2
    finally:
        await store.close()


# --- 100 concurrent compare-and-set writers ----------------------------------------------------

WRITERS = 100
STORES = 4
"""Separate store objects (each its own pool of connections) the writers are spread over."""


async def _many_stores(first: PostgresCheckpointer) -> list[PostgresCheckpointer]:
    return [first, *[await PostgresCheckpointer.open(first._url, create=False) for _ in range(STORES - 1)]]


async def test_a_hundred_concurrent_extra_writers_each_apply_once_or_conflict() -> None:
    first = await new_store("cas")
    stores = await _many_stores(first)
    try:
        await first.save_extra("t", {"start": True})  # revision 1

        async def writer(i: int) -> tuple[int, int | None]:
            store = stores[i % STORES]
            data = await store.load("t")
            assert data is not None
            try:
                return i, await store.save_extra(
                    "t", {f"w{i}": data.extra_revision}, expected_revision=data.extra_revision
                )
            except ConflictError as error:
                assert error.thread_id == "t" and error.expected == data.extra_revision
                assert error.actual is not None and error.actual > data.extra_revision
                return i, None

        results = await asyncio.wait_for(asyncio.gather(*(writer(i) for i in range(WRITERS))), WAIT * 2)
        applied = {i: revision for i, revision in results if revision is not None}
        assert applied, "no writer got through"
        final = await first.load("t")
        assert final is not None
        assert final.extra_revision == 1 + len(applied)
        assert sorted(applied.values()) == list(range(2, 2 + len(applied)))  # each revision handed out once
        assert set(final.extra) == {"start", *(f"w{i}" for i in applied)}  # exactly the applied ones
        assert all(final.extra[f"w{i}"] == revision - 1 for i, revision in applied.items())
    finally:
        for store in stores[1:]:
            await store.close()
        await first.close()


async def test_a_hundred_concurrent_step_writers_each_apply_once_or_conflict() -> None:
    first = await new_store("cas")
    stores = await _many_stores(first)
    try:
        await first.step_begin("t", "job:k", input_fingerprint="f", workflow="w")

        async def writer(i: int) -> tuple[int, int | None]:
            store = stores[i % STORES]
            current = await store.step_get("t", "job:k")
            assert current is not None
            try:
                done = await store.step_commit(
                    "t",
                    "job:k",
                    expected_revision=current.revision,
                    workflow="w",
                    next_step=current.next_step + 1,
                    data={"writer": i, "after": current.data},
                )
                return i, done.revision
            except ConflictError as error:
                assert (error.expected, error.record) == (current.revision, "step job:k")
                return i, None

        results = await asyncio.wait_for(asyncio.gather(*(writer(i) for i in range(WRITERS))), WAIT * 2)
        applied = {revision: i for i, revision in results if revision is not None}
        assert applied, "no writer got through"
        assert sorted(applied) == list(range(1, 1 + len(applied)))
        final = await first.step_get("t", "job:k")
        assert final is not None
        assert (final.revision, final.next_step) == (len(applied), len(applied))
        # The data is a chain: each applied writer saw the one before it, none was lost.
        chain, data = [], final.data
        while data is not None:
            chain.append(data["writer"])
            data = data["after"]
        assert chain == [applied[r] for r in range(len(applied), 0, -1)]
    finally:
        for store in stores[1:]:
            await store.close()
        await first.close()


# --- the listing stays a fixed number of queries ------------------------------------------------


async def test_the_thread_listing_sends_the_same_queries_for_one_thread_or_many_of_several_owners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ann = await new_store("listing", owner="ann")
    bob = await PostgresCheckpointer.open(ann._url, create=False, owner="bob")
    sent: list[str] = []
    real_fetch = asyncpg.connection.Connection.fetch

    async def counting_fetch(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(query)
        return await real_fetch(self, query, *args, **kwargs)

    try:
        now = time.time()
        await ann.append("a0", [user_text("first")])
        await ann.acquire_lease(Lease("a0", "h", 1, "host", None, now, now, now + 60), is_stale=lambda _: True)
        monkeypatch.setattr(asyncpg.connection.Connection, "fetch", counting_fetch)
        (only,) = await ann.list_threads()
        one = list(sent)
        monkeypatch.undo()
        for i in range(1, 30):
            await ann.append(f"a{i}", [user_text(f"ann {i}")])
            await bob.append(f"b{i}", [user_text(f"bob {i}")])
            await ann.claim_run(f"a{i}", "r1")
        sent.clear()
        monkeypatch.setattr(asyncpg.connection.Connection, "fetch", counting_fetch)
        listed = await ann.list_threads()
        assert sent == one, "the listing's queries changed with the number of threads"
        assert only.lease is not None and only.lease.revision == 1
        assert sorted(s.thread_id for s in listed) == sorted(f"a{i}" for i in range(30))
        assert all(s.first_prompt.startswith(("ann", "first")) for s in listed)
        assert {s.thread_id for s in await bob.list_threads()} == {f"b{i}" for i in range(1, 30)}
    finally:
        await bob.close()
        await ann.close()


def _buffers(plan: dict[str, Any]) -> int:
    """Shared buffers the executed plan touched (its top node counts every node under it)."""
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


async def _buffers_of(monkeypatch: pytest.MonkeyPatch, call: Any) -> int:
    """The shared buffers every query of ``call()`` touches on the server, each measured by
    running it under ``EXPLAIN (ANALYZE, BUFFERS)`` first, in the same transaction (the same
    settings and snapshot), then for real: the work it does, free of timing noise."""
    touched = [0]
    methods = {name: getattr(asyncpg.connection.Connection, name) for name in ("fetch", "fetchrow", "fetchval")}

    def measured(real: Any) -> Any:
        async def run(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if query.lstrip().upper().startswith("SELECT"):
                explained = await methods["fetchval"](self, f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", *args)
                touched[0] += sum(_buffers(plan) for plan in json.loads(explained))
            return await real(self, query, *args, **kwargs)

        return run

    with monkeypatch.context() as patched:
        for name, real in methods.items():
            patched.setattr(asyncpg.connection.Connection, name, measured(real))
        await call()
    return touched[0]


async def test_the_listing_and_unowned_count_do_the_same_work_however_many_threads_others_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Must have 1, "no timing or count leak in the picker": bob's listing and everyone's
    unowned count start from the owner's threads (the records' owner index), so the buffers
    they touch do not grow with the threads of other owners (named or none)."""
    bob = await new_store("quiet", owner="bob")
    unowned = await PostgresCheckpointer.open(bob.database_url, create=False, owner=UNOWNED)
    alice = await PostgresCheckpointer.open(bob.database_url, create=False, owner="alice")
    try:
        await bob.append("b0", [user_text("bob's")])
        await unowned.append("u0", [user_text("nobody's")])

        async def work() -> tuple[int, int, int]:
            async def listed(store: PostgresCheckpointer, expected: list[str]) -> None:
                assert [s.thread_id for s in await store.list_threads()] == expected

            async def counted() -> None:
                assert await bob.unowned_count() == 1

            return (
                await _buffers_of(monkeypatch, lambda: listed(bob, ["b0"])),
                await _buffers_of(monkeypatch, lambda: listed(unowned, ["u0"])),
                await _buffers_of(monkeypatch, counted),
            )

        alone = await work()
        for i in range(300):
            await alice.append(f"a{i}", [user_text("alice's")])
            await alice.claim_run(f"a{i}", "r1")
        async with asyncpg.create_pool(bob.database_url, min_size=1, max_size=1) as pool:
            await pool.execute("ANALYZE")  # statistics that show the other owners' many rows
        crowded = await work()
        for what, few, many in zip(
            ("bob's listing", "the unowned listing", "unowned_count"), alone, crowded, strict=True
        ):
            assert many <= 2 * few, f"{what}: {many} buffers beside 300 of alice's threads, {few} without"
    finally:
        await alice.close()
        await unowned.close()
        await bob.close()


# --- a compare-and-set write whose acknowledgement was lost -------------------------------------


async def test_a_compare_and_set_write_whose_commit_answer_was_lost_answers_what_it_did() -> None:
    """The retry of a write that committed (its answer lost on the way back) finds its write
    id and returns what the first attempt returned, instead of meeting its own new revision
    as a conflict or writing twice."""
    from urllib.parse import urlsplit, urlunsplit

    from tests.helpers.pg_proxy import CommitDropper

    origin = await new_store("lostcas")
    where = urlsplit(origin._url)
    proxy = CommitDropper(where.hostname or "127.0.0.1", where.port or 5432)
    port = await proxy.start()
    user = where.netloc.rpartition("@")[0]
    url = urlunsplit(where._replace(netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"))
    store = await PostgresCheckpointer.open(url, create=False)
    try:
        assert await origin.save_extra("t", {"k": 0}) == 1
        await origin.step_begin("t", "job:a", input_fingerprint="f", workflow="w")
        command = await origin.send_command("t", "steer", "left")
        fingerprints = Fingerprints("i", "a", {"model": "m"}, "v1")
        calls = {
            "save_extra": lambda: store.save_extra("t", {"k": 1}, expected_revision=1),
            "step_commit": lambda: store.step_commit(
                "t", "job:a", expected_revision=0, workflow="w", next_step=1, data={"n": 1}
            ),
            "update_command": lambda: store.update_command(command.seq, "delivered", expected_revision=1),
            "save_fingerprints": lambda: store.save_fingerprints("t", fingerprints, expected_revision=0),
            "delete_thread": lambda: store.delete_thread("gone"),
        }
        await origin.append("gone", [user_text("to delete")])
        results = {}
        for name, call in calls.items():
            proxy.arm()
            dropped = proxy.dropped
            results[name] = await asyncio.wait_for(call(), WAIT)
            assert proxy.dropped == dropped + 1, f"{name}: its commit's answer was withheld"
        assert results["save_extra"] == 2 and (await origin.load("t")).extra_revision == 2  # type: ignore[union-attr]
        step = await origin.step_get("t", "job:a")
        assert results["step_commit"] == step and step is not None and step.revision == 1
        (stored,) = await origin.list_commands("t")
        assert results["update_command"] == stored and stored.revision == 2
        meta = await origin.load_meta("t")
        assert results["save_fingerprints"] == meta and meta is not None and meta.revision == 1
        assert meta.fingerprints == fingerprints
        assert results["delete_thread"] is None and await origin.load("gone") is None
    finally:
        await store.close()
        await proxy.close()
        await origin.close()


async def test_an_unreadable_fingerprints_record_is_one_sentence_and_left_as_it_is() -> None:
    from core.errors import CorruptRecordError

    store = await new_store("badrecord")
    try:
        await store.append("t", [user_text("hi")])
        await _sql(
            store._url, "UPDATE cubepi_tui_thread_records SET fingerprints = '{\"input\": 1' WHERE thread_id = 't'"
        )
        sentence = "The fingerprints record of thread 't' cannot be read; it was left as it is."
        with pytest.raises(CorruptRecordError) as bad:
            await store.load_meta("t")
        assert str(bad.value) == sentence
        data = await store.load("t")  # the thread still loads; the record is a problem shown raw
        assert data is not None and [m.text for m in data.messages] == ["hi"] and data.meta is None  # type: ignore[union-attr]
        assert [(p.row_id, p.reason, p.raw) for p in data.problems] == [("record", sentence, '{"input": 1')]
        (kept,) = await _sql(store._url, "SELECT fingerprints FROM cubepi_tui_thread_records")
        assert kept[0] == '{"input": 1'
        assert [s.thread_id for s in await store.list_threads()] == ["t"]  # the picker does not read it
    finally:
        await store.close()
