"""SQLite-only owners and revisions: migrations, crashes between the UPDATE and the COMMIT,
compare-and-set writers in many processes, and the owner inside every query.

The contract itself (one store per owner, the same on every backend) is in
``test_contract_owners.py``; these tests need real files of earlier versions, the real
cubeloop, real processes killed with SIGKILL, or a look at the statements SQLite runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint import sqlite_schema
from core.checkpoint.base import CheckpointData, Fingerprints, Lease, StepRecord, ThreadMeta, thread_unavailable
from core.checkpoint.sqlite import MIGRATIONS, SQLiteCheckpointer
from core.checkpoint.sqlite_gate import call
from core.errors import ConflictError, ThreadNotFoundError
from core.messages import AssistantMessage, TextContent, user_text
from core.owners import UNOWNED
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.cubeloop_peer import CONTINUED, cubeloop_continue, cubeloop_load, run_completed
from tests.helpers.older_files import write_older_file
from tests.helpers.sqlite_cas_child import CRASH_KEY, OWNER, RACE_KEY, THREAD, WORKFLOW

PREVIOUS = 2
"""The schema version before owners, revisions and steps (v3; v4 gave every thread a record)."""

CHILD = [sys.executable, "-m", "tests.helpers.sqlite_cas_child"]


def plain(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with plain(path) as db:
        return db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()


def expired(_lease: Lease) -> bool:
    return True


# --- migrations ------------------------------------------------------------------------------


async def test_a_previous_version_file_is_unowned_browsed_and_upgraded(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = {
        "old-a": [user_text("first, before owners"), AssistantMessage(content=[TextContent(text="ok")], run_id="r1")],
        "old-b": [user_text("second, before owners")],
    }
    write_older_file(sqlite_path, PREVIOUS, monkeypatch, threads)
    kept = {t: rows(sqlite_path, t) for t in ("messages", "thread_extra", "runs", "cubepi_jobs", "cubepi_commands")}

    # Browsing (not upgraded yet): a named owner sees nothing, the unowned scope sees it all.
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        assert alice.needs_upgrade and alice.schema_version == PREVIOUS
        assert await alice.list_threads() == [] and await alice.load("old-a") is None
        assert await alice.get_lease("old-a") is None and await alice.list_leases() == {}
        assert await alice.job_get("old-a", "k1") is None and await alice.list_commands("old-a") == []
        assert await alice.read_live_events("old-a") == [] and await alice.load_meta("old-a") is None
        assert await alice.unowned_count() == 2
    async with await SQLiteCheckpointer.open(sqlite_path, owner=UNOWNED) as nobody:
        assert nobody.needs_upgrade
        assert {s.thread_id for s in await nobody.list_threads()} == {"old-a", "old-b"}
        data = await nobody.load("old-a")
        assert data is not None and [m.role for m in data.messages] == ["user", "assistant"]
        assert data.meta is None and data.extra_revision == 0 and data.extra == {"title": "old-a"}
        assert [r.revision for r in data.runs] == [1]
        assert await nobody.load_meta("old-a") == ThreadMeta("old-a", UNOWNED)
        assert (await nobody.job_get("old-a", "k1")).revision == 1  # type: ignore[union-attr]
        assert [c.revision for c in await nobody.list_commands("old-a")] == [1]
        assert (await nobody.get_lease("old-a")).revision == 1  # type: ignore[union-attr]
        assert [e.data["type"] for e in await nobody.read_live_events("old-a")] == ["text_delta"]

        await nobody.upgrade()
        assert nobody.schema_version == len(MIGRATIONS) and not nobody.read_only
        for table, before in kept.items():
            assert rows(sqlite_path, table)[: len(before)] == [
                (*r, 1) if table.startswith("cubepi_") else r for r in before
            ]
        with plain(sqlite_path) as db:
            assert db.execute("SELECT count(*) FROM cubepi_thread_records WHERE owner IS NOT NULL").fetchone() == (
                0,
            ), "no thread got an owner"

        # After the upgrade the unowned scope writes, with revisions from where they were.
        assert await nobody.save_extra("old-a", {"more": 1}, expected_revision=0) == 1
        (command,) = await nobody.list_commands("old-a")
        assert (await nobody.update_command(command.seq, "applied", expected_revision=1)).revision == 2
        job = await nobody.job_begin("old-a", "k1")
        assert (job.attempts, job.revision) == (2, 2)
        now = time.time()
        taken = await nobody.acquire_lease(Lease("old-a", "me", 1, "box", "r2", now, now, now + 15), is_stale=expired)
        assert taken.revision == 2
        await nobody.append("old-a", [user_text("after the upgrade")])
        assert (await nobody.load_meta("old-a")).owner == UNOWNED  # type: ignore[union-attr]
        assert await nobody.unowned_count() == 2

    # A named owner still has no such thread: reading and writing it answer as for a missing one.
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        assert not alice.read_only and await alice.list_threads() == []
        before = rows(sqlite_path, "messages")
        with pytest.raises(ThreadNotFoundError) as foreign:
            await alice.append("old-b", [user_text("not mine")])
        with pytest.raises(ThreadNotFoundError) as missing:
            await alice.delete_thread("never-written")  # a write to a missing thread would create it
        assert str(foreign.value) == str(missing.value).replace("never-written", "old-b")
        assert rows(sqlite_path, "messages") == before
        await alice.append("mine", [user_text("a thread of alice")])
        assert [s.thread_id for s in await alice.list_threads()] == ["mine"]
        assert (await alice.load_meta("mine")).owner == "alice"  # type: ignore[union-attr]
        assert await alice.unowned_count() == 2

    # The real cubeloop reads and continues the migrated file's threads, ours included.
    loaded = await cubeloop_load(sqlite_path, "old-a")
    assert [m.role for m in loaded.messages] == ["user", "assistant", "user"]
    run_id = await cubeloop_continue(sqlite_path, "old-b")
    assert run_completed(sqlite_path, "old-b", run_id)
    assert (await cubeloop_load(sqlite_path, "mine")).messages[0].role == "user"
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=UNOWNED) as nobody:
        data = await nobody.load("old-b")
        assert data is not None and data.messages[-1].text == CONTINUED  # type: ignore[union-attr]


async def test_a_cubeloop_file_is_unowned_after_the_upgrade_and_cubeloop_keeps_using_it(
    fixture_db: Path, fixture_json: dict[str, Any]
) -> None:
    ids = {t["thread_id"] for t in fixture_json["threads"]}
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner="alice") as alice:
        assert alice.needs_upgrade and await alice.list_threads() == [] and await alice.load("completed") is None
        assert await alice.unowned_count() == len(ids)
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as nobody:
        assert {s.thread_id for s in await nobody.list_threads()} == ids
        await nobody.upgrade()
        await nobody.claim_run("crash-after-user", "r-ours")
        await nobody.append("crash-after-user", [AssistantMessage(content=[TextContent(text="ours")], run_id="r-ours")])
        await nobody.mark_run_complete("crash-after-user", "r-ours")
        assert await nobody.save_extra("crash-after-user", {"seen": True}, expected_revision=0) == 1
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner="alice") as alice:
        assert await alice.list_threads() == [] and await alice.load("crash-after-user") is None
        with pytest.raises(ThreadNotFoundError):
            await alice.claim_run("completed", "r-alice")
        await alice.append("alice-thread", [user_text("mine")])

    # The real cubeloop reads what we wrote, continues it, and starts threads of its own.
    assert [m.role for m in (await cubeloop_load(fixture_db, "crash-after-user")).messages] == ["user", "assistant"]
    run_id = await cubeloop_continue(fixture_db, "crash-after-user")
    assert run_completed(fixture_db, "crash-after-user", run_id)
    new_run = await cubeloop_continue(fixture_db, "from-cubeloop", "A thread cubeloop starts.")
    assert run_completed(fixture_db, "from-cubeloop", new_run)
    assert (await cubeloop_load(fixture_db, "alice-thread")).messages[0].role == "user"

    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as nobody:
        data = await nobody.load("crash-after-user")
        assert data is not None and data.messages[-1].text == CONTINUED  # type: ignore[union-attr]
        assert [r.run_id for r in data.runs][-2:] == ["r-ours", run_id] and all(r.revision == 2 for r in data.runs[-2:])
        assert data.extra_revision == 1 and data.extra["seen"] is True
        listed = {s.thread_id for s in await nobody.list_threads()}
        assert listed == ids | {"from-cubeloop"}, "cubeloop's new thread is unowned; alice's is not listed"
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner="alice") as alice:
        assert [s.thread_id for s in await alice.list_threads()] == ["alice-thread"]
        assert await alice.load("from-cubeloop") is None


# --- a crash between the UPDATE and the COMMIT -------------------------------------------------


class Injected(RuntimeError):
    """The failure the seam raises inside the transaction."""


async def prepared(path: Path) -> tuple[StepRecord, int, dict[str, Any]]:
    """Thread ``t`` of alice with step record ``job:crash`` at step 1 and one saved extra."""
    path.parent.mkdir(exist_ok=True)
    async with await SQLiteCheckpointer.open(path, owner=OWNER) as store:
        await store.step_begin(THREAD, CRASH_KEY, input_fingerprint="f" * 64, workflow=WORKFLOW, total_steps=3)
        step = await store.step_commit(
            THREAD, CRASH_KEY, expected_revision=0, workflow=WORKFLOW, next_step=1, data={"normalized": "hello agent"}
        )
        revision = await store.save_extra(THREAD, {"kept": 1})
        data = await store.load(THREAD)
        assert data is not None
        return step, revision, data.extra


async def check_unchanged(path: Path, step: StepRecord, revision: int, extra: dict[str, Any]) -> None:
    """The earlier state, read by a fresh store; then the next writes with the old revisions apply."""
    with plain(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    async with await SQLiteCheckpointer.open(path, create=False, owner=OWNER) as store:
        assert not store.read_only and not store.needs_upgrade
        assert await store.step_get(THREAD, CRASH_KEY) == step
        data = await store.load(THREAD)
        assert data is not None and (data.extra, data.extra_revision) == (extra, revision)
        again = await store.step_commit(
            THREAD, CRASH_KEY, expected_revision=step.revision, workflow=WORKFLOW, next_step=2, data="words=2"
        )
        assert (again.revision, again.next_step, again.data) == (step.revision + 1, 2, "words=2")
        assert await store.save_extra(THREAD, {"after": 1}, expected_revision=revision) == revision + 1


@pytest.mark.parametrize("what", ["step_commit", "save_extra"])
async def test_an_exception_between_the_update_and_the_commit_leaves_the_earlier_state(
    sqlite_path: Path, what: str
) -> None:
    step, revision, extra = await prepared(sqlite_path)
    seen: list[int] = []

    def seam(name: str, c: sqlite3.Connection) -> None:
        if name == "step_commit":
            seen.append(c.execute("SELECT revision FROM cubepi_steps WHERE key = ?", (CRASH_KEY,)).fetchone()[0])
        else:
            seen.append(c.execute("SELECT extra_revision FROM cubepi_thread_records").fetchone()[0])
        raise Injected(f"injected before the commit of {name}")

    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=OWNER) as store:
        store._before_commit = seam
        with pytest.raises(Injected):
            if what == "step_commit":
                await store.step_commit(
                    THREAD, CRASH_KEY, expected_revision=step.revision, workflow=WORKFLOW, next_step=2, data="lost"
                )
            else:
                await store.save_extra(THREAD, {"lost": True}, expected_revision=revision)
        assert seen == [(step.revision if what == "step_commit" else revision) + 1], "the UPDATE ran before the seam"
        store._before_commit = None
        assert await store.step_get(THREAD, CRASH_KEY) == step, "the same store reads the earlier state"
    await check_unchanged(sqlite_path, step, revision, extra)


@pytest.mark.parametrize("what", ["step_commit", "save_extra"])
async def test_a_process_killed_between_the_update_and_the_commit_leaves_the_earlier_state(
    sqlite_path: Path, what: str
) -> None:
    step, revision, extra = await prepared(sqlite_path)
    expected = step.revision if what == "step_commit" else revision
    marks = await asyncio.to_thread(
        run_marked,
        [*CHILD, "crash", str(sqlite_path), what, str(expected)],
        f"the {what} child",
        kill_at=["before_commit"],
        cwd=str(REPO_ROOT),
    )
    assert marks == [f"inside:{expected + 1}", "before_commit"], "killed after its UPDATE, before its COMMIT"
    await check_unchanged(sqlite_path, step, revision, extra)


# --- 100 compare-and-set writers in 10 processes -----------------------------------------------

PROCESSES = 10
PER_PROCESS = 10


@pytest.mark.parametrize("kind", ["extra", "steps"])
async def test_a_hundred_writers_in_ten_processes_apply_once_or_conflict(
    sqlite_path: Path, tmp_path: Path, kind: str
) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner=OWNER) as store:
        assert await store.save_extra(THREAD, {"seed": 0}) == 1
        await store.step_begin(THREAD, RACE_KEY, input_fingerprint="f" * 64, workflow=WORKFLOW)
        await store.step_commit(THREAD, RACE_KEY, expected_revision=0, workflow=WORKFLOW, next_step=0, data=[])
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [*CHILD, "race", str(sqlite_path), kind, str(go), str(PER_PROCESS), str(n * PER_PROCESS)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            ready = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), timeout=120)
            assert ready == "MARK ready\n", child.stderr.read() if child.stderr else ready
        go.touch()
        outputs = [await asyncio.wait_for(asyncio.to_thread(child.communicate), timeout=120) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    applied: dict[int, int] = {}
    conflicts = 0
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err[-2000:]
        (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
        result = json.loads(line[len("RESULT ") :])
        applied.update({int(k): v for k, v in result["applied"].items()})
        conflicts += result["conflicts"]
    assert len(applied) + conflicts == PROCESSES * PER_PROCESS
    assert applied and conflicts, f"{len(applied)} applied, {conflicts} conflicts: the writers never raced"
    # Both records stood at revision 1 before the race.
    assert sorted(applied.values()) == list(range(2, 2 + len(applied))), "each revision given exactly once"
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=OWNER) as store:
        if kind == "extra":
            data = await store.load(THREAD)
            assert data is not None and data.extra_revision == 1 + len(applied)
            assert data.extra == {"seed": 0, **{f"w{i}": i for i in applied}}
        else:
            final = await store.step_get(THREAD, RACE_KEY)
            assert final is not None and final.revision == 1 + len(applied) and final.next_step == len(applied)
            assert final.data == sorted(applied, key=applied.__getitem__), "every applied step once, in order"


# --- the owner inside every query ----------------------------------------------------------------

THREAD_TABLES = (
    "messages",
    "thread_extra",
    "runs",
    "thread_pending_request",
    "cubepi_tool_journal",
    "cubepi_jobs",
    "cubepi_leases",
    "cubepi_live_events",
    "cubepi_commands",
    "cubepi_steps",
    "cubepi_thread_records",
)


@asynccontextmanager
async def traced(store: SQLiteCheckpointer, into: list[str]) -> AsyncIterator[None]:
    """Every statement the store's connection runs meanwhile (as SQLite expands it, with its
    values), appended to ``into``; the callback is set on the connection's own thread."""
    assert store._db is not None
    await call(store._db, lambda c: c.set_trace_callback(into.append))
    try:
        yield
    finally:
        await call(store._db, lambda c: c.set_trace_callback(None))


