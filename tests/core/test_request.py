"""The request builder: any stored history becomes a request that keeps the rule.

Property-based (hypothesis) over random histories: calls, results, orphans, duplicates,
user messages interleaved, unknown rows, failed replies, other runs' messages.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import (
    AnyMessage,
    AssistantMessage,
    ToolResultMessage,
    UnknownMessage,
    UserMessage,
    user_text,
)
from core.request import RequestBuilder, RequestChecker, build_request, check_request, repair_words
from tests.helpers.histories import assistant as _assistant
from tests.helpers.histories import histories
from tests.helpers.histories import result as _result


def _first_results(history: list[AnyMessage]) -> dict[str, tuple[AssistantMessage, ToolResultMessage]]:
    """Call id -> (the sent assistant message that first made it, its first result after it)."""
    made: dict[str, AssistantMessage] = {}
    out: dict[str, tuple[AssistantMessage, ToolResultMessage]] = {}
    for m in history:
        if isinstance(m, AssistantMessage) and m.stop_reason != "error":
            for c in m.tool_calls:
                made.setdefault(c.id, m)
        elif isinstance(m, ToolResultMessage) and m.tool_call_id in made and m.tool_call_id not in out:
            out[m.tool_call_id] = (made[m.tool_call_id], m)
    return out


@settings(max_examples=400, deadline=None)
@given(histories())
def test_the_built_request_keeps_the_rule_and_loses_nothing_that_may_be_sent(history: list[AnyMessage]) -> None:
    stored = [m.model_dump() for m in history]
    built = build_request(history)
    sent = list(built.messages)

    assert check_request(sent) is None
    assert [m.model_dump() for m in history] == stored, "stored rows were changed"
    assert not any(isinstance(m, UnknownMessage) for m in sent)
    assert not any(isinstance(m, AssistantMessage) and m.stop_reason == "error" for m in sent)
    # Every call that has a result is sent, right after its assistant message's text, with its first result.
    sent_calls = {c.id for m in sent if isinstance(m, AssistantMessage) for c in m.tool_calls}
    sent_results = {id(m) for m in sent if isinstance(m, ToolResultMessage)}
    for call_id, (_, first) in _first_results(history).items():
        assert call_id in sent_calls, call_id
        assert id(first) in sent_results, call_id
    # User messages are all sent, in their order.
    assert [id(m) for m in sent if isinstance(m, UserMessage)] == [id(m) for m in history if isinstance(m, UserMessage)]
    # What is left out is said.
    left_out = sum(1 for m in history if isinstance(m, (ToolResultMessage, UnknownMessage))) - len(sent_results)
    left_out += sum(1 for m in history if isinstance(m, AssistantMessage) and m.stop_reason == "error")
    said = sum(r.kind in ("duplicate_result", "orphan_result", "unknown_row", "failed_reply") for r in built.repairs)
    assert said == left_out


@settings(max_examples=200, deadline=None)
@given(histories(), st.lists(st.integers(1, 5), max_size=8))
def test_fed_as_it_grows_the_builder_sends_what_one_pass_sends(history: list[AnyMessage], steps: list[int]) -> None:
    builder = RequestBuilder()
    checker = RequestChecker()
    growing: list[AnyMessage] = []
    at = 0
    for step in [*steps, len(history)]:
        growing.extend(history[at : at + step])
        at += step
        builder.update(growing)
        request = builder.request()
        assert checker.check(request) == check_request(list(request))
    whole = build_request(history)
    assert [m.model_dump() for m in builder.request()] == [m.model_dump() for m in whole.messages]
    assert sorted(builder.built().repairs, key=repr) == sorted(whole.repairs, key=repr)
    assert [u.call.id for u in builder.unanswered()] == [u.call.id for u in whole.unanswered]


@settings(max_examples=200, deadline=None)
@given(histories())
def test_unanswered_calls_are_exactly_those_with_no_result_after_them(history: list[AnyMessage]) -> None:
    answered = _first_results(history)
    made = [c.id for m in history if isinstance(m, AssistantMessage) and m.stop_reason != "error" for c in m.tool_calls]
    expected = [c for c in dict.fromkeys(made) if c not in answered]
    assert [u.call.id for u in build_request(history).unanswered] == expected


# --- the cases a person meets -----------------------------------------------------------------


def test_a_user_message_between_a_call_and_its_result_is_sent_after_the_result() -> None:
    call, steer, result = _assistant("c1"), user_text("wait"), _result("c1")
    built = build_request([user_text("go"), call, steer, result])
    assert built.messages[1:] == [call, result, steer]
    assert repair_words(built.repairs) == ["1 user message placed after the tool results"]


def test_results_settled_after_a_later_reply_are_placed_after_their_calls() -> None:
    # cubeloop continued a mid-tool thread; the resume settled c1 and c2 at the end.
    first, later = _assistant("c1", "c2", run="r1"), _assistant(run="r2", text="carried on")
    r1, r2 = _result("c1", "r1"), _result("c2", "r1")
    built = build_request([user_text("go"), first, user_text("next", run_id="r2"), later, r1, r2])
    assert [m.role for m in built.messages] == ["user", "assistant", "tool_result", "tool_result", "user", "assistant"]
    assert repair_words(built.repairs) == [
        "1 user message placed after the tool results",
        "2 results placed after their calls",
    ]
    assert built.interleaved == (1,)


def test_orphans_duplicates_unknown_rows_and_failed_replies_are_left_out_and_said() -> None:
    history = [
        user_text("go"),
        _result("nobody"),
        _assistant("c1"),
        _result("c1"),
        _result("c1"),
        UnknownMessage(role="system"),
        _assistant(stop="error", text="half a rep"),
    ]
    built = build_request(history)
    assert [m.role for m in built.messages] == ["user", "assistant", "tool_result"]
    assert built.messages[2] is history[3]
    assert repair_words(built.repairs) == [
        "1 duplicate tool result left out of what is sent",
        "1 orphan tool result left out of what is sent",
        "1 row of unknown role left out of what is sent",
        "1 failed reply left out of what is sent",
    ]
    assert [(r.kind, r.index) for r in built.repairs if r.kind == "orphan_result"] == [("orphan_result", 1)]


def test_a_call_answered_nowhere_is_left_out_and_listed() -> None:
    built = build_request([user_text("go"), _assistant("c1")])
    assert [m.role for m in built.messages] == ["user"]
    assert [u.call.id for u in built.unanswered] == ["c1"]
    assert repair_words(built.repairs) == ["1 unanswered tool call left out of what is sent"]


def test_the_builder_grows_its_own_list_in_place_when_every_call_is_answered() -> None:
    history: list[AnyMessage] = [user_text("go"), _assistant("c1"), _result("c1")]
    builder = RequestBuilder()
    builder.update(history)
    first = builder.request()
    history += [_assistant(text="done"), user_text("more")]
    builder.update(history)
    assert builder.request() is first and len(first) == 5


def test_the_rule_names_what_is_wrong() -> None:
    assert check_request([_assistant("c1"), user_text("x"), _result("c1")]) == (
        "Message 1 (user) comes before the results of tool call(s) c1."
    )
    assert check_request([user_text("x"), _result("c9")]) == (
        "Message 1 is a tool result for c9, which is not a call awaiting its result."
    )
    assert check_request([_assistant("c1")]) == "Tool call(s) c1 have no result at the end of the request."
    assert check_request([UnknownMessage(role="system")]) == "Message 0 has the unknown role 'system'."
    assert check_request([_assistant("c1"), _result("c1"), _assistant("c1"), _result("c1")]) == (
        "Message 2 repeats the tool call id c1."
    )


# --- the loop on any history -------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(histories())
async def test_a_run_on_any_history_settles_every_call_and_is_never_refused(history: list[AnyMessage]) -> None:
    # The faux provider refuses a request that breaks the rule, as the API would (400):
    # a completed run means every model call was sent a valid request.
    import asyncio

    from core.loop import LoopConfig, run_loop
    from core.providers.faux import FauxProvider
    from core.recovery import unanswered_calls

    async def nothing(event: object) -> None:
        return None

    provider = FauxProvider(["ok"])
    transcript = list(history)
    config = LoopConfig(provider, run_id="run-new")
    outcome = await run_loop(transcript, config, nothing, asyncio.Event(), [user_text("next", run_id="run-new")])
    assert outcome == "completed", transcript[-1]
    assert unanswered_calls(transcript) == []
    assert check_request(provider.requests[0].messages) is None
    # Settled results carry the run that made their call.
    issuers: dict[str, str | None] = {}
    for m in history:
        if isinstance(m, AssistantMessage) and m.stop_reason != "error":
            for c in m.tool_calls:
                issuers.setdefault(c.id, m.run_id)  # a reused id belongs to its first call
    for settled in transcript[len(history) :]:
        if isinstance(settled, ToolResultMessage):
            assert settled.run_id == (issuers[settled.tool_call_id] or "run-new")
