"""core.hitl against the real cubeloop package: the same bytes, the same ids, the same texts."""

from __future__ import annotations

import json

import pytest
from cubeloop.checkpointer.sqlite import _serialize_structured_value
from cubeloop.hitl import types as cl
from cubeloop.hitl.ask_user import _format_answers
from cubeloop.hitl.channel import InMemoryChannel, _derive_question_id

from core import hitl, hitl_replies, hitl_results
from core.errors import AnswerMismatchError, UnreadableRequestError

# The ask the probe's cubeloop run left pending (/tmp/hitl/a_pending.db, hitl-spec.md §2).
PROBE_ASK = (
    '{"question_id":"1d52da98d7e075224b6acae7219388a8.0","thread_id":"tA","payload":{"kind":"ask","questions":'
    '[{"key":"target","prompt":"Which file?","options":null,"multi_select":false,"required":true},{"key":"env",'
    '"prompt":"Where?","options":[{"label":"Prod","value":"prod","description":null,"allow_input":false},'
    '{"label":"Other","value":"other","description":null,"allow_input":true}],"multi_select":false,"required":true}]},'
    '"created_at":1796180043.0000012,"timeout_seconds":null}'
)
PROBE_APPROVE = (
    '{"question_id":"call_del_1","thread_id":"tK","payload":{"kind":"approve","tool_name":"delete_file",'
    '"tool_call_id":"call_del_1","args":{"path":"/etc/k"},"details":{"why":"system path"}},'
    '"created_at":1796180084.374118,"timeout_seconds":null}'
)


def _confirm(prompt: str = "Proceed?") -> str:
    return hitl.HumanRequest(
        question_id="q1", thread_id="t", payload=hitl.ConfirmRequest(prompt=prompt), created_at=1.5
    ).model_dump_json()


def _choice_ask(*, multi: bool = False, allow_input: bool = False) -> hitl.HumanRequest:
    options = [hitl.Option(label="Prod", value="prod"), hitl.Option(label="Staging", value="stage")]
    if allow_input:
        options.append(hitl.Option(label="Other", value="other", allow_input=True))
    q = hitl.Question(key="env", prompt="Where?", options=options, multi_select=multi)
    return hitl.HumanRequest(question_id="q", thread_id="t", payload=hitl.AskRequest(questions=[q]), created_at=2.0)


@pytest.mark.parametrize("text", [PROBE_ASK, PROBE_APPROVE, _confirm()])
def test_requests_dump_to_the_bytes_cubeloop_writes(text: str) -> None:
    ours = hitl.parse_request(text)
    theirs = cl.HitlRequest.model_validate_json(text)
    assert ours.model_dump_json() == theirs.model_dump_json() == text


def test_a_request_built_here_is_byte_identical_to_cubeloops() -> None:
    args = {"path": "/etc/ü", "n": 3, "f": 1.25, "nested": {"a": [1, None, True]}}
    ours = hitl.HumanRequest(
        question_id="c1",
        thread_id=None,
        payload=hitl.ApproveRequest(tool_name="rm", tool_call_id="c1", args=args, details={"why": "x"}),
        created_at=1796180084.374118,
        timeout_seconds=30.0,
    )
    theirs = cl.HitlRequest(
        question_id="c1",
        thread_id=None,
        payload=cl.ApproveRequest(tool_name="rm", tool_call_id="c1", args=args, details={"why": "x"}),
        created_at=1796180084.374118,
        timeout_seconds=30.0,
    )
    assert ours.model_dump_json() == theirs.model_dump_json()


def test_answers_dump_as_cubeloop_stores_them() -> None:
    values = [True, False, {"target": "src/ü.py", "env": ["a", "b"]}]
    for value in values:
        assert hitl_replies.dump_answer(value) == _serialize_structured_value(value)
    ours = hitl.ApprovalAnswer(decision="edit", edited_args={"path": "/tmp/x"}, reason=None)
    theirs = cl.ApproveAnswer(decision="edit", edited_args={"path": "/tmp/x"})
    assert hitl_replies.dump_answer(ours) == _serialize_structured_value(theirs) == theirs.model_dump_json()