def reads_of_threads(statements: list[str]) -> list[str]:
    """The statements outside write transactions that read a thread table."""
    found, writing = [], False
    for sql in statements:
        head = sql.lstrip().upper()
        if head.startswith("BEGIN IMMEDIATE"):
            writing = True
        elif head.startswith(("COMMIT", "ROLLBACK")):
            writing = False
        elif not writing and head.startswith("SELECT") and any(t in sql for t in THREAD_TABLES):
            found.append(sql)
    return found


def write_transactions(statements: list[str]) -> list[list[str]]:
    """The statements of each ``BEGIN IMMEDIATE`` ... ``COMMIT``/``ROLLBACK``."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for sql in statements:
        head = sql.lstrip().upper()
        if head.startswith("BEGIN IMMEDIATE"):
            current = []
        elif head.startswith(("COMMIT", "ROLLBACK")) and current is not None:
            out.append(current)
            current = None
        elif current is not None:
            current.append(sql)
    return out


async def every_write(store: SQLiteCheckpointer, thread: str) -> None:
    """Every write of the store's API keyed by ``thread`` (refused ones are fine)."""
    now = time.time()
    for write in (
        store.append(thread, [user_text("hello")]),
        store.save_extra(thread, {"k": 1}),
        store.claim_run(thread, "r1"),
        store.mark_run_complete(thread, "r1"),
        store.save_pending_request(thread, None),
        store.record_tool_event(thread, "c1", "start", tool_name="read"),
        store.job_begin(thread, "k"),
        store.job_finish(thread, "k", "done", 1),
        store.acquire_lease(Lease(thread, "h", 1, "box", None, now, now, now + 60), is_stale=expired),
        store.renew_lease(thread, "h", now, now + 60),
        store.append_live_events(thread, None, [{"type": "x"}]),
        store.prune_live_events(thread),
        store.send_command(thread, "steer", "go"),
        store.step_begin(thread, "s", input_fingerprint="f", workflow="w"),
        store.step_commit(thread, "s", expected_revision=0, workflow="w", next_step=1, data=1),
        store.save_fingerprints(thread, Fingerprints("i", "a", {"model": "m"}), expected_revision=0),
        store.release_lease(thread, "h"),
    ):
        try:
            await write
        except ThreadNotFoundError:
            pass


