"""The contract of owners, revisions, fingerprints, tool steps and deletion, on every backend.

Each test takes the parametrized ``checkpointer`` fixture (opened for owner ``"alice"``) and,
where a second owner or a second store object is needed, ``reopen(owner)`` (another store
object on the same data; ``tests/conftest.py``). The rules are in
``core/checkpoint/capabilities.py`` (``OwnerScoped``, ``CheckedExtra``, ``ThreadRecords``,
``ToolSteps``, ``ThreadDeletion``) and the records and sentences in ``core/checkpoint/base.py``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from core.checkpoint.base import (
    FingerprintOverride,
    Fingerprints,
    Lease,
    StepRecord,
    input_conflict,
    revision_conflict,
    thread_unavailable,
)
from core.errors import ConflictError, RunAlreadyClaimedError, ThreadNotFoundError
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.owners import UNOWNED

Reopen = Callable[[str], Awaitable[Any]]

ALICE = "alice"
"""The owner the ``checkpointer`` fixture is opened for."""


def reply(text: str, *, run_id: str | None = None, calls: tuple[str, ...] = ()) -> AssistantMessage:
    blocks = [TextContent(text=text), *(ToolCall(id=c, name="read", arguments={"path": c}) for c in calls)]
    return AssistantMessage(content=blocks, stop_reason="tool_use" if calls else "stop", run_id=run_id)


def dumps(messages: object) -> list[dict]:
    return [m.model_dump(mode="json") for m in messages]  # type: ignore[attr-defined]


def lease_for(holder: str, thread: str, *, ttl: float = 60.0, now: float | None = None) -> Lease:
    at = time.time() if now is None else now
    return Lease(
        thread, holder, pid=4242, host="box", run_id="r1", acquired_at=at, heartbeat_at=at, expires_at=at + ttl
    )


def fingerprints(model: str = "model-a", workflow: str | None = "v1") -> Fingerprints:
    return Fingerprints(
        input=hashlib.sha256(b"first input").hexdigest(),
        agent=hashlib.sha256(model.encode()).hexdigest(),
        parts={"model": model, "system_prompt": "ab" * 32, "tool:read": "cd" * 32},
        workflow=workflow,
    )


STEP_KEY = "job:s1"
STEP_INPUT = hashlib.sha256(b'{"path": "big.csv"}').hexdigest()
STEP_WORKFLOW = "import-v1"


async def reads(store: Any, thread_id: str) -> dict[str, Any]:
    """Every read of the contract about ``thread_id``, as comparable values."""
    data = await store.load(thread_id)
    after = await store.load_after(thread_id, 0)
    return {
        "load": None
        if data is None
        else (
            dumps(data.messages),
            data.message_ids,
            data.extra,
            data.extra_revision,
            data.runs,
            data.journal,
            data.pending_request,
            data.meta,
            data.problems,
        ),
        "load_after": (
            dumps(after.messages),
            after.message_ids,
            after.extra,
            after.extra_revision,
            after.runs,
            after.journal,
            after.meta,
        ),
        "journal": await store.load_journal(thread_id),
        "job": await store.job_get(thread_id, "k"),
        "lease": await store.get_lease(thread_id),
        "events": await store.read_live_events(thread_id),
        "commands": await store.list_commands(thread_id),
        "meta": await store.load_meta(thread_id),
        "step": await store.step_get(thread_id, STEP_KEY),
        "steps": await store.list_steps(thread_id),
        "listed": [s for s in await store.list_threads() if s.thread_id == thread_id],
        "leased": (await store.list_leases()).get(thread_id),
    }


@dataclass
class Written:
    """What :func:`write_everything` wrote, to aim later writes at the right revisions."""

    holder_id: str
    command_seq: int
    extra_revision: int
    meta_revision: int
    step_revision: int


async def write_everything(store: Any, thread_id: str, holder_id: str) -> Written:
    """Give ``thread_id`` one of every record: messages, extra, a run, the journal, a job, a
    live lease, live events, a command, fingerprints and a committed step."""
    await store.acquire_lease(lease_for(holder_id, thread_id), is_stale=lambda _: False)
    await store.claim_run(thread_id, "r1", holder_id=holder_id)
    await store.append(
        thread_id, [user_text("go", run_id="r1"), reply("on it", run_id="r1", calls=("c1",))], holder_id=holder_id
    )
    extra_revision = await store.save_extra(thread_id, {"title": "mine"})
    await store.record_tool_event(thread_id, "c1", "start", tool_name="read", run_id="r1", at=1.0, holder_id=holder_id)
    await store.job_begin(thread_id, "k", "c1", holder_id=holder_id)
    await store.append_live_events(thread_id, "r1", [{"type": "text_delta", "text": "on it"}])
    command = await store.send_command(thread_id, "steer", "look left")
    meta = await store.save_fingerprints(thread_id, fingerprints(), expected_revision=0)
    step = await store.step_begin(
        thread_id, STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW, total_steps=3, holder_id=holder_id
    )
    step = await store.step_commit(
        thread_id,
        STEP_KEY,
        expected_revision=step.revision,
        workflow=STEP_WORKFLOW,
        next_step=1,
        data={"rows": 10},
        holder_id=holder_id,
    )
    return Written(holder_id, command.seq, extra_revision, meta.revision, step.revision)


def foreign_writes(store: Any, thread_id: str, bob: Written) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every write of the contract aimed at ``thread_id`` (another owner's, written by
    :func:`write_everything`), with the right revisions and ids, so only the owner can refuse it."""
    now = time.time()
    return {
        "append": lambda: store.append(thread_id, [user_text("mine now?")]),
        "append_fenced": lambda: store.append(thread_id, [user_text("mine now?")], holder_id=bob.holder_id),
        "save_extra": lambda: store.save_extra(thread_id, {"title": "stolen"}),
        "save_extra_checked": lambda: store.save_extra(
            thread_id, {"title": "stolen"}, expected_revision=bob.extra_revision
        ),
        "save_pending_request": lambda: store.save_pending_request(thread_id, '{"payload": {}}'),
        "claim_run": lambda: store.claim_run(thread_id, "r9"),
        "mark_run_complete": lambda: store.mark_run_complete(thread_id, "r1"),
        "record_tool_event": lambda: store.record_tool_event(thread_id, "c1", "end"),
        "job_begin": lambda: store.job_begin(thread_id, "k"),
        "job_finish": lambda: store.job_finish(thread_id, "k", "done", {"stolen": True}),
        "acquire_lease": lambda: store.acquire_lease(lease_for("thief", thread_id), is_stale=lambda _: True),
        "renew_lease": lambda: store.renew_lease(thread_id, bob.holder_id, now, now + 600),
        "release_lease": lambda: store.release_lease(thread_id, bob.holder_id),
        "append_live_events": lambda: store.append_live_events(thread_id, None, [{"type": "x"}]),
        "prune_live_events": lambda: store.prune_live_events(thread_id),
        "send_command": lambda: store.send_command(thread_id, "abort"),
        "save_fingerprints": lambda: store.save_fingerprints(
            thread_id, fingerprints("model-b"), expected_revision=bob.meta_revision
        ),
        "step_begin": lambda: store.step_begin(
            thread_id, STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW
        ),
        "step_commit": lambda: store.step_commit(
            thread_id,
            STEP_KEY,
            expected_revision=bob.step_revision,
            workflow=STEP_WORKFLOW,
            next_step=2,
            data={"rows": 20},
        ),
        "delete_thread": lambda: store.delete_thread(thread_id),
    }