def test_question_ids_follow_cubeloops_formula() -> None:
    request = hitl.parse_request(PROBE_ASK)
    assert hitl.question_id_for(request.payload) == "1d52da98d7e075224b6acae7219388a8.0"
    confirm = hitl.ConfirmRequest(prompt="Delete it?", details={"n": 1})
    assert hitl.content_hash(confirm) == _derive_question_id("confirm", {"prompt": "Delete it?", "details": {"n": 1}})
    assert hitl.question_id_for(confirm, tool_call_id="call_9") == "call_9"
    approve = hitl.ApproveRequest(tool_name="rm", tool_call_id="call_7", args={})
    assert hitl.question_id_for(approve) == "call_7"


async def test_question_ids_count_repeats_like_a_cubeloop_channel() -> None:
    """A fresh channel's ids for the same confirm asked twice and another one between."""
    channel = InMemoryChannel()
    seen: list[str] = []

    async def answer_all() -> None:
        async for request in channel.subscribe():
            seen.append(request.question_id)
            await channel.answer(request.question_id, True)
            if len(seen) == 3:
                return

    import asyncio

    answering = asyncio.create_task(answer_all())
    await asyncio.sleep(0)
    for prompt in ("a?", "b?", "a?"):
        await channel.confirm(prompt, timeout=5)
    await answering
    ids = hitl.QuestionIds()
    assert [ids.next(hitl.ConfirmRequest(prompt=p)) for p in ("a?", "b?", "a?")] == seen
    assert seen[2].endswith(".1") and seen[0].endswith(".0")


def test_an_unreadable_request_is_one_sentence() -> None:
    with pytest.raises(UnreadableRequestError, match=r"^The pending request cannot be read .*payload"):
        hitl.parse_request('{"question_id":"q","thread_id":"t","payload":{"kind":"poll"},"created_at":1}')
    with pytest.raises(UnreadableRequestError):
        hitl.parse_request("not json")


def test_replies_to_an_approval() -> None:
    request = hitl.parse_request(PROBE_APPROVE)
    assert (
        hitl_replies.answer_json_for(request, hitl_replies.ApproveReply())
        == '{"decision":"approve","edited_args":null,"reason":null}'
    )
    denied = hitl_replies.answer_json_for(request, hitl_replies.DenyReply("not on prod"))
    assert cl.ApproveAnswer.model_validate_json(denied) == cl.ApproveAnswer(decision="deny", reason="not on prod")
    edited = hitl_replies.answer_json_for(request, hitl_replies.EditReply({"path": "/tmp/k"}))
    assert hitl_replies.check_answer(request, edited) == hitl.ApprovalAnswer(
        decision="edit", edited_args={"path": "/tmp/k"}
    )
    with pytest.raises(AnswerMismatchError, match="takes approve, deny or edit, not text"):
        hitl_replies.answer_json_for(request, hitl_replies.TextReply("yes"))


def test_replies_to_a_confirm() -> None:
    request = hitl.parse_request(_confirm())
    assert hitl_replies.answer_json_for(request, hitl_replies.YesNoReply(True)) == "true"
    assert hitl_replies.answer_json_for(request, hitl_replies.YesNoReply(False)) == "false"
    with pytest.raises(AnswerMismatchError, match=r"^This request takes yes or no, not text\.$"):
        hitl_replies.answer_json_for(request, hitl_replies.TextReply("sure"))
    with pytest.raises(AnswerMismatchError, match="true or false"):
        hitl_replies.check_answer(request, '"yes"')


def test_replies_to_an_ask_of_two_questions() -> None:
    request = hitl.parse_request(PROBE_ASK)
    built = hitl_replies.answer_json_for(request, hitl_replies.KeyedReply({"target": "src/cli.py", "env": "Prod"}))
    assert json.loads(built) == {"target": "src/cli.py", "env": "prod"}, "a label is answered with its value"
    # "Other" allows input, so free text fits the second question.
    assert hitl_replies.check_answer(request, '{"target": "a", "env": "the moon"}') == {
        "target": "a",
        "env": "the moon",
    }
    with pytest.raises(AnswerMismatchError, match=r"asks 2 questions; answer each by key \('target', 'env'\)"):
        hitl_replies.answer_json_for(request, hitl_replies.TextReply("src/cli.py"))
    with pytest.raises(AnswerMismatchError, match=r"^Question 'env' \(Where\?\) needs an answer\.$"):
        hitl_replies.answer_json_for(request, hitl_replies.KeyedReply({"target": "x"}))
    with pytest.raises(AnswerMismatchError, match="has no question 'tagret'"):
        hitl_replies.answer_json_for(request, hitl_replies.KeyedReply({"tagret": "x", "env": "prod"}))