WRITES = 17
"""How many writes :func:`every_write` makes."""


async def every_read(store: SQLiteCheckpointer, thread: str) -> list[Any]:
    """What every read of the store's API answers about ``thread``."""
    return [
        await store.load(thread),
        await store.load_after(thread, 0),
        await store.list_threads(),
        await store.load_journal(thread),
        await store.job_get(thread, "k"),
        await store.get_lease(thread),
        await store.list_leases(),
        await store.read_live_events(thread),
        await store.list_commands(thread),
        await store.load_meta(thread),
        await store.step_get(thread, "s"),
        await store.list_steps(thread),
    ]


_LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", re.IGNORECASE)


def shapes(statements: list[str]) -> list[str]:
    """The statements with every literal value (the bound parameters SQLite expanded) blanked."""
    return [_LITERAL.sub("?", sql) for sql in statements]


async def test_every_read_names_the_owner_and_every_write_begins_with_the_admission(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        statements: list[str] = []
        async with traced(alice, statements):
            await every_write(alice, "t")
            (command,) = await alice.list_commands("t")
            await alice.update_command(command.seq, "applied")
            await alice.delete_thread("t")
            await every_read(alice, "t")
    reads = reads_of_threads(statements)
    assert len(reads) > 15
    for sql in reads:
        assert "owner" in sql, f"a read without the owner in its query: {sql}"
    transactions = write_transactions(statements)
    assert len(transactions) == WRITES + 2
    for one in transactions[:WRITES]:  # the admission: the owner's record, or one made for a new thread
        assert one[0].startswith("SELECT 1 FROM cubepi_thread_records") and "owner" in one[0], one
    assert transactions[0][1].startswith("INSERT INTO cubepi_thread_records"), "the first write made the record"
    for one in transactions[WRITES:]:  # update_command (by seq) and delete_thread: no record to make
        assert "owner" in one[0], one


async def test_another_owners_thread_is_read_with_the_same_statements_as_a_missing_one(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        await every_write(alice, "t")
        assert all(answer for answer in (await every_read(alice, "t"))[:3])
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="bob") as bob:
        foreign: list[str] = []
        async with traced(bob, foreign):
            of_alice = await every_read(bob, "t")
        missing: list[str] = []
        async with traced(bob, missing):
            of_nobody = await every_read(bob, "u")
    empty = [None, CheckpointData(journal={}), [], {}, None, None, {}, [], [], None, None, []]
    assert of_alice == of_nobody == empty
    assert shapes(foreign) == shapes(missing), "a foreign thread is read with other statements than a missing one"


async def test_a_write_creates_the_record_in_its_own_transaction_and_a_refused_one_leaves_none(
    sqlite_path: Path,
) -> None:
    sqlite_path.parent.mkdir()
    before = time.time()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        await alice.send_command("new", "abort")
        with pytest.raises(KeyError):
            await alice.step_commit("other", "k", expected_revision=0, workflow="w", next_step=1, data=None)
        assert await alice.renew_lease("third", "h", 1.0, 2.0) is False
        await alice.release_lease("third", "h")
        await alice.prune_live_events("third")
    with plain(sqlite_path) as db:
        ((thread_id, owner, created_at),) = db.execute(
            "SELECT thread_id, owner, created_at FROM cubepi_thread_records"
        ).fetchall()
    assert (thread_id, owner) == ("new", "alice") and before <= created_at <= time.time()
    async with await SQLiteCheckpointer.open(sqlite_path, owner=UNOWNED) as nobody:
        await nobody.save_extra("unowned-new", {"k": 1})
        with pytest.raises(ThreadNotFoundError):
            await nobody.send_command("new", "abort")
    with plain(sqlite_path) as db:
        assert db.execute("SELECT owner FROM cubepi_thread_records WHERE thread_id = 'unowned-new'").fetchone() == (
            None,
        )


async def test_list_threads_runs_as_many_statements_for_fifty_threads_as_for_five(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    counts = []
    alice = await SQLiteCheckpointer.open(sqlite_path, owner="alice")
    bob = await SQLiteCheckpointer.open(sqlite_path, owner="bob")
    try:
        for n in (5, 50):
            for i in range(n):
                for store in (alice, bob):
                    await store.append(f"{store.owner}-{n}-{i}", [user_text("q"), AssistantMessage()])
                    await store.claim_run(f"{store.owner}-{n}-{i}", "r1")
            statements: list[str] = []
            async with traced(alice, statements):
                listed = await alice.list_threads()
            assert len(listed) == n + (5 if n == 50 else 0) and all(s.thread_id.startswith("alice-") for s in listed)
            counts.append(len(statements))
    finally:
        await bob.close()
        await alice.close()
    assert counts[0] == counts[1], f"statements per listing grew with the threads: {counts}"


async def test_conflict_names_the_thread_and_both_revisions(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        assert await alice.save_extra("t", {"a": 1}, expected_revision=0) == 1
        with pytest.raises(ConflictError) as error:
            await alice.save_extra("t", {"b": 2}, expected_revision=0)
        assert (error.value.thread_id, error.value.record, error.value.expected, error.value.actual) == (
            "t",
            "extra",
            0,
            1,
        )
        assert (await alice.load("t")).extra == {"a": 1}  # type: ignore[union-attr]


def test_the_previous_schema_is_the_one_before_owners() -> None:
    assert sqlite_schema.MIGRATIONS[PREVIOUS].__name__ == "_v3_owners_revisions_steps"


@asynccontextmanager
async def qa9_counted_steps(store: SQLiteCheckpointer, into: list[int]) -> AsyncIterator[None]:
    """Count the SQLite virtual-machine instructions the store's connection runs meanwhile
    (a progress handler called at every instruction): the work a query does, free of noise."""
    assert store._db is not None

    def count() -> int:
        into[0] += 1
        return 0

    await call(store._db, lambda c: c.set_progress_handler(count, 1))
    try:
        yield
    finally:
        await call(store._db, lambda c: c.set_progress_handler(None, 1))


async def test_qa9_another_owners_long_thread_loads_with_the_work_of_a_missing_one(sqlite_path: Path) -> None:
    """QA (issue 9, must have 1: "no timing ... leak"): the owner predicate is checked per
    message row after the (thread_id, id) index has walked every row of the thread, so
    loading another owner's 5,000-message thread costs ~10x a missing one's (1.16 ms vs
    0.11 ms median of 1,000 trials here): its existence and its size show in the time."""
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="alice") as alice:
        for batch in range(20):
            await alice.append("t", [user_text(f"message {batch}.{i}") for i in range(250)])
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="bob") as bob:
        await bob.load("t"), await bob.load("u")  # warm the statement cache alike
        foreign, missing = [0], [0]
        async with qa9_counted_steps(bob, foreign):
            assert await bob.load("t") is None
        async with qa9_counted_steps(bob, missing):
            assert await bob.load("u") is None
    assert foreign[0] <= 2 * missing[0], f"foreign load ran {foreign[0]} instructions, a missing one {missing[0]}"


async def test_qa9_the_listing_does_the_same_work_however_many_threads_others_have(sqlite_path: Path) -> None:
    """QA (issue 9, must have 1: "no timing or count leak in the picker"): ``list_threads``
    and ``unowned_count`` walk every owner's threads, so bob's picker takes ~77x longer
    when alice has 3,000 threads (9.5 ms vs 0.12 ms median here): the count of other
    people's threads shows in the time of one's own listing."""
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path, owner="bob") as bob:
        await bob.append("b0", [user_text("bob's")])

        async def work() -> tuple[int, int]:
            await bob.list_threads(), await bob.unowned_count()  # warm the statement cache
            listed, counted = [0], [0]
            async with qa9_counted_steps(bob, listed):
                assert [s.thread_id for s in await bob.list_threads()] == ["b0"]
            async with qa9_counted_steps(bob, counted):
                assert await bob.unowned_count() == 0
            return listed[0], counted[0]

        alone = await work()
        async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="alice") as alice:
            for i in range(500):
                await alice.append(f"a{i}", [user_text("alice's")])
        crowded = await work()
    assert crowded[0] <= 2 * alone[0], (
        f"list_threads: {crowded[0]} instructions beside 500 foreign threads, {alone[0]} alone"
    )
    assert crowded[1] <= 2 * alone[1], (
        f"unowned_count: {crowded[1]} instructions beside 500 foreign threads, {alone[1]} alone"
    )


