"""The contract of human answers (``HumanAnswers``, ``core/checkpoint/capabilities.py``), on every backend.

One answer per question, ever: the pending request is compared and the answer inserted in
one transaction (one script on Redis), and a second answer - sequential or raced from
another store object (a second connection, on SQLite and Postgres) - is refused with the
first one named. Settling clears the request once. Each test takes the parametrized
``checkpointer`` fixture (owner ``"alice"``) and, for a second connection or another
owner, ``reopen(owner)`` (``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from core.checkpoint.base import Lease, PendingRequest
from core.checkpoint.capabilities import HumanAnswers, ThreadVersions, supports
from core.errors import AlreadyAnsweredError, LeaseLostError, StaleAnswerError, ThreadNotFoundError
from core.hitl import ApproveRequest, HumanRequest
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.outline import read_outline

Reopen = Callable[[str], Awaitable[Any]]

APPROVE = '{"decision":"approve","edited_args":null,"reason":null}'
DENY = '{"decision":"deny","edited_args":null,"reason":"not on prod"}'
SIGNAL_WAIT = 30.0
"""Seconds a change signal may take to arrive (a liveness bound on a loaded machine)."""


def request(thread_id: str, call_id: str) -> str:
    return HumanRequest(
        question_id=call_id,
        thread_id=thread_id,
        payload=ApproveRequest(tool_name="delete_file", tool_call_id=call_id, args={"path": "/etc/k"}),
        created_at=time.time(),
    ).model_dump_json()


async def asking(store: Any, thread_id: str = "t", call_id: str = "call_1", run_id: str | None = "run-1") -> None:
    """A thread whose run asked to approve ``call_id``: the call appended, the request pending."""
    call = ToolCall(id=call_id, name="delete_file", arguments={"path": "/etc/k"})
    asked = AssistantMessage(content=[TextContent(text="Deleting."), call], stop_reason="tool_use", run_id=run_id)
    await store.append(thread_id, [user_text("clean up"), asked])
    await store.save_pending_request(thread_id, request(thread_id, call_id), run_id=run_id)


async def test_every_backend_declares_human_answers(checkpointer: Any) -> None:
    assert supports(checkpointer, HumanAnswers)


async def test_an_answer_is_recorded_once_and_read_back(checkpointer: Any) -> None:
    await asking(checkpointer)
    assert await checkpointer.load_answer("t", "run-1", "call_1") is None
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    assert json.loads(await checkpointer.load_answer("t", "run-1", "call_1")) == json.loads(APPROVE)
    with pytest.raises(AlreadyAnsweredError) as refused:
        await checkpointer.answer("t", "run-1", "call_1", DENY)
    assert json.loads(refused.value.stored) == json.loads(APPROVE)
    assert (refused.value.thread_id, refused.value.question_id) == ("t", "call_1")
    assert str(refused.value).startswith("Question 'call_1' of thread 't' was already answered (")
    with pytest.raises(AlreadyAnsweredError):
        await checkpointer.answer("t", "run-1", "call_1", APPROVE)  # the same answer again: still a second one
    assert json.loads(await checkpointer.load_answer("t", "run-1", "call_1")) == json.loads(APPROVE)
    pending = (await checkpointer.load("t")).pending_request
    assert pending is not None and pending.run_id == "run-1", "answering leaves the request pending until settled"


async def test_a_request_of_no_run_is_answered_under_the_empty_run(checkpointer: Any) -> None:
    await asking(checkpointer, run_id=None)
    await checkpointer.answer("t", None, "call_1", APPROVE)
    assert await checkpointer.load_answer("t", "", "call_1") == await checkpointer.load_answer("t", None, "call_1")
    assert await checkpointer.load_answer("t", None, "call_1") is not None
    with pytest.raises(AlreadyAnsweredError):
        await checkpointer.answer("t", "", "call_1", DENY)


async def test_answers_raced_on_one_store_object_apply_once(checkpointer: Any) -> None:
    await asking(checkpointer)
    outcomes = await asyncio.gather(
        *(checkpointer.answer("t", "run-1", "call_1", a) for a in (APPROVE, DENY, APPROVE, DENY)),
        return_exceptions=True,
    )
    _exactly_one_won(outcomes, [APPROVE, DENY, APPROVE, DENY], await checkpointer.load_answer("t", "run-1", "call_1"))


async def test_answers_raced_from_two_connections_apply_once(checkpointer: Any, reopen: Reopen) -> None:
    """Two supervisors answering at once, each with a store object (a connection) of its own."""
    await asking(checkpointer)
    first, second = await reopen("alice"), await reopen("alice")
    for attempt in range(5):
        call = f"call_{attempt}"
        await checkpointer.save_pending_request("t", request("t", call), run_id="run-1")
        answers = [APPROVE, DENY]
        outcomes = await asyncio.gather(
            first.answer("t", "run-1", call, answers[0]),
            second.answer("t", "run-1", call, answers[1]),
            return_exceptions=True,
        )
        _exactly_one_won(outcomes, answers, await checkpointer.load_answer("t", "run-1", call))


def _exactly_one_won(outcomes: list[Any], answers: list[str], stored: str | None) -> None:
    won = [i for i, o in enumerate(outcomes) if o is None]
    assert len(won) == 1, f"exactly one answer must be recorded, got {outcomes!r}"
    assert stored is not None and json.loads(stored) == json.loads(answers[won[0]])
    for o in outcomes:
        if o is not None:
            assert isinstance(o, AlreadyAnsweredError), repr(o)
            assert json.loads(o.stored) == json.loads(stored)


async def test_an_answer_to_another_question_or_run_is_stale(checkpointer: Any) -> None:
    await asking(checkpointer)
    for run_id, question_id in (("run-1", "call_2"), ("run-2", "call_1"), (None, "call_1")):
        with pytest.raises(StaleAnswerError) as stale:
            await checkpointer.answer("t", run_id, question_id, APPROVE)
        assert str(stale.value).startswith(f"Thread 't' has no pending question {question_id!r}; ")
        assert await checkpointer.load_answer("t", run_id, question_id) is None
    await checkpointer.save_pending_request("t", None)
    with pytest.raises(StaleAnswerError):
        await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    await checkpointer.append("u", [user_text("never asked")])
    with pytest.raises(StaleAnswerError):
        await checkpointer.answer("u", None, "call_1", APPROVE)


async def test_an_unknown_thread_cannot_be_answered(checkpointer: Any) -> None:
    with pytest.raises(ThreadNotFoundError, match="'nobody' is unavailable"):
        await checkpointer.answer("nobody", "run-1", "call_1", APPROVE)
    assert await checkpointer.load_answer("nobody", "run-1", "call_1") is None
    assert await checkpointer.load("nobody") is None, "a refused answer creates nothing"


async def test_settling_clears_the_request_and_its_runs_answers_once(checkpointer: Any) -> None:
    await asking(checkpointer)
    await checkpointer.answer("t", "run-1", "call_1", DENY)
    assert await checkpointer.settle_request("t", "run-1", "call_2") is False, "another question: nothing changes"
    assert await checkpointer.settle_request("t", "run-2", "call_1") is False
    assert (await checkpointer.load("t")).pending_request is not None
    assert await checkpointer.settle_request("t", "run-1", "call_1") is True
    assert (await checkpointer.load("t")).pending_request is None
    assert (await checkpointer.list_threads())[0].pending_request is None
    assert await checkpointer.load_answer("t", "run-1", "call_1") is None
    assert await checkpointer.settle_request("t", "run-1", "call_1") is False, "a second settle is a no-op"
    with pytest.raises(StaleAnswerError):
        await checkpointer.answer("t", "run-1", "call_1", APPROVE)


async def test_a_question_asked_again_after_settling_takes_a_new_answer(checkpointer: Any) -> None:
    await asking(checkpointer)
    await checkpointer.answer("t", "run-1", "call_1", DENY)
    assert await checkpointer.settle_request("t", "run-1", "call_1")
    await checkpointer.save_pending_request("t", request("t", "call_1"), run_id="run-1")
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    assert json.loads(await checkpointer.load_answer("t", "run-1", "call_1")) == json.loads(APPROVE)


async def test_settling_keeps_other_runs_answers(checkpointer: Any) -> None:
    await asking(checkpointer, run_id="run-1")
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    await checkpointer.save_pending_request("t", request("t", "call_9"), run_id="run-2")
    await checkpointer.answer("t", "run-2", "call_9", DENY)
    assert await checkpointer.settle_request("t", "run-2", "call_9")
    assert await checkpointer.load_answer("t", "run-2", "call_9") is None
    assert await checkpointer.load_answer("t", "run-1", "call_1") is not None


async def test_another_owners_thread_is_unavailable_to_answer_read_and_settle(
    checkpointer: Any, reopen: Reopen
) -> None:
    await asking(checkpointer)
    bob = await reopen("bob")
    with pytest.raises(ThreadNotFoundError, match="'t' is unavailable"):
        await bob.answer("t", "run-1", "call_1", DENY)
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    assert await bob.load_answer("t", "run-1", "call_1") is None
    with pytest.raises(ThreadNotFoundError):
        await bob.settle_request("t", "run-1", "call_1")
    assert (await checkpointer.load("t")).pending_request is not None
    assert json.loads(await checkpointer.load_answer("t", "run-1", "call_1")) == json.loads(APPROVE)


def _lease(holder: str, thread_id: str = "t", ttl: float = 60.0) -> Lease:
    now = time.time()
    return Lease(
        thread_id, holder, pid=4242, host="box", run_id="run-1", acquired_at=now, heartbeat_at=now, expires_at=now + ttl
    )


async def test_the_runners_writes_are_fenced_by_its_lease(checkpointer: Any) -> None:
    await asking(checkpointer)
    await checkpointer.acquire_lease(_lease("runner-b"), is_stale=lambda _lease: False)
    with pytest.raises(LeaseLostError):
        await checkpointer.save_pending_request("t", request("t", "call_2"), run_id="run-1", holder_id="runner-a")
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)  # anyone may answer: not fenced
    with pytest.raises(LeaseLostError):
        await checkpointer.settle_request("t", "run-1", "call_1", holder_id="runner-a")
    pending = (await checkpointer.load("t")).pending_request
    assert pending is not None and json.loads(pending.request_json)["question_id"] == "call_1", "nothing written"
    assert await checkpointer.settle_request("t", "run-1", "call_1", holder_id="runner-b")
    await checkpointer.save_pending_request("t", request("t", "call_2"), run_id="run-1", holder_id="runner-b")
    assert json.loads((await checkpointer.load("t")).pending_request.request_json)["question_id"] == "call_2"


async def test_an_answer_moves_the_change_token_and_signals_another_store_object(
    checkpointer: Any, reopen: Reopen
) -> None:
    """How a runner waiting in another process wakes (core.changes.StoreWatch's two sources)."""
    await asking(checkpointer)
    watcher = await reopen("alice")
    before = await watcher.change_token()
    stop = asyncio.Event()
    signals = watcher.change_signals(stop, quiet_ms=10)
    first = asyncio.ensure_future(anext(signals))
    await asyncio.sleep(0.3)  # the watch is set up before the write
    try:
        if first.done():  # a signal that was pending from the setup writes
            first = asyncio.ensure_future(anext(signals))
        await checkpointer.answer("t", "run-1", "call_1", APPROVE)
        await asyncio.wait_for(first, SIGNAL_WAIT)
    finally:
        stop.set()
        first.cancel()
        await signals.aclose()
    assert await watcher.change_token() != before
    token = await watcher.change_token()
    assert await checkpointer.settle_request("t", "run-1", "call_1")
    assert await watcher.change_token() != token


async def test_deleting_a_thread_deletes_its_answers(checkpointer: Any) -> None:
    await asking(checkpointer)
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    await checkpointer.delete_thread("t")
    assert await checkpointer.load_answer("t", "run-1", "call_1") is None
    await asking(checkpointer)
    await checkpointer.answer("t", "run-1", "call_1", DENY)
    assert json.loads(await checkpointer.load_answer("t", "run-1", "call_1")) == json.loads(DENY)


# --- the listing and every read of a pending request say whether its answer is stored ---------


async def _every_read(store: Any, thread_id: str = "t") -> dict[str, PendingRequest | None]:
    """The thread's pending request as each read that carries one gives it: the listing,
    the named summaries (when the store has thread versions), a load, and an outline read
    (the streamed read, on a store with paged reads)."""
    found: dict[str, PendingRequest | None] = {}
    by_id = {s.thread_id: s for s in await store.list_threads()}
    found["list_threads"] = by_id[thread_id].pending_request
    if supports(store, ThreadVersions):
        (summary,) = await store.summaries([thread_id])
        found["summaries"] = summary.pending_request
    data = await store.load(thread_id)
    found["load"] = data.pending_request
    outlined = await read_outline(store, thread_id)
    assert outlined is not None
    found["outline"] = outlined[0].pending_request
    return found


def _answered(reads: dict[str, PendingRequest | None]) -> dict[str, bool | None]:
    return {name: None if pending is None else pending.answered for name, pending in reads.items()}


async def _version(store: Any, thread_id: str = "t") -> object:
    return (await store.thread_versions())[thread_id] if supports(store, ThreadVersions) else None


async def test_every_read_of_a_pending_request_says_whether_its_answer_is_stored(checkpointer: Any) -> None:
    await asking(checkpointer, "t")
    await asking(checkpointer, "u", call_id="call_u")
    before = await _version(checkpointer)
    unanswered = await _every_read(checkpointer)
    assert set(_answered(unanswered).values()) == {False}, _answered(unanswered)

    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    answered = await _every_read(checkpointer)
    assert set(_answered(answered).values()) == {True}, _answered(answered)
    for name, pending in answered.items():  # the flag is all that changed
        assert pending is not None and (pending.request_json, pending.run_id) == (
            unanswered[name].request_json,  # type: ignore[union-attr]
            unanswered[name].run_id,  # type: ignore[union-attr]
        ), name
    assert set(_answered(await _every_read(checkpointer, "u")).values()) == {False}, "another thread's is not"
    if supports(checkpointer, ThreadVersions):
        assert await _version(checkpointer) != before, "an answer is a new version: the picker reads the row again"

    assert await checkpointer.settle_request("t", "run-1", "call_1")
    assert set((await _every_read(checkpointer)).values()) == {None}


async def test_the_flag_is_of_the_question_pending_now(checkpointer: Any) -> None:
    """The answer of call_1 stays stored (until the run is settled) when the run asks call_2:
    call_2 is not answered; call_1 asked again is."""
    await asking(checkpointer)
    await checkpointer.answer("t", "run-1", "call_1", APPROVE)
    await checkpointer.save_pending_request("t", request("t", "call_2"), run_id="run-1")
    assert set(_answered(await _every_read(checkpointer)).values()) == {False}
    await checkpointer.save_pending_request("t", request("t", "call_1"), run_id="run-2")
    assert set(_answered(await _every_read(checkpointer)).values()) == {False}, "another run's question"
    await checkpointer.save_pending_request("t", request("t", "call_1"), run_id="run-1")
    assert set(_answered(await _every_read(checkpointer)).values()) == {True}


@pytest.mark.parametrize("run_id", [None, "rün-ß-日本"])
async def test_a_request_of_no_run_or_of_a_non_ascii_run_reads_answered(checkpointer: Any, run_id: str | None) -> None:
    """The answer's key is found as the answer was written: the empty run for none; on Redis
    a field whose run id is length-prefixed in characters, not bytes."""
    await asking(checkpointer, run_id=run_id)
    assert set(_answered(await _every_read(checkpointer)).values()) == {False}
    await checkpointer.answer("t", run_id, "call_1", DENY)
    assert set(_answered(await _every_read(checkpointer)).values()) == {True}


@pytest.mark.parametrize("text", ["[1, 2]", '{"question_id": 7}', '{"payload": {"kind": "poll"}}'])
async def test_a_request_this_version_cannot_read_is_read_unanswered(checkpointer: Any, text: str) -> None:
    """No question id to look the answer up by (JSON that is not an object, a question id
    that is not text): read as it is, unanswered, and nothing fails on it."""
    await checkpointer.append("t", [user_text("hello")])
    await checkpointer.save_pending_request("t", text, run_id="run-1")
    reads = await _every_read(checkpointer)
    assert set(_answered(reads).values()) == {False}
    assert {json.loads(p.request_json) == json.loads(text) for p in reads.values() if p is not None} == {True}