FOREIGN_WRITES = list(foreign_writes(None, "", Written("", 0, 0, 0, 0)))

NEEDS_EXISTENCE = {"delete_thread"}
"""Writes whose answer for a missing thread is the same ``ThreadNotFoundError``."""


# --- owner A and owner B on one store ---------------------------------------------------------


async def test_another_owners_thread_reads_exactly_like_a_never_written_one(checkpointer: Any, reopen: Reopen) -> None:
    alice, bob = checkpointer, await reopen("bob")
    await alice.append("a", [user_text("alice's own")])
    alice_list, alice_leases = await alice.list_threads(), await alice.list_leases()
    await write_everything(bob, "b", "bob-holder")

    seen_by_bob = await reads(bob, "b")
    assert all(seen_by_bob.values()), {k: v for k, v in seen_by_bob.items() if not v}  # bob has one of each
    assert seen_by_bob["meta"].owner == "bob"
    assert await reads(alice, "b") == await reads(alice, "never-written")
    assert await alice.load("b") is None and await alice.load_meta("b") is None
    assert await alice.list_threads() == alice_list
    assert await alice.list_leases() == alice_leases
    assert [s.thread_id for s in await bob.list_threads()] == ["b"]
    assert await alice.unowned_count() == 0 and await bob.unowned_count() == 0