def test_choices() -> None:
    single = _choice_ask()
    assert json.loads(hitl_replies.answer_json_for(single, hitl_replies.ChoiceReply(("stage",)))) == {"env": "stage"}
    with pytest.raises(
        AnswerMismatchError, match=r"'mars' is not an option of question 'env' \(its options: 'prod', 'stage'\)"
    ):
        hitl_replies.answer_json_for(single, hitl_replies.ChoiceReply(("mars",)))
    with pytest.raises(AnswerMismatchError, match="takes one answer, not 2"):
        hitl_replies.answer_json_for(single, hitl_replies.ChoiceReply(("prod", "stage")))
    multi = _choice_ask(multi=True)
    assert json.loads(hitl_replies.answer_json_for(multi, hitl_replies.ChoiceReply(("Prod", "stage")))) == {
        "env": ["prod", "stage"]
    }
    open_ended = _choice_ask(allow_input=True)
    assert json.loads(hitl_replies.answer_json_for(open_ended, hitl_replies.TextReply("mars"))) == {"env": "mars"}


def test_a_reply_to_a_free_text_question_must_say_something() -> None:
    q = hitl.Question(key="name", prompt="Name?")
    request = hitl.HumanRequest(question_id="q", thread_id="t", payload=hitl.AskRequest(questions=[q]), created_at=0)
    assert hitl_replies.answer_json_for(request, hitl_replies.TextReply("Ada")) == '{"name":"Ada"}'
    with pytest.raises(AnswerMismatchError, match="needs an answer"):
        hitl_replies.answer_json_for(request, hitl_replies.TextReply("  "))


def test_edit_needs_arguments_and_only_edit_gives_them() -> None:
    request = hitl.parse_request(PROBE_APPROVE)
    with pytest.raises(AnswerMismatchError, match="must give the tool's new arguments"):
        hitl_replies.check_answer(request, '{"decision":"edit"}')
    with pytest.raises(AnswerMismatchError, match="Only an edit gives new arguments, not approve"):
        hitl_replies.check_answer(request, '{"decision":"approve","edited_args":{"a":1}}')
    # cubeloop's respond() path stores a plain dict for a denial; it reads as one here.
    assert hitl_replies.check_answer(request, '{"decision": "deny", "reason": "not on prod"}').reason == "not on prod"


def test_decision_results_are_cubeloops() -> None:
    """The texts and details cubeloop's middleware and ask_user give (hitl-spec.md §1 table)."""
    args = {"path": "/etc/k"}
    deny = hitl_results.approval_result(hitl.ApprovalAnswer(decision="deny", reason="no"), args)
    assert (deny.text, deny.is_error, deny.hitl) == ("no", True, {"decision": "human_deny", "reason": "no"})
    bare = hitl_results.approval_result(hitl.ApprovalAnswer(decision="deny"), args)
    assert bare.text == "Tool execution was blocked" and bare.hitl == {"decision": "human_deny", "reason": None}
    approve = hitl_results.approval_result(hitl.ApprovalAnswer(decision="approve"), args)
    assert approve.runs_tool and approve.hitl == {"decision": "human_approve"}
    edit = hitl_results.approval_result(hitl.ApprovalAnswer(decision="edit", edited_args={"path": "/tmp"}), args)
    assert edit.runs_tool and edit.hitl == {"decision": "edit", "original_args": args, "edited_args": {"path": "/tmp"}}
    assert hitl_results.approval_timeout_result().text == "approval_timeout"
    assert hitl_results.approval_cancelled_result("quit").text == "cancelled: quit"
    assert hitl_results.aborted_result("stop").hitl == {"decision": "aborted", "reason": "stop"}
    answers = {"target": "ü", "env": ["a"]}
    assert hitl_results.ask_answered_result(answers).text == _format_answers(answers)
    assert hitl_results.ask_timeout_result(5.0).text == "timed out after 5.0 seconds"
    assert hitl_results.ask_cancelled_result("bye").hitl == {"outcome": "cancelled", "reason": "bye"}
    assert hitl_results.with_hitl({"a": 1}, {"decision": "human_approve"}) == {
        "a": 1,
        "hitl": {"decision": "human_approve"},
    }
    assert hitl_results.with_hitl("x", {"d": 1}) == {"_non_dict_details": "x", "hitl": {"d": 1}}