# --- a thread of only our rows ------------------------------------------------------------------

LEFTOVER_WRITES = {
    "append": lambda s: s.append("left", [user_text("mine now?")]),
    "save_extra": lambda s: s.save_extra("left", {"title": "mine"}),
    "claim_run": lambda s: s.claim_run("left", "r9"),
    "record_tool_event": lambda s: s.record_tool_event("left", "c1", "end"),
    "job_begin": lambda s: s.job_begin("left", "k1"),
    "acquire_lease": lambda s: s.acquire_lease(
        Lease("left", "thief", 1, "box", None, time.time(), time.time(), time.time() + 60), is_stale=expired
    ),
    "append_live_events": lambda s: s.append_live_events("left", None, [{"type": "x"}]),
    "send_command": lambda s: s.send_command("left", "abort"),
    "save_fingerprints": lambda s: s.save_fingerprints("left", Fingerprints("i", "a", {}), expected_revision=0),
    "step_begin": lambda s: s.step_begin("left", "k1", input_fingerprint="f", workflow="w"),
}


@pytest.mark.parametrize("write", list(LEFTOVER_WRITES))
async def test_a_v2_thread_with_rows_only_in_our_tables_is_not_taken_by_a_named_owner(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """A v2 file's thread whose rows are all ours (a finished job, a pending command, its
    journal, an expired lease, a live event; nothing in cubeloop's tables) exists: after the
    upgrade it is the unowned scope's, and a named owner's write to it is refused with the
    sentence of a foreign thread and writes nothing, as for any unowned thread."""
    write_older_file(sqlite_path, 2, monkeypatch, {})
    now = time.time()
    with plain(sqlite_path) as db:
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "INSERT INTO cubepi_tool_journal (thread_id, tool_call_id, tool_name, started_at, ended_at)"
            " VALUES ('left', 'c1', 'read', ?, ?)",
            (now, now),
        )
        db.execute(
            "INSERT INTO cubepi_jobs (thread_id, key, status, result_json, started_at, finished_at)"
            " VALUES ('left', 'k1', 'done', '\"42\"', ?, ?)",
            (now, now),
        )
        db.execute(
            "INSERT INTO cubepi_leases VALUES ('left', 'old-holder', 1, 'box', NULL, ?, ?, ?)", (now, now, now - 1)
        )
        db.execute(
            "INSERT INTO cubepi_live_events (thread_id, data_json, at) VALUES ('left', '{\"type\":\"x\"}', ?)", (now,)
        )
        db.execute(
            "INSERT INTO cubepi_commands (thread_id, kind, text, status, created_at, updated_at)"
            " VALUES ('left', 'steer', 'go on', 'pending', ?, ?)",
            (now, now),
        )
        db.execute("COMMIT")
    async with await SQLiteCheckpointer.open(sqlite_path, owner=UNOWNED) as nobody:
        await nobody.upgrade()
        assert [c.text for c in await nobody.list_commands("left")] == ["go on"]
    tables = ("cubepi_tool_journal", "cubepi_jobs", "cubepi_leases", "cubepi_live_events", "cubepi_commands")
    kept = {t: rows(sqlite_path, t) for t in (*tables, "cubepi_steps", "messages", "thread_extra", "runs")}

    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="alice") as alice:
        with pytest.raises(ThreadNotFoundError) as refused:
            await LEFTOVER_WRITES[write](alice)
        assert str(refused.value) == str(thread_unavailable("left", "alice"))
        assert await alice.load_meta("left") is None and await alice.list_commands("left") == []
    assert {t: rows(sqlite_path, t) for t in kept} == kept, "the refused write wrote something"
    with plain(sqlite_path) as db:
        owners = db.execute("SELECT owner FROM cubepi_thread_records WHERE thread_id = 'left'").fetchall()
    assert owners in ([], [(None,)]), "the leftover thread was given an owner"
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=UNOWNED) as nobody:
        assert (await nobody.job_get("left", "k1")).status == "done"  # type: ignore[union-attr]
        assert (await nobody.load_meta("left")).owner == UNOWNED  # type: ignore[union-attr]