@pytest.mark.parametrize("write", FOREIGN_WRITES)
async def test_every_write_to_another_owners_thread_is_refused_and_writes_nothing(
    checkpointer: Any, reopen: Reopen, write: str
) -> None:
    alice, bob = checkpointer, await reopen("bob")
    written = await write_everything(bob, "b", "bob-holder")
    before = await reads(bob, "b")
    with pytest.raises(ThreadNotFoundError) as error:
        await foreign_writes(alice, "b", written)[write]()
    assert str(error.value) == str(thread_unavailable("b", ALICE))
    assert await reads(bob, "b") == before, "a refused write changed the owner's thread"
    assert await reads(alice, "b") == await reads(alice, "never-written")
    if write in NEEDS_EXISTENCE:
        # The same thread id once it is gone: the same error, word for word.
        await bob.release_lease("b", written.holder_id)
        await bob.delete_thread("b")
        with pytest.raises(ThreadNotFoundError) as missing:
            await foreign_writes(alice, "b", written)[write]()
        assert str(missing.value) == str(error.value)


async def test_another_owners_command_is_an_unknown_command(checkpointer: Any, reopen: Reopen) -> None:
    alice, bob = checkpointer, await reopen("bob")
    written = await write_everything(bob, "b", "bob-holder")
    before = await bob.list_commands("b")
    with pytest.raises(KeyError) as foreign:
        await alice.update_command(written.command_seq, "discarded", "not yours")
    with pytest.raises(KeyError) as foreign_checked:
        await alice.update_command(written.command_seq, "discarded", expected_revision=1)
    with pytest.raises(KeyError) as foreign_edit:
        await alice.edit_command(written.command_seq, "not yours", expected_revision=1)
    assert await bob.list_commands("b") == before
    await bob.release_lease("b", written.holder_id)
    await bob.delete_thread("b")
    with pytest.raises(KeyError) as missing:
        await alice.update_command(written.command_seq, "discarded", "not yours")
    assert str(foreign.value) == str(foreign_checked.value) == str(foreign_edit.value) == str(missing.value)


CREATING_WRITES: dict[str, Callable[[Any, str], Awaitable[Any]]] = {
    "append": lambda s, t: s.append(t, [user_text("hi")]),
    "save_extra": lambda s, t: s.save_extra(t, {"a": 1}),
    "save_pending_request": lambda s, t: s.save_pending_request(t, '{"payload": {}}'),
    "claim_run": lambda s, t: s.claim_run(t, "r1"),
    "record_tool_event": lambda s, t: s.record_tool_event(t, "c1", "start"),
    "job_begin": lambda s, t: s.job_begin(t, "k"),
    "acquire_lease": lambda s, t: s.acquire_lease(lease_for("h", t), is_stale=lambda _: False),
    "append_live_events": lambda s, t: s.append_live_events(t, None, [{"type": "x"}]),
    "send_command": lambda s, t: s.send_command(t, "abort"),
    "save_fingerprints": lambda s, t: s.save_fingerprints(t, fingerprints(), expected_revision=0),
    "step_begin": lambda s, t: s.step_begin(t, "k", input_fingerprint="f", workflow="w"),
}


@pytest.mark.parametrize("write", list(CREATING_WRITES))
async def test_a_write_to_a_missing_thread_creates_it_owned_by_the_writer(
    checkpointer: Any, reopen: Reopen, write: str
) -> None:
    alice, bob = checkpointer, await reopen("bob")
    assert await alice.load_meta("new") is None
    await CREATING_WRITES[write](alice, "new")
    meta = await alice.load_meta("new")
    assert meta is not None and (meta.thread_id, meta.owner) == ("new", ALICE)
    assert await bob.load_meta("new") is None
    with pytest.raises(ThreadNotFoundError) as error:
        await CREATING_WRITES[write](bob, "new")
    assert str(error.value) == str(thread_unavailable("new", "bob"))
    assert (await alice.load_meta("new")).owner == ALICE


