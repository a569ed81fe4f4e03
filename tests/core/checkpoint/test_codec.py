"""Decoding stored rows (core/checkpoint/codec.py): many rows at once give what each row
gives alone, bad rows are found where they are, the unions choose as a Python function of
the tag would (same messages, same reasons), and a load's cost per row does not grow."""

from __future__ import annotations

import gc
import json
import sys
import threading
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError

from bench.bench_store import make_messages
from core.checkpoint import codec, postgres_rows, redis_read, sqlite_queries
from core.checkpoint.base import CorruptRow
from core.errors import CorruptRecordError
from core.messages import (
    KNOWN_BLOCK_TYPES,
    KNOWN_ROLES,
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    UserMessage,
)
from tests.helpers.histories import histories

# --- the reference: unions that choose by a Python function of the tag (the earlier schema) ---


def _python_tag(field: str, known: tuple[str, ...]) -> Any:
    def tag(value: Any) -> str:
        found = value.get(field) if isinstance(value, dict) else getattr(value, field, None)
        return found if found in known else "unknown"

    return tag


_RefBlock = Annotated[
    Annotated[TextContent, Tag("text")]
    | Annotated[ThinkingContent, Tag("thinking")]
    | Annotated[ImageContent, Tag("image")]
    | Annotated[ToolCall, Tag("tool_call")]
    | Annotated[UnknownContent, Tag("unknown")],
    Discriminator(_python_tag("type", KNOWN_BLOCK_TYPES)),
]


class _RefUser(UserMessage):
    content: str | list[_RefBlock] = Field(default_factory=list)  # type: ignore[assignment]


class _RefAssistant(AssistantMessage):
    content: list[_RefBlock] = Field(default_factory=list)  # type: ignore[assignment]


class _RefToolResult(ToolResultMessage):
    content: list[_RefBlock] = Field(default_factory=list)  # type: ignore[assignment]


_REFERENCE = TypeAdapter(
    Annotated[
        Annotated[_RefUser, Tag("user")]
        | Annotated[_RefAssistant, Tag("assistant")]
        | Annotated[_RefToolResult, Tag("tool_result")]
        | Annotated[UnknownMessage, Tag("unknown")],
        Discriminator(_python_tag("role", KNOWN_ROLES)),
    ]
)
_REF_CLASS = {_RefUser: UserMessage, _RefAssistant: AssistantMessage, _RefToolResult: ToolResultMessage}


def _reference(text: str) -> tuple[type, dict[str, Any]] | str:
    """What the reference makes of a row: (class, dump), or the message of its first error."""
    try:
        message = _REFERENCE.validate_json(text)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return _REF_CLASS.get(type(message), type(message)), message.model_dump()


def _ours(text: str) -> tuple[type, dict[str, Any]] | str:
    try:
        message = codec.decode(text, thread_id="t", row_id=1)
    except CorruptRecordError as exc:
        return str(exc)
    return type(message), message.model_dump()


# --- rows: valid ones from random histories, then changed where the unions choose ---

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "x", *KNOWN_ROLES, *KNOWN_BLOCK_TYPES]),
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(st.sampled_from(["type", "role", "text", "id"]), inner, max_size=2)
    ),
    max_leaves=4,
)
_KEYS = st.sampled_from(
    ["role", "type", "content", "text", "id", "name", "tool_call_id", "usage", "metadata", "source"]
)


@st.composite
def _changed_rows(draw: st.DrawFn) -> str:
    message = draw(st.sampled_from(draw(histories().filter(bool))))
    row: Any = json.loads(codec.encode(message))
    for _ in range(draw(st.integers(1, 3))):
        blocks = row.get("content") if isinstance(row, dict) else None
        target = row
        if isinstance(blocks, list) and blocks and draw(st.booleans()):
            i = draw(st.integers(0, len(blocks) - 1))
            if draw(st.integers(0, 3)) == 0:
                blocks[i] = draw(_JSON)  # a block that is no object at all, or an odd one
                continue
            target = blocks[i]
        if not isinstance(target, dict):
            continue
        key = draw(_KEYS)
        if draw(st.booleans()) and key in target:
            del target[key]
        else:
            target[key] = draw(_JSON)
    return json.dumps(row)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changed_rows())
def test_each_row_decodes_as_a_union_choosing_by_a_python_function_of_the_tag(text: str) -> None:
    ours, theirs = _ours(text), _reference(text)
    if isinstance(theirs, str):
        assert isinstance(ours, str), (text, ours)
        assert f"holds an invalid message ({theirs}); it is shown raw" in ours, (text, ours, theirs)
    else:
        assert ours == theirs, text


@pytest.mark.parametrize(
    ("row", "first_error"),
    [
        ({"role": "user", "content": [{"type": "tool_call", "name": "x"}]}, "Input should be a valid string"),
        ({"role": "assistant", "content": [{"type": "tool_call", "name": "x"}]}, "Field required"),  # no id
        ({"role": "assistant", "content": [{"text": "no type"}]}, "Field required"),  # as an unknown block
        ({"role": "assistant", "content": [{"type": 5}]}, "Input should be a valid string"),
        ({"role": "assistant", "content": ["not a block"]}, "Input should be an object"),
        ({"content": "no role"}, "Field required"),
        ({"role": 5}, "Input should be a valid string"),
        ({"role": "tool_result", "content": []}, "Field required"),  # no tool_call_id
    ],
)
def test_a_bad_row_gives_the_reason_of_its_tags_member(row: Any, first_error: str) -> None:
    assert _reference(json.dumps(row)) == first_error
    with pytest.raises(CorruptRecordError, match=rf"holds an invalid message \({first_error}\)"):
        codec.decode(json.dumps(row))


