"""The Redis store's owners, revisions and crash safety, beyond the contract suite.

* Migration: a store of our previous schema (v2, made with the previous migrations only)
  and one of CubePi's example layout written with cubeloop's own classes open browse-only;
  their threads are the unowned scope's (a named owner sees nothing of them); after the
  upgrade writes work, and cubeloop's code still reads and writes the store.
* A crash between the update and the commit. Redis has no transactions to roll back: each
  compare-and-set write is one Lua script that makes all its checks before its first write,
  and the server runs a script whole or not at all. So the crash that can happen "between
  the update and the commit" is the client failing after its checks in Python and before
  (or while) the script is sent: an exception there, and a SIGKILL of a child process there
  (the ``_before_commit`` test seam), must leave the store exactly as it was. A kill while
  the server runs the script cannot cut it in half (the server does not read the client
  while a script runs), which is what "whole or not at all" means; that part is not
  something a test can reach, so it is not pretended here. What a test can show is that
  the script's own late checks refuse a write that another writer (or another owner) made
  stale after Python's checks, and write nothing.
* The owner checked inside the listing's script, not only by the per-owner index.
* 100 concurrent compare-and-set writers, each on its own store object and connection.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator

import pytest
from cubeloop.providers.base import AssistantMessage as CubeAssistant
from cubeloop.providers.base import TextContent as CubeText
from cubeloop.providers.base import UserMessage as CubeUser

from core.checkpoint import redis_schema
from core.checkpoint.base import Fingerprints, Lease, StepRecord, ThreadMeta, thread_unavailable
from core.checkpoint.redis import RedisCheckpointer
from core.errors import ConflictError, ReadOnlyStoreError, ThreadNotFoundError
from core.messages import AssistantMessage, TextContent, user_text
from core.owners import UNOWNED
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.redis_tools import admin, example_append, example_load, example_save_extra
from tests.helpers.services import redis_prefix

pytestmark = pytest.mark.redis

WORKFLOW = "lesson-v1"


@pytest.fixture
async def place() -> AsyncIterator[tuple[str, str]]:
    async with redis_prefix("owners") as found:
        yield found


async def opened(place: tuple[str, str], owner: str) -> RedisCheckpointer:
    url, prefix = place
    return await RedisCheckpointer.open(url, prefix=prefix, owner=owner)


async def snapshot(place: tuple[str, str]) -> dict[bytes, bytes]:
    """Every key under the prefix and its value (``DUMP``), to compare before and after."""
    url, prefix = place
    async with admin(url) as client:
        return {key: await client.dump(key) async for key in client.scan_iter(match=prefix + "*", count=1000)}


# --- migration ------------------------------------------------------------------------------


async def make_v2_store(place: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    """A store as cubepi-tui of schema v2 left it: created with the previous migrations only
    and written through the unowned scope (which keeps v2's keys), then stripped of what v2
    never wrote - the thread records and the revisions inside job, lease and command JSON.
    Returns the seq of its command."""
    url, prefix = place
    now = time.time()
    with monkeypatch.context() as patched:
        patched.setattr(redis_schema, "MIGRATIONS", redis_schema.MIGRATIONS[:2])
        async with await opened(place, UNOWNED) as store:
            assert (store.schema_version, store.read_only) == (2, False)
            await store.claim_run("old", "r1")
            await store.append(
                "old",
                [
                    user_text("an old question", run_id="r1"),
                    AssistantMessage(content=[TextContent(text="an old answer")], run_id="r1"),
                ],
            )
            await store.mark_run_complete("old", "r1")
            await store.save_extra("old", {"title": "kept"})
            await store.record_tool_event("old", "c1", "start", tool_name="read")
            await store.job_begin("old", "job:1", "c1")
            lease = Lease("old", "h1", 1, "host", "r2", now, now, now + 600)
            await store.acquire_lease(lease, is_stale=lambda _held: False)
            seq = (await store.send_command("old", "steer", "go on")).seq
            await store.append("other", [user_text("another thread")])
    async with admin(url) as client:
        await client.delete(*[key async for key in client.scan_iter(match=f"{prefix}tui:rec:*")])
        for hash_key in (f"{prefix}tui:jobs:old", f"{prefix}tui:leases", f"{prefix}tui:cmds"):
            for field, raw in (await client.hgetall(hash_key)).items():
                record = json.loads(raw)
                del record["revision"]
                await client.hset(hash_key, field, json.dumps(record))
        for v3_only in ("rec", "steps", "threads:", "leases:", "owncmds"):
            assert [key async for key in client.scan_iter(match=f"{prefix}tui:{v3_only}*")] == []
        assert await client.get(f"{prefix}tui:schema") == b"2"
    return seq


async def test_a_store_of_the_previous_schema_opens_browse_only_and_its_threads_become_unowned(
    place: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = await make_v2_store(place, monkeypatch)
    async with await opened(place, "alice") as alice:
        assert (alice.needs_upgrade, alice.schema_version) == (True, 2)
        assert await alice.list_threads() == [] and await alice.load("old") is None
        assert await alice.load_meta("old") is None and await alice.get_lease("old") is None
        assert await alice.list_leases() == {} and await alice.list_commands("old") == []
        assert await alice.job_get("old", "job:1") is None and await alice.load_journal("old") == {}
        assert await alice.unowned_count() == 2
    async with await opened(place, UNOWNED) as store:
        assert (store.needs_upgrade, store.schema_version) == (True, 2)
        assert {s.thread_id for s in await store.list_threads()} == {"old", "other"}
        data = await store.load("old")
        assert data is not None and [m.text for m in data.messages] == ["an old question", "an old answer"]
        assert (data.extra, data.extra_revision, data.meta) == ({"title": "kept"}, 0, None)
        assert [(r.run_id, r.revision) for r in data.runs] == [("r1", 2)], "a completed run reads as revision 2"
        assert await store.load_meta("old") == ThreadMeta("old", UNOWNED)
        assert (await store.get_lease("old")).revision == 1  # type: ignore[union-attr]
        assert (await store.job_get("old", "job:1")).revision == 1  # type: ignore[union-attr]
        assert [(c.seq, c.revision) for c in await store.list_commands("old")] == [(seq, 1)]
        assert set(await store.load_journal("old")) == {"c1"}  # type: ignore[arg-type]
        with pytest.raises(ReadOnlyStoreError):
            await store.append("old", [user_text("refused before the upgrade")])

        await store.upgrade()
        assert (store.needs_upgrade, store.schema_version) == (False, len(redis_schema.MIGRATIONS))
        assert await store.save_extra("old", {"more": 1}, expected_revision=0) == 1
        with pytest.raises(ConflictError):
            await store.save_extra("old", {"stale": 1}, expected_revision=0)
        assert (await store.update_command(seq, "delivered", expected_revision=1)).revision == 2
        now = time.time()
        assert await store.renew_lease("old", "h1", now, now + 600)
        assert (await store.get_lease("old")).revision == 2  # type: ignore[union-attr]
        await store.append("old", [user_text("after the upgrade")])
        assert (await store.load_meta("old")).owner == UNOWNED  # type: ignore[union-attr]
    async with await opened(place, "alice") as alice:
        with pytest.raises(ThreadNotFoundError) as refused:
            await alice.append("old", [user_text("is it mine?")])
        assert str(refused.value) == str(thread_unavailable("old", "alice"))
        await alice.append("new", [user_text("alice's own")])
        assert [s.thread_id for s in await alice.list_threads()] == ["new"]
        assert (await alice.load_meta("new")).owner == "alice"  # type: ignore[union-attr]
        assert await alice.unowned_count() == 2
    async with await opened(place, UNOWNED) as store:
        assert {s.thread_id for s in await store.list_threads()} == {"old", "other"}
        data = await store.load("old")
        assert [m.text for m in data.messages][-1] == "after the upgrade"  # type: ignore[union-attr]
        assert (data.extra, data.extra_revision) == ({"title": "kept", "more": 1}, 1)  # type: ignore[union-attr]


async def test_a_v2_thread_with_keys_only_of_ours_is_not_taken_by_a_named_owner(
    place: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v2 store's thread that has only keys of ours (its journal, a finished job, an
    expired lease, live events, a pending command; no message list, extra, runs or pending
    request) exists: after the upgrade it is the unowned scope's, and each named owner's
    write to it is refused with the sentence of a foreign thread and writes nothing."""
    url, prefix = place
    now = time.time()
    with monkeypatch.context() as patched:
        patched.setattr(redis_schema, "MIGRATIONS", redis_schema.MIGRATIONS[:2])
        async with await opened(place, UNOWNED) as store:
            await store.record_tool_event("left", "c1", "end", tool_name="read", at=now)
            await store.job_begin("left", "k1", "c1")
            await store.job_finish("left", "k1", "done", 42)
            await store.acquire_lease(Lease("left", "h1", 1, "host", None, now, now, now - 1), is_stale=lambda _: True)
            await store.append_live_events("left", None, [{"type": "x"}])
            await store.send_command("left", "steer", "go on")
    async with admin(url) as client:
        await client.delete(*[key async for key in client.scan_iter(match=f"{prefix}tui:rec:*")])
    async with await opened(place, UNOWNED) as store:
        await store.upgrade()
    kept = await snapshot(place)
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
    async with await opened(place, "alice") as alice:
        for name, write in writes.items():
            with pytest.raises(ThreadNotFoundError) as refused:
                await write(alice)
            assert str(refused.value) == str(thread_unavailable("left", "alice")), name
        assert await alice.load_meta("left") is None and await alice.list_commands("left") == []
    assert await snapshot(place) == kept, "a refused write wrote something"
    async with await opened(place, UNOWNED) as store:
        assert [c.text for c in await store.list_commands("left")] == ["go on"]
        assert (await store.job_get("left", "k1")).status == "done"  # type: ignore[union-attr]


def cubeloop_thread(n: int) -> list[object]:
    return [
        CubeUser(content=[CubeText(text=f"cubeloop question {n}")], timestamp=1000.0 + n),
        CubeAssistant(content=[CubeText(text=f"cubeloop answer {n}")], stop_reason="stop", timestamp=1001.0 + n),
    ]


async def test_a_cubeloop_store_migrates_as_unowned_and_cubeloop_still_reads_and_writes_it(
    place: tuple[str, str],
) -> None:
    url, prefix = place
    async with admin(url) as client:
        for n in range(2):
            await example_append(client, prefix, f"t{n}", cubeloop_thread(n))
        await example_save_extra(client, prefix, "t0", {"title": "cubeloop's"})
    async with await opened(place, "alice") as alice:
        assert (alice.needs_upgrade, alice.schema_version) == (True, None)
        assert await alice.list_threads() == [] and await alice.load("t0") is None
        assert await alice.load_meta("t0") is None and await alice.unowned_count() == 2
    async with await opened(place, UNOWNED) as store:
        assert {s.thread_id for s in await store.list_threads()} == {"t0", "t1"}
        data = await store.load("t0")
        assert data is not None and (data.extra, data.extra_revision, data.meta) == ({"title": "cubeloop's"}, 0, None)
        assert await store.load_meta("t0") == ThreadMeta("t0", UNOWNED)
        await store.upgrade()
        assert await store.save_extra("t0", {"ours": [1, []]}, expected_revision=0) == 1
        await store.claim_run("t0", "r1")
        await store.append("t0", [user_text("from cubepi-tui", run_id="r1")])
        await store.mark_run_complete("t0", "r1")
        assert await store.unowned_count() == 2
    async with await opened(place, "alice") as alice:
        for write in (alice.append("t0", [user_text("mine?")]), alice.save_extra("t1", {"mine": True})):
            with pytest.raises(ThreadNotFoundError) as refused:
                await write
            assert "owner alice has no such thread" in str(refused.value)
        assert await alice.list_threads() == []
    async with admin(url) as client:
        messages, extra = await example_load(client, prefix, "t0")
        assert [type(m).__name__ for m in messages] == ["UserMessage", "AssistantMessage", "UserMessage"]
        assert messages[2].content[0].text == "from cubepi-tui" and messages[2].run_id == "r1"
        assert extra == {"title": "cubeloop's", "ours": [1, []]}
        await example_append(client, prefix, "t0", [CubeUser(content=[CubeText(text="cubeloop again")])])
        await example_save_extra(client, prefix, "t0", {"cubeloop_key": 2})
    async with await opened(place, UNOWNED) as store:
        data = await store.load("t0")
        assert data is not None and data.messages[-1].text == "cubeloop again"
        assert data.extra_revision == 1, "cubeloop's own save_extra keeps no revision"
        assert await store.save_extra("t0", {"after": 3}, expected_revision=1) == 2
        data = await store.load("t0")
        assert data is not None and data.extra == {
            "title": "cubeloop's",
            "ours": [1, []],
            "cubeloop_key": 2,
            "after": 3,
        }


# --- a crash between the update and the commit ------------------------------------------------


async def earlier_state(store: RedisCheckpointer, thread_id: str, what: str) -> None:
    """Revision 1 of the record ``what`` (``step``: the lesson's first step; ``extra``)."""
    await store.append(thread_id, [user_text("hello agent")])
    if what == "step":
        await store.step_begin(thread_id, "lesson", input_fingerprint="f" * 64, workflow=WORKFLOW, total_steps=2)
        await store.step_commit(
            thread_id,
            "lesson",
            expected_revision=0,
            workflow=WORKFLOW,
            next_step=1,
            data={"normalized": "hello agent"},
        )
    else:
        assert await store.save_extra(thread_id, {"normalized": "hello agent"}, expected_revision=0) == 1


async def cas_write(store: RedisCheckpointer, thread_id: str, what: str, expected: int) -> int:
    """The next compare-and-set write of ``what``; the new revision."""
    if what == "step":
        record = await store.step_commit(
            thread_id, "lesson", expected_revision=expected, workflow=WORKFLOW, next_step=2, data="words=2"
        )
        return record.revision
    return await store.save_extra(thread_id, {"words": 2}, expected_revision=expected)


async def state_of(store: RedisCheckpointer, thread_id: str, what: str) -> tuple[object, int]:
    """The record ``what`` as read back, and its revision."""
    if what == "step":
        record = await store.step_get(thread_id, "lesson")
        assert isinstance(record, StepRecord)
        return (record.next_step, record.data), record.revision
    data = await store.load(thread_id)
    assert data is not None
    return data.extra, data.extra_revision


EARLIER = {"step": ((1, {"normalized": "hello agent"}), 1), "extra": ({"normalized": "hello agent"}, 1)}


@pytest.mark.parametrize("what", ["step", "extra"])
async def test_an_exception_between_the_update_and_the_commit_leaves_the_earlier_state(
    place: tuple[str, str], what: str
) -> None:
    """The seam raises once Python's checks passed and the script is about to be sent."""
    async with await opened(place, "alice") as store:
        await earlier_state(store, "t", what)
        before = await snapshot(place)
        seen: list[str] = []

        def crash(at: str) -> None:
            seen.append(at)
            raise RuntimeError("the process failed between the update and the commit")

        store._before_commit = crash
        with pytest.raises(RuntimeError, match="between the update and the commit"):
            await cas_write(store, "t", what, expected=1)
        assert seen == [what]
        assert await snapshot(place) == before, "not one key changed"
        assert await state_of(store, "t", what) == EARLIER[what]
        store._before_commit = None
        assert await cas_write(store, "t", what, expected=1) == 2, "the old expected revision still applies"


@pytest.mark.parametrize("what", ["step", "extra"])
async def test_a_process_killed_between_the_update_and_the_commit_leaves_the_earlier_state(
    place: tuple[str, str], what: str
) -> None:
    """A child SIGKILLed at the seam (after every check made in Python, before the script)."""
    url, prefix = place
    async with await opened(place, "alice") as store:
        await earlier_state(store, "t", what)
    before = await snapshot(place)
    argv = [sys.executable, "-m", "tests.helpers.redis_commit_child", url, prefix, "alice", "t", what, "1"]
    marks = await asyncio.to_thread(run_marked, argv, f"the {what} writer", kill_at=["commit"], cwd=str(REPO_ROOT))
    assert marks == ["commit"]
    assert await snapshot(place) == before, "the killed write left nothing"
    async with await opened(place, "alice") as store:
        assert not store.read_only
        assert await state_of(store, "t", what) == EARLIER[what]
        assert await cas_write(store, "t", what, expected=1) == 2


@pytest.mark.parametrize("what", ["step", "extra"])
async def test_a_write_made_stale_after_the_checks_in_python_is_refused_by_the_script(
    place: tuple[str, str], what: str
) -> None:
    """Another store object commits revision 2 at the seam, after this write's Python side
    saw revision 1: the script's own revision check refuses it, and it writes nothing. (The
    other extra write saves what is already there, so the extra's text stays the same and
    only the revision tells the two apart.)"""
    first, second = await opened(place, "alice"), await opened(place, "alice")
    try:
        await earlier_state(first, "t", what)
        after_other: list[dict[bytes, bytes]] = []

        async def other_writer_first(_at: str) -> None:
            if what == "extra":
                assert await second.save_extra("t", {"normalized": "hello agent"}, expected_revision=1) == 2
            else:
                assert await cas_write(second, "t", what, expected=1) == 2
            after_other.append(await snapshot(place))

        first._before_commit = other_writer_first
        with pytest.raises(ConflictError) as conflict:
            await cas_write(first, "t", what, expected=1)
        assert (conflict.value.thread_id, conflict.value.expected, conflict.value.actual) == ("t", 1, 2)
        assert await snapshot(place) == after_other[0], "the refused script wrote nothing"
    finally:
        await first.close()
        await second.close()


async def test_another_owner_making_the_thread_after_the_checks_in_python_is_refused_by_the_script(
    place: tuple[str, str],
) -> None:
    """alice's ``save_extra`` read a thread that did not exist; bob makes it at the seam: the
    owner check inside alice's script refuses, and bob's thread is exactly as bob left it."""
    alice, bob = await opened(place, "alice"), await opened(place, "bob")
    try:
        after_bob: list[dict[bytes, bytes]] = []

        async def bob_first(_at: str) -> None:
            await bob.append("t", [user_text("bob's")])
            after_bob.append(await snapshot(place))

        alice._before_commit = bob_first
        with pytest.raises(ThreadNotFoundError) as refused:
            await alice.save_extra("t", {"alice": True})
        assert str(refused.value) == str(thread_unavailable("t", "alice"))
        assert await snapshot(place) == after_bob[0]
        data = await bob.load("t")
        assert data is not None and (data.extra, data.meta.owner) == ({}, "bob")  # type: ignore[union-attr]
    finally:
        await alice.close()
        await bob.close()


async def test_a_listing_leaves_out_a_thread_that_became_another_owners_after_the_index_was_read(
    place: tuple[str, str],
) -> None:
    """alice's listing read her index; before its script runs, "t" is deleted and made again
    by bob: the script's own owner check leaves it out (the index alone would show bob's)."""
    alice, bob = await opened(place, "alice"), await opened(place, "bob")
    try:
        await alice.append("t", [user_text("alice's")])
        await alice.append("u", [user_text("alice's other")])
        chunk = alice._scripts["LIST_CHUNK"]

        async def interleaved(**kwargs: object) -> object:
            await alice.delete_thread("t")
            await bob.append("t", [user_text("bob's secret")])
            return await chunk(**kwargs)

        alice._scripts["LIST_CHUNK"] = interleaved  # type: ignore[assignment]
        listed = await alice.list_threads()
        assert [(s.thread_id, s.first_prompt) for s in listed] == [("u", "alice's other")]
        assert [s.thread_id for s in await bob.list_threads()] == ["t"]
    finally:
        await alice.close()
        await bob.close()


# --- concurrent compare-and-set writers -------------------------------------------------------


@pytest.mark.parametrize("what", ["extra", "step"])
async def test_a_hundred_concurrent_compare_and_set_writers_each_apply_once_or_conflict(
    place: tuple[str, str], what: str
) -> None:
    """100 store objects (each its own connection pool) read the revision and write once
    with it as the expected revision, at random moments within 50 ms."""
    stores = [await opened(place, "alice") for _ in range(100)]
    try:
        await stores[0].append("t", [user_text("hello agent")])
        if what == "step":
            await stores[0].step_begin("t", "lesson", input_fingerprint="f" * 64, workflow=WORKFLOW)
        applied: list[tuple[int, int]] = []
        conflicts: list[int] = []
        rng = random.Random(9)
        delays = [rng.random() * 0.05 for _ in stores]

        async def writer(i: int) -> None:
            store = stores[i]
            await asyncio.sleep(delays[i])
            seen = await read_revision(store, what)
            try:
                if what == "step":
                    new = (
                        await store.step_commit(
                            "t", "lesson", expected_revision=seen, workflow=WORKFLOW, next_step=seen + 1, data={"by": i}
                        )
                    ).revision
                else:
                    new = await store.save_extra("t", {f"w{i}": i}, expected_revision=seen)
            except ConflictError as error:
                assert (error.thread_id, error.expected) == ("t", seen) and error.actual != seen
                conflicts.append(i)
            else:
                assert new == seen + 1
                applied.append((i, new))

        await asyncio.gather(*(writer(i) for i in range(100)))
        assert len(applied) + len(conflicts) == 100 and applied
        assert sorted(new for _, new in applied) == list(range(1, len(applied) + 1)), "each revision applied once"
        final = await read_revision(stores[0], what)
        assert final == len(applied)
        last_writer = max(applied, key=lambda pair: pair[1])[0]
        if what == "step":
            record = await stores[0].step_get("t", "lesson")
            assert record is not None and (record.next_step, record.data) == (final, {"by": last_writer})
        else:
            data = await stores[0].load("t")
            assert data is not None and data.extra == {f"w{i}": i for i, _ in applied}
    finally:
        for store in stores:
            await store.close()


async def read_revision(store: RedisCheckpointer, what: str) -> int:
    if what == "step":
        record = await store.step_get("t", "lesson")
        assert record is not None
        return record.revision
    data = await store.load("t")
    assert data is not None
    return data.extra_revision