# --- the unowned scope --------------------------------------------------------------------------


async def test_the_unowned_scope_is_an_owner_of_its_own(checkpointer: Any, reopen: Reopen) -> None:
    alice, unowned, bob = checkpointer, await reopen(UNOWNED), await reopen("bob")
    assert unowned.owner == UNOWNED and alice.owner == ALICE
    assert await alice.unowned_count() == 0
    await unowned.append("old", [user_text("written before owners")])
    await unowned.save_extra("old", {"title": "legacy"})
    meta = await unowned.load_meta("old")
    assert meta is not None and meta.owner == UNOWNED
    assert (await unowned.load("old")).meta.owner == UNOWNED
    await alice.append("a", [user_text("alice's")])
    await bob.append("b", [user_text("bob's")])

    assert await alice.load("old") is None and await alice.load_meta("old") is None
    assert "old" not in {s.thread_id for s in await alice.list_threads()}
    with pytest.raises(ThreadNotFoundError) as named:
        await alice.append("old", [user_text("adopting it")])
    assert str(named.value) == str(thread_unavailable("old", ALICE))
    with pytest.raises(ThreadNotFoundError) as scoped:
        await unowned.append("a", [user_text("into alice's")])
    assert str(scoped.value) == str(thread_unavailable("a", UNOWNED))
    assert "unowned" in str(scoped.value)
    assert [s.thread_id for s in await unowned.list_threads()] == ["old"]
    assert [m.text for m in (await unowned.load("old")).messages] == ["written before owners"]
    for store in (alice, bob, unowned):
        assert await store.unowned_count() == 1, store.owner
    await unowned.append("older", [user_text("another")])
    assert await alice.unowned_count() == 2


OUR_RECORDS_ONLY = (
    "record_tool_event",
    "job_begin",
    "acquire_lease",
    "append_live_events",
    "send_command",
    "step_begin",
)
"""Creating writes that give a thread rows of ours only (none of cubeloop's)."""


@pytest.mark.parametrize("write", OUR_RECORDS_ONLY)
async def test_an_unowned_thread_of_our_records_only_is_no_named_owners_to_take(
    checkpointer: Any, reopen: Reopen, write: str
) -> None:
    alice, unowned = checkpointer, await reopen(UNOWNED)
    await CREATING_WRITES[write](unowned, "ours")
    assert (await unowned.load_meta("ours")).owner == UNOWNED
    for attempt in ("append", "send_command", write):
        with pytest.raises(ThreadNotFoundError) as refused:
            await CREATING_WRITES[attempt](alice, "ours")
        assert str(refused.value) == str(thread_unavailable("ours", ALICE))
    assert await alice.load_meta("ours") is None
    assert (await unowned.load_meta("ours")).owner == UNOWNED


# --- revisions --------------------------------------------------------------------------------


async def test_extra_revision_counts_saves_and_a_stale_writer_writes_nothing(checkpointer: Any) -> None:
    store = checkpointer
    assert await store.save_extra("t", {"a": 1}) == 1
    assert (await store.load("t")).extra_revision == 1
    assert await store.save_extra("t", {"b": 2}) == 2
    assert (await store.load("t")).extra_revision == 2
    assert await store.save_extra("t", {"c": 3}, expected_revision=2) == 3
    with pytest.raises(ConflictError) as error:
        await store.save_extra("t", {"late": True}, expected_revision=2)
    assert (error.value.thread_id, error.value.record, error.value.expected, error.value.actual) == ("t", "extra", 2, 3)
    assert str(error.value) == str(revision_conflict("t", "extra", 2, 3))
    data = await store.load("t")
    assert (data.extra, data.extra_revision) == ({"a": 1, "b": 2, "c": 3}, 3)


async def test_extra_expected_revision_zero_means_never_saved(checkpointer: Any) -> None:
    store = checkpointer
    with pytest.raises(ConflictError) as error:
        await store.save_extra("new", {"a": 1}, expected_revision=4)
    assert (error.value.expected, error.value.actual) == (4, 0)
    assert await store.load("new") is None and await store.load_meta("new") is None, "a refused write creates nothing"
    assert await store.save_extra("new", {"a": 1}, expected_revision=0) == 1
    with pytest.raises(ConflictError):
        await store.save_extra("new", {"a": 2}, expected_revision=0)
    assert (await store.load("new")).extra == {"a": 1}