def test_unknown_roles_and_block_types_are_kept() -> None:
    message = codec.decode(json.dumps({"role": "assistant", "content": [{"type": "redacted", "data": "z"}]}))
    assert isinstance(message, AssistantMessage) and message.content == [UnknownContent(type="redacted", data="z")]
    assert codec.decode(json.dumps({"role": "system", "text": "hi"})) == UnknownMessage(role="system", text="hi")


# --- many rows at once ---


def _per_row(rows: list[tuple[int, bytes]]) -> tuple[list[Any], list[int], list[CorruptRow]]:
    messages, ids, problems = [], [], []
    for row_id, raw in rows:
        try:
            messages.append(codec.decode(raw, thread_id="t", row_id=row_id))
            ids.append(row_id)
        except CorruptRecordError as exc:
            problems.append(CorruptRow(row_id, str(exc), raw.decode("utf-8", "replace")))
    return messages, ids, problems


_BAD = st.sampled_from(
    [
        b'{"role":"user","content":["a"',  # ends inside an object: joined with the next it could be one message
        b'"b"]}',
        b"not json",
        b'{"role":"tool_result","content":[]}',
        b'{"role":"assistant","content":[{"type":"tool_call"}]}',
        b"[]",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.lists(st.tuples(st.integers(0, 50), _BAD), max_size=4))
def test_many_rows_decode_as_each_row_alone(history: list[Any], bad: list[tuple[int, bytes]]) -> None:
    raws = [codec.encode(m).encode() for m in history]
    for at, raw in bad:
        raws.insert(min(at, len(raws)), raw)
    rows = list(enumerate(raws, start=1))
    got = sqlite_queries.decode_rows(rows, "t")
    assert got == _per_row(rows)
    assert len(got[0]) == len(got[1]) == len(raws) - len(bad)


def test_a_bad_row_in_the_middle_is_found_where_it_is() -> None:
    history = make_messages(1000)
    raws = [codec.encode(m).encode() for m in history]
    raws[500:500] = [b'{"role":"user","content":["a"', b'"b"]}']  # one message if the two were joined
    messages, ids, problems = codec.decode_rows(enumerate(raws, start=1), "t", bytes.hex)
    assert messages == history
    assert ids == [*range(1, 501), *range(503, 1003)]
    assert [(p.row_id, p.raw) for p in problems] == [(501, raws[500].hex()), (502, raws[501].hex())]
    assert all("holds malformed JSON" in p.reason and "row 50" in p.reason.lower() for p in problems)


def test_redis_rows_that_would_join_into_one_message_are_two_bad_rows() -> None:
    good = codec.encode(UserMessage(content="ok")).encode()
    messages, ids, problems = redis_read.decode_rows([good, b'{"role":"user","content":["a"', b'"b"]}', good], "t", 1)
    assert (len(messages), ids, [p.row_id for p in problems]) == (2, [1, 4], [2, 3])


def test_postgres_rows_decode_as_they_were_written() -> None:
    history = [*make_messages(30), UserMessage(content="x", metadata={})]
    rows = [(seq, *postgres_rows.encode_message(m)[:3]) for seq, m in enumerate(history, start=1)]
    rows.insert(5, (99, "user", "{}", b"\xc1"))  # not msgpack
    messages, ids, problems = postgres_rows.decode_rows(rows, "t")
    assert messages == history and 99 not in ids and [p.row_id for p in problems] == [99]


# --- cost ---


def _calls(fn: Any) -> int:
    """Python and C function calls made by ``fn()`` (a count of work, not a time)."""
    count = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_the_calls_per_row_do_not_grow_with_the_thread() -> None:
    def rows(n: int) -> list[tuple[int, bytes]]:
        raws = [codec.encode(m).encode() for m in make_messages(n)]
        raws[n // 2] = b"not json"  # one bad row each: its fallback must stay a cost of that row alone
        return list(enumerate(raws))

    small, large = rows(1000), rows(10_000)
    per_row_small = _calls(lambda: sqlite_queries.decode_rows(small, "t")) / len(small)
    per_row_large = _calls(lambda: sqlite_queries.decode_rows(large, "t")) / len(large)
    assert per_row_large <= 2 * per_row_small, (per_row_small, per_row_large)


def test_decoded_messages_go_to_the_oldest_generation_without_a_collection() -> None:
    raws = [codec.encode(m).encode() for m in make_messages(3000)]
    collections: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        messages, _ids, _problems = codec.decode_rows(enumerate(raws), "t", bytes.hex)
    finally:
        gc.callbacks.remove(seen)
    assert collections == []  # ~23,000 tracked objects made, none walked by a collection
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(m) in oldest and id(m.content) in oldest for m in messages)
    assert gc.isenabled()


def test_the_collector_stays_paused_until_the_last_pause_ends() -> None:
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with codec.gc_paused():
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=other)
    with codec.gc_paused():
        worker.start()
        inside.wait(5)
    assert not gc.isenabled()  # the other thread's pause is still running
    release.set()
    worker.join(5)
    assert gc.isenabled()
    gc.disable()
    try:
        with codec.gc_paused():
            pass
        assert not gc.isenabled()  # off before, so left off
    finally:
        gc.enable()


def test_a_freeze_made_by_someone_else_is_left_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        codec.decode_rows(enumerate([codec.encode(m).encode() for m in make_messages(30)]), "t", bytes.hex)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
