"""core.answers.answer: the Python call that answers a waiting thread (memory and SQLite stores)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from core.answers import answer, pending_request
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import (
    AlreadyAnsweredError,
    AnswerMismatchError,
    NotWaitingError,
    StaleAnswerError,
    ThreadNotFoundError,
    UnreadableRequestError,
)
from core.hitl import (
    ApproveRequest,
    AskRequest,
    ConfirmRequest,
    HumanRequest,
    Option,
    Question,
    RequestPayload,
    question_id_for,
)
from core.hitl_replies import ApproveReply, ChoiceReply, DenyReply, EditReply, KeyedReply, TextReply, YesNoReply
from core.messages import user_text


async def waiting(store: Any, payload: RequestPayload, *, thread_id: str = "t1", run_id: str | None = "run-1") -> str:
    """A thread waiting on ``payload``; returns its question id."""
    qid = question_id_for(payload)
    text = HumanRequest(question_id=qid, thread_id=thread_id, payload=payload, created_at=time.time()).model_dump_json()
    await store.append(thread_id, [user_text("go")])
    await store.save_pending_request(thread_id, text, run_id=run_id)
    return qid


APPROVAL = ApproveRequest(tool_name="delete_file", tool_call_id="call_1", args={"path": "/etc/k"})
TWO_QUESTIONS = AskRequest(
    questions=[
        Question(key="target", prompt="Which file?"),
        Question(
            key="env", prompt="Where?", options=[Option(label="Prod", value="prod"), Option(label="Dev", value="dev")]
        ),
    ]
)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        yield MemoryCheckpointer("alice")
        return
    opened = await SQLiteCheckpointer.open(tmp_path / "a.sqlite", create=True, owner="alice")
    yield opened
    await opened.close()


async def test_an_approval_is_answered_and_recorded(store: Any) -> None:
    qid = await waiting(store, APPROVAL)
    done = await answer(store, "t1", ApproveReply())
    assert (done.thread_id, done.run_id, done.request.question_id) == ("t1", "run-1", qid)
    assert await store.load_answer("t1", "run-1", qid) == done.answer_json
    assert json.loads(done.answer_json) == {"decision": "approve", "edited_args": None, "reason": None}
    # Nobody runs the thread: resuming applies it, and the sentence says so.
    assert done.live is False
    assert done.sentence == "Thread 't1': the call delete_file (call_1) approved; resume the thread to apply it."


async def test_an_answer_to_a_run_holding_its_lease_says_the_run_goes_on(store: Any) -> None:
    from core.checkpoint.base import Lease

    await waiting(store, APPROVAL)
    now = time.time()
    await store.acquire_lease(
        Lease("t1", "runner", 7, "build-7", "run-1", now, now, now + 30), is_stale=lambda _l: True
    )
    done = await answer(store, "t1", ApproveReply())
    assert done.live is True
    assert done.sentence == "Thread 't1': the call delete_file (call_1) approved; the run that asked goes on with it."


async def test_a_denial_says_its_reason_and_a_second_answer_is_refused(store: Any) -> None:
    qid = await waiting(store, APPROVAL)
    denied = await answer(store, "t1", DenyReply("not on prod"))
    assert denied.sentence.startswith("Thread 't1': the call delete_file (call_1) denied: not on prod;")
    with pytest.raises(AlreadyAnsweredError, match=r"was already answered .*not on prod"):
        await answer(store, "t1", ApproveReply())
    assert json.loads(await store.load_answer("t1", "run-1", qid))["decision"] == "deny"


async def test_an_edit_records_the_new_arguments(store: Any) -> None:
    qid = await waiting(store, APPROVAL)
    await answer(store, "t1", EditReply({"path": "/tmp/k"}))
    assert json.loads(await store.load_answer("t1", "run-1", qid)) == {
        "decision": "edit",
        "edited_args": {"path": "/tmp/k"},
        "reason": None,
    }


async def test_questions_by_key_text_and_choice(store: Any) -> None:
    qid = await waiting(store, TWO_QUESTIONS)
    done = await answer(store, "t1", KeyedReply({"target": "src/cli.py", "env": "Dev"}))
    assert json.loads(await store.load_answer("t1", "run-1", qid)) == {"target": "src/cli.py", "env": "dev"}
    assert done.sentence.startswith("Thread 't1': 2 questions answered {")
    one = AskRequest(questions=[TWO_QUESTIONS.questions[1]])
    qid2 = await waiting(store, one, thread_id="t2", run_id=None)
    await answer(store, "t2", ChoiceReply(("prod",)))
    assert json.loads(await store.load_answer("t2", None, qid2)) == {"env": "prod"}
    qid3 = await waiting(store, AskRequest(questions=[TWO_QUESTIONS.questions[0]]), thread_id="t3")
    await answer(store, "t3", TextReply("README.md"))
    assert json.loads(await store.load_answer("t3", "run-1", qid3)) == {"target": "README.md"}


async def test_yes_or_no(store: Any) -> None:
    qid = await waiting(store, ConfirmRequest(prompt="Ship it?"))
    done = await answer(store, "t1", YesNoReply(False))
    assert await store.load_answer("t1", "run-1", qid) == "false"
    assert "answered no" in done.sentence


async def test_a_reply_that_does_not_fit_records_nothing(store: Any) -> None:
    qid = await waiting(store, ConfirmRequest(prompt="Ship it?"))
    with pytest.raises(AnswerMismatchError, match=r"^This request takes yes or no, not text\.$"):
        await answer(store, "t1", TextReply("sure"))
    with pytest.raises(AnswerMismatchError):
        await answer(store, "t1", ApproveReply())
    assert await store.load_answer("t1", "run-1", qid) is None


async def test_a_thread_not_waiting_is_one_sentence(store: Any) -> None:
    await store.append("idle", [user_text("hello")])
    with pytest.raises(NotWaitingError, match=r"^Thread 'idle' is not waiting for an answer\.$"):
        await answer(store, "idle", ApproveReply())
    with pytest.raises(ThreadNotFoundError, match=r"^Thread 'nobody' is unavailable: owner .* has no such thread\.$"):
        await answer(store, "nobody", ApproveReply())


async def test_another_owners_waiting_thread_reads_as_a_missing_one(store: Any) -> None:
    qid = await waiting(store, APPROVAL)
    bob = MemoryCheckpointer("bob", shared=store) if isinstance(store, MemoryCheckpointer) else None
    if bob is None:
        bob = await SQLiteCheckpointer.open(store.path, create=False, owner="bob")
    try:
        with pytest.raises(ThreadNotFoundError) as foreign:
            await answer(bob, "t1", ApproveReply())
        with pytest.raises(ThreadNotFoundError) as missing:
            await answer(bob, "t9", ApproveReply())
        assert str(foreign.value) == str(missing.value).replace("t9", "t1"), "nothing tells them apart"
        assert await store.load_answer("t1", "run-1", qid) is None
    finally:
        await bob.close()


async def test_a_question_id_that_is_not_the_pending_ones_is_stale(store: Any) -> None:
    qid = await waiting(store, APPROVAL)
    with pytest.raises(StaleAnswerError, match="has no pending question 'call_0'"):
        await answer(store, "t1", ApproveReply(), question_id="call_0")
    await answer(store, "t1", ApproveReply(), question_id=qid)
    assert await pending_request(store, "t1") is not None


async def test_an_unreadable_request_is_refused(store: Any) -> None:
    await store.append("t1", [user_text("go")])
    await store.save_pending_request("t1", '{"question_id": "q", "payload": {"kind": "vote"}}', run_id=None)
    with pytest.raises(UnreadableRequestError):
        await answer(store, "t1", ApproveReply())


async def test_a_store_without_answers_is_a_type_error() -> None:
    class Plain:
        async def load(self, thread_id: str) -> None:
            return None

    with pytest.raises(TypeError, match="does not record human answers"):
        await answer(Plain(), "t1", ApproveReply())  # type: ignore[arg-type]