async def test_command_revision_rises_per_update_and_is_compared(checkpointer: Any) -> None:
    store = checkpointer
    sent = await store.send_command("t", "steer", "go left")
    assert sent.revision == 1
    delivered = await store.update_command(sent.seq, "delivered")
    assert delivered.revision == 2
    again = await store.update_command(sent.seq, "delivered", expected_revision=2)
    assert again.revision == 3
    with pytest.raises(ConflictError) as error:
        await store.update_command(sent.seq, "applied", expected_revision=2)
    record = f"command {sent.seq}"
    assert (error.value.thread_id, error.value.record, error.value.expected, error.value.actual) == ("t", record, 2, 3)
    assert str(error.value) == str(revision_conflict("t", record, 2, 3))
    assert await store.list_commands("t") == [again], "a stale update changes nothing"
    applied = await store.update_command(sent.seq, "applied", expected_revision=3)
    assert (applied.status, applied.revision) == ("applied", 4)


async def test_run_revision_is_one_when_claimed_and_two_when_completed(checkpointer: Any) -> None:
    store = checkpointer
    await store.claim_run("t", "r1")
    assert [r.revision for r in (await store.load("t")).runs] == [1]
    await store.mark_run_complete("t", "r1")
    await store.mark_run_complete("t", "r1")  # idempotent: no second write
    (run,) = (await store.load("t")).runs
    assert (run.completed, run.revision) == (True, 2)


async def test_lease_revision_rises_on_every_write_of_the_row(checkpointer: Any) -> None:
    store = checkpointer
    now = time.time()
    first = await store.acquire_lease(lease_for("me", "t"), is_stale=lambda _: False)
    assert first.revision == 1
    assert await store.renew_lease("t", "me", now + 1, now + 61) is True
    assert (await store.get_lease("t")).revision == 2
    assert await store.renew_lease("t", "me", now + 2, now + 62) is True
    got = await store.get_lease("t")
    assert (got.revision, got.heartbeat_at, got.expires_at) == (3, now + 2, now + 62)
    assert await store.renew_lease("t", "someone else", now + 3, now + 63) is False
    assert (await store.get_lease("t")).revision == 3, "a refused renew writes nothing"
    taken = await store.acquire_lease(lease_for("next", "t"), is_stale=lambda _: True)
    assert taken.revision == 4 and (await store.get_lease("t")) == taken
    await store.release_lease("t", "next")
    assert (await store.acquire_lease(lease_for("fresh", "t"), is_stale=lambda _: False)).revision == 1


async def test_job_revision_rises_on_begin_and_finish(checkpointer: Any) -> None:
    store = checkpointer
    assert (await store.job_begin("t", "k")).revision == 1
    assert (await store.job_begin("t", "k")).revision == 2
    await store.job_finish("t", "k", "done", {"ok": True})
    done = await store.job_get("t", "k")
    assert (done.status, done.revision) == ("done", 3)
    assert await store.job_begin("t", "k") == done, "a done job is returned unchanged"
    await store.job_finish("t", "k", "failed", "late")
    assert (await store.job_get("t", "k")).revision == 3


# --- fingerprints -----------------------------------------------------------------------------


async def test_fingerprints_are_compare_and_set_and_overrides_are_kept(checkpointer: Any) -> None:
    store = checkpointer
    await store.append("t", [user_text("first input")])
    first = await store.save_fingerprints("t", fingerprints(), expected_revision=0)
    assert (first.thread_id, first.owner, first.revision, first.fingerprints, first.overrides) == (
        "t",
        ALICE,
        1,
        fingerprints(),
        (),
    )
    assert await store.load_meta("t") == first
    assert (await store.load("t")).meta == first

    override = FingerprintOverride(at=1_700_000_000.5, owner=ALICE, changes=("model: model-a -> model-b",))
    second = await store.save_fingerprints("t", fingerprints("model-b"), expected_revision=1, override=override)
    assert (second.revision, second.fingerprints, second.overrides) == (2, fingerprints("model-b"), (override,))
    assert second.created_at == first.created_at

    with pytest.raises(ConflictError) as error:
        await store.save_fingerprints("t", fingerprints("model-c"), expected_revision=1, override=override)
    assert (error.value.record, error.value.expected, error.value.actual) == ("fingerprints", 1, 2)
    assert str(error.value) == str(revision_conflict("t", "fingerprints", 1, 2))
    assert await store.load_meta("t") == second, "a stale writer writes nothing"
    assert (await store.load("t")).meta == second


