"""The request builder: any stored history becomes a request that keeps the rule.

Property-based (hypothesis) over random histories: calls, results, orphans, duplicates,
user messages interleaved, unknown rows, failed replies, other runs' messages, empty and
whitespace-only text, images without data, histories not starting with a user message.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import (
    AnyMessage,
    AssistantMessage,
    ImageContent,
    TextContent,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    UserMessage,
    user_text,
)
from core.request import (
    RequestBuilder,
    RequestChecker,
    blank,
    build_request,
    check_request,
    image_source,
    repair_words,
)
from tests.helpers.histories import assistant as _assistant
from tests.helpers.histories import histories
from tests.helpers.histories import result as _result


def _words(message: UserMessage) -> list[str]:
    """The text of a user message that can be sent (blank text is never sent)."""
    content = message.content
    texts = [content] if isinstance(content, str) else [b.text for b in content if isinstance(b, TextContent)]
    return [t for t in texts if not blank(t)]


def _sendable_user(message: AnyMessage) -> bool:
    if not isinstance(message, UserMessage):
        return False
    images = [] if isinstance(message.content, str) else [b for b in message.content if isinstance(b, ImageContent)]
    return bool(_words(message)) or any(image_source(b) is not None for b in images)


def _leading(history: list[AnyMessage]) -> int:
    """How many messages come before the first user message that can be sent."""
    return next((i for i, m in enumerate(history) if _sendable_user(m)), len(history))


def _first_results(history: list[AnyMessage]) -> dict[str, tuple[AssistantMessage, ToolResultMessage]]:
    """Call id -> (the sent assistant message that first made it, its first result after it);
    replies before the first sendable user message are never sent, nor are their calls."""
    made: dict[str, AssistantMessage] = {}
    out: dict[str, tuple[AssistantMessage, ToolResultMessage]] = {}
    for m in history[_leading(history) :]:
        if isinstance(m, AssistantMessage) and m.stop_reason != "error":
            for c in m.tool_calls:
                made.setdefault(c.id, m)
        elif isinstance(m, ToolResultMessage) and m.tool_call_id in made and m.tool_call_id not in out:
            out[m.tool_call_id] = (made[m.tool_call_id], m)
    return out


@settings(max_examples=400, deadline=None)
@given(histories())
def test_the_built_request_keeps_the_rule_and_loses_nothing_that_may_be_sent(history: list[AnyMessage]) -> None:
    for n, m in enumerate(history):
        if isinstance(m, ToolResultMessage):
            m.metadata["n"] = n  # which stored result a sent one is (blank text makes a copy)
    stored = [m.model_dump() for m in history]
    built = build_request(history)
    sent = list(built.messages)

    # The rule holds for every message sent; the end is what needs_reply says (with every
    # call answered), and a user message after it could always be sent.
    assert check_request([*sent, user_text("next")]) is None
    if not built.unanswered:
        assert (check_request(sent) is None) == built.needs_reply
    if sent:
        assert isinstance(sent[0], UserMessage)
    assert [m.model_dump() for m in history] == stored, "stored rows were changed"
    assert not any(isinstance(m, UnknownMessage) for m in sent)
    assert not any(isinstance(m, AssistantMessage) and m.stop_reason == "error" for m in sent)
    # Every call that has a result is sent, right after its assistant message's text, with its first result.
    sent_calls = {c.id for m in sent if isinstance(m, AssistantMessage) for c in m.tool_calls}
    sent_results = [m for m in sent if isinstance(m, ToolResultMessage)]
    sent_ids = {m.metadata["n"] for m in sent_results}
    for call_id, (_, first) in _first_results(history).items():
        assert call_id in sent_calls, call_id
        assert first.metadata["n"] in sent_ids, call_id
    # User messages that hold text or an image are all sent, in their order, without blank text.
    assert [_words(m) for m in sent if isinstance(m, UserMessage)] == [_words(m) for m in history if _sendable_user(m)]
    # What is left out is said.
    leading = _leading(history)
    left_out = sum(1 for m in history if isinstance(m, (ToolResultMessage, UnknownMessage))) - len(sent_results)
    left_out += sum(1 for m in history if isinstance(m, AssistantMessage) and m.stop_reason == "error")
    left_out += sum(1 for m in history if isinstance(m, UserMessage) and not _sendable_user(m))
    left_out += sum(
        1
        for m in history[:leading]
        if isinstance(m, AssistantMessage) and m.stop_reason != "error" and any(_sent_block(b) for b in m.content)
    )
    kinds = ("duplicate_result", "orphan_result", "unknown_row", "failed_reply", "empty_user", "leading_reply")
    assert sum(r.kind in kinds for r in built.repairs) == left_out
    dataless = sum(
        isinstance(b, ImageContent) and image_source(b) is None
        for m in history
        if isinstance(m, (UserMessage, ToolResultMessage)) and not isinstance(m.content, str)
        for b in m.content
    )
    assert sum(r.kind == "image_left_out" for r in built.repairs) == dataless


def _sent_block(block: object) -> bool:
    return not (isinstance(block, TextContent) and blank(block.text))


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
    made = [
        c.id
        for m in history[_leading(history) :]
        if isinstance(m, AssistantMessage) and m.stop_reason != "error"
        for c in m.tool_calls
    ]
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


@settings(max_examples=200, deadline=None)
@given(histories(), st.lists(st.integers(0, 6), max_size=8))
def test_read_in_slices_the_builder_sends_what_one_pass_sends(history: list[AnyMessage], stops: list[int]) -> None:
    builder = RequestBuilder()
    for upto in stops:  # any order, and past the end: each reads only what it has not read
        builder.update(history, upto)
    builder.update(history)
    whole = build_request(history)
    assert [m.model_dump() for m in builder.request()] == [m.model_dump() for m in whole.messages]
    assert sorted(builder.built().repairs, key=repr) == sorted(whole.repairs, key=repr)
    assert [u.call.id for u in builder.unanswered()] == [u.call.id for u in whole.unanswered]


def test_the_builder_grows_its_own_list_in_place_when_every_call_is_answered() -> None:
    history: list[AnyMessage] = [user_text("go"), _assistant("c1"), _result("c1")]
    builder = RequestBuilder()
    builder.update(history)
    first = builder.request()
    history += [_assistant(text="done"), user_text("more")]
    builder.update(history)
    assert builder.request() is first and len(first) == 5


def test_the_rule_names_what_is_wrong() -> None:
    go = user_text("go")
    assert check_request([go, _assistant("c1"), user_text("x"), _result("c1")]) == (
        "Message 2 (user) comes before the results of tool call(s) c1."
    )
    assert check_request([user_text("x"), _result("c9")]) == (
        "Message 1 is a tool result for c9, which is not a call awaiting its result."
    )
    assert check_request([go, _assistant("c1")]) == "Tool call(s) c1 have no result at the end of the request."
    assert check_request([UnknownMessage(role="system")]) == "Message 0 has the unknown role 'system'."
    assert check_request([go, _assistant("c1"), _result("c1"), _assistant("c1"), _result("c1")]) == (
        "Message 3 repeats the tool call id c1."
    )
    assert check_request([_assistant(text="hi"), go]) == (
        "The request starts with an assistant message; the first message must be a user message."
    )
    assert check_request([go, _assistant(text="answer  ")]) == (
        "The request ends with an assistant message (message 1, a prefill); it must end with a user message or a "
        "tool result."
    )
    assert check_request([]) == "The request has no messages."
    assert check_request([user_text("   ")]) == "Message 0 (user) has no text or image to send."
    assert check_request([UserMessage(content=[TextContent(text="a"), TextContent(text=" ")])]) == (
        "Message 0 has an empty or whitespace-only text block."
    )
    assert check_request([UserMessage(content="")]) == "Message 0 (user) is empty or only whitespace."
    assert check_request([UserMessage(content=[UnknownContent(type="document")])]) == (
        "Message 0 (user) has no text or image to send."
    )
    no_data = UserMessage(content=[TextContent(text="look"), ImageContent()])
    assert check_request([no_data]) == "Message 0 has an image without data."


# --- what may be sent, and whether the model may be called ----------------------------------------


def test_a_reply_stored_after_a_dangling_call_is_final_so_no_reply_is_needed() -> None:
    # cubeloop continued a mid-tool thread: once c1 is settled (its result placed after
    # its call) the request would end with cubeloop's reply, a prefill.
    history = [user_text("go"), _assistant("c1", run="r1"), user_text("hi", run_id="r2"), _assistant(text="hello")]
    assert not build_request(history).needs_reply
    assert build_request([*history, _result("c1")]).messages[-1] is history[-1]
    assert build_request(history[:2]).needs_reply  # the call is the last thing: its result follows it
    assert build_request([*history, user_text("more")]).needs_reply


def test_blank_text_is_left_out_and_a_user_message_with_nothing_to_send_is_said() -> None:
    history = [
        UserMessage(content=[TextContent(text="look"), TextContent(text="  ")]),
        _assistant(text="seen"),
        UserMessage(content=" \n"),
        UserMessage(content=[UnknownContent(type="document")]),
    ]
    built = build_request(history)
    assert [m.role for m in built.messages] == ["user", "assistant"]
    assert built.messages[0].content == [TextContent(text="look")]
    assert not built.needs_reply
    assert repair_words(built.repairs) == ["2 user messages with nothing to send left out of what is sent"]


def test_replies_before_the_first_user_message_are_left_out_with_their_calls() -> None:
    history = [
        UserMessage(content=[UnknownContent(type="document")]),
        _assistant("c1", text="about that document"),
        _result("c1"),
        user_text("and now?"),
    ]
    built = build_request(history)
    assert built.messages == [history[3]]
    assert built.unanswered == ()
    assert repair_words(built.repairs) == [
        "1 orphan tool result left out of what is sent",
        "1 user message with nothing to send left out of what is sent",
        "1 reply before the first user message left out of what is sent",
    ]
    # The tail of a thread (its summary) starts with a reply: that one is not leading.
    assert [m.role for m in build_request(history[1:3], tail=True).messages] == ["assistant", "tool_result"]


def test_an_image_is_sent_with_its_data_in_either_shape_and_left_out_without_any() -> None:
    ours = ImageContent(data="iVBORw0KGgo=", mime_type="image/png")
    url = ImageContent.model_validate({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}})
    empty = ImageContent.model_validate({"type": "image", "source": "", "media_type": "image/png"})
    message = UserMessage(content=[TextContent(text="q"), ours, url, empty, ImageContent()])
    built = build_request([message])
    assert built.messages[0].content == [TextContent(text="q"), ours, url]
    assert repair_words(built.repairs) == ["2 images without data left out of what is sent"]


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
    for m in history[_leading(history) :]:  # a reply before the first user message is never sent
        if isinstance(m, AssistantMessage) and m.stop_reason != "error":
            for c in m.tool_calls:
                issuers.setdefault(c.id, m.run_id)  # a reused id belongs to its first call
    for settled in transcript[len(history) :]:
        if isinstance(settled, ToolResultMessage):
            assert settled.run_id == issuers[settled.tool_call_id]  # None stays None: cubeloop groups by it


@settings(max_examples=100, deadline=None)
@given(histories())
async def test_resumed_on_any_history_the_model_is_called_only_when_a_reply_is_needed(
    history: list[AnyMessage],
) -> None:
    # No prompt: the run settles what is dangling, then calls the model only if the
    # request would end with a user message or a tool result (never a prefill).
    import asyncio

    from core.loop import LoopConfig, run_loop
    from core.providers.faux import FauxProvider

    async def nothing(event: object) -> None:
        return None

    provider = FauxProvider(["ok"])
    transcript = list(history)
    outcome = await run_loop(transcript, LoopConfig(provider, run_id="run-new"), nothing, asyncio.Event())
    assert outcome == "completed", transcript[-1]
    assert len(provider.requests) == (1 if build_request(history).needs_reply else 0)
    if provider.requests:
        assert check_request(provider.requests[0].messages) is None
    assert not build_request(transcript).unanswered