# --- v4: a record for every thread ----------------------------------------------------------------


async def test_a_v3_file_lists_alike_before_and_after_v4_gives_every_thread_a_record(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v3 file holds alice's thread (with its record) and one without a record (ours
    before v3, or cubeloop's). Browsed, each scope lists its own; the upgrade to v4 gives the
    unrecorded thread a record without owner and leaves alice's as it was; afterwards a
    thread cubeloop starts gets one too, so each listing still finds its own."""
    write_older_file(sqlite_path, 3, monkeypatch, {"old": [user_text("before owners")]})
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:3])
        async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="alice") as alice:
            assert alice.schema_version == 3 and not alice.read_only
            await alice.append("a1", [user_text("alice's, at v3")])
    alice_record = rows(sqlite_path, "cubepi_thread_records")
    assert [r[:2] for r in alice_record] == [("a1", "alice")]

    async def listings() -> tuple[list[str], list[str], int, int]:
        async with (
            await SQLiteCheckpointer.open(sqlite_path, create=False, owner="alice") as alice,
            await SQLiteCheckpointer.open(sqlite_path, create=False, owner=UNOWNED) as nobody,
        ):
            return (
                sorted(s.thread_id for s in await alice.list_threads()),
                sorted(s.thread_id for s in await nobody.list_threads()),
                await alice.unowned_count(),
                await nobody.unowned_count(),
            )

    assert await listings() == (["a1"], ["old"], 1, 1)  # browsed at v3
    async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner=UNOWNED) as nobody:
        assert nobody.needs_upgrade
        await nobody.upgrade()
        assert nobody.schema_version == 4
    recorded = {r[0]: r for r in rows(sqlite_path, "cubepi_thread_records")}
    assert recorded["a1"] == alice_record[0], "alice's record is unchanged"
    assert recorded["old"][1:3] == (None, None), "the unrecorded thread got a record without owner or time"
    assert await listings() == (["a1"], ["old"], 1, 1)

    run_id = await cubeloop_continue(sqlite_path, "from-cubeloop", "A thread cubeloop starts.")
    assert run_completed(sqlite_path, "from-cubeloop", run_id)
    await cubeloop_continue(sqlite_path, "a1", "cubeloop writes into alice's thread")
    recorded = {r[0]: r for r in rows(sqlite_path, "cubepi_thread_records")}
    assert recorded["from-cubeloop"][1] is None and recorded["a1"] == alice_record[0]
    assert await listings() == (["a1"], ["from-cubeloop", "old"], 2, 2)


async def test_the_unowned_scope_lists_with_the_same_work_however_many_threads_named_owners_have(
    sqlite_path: Path,
) -> None:
    """The unowned threads are found from the records' owner index too (v4), so neither the
    unowned scope's listing nor anyone's unowned count walks named owners' threads."""
    sqlite_path.parent.mkdir()
    async with (
        await SQLiteCheckpointer.open(sqlite_path, owner=UNOWNED) as nobody,
        await SQLiteCheckpointer.open(sqlite_path, create=False, owner="bob") as bob,
    ):
        await nobody.append("u0", [user_text("nobody's")])

        async def work() -> tuple[int, int]:
            await nobody.list_threads(), await bob.unowned_count()  # warm the statement caches
            listed, counted = [0], [0]
            async with qa9_counted_steps(nobody, listed):
                assert [s.thread_id for s in await nobody.list_threads()] == ["u0"]
            async with qa9_counted_steps(bob, counted):
                assert await bob.unowned_count() == 1
            return listed[0], counted[0]

        alone = await work()
        async with await SQLiteCheckpointer.open(sqlite_path, create=False, owner="alice") as alice:
            for i in range(500):
                await alice.append(f"a{i}", [user_text("alice's")])
        crowded = await work()
    assert crowded[0] <= 2 * alone[0], f"unowned listing: {crowded[0]} instructions beside 500 named, {alone[0]} alone"
    assert crowded[1] <= 2 * alone[1], f"unowned_count: {crowded[1]} instructions beside 500 named, {alone[1]} alone"