async def test_fingerprints_of_a_new_thread_expect_revision_zero(checkpointer: Any) -> None:
    store = checkpointer
    with pytest.raises(ConflictError) as error:
        await store.save_fingerprints("new", fingerprints(), expected_revision=1)
    assert (error.value.expected, error.value.actual) == (1, 0)
    assert await store.load_meta("new") is None, "a refused write creates nothing"
    meta = await store.save_fingerprints("new", fingerprints(workflow=None), expected_revision=0)
    assert meta.revision == 1 and meta.fingerprints.workflow is None
    meta.fingerprints.parts["model"] = "changed after saving"
    assert (await store.load_meta("new")).fingerprints == fingerprints(workflow=None), "copies out"


# --- tool steps -------------------------------------------------------------------------------


async def test_step_begin_creates_once_and_refuses_another_input_or_workflow(checkpointer: Any) -> None:
    store = checkpointer
    before = time.time()
    first = await store.step_begin(
        "t", STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW, total_steps=8, tool_call_id="c1"
    )
    assert isinstance(first, StepRecord)
    assert (first.thread_id, first.key, first.input_fingerprint, first.workflow) == (
        "t",
        STEP_KEY,
        STEP_INPUT,
        STEP_WORKFLOW,
    )
    assert (first.next_step, first.revision, first.data, first.total_steps, first.tool_call_id) == (0, 0, None, 8, "c1")
    assert before - 2 <= first.updated_at <= time.time() + 2
    again = await store.step_begin("t", STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW)
    assert again == first
    for other in (
        {"input_fingerprint": "0" * 64, "workflow": STEP_WORKFLOW},
        {"input_fingerprint": STEP_INPUT, "workflow": "import-v2"},
    ):
        with pytest.raises(ConflictError) as error:
            await store.step_begin("t", STEP_KEY, **other)
        assert (error.value.thread_id, error.value.record) == ("t", f"step {STEP_KEY}")
        assert str(error.value) == str(input_conflict("t", f"step {STEP_KEY}"))
    assert await store.step_get("t", STEP_KEY) == first
    assert await store.step_get("t", "job:never") is None


async def test_step_commit_is_compare_and_set_and_round_trips_json(checkpointer: Any) -> None:
    store = checkpointer
    begun = await store.step_begin("t", STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW, total_steps=3)
    data = {"rows": [1, {"nested": ["ünïcødé ✓", None, True, 2.5]}], "empty": {}, "big": 2**60}
    one = await store.step_commit(
        "t", STEP_KEY, expected_revision=begun.revision, workflow=STEP_WORKFLOW, next_step=1, data=data
    )
    assert (one.next_step, one.revision, one.data) == (1, 1, data)
    assert one.updated_at >= begun.updated_at
    assert await store.step_get("t", STEP_KEY) == one

    with pytest.raises(ConflictError) as stale:
        await store.step_commit("t", STEP_KEY, expected_revision=0, workflow=STEP_WORKFLOW, next_step=2, data="late")
    record = f"step {STEP_KEY}"
    assert (stale.value.thread_id, stale.value.record, stale.value.expected, stale.value.actual) == ("t", record, 0, 1)
    assert str(stale.value) == str(revision_conflict("t", record, 0, 1))
    with pytest.raises(ConflictError) as other_workflow:
        await store.step_commit("t", STEP_KEY, expected_revision=1, workflow="import-v2", next_step=2, data="other")
    assert str(other_workflow.value) == str(input_conflict("t", record))
    with pytest.raises(TypeError):
        await store.step_commit(
            "t", STEP_KEY, expected_revision=1, workflow=STEP_WORKFLOW, next_step=2, data={"when": object()}
        )
    assert await store.step_get("t", STEP_KEY) == one, "refused commits change nothing"

    two = await store.step_commit("t", STEP_KEY, expected_revision=1, workflow=STEP_WORKFLOW, next_step=2, data="x")
    assert (two.next_step, two.revision, two.data) == (2, 2, "x")
    two_copy = await store.step_get("t", STEP_KEY)
    assert two_copy == two


async def test_step_commit_of_a_never_begun_key_raises_key_error(checkpointer: Any) -> None:
    store = checkpointer
    await store.step_begin("t", STEP_KEY, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW)
    with pytest.raises(KeyError):
        await store.step_commit("t", "job:never", expected_revision=0, workflow=STEP_WORKFLOW, next_step=1, data=1)
    with pytest.raises(KeyError):
        await store.step_commit("nobody", STEP_KEY, expected_revision=0, workflow=STEP_WORKFLOW, next_step=1, data=1)
    assert await store.step_get("t", "job:never") is None and await store.step_get("nobody", STEP_KEY) is None
    assert await store.load_meta("nobody") is None, "a refused commit creates nothing"


async def test_steps_are_listed_by_key_and_copied_out(checkpointer: Any) -> None:
    store = checkpointer
    for key in ("job:b", "job:a"):
        begun = await store.step_begin("t", key, input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW)
        await store.step_commit(
            "t", key, expected_revision=begun.revision, workflow=STEP_WORKFLOW, next_step=1, data={"items": [key]}
        )
    await store.step_begin("u", "job:c", input_fingerprint=STEP_INPUT, workflow=STEP_WORKFLOW)
    listed = await store.list_steps("t")
    assert [(s.key, s.data) for s in listed] == [("job:a", {"items": ["job:a"]}), ("job:b", {"items": ["job:b"]})]
    listed[0].data["items"].append("changed")
    (await store.step_get("t", "job:a")).data["items"].append("changed")
    assert (await store.step_get("t", "job:a")).data == {"items": ["job:a"]}
    assert [s.key for s in await store.list_steps("u")] == ["job:c"]
    assert await store.list_steps("nobody") == []


# --- delete_thread --------------------------------------------------------------------------


async def test_delete_thread_removes_everything_of_that_thread_only(checkpointer: Any) -> None:
    store = checkpointer
    written = await write_everything(store, "t", "me")
    await write_everything(store, "other", "me-too")
    other_before = await reads(store, "other")
    await store.release_lease("t", written.holder_id)
    await store.delete_thread("t")
    assert await reads(store, "t") == await reads(store, "never-written")
    assert await store.load("t") is None and await store.load_meta("t") is None
    assert await reads(store, "other") == other_before
    assert [s.thread_id for s in await store.list_threads()] == ["other"]
    with pytest.raises(ThreadNotFoundError) as again:
        await store.delete_thread("t")
    with pytest.raises(ThreadNotFoundError) as never:
        await store.delete_thread("never-written")
    assert str(again.value) == str(thread_unavailable("t", ALICE))
    assert str(never.value) == str(thread_unavailable("never-written", ALICE))


async def test_a_deleted_thread_id_is_free_for_any_owner_and_nothing_old_comes_back(
    checkpointer: Any, reopen: Reopen
) -> None:
    alice, bob = checkpointer, await reopen("bob")
    written = await write_everything(alice, "t", "me")
    await alice.release_lease("t", written.holder_id)
    await alice.delete_thread("t")
    await bob.append("t", [user_text("bob's now")])
    seen = await reads(bob, "t")
    assert seen["meta"].owner == "bob" and seen["meta"].revision == 0 and seen["meta"].fingerprints is None
    assert [m.text for m in (await bob.load("t")).messages] == ["bob's now"]
    assert seen["load"][2:5] == ({}, 0, [])  # extra, its revision, runs
    leftovers = {k: seen[k] for k in ("job", "lease", "events", "commands", "step", "steps", "leased")}
    assert leftovers == {k: None if k in ("job", "lease", "step", "leased") else [] for k in leftovers}
    assert not seen["journal"]
    assert await alice.load("t") is None


async def test_delete_thread_refuses_while_a_live_lease_holds_it(checkpointer: Any) -> None:
    store = checkpointer
    await write_everything(store, "t", "me")
    before = await reads(store, "t")
    with pytest.raises(RunAlreadyClaimedError) as error:
        await store.delete_thread("t")
    assert error.value.lease == await store.get_lease("t")
    assert await reads(store, "t") == before, "nothing is deleted"


async def test_delete_thread_goes_through_an_expired_lease(checkpointer: Any) -> None:
    store = checkpointer
    await store.append("t", [user_text("crashed run")])
    await store.acquire_lease(lease_for("dead", "t", ttl=10, now=time.time() - 100), is_stale=lambda _: False)
    await store.delete_thread("t")
    assert await store.load("t") is None and await store.get_lease("t") is None


# --- the lesson's workflow, at the store --------------------------------------------------------

LESSON_WORKFLOW = "lesson-v1"


def lesson_step(step: int, text: str, data: Any) -> Any:
    """The lesson's two steps: normalise the text, then count its words."""
    if step == 1:
        return {"normalized": " ".join(text.lower().split())}
    return f"words={len(data['normalized'].split())}"


async def run_lesson(store: Any, thread_id: str, text: str, ran: list[int]) -> StepRecord:
    """Begin (or find) the lesson's record and repeat steps until done; ``ran`` gets each step run."""
    record = await store.step_begin(
        thread_id,
        "lesson",
        input_fingerprint=hashlib.sha256(json.dumps({"text": text}).encode()).hexdigest(),
        workflow=LESSON_WORKFLOW,
        total_steps=2,
    )
    while record.next_step < 2:
        step = record.next_step + 1
        ran.append(step)
        record = await store.step_commit(
            thread_id,
            "lesson",
            expected_revision=record.revision,
            workflow=LESSON_WORKFLOW,
            next_step=step,
            data=lesson_step(step, text, record.data),
        )
    return record


async def test_the_lessons_workflow_commits_its_steps_and_running_again_changes_nothing(
    checkpointer: Any, reopen: Reopen
) -> None:
    store, text = checkpointer, "  Hello   AGENT "
    fingerprint = hashlib.sha256(json.dumps({"text": text}).encode()).hexdigest()
    begun = await store.step_begin(
        "t", "lesson", input_fingerprint=fingerprint, workflow=LESSON_WORKFLOW, total_steps=2
    )
    one = await store.step_commit(
        "t",
        "lesson",
        expected_revision=begun.revision,
        workflow=LESSON_WORKFLOW,
        next_step=1,
        data=lesson_step(1, text, None),
    )
    assert (one.next_step, one.revision, one.data) == (1, 1, {"normalized": "hello agent"})
    two = await store.step_commit(
        "t", "lesson", expected_revision=1, workflow=LESSON_WORKFLOW, next_step=2, data=lesson_step(2, text, one.data)
    )
    assert (two.next_step, two.revision, two.data) == (2, 2, "words=2")

    ran: list[int] = []
    again = await run_lesson(await reopen(ALICE), "t", text, ran)
    assert ran == [] and again == two
    assert await store.step_get("t", "lesson") == two


async def test_the_lessons_workflow_resumes_from_its_last_committed_step(checkpointer: Any, reopen: Reopen) -> None:
    store, text = checkpointer, "Hello agent"
    begun = await store.step_begin(
        "t",
        "lesson",
        input_fingerprint=hashlib.sha256(json.dumps({"text": text}).encode()).hexdigest(),
        workflow=LESSON_WORKFLOW,
        total_steps=2,
    )
    await store.step_commit(
        "t",
        "lesson",
        expected_revision=begun.revision,
        workflow=LESSON_WORKFLOW,
        next_step=1,
        data=lesson_step(1, text, None),
    )
    # The first process stops here; another store object picks the record up.
    ran: list[int] = []
    done = await run_lesson(await reopen(ALICE), "t", text, ran)
    assert ran == [2], "only the step not yet committed runs again"
    assert (done.next_step, done.revision, done.data) == (2, 2, "words=2")
    uninterrupted: list[int] = []
    fresh = await run_lesson(store, "u", text, uninterrupted)
    assert uninterrupted == [1, 2] and (fresh.data, fresh.revision) == (done.data, done.revision)
    with pytest.raises(ConflictError):
        await run_lesson(store, "t", "another text", [])


def test_the_contract_names_the_records_as_the_tests_do() -> None:
    """The record names the tests above spell out are the ones base.py builds."""
    from core.checkpoint import base

    assert (base.EXTRA_RECORD, base.FINGERPRINTS_RECORD) == ("extra", "fingerprints")
    assert (base.command_record_name(7), base.step_record_name("job:ab")) == ("command 7", "step job:ab")
